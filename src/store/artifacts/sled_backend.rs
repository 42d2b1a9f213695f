//! The sled layout of artifacts: tree `artifacts.meta` maps a handle to its
//! JSON metadata; tree `artifacts.chunks` maps `handle 0x00 stream index`
//! (index big-endian, so a prefix scan returns chunks in order) to the
//! chunk's bytes. Handles never contain 0x00, so prefixes can't collide.

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

fn chunk_key(handle: &str, stream: StreamName, index: u32) -> Vec<u8> {
    let mut k = prefix(handle);
    k.push(tag(stream));
    k.extend_from_slice(&index.to_be_bytes());
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
        self.meta.insert(meta.handle.as_bytes(), json)?;
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
        self.chunks.insert(chunk_key(handle, stream, index), bytes)?;
        Ok(())
    }

    fn get_chunk(&self, handle: &str, stream: StreamName, index: u32) -> Result<Option<Vec<u8>>, ArtifactError> {
        Ok(self.chunks.get(chunk_key(handle, stream, index))?.map(|v| v.to_vec()))
    }

    fn remove(&self, handle: &str) -> Result<(), ArtifactError> {
        self.meta.remove(handle.as_bytes())?;
        let mut batch = sled::Batch::default();
        for k in self.chunks.scan_prefix(prefix(handle)).keys() {
            batch.remove(k?);
        }
        self.chunks.apply_batch(batch)?;
        Ok(())
    }

    fn chunk_handles(&self) -> Result<BTreeSet<String>, ArtifactError> {
        let mut out = BTreeSet::new();
        let mut last: Option<Vec<u8>> = None;
        for k in self.chunks.iter().keys() {
            let k = k?;
            let h = k.split(|&b| b == 0).next().unwrap_or(&[]);
            if last.as_deref() != Some(h) {
                out.insert(String::from_utf8_lossy(h).into_owned());
                last = Some(h.to_vec());
            }
        }
        Ok(out)
    }

    fn flush(&self) -> Result<(), ArtifactError> {
        self.store.flush()?;
        Ok(())
    }
}
