//! `sync`: read `.confine-memory/*.md` files that were added or edited by
//! hand back into sled.
//!
//! A file whose bytes match what confine last wrote or read (`mdSha256`) is
//! unchanged. Otherwise: no memory with that id → imported; the file's
//! mtime is after the memory's `updatedAt` → the file wins (updated; a
//! time in the future counts as now);
//! else the store wins and the file is rewritten from it. A file that
//! doesn't parse or check is reported and left alone; so is a live
//! memory whose file is gone (`memory_remove` removes memories).
//!
//! The repository decides the repoId (a teammate's confine.toml may call
//! it something else). Linked-file hashes recorded in the front matter are
//! kept as the baseline, so staleness means the same in every clone.
//! All changes go in one transaction and one flush. The directory is
//! listed, read and written through its fd (`markdown.rs`): a file that
//! is a symlink, a FIFO or too large is a problem reported, never read.

use super::db::{address, Commit, MemoryDb, Record};
use super::markdown;
use super::stale::{sha256_hex, FileHasher};
use super::time::{format_ms, parse_rfc3339_ms};
use super::types::*;
use super::validate::{self, repo_root};
use super::MemoryError;
use crate::dirfd::Dir;
use std::collections::{HashMap, HashSet};

/// How a change is committed: an import points the content address at
/// the memory (unless it is deleted); a rewrite leaves it alone.
struct Plan {
    import: bool,
    old_addr: Option<String>,
    op: &'static str,
}

/// What to do with one changed file.
enum Change {
    /// The record read from the file, and the one it replaces.
    Import(Record, Option<Box<Record>>),
    Rewrite(Record),
}

impl MemoryDb {
    pub(crate) fn sync_repo(&self, repo: &RepoRef) -> Result<SyncReport, MemoryError> {
        let root = repo_root(repo)?;
        let mut report = SyncReport { repo_id: repo.id.clone(), ..SyncReport::default() };
        // No mirror: nothing in the repository is the memories'.
        if !repo.files {
            return Ok(report);
        }
        let _w = self.write_lock();
        let mut seen = HashSet::new();
        let mut changes = Vec::new();
        // A symlinked or non-directory `.confine-memory` is an error: nothing is read.
        if let Some(dir) = markdown::open_dir(&root, &repo.id)? {
            let mut names: Vec<String> = dir
                .names()
                .map_err(|e| MemoryError::File { path: markdown::MEMORY_DIR.into(), message: e.to_string() })?
                .into_iter()
                .filter_map(|n| n.into_string().ok())
                .collect();
            names.sort();
            let mut hasher = FileHasher::new(&root);
            let mut claimed: HashMap<String, String> = HashMap::new();
            for name in names {
                let Some(id) = markdown::id_of(&name) else { continue };
                let file = format!("{}/{name}", markdown::MEMORY_DIR);
                if let Err(e) = validate::memory_id(id) {
                    report.problems.push(SyncProblem { file, message: e.to_string() });
                    continue;
                }
                seen.insert(id.to_string());
                match self.examine(repo, &dir, &name, id, &mut hasher, &mut claimed) {
                    Ok(None) => report.unchanged += 1,
                    Ok(Some(change)) => changes.push(change),
                    Err(problem) => report.problems.push(SyncProblem { file, message: problem.to_string() }),
                }
            }
            self.apply(&dir, changes, &mut report)?;
        }
        for r in self.all(&repo.id)? {
            if !r.memory.deleted && r.md_sha256.is_some() && !seen.contains(&r.memory.memory_id) {
                report.missing.push(r.memory.memory_id);
            }
        }
        Ok(report)
    }

