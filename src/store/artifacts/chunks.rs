//! Chunk encoding and writing: each chunk of a stream becomes one gzip
//! member (level 1), or stays raw when it does not compress, and its place
//! in the stream and its SHA-256 go into the per-chunk index.
//!
//! Where the bytes go: a stream whose stored bytes stay under
//! [`INLINE_MAX_BYTES`] (most jobs' output) is kept with its metadata, in
//! sled, in small pieces: no file to create and sync per job. A larger
//! one goes to a blob file ([`crate::store::blobs`]), so artifact bytes
//! never fill sled's cache and write buffers.

use super::{ArtifactBackend, ArtifactError, ChunkInfo, Encoding, StreamName};
use crate::store::blobs::{BlobPin, BlobWriter};
use sha2::{Digest, Sha256};
use std::sync::{Arc, Mutex};

/// A chunk whose first 32 KiB shrink by less than 10% at gzip level 1 is
/// stored raw: such output (base64, compressed data) would otherwise cost
/// compression for nothing, at a rate far below the drain target.
const PROBE_BYTES: usize = 32 << 10;

/// Stored bytes of a stream above which it goes to a blob file.
pub const INLINE_MAX_BYTES: usize = 64 << 10;

/// What a stream's chunks became.
#[derive(Debug, Default)]
pub struct StoredStream {
    pub chunks: Vec<ChunkInfo>,
    /// Bytes the chunks take in the store.
    pub compressed_bytes: u64,
    /// The blob that holds them; `None`: kept with the metadata.
    pub blob: Option<String>,
}

/// Encodes and stores one stream's chunks, and keeps their index.
pub struct ChunkSink {
    backend: Arc<dyn ArtifactBackend>,
    handle: String,
    stream: StreamName,
    chunks: Vec<ChunkInfo>,
    /// The chunks' SHA-256s: a blob's name is the SHA-256 of them.
    hashes: Vec<[u8; 32]>,
    lines: u64,
    compressed: u64,
    encoder: ChunkEncoder,
    /// Stored bytes of the chunks while the stream may still stay inline.
    pending: Vec<u8>,
    blob: Option<BlobWriter>,
    /// The backend has no blob store: chunks go to it one by one.
    direct: bool,
    /// Where a committed blob's pin goes: the artifact writer holds it
    /// until the metadata that names the blob is written.
    pins: Arc<Mutex<Vec<BlobPin>>>,
}

impl ChunkSink {
    pub(super) fn new(
        backend: Arc<dyn ArtifactBackend>,
        handle: String,
        stream: StreamName,
        pins: Arc<Mutex<Vec<BlobPin>>>,
    ) -> Self {
        ChunkSink {
            backend,
            handle,
            stream,
            chunks: Vec::new(),
            hashes: Vec::new(),
            lines: 0,
            compressed: 0,
            encoder: ChunkEncoder::new(),
            pending: Vec::new(),
            blob: None,
            direct: false,
            pins,
        }
    }

    /// Encode and store the next chunk (at most [`super::CHUNK_BYTES`] raw bytes).
    pub fn write_chunk(&mut self, raw: &[u8]) -> Result<(), ArtifactError> {
        let encoding = self.encoder.encode(raw);
        let bytes = if encoding == Encoding::Gzip { &self.encoder.out[..] } else { raw };
        let index = self.chunks.len() as u32;
        let hash: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(blob) = &mut self.blob {
            blob.append(bytes, &hash).map_err(|e| blob_error(&self.handle, e))?;
        } else if self.direct {
            self.backend.put_chunk(&self.handle, self.stream, index, bytes)?;
        } else {
            self.pending.extend_from_slice(bytes);
        }
        let newlines = memchr::memchr_iter(b'\n', raw).count() as u32;
        self.chunks.push(ChunkInfo {
            first_line: self.lines,
            newlines,
            raw_len: raw.len() as u32,
            stored_len: bytes.len() as u32,
            encoding,
            ends_with_newline: raw.last() == Some(&b'\n'),
            sha256: hex::encode(hash),
        });
        self.hashes.push(hash);
        self.lines += u64::from(newlines);
        self.compressed += bytes.len() as u64;
        if self.pending.len() > INLINE_MAX_BYTES {
            self.spill()?;
        }
        Ok(())
    }

    /// Number the next chunk's lines as if `n` more lines had been stored:
    /// the lines of a dropped middle, so the tail keeps its line numbers.
    pub fn skip_lines(&mut self, n: u64) {
        self.lines += n;
    }

    /// The store's blobs, for scratch files; `None` when the backend has
    /// none (a stream's tail is then kept in memory).
    pub fn blob_store(&self) -> Option<crate::store::blobs::Blobs> {
        self.backend.blobs().cloned()
    }

