//! [`Dir`] off Unix: the same calls on paths, each component checked with
//! `symlink_metadata` first. Racy (see the module doc); the Linux build
//! never uses it.

use super::{components, not_regular, symlink_refused, too_large, Read, Stat};
use std::ffi::{OsStr, OsString};
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// An open directory, by path.
#[derive(Debug)]
pub struct Dir {
    path: PathBuf,
}

fn stat_of(m: &std::fs::Metadata) -> Stat {
    let mtime_ms = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    Stat {
        uid: 0,
        mode: if m.permissions().readonly() { 0o555 } else { 0o755 },
        is_dir: m.is_dir(),
        is_file: m.is_file(),
        is_symlink: m.file_type().is_symlink(),
        size: m.len(),
        mtime_ms,
    }
}

fn single(name: &OsStr) -> std::io::Result<&OsStr> {
    match components(Path::new(name)) {
        Some(parts) if parts.len() == 1 => Ok(name),
        _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a single file name")),
    }
}

impl Dir {
    pub fn open(path: &Path) -> std::io::Result<Dir> {
        if !std::fs::metadata(path)?.is_dir() {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a directory"));
        }
        Ok(Dir { path: path.to_path_buf() })
    }

    fn resolve(&self, rel: &Path) -> std::io::Result<PathBuf> {
        let parts = components(rel)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a relative path inside"))?;
        let mut at = self.path.clone();
        for part in parts {
            at.push(part);
            if std::fs::symlink_metadata(&at)?.file_type().is_symlink() {
                return Err(symlink_refused());
            }
        }
        Ok(at)
    }

    pub fn dir(&self, rel: &Path) -> std::io::Result<Dir> {
        let path = self.resolve(rel)?;
        Dir::open(&path)
    }

    pub fn dir_beneath(&self, rel: &Path) -> std::io::Result<Dir> {
        self.dir(rel)
    }

    pub fn mkdir(&self, name: &OsStr, _mode: u32) -> std::io::Result<bool> {
        match std::fs::create_dir(self.path.join(single(name)?)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn open_regular(&self, rel: &Path) -> std::io::Result<(std::fs::File, Stat)> {
        let path = self.resolve(rel)?;
        let m = std::fs::symlink_metadata(&path)?;
        if !m.is_file() {
            return Err(not_regular());
        }
        Ok((std::fs::File::open(&path)?, stat_of(&m)))
    }

    pub fn read_regular(&self, rel: &Path, max: u64) -> std::io::Result<Option<Read>> {
        let (f, stat) = match self.open_regular(rel) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        f.take(max + 1).read_to_end(&mut bytes)?;
        if bytes.len() as u64 > max {
            return Err(too_large(max));
        }
        Ok(Some(Read { bytes, stat }))
    }

    pub fn create_new(&self, name: &OsStr, _mode: u32) -> std::io::Result<std::fs::File> {
        std::fs::OpenOptions::new().write(true).create_new(true).open(self.path.join(single(name)?))
    }

    pub fn rename(&self, from: &OsStr, to: &OsStr) -> std::io::Result<()> {
        std::fs::rename(self.path.join(single(from)?), self.path.join(single(to)?))
    }

    pub fn unlink(&self, name: &OsStr) -> std::io::Result<()> {
        std::fs::remove_file(self.path.join(single(name)?))
    }

    pub fn lstat(&self, name: &OsStr) -> std::io::Result<Option<Stat>> {
        match std::fs::symlink_metadata(self.path.join(single(name)?)) {
            Ok(m) => Ok(Some(stat_of(&m))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn stat(&self) -> std::io::Result<Stat> {
        std::fs::metadata(&self.path).map(|m| stat_of(&m))
    }

    pub fn sync(&self) -> std::io::Result<()> {
        Ok(())
    }

    pub fn names(&self) -> std::io::Result<Vec<OsString>> {
        std::fs::read_dir(&self.path)?.map(|e| e.map(|e| e.file_name())).collect()
    }

    pub fn current_path(&self) -> Option<PathBuf> {
        Some(self.path.clone())
    }
}
