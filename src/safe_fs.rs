//! Files named by a path a user gave (`--json-status`, `--code-file`, an
//! export's `--output`) in places where hostile code may have been first:
//! a read-write workspace, a repository jobs write to. The supervisor often
//! runs as root, so the name there is never trusted: a job can swap it for
//! a symlink (and have root write or read wherever it points), a FIFO (and
//! have root block for ever), or a device.
//!
//! Built on [`crate::dirfd`]: the path's directory is opened (following
//! the symlinks the user's own path has), and the last name is reached
//! from that fd and never followed. Reads take only a regular file, opened
//! without blocking, up to a size bound. Writes never open the
//! destination: a fresh temp file is created beside it and renamed over
//! the name, which replaces whatever a job left there (a symlink is
//! replaced, never followed) and fails on a directory. [`OutputFile`]
//! opens its directory before a job could act, and uses only that fd.

use crate::dirfd::{self, Dir};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Why a guarded read or write was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SafeFsError {
    /// The path names something other than a regular file.
    #[error("{path}: not a regular file (a symlink, FIFO, device or directory is never opened)")]
    NotRegular { path: PathBuf },
    /// The file is larger than the bound.
    #[error("{path}: larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    /// The path has no file name to write to.
    #[error("{path}: give a file name, not a directory")]
    NoFileName { path: PathBuf },
    /// Opening, reading or writing failed.
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    /// A step of a guarded walk ([`open_guarded`]) failed.
    #[cfg(target_os = "linux")]
    #[error("{path}: {source}")]
    Walk { path: PathBuf, source: nix::errno::Errno },
    /// A guarded walk met a symlink inside a root jobs write to.
    #[cfg(target_os = "linux")]
    #[error(
        "{path}: {link} is a symbolic link inside a directory that jobs write to (a job could have put it there); \
         give the real path, or remove the link if you did not make it"
    )]
    Planted { path: PathBuf, link: PathBuf },
}

impl SafeFsError {
    fn io(path: &Path, source: io::Error) -> Self {
        if dirfd::is_symlink_error(&source) || dirfd::is_not_regular(&source) {
            return SafeFsError::NotRegular { path: path.to_path_buf() };
        }
        SafeFsError::Io { path: path.to_path_buf(), source }
    }
}

/// The directory of `path` and its last name (neither `.` nor `..`).
fn split(path: &Path) -> Result<(&Path, &OsStr), SafeFsError> {
    let name = match path.file_name() {
        Some(n) if n != OsStr::new(".") && n != OsStr::new("..") => n,
        _ => return Err(SafeFsError::NoFileName { path: path.to_path_buf() }),
    };
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    Ok((parent, name))
}

/// Whether `given`, as a user wrote it, reaches `canonical` through a
/// symbolic link: its absolute, lexically normalised form differs from
/// the real path. (A `..` after a link counts too: conservative.)
pub fn through_symlink(given: &Path, canonical: &Path) -> bool {
    // A relative path starts from the directory the user is in by the
    // path they took (the shell's $PWD, when it names this very
    // directory), not from its real path: `cd ws/sub && --workspace .`
    // went through `sub` if `sub` is a link.
    let abs = if given.is_absolute() {
        given.to_path_buf()
    } else {
        match logical_cwd() {
            Some(cwd) => cwd.join(given),
            None => match std::path::absolute(given) {
                Ok(a) => a,
                Err(_) => return true,
            },
        }
    };
    let mut norm = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                norm.pop();
            }
            std::path::Component::CurDir => {}
            other => norm.push(other),
        }
    }
    norm != canonical
}

/// `$PWD` when it is absolute and names the current directory (same
/// device and inode), as a shell keeps it: the path the user took.
#[cfg(not(unix))]
fn logical_cwd() -> Option<PathBuf> {
    None
}

/// `$PWD` when it is absolute and names the current directory (same
/// device and inode), as a shell keeps it: the path the user took.
#[cfg(unix)]
fn logical_cwd() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let pwd = PathBuf::from(std::env::var_os("PWD")?);
    if !pwd.is_absolute() {
        return None;
    }
    let (a, b) = (std::fs::metadata(&pwd).ok()?, std::fs::metadata(".").ok()?);
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some(pwd)
}

