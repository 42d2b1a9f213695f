//! [`MemoryDb`]: the sled-backed [`MemoryStore`]. Records live in the
//! `memories` tree (key `repoId \0 memoryId`), the content addresses in
//! `memory_addr` (SHA-256 of repoId, type, title and SHA-256(content) →
//! memoryId), and every operation in the append-only `memory_log`.
//!
//! Order of every write: check all input, write the `.md`, commit the sled
//! trees in one transaction, flush; if sled fails, the `.md` is put back.
//! Writes are serialised by one lock, so a deduplication check and the
//! write it guards can't interleave with another write of this process
//! (sled lets only one process open the store).

use super::markdown;
use super::search::{DocMeta, RepoIndex};
use super::stale::{sha256_hex, Baseline, FileHasher};
use super::time::{format_ms, now_ms};
use super::types::*;
use super::validate::{self, repo_root};
use super::{MemoryError, MemoryStore};
use crate::dirfd::Dir;
use crate::store::Store;
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Memory records.
pub const RECORDS_TREE: &str = "memories";
/// Content address → memoryId.
pub const ADDR_TREE: &str = "memory_addr";
/// The append-only log of memory operations, keyed by big-endian sequence.
pub const LOG_TREE: &str = "memory_log";

/// A stored memory: what tools show, and what staleness and sync need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Record {
    #[serde(flatten)]
    pub memory: Memory,
    pub created_ms: i64,
    pub updated_ms: i64,
    pub content_sha256: String,
    /// The staleness baseline: SHA-256 of each linked file when stored.
    pub file_hashes: Baseline,
    /// SHA-256 of the `.md` as last written or read (`None`: no file).
    pub md_sha256: Option<String>,
}

impl Record {
    pub fn address(&self) -> String {
        address(&self.memory.repo_id, self.memory.memory_type, &self.memory.title, &self.content_sha256)
    }

    fn meta(&self) -> DocMeta {
        let m = &self.memory;
        DocMeta {
            memory_id: m.memory_id.clone(),
            memory_type: m.memory_type,
            tags: m.tags.clone(),
            symbol_ids: m.symbol_ids.clone(),
            file_rel_paths: m.file_rel_paths.clone(),
            confidence: m.confidence,
            updated_ms: self.updated_ms,
            stale: m.stale,
            stale_files: m.stale_files.clone(),
            baseline: self.file_hashes.clone(),
        }
    }
}

/// The content address: repoId + type + title + SHA-256(content).
pub(crate) fn address(repo_id: &str, t: MemoryType, title: &str, content_sha256: &str) -> String {
    sha256_hex(format!("{repo_id}\0{}\0{title}\0{content_sha256}", t.as_str()).as_bytes())
}

fn record_key(repo_id: &str, memory_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(repo_id.len() + memory_id.len() + 1);
    k.extend_from_slice(repo_id.as_bytes());
    k.push(0);
    k.extend_from_slice(memory_id.as_bytes());
    k
}

/// One sled commit: a record, its address change, and its log entry.
pub(crate) struct Commit<'a> {
    pub record: &'a Record,
    /// The address this memory had (removed if it still points here).
    pub old_addr: Option<String>,
    /// The address to point at this memory (`None`: removed memories have none).
    pub new_addr: Option<String>,
    pub op: &'static str,
    pub detail: Option<String>,
}

/// The sled-backed memory store.
pub struct MemoryDb {
    store: Store,
    records: sled::Tree,
    addr: sled::Tree,
    pub(crate) log: sled::Tree,
    next_seq: AtomicU64,
    indexes: Mutex<HashMap<String, RepoIndex>>,
    writes: Mutex<()>,
}

impl MemoryDb {
    pub fn open(store: &Store) -> Result<MemoryDb, MemoryError> {
        let log = store.tree(LOG_TREE)?;
        let last = match log.last()? {
            Some((k, _)) => k.as_ref().try_into().map(u64::from_be_bytes).unwrap_or(0),
            None => 0,
        };
        Ok(MemoryDb {
            store: store.clone(),
            records: store.tree(RECORDS_TREE)?,
            addr: store.tree(ADDR_TREE)?,
            log,
            next_seq: AtomicU64::new(last + 1),
            indexes: Mutex::new(HashMap::new()),
            writes: Mutex::new(()),
        })
    }

