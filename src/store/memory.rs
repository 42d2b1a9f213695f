//! Memories: decisions, bugfix notes and task context an agent keeps about a
//! repository (the SDL-MCP memory tools). This module owns their records in
//! sled, their markdown mirrors in `<repo>/.confine-memory/<memoryId>.md`,
//! the full-text index, staleness (SHA-256 of linked files) and the
//! append-only log of every memory operation.
//!
//! It must never write outside `<repo>/.confine-memory/`, follow a symlink
//! out of a repository, or leave a half-done write: every operation checks
//! all of its input first, then writes the `.md` (temp file + rename), then
//! sled (one transaction), then flushes.
//!
//! Layout: `types.rs` (wire types), `validate.rs` (ranges, path jail),
//! `markdown.rs` (front matter), `search.rs` (tokens, BM25 index),
//! `stale.rs` (file hashes, check), `surface.rs` (ranking), `db.rs` (the
//! sled store and its writes), `read.rs` (query, surface, log), `sync.rs` (.md → sled), `service.rs` (repo table + stores).

mod db;
mod markdown;
mod read;
mod search;
mod service;
mod stale;
mod surface;
mod sync;
mod time;
mod types;
mod validate;

pub use db::{MemoryDb, LOG_TREE, RECORDS_TREE};
pub use markdown::MEMORY_DIR;
pub use service::MemoryService;
pub use surface::{overlap_factor, recency_factor, RECENCY_FLOOR, RECENCY_HALF_LIFE_DAYS};
pub use time::{format_ms, now_ms, parse_rfc3339_ms};
pub use types::*;

use super::StoreError;

/// Errors of the memory store. Each message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// An argument is malformed or out of range (nothing was written).
    #[error("{0}")]
    Invalid(String),
    /// No memory with this id in this repository.
    #[error(
        "unknown memoryId '{id}' in repository '{repo}' (find ids with memory_query; omit memoryId to create a memory)"
    )]
    NotFound { repo: String, id: String },
    /// The repoId is not configured.
    #[error("unknown repoId '{id}' (configured: {known}; add a [[repos]] entry with this id to confine.toml)")]
    UnknownRepo { id: String, known: String },
    /// An upsert would give a memory the address of another one.
    #[error("memory '{existing}' already has this type, title and content; update or remove that one instead")]
    Conflict { existing: String },
    /// The repository (or its .confine-memory directory) can't be used.
    #[error("repository '{repo}': {message}")]
    Repo { repo: String, message: String },
    /// A markdown mirror could not be written or removed (path relative to the repository).
    #[error("{path}: {message} (check the permissions of the repository)")]
    File { path: String, message: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A stored record does not decode.
    #[error("memory record '{key}' is unreadable: {message} (remove it with `confine memory rm`, or restore its .md and run `confine memory sync`)")]
    Corrupt { key: String, message: String },
}

impl From<sled::Error> for MemoryError {
    fn from(e: sled::Error) -> Self {
        MemoryError::Store(StoreError::Db(e))
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> MemoryError {
    MemoryError::Invalid(msg.into())
}

/// The memory operations, over one repository each. Today sled and markdown
/// files ([`MemoryDb`]); a shared service for a fleet can implement this
/// without the tools noticing.
pub trait MemoryStore: Send + Sync {
    /// Create, deduplicate, or (with `memoryId`) update a memory.
    fn store(&self, repo: &RepoRef, req: &StoreRequest) -> Result<StoreResult, MemoryError>;
    /// Full text and filters over the live memories.
    fn query(&self, repo: &RepoRef, req: &MemoryQuery) -> Result<QueryResult, MemoryError>;
    /// Soft-delete a memory; `deleteFile` also removes its `.md`.
    fn remove(&self, repo: &RepoRef, req: &RemoveRequest) -> Result<RemoveResult, MemoryError>;
    /// The memories linked to the symbols and files of a task, best first.
    fn surface(&self, repo: &RepoRef, req: &SurfaceRequest) -> Result<SurfaceResult, MemoryError>;
    /// Re-hash linked files and flag the memories whose files changed.
    fn check(&self, repo: &RepoRef) -> Result<CheckReport, MemoryError>;
    /// Read `.md` files added or edited by hand back into the store.
    fn sync(&self, repo: &RepoRef) -> Result<SyncReport, MemoryError>;
    /// The newest `limit` log entries of a repository (one memory's, with `memory_id`), newest first.
    fn log(&self, repo_id: &str, memory_id: Option<&str>, limit: usize) -> Result<Vec<LogEntry>, MemoryError>;
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_files;