    /// Decide what one file means; `Ok(None)` when it matches the store.
    fn examine(
        &self,
        repo: &RepoRef,
        dir: &Dir,
        name: &str,
        id: &str,
        hasher: &mut FileHasher<'_>,
        claimed: &mut HashMap<String, String>,
    ) -> Result<Option<Change>, FileProblem> {
        // The bytes and their mtime come from one fstat'ed fd. Times in the
        // future (the file's to set, as its updatedAt is) count as now: a
        // file must not stay newer than every later edit.
        let Some((bytes, mtime)) = markdown::read(dir, name)? else { return Ok(None) };
        let now = crate::ids::now_ms() as i64;
        let mtime = mtime.min(now);
        let md_sha256 = sha256_hex(&bytes);
        let existing = self.get(&repo.id, id)?;
        if existing.as_ref().is_some_and(|r| r.md_sha256.as_deref() == Some(md_sha256.as_str())) {
            return Ok(None);
        }
        // A record dated in the future (by a version that trusted a
        // file's date) does not win against a changed file.
        if let Some(old) = existing.as_ref().filter(|r| r.updated_ms <= now && mtime <= r.updated_ms) {
            return Ok(Some(Change::Rewrite(old.clone())));
        }
        let text = std::str::from_utf8(&bytes).map_err(|_| FileProblem::NotUtf8)?;
        let parsed = markdown::parse(text)?;
        let fm = parsed.front;
        if let Some(other) = fm.memory_id.as_deref().filter(|m| *m != id) {
            return Err(FileProblem::OtherId(validate::clip(other).to_string()));
        }
        let f = validate::fields(
            fm.memory_type,
            &fm.title,
            &parsed.content,
            &fm.tags,
            fm.confidence,
            &fm.symbol_ids,
            &fm.file_rel_paths,
        )?;
        let content_sha256 = sha256_hex(f.content.as_bytes());
        let addr = address(&repo.id, f.memory_type, &f.title, &content_sha256);
        if !fm.deleted {
            let owner = self.live_owner(&repo.id, &addr)?;
            if let Some(other) = owner.or_else(|| claimed.get(&addr).cloned()).filter(|o| o != id) {
                return Err(FileProblem::Duplicate(other));
            }
            claimed.insert(addr, id.to_string());
        }
        let baseline = hasher.baseline_from(&f.file_rel_paths, &fm.file_hashes);
        let stale_files = hasher.changed(&baseline);
        let parse_time = |s: &Option<String>| s.as_deref().and_then(parse_rfc3339_ms);
        let created_ms =
            parse_time(&fm.created_at).or(existing.as_ref().map(|r| r.created_ms)).unwrap_or(mtime).min(now);
        let updated_ms = parse_time(&fm.updated_at).map_or(mtime, |u| u.max(mtime)).min(now);
        let record = Record {
            memory: Memory {
                memory_id: id.to_string(),
                repo_id: repo.id.clone(),
                memory_type: f.memory_type,
                title: f.title,
                content: f.content,
                tags: f.tags,
                confidence: f.confidence,
                symbol_ids: f.symbol_ids,
                file_rel_paths: f.file_rel_paths,
                created_at: format_ms(created_ms),
                updated_at: format_ms(updated_ms),
                deleted: fm.deleted,
                stale: !stale_files.is_empty(),
                stale_files,
            },
            created_ms,
            updated_ms,
            content_sha256,
            file_hashes: baseline,
            md_sha256: Some(md_sha256),
        };
        Ok(Some(Change::Import(record, existing.map(Box::new))))
    }

    /// Rewrite the files the store wins, then commit everything at once.
    fn apply(&self, dir: &Dir, changes: Vec<Change>, report: &mut SyncReport) -> Result<(), MemoryError> {
        let mut records = Vec::with_capacity(changes.len());
        let mut plans = Vec::with_capacity(changes.len());
        for change in changes {
            match change {
                Change::Rewrite(mut r) => {
                    let id = r.memory.memory_id.clone();
                    let text = markdown::render(&r.memory, &r.file_hashes)?;
                    markdown::write_atomic(dir, &id, text.as_bytes())?;
                    r.md_sha256 = Some(sha256_hex(text.as_bytes()));
                    report.rewritten.push(id);
                    plans.push(Plan { import: false, old_addr: None, op: "rewrite_file" });
                    records.push(r);
                }
                Change::Import(r, old) => {
                    let op = if old.is_some() { "update_from_file" } else { "import" };
                    if old.is_some() {
                        report.updated.push(r.memory.memory_id.clone());
                    } else {
                        report.imported.push(r.memory.memory_id.clone());
                    }
                    plans.push(Plan { import: true, old_addr: old.map(|o| o.address()), op });
                    records.push(r);
                }
            }
        }
        let commits: Vec<Commit<'_>> = records
            .iter()
            .zip(&plans)
            .map(|(r, plan)| Commit {
                record: r,
                old_addr: plan.old_addr.clone(),
                new_addr: (plan.import && !r.memory.deleted).then(|| r.address()),
                op: plan.op,
                detail: Some(markdown::shown(&r.memory.memory_id)),
            })
            .collect();
        // Chunks keep one transaction's memory bounded on a large first sync.
        for chunk in commits.chunks(1000) {
            self.commit(chunk)?;
        }
        for r in &records {
            self.index(r)?;
        }
        Ok(())
    }
}

/// Why a mirror file was left out of a sync (reported, never fatal).
#[derive(Debug, thiserror::Error)]
enum FileProblem {
    #[error(transparent)]
    Unreadable(#[from] markdown::Unreadable),
    #[error(transparent)]
    Store(#[from] MemoryError),
    #[error("not UTF-8 text")]
    NotUtf8,
    #[error(transparent)]
    Parse(#[from] markdown::ParseError),
    #[error("memoryId '{0}' does not match the file name; rename one")]
    OtherId(String),
    #[error("same type, title and content as memory '{0}'; delete one of the files")]
    Duplicate(String),
}