    /// The stream outgrew [`INLINE_MAX_BYTES`]: what is pending goes to a
    /// blob, and the rest will follow it there.
    fn spill(&mut self) -> Result<(), ArtifactError> {
        let pending = std::mem::take(&mut self.pending);
        let mut at = 0;
        match self.backend.blobs() {
            Some(blobs) => {
                let tag = format!("{}.{}", self.handle, self.stream);
                let mut w = blobs.writer(&tag).map_err(|e| blob_error(&self.handle, e))?;
                for (info, hash) in self.chunks.iter().zip(&self.hashes) {
                    let end = at + info.stored_len as usize;
                    w.append(&pending[at..end], hash).map_err(|e| blob_error(&self.handle, e))?;
                    at = end;
                }
                self.blob = Some(w);
            }
            None => {
                self.put_pending(&pending)?;
                self.direct = true;
            }
        }
        Ok(())
    }

    /// The pending chunks, each to the backend's own store.
    fn put_pending(&self, pending: &[u8]) -> Result<(), ArtifactError> {
        let mut at = 0;
        for (i, info) in self.chunks.iter().enumerate() {
            let end = at + info.stored_len as usize;
            self.backend.put_chunk(&self.handle, self.stream, i as u32, &pending[at..end])?;
            at = end;
        }
        Ok(())
    }

    /// Store what is pending: a blob is synced and named, inline bytes go
    /// to the backend. Returns the chunk index and where the bytes are.
    pub fn finish(mut self) -> Result<StoredStream, ArtifactError> {
        let mut blob = None;
        if let Some(w) = self.blob.take() {
            let pin = w.commit().map_err(|e| blob_error(&self.handle, e))?;
            blob = Some(pin.name().to_string());
            self.pins.lock().unwrap_or_else(|p| p.into_inner()).push(pin);
        } else if !self.direct {
            self.put_pending(&self.pending)?;
        }
        Ok(StoredStream { chunks: std::mem::take(&mut self.chunks), compressed_bytes: self.compressed, blob })
    }
}

fn blob_error(handle: &str, source: std::io::Error) -> ArtifactError {
    ArtifactError::Blob { handle: handle.to_string(), source }
}

/// Gzip at level 1 (measured: about 1 GB/s on build logs with zlib-rs),
/// one member per chunk. One deflate state is reused for every chunk of a
/// stream: a fresh encoder per chunk would allocate and free ~300 KiB each
/// time, which fragments the heap and shows up in the supervisor's RSS.
///
/// The state is made at the first chunk worth compressing, not with the
/// sink: most jobs leave a stream empty or nearly so, and making it
/// allocates and zeroes those ~300 KiB (a `confine exec` of `true`, whose
/// streams are empty, is measurably faster without the two).
pub(super) struct ChunkEncoder {
    z: Option<flate2::Compress>,
    pub(super) out: Vec<u8>,
}

/// Gzip header: deflate, no name, no mtime, unknown OS.
const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// The smallest gzip member: the header, an empty deflate block (two
/// bytes), the CRC-32 and the length. A chunk of at most this many bytes
/// can't shrink, and is stored raw without trying.
const GZIP_MIN_BYTES: usize = GZIP_HEADER.len() + 2 + 8;

impl ChunkEncoder {
    pub(super) fn new() -> Self {
        ChunkEncoder { z: None, out: Vec::new() }
    }

    /// Whether the deflate state has been made (tests).
    #[cfg(test)]
    pub(super) fn has_deflate_state(&self) -> bool {
        self.z.is_some()
    }

    /// `raw` as one gzip member in `self.out`.
    fn gzip(&mut self, raw: &[u8]) -> Result<(), flate2::CompressError> {
        let z = match &mut self.z {
            Some(z) => {
                z.reset();
                z
            }
            None => self.z.insert(flate2::Compress::new(flate2::Compression::fast(), false)),
        };
        self.out.clear();
        self.out.extend_from_slice(&GZIP_HEADER);
        let mut done = 0;
        loop {
            if self.out.capacity() - self.out.len() < 4096 {
                self.out.reserve((raw.len() - done) / 4 + 4096);
            }
            let before = z.total_in();
            let status = z.compress_vec(&raw[done..], &mut self.out, flate2::FlushCompress::Finish)?;
            done += (z.total_in() - before) as usize;
            if status == flate2::Status::StreamEnd {
                break;
            }
        }
        let mut crc = flate2::Crc::new();
        crc.update(raw);
        self.out.extend_from_slice(&crc.sum().to_le_bytes());
        self.out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        Ok(())
    }

    /// Gzip, or raw when that saves less than 10%. `Gzip` leaves the bytes
    /// in `self.out`.
    pub(super) fn encode(&mut self, raw: &[u8]) -> Encoding {
        if raw.len() <= GZIP_MIN_BYTES {
            return Encoding::Raw;
        }
        if raw.len() > 2 * PROBE_BYTES {
            let probe = &raw[..PROBE_BYTES];
            if self.gzip(probe).is_err() || self.out.len() * 10 > probe.len() * 9 {
                return Encoding::Raw;
            }
        }
        match self.gzip(raw) {
            Ok(()) if self.out.len() < raw.len() => Encoding::Gzip,
            _ => Encoding::Raw,
        }
    }
}
