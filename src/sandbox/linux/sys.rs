//! Thin, typed wrappers for the few syscalls nix does not cover
//! (`clone` with namespace flags and no new stack, `mount_setattr`, the
//! `lo` interface flags), and the one error type of the init stage.
//!
//! One syscall per `unsafe` block, each with the reason it is sound.

use nix::errno::Errno;
use std::ffi::CString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// A failed step of building the sandbox, with the path it was about.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// `{step} {path}: {source}`
    #[error("{step} {path}: {source}")]
    Path { step: &'static str, path: PathBuf, source: Errno },
    /// `{step} {path}: {source}`
    #[error("{step} {path}: {source}")]
    Io { step: &'static str, path: PathBuf, source: std::io::Error },
    /// `{step}: {source}`
    #[error("{step}: {source}")]
    Call { step: &'static str, source: Errno },
    /// `{step}: {message}`
    #[error("{step}: {message}")]
    Other { step: &'static str, message: String },
}

impl SysError {
    pub fn path(step: &'static str, path: &Path, source: Errno) -> Self {
        SysError::Path { step, path: path.to_path_buf(), source }
    }
    pub fn io(step: &'static str, path: &Path, source: std::io::Error) -> Self {
        SysError::Io { step, path: path.to_path_buf(), source }
    }
    pub fn call(step: &'static str, source: Errno) -> Self {
        SysError::Call { step, source }
    }
    pub fn other(step: &'static str, message: impl std::fmt::Display) -> Self {
        SysError::Other { step, message: message.to_string() }
    }
    /// The step that failed, for the `SetupFailed` report.
    pub fn step(&self) -> &'static str {
        match self {
            SysError::Path { step, .. }
            | SysError::Io { step, .. }
            | SysError::Call { step, .. }
            | SysError::Other { step, .. } => step,
        }
    }
}

/// `clone(2)` with `flags` and no new stack: fork semantics (the child
/// continues here on a copy-on-write copy of our stack) plus new namespaces.
/// Returns 0 in the child and the child's pid in the parent.
///
/// Only sound in a single-threaded process, which the `__init` stage is.
pub fn clone_fork(flags: libc::c_int) -> Result<libc::pid_t, Errno> {
    // SAFETY: with a null stack pointer clone behaves like fork: the child
    // gets a private copy of our address space. The caller is the
    // single-threaded init stage, so no lock can be held by another thread
    // at the time of the copy. x86_64 argument order: flags, stack,
    // parent_tid, child_tid, tls; the unused pointers are null.
    let ret = unsafe {
        libc::syscall(libc::SYS_clone, (flags | libc::SIGCHLD) as libc::c_ulong, 0usize, 0usize, 0usize, 0usize)
    };
    Errno::result(ret).map(|pid| pid as libc::pid_t)
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `clone3(2)` with `flags`, fork semantics, and the child born in the
/// cgroup v2 directory `cgroup` (CLONE_INTO_CGROUP, Linux 5.7). Joining
/// at birth skips the write to `cgroup.procs`, whose migration waits for
/// an RCU grace period: this is what crun does.
///
/// Only sound in a single-threaded process, which the `__init` stage is.
pub fn clone3_into_cgroup(flags: libc::c_int, cgroup: &std::os::fd::OwnedFd) -> Result<libc::pid_t, Errno> {
    use std::os::fd::AsRawFd;
    let args = CloneArgs {
        flags: flags as u32 as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: args is a valid clone_args of the size passed. With no stack
    // given, clone3 behaves like fork: the child runs on a copy-on-write
    // copy of our stack. The caller is single-threaded (see above).
    let ret = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    Errno::result(ret).map(|pid| pid as libc::pid_t)
}

/// A pidfd for `pid` (Linux 5.3): it refers to that very process, however
/// its pid is reused later, and polls readable once the process exits.
pub fn pidfd_open(pid: libc::pid_t) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags, no pointers.
    let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = Errno::result(ret)?;
    // SAFETY: the kernel just returned this new fd; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) })
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: libc::c_uint = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Add mount attributes to `path` (and its submounts when `recursive`),
/// with `mount_setattr(2)` (Linux 5.12). Older kernels fall back to a
/// remount of each mount, the top one and (when `recursive`) every one
/// below it, keeping the flags the kernel locked on each.
pub fn set_mount_attrs(path: &Path, attrs: u64, recursive: bool) -> Result<(), SysError> {
    let cpath = cstr(path)?;
    let attr = MountAttr { attr_set: attrs, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: cpath is a valid NUL-terminated string and attr a valid
    // struct of the size we pass; the kernel only reads both.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            cpath.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    match Errno::result(ret) {
        Ok(_) => Ok(()),
        Err(Errno::ENOSYS) => {
            remount_fallback(path, attrs)?;
            if recursive {
                // mountinfo names mounts by their real path: one reached
                // through a symbolic link would match nothing below it.
                let real = std::fs::canonicalize(path).map_err(|e| SysError::io("resolve", path, e))?;
                let file = Path::new("/proc/self/mountinfo");
                let info = std::fs::read(file).map_err(|e| SysError::io("read mountinfo", file, e))?;
                if !mount_points(&info).any(|p| p == real) {
                    return Err(SysError::other(
                        "set mount flags",
                        format!("{} is not a mount point in /proc/self/mountinfo", real.display()),
                    ));
                }
                for below in mounts_below(&info, &real) {
                    remount_fallback(&below, attrs)?;
                }
            }
            Ok(())
        }
        Err(e) => Err(SysError::path("set mount flags", path, e)),
    }
}

/// The mount points strictly below `path` in `/proc/self/mountinfo`'s
/// text, parents before children. A mount point's name is escaped there
/// (`\040` for a space, and tab, newline and backslash alike), since a
/// directory's name can hold any of them.
pub fn mounts_below(info: &[u8], path: &Path) -> Vec<PathBuf> {
    let mut below: Vec<PathBuf> = mount_points(info).filter(|p| p != path && p.starts_with(path)).collect();
    below.sort_by_key(|p| p.components().count());
    below.dedup();
    below
}

/// Every mount point of a mountinfo text, unescaped (names need not be
/// UTF-8).
fn mount_points(info: &[u8]) -> impl Iterator<Item = PathBuf> + '_ {
    info.split(|b| *b == b'\n')
        .filter_map(|line| line.split(|b| *b == b' ').nth(4))
        .map(|escaped| PathBuf::from(std::ffi::OsString::from_vec(unescape_mountinfo(escaped))))
}

fn unescape_mountinfo(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .map(|d| d.iter().fold(0u16, |n, c| n * 8 + u16::from(c - b'0')))
            .and_then(|n| u8::try_from(n).ok());
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

fn remount_fallback(path: &Path, attrs: u64) -> Result<(), SysError> {
    use nix::mount::MsFlags;
    use nix::sys::statvfs::{statvfs, FsFlags};
    let current = statvfs(path).map_err(|e| SysError::path("statvfs", path, e))?.flags();
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
    for (have, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
    ] {
        if current.contains(have) {
            flags |= ms;
        }
    }
    for (attr, ms) in [
        (MOUNT_ATTR_RDONLY, MsFlags::MS_RDONLY),
        (MOUNT_ATTR_NOSUID, MsFlags::MS_NOSUID),
        (MOUNT_ATTR_NODEV, MsFlags::MS_NODEV),
        (MOUNT_ATTR_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if attrs & attr != 0 {
            flags |= ms;
        }
    }
    let nil: Option<&str> = None;
    nix::mount::mount(nil, path, nil, flags, nil).map_err(|e| SysError::path("remount", path, e))
}

pub fn cstr(path: &Path) -> Result<CString, SysError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError::path("path", path, Errno::EINVAL))
}

/// Bring `lo` up in the current (fresh) network namespace.
pub fn loopback_up() -> Result<(), SysError> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    use std::os::fd::AsRawFd;
    let sock = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| SysError::call("socket for lo", e))?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the name and writes ifru_flags of the
    // ifreq we own; the socket fd is open for the duration of the call.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) };
    Errno::result(ret).map_err(|e| SysError::call("get lo flags", e))?;
    // SAFETY: the previous ioctl filled the flags member of the union.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads the ifreq.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("set lo up", e))
}

/// Make this process non-dumpable: no ptrace attach, /proc/PID owned by root.
pub fn set_not_dumpable() -> Result<(), SysError> {
    set_dumpable(false)
}

/// `PR_SET_DUMPABLE`: whether the process's /proc files belong to its own
/// uid (and it may be ptraced by its uid) or to root.
pub fn set_dumpable(on: bool) -> Result<(), SysError> {
    // SAFETY: PR_SET_DUMPABLE takes an integer flag and no pointers.
    let ret = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(on), 0, 0, 0) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("set dumpable", e))
}

