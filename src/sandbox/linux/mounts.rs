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

/// Device nodes of the minimal /dev.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// /proc files hidden behind /dev/null, as runc masks them.
const PROC_MASKED_FILES: &[&str] = &["kcore", "keys", "timer_list", "timer_stats", "sched_debug", "latency_stats"];
/// /proc directories hidden behind an empty read-only tmpfs.
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];
/// /proc paths made read-only.
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

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
    }
    ops.push(MountOp::Tmpfs { dst: "/tmp".into(), size: spec.limits.tmp_size_bytes, mode: 0o1777 });
    ops.push(MountOp::Tmpfs { dst: "/dev".into(), size: 64 * 1024, mode: 0o755 });
    for dev in DEVICES {
        let p = Path::new("/dev").join(dev);
        ops.push(MountOp::Bind { src: p.clone(), dst: p, rw: true, dev: true, optional: false });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink { target: target.into(), dst: Path::new("/dev").join(name) });
    }
    ops.push(MountOp::Tmpfs { dst: "/dev/shm".into(), size: spec.limits.tmp_size_bytes, mode: 0o1777 });
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

fn touch(path: &Path) -> Result<(), SysError> {
    if let Some(parent) = path.parent() {
        mkdir_p(parent, 0o755)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| SysError::io("create mount point", path, e))
}

/// Run the plan under `root` (a fresh tmpfs at [`STAGING`]).
pub fn build(ops: &[MountOp], fds: &[Option<OwnedFd>]) -> Result<(), SysError> {
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
            MountOp::Tmpfs { dst, size, mode } => {
                let target = under(root, dst);
                mkdir_p(&target, 0o755)?;
                let data = format!("mode={mode:o},size={size}");
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
        }
    }
    Ok(())
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
        assert!(ops.contains(&MountOp::Tmpfs { dst: "/tmp".into(), size: 1234, mode: 0o1777 }));
    }
}
