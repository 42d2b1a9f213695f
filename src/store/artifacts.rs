//! Output artifacts: the stored stdout and stderr of a job, cut into chunks
//! of about 1 MiB (each one gzip member, or raw when it doesn't compress),
//! with their metadata, TTL and garbage collection. A small stream's bytes
//! are kept in sled with the metadata; a larger one's in a blob file
//! ([`crate::store::blobs`]).
//!
//! Crash rule: bytes are written (a blob synced, renamed, its directory
//! synced) first and the metadata last, with `complete: true`, then
//! flushed. An artifact whose metadata is missing or says `complete:
//! false` is never served as output; `gc` removes it, and blobs and chunks
//! no metadata names. Every chunk's SHA-256 is in the metadata and checked
//! at each read: damaged bytes are reported, never served.
//!
//! This module owns the layout and never interprets output (that is
//! [`crate::output`]). It reaches sled only through [`ArtifactBackend`], so an
//! object store can take its place on a fleet.

mod chunks;
mod gc;
mod sled_backend;
#[cfg(test)]
mod tests;

pub use crate::store::blobs::Scratch;
pub use chunks::{ChunkSink, StoredStream, INLINE_MAX_BYTES};
pub use gc::GcReport;
pub use sled_backend::SledBackend;

use super::{Store, StoreError};
use crate::job::Status;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// Raw bytes per chunk. A chunk ends at its last newline when it has one, so
/// lines rarely straddle chunks.
pub const CHUNK_BYTES: usize = 1 << 20;
/// Default time to live of an artifact: 24 hours.
pub const DEFAULT_TTL_MS: u64 = 24 * 3600 * 1000;
/// Default cap on the artifacts' total stored size: 1 GiB.
pub const DEFAULT_MAX_TOTAL_BYTES: u64 = 1 << 30;

/// Errors of the artifact store.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// Unknown, expired, or malformed handle. The text is part of the MCP contract.
    #[error("artifact '{0}' not found (expired or never stored)")]
    NotFound(String),
    /// The writer stopped before the end (crash, kill, store failure).
    #[error(
        "artifact '{0}' is incomplete: its capture stopped before the end (crash or kill); `confine gc` removes it"
    )]
    Incomplete(String),
    /// A chunk is missing or does not decode.
    #[error("artifact '{handle}' is damaged ({reason}); remove it with `confine artifacts rm {handle}`")]
    Corrupt { handle: String, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A blob file could not be written or read.
    #[error("artifact '{handle}': its bytes could not be stored or read: {source} (check the free space and health of the store's disk)")]
    Blob {
        handle: String,
        #[source]
        source: std::io::Error,
    },
    /// Writing decompressed output to the caller failed.
    #[error("cannot write the output: {0}")]
    Write(#[source] std::io::Error),
}

impl From<sled::Error> for ArtifactError {
    fn from(e: sled::Error) -> Self {
        ArtifactError::Store(StoreError::Db(e))
    }
}

/// One of the two captured streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    Stdout,
    Stderr,
}

impl StreamName {
    pub const BOTH: [StreamName; 2] = [StreamName::Stdout, StreamName::Stderr];

    pub fn as_str(self) -> &'static str {
        match self {
            StreamName::Stdout => "stdout",
            StreamName::Stderr => "stderr",
        }
    }
}

impl std::fmt::Display for StreamName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a chunk's bytes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// One gzip member (RFC 1952).
    Gzip,
    /// The bytes as they are (they did not compress).
    Raw,
}

/// Where one chunk sits in its stream: the per-chunk line index that lets a
/// query or a line range touch only the chunks it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkInfo {
    /// Newlines in the stream before this chunk's first byte.
    pub first_line: u64,
    /// Newlines in this chunk.
    pub newlines: u32,
    pub raw_len: u32,
    pub stored_len: u32,
    pub encoding: Encoding,
    pub ends_with_newline: bool,
    /// SHA-256 (hex) of the chunk's stored bytes, checked at every read.
    pub sha256: String,
}

