//! The job's private root: planned as data by the supervisor, built by pid 1.
//!
//! [`plan`] turns a [`JobSpec`] into an ordered list of [`MountOp`]s: a
//! tmpfs root, read-only binds of the system paths, the workspace, a capped
//! /tmp, a minimal /dev and a fresh, masked /proc. [`open_sources`] and
//! [`build`] run inside the new user and mount namespaces; [`enter`] pivots
//! into the result and detaches the host's root. This module must never
//! mount anything in the host's mount namespace: every call here happens
//! after `CLONE_NEWNS`.

use super::protocol::MountOp;
use super::sys::{self, SysError};
use crate::job::{JobSpec, Network};
use nix::fcntl::{open, OFlag};
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::Mode;
use nix::unistd::{chdir, pivot_root};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Where the new root is assembled. /tmp always exists; mounting over it is
/// private to our mount namespace, and every bind source is opened as an fd
/// before this mount hides the host's /tmp.
pub const STAGING: &str = "/tmp";

/// Host paths bound read-only into every sandbox, when they exist.
/// Merged-/usr distros have /bin, /lib… as symlinks; they are recreated as
/// symlinks, which is both faithful and cheaper than a bind.
pub const SYSTEM_PATHS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"];

/// Device nodes of the minimal /dev. `/dev/tty` is added only for a job
/// with a terminal of its own (`--tty`): without one, the job must not
/// reach its caller's.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// /proc files hidden behind /dev/null: Docker's and runc's masked files
/// (`kcore keys timer_list timer_stats sched_debug latency_stats
/// interrupts`), and more of the host that a job has no use for and that
/// docs/design.md's "/proc" table explains one by one: the host's boot
/// line and boot config (secrets and host layout), the symbol table and
/// module list (kernel reconnaissance), the other interrupt and memory
/// fragmentation counters (timing and memory-layout side channels), and
/// the key users (like `keys`).
pub const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "interrupts",
    "softirqs",
    "cmdline",
    "bootconfig",
    "kallsyms",
    "modules",
    "buddyinfo",
    "pagetypeinfo",
    "zoneinfo",
];
/// /proc directories hidden behind an empty read-only tmpfs (Docker's).
pub const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];
/// /proc paths made read-only (Docker's).
pub const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// Inodes of a tmpfs per byte of its size: one per 4 KiB page, so a cap
/// of files (`nr_inodes`) holds when they are empty as well as when they
/// are full (200,000 empty files once went past a 64 MiB cap).
const TMPFS_BYTES_PER_INODE: u64 = 4096;
/// The fewest inodes a sized tmpfs gets.
const TMPFS_MIN_INODES: u64 = 1024;

/// The inode cap of a tmpfs of `size` bytes.
pub fn tmpfs_inodes(size: u64) -> u64 {
    (size / TMPFS_BYTES_PER_INODE).max(TMPFS_MIN_INODES)
}

/// What [`plan`] needs to know of the host; a parameter so plans are testable.
pub trait HostFs {
    /// `Some(target)` for a symlink, `None` for anything else that exists,
    /// and `Err` when the path does not exist.
    fn symlink_target(&self, path: &Path) -> std::io::Result<Option<PathBuf>>;
}

/// The real host filesystem.
pub struct RealHost;

impl HostFs for RealHost {
    fn symlink_target(&self, path: &Path) -> std::io::Result<Option<PathBuf>> {
        let meta = std::fs::symlink_metadata(path)?;
        if meta.file_type().is_symlink() {
            Ok(Some(std::fs::read_link(path)?))
        } else {
            Ok(None)
        }
    }
}