/// Read `path` whole, at most `max` bytes, never following a symlink at
/// its last component, never blocking on a FIFO, and only if it is a
/// regular file.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, SafeFsError> {
    let (parent, name) = split(path)?;
    let dir = Dir::open(parent).map_err(|e| SafeFsError::io(parent, e))?;
    match dir.read_regular(Path::new(name), max) {
        Ok(Some(read)) => Ok(read.bytes),
        // The OS's words (`No such file or directory`), as every other
        // missing path is shown; a bare `ErrorKind` says `entity not found`.
        Ok(None) => Err(SafeFsError::io(path, io::Error::from_raw_os_error(libc::ENOENT))),
        Err(e) if dirfd::is_too_large(&e) => Err(SafeFsError::TooLarge { path: path.to_path_buf(), max }),
        Err(e) => Err(SafeFsError::io(path, e)),
    }
}

/// [`read_regular`], as UTF-8 text.
pub fn read_regular_string(path: &Path, max: u64) -> Result<String, SafeFsError> {
    let bytes = read_regular(path, max)?;
    String::from_utf8(bytes)
        .map_err(|_| SafeFsError::io(path, io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text")))
}

/// `path` reached one component at a time from `/` (or the working
/// directory), following the symlinks of the user's own directories but
/// refusing any inside `roots` (canonical directories that hostile code
/// can write: a job's workspace, a bind's source), where a job could have
/// planted one to send the supervisor elsewhere. `with_last`: the last
/// component too (a bind source); else only the directories on the way
/// (a file that is replaced by rename, where a link at the name is
/// harmless). Each step opens from the fd of the one before (`O_PATH`,
/// `O_NOFOLLOW` inside a root), so no check is separate from its use: a
/// name swapped meanwhile is caught, not followed. Returns an `O_PATH`
/// fd of what the path names.
#[cfg(target_os = "linux")]
pub fn open_guarded(path: &Path, roots: &[PathBuf], with_last: bool) -> Result<std::os::fd::OwnedFd, SafeFsError> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    use std::path::Component;
    let shown = |source: nix::errno::Errno| SafeFsError::Walk { path: path.to_path_buf(), source };
    let start = if path.is_absolute() { Path::new("/") } else { Path::new(".") };
    let mut at =
        nix::fcntl::open(start, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(shown)?;
    let comps: Vec<Component> = path.components().collect();
    let mut walked = PathBuf::from(start);
    for (i, c) in comps.iter().enumerate() {
        let last = i + 1 == comps.len();
        let name: &std::ffi::OsStr = match c {
            Component::Normal(n) => n,
            Component::ParentDir => std::ffi::OsStr::new(".."),
            _ => continue,
        };
        walked.push(name);
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&at)))
            .map_err(|source| SafeFsError::Io { path: path.to_path_buf(), source })?;
        let guarded = roots.iter().any(|r| real.starts_with(r)) && (with_last || !last) && name != "..";
        let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
        if guarded {
            flags |= OFlag::O_NOFOLLOW;
        }
        let next = openat(&at, name, flags, Mode::empty()).map_err(shown)?;
        if guarded {
            let st = nix::sys::stat::fstat(&next).map_err(shown)?;
            if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                return Err(SafeFsError::Planted { path: path.to_path_buf(), link: walked });
            }
        }
        at = next;
    }
    Ok(at)
}

/// The canonical path of `path` ([`open_guarded`] with its last
/// component): what a bind's source must then be, to the end.
pub fn resolve_guarded(path: &Path, roots: &[PathBuf]) -> Result<PathBuf, SafeFsError> {
    // Not `SafeFsError::io`: a failure here is reported as it is.
    let failed = |source| SafeFsError::Io { path: path.to_path_buf(), source };
    #[cfg(target_os = "linux")]
    {
        let fd = open_guarded(path, roots, true)?;
        std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).map_err(failed)
    }
    #[cfg(not(target_os = "linux"))]
    {
        // No fd paths to read back here: resolved by name (no sandbox
        // binds off Linux; this keeps the other builds whole).
        let _ = roots;
        std::fs::canonicalize(path).map_err(failed)
    }
}

/// Why [`OutputFile::write_with`] failed: the file system, or the content.
#[derive(Debug, thiserror::Error)]
pub enum WriteError<E> {
    #[error(transparent)]
    Fs(SafeFsError),
    #[error("{0}")]
    Content(E),
}

/// A file the supervisor will write when a job ends (`--json-status`, an
/// export): its directory is opened now, before any job code runs, so
/// that what the job does to the path afterwards can't redirect the write.
#[derive(Debug)]
pub struct OutputFile {
    dir: Dir,
    name: OsString,
    /// The path as the user gave it, for messages.
    shown: PathBuf,
}

