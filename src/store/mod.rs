//! The sled store: one database for artifacts, audit, memories and
//! feedback, each in its own tree. Callers get typed handles; nobody else
//! opens sled.
//!
//! Durability rule: anything a response refers to (an audit record, an
//! artifact) is flushed before the response is returned.

pub mod artifacts;
pub mod audit;
pub mod feedback;
pub mod memory;

use std::path::{Path, PathBuf};

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened or written.
    #[error("store {path}: {source} (check that the directory is writable and not used by another confine)")]
    Open { path: PathBuf, source: sled::Error },
    /// A read or write failed.
    #[error("store: {0}")]
    Db(#[from] sled::Error),
    /// A record could not be (de)serialised.
    #[error("store: corrupt record: {0}")]
    Corrupt(String),
}

/// Where the store lives when the config names no `store.path`:
/// `$XDG_DATA_HOME/confine`, else `~/.local/share/confine`.
pub fn default_path() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("confine");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/share/confine")
}

/// The one sled database of a confine installation.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
}

impl Store {
    /// Open (or create) the store at `path`. sled's flusher thread writes
    /// and syncs what was written every 500 ms, whether or not anyone
    /// flushed it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, Some(500))
    }

    /// Open (or create) the store at `path` for a process that flushes
    /// everything it writes before it exits (`confine exec`: the audit
    /// append's flush covers the artifact too, an append that fails is
    /// followed by a flush of its own, and GC flushes its own): no flusher
    /// thread. That thread would start while the job's sandbox is
    /// built, and its first round `fsync`s the file (data and inode)
    /// while the store's own start syncs it too (docs/benchmarks.md,
    /// "Figures once in the code").
    pub fn open_flushed_by_caller(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, None)
    }

    fn open_with(path: &Path, flush_every_ms: Option<u64>) -> Result<Store, StoreError> {
        let db = sled::Config::new()
            .path(path)
            // sled's default cache (1 GiB) lets a long-running supervisor keep
            // most artifact bytes it ever wrote resident; 16 MiB keeps RSS
            // flat (measured: see store/artifacts/sled_backend.rs).
            .cache_capacity(16 << 20)
            .flush_every_ms(flush_every_ms)
            .open()
            .map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
        Ok(Store { db })
    }

    /// A named tree (table) of the store.
    pub fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.db.open_tree(name)?)
    }

    /// Flush everything to disk, durably (sled's flush plus fdatasync:
    /// `vendor/sled/CONFINE-PATCH.md`, change 7).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    /// How many times the database file was synced (`fsync`/`fdatasync`)
    /// by flushes, sled's flusher and drops since the store was opened.
    #[doc(hidden)]
    pub fn file_syncs(&self) -> u64 {
        self.db.file_syncs()
    }

    /// How many runs of log buffers sled made stable with
    /// `sync_file_range` (a wait for the device each) rather than a sync.
    #[doc(hidden)]
    pub fn range_syncs(&self) -> u64 {
        self.db.range_syncs()
    }

    /// How many sled pages the store uses: each start reads, loads and
    /// writes back a table of them.
    #[doc(hidden)]
    pub fn pages_in_use(&self) -> u64 {
        self.db.pages_in_use()
    }

    /// Approximate on-disk size in bytes.
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_keeps_flushed_data() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            s.tree("t").unwrap().insert("k", "v").unwrap();
            s.flush().unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.tree("t").unwrap().get("k").unwrap().unwrap().as_ref(), b"v");
    }
}
