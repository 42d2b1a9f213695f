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
//! Blobs are collected last: a blob no metadata names and no writer of
//! this process has pinned (committed, its metadata not yet written) is
//! an orphan, and so is a temporary blob file whose writer is gone. Blobs
//! are content-addressed and may be shared, so removing an artifact never
//! removes its blobs itself.
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
    /// Blob files no artifact names (a crash before the metadata, or
    /// removed artifacts), temporary ones included.
    pub orphan_blobs: u64,
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
    // Before anything is listed (see `Blobs::collection`).
    let collection = backend.blobs().map(|b| b.collection());
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
    // The removals first: a crash must leave blobs without metadata, never
    // metadata without its blobs.
    backend.flush()?;
    if collection.is_some() {
        report.orphan_blobs = collect_blobs(backend, is_active)?;
    }
    drop(collection);
    Ok(report)
}

/// Remove the blobs no metadata names and the temporary files of writers
/// that are gone. The caller holds a [`crate::store::blobs::Collection`]
/// from before it listed anything.
pub(super) fn collect_blobs(
    backend: &dyn ArtifactBackend,
    is_active: &dyn Fn(&str) -> bool,
) -> Result<u64, ArtifactError> {
    let Some(blobs) = backend.blobs() else { return Ok(0) };
    let blob_error = |source| ArtifactError::Blob { handle: "(garbage collection)".into(), source };
    let mut named = BTreeSet::new();
    for meta in backend.list_meta()? {
        named.extend(meta.stdout.blob.clone());
        named.extend(meta.stderr.blob.clone());
    }
    let (files, tmps) = blobs.list().map_err(blob_error)?;
    let mut removed = 0;
    for name in files {
        if !named.contains(&name) && blobs.remove_unpinned(&name).map_err(blob_error)? {
            removed += 1;
        }
    }
    for tag in tmps {
        // `<handle>.<stream>`: a handle never holds a dot-free stream name.
        let handle = tag.rsplit_once('.').map_or(tag.as_str(), |(h, _)| h);
        if !is_active(handle) {
            blobs.remove_tmp(&tag).map_err(blob_error)?;
            removed += 1;
        }
    }
    Ok(removed)
}
