//! The job's private root: planned as data by the supervisor, built by pid 1.
//!
//! [`plan`] turns a [`JobSpec`] into an ordered list of [`MountOp`]s: a
//! tmpfs root, read-only binds of the system paths, the workspace, a capped
//! /tmp, a minimal /dev and a fresh, masked /proc. [`open_sources`] runs in
//! the outer stage, as host root: it opens every bind source, and every
//! path of a read-write workspace to protect, inside pid 1's mount
//! namespace (through `/proc/<pid1>/root`), and [`send_sources`] hands the
//! fds to pid 1, which never needs host credentials. [`build`] runs in pid
//! 1, in the new user and mount namespaces; [`enter`] pivots into the
//! result and detaches the host's root. This module must never mount
//! anything in the host's mount namespace: every mount happens in pid 1,
//! after `CLONE_NEWNS`.

use super::mount_point;
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

/// Device nodes of the minimal /dev. `/dev/tty` names the controlling
/// terminal of the process that opens it: a job's session has none but a
/// pty of its own (its private `/dev/pts`, or `--tty`'s), never its
/// caller's (pid 1 starts it in a session of its own), so it is there for
/// every job, as programs that ask for a password expect.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The most ptys a job's own devpts instance holds at once. Every devpts
/// instance but the host's draws from one pool of the kernel's
/// (`kernel.pty.max` less `kernel.pty.reserve`, 3072 by default): one job
/// must not take all of it from the others. A test suite that drives
/// programs through ptys holds a few at a time.
pub const PTY_MAX: u32 = 16;

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

/// The real host: its file system here, and our ids and fresh user
/// namespace owners for [`super::Host`].
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
            Ok(None) => ops.push(MountOp::Bind {
                src: path.into(),
                dst: path.into(),
                rw: false,
                dev: false,
                optional: true,
                exact: false,
                idmap: None,
                workspace: false,
            }),
            Err(_) => {}
        }
    }
    let tmp = spec.limits.tmp_size_bytes;
    ops.push(MountOp::Tmpfs { dst: "/tmp".into(), size: tmp, mode: 0o1777, inodes: tmpfs_inodes(tmp) });
    ops.push(MountOp::Tmpfs { dst: "/dev".into(), size: 64 * 1024, mode: 0o755, inodes: 64 });
    for dev in DEVICES {
        let p = Path::new("/dev").join(dev);
        ops.push(MountOp::Bind {
            src: p.clone(),
            dst: p,
            rw: true,
            dev: true,
            // A host without /dev/tty (some container images) still runs
            // jobs, as it did before every job had one.
            optional: *dev == "tty",
            exact: false,
            idmap: None,
            workspace: false,
        });
    }
    ops.push(MountOp::Devpts { dst: "/dev/pts".into(), max: PTY_MAX });
    if spec.tty {
        ops.push(MountOp::Terminal);
    }
    for (name, target) in [
        ("ptmx", "pts/ptmx"),
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
    // The workspace and the user's binds after the sandbox's own mounts:
    // one under /tmp (a workspace at its host path in a temporary
    // directory) lands in the private /tmp instead of under it, hidden.
    if let Some(ws) = &spec.workspace {
        ops.push(MountOp::Bind {
            src: ws.clone(),
            dst: spec.workspace_at.clone(),
            rw: spec.workspace_rw,
            dev: false,
            optional: false,
            exact: true,
            idmap: None,
            workspace: true,
        });
        if spec.workspace_rw {
            for path in &spec.protect {
                ops.push(MountOp::Protect { base: spec.workspace_at.clone(), path: path.clone() });
            }
        }
    }
    for bind in &spec.binds {
        ops.push(MountOp::Bind {
            src: bind.source.clone(),
            dst: bind.dest.clone(),
            rw: bind.writable,
            dev: false,
            optional: false,
            exact: true,
            idmap: None,
            workspace: false,
        });
    }
    if spec.network == Network::Host {
        // Name resolution on the host network may need the resolver's runtime dir.
        for p in ["/run/systemd/resolve", "/run/resolvconf"] {
            if host.symlink_target(Path::new(p)).is_ok() {
                ops.push(MountOp::Bind {
                    src: p.into(),
                    dst: p.into(),
                    rw: false,
                    dev: false,
                    optional: true,
                    exact: false,
                    idmap: None,
                    workspace: false,
                });
            }
        }
    }
    ops
}

/// What pid 1 mounts from, per op of the plan, opened for it by the outer
/// stage: a bind's source, a detached idmapped copy of one, or the
/// components of a path to protect (the directories on the way, then the
/// path itself).
#[derive(Debug)]
pub enum Source {
    None,
    Bind(OwnedFd),
    /// A detached mount tree (`open_tree`), idmapped, private and with
    /// the bind's attributes already set: pid 1 only moves it in place.
    Tree(OwnedFd),
    /// A detached copy as [`Source::Tree`], not idmapped: a warm
    /// sandbox's bind, opened from the host's mount namespace after pid 1
    /// has covered its own copy of the host's /tmp.
    Detached(OwnedFd),
    Protect(Vec<OwnedFd>),
}

