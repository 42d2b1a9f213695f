//! Chunk encoding and writing: each chunk of a stream becomes one gzip
//! member (level 1), or stays raw when it does not compress, and its place
//! in the stream goes into the per-chunk line index.

use super::{ArtifactBackend, ArtifactError, ChunkInfo, Encoding, StreamName};
use std::sync::Arc;

/// A chunk whose first 32 KiB shrink by less than 10% at gzip level 1 is
/// stored raw: such output (base64, compressed data) would otherwise cost
/// compression for nothing, at a rate far below the drain target.
const PROBE_BYTES: usize = 32 << 10;

/// Encodes and stores one stream's chunks, and keeps their line index.
pub struct ChunkSink {
    backend: Arc<dyn ArtifactBackend>,
    handle: String,
    stream: StreamName,
    chunks: Vec<ChunkInfo>,
    lines: u64,
    compressed: u64,
    encoder: ChunkEncoder,
}

impl ChunkSink {
    pub(super) fn new(backend: Arc<dyn ArtifactBackend>, handle: String, stream: StreamName) -> Self {
        ChunkSink { backend, handle, stream, chunks: Vec::new(), lines: 0, compressed: 0, encoder: ChunkEncoder::new() }
    }

    /// Encode and store the next chunk (at most [`super::CHUNK_BYTES`] raw bytes).
    pub fn write_chunk(&mut self, raw: &[u8]) -> Result<(), ArtifactError> {
        let encoding = self.encoder.encode(raw);
        let bytes = if encoding == Encoding::Gzip { &self.encoder.out[..] } else { raw };
        let index = self.chunks.len() as u32;
        self.backend.put_chunk(&self.handle, self.stream, index, bytes)?;
        let newlines = memchr::memchr_iter(b'\n', raw).count() as u32;
        self.chunks.push(ChunkInfo {
            first_line: self.lines,
            newlines,
            raw_len: raw.len() as u32,
            stored_len: bytes.len() as u32,
            encoding,
            ends_with_newline: raw.last() == Some(&b'\n'),
        });
        self.lines += u64::from(newlines);
        self.compressed += bytes.len() as u64;
        Ok(())
    }

    /// The chunk index and the bytes the chunks take.
    pub fn into_parts(self) -> (Vec<ChunkInfo>, u64) {
        (self.chunks, self.compressed)
    }
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