/// The ordered list of steps that builds the job's root.
pub fn plan(spec: &JobSpec, host: &impl HostFs) -> Vec<MountOp> {
    let mut ops = Vec::new();
    for path in SYSTEM_PATHS {
        let path = Path::new(path);
        match host.symlink_target(path) {
            Ok(Some(target)) => ops.push(MountOp::Symlink { target, dst: path.into() }),
            Ok(None) => {
                ops.push(MountOp::Bind { src: path.into(), dst: path.into(), rw: false, dev: false, optional: true })
            }
            Err(_) => {}
        }
    }
    for bind in &spec.binds {
        ops.push(MountOp::Bind {
            src: bind.source.clone(),
            dst: bind.dest.clone(),
            rw: bind.writable,
            dev: false,
            optional: false,
        });
    }
    if let Some(ws) = &spec.workspace {
        ops.push(MountOp::Bind {
            src: ws.clone(),
            dst: "/workspace".into(),
            rw: spec.workspace_rw,
            dev: false,
            optional: false,
        });
        if spec.workspace_rw {
            for path in &spec.protect {
                ops.push(MountOp::Protect { base: "/workspace".into(), path: path.clone() });
            }
        }
    }
    let tmp = spec.limits.tmp_size_bytes;
    ops.push(MountOp::Tmpfs { dst: "/tmp".into(), size: tmp, mode: 0o1777, inodes: tmpfs_inodes(tmp) });
    ops.push(MountOp::Tmpfs { dst: "/dev".into(), size: 64 * 1024, mode: 0o755, inodes: 64 });
    let tty = spec.tty.then_some("tty");
    for dev in DEVICES.iter().copied().chain(tty) {
        let p = Path::new("/dev").join(dev);
        ops.push(MountOp::Bind { src: p.clone(), dst: p, rw: true, dev: true, optional: false });
    }
    if spec.tty {
        ops.push(MountOp::Terminal);
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink { target: target.into(), dst: Path::new("/dev").join(name) });
    }
    ops.push(MountOp::Tmpfs { dst: "/dev/shm".into(), size: tmp, mode: 0o1777, inodes: tmpfs_inodes(tmp) });
    ops.push(MountOp::Proc { dst: "/proc".into() });
    for f in PROC_MASKED_FILES {
        ops.push(MountOp::MaskFile { dst: Path::new("/proc").join(f) });
    }
    for d in PROC_MASKED_DIRS {
        ops.push(MountOp::MaskDir { dst: Path::new("/proc").join(d) });
    }
    for p in PROC_READONLY {
        ops.push(MountOp::ReadOnly { dst: Path::new("/proc").join(p) });
    }
    if spec.network == Network::Host {
        // Name resolution on the host network may need the resolver's runtime dir.
        for p in ["/run/systemd/resolve", "/run/resolvconf"] {
            if host.symlink_target(Path::new(p)).is_ok() {
                ops.push(MountOp::Bind { src: p.into(), dst: p.into(), rw: false, dev: false, optional: true });
            }
        }
    }
    ops
}

/// Open every bind source as an `O_PATH` fd, in plan order (`None` for
/// other ops and for optional sources that are absent). Called while pid 1
/// still holds the host credentials it was cloned with, so root-owned
/// toolchain trees such as /root/.rustup can be reached.
pub fn open_sources(ops: &[MountOp]) -> Result<Vec<Option<OwnedFd>>, SysError> {
    ops.iter()
        .map(|op| match op {
            MountOp::Bind { src, optional, .. } => {
                match open(src.as_path(), OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()) {
                    Ok(fd) => Ok(Some(fd)),
                    Err(nix::errno::Errno::ENOENT) if *optional => Ok(None),
                    Err(e) => Err(SysError::path("open bind source", src, e)),
                }
            }
            _ => Ok(None),
        })
        .collect()
}

fn under(root: &Path, dst: &Path) -> PathBuf {
    root.join(dst.strip_prefix("/").unwrap_or(dst))
}

fn mkdir_p(path: &Path, mode: u32) -> Result<(), SysError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path).map_err(|e| SysError::io("mkdir", path, e))
}

/// Make the missing directories above a mount point under `root`, each
/// with the permission bits of the host directory at the same path (a
/// 0700 `/root` above a bound `/root/.rustup` stays 0700), or 0700 where
/// the host has none. The mount point itself is covered by its mount.
fn mkdir_parents(root: &Path, target: &Path) -> Result<(), SysError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let Some(parent) = target.parent() else { return Ok(()) };
    let Ok(rel) = parent.strip_prefix(root) else { return mkdir_p(parent, 0o755) };
    let mut at = root.to_path_buf();
    let mut host = PathBuf::from("/");
    for c in rel.components() {
        at.push(c);
        host.push(c);
        if at.is_dir() {
            continue;
        }
        let mode = std::fs::metadata(&host).map(|m| m.permissions().mode() & 0o777).unwrap_or(0o700);
        std::fs::DirBuilder::new().mode(mode).create(&at).map_err(|e| SysError::io("mkdir", &at, e))?;
        // The umask may have cut bits the host has.
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode))
            .map_err(|e| SysError::io("chmod", &at, e))?;
    }
    Ok(())
}

fn touch(path: &Path) -> Result<(), SysError> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| SysError::io("create mount point", path, e))
}