/// Open, as host root in the outer stage, every source of `ops` inside the
/// mount namespace of pid 1 (host pid `pid1`), so that pid 1 can bind them.
/// Returns the sources and, for each bind whose idmap was asked for but
/// could not be made, `dst: why` (it is then bound plainly).
///
/// A source is looked up from pid 1's root (`RESOLVE_IN_ROOT`). An exact
/// one (the workspace, the user's binds, toolchain roots: all canonical)
/// must meet no symlink on the way: one there means the path changed since
/// it was resolved (a job sharing the directory can do that), and it is
/// refused. A path to protect is walked one component at a time from its
/// base's source with `O_NOFOLLOW`, as root, so a job can't hide it behind
/// its permissions (`chmod 000 .git`) or a symlink.
///
/// A bind with an idmap ([`MountOp::Bind`]'s `idmap`) is copied here
/// instead, from our own mount namespace (the one pid 1's was copied from:
/// `open_tree` copies only mounts of the caller's namespace), and the copy
/// is idmapped: only host root may, as the file system's superblock
/// belongs to the host. `job` is the job's host (uid, gid).
///
/// `detached` (a warm sandbox's request, whose pid 1 has built its root
/// already): every bind is a detached copy from our own mount namespace,
/// idmapped or not, since pid 1's no longer shows the host's paths.
pub fn open_sources(
    pid1: libc::pid_t,
    ops: &[MountOp],
    job: (u32, u32),
    rootless: bool,
    sweep: Option<&super::sweep::SweepRecord>,
    detached: bool,
    premade: Vec<IdmapNamespace>,
) -> Result<Opened, SysError> {
    let proc_root = PathBuf::from(format!("/proc/{pid1}/root"));
    let root = open(proc_root.as_path(), OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::path("open pid 1's root", &proc_root, e))?;
    let mut idmaps = Idmaps { job, namespaces: premade.into_iter().map(|n| (n.owner, n.fd)).collect(), own_root: None };
    let mut not_idmapped = Vec::new();
    let mut idmapped = Vec::new();
    let mut out: Vec<Source> = Vec::with_capacity(ops.len());
    for op in ops {
        let source = match op {
            MountOp::Bind { src, dst, rw, idmap: Some(owner), workspace, .. } if !rootless => {
                // What is protected is mounted read-only over the tree:
                // nothing there can be written, so it needn't be checked.
                let skip = protected_under(ops, dst);
                // Protection asked for (the default with --rw), or a bind,
                // which has none: every repository in the tree must be
                // protected, and those the job makes are disowned after it
                // (`idmap_check`).
                let guard = !skip.is_empty() || !workspace;
                let swept = sweep.and_then(|r| r.inode_of(dst));
                match idmaps.tree(src, *owner, *rw, &skip, guard, swept) {
                    Ok(tree) => {
                        idmapped.push(dst.clone());
                        Some(Source::Tree(tree))
                    }
                    Err(why) => {
                        not_idmapped.push(format!("{}: {why}", dst.display()));
                        None
                    }
                }
            }
            MountOp::Bind { dst, idmap: Some(_), .. } => {
                not_idmapped.push(format!("{}: {IDMAP_ROOTLESS}", dst.display()));
                None
            }
            _ => None,
        };
        let source = match (source, op) {
            (Some(tree), _) => tree,
            (None, MountOp::Bind { src, .. }) if !recursive(src) && rootless => {
                return Err(SysError::other("bind", ROOT_ROOTLESS));
            }
            // Alone, it is copied here, as host root: pid 1 may bind a
            // tree of its namespace only whole, with what is below it.
            (None, MountOp::Bind { src, rw, dev, optional, exact, .. }) if detached || !recursive(src) => {
                bind_source(idmaps.detached(src, *rw, *dev, *exact).map(Source::Detached), src, *optional, *exact)?
            }
            (None, MountOp::Bind { src, optional, exact, .. }) => {
                bind_source(open_in_root(&root, &proc_root, src, *exact).map(Source::Bind), src, *optional, *exact)?
            }
            (None, MountOp::Protect { base, path }) => {
                let base_fd = ops.iter().zip(&out).find_map(|(o, s)| match (o, s) {
                    (MountOp::Bind { dst, .. }, Source::Bind(fd) | Source::Tree(fd) | Source::Detached(fd))
                        if dst == base =>
                    {
                        Some(fd)
                    }
                    _ => None,
                });
                match base_fd {
                    Some(fd) => walk_protected(fd, path)?,
                    None => Source::None,
                }
            }
            _ => Source::None,
        };
        out.push(source);
    }
    Ok(Opened { sources: out, not_idmapped, idmapped })
}

