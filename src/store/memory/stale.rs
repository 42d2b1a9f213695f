//! Staleness: at store time the SHA-256 of each linked file is recorded
//! (the baseline); a later check hashes the files again, and a memory whose
//! linked files changed, vanished, or now lead out of the repository is
//! stale. Files are opened again on every check, from the repository
//! root's fd with no symlink followed and without blocking, and must be
//! regular ([`open_linked`]): a symlink or a FIFO swapped in later is
//! never read, and reads as "changed". At most [`MAX_LINKED_BYTES`] of a
//! file is hashed; a larger one counts as unreadable.
//!
//! Symbol links can't go stale here: confine has no symbol index (a
//! memory's `symbolIds` are opaque labels).

use super::db::{Commit, MemoryDb};
use super::types::{CheckReport, RepoRef};
use super::validate::{open_linked, repo_root};
use super::{invalid, MemoryError};
use crate::dirfd::Dir;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;

/// Largest linked file hashed (a job could plant a huge sparse file to
/// keep the supervisor busy).
pub const MAX_LINKED_BYTES: u64 = 1 << 30;

/// The recorded hash of each linked file (`None`: it did not exist).
pub(crate) type Baseline = BTreeMap<String, Option<String>>;

/// Hashes files of one repository, each at most once per call.
pub(crate) struct FileHasher<'a> {
    root: &'a Dir,
    memo: HashMap<String, Option<String>>,
}

impl<'a> FileHasher<'a> {
    /// For the repository open at `root` ([`repo_root`]).
    pub fn new(root: &'a Dir) -> Self {
        FileHasher { root, memo: HashMap::new() }
    }

    /// The hash of `rel` now; `None` when it is absent, unreadable, or
    /// leads outside the repository.
    pub fn current(&mut self, rel: &str) -> Option<String> {
        if let Some(h) = self.memo.get(rel) {
            return h.clone();
        }
        let h = match open_linked(self.root, rel) {
            Ok(Some((file, _))) => hash_file(file).ok(),
            _ => None,
        };
        self.memo.insert(rel.to_string(), h.clone());
        h
    }

    /// The baseline of a memory being stored: every file must exist.
    pub fn baseline(&mut self, rels: &[String]) -> Result<Baseline, MemoryError> {
        let mut out = Baseline::new();
        for rel in rels {
            let (file, _) = open_linked(self.root, rel)?.ok_or_else(|| {
                invalid(format!("fileRelPath '{rel}' does not exist in the repository; link existing files"))
            })?;
            let h = hash_file(file).map_err(|e| invalid(format!("fileRelPath '{rel}' can't be read: {e}")))?;
            self.memo.insert(rel.clone(), Some(h.clone()));
            out.insert(rel.clone(), Some(h));
        }
        Ok(out)
    }

    /// The baseline of a memory read back from a file: the recorded hash
    /// where the file has one, else the file's hash now.
    pub fn baseline_from(&mut self, rels: &[String], recorded: &Baseline) -> Baseline {
        rels.iter()
            .map(|rel| {
                let h = match recorded.get(rel) {
                    Some(h) => h.clone(),
                    None => self.current(rel),
                };
                (rel.clone(), h)
            })
            .collect()
    }

    /// The linked files whose hash differs from the baseline, in order.
    pub fn changed(&mut self, baseline: &Baseline) -> Vec<String> {
        baseline.iter().filter(|(rel, h)| self.current(rel) != **h).map(|(rel, _)| rel.clone()).collect()
    }
}

/// SHA-256 of an open regular file, at most [`MAX_LINKED_BYTES`].
fn hash_file(f: std::fs::File) -> std::io::Result<String> {
    let mut f = f.take(MAX_LINKED_BYTES + 1);
    let mut seen = 0u64;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        seen += n as u64;
        if seen > MAX_LINKED_BYTES {
            return Err(crate::dirfd::too_large(MAX_LINKED_BYTES));
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// SHA-256 of bytes, hex.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl MemoryDb {
    /// Re-hash every linked file of the live memories (each file once) and
    /// update the flags that changed: one transaction and one flush, only
    /// when something did. The index lock is never held while files are
    /// read; the write lock is, so no store can slip in between.
    pub(crate) fn check_repo(&self, repo: &RepoRef) -> Result<CheckReport, MemoryError> {
        let root = repo_root(repo)?;
        let _w = self.write_lock();
        let rels: Vec<String> = self.with_index(&repo.id, |ix| {
            let set: BTreeSet<&str> = ix.metas().flat_map(|m| m.baseline.keys().map(String::as_str)).collect();
            set.into_iter().map(str::to_string).collect()
        })?;
        let mut hasher = FileHasher::new(&root);
        let now: HashMap<String, Option<String>> = rels
            .into_iter()
            .map(|r| {
                let h = hasher.current(&r);
                (r, h)
            })
            .collect();
        let mut report = CheckReport { repo_id: repo.id.clone(), ..CheckReport::default() };
        let flips: Vec<(String, Vec<String>)> = self.with_index(&repo.id, |ix| {
            let mut flips = Vec::new();
            for m in ix.metas().filter(|m| !m.baseline.is_empty()) {
                report.checked += 1;
                let files: Vec<String> = m
                    .baseline
                    .iter()
                    .filter(|(rel, h)| now.get(rel.as_str()) != Some(*h))
                    .map(|(rel, _)| rel.clone())
                    .collect();
                report.stale += usize::from(!files.is_empty());
                if files != m.stale_files || m.stale == files.is_empty() {
                    flips.push((m.memory_id.clone(), files));
                }
            }
            flips
        })?;
        let mut changed = Vec::with_capacity(flips.len());
        for (id, files) in flips {
            let Some(mut r) = self.get(&repo.id, &id)? else { continue };
            let stale = !files.is_empty();
            if stale && !r.memory.stale {
                report.newly_stale.push(id);
            } else if !stale {
                report.no_longer_stale.push(id);
            }
            r.memory.stale = stale;
            r.memory.stale_files = files;
            changed.push(r);
        }
        if changed.is_empty() {
            return Ok(report);
        }
        let commits: Vec<Commit<'_>> = changed
            .iter()
            .map(|r| Commit {
                record: r,
                old_addr: None,
                new_addr: None,
                op: if r.memory.stale { "stale" } else { "fresh" },
                detail: (!r.memory.stale_files.is_empty()).then(|| r.memory.stale_files.join(", ")),
            })
            .collect();
        self.commit(&commits)?;
        self.with_index(&repo.id, |ix| {
            for r in &changed {
                ix.set_stale(&r.memory.memory_id, &r.memory.stale_files);
            }
        })?;
        Ok(report)
    }
}