/// One stream of an artifact.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamMeta {
    /// Bytes the job wrote, including those past the stored cap.
    pub total_bytes: u64,
    /// Lines of the whole (redacted) output, counted past the stored cap too.
    pub total_lines: u64,
    /// Bytes stored: the redacted output up to the stored cap.
    pub stored_bytes: u64,
    /// Lines stored (a last line without a newline counts).
    pub stored_lines: u64,
    /// Bytes the chunks take in the store.
    pub compressed_bytes: u64,
    /// SHA-256 (hex) of the stored bytes, exactly what `confine artifacts
    /// show` prints. Hashing the redacted rather than the raw output is
    /// deliberate: a hash of raw output that held a secret would let anyone
    /// with the handle confirm a guess of that secret. With nothing redacted
    /// and nothing truncated it equals `sha256sum` of the raw output.
    pub sha256: String,
    /// Output went past the stored cap: its middle was drained and counted,
    /// not kept ([`StreamMeta::dropped`] says what).
    pub truncated: bool,
    /// Secrets replaced by `[REDACTED]`.
    pub redactions: u64,
    pub chunks: Vec<ChunkInfo>,
    /// The blob file that holds the chunks, one after the other; `None`:
    /// they are kept in sled with the metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
    /// What was dropped between the head and the tail of a stream past its
    /// stored cap; a marker line stands in its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Dropped>,
}

/// The middle of a stream past its stored cap: its first part (a quarter
/// of the cap) and its last part (the rest) are stored, this is not. The
/// lines after it keep their numbers in the whole output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dropped {
    /// Lines stored whole before the dropped part: line `after_line + 1`
    /// is the first that lost bytes (the marker is at its end, or is it).
    pub after_line: u64,
    /// The first line (1-based) stored whole after it.
    pub resume_line: u64,
    pub bytes: u64,
    /// Newlines in the dropped part.
    pub lines: u64,
}

impl StreamMeta {
    /// The number of the last stored line: the stored lines, plus the
    /// lines a dropped middle skipped.
    pub fn last_line(&self) -> u64 {
        match self.chunks.last() {
            Some(c) => c.first_line + u64::from(c.newlines) + u64::from(!c.ends_with_newline && c.raw_len > 0),
            None => self.stored_lines,
        }
    }
}

/// The job an artifact belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    pub runtime: Option<String>,
    pub status: Option<Status>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
}

/// The metadata record of an artifact: written at the start with
/// `complete: false`, rewritten at the end with `complete: true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactMeta {
    pub handle: String,
    pub repo_id: String,
    pub created_ms: u64,
    pub expires_ms: u64,
    pub complete: bool,
    #[serde(default)]
    pub job: JobInfo,
    #[serde(default)]
    pub stdout: StreamMeta,
    #[serde(default)]
    pub stderr: StreamMeta,
}

impl ArtifactMeta {
    pub fn stream(&self, s: StreamName) -> &StreamMeta {
        match s {
            StreamName::Stdout => &self.stdout,
            StreamName::Stderr => &self.stderr,
        }
    }

    /// Bytes the artifact takes in the store (what the size cap counts).
    pub fn compressed_bytes(&self) -> u64 {
        self.stdout.compressed_bytes + self.stderr.compressed_bytes
    }
}

/// Where artifacts are kept: sled today ([`SledBackend`]), an object store
/// later. Keys are plain (handle, stream, chunk index) so both fit.
pub trait ArtifactBackend: Send + Sync {
    fn put_meta(&self, meta: &ArtifactMeta) -> Result<(), ArtifactError>;
    fn get_meta(&self, handle: &str) -> Result<Option<ArtifactMeta>, ArtifactError>;
    /// Every metadata record, complete or not. A record that does not parse
    /// comes back as an incomplete one, so `gc` removes it.
    fn list_meta(&self) -> Result<Vec<ArtifactMeta>, ArtifactError>;
    /// Store a chunk of a stream kept with the metadata.
    fn put_chunk(&self, handle: &str, stream: StreamName, index: u32, bytes: &[u8]) -> Result<(), ArtifactError>;
    fn get_chunk(&self, handle: &str, stream: StreamName, index: u32) -> Result<Option<Vec<u8>>, ArtifactError>;
    /// Remove the metadata, then the chunks (a crash in between leaves
    /// orphan chunks, which `gc` sweeps, never a record without its data).
    /// Blobs are collected by `gc`: another artifact may share one.
    fn remove(&self, handle: &str) -> Result<(), ArtifactError>;
    /// Handles that own chunks, with or without metadata.
    fn chunk_handles(&self) -> Result<BTreeSet<String>, ArtifactError>;
    /// Where larger streams go; `None`: every chunk goes to `put_chunk`.
    fn blobs(&self) -> Option<&crate::store::blobs::Blobs> {
        None
    }
    fn flush(&self) -> Result<(), ArtifactError>;
}