/// A bind's source as opened, or what its failure means: an optional one
/// that is not there is skipped; a link met on an exact one's path is
/// refused (the path changed since it was resolved).
fn bind_source(
    opened: Result<Source, nix::errno::Errno>,
    src: &Path,
    optional: bool,
    exact: bool,
) -> Result<Source, SysError> {
    match opened {
        Ok(source) => Ok(source),
        Err(nix::errno::Errno::ENOENT) if optional => Ok(Source::None),
        Err(nix::errno::Errno::ELOOP | nix::errno::Errno::EXDEV) if exact => Err(SysError::other(
            "open bind source",
            format!(
                "{}: a symbolic link appeared on its path since it was resolved (something is changing it); \
                 nothing was bound",
                src.display()
            ),
        )),
        Err(e) => Err(SysError::path("open bind source", src, e)),
    }
}

/// The paths protected inside the bind at `dst` (relative to it).
pub fn protected_under(ops: &[MountOp], dst: &Path) -> Vec<PathBuf> {
    ops.iter()
        .filter_map(|o| match o {
            MountOp::Protect { base, path } if base == dst => Some(path.clone()),
            _ => None,
        })
        .collect()
}

/// What [`open_sources`] opened: a source for each op, and the binds not
/// idmapped (`dst: why`).
pub struct Opened {
    pub sources: Vec<Source>,
    pub not_idmapped: Vec<String>,
    /// The destinations of the binds that were idmapped.
    pub idmapped: Vec<PathBuf>,
}

/// Why a rootless job can't have the host's `/`.
const ROOT_ROOTLESS: &str = "the host's / can't be bound by a rootless confine: it would come with every file \
system below it (the kernel binds a less privileged namespace's mounts only together), and with the sockets \
there (your session bus, agents, display), which a read-only mount does not close; bind the directories the \
job needs, or run confine as root";

/// Why a rootless job gets no idmapped mount.
const IDMAP_ROOTLESS: &str = "rootless: an idmapped mount of a host file system needs host root";

/// A user namespace that shows `owner`'s files as the job's
/// ([`super::namespaces::idmap_userns`]), made before it was needed.
pub struct IdmapNamespace {
    owner: (u32, u32),
    fd: OwnedFd,
}

impl IdmapNamespace {
    /// Make the namespace of `owner` for a job of host ids `job`.
    pub fn make(owner: (u32, u32), job: (u32, u32)) -> Result<IdmapNamespace, SysError> {
        Ok(IdmapNamespace { owner, fd: super::namespaces::idmap_userns(owner, job)? })
    }
}

/// The idmapped copies of one job's binds, and the user namespaces that
/// hold their mappings (one per owner).
struct Idmaps {
    job: (u32, u32),
    namespaces: Vec<((u32, u32), OwnedFd)>,
    own_root: Option<OwnedFd>,
}

impl Idmaps {
    /// Our own root, opened once.
    fn own_root(&mut self) -> Result<&OwnedFd, nix::errno::Errno> {
        if self.own_root.is_none() {
            self.own_root = Some(open("/", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())?);
        }
        self.own_root.as_ref().ok_or(nix::errno::Errno::ENOENT)
    }

    /// A detached copy of `src` (and every mount below it), private, with
    /// the bind's attributes: what a plain bind would mount, taken from
    /// our own mount namespace. `exact`: no symlink on the way.
    fn detached(&mut self, src: &Path, rw: bool, dev: bool, exact: bool) -> Result<OwnedFd, nix::errno::Errno> {
        let root = self.own_root()?;
        let rel = relative(src);
        let mut resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        if exact {
            resolve |= libc::RESOLVE_NO_SYMLINKS;
        }
        let fd = sys::openat2(root, rel, libc::O_PATH | libc::O_CLOEXEC, resolve)?;
        let tree = if recursive(src) { sys::open_tree_clone_recursive(&fd)? } else { sys::open_tree_clone(&fd)? };
        let mut attrs = sys::MOUNT_ATTR_NOSUID;
        attrs |= if dev { sys::MOUNT_ATTR_NOEXEC } else { sys::MOUNT_ATTR_NODEV };
        if !rw {
            attrs |= sys::MOUNT_ATTR_RDONLY;
        }
        sys::set_tree_attrs(&tree, attrs)?;
        Ok(tree)
    }

