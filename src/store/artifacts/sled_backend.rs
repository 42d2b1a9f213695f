//! The sled layout of artifacts: tree `artifacts.meta` maps a handle to its
//! JSON metadata; tree `artifacts.chunks` maps `handle 0x00 stream index
//! piece` (numbers big-endian, so a prefix scan returns bytes in order) to
//! pieces of at most 4 KiB of a chunk of a small stream. Handles never
//! contain 0x00, so prefixes can't collide. Larger streams are in the
//! store's blobs.
//!
//! Why pieces: sled 0.34 keeps large values resident whatever its cache
//! size (docs/benchmarks.md, "Figures once in the code"). A chunk's pieces
//! go in one batch: all or none.

use super::{ArtifactBackend, ArtifactError, ArtifactMeta, StreamName};
use crate::store::{Store, StoreError};
use std::collections::BTreeSet;

const TREE_META: &str = "artifacts.meta";
const TREE_CHUNKS: &str = "artifacts.chunks";

/// Artifacts kept in the confine sled store.
pub struct SledBackend {
    store: Store,
    meta: sled::Tree,
    chunks: sled::Tree,
}

impl SledBackend {
    pub fn open(store: &Store) -> Result<Self, ArtifactError> {
        Ok(SledBackend { store: store.clone(), meta: store.tree(TREE_META)?, chunks: store.tree(TREE_CHUNKS)? })
    }
}

fn tag(stream: StreamName) -> u8 {
    match stream {
        StreamName::Stdout => b'o',
        StreamName::Stderr => b'e',
    }
}

fn prefix(handle: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(handle.len() + 6);
    k.extend_from_slice(handle.as_bytes());
    k.push(0);
    k
}

/// Bytes per sled value (see the module doc).
const PIECE_BYTES: usize = 4096;

fn chunk_key(handle: &str, stream: StreamName, index: u32) -> Vec<u8> {
    let mut k = prefix(handle);
    k.push(tag(stream));
    k.extend_from_slice(&index.to_be_bytes());
    k
}

fn piece_key(chunk: &[u8], piece: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(chunk.len() + 4);
    k.extend_from_slice(chunk);
    k.extend_from_slice(&piece.to_be_bytes());
    k
}

/// A record that does not parse is reported as an incomplete artifact:
/// never served, removed by `gc`.
fn decode(key: &[u8], value: &[u8]) -> ArtifactMeta {
    serde_json::from_slice(value).unwrap_or_else(|_| ArtifactMeta {
        handle: String::from_utf8_lossy(key).into_owned(),
        repo_id: String::new(),
        created_ms: 0,
        expires_ms: 0,
        complete: false,
        job: Default::default(),
        stdout: Default::default(),
        stderr: Default::default(),
    })
}

impl ArtifactBackend for SledBackend {
    fn put_meta(&self, meta: &ArtifactMeta) -> Result<(), ArtifactError> {
        let json = serde_json::to_vec(meta).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.store.check_room_for_records()?;
        self.meta.insert(meta.handle.as_bytes(), json).map_err(|e| self.store.failed_with(e.into()))?;
        crate::crashpoint::reached("artifact-meta");
        Ok(())
    }

    fn get_meta(&self, handle: &str) -> Result<Option<ArtifactMeta>, ArtifactError> {
        Ok(self.meta.get(handle.as_bytes())?.map(|v| decode(handle.as_bytes(), &v)))
    }

    fn list_meta(&self) -> Result<Vec<ArtifactMeta>, ArtifactError> {
        let mut out = Vec::new();
        for kv in self.meta.iter() {
            let (k, v) = kv?;
            out.push(decode(&k, &v));
        }
        Ok(out)
    }

    fn put_chunk(&self, handle: &str, stream: StreamName, index: u32, bytes: &[u8]) -> Result<(), ArtifactError> {
        let chunk = chunk_key(handle, stream, index);
        let mut batch = sled::Batch::default();
        for (i, piece) in bytes.chunks(PIECE_BYTES).enumerate() {
            batch.insert(piece_key(&chunk, i as u32), piece);
        }
        self.store.check_room_for_records()?;
        self.chunks.apply_batch(batch).map_err(|e| self.store.failed_with(e.into()))?;
        Ok(())
    }

    fn get_chunk(&self, handle: &str, stream: StreamName, index: u32) -> Result<Option<Vec<u8>>, ArtifactError> {
        let mut out: Option<Vec<u8>> = None;
        for piece in self.chunks.scan_prefix(chunk_key(handle, stream, index)).values() {
            out.get_or_insert_with(Vec::new).extend_from_slice(&piece?);
        }
        Ok(out)
    }

    fn remove(&self, handle: &str) -> Result<(), ArtifactError> {
        // A removal is a write too (sled logs it).
        self.store.check_room_for_records()?;
        self.meta.remove(handle.as_bytes()).map_err(|e| self.store.failed_with(e.into()))?;
        let mut batch = sled::Batch::default();
        for k in self.chunks.scan_prefix(prefix(handle)).keys() {
            batch.remove(k?);
        }
        self.chunks.apply_batch(batch).map_err(|e| self.store.failed_with(e.into()))?;
        Ok(())
    }

    fn chunk_handles(&self) -> Result<BTreeSet<String>, ArtifactError> {
        // One seek per handle: the keys of handle `h` all sort before `h 0x01`.
        let mut out = BTreeSet::new();
        let mut from: Vec<u8> = Vec::new();
        while let Some(kv) = self.chunks.range(from.clone()..).next() {
            let (k, _) = kv?;
            let h = k.split(|&b| b == 0).next().unwrap_or(&[]);
            out.insert(String::from_utf8_lossy(h).into_owned());
            from = h.to_vec();
            from.push(1);
        }
        Ok(out)
    }

    fn blobs(&self) -> Option<&crate::store::blobs::Blobs> {
        Some(self.store.blobs())
    }

    fn flush(&self) -> Result<(), ArtifactError> {
        self.store.flush()?;
        Ok(())
    }
}