    pub(crate) fn write_lock(&self) -> MutexGuard<'_, ()> {
        self.writes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One record, deleted ones included.
    pub(crate) fn get(&self, repo_id: &str, memory_id: &str) -> Result<Option<Record>, MemoryError> {
        let key = record_key(repo_id, memory_id);
        match self.records.get(&key)? {
            Some(bytes) => decode(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    /// Every record of a repository, deleted ones included; unreadable
    /// ones are logged and skipped.
    pub(crate) fn all(&self, repo_id: &str) -> Result<Vec<Record>, MemoryError> {
        let mut out = Vec::new();
        for kv in self.records.scan_prefix(record_key(repo_id, "")) {
            let (k, v) = kv?;
            match decode(&k, &v) {
                Ok(r) => out.push(r),
                Err(e) => tracing::warn!(error = %e, "skipping an unreadable memory record"),
            }
        }
        Ok(out)
    }

    /// Run `f` on a repository's index, built from sled on first use.
    pub(crate) fn with_index<R>(&self, repo_id: &str, f: impl FnOnce(&mut RepoIndex) -> R) -> Result<R, MemoryError> {
        let mut map = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(repo_id) {
            let mut ix = RepoIndex::default();
            for r in self.all(repo_id)? {
                if !r.memory.deleted {
                    ix.upsert(r.meta(), &r.memory.title, &r.memory.content);
                }
            }
            map.insert(repo_id.to_string(), ix);
        }
        let ix = map.entry(repo_id.to_string()).or_default();
        Ok(f(ix))
    }

    /// The memoryId a content address points at, if that memory is live.
    pub(crate) fn live_owner(&self, repo_id: &str, addr: &str) -> Result<Option<String>, MemoryError> {
        let Some(id) = self.addr.get(addr.as_bytes())? else { return Ok(None) };
        let id = String::from_utf8_lossy(&id).into_owned();
        Ok(self.get(repo_id, &id)?.filter(|r| !r.memory.deleted).map(|_| id))
    }

    /// A fresh memoryId: `mem_` and 24 hex digits.
    fn new_id(&self, repo_id: &str, addr: &str) -> Result<String, MemoryError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        loop {
            let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let seed = format!("{addr}\0{nanos}\0{}\0{n}", std::process::id());
            let id = format!("mem_{}", &sha256_hex(seed.as_bytes())[..24]);
            if self.get(repo_id, &id)?.is_none() {
                return Ok(id);
            }
        }
    }

    /// Write records and their log entries in one transaction, then flush.
    pub(crate) fn commit(&self, commits: &[Commit<'_>]) -> Result<(), MemoryError> {
        let timestamp = format_ms(now_ms());
        let mut encoded = Vec::with_capacity(commits.len());
        for c in commits {
            let m = &c.record.memory;
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            let entry = LogEntry {
                seq,
                timestamp: timestamp.clone(),
                op: c.op.to_string(),
                repo_id: m.repo_id.clone(),
                memory_id: m.memory_id.clone(),
                title: m.title.clone(),
                content_sha256: c.record.content_sha256.clone(),
                detail: c.detail.clone(),
            };
            let record = serde_json::to_vec(c.record).map_err(|e| corrupt(&m.memory_id, e))?;
            let entry = serde_json::to_vec(&entry).map_err(|e| corrupt(&m.memory_id, e))?;
            encoded.push((record_key(&m.repo_id, &m.memory_id), record, seq.to_be_bytes(), entry));
        }
        self.store.check_room_for_records()?;
        let result = (&self.records, &self.addr, &self.log).transaction(|(records, addr, log)| {
            for (c, (key, record, seq, entry)) in commits.iter().zip(&encoded) {
                let id = c.record.memory.memory_id.as_bytes();
                records.insert(key.as_slice(), record.as_slice())?;
                if let Some(old) = &c.old_addr {
                    if addr.get(old.as_bytes())?.as_deref() == Some(id) {
                        addr.remove(old.as_bytes())?;
                    }
                }
                if let Some(new) = &c.new_addr {
                    addr.insert(new.as_bytes(), id)?;
                }
                log.insert(seq, entry.as_slice())?;
            }
            Ok::<(), ConflictableTransactionError<()>>(())
        });
        match result {
            Ok(()) => {}
            Err(TransactionError::Storage(e)) => return Err(self.store.failed_with(e.into()).into()),
            Err(TransactionError::Abort(())) => return Err(corrupt("transaction", "aborted")),
        }
        self.store.flush()?;
        Ok(())
    }

    /// Keep the index in step with a committed record.
    pub(crate) fn index(&self, r: &Record) -> Result<(), MemoryError> {
        self.with_index(&r.memory.repo_id, |ix| {
            if r.memory.deleted {
                ix.remove(&r.memory.memory_id);
            } else {
                ix.upsert(r.meta(), &r.memory.title, &r.memory.content);
            }
        })
    }

    /// Write a memory's `.md` (where the repository mirrors its memories),
    /// then commit; if the commit fails, put the previous file back.
    /// Returns the record as committed.
    fn write_through(
        &self,
        root: &Dir,
        files: bool,
        mut record: Record,
        commit: Commit<'_>,
    ) -> Result<Record, MemoryError> {
        if !files {
            let commit = Commit { record: &record, ..commit };
            self.commit(&[commit])?;
            self.index(&record)?;
            return Ok(record);
        }
        let id = record.memory.memory_id.clone();
        let dir = markdown::ensure_dir(root, &record.memory.repo_id)?;
        let previous = markdown::read(&dir, &format!("{id}.md")).ok().flatten().map(|(bytes, _)| bytes);
        let text = markdown::render(&record.memory, &record.file_hashes)?;
        markdown::write_atomic(&dir, &id, text.as_bytes())?;
        record.md_sha256 = Some(sha256_hex(text.as_bytes()));
        let commit = Commit { record: &record, ..commit };
        if let Err(e) = self.commit(&[commit]) {
            restore(&dir, &id, previous.as_deref());
            return Err(e);
        }
        self.index(&record)?;
        Ok(record)
    }
}

/// Put a `.md` back as it was before a failed commit (best effort: the
/// commit error is what the caller reports).
fn restore(dir: &Dir, id: &str, previous: Option<&[u8]>) {
    let undone = match previous {
        Some(bytes) => markdown::write_atomic(dir, id, bytes).map(|_| ()),
        None => markdown::remove(dir, id).map(|_| ()),
    };
    if let Err(e) = undone {
        tracing::warn!(error = %e, "could not restore the memory file after a failed store write");
    }
}

pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Result<Record, MemoryError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(&String::from_utf8_lossy(key).replace('\0', "/"), e))
}

pub(crate) fn corrupt(key: &str, e: impl std::fmt::Display) -> MemoryError {
    MemoryError::Corrupt { key: key.to_string(), message: e.to_string() }
}

impl MemoryStore for MemoryDb {
    fn store(&self, repo: &RepoRef, req: &StoreRequest) -> Result<StoreResult, MemoryError> {
        if let Some(id) = &req.memory_id {
            validate::memory_id(id)?;
        }
        let f = validate::fields(
            req.memory_type,
            &req.title,
            &req.content,
            &req.tags,
            req.confidence,
            &req.symbol_ids,
            &req.file_rel_paths,
        )?;
        let root = repo_root(repo)?;
        let baseline = FileHasher::new(&root).baseline(&f.file_rel_paths)?;
        let content_sha256 = sha256_hex(f.content.as_bytes());
        let addr = address(&repo.id, f.memory_type, &f.title, &content_sha256);
        let _w = self.write_lock();
        let now = now_ms();
        let (memory_id, created_ms, created_at, old_addr, op) = match &req.memory_id {
            Some(id) => {
                let old = self
                    .get(&repo.id, id)?
                    .ok_or_else(|| MemoryError::NotFound { repo: repo.id.clone(), id: id.clone() })?;
                if let Some(other) = self.live_owner(&repo.id, &addr)?.filter(|o| o != id) {
                    return Err(MemoryError::Conflict { existing: other });
                }
                (id.clone(), old.created_ms, old.memory.created_at.clone(), Some(old.address()), "update")
            }
            None => {
                if let Some(existing) = self.live_owner(&repo.id, &addr)? {
                    if let Some(r) = self.get(&repo.id, &existing)? {
                        let c = Commit { record: &r, old_addr: None, new_addr: None, op: "deduplicate", detail: None };
                        self.commit(&[c])?;
                    }
                    return Ok(StoreResult { ok: true, memory_id: existing, created: false, deduplicated: true });
                }
                (self.new_id(&repo.id, &addr)?, now, format_ms(now), None, "store")
            }
        };
        let record = Record {
            memory: Memory {
                memory_id: memory_id.clone(),
                repo_id: repo.id.clone(),
                memory_type: f.memory_type,
                title: f.title,
                content: f.content,
                tags: f.tags,
                confidence: f.confidence,
                symbol_ids: f.symbol_ids,
                file_rel_paths: f.file_rel_paths,
                created_at,
                updated_at: format_ms(now),
                deleted: false,
                stale: false,
                stale_files: vec![],
            },
            created_ms,
            updated_ms: now,
            content_sha256,
            file_hashes: baseline,
            md_sha256: None,
        };
        let commit = Commit { record: &record, old_addr, new_addr: Some(addr), op, detail: None };
        let created = op == "store";
        let stored = self.write_through(&root, repo.files, record.clone(), commit)?;
        Ok(StoreResult { ok: true, memory_id: stored.memory.memory_id, created, deduplicated: false })
    }

