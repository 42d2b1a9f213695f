//! [`Dir`] on Unix: `openat` and friends on an owned directory fd, and
//! `openat2` on Linux.

use super::{components, not_regular, too_large, Read, Stat};
use std::ffi::{CString, OsStr, OsString};
use std::io::Read as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An open directory; everything below it is reached from its fd.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
}

/// `-1` into the last OS error.
fn check(ret: libc::c_int) -> std::io::Result<libc::c_int> {
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// One path component as a C string: no '/', not `.` or `..`, no NUL.
fn name(s: &OsStr) -> std::io::Result<CString> {
    let bytes = s.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a single file name"));
    }
    CString::new(bytes).map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a name"))
}

fn stat_of(st: &libc::stat) -> Stat {
    let kind = st.st_mode & libc::S_IFMT;
    #[allow(clippy::unnecessary_cast)] // st_mtime's type differs between targets
    let mtime_ms = (st.st_mtime as i64) * 1000 + (st.st_mtime_nsec as i64) / 1_000_000;
    Stat {
        uid: st.st_uid,
        #[allow(clippy::unnecessary_cast)] // mode_t is u16 on macOS
        mode: (st.st_mode & 0o7777) as u32,
        is_dir: kind == libc::S_IFDIR,
        is_file: kind == libc::S_IFREG,
        is_symlink: kind == libc::S_IFLNK,
        size: st.st_size as u64,
        mtime_ms,
    }
}

fn fstat(fd: &OwnedFd) -> std::io::Result<Stat> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open for the call; st is a valid, writable stat.
    check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(stat_of(&st))
}

impl Dir {
    /// Open the directory at `path`. The path is the caller's to trust
    /// (a configured repository root, a runtime directory from the
    /// environment): its symlinks are followed, what is below it is not.
    pub fn open(path: &Path) -> std::io::Result<Dir> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a path"))?;
        // SAFETY: c is a valid NUL-terminated path; the returned fd is owned below.
        let fd = check(unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
        // SAFETY: fd was just returned by open and is owned by nobody else.
        Ok(Dir { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// The directory an fd already refers to (one [`crate::safe_fs`]
    /// reached one component at a time).
    pub fn from_fd(fd: OwnedFd) -> std::io::Result<Dir> {
        if !fstat(&fd)?.is_dir {
            return Err(std::io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(Dir { fd })
    }

    /// Open `rel` below this directory, refusing any symlink on the way
    /// and `..`: `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, or,
    /// where the kernel lacks it, one `O_NOFOLLOW` `openat` per component.
    fn resolve(&self, rel: &Path, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let parts = components(rel)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a relative path inside"))?;
        #[cfg(target_os = "linux")]
        {
            let joined: PathBuf = parts.iter().collect();
            match openat2_beneath(&self.fd, &joined, flags, true) {
                Err(e) if openat2_unavailable(&e) => {}
                other => return other,
            }
        }
        self.walk(&parts, flags)
    }

    /// The portable walk: every directory on the way opened `O_NOFOLLOW |
    /// O_DIRECTORY` from the one before, the last with `flags | O_NOFOLLOW`.
    fn walk(&self, parts: &[&OsStr], flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let mut at: Option<OwnedFd> = None;
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let f = if last { flags } else { libc::O_RDONLY | libc::O_DIRECTORY };
            let dirfd = at.as_ref().unwrap_or(&self.fd);
            match openat(dirfd, part, f | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0) {
                Ok(fd) => at = Some(fd),
                // O_DIRECTORY | O_NOFOLLOW on a symlink says ENOTDIR on
                // Linux: name it for what it is, as openat2 would.
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) && is_symlink_at(dirfd, part) => {
                    return Err(std::io::Error::from_raw_os_error(libc::ELOOP))
                }
                Err(e) => return Err(e),
            }
        }
        at.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "an empty path"))
    }

    /// The directory `rel` below this one (no symlink on the way).
    pub fn dir(&self, rel: &Path) -> std::io::Result<Dir> {
        Ok(Dir { fd: self.resolve(rel, libc::O_RDONLY | libc::O_DIRECTORY)? })
    }

    /// The directory `rel` below this one, following symlinks that stay
    /// below it (the kernel checks every step, `openat2(RESOLVE_BENEATH)`);
    /// where the kernel lacks `openat2`, no symlink at all. For a working
    /// directory, which only the sandbox enters.
    pub fn dir_beneath(&self, rel: &Path) -> std::io::Result<Dir> {
        #[cfg(target_os = "linux")]
        {
            let parts = components(rel)
                .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a relative path inside"))?;
            let joined: PathBuf = parts.iter().collect();
            match openat2_beneath(&self.fd, &joined, libc::O_PATH | libc::O_DIRECTORY, false) {
                Err(e) if openat2_unavailable(&e) => {}
                other => return other.map(|fd| Dir { fd }),
            }
        }
        self.dir(rel)
    }

    /// Create directory `name` here (`Ok(false)`: it was already there).
    pub fn mkdir(&self, name_: &OsStr, mode: u32) -> std::io::Result<bool> {
        let c = name(name_)?;
        // SAFETY: the fd is open and c a valid NUL-terminated name.
        match check(unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) }) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A regular file `rel` below this one, opened for reading without
    /// blocking (a FIFO opens at once, and is refused), and its `fstat`.
    pub fn open_regular(&self, rel: &Path) -> std::io::Result<(std::fs::File, Stat)> {
        let fd = self.resolve(rel, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY)?;
        let st = fstat(&fd)?;
        if !st.is_file {
            return Err(not_regular());
        }
        Ok((std::fs::File::from(fd), st))
    }