/// Handles being written by this process; `gc` leaves them alone. (sled
/// locks its directory, so no other process can write the same store.)
static ACTIVE: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

fn active_set() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    ACTIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub use crate::ids::now_ms;

/// The artifact store: capture writes through it, queries read through it.
#[derive(Clone)]
pub struct Artifacts {
    backend: Arc<dyn ArtifactBackend>,
}

impl Artifacts {
    pub fn new(backend: Arc<dyn ArtifactBackend>) -> Self {
        Artifacts { backend }
    }

    /// Artifacts in the sled store.
    pub fn open(store: &Store) -> Result<Self, ArtifactError> {
        Ok(Artifacts::new(Arc::new(SledBackend::open(store)?)))
    }

    /// Start an artifact: a fresh handle and an incomplete metadata record.
    pub fn begin(&self, repo_id: &str, ttl_ms: u64) -> Result<ArtifactWriter, ArtifactError> {
        let created_ms = now_ms();
        let handle = new_handle(repo_id, created_ms);
        let meta = ArtifactMeta {
            handle: handle.clone(),
            repo_id: repo_id.to_string(),
            created_ms,
            expires_ms: created_ms.saturating_add(ttl_ms),
            complete: false,
            job: JobInfo::default(),
            stdout: StreamMeta::default(),
            stderr: StreamMeta::default(),
        };
        active_set().insert(handle.clone());
        let writer = ArtifactWriter { artifacts: self.clone(), meta, pins: Default::default() };
        self.backend.put_meta(&writer.meta)?;
        Ok(writer)
    }

    /// A complete, unexpired artifact.
    pub fn get(&self, handle: &str) -> Result<ArtifactMeta, ArtifactError> {
        let not_found = || ArtifactError::NotFound(handle.to_string());
        if handle.is_empty() || handle.len() > 200 || handle.contains('\0') {
            return Err(not_found());
        }
        let meta = self.backend.get_meta(handle)?.ok_or_else(not_found)?;
        if meta.expires_ms <= now_ms() {
            return Err(not_found());
        }
        if !meta.complete {
            return Err(ArtifactError::Incomplete(handle.to_string()));
        }
        Ok(meta)
    }

    /// Every artifact, incomplete and expired ones included, oldest first.
    pub fn list(&self) -> Result<Vec<ArtifactMeta>, ArtifactError> {
        let mut all = self.backend.list_meta()?;
        all.sort_by(|a, b| (a.created_ms, &a.handle).cmp(&(b.created_ms, &b.handle)));
        Ok(all)
    }

    /// Remove an artifact; `false` when there was none.
    pub fn remove(&self, handle: &str) -> Result<bool, ArtifactError> {
        let collection = self.backend.blobs().map(|b| b.collection());
        let existed = self.backend.get_meta(handle)?.is_some();
        self.backend.remove(handle)?;
        self.backend.flush()?;
        if collection.is_some() {
            gc::collect_blobs(self.backend.as_ref(), &|h| active_set().contains(h))?;
        }
        Ok(existed)
    }

