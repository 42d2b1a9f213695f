//! Artifact garbage collection: expired first, then incomplete leftovers of
//! a crash, then orphan chunks, then the oldest artifacts until the total
//! fits the size cap. Artifacts this process is still writing are skipped.
//!
//! GC runs while jobs write (the supervisor starts it after a job), so
//! "being written" is asked at the moment of each removal, never from a
//! snapshot: a writer becomes active before its first record and stops
//! being active only after its final one, so a handle that is not active
//! *now* and has no record *now* is truly an orphan, and an incomplete
//! record that is still incomplete once its writer is gone is truly a
//! leftover.
//!
//! The cap counts the bytes the artifacts' chunks take (their compressed
//! size), not sled's file size: sled reclaims space lazily, so its file
//! size would lag behind every deletion and evict too much.

use super::{ArtifactBackend, ArtifactError};
use serde::Serialize;
use std::collections::BTreeSet;

/// What one GC pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GcReport {
    /// Past their TTL.
    pub expired: u64,
    /// Left incomplete by a crash or a failed capture.
    pub incomplete: u64,
    /// Chunks without a metadata record (a crash during removal).
    pub orphans: u64,
    /// Removed, oldest first, to fit the size cap.
    pub evicted: u64,
    /// Stored bytes freed by expiry and eviction.
    pub freed_bytes: u64,
    /// Artifacts kept, and the bytes they take.
    pub kept: u64,
    pub kept_bytes: u64,
}

pub(super) fn run(
    backend: &dyn ArtifactBackend,
    max_total_bytes: u64,
    now_ms: u64,
    is_active: &dyn Fn(&str) -> bool,
) -> Result<GcReport, ArtifactError> {
    let mut report = GcReport::default();
    let mut keep = Vec::new();
    let mut known = BTreeSet::new();
    for listed in backend.list_meta()? {
        known.insert(listed.handle.clone());
        if is_active(&listed.handle) {
            continue;
        }
        // Listed incomplete, it may have been finished since: look again.
        let meta = if listed.complete {
            listed
        } else {
            match backend.get_meta(&listed.handle)? {
                Some(now) if now.complete => now,
                Some(_) => {
                    backend.remove(&listed.handle)?;
                    report.incomplete += 1;
                    continue;
                }
                None => continue,
            }
        };
        if meta.expires_ms <= now_ms {
            backend.remove(&meta.handle)?;
            report.expired += 1;
            report.freed_bytes += meta.compressed_bytes();
        } else {
            keep.push(meta);
        }
    }
    for handle in backend.chunk_handles()? {
        // In this order: a writer is active before its first record.
        if !known.contains(&handle) && !is_active(&handle) && backend.get_meta(&handle)?.is_none() {
            backend.remove(&handle)?;
            report.orphans += 1;
        }
    }
    keep.sort_by(|a, b| (a.created_ms, &a.handle).cmp(&(b.created_ms, &b.handle)));
    let mut total: u64 = keep.iter().map(|m| m.compressed_bytes()).sum();
    let mut evict = 0;
    while total > max_total_bytes && evict < keep.len() {
        let meta = &keep[evict];
        backend.remove(&meta.handle)?;
        total -= meta.compressed_bytes();
        report.freed_bytes += meta.compressed_bytes();
        report.evicted += 1;
        evict += 1;
    }
    report.kept = (keep.len() - evict) as u64;
    report.kept_bytes = total;
    backend.flush()?;
    Ok(report)
}