    fn query(&self, repo: &RepoRef, req: &MemoryQuery) -> Result<QueryResult, MemoryError> {
        self.query_repo(repo, req)
    }

    fn remove(&self, repo: &RepoRef, req: &RemoveRequest) -> Result<RemoveResult, MemoryError> {
        validate::memory_id(&req.memory_id)?;
        let root = repo_root(repo)?;
        let _w = self.write_lock();
        let id = &req.memory_id;
        let mut record =
            self.get(&repo.id, id)?.ok_or_else(|| MemoryError::NotFound { repo: repo.id.clone(), id: id.clone() })?;
        let now = now_ms();
        let old_addr = Some(record.address());
        record.memory.deleted = true;
        record.memory.updated_at = format_ms(now);
        record.updated_ms = now;
        if req.delete_file != Some(true) || !repo.files {
            let commit = Commit { record: &record, old_addr, new_addr: None, op: "remove", detail: None };
            self.write_through(&root, repo.files, record.clone(), commit)?;
            return Ok(RemoveResult { ok: true, memory_id: id.clone(), file_deleted: false });
        }
        let dir = markdown::open_dir(&root, &repo.id)?;
        let previous =
            dir.as_ref().and_then(|d| markdown::read(d, &format!("{id}.md")).ok().flatten()).map(|(bytes, _)| bytes);
        let file_deleted = match &dir {
            Some(d) => markdown::remove(d, id)?,
            None => false,
        };
        record.md_sha256 = None;
        let detail = Some(format!("fileDeleted: {file_deleted}"));
        let commit = Commit { record: &record, old_addr, new_addr: None, op: "remove", detail };
        if let Err(e) = self.commit(&[commit]) {
            if let (Some(d), Some(bytes)) = (&dir, &previous) {
                restore(d, id, Some(bytes));
            }
            return Err(e);
        }
        self.index(&record)?;
        Ok(RemoveResult { ok: true, memory_id: id.clone(), file_deleted })
    }

    fn surface(&self, repo: &RepoRef, req: &SurfaceRequest) -> Result<SurfaceResult, MemoryError> {
        self.surface_repo(repo, req)
    }

    fn check(&self, repo: &RepoRef) -> Result<CheckReport, MemoryError> {
        self.check_repo(repo)
    }

    fn sync(&self, repo: &RepoRef) -> Result<SyncReport, MemoryError> {
        self.sync_repo(repo)
    }

    fn log(&self, repo_id: &str, memory_id: Option<&str>, limit: usize) -> Result<Vec<LogEntry>, MemoryError> {
        self.log_entries(repo_id, memory_id, limit)
    }
}
