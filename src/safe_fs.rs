//! Files the supervisor reads or writes where hostile code may have been
//! first: a read-write workspace, a repository, a directory a job shares
//! with its caller. The supervisor often runs as root, so a name there is
//! never trusted: a job can swap it for a symlink (and have root write or
//! read wherever it points), a FIFO (and have root block for ever), or a
//! device.
//!
//! Reads open with `O_NOFOLLOW | O_NONBLOCK`, check with `fstat` that they
//! got a regular file, and stop at a size bound. Writes never open the
//! destination: they create a fresh temp file (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`) beside it, sync it, and `renameat` it over the name in a
//! directory whose fd was opened before the job could act ([`OutputFile`]).
//! A rename replaces whatever the job left at the name (a symlink is
//! replaced, never followed) and fails on a directory.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
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
}

impl SafeFsError {
    fn io(path: &Path, source: io::Error) -> Self {
        SafeFsError::Io { path: path.to_path_buf(), source }
    }
}

/// Read `path` whole, at most `max` bytes, never following a symlink at
/// its last component, never blocking on a FIFO, and only if it is a
/// regular file.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, SafeFsError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    (&file).take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| SafeFsError::io(path, e))?;
    if bytes.len() as u64 > max {
        return Err(SafeFsError::TooLarge { path: path.to_path_buf(), max });
    }
    Ok(bytes)
}

/// [`read_regular`], as UTF-8 text.
pub fn read_regular_string(path: &Path, max: u64) -> Result<String, SafeFsError> {
    let bytes = read_regular(path, max)?;
    String::from_utf8(bytes)
        .map_err(|_| SafeFsError::io(path, io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text")))
}

/// Open `path` for reading if, and only if, it is a regular file: the open
/// itself can neither follow a final symlink nor block (a FIFO opened with
/// `O_NONBLOCK` returns at once, and `fstat` then refuses it).
pub fn open_regular(path: &Path) -> Result<File, SafeFsError> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    let fd = match open_at(libc::AT_FDCWD, path.as_os_str(), flags, 0) {
        Ok(fd) => fd,
        // O_NOFOLLOW on a symlink.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(SafeFsError::NotRegular { path: path.to_path_buf() })
        }
        Err(e) => return Err(SafeFsError::io(path, e)),
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| SafeFsError::io(path, e))?;
    if !meta.file_type().is_file() {
        return Err(SafeFsError::NotRegular { path: path.to_path_buf() });
    }
    // Reads of a regular file never block; clear the flag so that code
    // reading it sees ordinary semantics.
    // SAFETY: F_SETFL on an fd we own, with an integer argument.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, 0) } < 0 {
        return Err(SafeFsError::io(path, io::Error::last_os_error()));
    }
    Ok(file)
}

/// `openat(2)`, returning an owned fd.
fn open_at(dir: libc::c_int, name: &OsStr, flags: libc::c_int, mode: libc::c_uint) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; openat
    // returns a new fd or -1.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags, mode) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `renameat(2)` within one directory.