    /// A detached copy of `src` (and every mount below it) that shows
    /// `owner`'s files as the job's, with the bind's attributes; or why not.
    fn tree(
        &mut self,
        src: &Path,
        owner: (u32, u32),
        rw: bool,
        skip: &[PathBuf],
        guard: bool,
        swept: Option<(u64, u64)>,
    ) -> Result<OwnedFd, NotIdmapped> {
        let errno = |step: &'static str| move |source| NotIdmapped::Sys { step, source };
        let root = self.own_root().map_err(errno("opening /"))?;
        let rel = relative(src);
        let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
        let fd =
            sys::openat2(root, rel, libc::O_PATH | libc::O_CLOEXEC, resolve).map_err(errno("opening the source"))?;
        let st = nix::sys::stat::fstat(&fd).map_err(errno("stat"))?;
        // The supervisor sweeps the directory it opened: one swapped in at
        // the path since would be written and never swept.
        if swept.is_some_and(|inode| inode != (st.st_dev, st.st_ino)) {
            return Err(NotIdmapped::Replaced);
        }
        if rw && guard && swept.is_none() {
            return Err(NotIdmapped::NotSwept);
        }
        // Changed owner since the plan: map what is there now.
        let owner = if (st.st_uid, st.st_gid) == owner { owner } else { (st.st_uid, st.st_gid) };
        if owner == self.job {
            return Err(NotIdmapped::JobOwned);
        }
        if rw {
            super::idmap_check::check(&fd, owner, skip, guard)?;
        }
        let tree = sys::open_tree_clone_recursive(&fd).map_err(errno("open_tree"))?;
        let userns = match self.namespaces.iter().find(|(o, _)| *o == owner) {
            Some((_, ns)) => ns,
            None => {
                let ns = super::namespaces::idmap_userns(owner, self.job).map_err(NotIdmapped::Userns)?;
                self.namespaces.push((owner, ns));
                &self.namespaces[self.namespaces.len() - 1].1
            }
        };
        let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
        if !rw {
            attrs |= sys::MOUNT_ATTR_RDONLY;
        }
        sys::set_mount_idmap(&tree, userns, attrs).map_err(idmap_refused)?;
        Ok(tree)
    }
}

/// Why a bind's tree is not idmapped: the outcome lists it, after the
/// bind's destination.
#[derive(Debug, thiserror::Error)]
enum NotIdmapped {
    #[error("{step} failed: {source}")]
    Sys { step: &'static str, source: nix::errno::Errno },
    #[error("it is not the directory the supervisor opened a moment ago (its path was replaced)")]
    Replaced,
    #[error("the supervisor could not open it to sweep after the job")]
    NotSwept,
    #[error("it now belongs to the job's own ids")]
    JobOwned,
    #[error(transparent)]
    Refused(#[from] super::idmap_check::IdmapRefusal),
    #[error("{0}")]
    Userns(SysError),
    #[error("this kernel has no idmapped mounts (Linux 5.12 or later has)")]
    NoKernelSupport,
    #[error("the file system (or one mounted below it) does not support idmapped mounts (EINVAL)")]
    NoFsSupport,
    #[error("the kernel refused an idmapped mount: {0}")]
    Kernel(nix::errno::Errno),
}

/// Why `mount_setattr(MOUNT_ATTR_IDMAP)` failed, in the user's words.
fn idmap_refused(e: nix::errno::Errno) -> NotIdmapped {
    match e {
        nix::errno::Errno::ENOSYS => NotIdmapped::NoKernelSupport,
        nix::errno::Errno::EINVAL => NotIdmapped::NoFsSupport,
        e => NotIdmapped::Kernel(e),
    }
}

/// `src` (absolute) looked up from `root` (pid 1's root): `openat2` with
/// `RESOLVE_IN_ROOT` (and `RESOLVE_NO_SYMLINKS` when `exact`), else, on
/// kernels before 5.6, `open` of the path under `/proc/<pid1>/root`.
fn open_in_root(root: &OwnedFd, proc_root: &Path, src: &Path, exact: bool) -> Result<OwnedFd, nix::errno::Errno> {
    let rel = relative(src);
    let mut resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    if exact {
        resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    match sys::openat2(root, rel, libc::O_PATH | libc::O_CLOEXEC, resolve) {
        Err(nix::errno::Errno::ENOSYS | nix::errno::Errno::E2BIG | nix::errno::Errno::EPERM) => {
            let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
            if exact {
                flags |= OFlag::O_NOFOLLOW;
            }
            open(proc_root.join(rel).as_path(), flags, Mode::empty())
        }
        other => other,
    }
}

/// The components of `path` under `base`, each opened with `O_NOFOLLOW`
/// from the one before: the directories on the way, then the path itself
/// (a file where a directory was expected, a `.git` gitfile, ends the walk
/// and is what is protected). Not there: nothing to protect. A symlink on
/// the way: refused, since a job could repoint it.
fn walk_protected(base: &OwnedFd, path: &Path) -> Result<Source, SysError> {
    use std::path::Component;
    let refuse = |what: String| {
        SysError::other(
            "protect",
            format!(
                "cannot keep {} read-only: {what}; if a job left it there, remove it (--no-protect would give the \
                 job the rest as well)",
                path.display()
            ),
        )
    };
    let names: Vec<&std::ffi::OsStr> = path
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(refuse("the path must be relative to the workspace, without '.' or '..'".into())),
        })
        .collect::<Result<_, _>>()?;
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(names.len());
    let mut done = PathBuf::new();
    for name in names {
        let at = fds.last().unwrap_or(base);
        let fd = match nix::fcntl::openat(at, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) => return Ok(Source::None),
            // The base itself can't be searched: only rootless (root reads
            // past permissions), where the job has our ids and can't enter
            // it either; it is refused before it runs (`usable_binds`).
            Err(nix::errno::Errno::EACCES) if fds.is_empty() => return Ok(Source::None),
            Err(e) => return Err(SysError::path("open protected path", &done.join(name), e)),
        };
        done.push(name);
        let st = nix::sys::stat::fstat(&fd).map_err(|e| SysError::path("stat protected path", &done, e))?;
        fds.push(fd);
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => return Err(refuse(format!("{} is a symbolic link", done.display()))),
            libc::S_IFDIR => {}
            // Another name (a hard link) elsewhere in the workspace would
            // stay writable: the file could be written through it.
            libc::S_IFREG if st.st_nlink > 1 => {
                return Err(refuse(format!("{} has {} names (hard links)", done.display(), st.st_nlink)))
            }
            _ => break,
        }
    }
    Ok(Source::Protect(fds))
}

