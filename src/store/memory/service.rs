//! [`MemoryService`]: what the MCP memory tools and `confine memory` call.
//! It resolves a `repoId` through the repository table of confine.toml and
//! hands the call to a [`MemoryStore`] or a [`FeedbackStore`]; it decides
//! nothing itself. Calls block (sled, file hashing): async callers run them
//! on a blocking thread.

use super::types::*;
use super::{MemoryDb, MemoryError, MemoryStore};
use crate::config::RepoConfig;
use crate::store::feedback::{
    FeedbackDb, FeedbackError, FeedbackQuery, FeedbackQueryResult, FeedbackRequest, FeedbackResult, FeedbackStore,
};
use crate::store::Store;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

/// The memory and feedback stores and the repositories they serve.
#[derive(Clone)]
pub struct MemoryService {
    memories: Arc<dyn MemoryStore>,
    feedback: Arc<dyn FeedbackStore>,
    repos: BTreeMap<String, (PathBuf, bool)>,
}

impl MemoryService {
    /// The sled-backed stores on `store` (share the one handle of the
    /// process: sled allows one open per process) for `repos`.
    pub fn open(store: &Store, repos: &[RepoConfig]) -> Result<MemoryService, MemoryError> {
        let feedback = FeedbackDb::open(store).map_err(|e| match e {
            FeedbackError::Store(s) => MemoryError::Store(s),
            other => MemoryError::Invalid(other.to_string()),
        })?;
        Ok(MemoryService::new(Arc::new(MemoryDb::open(store)?), Arc::new(feedback), repos))
    }

    /// Any implementations of the two stores (tests, a remote service).
    pub fn new(memories: Arc<dyn MemoryStore>, feedback: Arc<dyn FeedbackStore>, repos: &[RepoConfig]) -> Self {
        let repos = repos.iter().map(|r| (r.id.clone(), (r.root.clone(), r.memory_files))).collect();
        MemoryService { memories, feedback, repos }
    }

    /// The configured repository ids, sorted.
    pub fn repo_ids(&self) -> Vec<String> {
        self.repos.keys().cloned().collect()
    }

    /// The repository a `repoId` names.
    pub fn repo(&self, id: &str) -> Result<RepoRef, MemoryError> {
        match self.repos.get(id) {
            Some((root, files)) => Ok(RepoRef { id: id.to_string(), root: root.clone(), files: *files }),
            None => Err(MemoryError::UnknownRepo {
                id: super::validate::clip(id),
                known: if self.repos.is_empty() { "none".into() } else { self.repo_ids().join(", ") },
            }),
        }
    }

    pub fn store(&self, req: &StoreRequest) -> Result<StoreResult, MemoryError> {
        self.memories.store(&self.repo(&req.repo_id)?, req)
    }

    pub fn query(&self, req: &MemoryQuery) -> Result<QueryResult, MemoryError> {
        self.memories.query(&self.repo(&req.repo_id)?, req)
    }

    pub fn remove(&self, req: &RemoveRequest) -> Result<RemoveResult, MemoryError> {
        self.memories.remove(&self.repo(&req.repo_id)?, req)
    }

    pub fn surface(&self, req: &SurfaceRequest) -> Result<SurfaceResult, MemoryError> {
        self.memories.surface(&self.repo(&req.repo_id)?, req)
    }

    pub fn check(&self, repo_id: &str) -> Result<CheckReport, MemoryError> {
        self.memories.check(&self.repo(repo_id)?)
    }

    pub fn sync(&self, repo_id: &str) -> Result<SyncReport, MemoryError> {
        self.memories.sync(&self.repo(repo_id)?)
    }

    pub fn log(&self, repo_id: &str, memory_id: Option<&str>, limit: usize) -> Result<Vec<LogEntry>, MemoryError> {
        self.repo(repo_id)?;
        self.memories.log(repo_id, memory_id, limit)
    }

    /// How many live memories of a repository are stale now (re-checked):
    /// what `info` reports with a repoId.
    pub fn stale_count(&self, repo_id: &str) -> Result<usize, MemoryError> {
        self.check(repo_id).map(|r| r.stale)
    }

    pub fn feedback(&self, req: &FeedbackRequest) -> Result<FeedbackResult, MemoryError> {
        self.repo(&req.repo_id)?;
        self.feedback.record(req).map_err(feedback_error)
    }

    pub fn feedback_query(&self, q: &FeedbackQuery) -> Result<FeedbackQueryResult, MemoryError> {
        self.repo(&q.repo_id)?;
        self.feedback.query(q).map_err(feedback_error)
    }

    /// What `confine serve` does at start: for every repository, read hand
    /// edits back (sync), then flag stale memories (check). A repository
    /// that fails is reported and skipped: one bad checkout must not keep
    /// the server from starting. Returns one line per problem.
    pub fn startup(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for id in self.repos.keys() {
            match self.sync(id) {
                Ok(r) => problems.extend(r.problems.iter().map(|p| format!("{id}: {}: {}", p.file, p.message))),
                Err(e) => problems.push(format!("{id}: sync: {e}")),
            }
            if let Err(e) = self.check(id) {
                problems.push(format!("{id}: check: {e}"));
            }
        }
        problems
    }
}

fn feedback_error(e: FeedbackError) -> MemoryError {
    match e {
        FeedbackError::Invalid(m) => MemoryError::Invalid(m),
        FeedbackError::Store(s) => MemoryError::Store(s),
        FeedbackError::Corrupt(m) => MemoryError::Corrupt { key: "feedback".into(), message: m },
    }
}