    /// Decode chunk `index` of a stream into `out` (cleared first).
    pub fn read_chunk(
        &self,
        meta: &ArtifactMeta,
        stream: StreamName,
        index: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ArtifactError> {
        let corrupt = |reason: String| ArtifactError::Corrupt { handle: meta.handle.clone(), reason };
        let info = meta
            .stream(stream)
            .chunks
            .get(index)
            .ok_or_else(|| corrupt(format!("{stream} chunk {index} out of range")))?;
        let s = meta.stream(stream);
        let bytes = match (&s.blob, self.backend.blobs()) {
            (Some(blob), Some(blobs)) => {
                let offset: u64 = s.chunks[..index].iter().map(|c| u64::from(c.stored_len)).sum();
                blobs
                    .read_at(blob, offset, info.stored_len as usize)
                    .map_err(|e| corrupt(format!("{stream} chunk {index}: blob {blob}: {e}")))?
            }
            (Some(blob), None) => return Err(corrupt(format!("{stream} is in blob {blob}, and this store has none"))),
            (None, _) => self
                .backend
                .get_chunk(&meta.handle, stream, index as u32)?
                .ok_or_else(|| corrupt(format!("{stream} chunk {index} is missing")))?,
        };
        if hex::encode(Sha256::digest(&bytes)) != info.sha256 {
            return Err(corrupt(format!(
                "{stream} chunk {index} does not match its SHA-256: its bytes were changed on disk"
            )));
        }
        out.clear();
        match info.encoding {
            Encoding::Raw => out.extend_from_slice(&bytes),
            Encoding::Gzip => {
                out.reserve(info.raw_len as usize);
                flate2::read::GzDecoder::new(&bytes[..])
                    .read_to_end(out)
                    .map_err(|e| corrupt(format!("{stream} chunk {index}: {e}")))?;
            }
        }
        if out.len() != info.raw_len as usize {
            return Err(corrupt(format!("{stream} chunk {index} has {} bytes, expected {}", out.len(), info.raw_len)));
        }
        Ok(())
    }

    /// Write a stream's stored bytes to `out`, one chunk in memory at a time.
    pub fn copy_stream(
        &self,
        meta: &ArtifactMeta,
        stream: StreamName,
        out: &mut dyn Write,
    ) -> Result<u64, ArtifactError> {
        let mut buf = Vec::new();
        let mut written = 0u64;
        for index in 0..meta.stream(stream).chunks.len() {
            self.read_chunk(meta, stream, index, &mut buf)?;
            out.write_all(&buf).map_err(ArtifactError::Write)?;
            written += buf.len() as u64;
        }
        out.flush().map_err(ArtifactError::Write)?;
        Ok(written)
    }

    /// Remove expired and incomplete artifacts, then the oldest ones until
    /// the rest take at most `max_total_bytes`.
    pub fn gc(&self, max_total_bytes: u64) -> Result<GcReport, ArtifactError> {
        gc::run(self.backend.as_ref(), max_total_bytes, now_ms(), &|h| active_set().contains(h))
    }
}

/// An artifact being written. Dropped without [`ArtifactWriter::finish`], it
/// stays incomplete and is never served.
pub struct ArtifactWriter {
    artifacts: Artifacts,
    meta: ArtifactMeta,
    /// Blobs the streams committed: safe from `gc` until the metadata
    /// naming them is written (the writer is dropped).
    pins: Arc<Mutex<Vec<crate::store::blobs::BlobPin>>>,
}

impl ArtifactWriter {
    pub fn handle(&self) -> &str {
        &self.meta.handle
    }

    /// The chunk writer of one stream. Call once per stream.
    pub fn chunk_sink(&self, stream: StreamName) -> ChunkSink {
        ChunkSink::new(self.artifacts.backend.clone(), self.meta.handle.clone(), stream, self.pins.clone())
    }

    /// Write the final metadata (`complete: true`) and flush: from here on
    /// the artifact is served.
    pub fn finish(self, job: JobInfo, stdout: StreamMeta, stderr: StreamMeta) -> Result<ArtifactMeta, ArtifactError> {
        let artifacts = self.artifacts.clone();
        let meta = self.finish_unflushed(job, stdout, stderr)?;
        artifacts.backend.flush()?;
        Ok(meta)
    }

    /// [`ArtifactWriter::finish`] without the flush, for a caller that
    /// flushes the store itself before it tells anyone of the artifact: the
    /// supervisor's audit append flushes both with one fsync.
    pub fn finish_unflushed(
        mut self,
        job: JobInfo,
        stdout: StreamMeta,
        stderr: StreamMeta,
    ) -> Result<ArtifactMeta, ArtifactError> {
        self.meta.job = job;
        self.meta.stdout = stdout;
        self.meta.stderr = stderr;
        self.meta.complete = true;
        self.artifacts.backend.put_meta(&self.meta)?;
        Ok(self.meta.clone())
    }
}

impl Drop for ArtifactWriter {
    fn drop(&mut self) {
        active_set().remove(&self.meta.handle);
    }
}

/// `run-<repoId>-<unix-ms>-<16 hex>`; the repo id is reduced to
/// `[A-Za-z0-9._-]` (at most 64 characters) so a handle is safe in keys,
/// paths and shells.
fn new_handle(repo_id: &str, now_ms: u64) -> String {
    let mut repo: String = repo_id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' })
        .take(64)
        .collect();
    if repo.is_empty() {
        repo.push_str("local");
    }
    format!("run-{repo}-{now_ms}-{}", hex::encode(random_bytes()))
}

/// Handles must be unique, not secret: the kernel's random bytes when
/// readable, else a randomly keyed hash of the time and a counter.
fn random_bytes() -> [u8; 8] {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return b;
    }
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u32(std::process::id());
    h.finish().to_le_bytes()
}