impl OutputFile {
    /// Open the directory of `path` (following the symlinks the user's
    /// path has now: the user chose them) and remember the file name.
    pub fn prepare(path: &Path) -> Result<OutputFile, SafeFsError> {
        let (parent, name) = split(path)?;
        let dir = Dir::open(parent).map_err(|e| SafeFsError::io(parent, e))?;
        Ok(OutputFile { dir, name: name.to_os_string(), shown: path.to_path_buf() })
    }

    /// As [`OutputFile::prepare`], but refusing a symlink on the way inside
    /// `roots` (directories jobs write to), in the same steps that open the
    /// directory ([`open_guarded`]).
    pub fn prepare_guarded(path: &Path, roots: &[PathBuf]) -> Result<OutputFile, SafeFsError> {
        let (parent, name) = split(path)?;
        // Not `SafeFsError::io`: a failure here is reported as it is.
        let failed = |source| SafeFsError::Io { path: parent.to_path_buf(), source };
        #[cfg(target_os = "linux")]
        let dir = {
            let fd = open_guarded(parent, roots, true)?;
            // The O_PATH fd can't be synced: the directory itself, opened
            // again through it (no name is looked up).
            let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
            let dir = nix::fcntl::openat(&fd, ".", flags, nix::sys::stat::Mode::empty())
                .map_err(|source| SafeFsError::Walk { path: parent.to_path_buf(), source })?;
            Dir::from_fd(dir).map_err(failed)?
        };
        #[cfg(not(target_os = "linux"))]
        let dir = {
            let _ = roots;
            Dir::open(parent).map_err(failed)?
        };
        Ok(OutputFile { dir, name: name.to_os_string(), shown: path.to_path_buf() })
    }

    /// Remove what is at the name now (a file an earlier run left, or a
    /// symlink someone planted: removed, never followed), so that a run
    /// that ends without writing leaves no stale content there. Nothing
    /// there is fine; a directory, or a name this process may not remove,
    /// is an error, as the write at the end would be.
    pub fn remove_stale(&self) -> Result<(), SafeFsError> {
        match self.dir.unlink(&self.name) {
            Ok(()) => self.dir.sync().map_err(|e| SafeFsError::Io { path: self.shown.clone(), source: e }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(SafeFsError::Io { path: self.shown.clone(), source: e }),
        }
    }

    /// Write `bytes` as the file's new content: a temp file beside it,
    /// synced, renamed over the name, the directory synced.
    pub fn write(&self, bytes: &[u8]) -> Result<(), SafeFsError> {
        self.write_with(|f| f.write_all(bytes)).map_err(|e| match e {
            WriteError::Fs(e) => e,
            WriteError::Content(e) => SafeFsError::io(&self.shown, e),
        })
    }

    /// As [`OutputFile::write`], with the content streamed by `fill` into
    /// the temp file (an export larger than memory should hold). An error
    /// of `fill` leaves the old file as it was.
    pub fn write_with<T, E>(&self, fill: impl FnOnce(&mut File) -> Result<T, E>) -> Result<T, WriteError<E>> {
        let err = |e: io::Error| WriteError::Fs(SafeFsError::io(&self.shown, e));
        let (tmp_name, mut f) = self.create_temp().map_err(err)?;
        let filled = match fill(&mut f) {
            Ok(v) => v,
            Err(e) => {
                let _ = self.dir.unlink(&tmp_name);
                return Err(WriteError::Content(e));
            }
        };
        let written = f.sync_all().and_then(|()| self.dir.rename(&tmp_name, &self.name)).and_then(|()| self.dir.sync());
        if let Err(e) = written {
            let _ = self.dir.unlink(&tmp_name);
            return Err(err(e));
        }
        Ok(filled)
    }

    /// A new temp file in the directory, under a name created exclusively
    /// (never an existing file, never through a symlink).
    fn create_temp(&self) -> io::Result<(OsString, File)> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        for attempt in 0..16u32 {
            let mut tmp = OsString::from(".");
            tmp.push(&self.name);
            tmp.push(format!(".{}.{nanos:x}.{attempt}.tmp", std::process::id()));
            match self.dir.create_new(&tmp, 0o644) {
                Ok(f) => return Ok((tmp, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temp file name"))
    }
}

#[cfg(test)]
#[cfg(unix)]
mod tests;