fn rename_in(dir: &OwnedFd, from: &OsStr, to: &OsStr) -> io::Result<()> {
    let (f, t) = (
        std::ffi::CString::new(from.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        std::ffi::CString::new(to.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
    );
    // SAFETY: both names are NUL-terminated and outlive the call; the
    // directory fd is open.
    if unsafe { libc::renameat(dir.as_raw_fd(), f.as_ptr(), dir.as_raw_fd(), t.as_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `unlinkat(2)` of a file in one directory.
fn unlink_in(dir: &OwnedFd, name: &OsStr) {
    if let Ok(c) = std::ffi::CString::new(name.as_bytes()) {
        // SAFETY: `c` is NUL-terminated and outlives the call.
        unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
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

/// A file the supervisor will write when a job ends (`--json-status`,
/// an export): its directory is opened now, before any job code runs, so
/// that what the job does to the path afterwards can't redirect the write.
#[derive(Debug)]
pub struct OutputFile {
    dir: OwnedFd,
    name: std::ffi::OsString,
    /// The path as the user gave it, for messages.
    shown: PathBuf,
}

impl OutputFile {
    /// Open the directory of `path` (following the symlinks the user's
    /// path has now: the user chose them) and remember the file name.
    pub fn prepare(path: &Path) -> Result<OutputFile, SafeFsError> {
        let name = match path.file_name() {
            Some(n) if n != OsStr::new(".") && n != OsStr::new("..") => n.to_os_string(),
            _ => return Err(SafeFsError::NoFileName { path: path.to_path_buf() }),
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK | libc::O_CLOEXEC;
        let dir = open_at(libc::AT_FDCWD, parent.as_os_str(), flags, 0).map_err(|e| SafeFsError::io(parent, e))?;
        Ok(OutputFile { dir, name, shown: path.to_path_buf() })
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
        let (tmp_name, tmp) = self.create_temp().map_err(err)?;
        let mut f = File::from(tmp);
        let filled = match fill(&mut f) {
            Ok(v) => v,
            Err(e) => {
                unlink_in(&self.dir, &tmp_name);
                return Err(WriteError::Content(e));
            }
        };
        let written = (|| {
            f.sync_all()?;
            rename_in(&self.dir, &tmp_name, &self.name)?;
            File::from(self.dir.try_clone()?).sync_all()
        })();
        if let Err(e) = written {
            unlink_in(&self.dir, &tmp_name);
            return Err(err(e));
        }
        Ok(filled)
    }

    /// A new temp file in the directory, under a name nobody could have
    /// planted (random, created exclusively, never followed).
    fn create_temp(&self) -> io::Result<(std::ffi::OsString, OwnedFd)> {
        for _ in 0..16 {
            let mut rnd = [0u8; 8];
            getrandom(&mut rnd);
            let mut tmp = std::ffi::OsString::from(".");
            tmp.push(&self.name);
            tmp.push(format!(".{}.tmp", hex::encode(rnd)));
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            match open_at(self.dir.as_raw_fd(), &tmp, flags, 0o644) {
                Ok(fd) => return Ok((tmp, fd)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free temp file name"))
    }
}

/// Fill `buf` from the kernel's random source (a name nobody can guess).
fn getrandom(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    // SAFETY: buf is a valid writable buffer of the length passed.
    unsafe {
        libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0)
    };
    #[cfg(not(target_os = "linux"))]
    // SAFETY: buf is a valid writable buffer of at most 256 bytes.
    unsafe {
        libc::getentropy(buf.as_mut_ptr().cast(), buf.len())
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_refuse_links_fifos_and_big_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "hello").unwrap();
        assert_eq!(read_regular(&file, 5).unwrap(), b"hello");
        assert!(matches!(read_regular(&file, 4), Err(SafeFsError::TooLarge { .. })));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(read_regular(&link, 100), Err(SafeFsError::NotRegular { .. })));
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // Returns at once: a blocking open would wait here for a writer.
        assert!(matches!(read_regular(&fifo, 100), Err(SafeFsError::NotRegular { .. })));
        assert!(matches!(read_regular(dir.path(), 100), Err(SafeFsError::NotRegular { .. })));
    }

    #[test]
    fn an_output_file_replaces_what_was_planted_at_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "untouched").unwrap();
        let path = dir.path().join("status.json");
        let out = OutputFile::prepare(&path).unwrap();
        // Planted after prepare: a symlink, then a FIFO.
        std::os::unix::fs::symlink(&target, &path).unwrap();
        out.write(b"one").unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one");
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        out.write(b"two").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
        // A directory at the name is an error, not a write inside it.
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        assert!(out.write(b"three").is_err());
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn the_directory_is_the_one_opened_before() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("out");
        std::fs::create_dir(&sub).unwrap();
        let out = OutputFile::prepare(&sub.join("s.json")).unwrap();
        // The directory is moved away and a symlink to elsewhere put in its place.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::rename(&sub, dir.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &sub).unwrap();
        out.write(b"x").unwrap();
        assert!(!elsewhere.join("s.json").exists());
        assert_eq!(std::fs::read_to_string(dir.path().join("moved/s.json")).unwrap(), "x");
    }

    #[test]
    fn a_path_without_a_file_name_is_refused() {
        assert!(matches!(OutputFile::prepare(Path::new("/tmp/..")), Err(SafeFsError::NoFileName { .. })));
        assert!(matches!(OutputFile::prepare(Path::new("/")), Err(SafeFsError::NoFileName { .. })));
    }
}