/// Set `no_new_privs`: execve can never grant privileges again.
pub fn set_no_new_privs() -> Result<(), SysError> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer flags and no pointers.
    let ret = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("set no_new_privs", e))
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// `open_tree(fd, "", OPEN_TREE_CLONE)` (Linux 5.2): a detached copy of
/// the mount at the object `fd` refers to, rooted at that very object
/// (a bind that never looks a path up again). Not recursive.
pub fn open_tree_clone(fd: &std::os::fd::OwnedFd) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    // SAFETY: an open fd and an empty NUL-terminated path; the kernel
    // returns a new fd or -1.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    let tree = Errno::result(ret)?;
    // SAFETY: the kernel just returned this new fd; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(tree as libc::c_int) })
}

/// Add mount attributes to the mount `fd` refers to (a detached tree from
/// [`open_tree_clone`]), with `mount_setattr(2)` on the fd itself.
pub fn set_mount_attrs_fd(fd: &std::os::fd::OwnedFd, attrs: u64) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let attr = MountAttr { attr_set: attrs, attr_clr: 0, propagation: 0, userns_fd: 0 };
    // SAFETY: an open fd, an empty NUL-terminated path and a valid struct
    // of the size passed; the kernel only reads them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(ret).map(drop)
}

/// Set `attrs` on the detached tree `tree` and every mount in it, and
/// make them private, as [`set_mount_idmap`] does without a mapping.
pub fn set_tree_attrs(tree: &std::os::fd::OwnedFd, attrs: u64) -> Result<(), Errno> {
    set_tree(tree, MountAttr { attr_set: attrs, attr_clr: 0, propagation: libc::MS_PRIVATE, userns_fd: 0 })
}