/// How many fds one message carries (the kernel takes up to 253).
const FDS_PER_MESSAGE: usize = 200;

/// Hand `sources` to pid 1 over `sock` (a `SOCK_SEQPACKET` pair made
/// before the clone): first how many fds each op has, then the fds.
pub fn send_sources(sock: &OwnedFd, sources: Vec<Source>, not_idmapped: &[String]) -> Result<(), SysError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let mut counts = Vec::with_capacity(sources.len());
    let mut fds: Vec<OwnedFd> = Vec::new();
    for s in sources {
        match s {
            Source::None => counts.push(0u8),
            Source::Bind(fd) => {
                counts.push(1);
                fds.push(fd);
            }
            Source::Tree(fd) => {
                counts.push(TREE);
                fds.push(fd);
            }
            Source::Detached(fd) => {
                counts.push(DETACHED);
                fds.push(fd);
            }
            Source::Protect(v) => {
                let n = u8::try_from(v.len())
                    .map_err(|_| SysError::other("protect", "a protected path has more than 255 components"))?;
                counts.push(n);
                fds.extend(v);
            }
        }
    }
    let send = |bytes: &[u8], fds: &[std::os::fd::RawFd]| {
        let iov = [std::io::IoSlice::new(bytes)];
        let cmsgs: Vec<ControlMessage> = if fds.is_empty() { vec![] } else { vec![ControlMessage::ScmRights(fds)] };
        sendmsg::<()>(sock.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), None)
            .map_err(|e| SysError::call("hand the mount sources to pid 1", e))
    };
    send(&counts, &[])?;
    let raw: Vec<std::os::fd::RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    for chunk in raw.chunks(FDS_PER_MESSAGE) {
        send(b"f", chunk)?;
    }
    send(format!("n{}", not_idmapped.join("\n")).as_bytes(), &[])?;
    Ok(())
}

/// The count [`send_sources`] gives a [`Source::Tree`] (one fd, and not a
/// bind to make): a bind's count is otherwise 0 or 1.
const TREE: u8 = 0x81;
/// The count [`send_sources`] gives a [`Source::Detached`].
const DETACHED: u8 = 0x82;

/// The longest list of idmap refusals pid 1 takes.
const MAX_NOT_IDMAPPED: usize = 64 * 1024;

