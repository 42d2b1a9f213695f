//! Files reached through a directory file descriptor, never through a
//! path that something else could change between a check and its use.
//!
//! The supervisor runs as root and reads and writes inside repositories
//! (the memory mirrors, the files memories link to) while a job with a
//! read-write workspace may be swapping any component for a symlink or a
//! FIFO. So a repository is opened once ([`Dir::open`]) and everything
//! under it is reached from that fd: `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` where the kernel has it, else one `openat(…,
//! O_NOFOLLOW)` per component; files are opened `O_NONBLOCK` (a FIFO
//! can't hang us) and checked with `fstat` to be regular before a byte is
//! read; new files are `O_CREAT | O_EXCL | O_NOFOLLOW` and renamed with
//! `renameat` inside the same directory fd. This module never follows a
//! symlink below the directory it was opened at, and never opens
//! anything but a directory or a regular file for reading.
//!
//! Off Unix there are no directory fds in std: the same calls are made on
//! paths, each checked with `symlink_metadata` first. That is racy, and
//! only there to keep the non-Linux builds (which run no governed jobs)
//! compiling; the Linux build never uses it.

#[cfg(unix)]
mod unix;
#[cfg(target_os = "linux")]
pub use unix::openat2;
#[cfg(unix)]
pub use unix::Dir;

#[cfg(not(unix))]
mod portable;
#[cfg(not(unix))]
pub use portable::Dir;

use std::path::{Component, Path};

/// What `fstat` says of a file or directory, the parts callers need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub uid: u32,
    /// Permission bits (the low 12 bits of `st_mode`).
    pub mode: u32,
    pub is_dir: bool,
    pub is_file: bool,
    pub is_symlink: bool,
    pub size: u64,
    /// Modification time, ms since the epoch.
    pub mtime_ms: i64,
}

/// A file read whole: its bytes and what `fstat` said of it.
#[derive(Debug, Clone)]
pub struct Read {
    pub bytes: Vec<u8>,
    pub stat: Stat,
}

/// The refusals this module makes, inside the `io::Error`s its calls
/// return: told apart by their type ([`is_not_regular`], [`is_too_large`]),
/// never by their text.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error("not a regular file")]
    NotRegular,
    #[error("larger than {0} bytes")]
    TooLarge(u64),
    /// Off Unix, where no errno says it.
    #[cfg(not(unix))]
    #[error("a symlink on the way is not followed")]
    Symlink,
}

/// The refusal `e` carries, if it is one of ours.
fn refusal(e: &std::io::Error) -> Option<&Refusal> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<Refusal>())
}

/// The error of a symlink on the way, off Unix.
#[cfg(not(unix))]
fn symlink_refused() -> std::io::Error {
    std::io::Error::other(Refusal::Symlink)
}

/// Why an operation failed, in the C library's words (`No such file or
/// directory`), for messages that must not name a host path: never an
/// `ErrorKind`'s own words (`entity not found`), which no user searches
/// for, nor Rust's `(os error N)`.
pub fn reason(e: &std::io::Error) -> String {
    let shown = e.to_string();
    match e.raw_os_error() {
        Some(code) => shown.strip_suffix(&format!(" (os error {code})")).unwrap_or(&shown).to_string(),
        None => shown,
    }
}

/// Whether `e` is the refusal of a symlink on the way (`ELOOP`, from
/// `O_NOFOLLOW` or `RESOLVE_NO_SYMLINKS`), or of a way out of the
/// directory (`EXDEV`, from `RESOLVE_BENEATH`).
pub fn is_symlink_error(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EXDEV))
    }
    #[cfg(not(unix))]
    {
        e.kind() == std::io::ErrorKind::Other && matches!(refusal(e), Some(Refusal::Symlink))
    }
}

/// The error of a file that is not a regular one (a FIFO, a device, a
/// directory where a file was expected).
pub fn not_regular() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, Refusal::NotRegular)
}

/// Whether `e` is [`not_regular`]'s.
pub fn is_not_regular(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::InvalidInput && matches!(refusal(e), Some(Refusal::NotRegular))
}

/// The error of a file over a size bound.
pub fn too_large(max: u64) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, Refusal::TooLarge(max))
}

/// Whether `e` is [`too_large`]'s.
pub fn is_too_large(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::InvalidData && matches!(refusal(e), Some(Refusal::TooLarge(_)))
}

/// The normal components of a relative path: no root, no `..`, no `.`
/// left, at least one; `None` otherwise.
pub fn components(rel: &Path) -> Option<Vec<&std::ffi::OsStr>> {
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(test)]
#[cfg(unix)]
mod tests;