/// Run the plan under `root` (a fresh tmpfs at [`STAGING`]). Returns the
/// paths that [`MountOp::Protect`] made read-only, as `base/path`.
pub fn build(ops: &[MountOp], fds: &[Option<OwnedFd>]) -> Result<Vec<String>, SysError> {
    let mut protected = Vec::new();
    let mut pinned = std::collections::HashSet::new();
    let root = Path::new(STAGING);
    let nil: Option<&str> = None;
    // Nothing we mount may propagate back to the host.
    mount(nil, "/", nil, MsFlags::MS_REC | MsFlags::MS_PRIVATE, nil)
        .map_err(|e| SysError::path("make / private", Path::new("/"), e))?;
    mount(Some("tmpfs"), root, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=0755,size=1m"))
        .map_err(|e| SysError::path("mount root tmpfs", root, e))?;

    for (op, fd) in ops.iter().zip(fds) {
        match op {
            MountOp::Bind { dst, rw, dev, src, .. } => {
                let Some(fd) = fd else { continue };
                let target = under(root, dst);
                let meta = nix::sys::stat::fstat(fd).map_err(|e| SysError::path("stat bind source", src, e))?;
                mkdir_parents(root, &target)?;
                if meta.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    mkdir_p(&target, 0o755)?;
                } else {
                    touch(&target)?;
                }
                let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
                mount(Some(source.as_str()), &target, nil, MsFlags::MS_BIND | MsFlags::MS_REC, nil)
                    .map_err(|e| SysError::path("bind", src, e))?;
                let mut attrs = sys::MOUNT_ATTR_NOSUID;
                if !dev {
                    attrs |= sys::MOUNT_ATTR_NODEV;
                } else {
                    attrs |= sys::MOUNT_ATTR_NOEXEC;
                }
                if !rw {
                    attrs |= sys::MOUNT_ATTR_RDONLY;
                }
                sys::set_mount_attrs(&target, attrs, true)?;
            }
            MountOp::Symlink { target, dst } => {
                let link = under(root, dst);
                if let Some(parent) = link.parent() {
                    mkdir_p(parent, 0o755)?;
                }
                std::os::unix::fs::symlink(target, &link).map_err(|e| SysError::io("symlink", &link, e))?;
            }
            MountOp::Tmpfs { dst, size, mode, inodes } => {
                let target = under(root, dst);
                mkdir_p(&target, 0o755)?;
                let data = match inodes {
                    0 => format!("mode={mode:o},size={size}"),
                    n => format!("mode={mode:o},size={size},nr_inodes={n}"),
                };
                mount(
                    Some("tmpfs"),
                    &target,
                    Some("tmpfs"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                    Some(data.as_str()),
                )
                .map_err(|e| SysError::path("mount tmpfs", dst, e))?;
            }
            MountOp::Dir { dst, mode } => mkdir_p(&under(root, dst), *mode)?,
            MountOp::Proc { dst } => {
                let target = under(root, dst);
                mkdir_p(&target, 0o555)?;
                mount(
                    Some("proc"),
                    &target,
                    Some("proc"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                    nil,
                )
                .map_err(|e| SysError::path("mount proc", dst, e))?;
            }
            MountOp::MaskFile { dst } => {
                let target = under(root, dst);
                if target.exists() {
                    mount(Some("/dev/null"), &target, nil, MsFlags::MS_BIND, nil)
                        .map_err(|e| SysError::path("mask", dst, e))?;
                    // Reads give nothing, writes go nowhere, nothing runs.
                    sys::set_mount_attrs(
                        &target,
                        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC,
                        false,
                    )?;
                }
            }
            MountOp::MaskDir { dst } => {
                let target = under(root, dst);
                if target.is_dir() {
                    mount(
                        Some("tmpfs"),
                        &target,
                        Some("tmpfs"),
                        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                        Some("size=0"),
                    )
                    .map_err(|e| SysError::path("mask", dst, e))?;
                }
            }
            MountOp::ReadOnly { dst } => {
                let target = under(root, dst);
                if target.exists() {
                    mount(Some(&target), &target, nil, MsFlags::MS_BIND | MsFlags::MS_REC, nil)
                        .map_err(|e| SysError::path("bind read-only", dst, e))?;
                    sys::set_mount_attrs(
                        &target,
                        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
                        true,
                    )?;
                }
            }
            MountOp::Terminal => bind_terminal(root)?,
            MountOp::Protect { base, path } => {
                if let Some(done) = protect(&under(root, base), path, &mut pinned)? {
                    protected.push(base.join(done).display().to_string());
                }
            }
        }
    }
    Ok(protected)
}

/// Bind the pty at our fd 0 (a host `/dev/pts/N`) at the same name in the
/// new root's `/dev/pts`. fd 0 was opened in the host's mount namespace,
/// which a bind can't take from: the name is opened again here, in ours,
/// and must be the very device fd 0 is.
fn bind_terminal(root: &Path) -> Result<(), SysError> {
    let fd0 = Path::new("/proc/self/fd/0");
    let name = std::fs::read_link(fd0).map_err(|e| SysError::io("find the job's terminal", fd0, e))?;
    let not_pty = || SysError::other("find the job's terminal", format!("fd 0 is {}, not a pty", name.display()));
    let n = name.strip_prefix("/dev/pts").ok().filter(|n| n.components().count() == 1).ok_or_else(not_pty)?;
    let fd = open(name.as_path(), OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::path("open the job's terminal", &name, e))?;
    let ours = nix::sys::stat::fstat(&fd).map_err(|e| SysError::path("stat", &name, e))?;
    // SAFETY: fd 0 is open for the whole life of this process.
    let given = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(0) })
        .map_err(|e| SysError::path("stat", fd0, e))?;
    if (ours.st_dev, ours.st_ino, ours.st_rdev) != (given.st_dev, given.st_ino, given.st_rdev) {
        return Err(not_pty());
    }
    let target = root.join("dev/pts").join(n);
    mkdir_p(&root.join("dev/pts"), 0o755)?;
    touch(&target)?;
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let nil: Option<&str> = None;
    mount(Some(source.as_str()), &target, nil, MsFlags::MS_BIND, nil).map_err(|e| SysError::path("bind", &name, e))?;
    sys::set_mount_attrs(&target, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC, false)
}