    /// Read the regular file `rel` whole, refusing more than `max` bytes.
    /// `Ok(None)`: there is no such file.
    pub fn read_regular(&self, rel: &Path, max: u64) -> std::io::Result<Option<Read>> {
        let (f, stat) = match self.open_regular(rel) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::with_capacity(stat.size.min(max) as usize);
        f.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(too_large(max));
        }
        Ok(Some(Read { bytes, stat }))
    }

    /// Create `name` here, new: never an existing file, never through a symlink.
    pub fn create_new(&self, name_: &OsStr, mode: u32) -> std::io::Result<std::fs::File> {
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        openat(&self.fd, name_, flags, mode).map(std::fs::File::from)
    }

    /// Rename `from` to `to`, both in this directory (`to` is replaced;
    /// a symlink at `to` is replaced, never followed).
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> std::io::Result<()> {
        let (a, b) = (name(from)?, name(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: the fd is open; a and b are valid NUL-terminated names.
        check(unsafe { libc::renameat(fd, a.as_ptr(), fd, b.as_ptr()) }).map(drop)
    }

    /// Remove the file `name` here (a symlink is removed, not followed).
    pub fn unlink(&self, name_: &OsStr) -> std::io::Result<()> {
        let c = name(name_)?;
        // SAFETY: the fd is open and c a valid NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(drop)
    }

    /// What is at `name` here, symlinks not followed; `None`: nothing.
    pub fn lstat(&self, name_: &OsStr) -> std::io::Result<Option<Stat>> {
        let c = name(name_)?;
        // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open, c a valid name, st a valid writable stat.
        let r = check(unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) });
        match r {
            Ok(_) => Ok(Some(stat_of(&st))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// This directory's own `fstat`.
    pub fn stat(&self) -> std::io::Result<Stat> {
        fstat(&self.fd)
    }

    /// Flush this directory's entries (after a rename or an unlink).
    pub fn sync(&self) -> std::io::Result<()> {
        // SAFETY: the fd is open for the call.
        check(unsafe { libc::fsync(self.fd.as_raw_fd()) }).map(drop)
    }

    /// The names in this directory, `.` and `..` left out.
    pub fn names(&self) -> std::io::Result<Vec<OsString>> {
        // A fresh fd for the stream: closedir closes it, and the offset of
        // ours is left alone.
        let dot = c".";
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: the fd is open and dot a valid NUL-terminated name.
        let raw = check(unsafe { libc::openat(self.fd.as_raw_fd(), dot.as_ptr(), flags) })?;
        // SAFETY: raw is an open directory fd; on success the stream owns it.
        let dir = unsafe { libc::fdopendir(raw) };
        if dir.is_null() {
            let e = std::io::Error::last_os_error();
            // SAFETY: fdopendir failed, so raw is still ours to close.
            unsafe { libc::close(raw) };
            return Err(e);
        }
        let mut out = Vec::new();
        loop {
            // SAFETY: dir is a valid stream until closedir below.
            let entry = unsafe { libc::readdir(dir) };
            if entry.is_null() {
                break;
            }
            // SAFETY: readdir returned a valid entry whose d_name is NUL-terminated.
            let n = unsafe { std::ffi::CStr::from_ptr((*entry).d_name.as_ptr()) };
            let bytes = n.to_bytes();
            if bytes != b"." && bytes != b".." {
                out.push(OsStr::from_bytes(bytes).to_os_string());
            }
        }
        // SAFETY: dir is a valid stream, closed once.
        unsafe { libc::closedir(dir) };
        Ok(out)
    }

    /// Where this directory is now, as the kernel names it (Linux: the
    /// fd's `/proc/self/fd` link; elsewhere `None`).
    pub fn current_path(&self) -> Option<PathBuf> {
        #[cfg(target_os = "linux")]
        {
            std::fs::read_link(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).ok()
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }
}

/// Whether `name_` in `dir` is a symlink (not followed).
fn is_symlink_at(dir: &OwnedFd, name_: &OsStr) -> bool {
    let Ok(c) = name(name_) else { return false };
    // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open, c a valid name, st a valid writable stat.
    let r = unsafe { libc::fstatat(dir.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFLNK
}

fn openat(dir: &OwnedFd, name_: &OsStr, flags: libc::c_int, mode: u32) -> std::io::Result<OwnedFd> {
    let c = name(name_)?;
    // SAFETY: the fd is open and c a valid NUL-terminated name; the
    // returned fd is owned below.
    let fd = check(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: fd was just returned by openat and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `openat2(dir, rel, flags, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS
/// [| RESOLVE_NO_SYMLINKS])`.
#[cfg(target_os = "linux")]
fn openat2_beneath(dir: &OwnedFd, rel: &Path, flags: libc::c_int, no_symlinks: bool) -> std::io::Result<OwnedFd> {
    let mut resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if no_symlinks {
        resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    openat2(dir, rel, flags | libc::O_CLOEXEC, resolve)
}

/// `openat2(2)` (Linux 5.6) of `rel` from `dir`, with `flags` and the
/// `RESOLVE_*` bits `resolve`; ENOSYS where the kernel lacks it.
#[cfg(target_os = "linux")]
pub fn openat2(dir: &OwnedFd, rel: &Path, flags: libc::c_int, resolve: u64) -> std::io::Result<OwnedFd> {
    let c = CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "a NUL byte in a path"))?;
    // SAFETY: open_how is plain integers; all zeros is its "nothing asked" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.resolve = resolve;
    // SAFETY: the fd is open, c a valid NUL-terminated path, and how a
    // valid open_how of the size passed; the returned fd is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by openat2 and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// openat2 is missing (before 5.6), filtered by a seccomp profile, or
/// refuses these flags: fall back to the component walk.
#[cfg(target_os = "linux")]
fn openat2_unavailable(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM) | Some(libc::E2BIG))
}

#[cfg(test)]
impl Dir {
    /// The portable walk, for tests on kernels that have openat2.
    pub(crate) fn walk_for_test(&self, rel: &Path, flags: libc::c_int) -> std::io::Result<OwnedFd> {
        let parts = components(rel).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        self.walk(&parts, flags)
    }
}