/// Take the sources [`send_sources`] sent, for `ops`, and the idmaps it
/// could not make.
pub fn receive_sources(sock: &OwnedFd, ops: &[MountOp]) -> Result<(Vec<Source>, Vec<String>), SysError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    let err = |what: &str| SysError::other("receive the mount sources", what);
    let mut counts = vec![0u8; ops.len() + 1];
    let n = {
        let mut iov = [std::io::IoSliceMut::new(&mut counts)];
        recvmsg::<()>(sock.as_raw_fd(), &mut iov, None, MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|e| SysError::call("receive the mount sources", e))?
            .bytes
    };
    if n != ops.len() {
        return Err(err("the outer stage sent sources for another plan"));
    }
    counts.truncate(n);
    let want: usize = counts.iter().map(|&c| if c == TREE || c == DETACHED { 1 } else { usize::from(c) }).sum();
    let mut fds: Vec<OwnedFd> = Vec::with_capacity(want);
    while fds.len() < want {
        let mut byte = [0u8; 1];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; FDS_PER_MESSAGE]);
        let mut iov = [std::io::IoSliceMut::new(&mut byte)];
        let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|e| SysError::call("receive the mount sources", e))?;
        let before = fds.len();
        for cmsg in msg.cmsgs().map_err(|e| SysError::call("receive the mount sources", e))? {
            if let ControlMessageOwned::ScmRights(raw) = cmsg {
                // SAFETY: the kernel just installed these fds in this
                // process for us (SCM_RIGHTS); nothing else owns them.
                fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
            }
        }
        if fds.len() == before {
            return Err(err("a message without fds"));
        }
    }
    let mut fds = fds.into_iter();
    let mut out = Vec::with_capacity(ops.len());
    for (op, count) in ops.iter().zip(counts) {
        let mut take = || fds.next().ok_or_else(|| err("fewer fds than announced"));
        out.push(match (op, count) {
            (_, 0) => Source::None,
            (MountOp::Bind { .. }, 1) => Source::Bind(take()?),
            (MountOp::Bind { .. }, TREE) => Source::Tree(take()?),
            (MountOp::Bind { .. }, DETACHED) => Source::Detached(take()?),
            (MountOp::Protect { .. }, n) => Source::Protect((0..n).map(|_| take()).collect::<Result<_, _>>()?),
            _ => return Err(err("sources that do not match the plan")),
        });
    }
    let mut text = vec![0u8; MAX_NOT_IDMAPPED];
    let n = {
        let mut iov = [std::io::IoSliceMut::new(&mut text)];
        recvmsg::<()>(sock.as_raw_fd(), &mut iov, None, MsgFlags::MSG_CMSG_CLOEXEC)
            .map_err(|e| SysError::call("receive the mount sources", e))?
            .bytes
    };
    let text = text.get(..n).and_then(|t| t.strip_prefix(b"n")).ok_or_else(|| err("no idmap list"))?;
    let not_idmapped =
        String::from_utf8_lossy(text).split('\n').filter(|l| !l.is_empty()).map(str::to_string).collect();
    Ok((out, not_idmapped))
}

/// `src` (absolute) relative to a root: `.` for the root itself, as an
/// empty path opens nothing.
fn relative(src: &Path) -> &Path {
    match src.strip_prefix("/") {
        Ok(rel) if rel.as_os_str().is_empty() => Path::new("."),
        Ok(rel) => rel,
        Err(_) => src,
    }
}

/// Whether a bind of `src` takes the mounts below it along. The host's
/// `/` does not: below it are the host's `/proc`, `/sys`, `/dev`, `/run`
/// and `/tmp`, whose sockets (a session bus, an agent, a display server)
/// a read-only mount does not keep a job from connecting to, and, in pid
/// 1's view, the sandbox's own root being built. Its own file system is
/// what `--ro-bind /:/host` is for; a file system below it is bound on
/// its own (docs/design.md, "Binds").
pub fn recursive(src: &Path) -> bool {
    src != Path::new("/")
}

fn under(root: &Path, dst: &Path) -> PathBuf {
    root.join(dst.strip_prefix("/").unwrap_or(dst))
}

fn mkdir_p(path: &Path, mode: u32) -> Result<(), SysError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(mode).create(path).map_err(|e| SysError::io("mkdir", path, e))
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

/// What [`build`] did beyond the plan's letter.
#[derive(Debug, Default)]
pub struct Built {
    /// The paths that [`MountOp::Protect`] made read-only, as `base/path`.
    pub protected: Vec<String>,
    /// The mount points bound through an idmapped copy ([`Source::Tree`]).
    pub idmapped: Vec<String>,
}

/// Run the plan under `root` (a fresh tmpfs at [`STAGING`]), from the
/// `sources` the outer stage opened.
pub fn build(ops: &[MountOp], sources: &[Source]) -> Result<Built, SysError> {
    let nil: Option<&str> = None;
    // Nothing we mount may propagate back to the host.
    mount(nil, "/", nil, MsFlags::MS_REC | MsFlags::MS_PRIVATE, nil)
        .map_err(|e| SysError::path("make / private", Path::new("/"), e))?;
    place(ops, sources, true)
}

/// Run a warm sandbox's request part of the plan (its binds, all of them
/// detached copies, and the paths to protect in them) into the root that
/// [`build`] made from the base, before [`enter`].
pub fn build_request(ops: &[MountOp], sources: &[Source]) -> Result<Built, SysError> {
    place(ops, sources, false)
}