/// Keep `path` under the read-write bind at `base` read-only for the job.
///
/// The bind's content belongs to the job's side: another job may be
/// changing it right now. So no path is looked up: each component is
/// opened with `O_NOFOLLOW` from the one before, and the mounts are made
/// on those very objects (`open_tree` and `move_mount` on fds). Every
/// directory on the way is bound onto itself (read-write), which makes it
/// a mount point: the job can then neither rename it away nor replace it
/// with one of its own (a fresh `.git` with a hostile `config` beside a
/// renamed real one). A component that is a file where a directory was
/// expected (a `.git` gitfile pointing elsewhere) is protected itself.
///
/// `Ok(None)`: nothing to protect (the path is not there, or the job
/// could not reach it anyway). A symlink on the way is an error: the job
/// could repoint it, and following it would protect something else.
fn protect(
    base: &Path,
    path: &Path,
    pinned: &mut std::collections::HashSet<PathBuf>,
) -> Result<Option<PathBuf>, SysError> {
    use std::path::Component;
    let refuse = |what: String| {
        SysError::other(
            "protect",
            format!("cannot keep {} read-only: {what}; remove it, or pass --no-protect", path.display()),
        )
    };
    let names: Vec<&std::ffi::OsStr> = path
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(refuse("the path must be relative to the workspace, without '.' or '..'".into())),
        })
        .collect::<Result<_, _>>()?;
    if names.is_empty() {
        return Ok(None);
    }
    let mut at = open(base, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::path("open protected base", base, e))?;
    let mut done = PathBuf::new();
    for (i, name) in names.iter().enumerate() {
        let fd =
            match nix::fcntl::openat(&at, *name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
                Ok(fd) => fd,
                // Not there, or out of the job's reach too.
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::EACCES) => return Ok(None),
                Err(e) => return Err(SysError::path("open protected path", &done.join(name), e)),
            };
        done.push(name);
        let kind = nix::sys::stat::fstat(&fd).map_err(|e| SysError::path("stat protected path", &done, e))?.st_mode
            & libc::S_IFMT;
        let last = i + 1 == names.len();
        match kind {
            libc::S_IFLNK => return Err(refuse(format!("{} is a symbolic link", done.display()))),
            libc::S_IFDIR if !last => {
                // Pinned once: a later protected path under it finds the
                // bind through its lookup from `base`.
                if pinned.insert(done.clone()) {
                    at = bind_onto_itself(&fd, false).map_err(|e| SysError::path("pin", &done, e))?;
                } else {
                    at = fd;
                }
            }
            _ => {
                bind_onto_itself(&fd, true).map_err(|e| SysError::path("protect", &done, e))?;
                return Ok(Some(done));
            }
        }
    }
    Ok(None)
}