/// `mount_setattr(2)` of `attr` on the detached tree `tree`, recursively.
fn set_tree(tree: &std::os::fd::OwnedFd, attr: MountAttr) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: an open fd, an empty NUL-terminated path and a valid struct
    // of the size passed; the kernel only reads them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(ret).map(drop)
}

/// `move_mount(2)` of the detached tree `from` onto the object `onto`
/// refers to: no path is looked up, so nothing can be swapped in between.
pub fn move_mount_onto(from: &std::os::fd::OwnedFd, onto: &std::os::fd::OwnedFd) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: two open fds and empty NUL-terminated paths.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            onto.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    Errno::result(ret).map(drop)
}

/// `openat2(2)` (Linux 5.6), as [`crate::dirfd::openat2`], with the errno.
pub fn openat2(
    dir: &std::os::fd::OwnedFd,
    rel: &Path,
    flags: libc::c_int,
    resolve: u64,
) -> Result<std::os::fd::OwnedFd, Errno> {
    crate::dirfd::openat2(dir, rel, flags, resolve).map_err(|e| e.raw_os_error().map_or(Errno::EINVAL, Errno::from_raw))
}

/// `open_tree(fd, "", OPEN_TREE_CLONE | AT_RECURSIVE)`: a detached copy
/// of the mount at `fd`'s object with every mount below it.
pub fn open_tree_clone_recursive(fd: &std::os::fd::OwnedFd) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE;
    // SAFETY: an open fd and an empty NUL-terminated path; the kernel
    // returns a new fd or -1.
    let ret = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    let tree = Errno::result(ret)?;
    // SAFETY: the kernel just returned this new fd; nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(tree as libc::c_int) })
}

/// `MOUNT_ATTR_IDMAP`: the mount shows its files' owners through a user
/// namespace's id mapping (Linux 5.12).
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Set `attrs` and the id mapping of the user namespace `userns` on the
/// detached tree `tree` and every mount in it, and make them private: a
/// copy of a shared host mount would otherwise stay in its peer group, and
/// the job's mounts on it would show on the host.
pub fn set_mount_idmap(tree: &std::os::fd::OwnedFd, userns: &std::os::fd::OwnedFd, attrs: u64) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    set_tree(
        tree,
        MountAttr {
            attr_set: attrs | MOUNT_ATTR_IDMAP,
            attr_clr: 0,
            propagation: libc::MS_PRIVATE,
            userns_fd: userns.as_raw_fd() as u64,
        },
    )
}

/// `move_mount(2)` of the detached tree `tree` onto `target`, a path of
/// pid 1's own staging root (nothing a job has seen, so the path can be
/// trusted).
pub fn move_mount_to(tree: &std::os::fd::OwnedFd, target: &Path) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let c = CString::new(target.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: an open fd, an empty path and a NUL-terminated target path.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    Errno::result(ret).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fallback before `mount_setattr` remounts what is below a bind:
    /// it must find every mount under it, by its real name, and no other.
    #[test]
    fn mounts_below_finds_every_submount_by_its_real_name() {
        let info = b"\
22 1 8:1 / / rw,relatime - ext4 /dev/vda rw
40 22 0:30 / /ws rw - ext4 /dev/vdb rw
41 40 0:31 / /ws/a\\040b rw - tmpfs tmpfs rw
42 41 0:32 / /ws/a\\040b/deep rw - tmpfs tmpfs rw
43 22 0:33 / /wsx rw - tmpfs tmpfs rw
44 40 0:34 / /ws/new\\012line\\134 rw - tmpfs tmpfs rw
45 40 0:35 / /ws/odd\\9 rw - tmpfs tmpfs rw
46 40 0:36 / /ws/\xff rw - tmpfs tmpfs rw
";
        let below = mounts_below(info, Path::new("/ws"));
        let names: Vec<&Path> = below.iter().map(PathBuf::as_path).collect();
        assert_eq!(
            names,
            [
                Path::new("/ws/a b"),
                Path::new("/ws/new\nline\\"),
                Path::new("/ws/odd\\9"),
                Path::new(std::ffi::OsStr::from_bytes(b"/ws/\xff")),
                Path::new("/ws/a b/deep")
            ],
            "parents first; /wsx is not below /ws"
        );
        assert!(mounts_below(info, Path::new("/ws/a b/deep")).is_empty());
    }
}