/// Run `ops` under the root at [`STAGING`]; `fresh`: mount that root first.
fn place(ops: &[MountOp], sources: &[Source], fresh: bool) -> Result<Built, SysError> {
    let root = Path::new(STAGING);
    let nil: Option<&str> = None;
    // An idmapped copy is already detached from the source tree: paths to
    // protect in it are protected once it is in place. The others before
    // their base is bound: its recursive bind takes them along.
    let trees: Vec<&Path> = ops
        .iter()
        .zip(sources)
        .filter_map(|(op, s)| match (op, s) {
            (MountOp::Bind { dst, .. }, Source::Tree(_) | Source::Detached(_)) => Some(dst.as_path()),
            _ => None,
        })
        .collect();
    let mut built = Built { protected: protect(ops, sources, |base| !trees.contains(&base))?, ..Built::default() };
    // The mount points of the trees bound read-write from the host so far:
    // no mount point of a later bind is made in them.
    let mut host_trees: Vec<PathBuf> = Vec::new();
    if fresh {
        mount(Some("tmpfs"), root, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some("mode=0755,size=1m"))
            .map_err(|e| SysError::path("mount root tmpfs", root, e))?;
    }

    for (op, source) in ops.iter().zip(sources) {
        match op {
            MountOp::Bind { dst, src, rw, .. } if matches!(source, Source::Tree(_) | Source::Detached(_)) => {
                let (Source::Tree(tree) | Source::Detached(tree)) = source else { continue };
                let meta = nix::sys::stat::fstat(tree).map_err(|e| SysError::path("stat bind source", src, e))?;
                let dir = meta.st_mode & libc::S_IFMT == libc::S_IFDIR;
                let target = mount_point::find_or_make(root, dst, dir, &host_trees)?;
                // Its attributes (read-only, nosuid, nodev) are set.
                sys::move_mount_to(tree, &target).map_err(|e| SysError::path("move detached mount", src, e))?;
                if matches!(source, Source::Tree(_)) {
                    built.idmapped.push(dst.display().to_string());
                }
                if *rw {
                    host_trees.push(target);
                }
            }
            MountOp::Bind { dst, rw, dev, src, .. } => {
                let Source::Bind(fd) = source else { continue };
                let meta = nix::sys::stat::fstat(fd).map_err(|e| SysError::path("stat bind source", src, e))?;
                let dir = meta.st_mode & libc::S_IFMT == libc::S_IFDIR;
                let target = mount_point::find_or_make(root, dst, dir, &host_trees)?;
                let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
                let flags = if recursive(src) { MsFlags::MS_BIND | MsFlags::MS_REC } else { MsFlags::MS_BIND };
                mount(Some(source.as_str()), &target, nil, flags, nil).map_err(|e| SysError::path("bind", src, e))?;
                let mut attrs = sys::MOUNT_ATTR_NOSUID;
                if !dev {
                    attrs |= sys::MOUNT_ATTR_NODEV;
                } else {
                    attrs |= sys::MOUNT_ATTR_NOEXEC;
                }
                if !rw {
                    attrs |= sys::MOUNT_ATTR_RDONLY;
                }
                sys::set_mount_attrs(&target, attrs, recursive(src))?;
                if *rw && !dev {
                    host_trees.push(target);
                }
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
            MountOp::Devpts { dst, max } => {
                let target = under(root, dst);
                mkdir_p(&target, 0o755)?;
                // No gid=: the host's tty group has no id in the job's
                // namespace; a pty belongs to the group of who opened it.
                let data = format!("newinstance,ptmxmode=0666,mode=0620,max={max}");
                mount(
                    Some("devpts"),
                    &target,
                    Some("devpts"),
                    MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                    Some(data.as_str()),
                )
                .map_err(|e| SysError::path("mount devpts", dst, e))?;
            }
            // Done around the binds, on the sources (see `protect`).
            MountOp::Protect { .. } => {}
        }
    }
    // The idmapped trees are in place: their paths to protect now, on the
    // very objects the outer stage opened in them.
    built.protected.extend(protect(ops, sources, |base| trees.contains(&base))?);
    Ok(built)
}

/// Bind the pty at our fd 0 (a host `/dev/pts/N`) at the new root's
/// `/dev/console`: its `/dev/pts` is the job's own devpts instance, where
/// no name of the host's can be made. fd 0 was opened in the host's mount
/// namespace, which a bind can't take from: the name is opened again
/// here, in ours, and must be the very device fd 0 is.
fn bind_terminal(root: &Path) -> Result<(), SysError> {
    let fd0 = Path::new("/proc/self/fd/0");
    let name = std::fs::read_link(fd0).map_err(|e| SysError::io("find the job's terminal", fd0, e))?;
    let not_pty = || SysError::other("find the job's terminal", format!("fd 0 is {}, not a pty", name.display()));
    name.strip_prefix("/dev/pts").ok().filter(|n| n.components().count() == 1).ok_or_else(not_pty)?;
    let fd = open(name.as_path(), OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| SysError::path("open the job's terminal", &name, e))?;
    let ours = nix::sys::stat::fstat(&fd).map_err(|e| SysError::path("stat", &name, e))?;
    // SAFETY: fd 0 is open for the whole life of this process.
    let given = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(0) })
        .map_err(|e| SysError::path("stat", fd0, e))?;
    if (ours.st_dev, ours.st_ino, ours.st_rdev) != (given.st_dev, given.st_ino, given.st_rdev) {
        return Err(not_pty());
    }
    let target = root.join("dev/console");
    touch(&target)?;
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let nil: Option<&str> = None;
    mount(Some(source.as_str()), &target, nil, MsFlags::MS_BIND, nil).map_err(|e| SysError::path("bind", &name, e))?;
    sys::set_mount_attrs(&target, sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC, false)
}