/// Bind the object `fd` refers to onto itself, read-only if `ro`. Returns
/// the new mount's root, from which a deeper path must be opened (the old
/// fd still sees what the mount now covers).
fn bind_onto_itself(fd: &OwnedFd, ro: bool) -> Result<OwnedFd, nix::errno::Errno> {
    let tree = sys::open_tree_clone(fd)?;
    if ro {
        sys::set_mount_attrs_fd(&tree, sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV)?;
    }
    sys::move_mount_onto(&tree, fd)?;
    Ok(tree)
}

/// Pivot into the built root, detach the host's root, and make `/` itself
/// read-only (its submounts keep their own flags).
pub fn enter() -> Result<(), SysError> {
    let root = Path::new(STAGING);
    chdir(root).map_err(|e| SysError::path("chdir new root", root, e))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; the
    // detach below then removes it without needing a put_old directory.
    pivot_root(".", ".").map_err(|e| SysError::path("pivot_root", root, e))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| SysError::path("detach old root", Path::new("/"), e))?;
    chdir("/").map_err(|e| SysError::path("chdir /", Path::new("/"), e))?;
    sys::set_mount_attrs(Path::new("/"), sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct FakeHost(HashMap<&'static str, Option<&'static str>>);
    impl HostFs for FakeHost {
        fn symlink_target(&self, path: &Path) -> std::io::Result<Option<PathBuf>> {
            match self.0.get(path.to_str().unwrap_or("")) {
                Some(t) => Ok(t.map(PathBuf::from)),
                None => Err(std::io::ErrorKind::NotFound.into()),
            }
        }
    }

    fn merged_usr() -> FakeHost {
        FakeHost(HashMap::from([
            ("/usr", None),
            ("/etc", None),
            ("/bin", Some("usr/bin")),
            ("/lib", Some("usr/lib")),
            ("/lib64", Some("usr/lib64")),
        ]))
    }

    #[test]
    fn merged_usr_links_are_recreated_not_bound() {
        let ops = plan(&JobSpec::new(vec!["true".into()]), &merged_usr());
        assert!(ops.contains(&MountOp::Symlink { target: "usr/bin".into(), dst: "/bin".into() }));
        assert!(ops.iter().any(|o| matches!(o, MountOp::Bind { dst, rw: false, .. } if dst == Path::new("/usr"))));
        // absent paths are neither bound nor linked
        assert!(!ops.iter().any(|o| matches!(o, MountOp::Bind { dst, .. } if dst == Path::new("/sbin"))));
    }

    #[test]
    fn workspace_is_read_only_unless_asked() {
        let mut spec = JobSpec::new(vec!["true".into()]);
        spec.workspace = Some("/src".into());
        let ro = plan(&spec, &merged_usr());
        assert!(ro.iter().any(|o| matches!(o, MountOp::Bind { dst, rw: false, .. } if dst == Path::new("/workspace"))));
        spec.workspace_rw = true;
        let rw = plan(&spec, &merged_usr());
        assert!(rw.iter().any(|o| matches!(o, MountOp::Bind { dst, rw: true, .. } if dst == Path::new("/workspace"))));
    }

    #[test]
    fn proc_is_mounted_before_it_is_masked() {
        let ops = plan(&JobSpec::new(vec!["true".into()]), &merged_usr());
        let proc_at = ops.iter().position(|o| matches!(o, MountOp::Proc { .. })).unwrap();
        let kcore_at =
            ops.iter().position(|o| matches!(o, MountOp::MaskFile { dst } if dst == Path::new("/proc/kcore"))).unwrap();
        let sys_at =
            ops.iter().position(|o| matches!(o, MountOp::ReadOnly { dst } if dst == Path::new("/proc/sys"))).unwrap();
        assert!(proc_at < kcore_at && proc_at < sys_at);
    }

    #[test]
    fn tmp_has_the_requested_cap() {
        let mut spec = JobSpec::new(vec!["true".into()]);
        spec.limits.tmp_size_bytes = 1234;
        let ops = plan(&spec, &merged_usr());
        assert!(ops.contains(&MountOp::Tmpfs { dst: "/tmp".into(), size: 1234, mode: 0o1777, inodes: 1024 }));
        spec.limits.tmp_size_bytes = 64 << 20;
        let ops = plan(&spec, &merged_usr());
        assert!(ops.contains(&MountOp::Tmpfs { dst: "/dev/shm".into(), size: 64 << 20, mode: 0o1777, inodes: 16384 }));
    }
}