/// Keep each [`MountOp::Protect`] path read-only for the job, on the
/// workspace's source tree in pid 1's mount namespace, before the
/// workspace is bound (recursively) into the new root.
///
/// No path is looked up: the outer stage opened every component with
/// `O_NOFOLLOW`, as root ([`open_sources`]), and the mounts are made on
/// those very objects (`open_tree`, `move_mount`). The path itself is bound
/// onto itself read-only; then every directory on the way is bound onto
/// itself (recursively, deepest first, so each takes what is below it
/// along), which makes it a mount point: the job can neither rename it
/// away nor put a directory of its own in its place (a fresh `.git` with a
/// hostile `config` beside a renamed real one).
///
/// Only the paths whose base `now` holds.
fn protect(ops: &[MountOp], sources: &[Source], now: impl Fn(&Path) -> bool) -> Result<Vec<String>, SysError> {
    let mut protected = Vec::new();
    let mut pins: Vec<(usize, (u64, u64), &OwnedFd, PathBuf)> = Vec::new();
    for (op, source) in ops.iter().zip(sources) {
        let (MountOp::Protect { base, path }, Source::Protect(fds)) = (op, source) else { continue };
        if !now(base) {
            continue;
        }
        let Some((leaf, dirs)) = fds.split_last() else { continue };
        let mut shown = base.clone();
        for (depth, (fd, name)) in dirs.iter().zip(path.components()).enumerate() {
            shown.push(name);
            let st = nix::sys::stat::fstat(fd).map_err(|e| SysError::path("stat protected path", &shown, e))?;
            let key = (st.st_dev, st.st_ino);
            if !pins.iter().any(|(_, k, _, _)| *k == key) {
                pins.push((depth, key, fd, shown.clone()));
            }
        }
        let done: PathBuf = path.components().take(fds.len()).collect();
        let shown = base.join(&done);
        bind_read_only_onto_itself(leaf, &shown)?;
        protected.push(shown.display().to_string());
    }
    pins.sort_by_key(|(depth, ..)| std::cmp::Reverse(*depth));
    for (_, _, fd, shown) in pins {
        let tree = sys::open_tree_clone_recursive(fd).map_err(|e| SysError::path("pin", &shown, e))?;
        sys::move_mount_onto(&tree, fd).map_err(|e| SysError::path("pin", &shown, e))?;
    }
    Ok(protected)
}

/// Bind the object `fd` refers to onto itself, read-only. Before
/// `mount_setattr` (Linux 5.12) a detached tree can't be made read-only:
/// it is moved in place first and then remounted through its own fd
/// (`/proc/self/fd/N` is that mount, whatever its path has become). The
/// job does not run yet, so nothing sees it writable in between.
fn bind_read_only_onto_itself(fd: &OwnedFd, shown: &Path) -> Result<(), SysError> {
    let protect = |e| SysError::path("protect", shown, e);
    let attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    let tree = sys::open_tree_clone(fd).map_err(protect)?;
    match sys::set_mount_attrs_fd(&tree, attrs) {
        Ok(()) => sys::move_mount_onto(&tree, fd).map_err(protect),
        Err(nix::errno::Errno::ENOSYS) => {
            sys::move_mount_onto(&tree, fd).map_err(protect)?;
            let mount = PathBuf::from(format!("/proc/self/fd/{}", tree.as_raw_fd()));
            sys::set_mount_attrs(&mount, attrs, false)
        }
        Err(e) => Err(protect(e)),
    }
}

/// What the tmpfs at `fd` (a job's /tmp) has run out of, if anything: no
/// block, or no inode, left.
pub fn tmp_out(fd: &OwnedFd) -> Option<super::protocol::TmpOut> {
    use super::protocol::TmpOut;
    let st = nix::sys::statfs::fstatfs(fd).ok()?;
    if st.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return None;
    }
    if st.blocks_available() == 0 {
        Some(TmpOut::Space)
    } else if st.files_free() == 0 {
        Some(TmpOut::Files { total: st.files() })
    } else {
        None
    }
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

    /// A workspace may not replace a system directory as a whole
    /// (`workspace_at`): its list is this sandbox's.
    #[test]
    fn every_system_path_is_one_a_workspace_can_not_replace() {
        for p in SYSTEM_PATHS.iter().chain(&["/tmp"]) {
            assert!(crate::sandbox::workspace_at::NOT_REPLACED.contains(p), "{p}");
        }
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
