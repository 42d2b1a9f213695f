//! The blocking half of capture, in two stages so that hashing and
//! compression run at the same time on two cores:
//!
//! 1. [`Processor`] (a tokio blocking thread): redaction, line counts, the
//!    inline head and tail, the stored cap, SHA-256. Past a quarter of the
//!    stored cap, bytes go to a ring of the stream's tail
//!    ([`super::tail`]) instead, stored at the end after a marker line;
//! 2. the store thread: cuts ~1 MiB chunks at newlines, gzips them, writes
//!    them to the artifact store.
//!
//! Buffers travel reader → stage 1 → stage 2 and back through a small
//! shared [`Pool`], so a flood allocates nothing once it runs. Both stages
//! keep draining after a store failure: the job must never block on a full
//! pipe because of us.

use super::capture::{StreamSink, StreamSummary};
use crate::store::artifacts::{ArtifactError, ChunkSink, Dropped, StoredStream, StreamMeta, CHUNK_BYTES};
use crate::store::blobs::Blobs;
use sha2::{Digest, Sha256};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex};

/// Why an output's tail ring was not stored after its head.
#[derive(Debug, thiserror::Error)]
enum TailError {
    #[error("reading its tail back: {0}")]
    Read(std::io::Error),
    #[error(transparent)]
    Store(#[from] ArtifactError),
}

/// Bytes asked of one pipe read.
pub(crate) const READ_BYTES: usize = 128 << 10;
/// Capacity of every buffer: a read, plus room for redaction output (the
/// input plus a small carry) to fit without growing.
const BUFFER_BYTES: usize = READ_BYTES + (4 << 10);
/// Buffers in flight between stage 1 and the store thread.
const STORE_QUEUE: usize = 8;

/// Reusable byte buffers, shared by the reader and both stages. All have
/// the same size, so a flood allocates only as many as are in flight
/// (bounded by the queues) and then recycles them: no allocator churn,
/// which on glibc would otherwise leave tens of MiB of freed buffers
/// resident in per-thread arenas.
#[derive(Default)]
pub(crate) struct Pool {
    bufs: Mutex<Vec<Vec<u8>>>,
}

impl Pool {
    /// An empty buffer of [`BUFFER_BYTES`] capacity.
    pub(crate) fn get(&self) -> Vec<u8> {
        let popped = self.bufs.lock().unwrap_or_else(|p| p.into_inner()).pop();
        popped.unwrap_or_else(|| Vec::with_capacity(BUFFER_BYTES))
    }

    pub(crate) fn put(&self, mut v: Vec<u8>) {
        // One that grew (redaction output with a long carry) is let go.
        if v.capacity() <= 2 * BUFFER_BYTES {
            v.clear();
            self.bufs.lock().unwrap_or_else(|p| p.into_inner()).push(v);
        }
    }
}

/// Stage 2: the chunk writer on its own thread.
struct Storer {
    tx: SyncSender<Vec<u8>>,
    thread: std::thread::JoinHandle<(ChunkSink, Option<String>)>,
}

impl Storer {
    fn spawn(mut sink: ChunkSink, pool: Arc<Pool>, name: &'static str) -> std::io::Result<Storer> {
        let (tx, rx) = sync_channel::<Vec<u8>>(STORE_QUEUE);
        let thread = std::thread::Builder::new().name(format!("confine-store-{name}")).spawn(move || {
            let mut cut = Cutter::default();
            let mut error: Option<String> = None;
            while let Ok(buf) = rx.recv() {
                // After a failure, only drained.
                if error.is_none() {
                    if let Err(e) = cut.push(&mut sink, &buf) {
                        error = Some(format!("storing {name}: {e}"));
                    }
                }
                pool.put(buf);
            }
            if error.is_none() {
                if let Err(e) = cut.flush(&mut sink) {
                    error = Some(format!("storing {name}: {e}"));
                }
            }
            (sink, error)
        })?;
        Ok(Storer { tx, thread })
    }
}

/// Cuts stored bytes into chunks of [`CHUNK_BYTES`] at the last newline,
/// so lines rarely straddle chunks.
#[derive(Default)]
struct Cutter {
    pending: Vec<u8>,
}

impl Cutter {
    fn push(&mut self, sink: &mut ChunkSink, bytes: &[u8]) -> Result<(), ArtifactError> {
        if self.pending.capacity() == 0 {
            self.pending.reserve(CHUNK_BYTES + (256 << 10));
        }
        self.pending.extend_from_slice(bytes);
        let mut start = 0;
        let mut result = Ok(());
        while self.pending.len() - start >= CHUNK_BYTES {
            let window = &self.pending[start..start + CHUNK_BYTES];
            let cut = memchr::memrchr(b'\n', window).map_or(CHUNK_BYTES, |i| i + 1);
            result = sink.write_chunk(&self.pending[start..start + cut]);
            start += cut;
            if result.is_err() {
                break;
            }
        }
        self.pending.drain(..start);
        result
    }

    /// Store what is pending as a chunk of its own.
    fn flush(&mut self, sink: &mut ChunkSink) -> Result<(), ArtifactError> {
        if !self.pending.is_empty() {
            sink.write_chunk(&self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }
}

/// Stored bytes stage 1 holds back before it starts the store thread.
/// Output this small (most jobs' is) is stored by stage 1 itself at the
/// end, as one chunk: a job's two streams then start no thread each.
pub(crate) const STORE_THREAD_AFTER: usize = 256 << 10;
// What stage 1 holds is stored as a single chunk.
const _: () = assert!(STORE_THREAD_AFTER < CHUNK_BYTES);

/// Stage 1.
pub(crate) struct Processor {
    sink: StreamSink,
    pool: Arc<Pool>,
    /// The chunk writer while no store thread has it.
    chunks: Option<ChunkSink>,
    /// Stored bytes not yet handed to a store thread.
    held: Vec<u8>,
    storer: Option<Storer>,
    hasher: Sha256,
    head: Vec<u8>,
    tail: Vec<u8>,
    seen: u64,
    total_bytes: u64,
    total_lines: u64,
    last_byte: Option<u8>,
    stored_bytes: u64,
    stored_lines: u64,
    stored_last: Option<u8>,
    truncated: bool,
    /// Stored bytes before the tail ring takes over: a quarter of the
    /// stored cap when the stream is stored, else the whole cap.
    head_cap: u64,
    ring: Option<super::tail::TailRing>,
    /// No scratch file could be made: the output is cut after the head.
    no_ring: bool,
    /// Where the ring's scratch file goes.
    blobs: Option<Blobs>,
    dropped: Option<Dropped>,
    error: Option<String>,
}

impl Processor {
    pub(crate) fn new(mut sink: StreamSink, pool: Arc<Pool>) -> Self {
        let chunks = sink.chunks.take();
        let cap = sink.limits.stored_bytes;
        let head_cap = if chunks.is_some() { cap / 4 } else { cap };
        let blobs = chunks.as_ref().and_then(ChunkSink::blob_store);
        Processor {
            sink,
            pool,
            chunks,
            held: Vec::new(),
            storer: None,
            hasher: Sha256::new(),
            head: Vec::new(),
            tail: Vec::new(),
            seen: 0,
            total_bytes: 0,
            total_lines: 0,
            last_byte: None,
            stored_bytes: 0,
            stored_lines: 0,
            stored_last: None,
            truncated: false,
            head_cap,
            ring: None,
            no_ring: false,
            blobs,
            dropped: None,
            error: None,
        }
    }

    /// Hand what is held, and from now on everything stored, to a store
    /// thread.
    fn start_storer(&mut self) {
        let Some(c) = self.chunks.take() else { return };
        match Storer::spawn(c, self.pool.clone(), self.sink.stream.as_str()) {
            Ok(s) => {
                let held = std::mem::take(&mut self.held);
                if s.tx.send(held).is_err() {
                    self.error.get_or_insert_with(|| format!("storing {}: the store thread stopped", self.sink.stream));
                } else {
                    self.storer = Some(s);
                }
            }
            Err(e) => {
                self.held = Vec::new();
                self.error = Some(format!("storing {}: cannot start a thread: {e}", self.sink.stream));
            }
        }
    }

    /// Bytes as read from the pipe.
    pub(crate) fn feed(&mut self, data: Vec<u8>) {
        self.total_bytes += data.len() as u64;
        if let Some(r) = self.sink.redact.as_mut() {
            let mut out = self.pool.get();
            r.push(&data, &mut out);
            self.pool.put(data);
            self.take(out);
        } else {
            self.take(data);
        }
    }

    /// Redacted bytes: count, keep inline, store up to the head's cap,
    /// then keep the tail.
    fn take(&mut self, mut bytes: Vec<u8>) {
        let Some(&last) = bytes.last() else { return self.pool.put(bytes) };
        self.last_byte = Some(last);
        self.seen += bytes.len() as u64;
        self.keep_inline(&bytes);
        let room = self.head_cap.saturating_sub(self.stored_bytes);
        let kept = bytes.len().min(room.try_into().unwrap_or(usize::MAX));
        let kept_lines = memchr::memchr_iter(b'\n', &bytes[..kept]).count() as u64;
        self.total_lines += kept_lines;
        if kept < bytes.len() {
            let rest = &bytes[kept..];
            let tail_cap = self.sink.limits.stored_bytes - self.head_cap;
            if self.ring.is_none() && !self.no_ring && self.head_cap < self.sink.limits.stored_bytes {
                // Without a scratch file (a full disk), the tail is not kept:
                // never in the supervisor's memory.
                self.ring = self.scratch().map(|f| super::tail::TailRing::new(tail_cap, f));
                self.no_ring = self.ring.is_none();
            }
            if let Some(ring) = self.ring.as_mut().filter(|_| self.error.is_none()) {
                let before = ring.newlines;
                if let Err(e) = ring.push(rest) {
                    self.error = Some(format!("storing {}: keeping its tail: {e}", self.sink.stream));
                }
                self.total_lines += ring.newlines - before;
            } else {
                self.truncated = true;
                self.total_lines += memchr::memchr_iter(b'\n', rest).count() as u64;
            }
            bytes.truncate(kept);
        }
        let Some(&l) = bytes.last() else { return self.pool.put(bytes) };
        self.store(bytes, kept_lines, l);
    }

    /// A scratch file of the store for the tail ring.
    fn scratch(&self) -> Option<crate::store::artifacts::Scratch> {
        self.blobs.as_ref().and_then(|b| b.scratch().ok())
    }

    /// Count, hash and store bytes that are kept.
    fn store(&mut self, bytes: Vec<u8>, lines: u64, last: u8) {
        self.count_stored(&bytes, lines, last);
        match &self.storer {
            Some(s) => {
                if s.tx.send(bytes).is_err() {
                    self.error.get_or_insert_with(|| format!("storing {}: the store thread stopped", self.sink.stream));
                    self.storer = None;
                }
            }
            None if self.chunks.is_some() => {
                // Copied, not kept: small reads must not each pin a buffer.
                self.held.extend_from_slice(&bytes);
                self.pool.put(bytes);
                if self.held.len() >= STORE_THREAD_AFTER {
                    self.start_storer();
                }
            }
            None => self.pool.put(bytes),
        }
    }

    fn keep_inline(&mut self, mut bytes: &[u8]) {
        let head_cap = self.sink.limits.inline_bytes / 2;
        let tail_cap = self.sink.limits.inline_bytes - head_cap;
        if self.head.len() < head_cap {
            let n = (head_cap - self.head.len()).min(bytes.len());
            self.head.extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        if bytes.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend_from_slice(&bytes[bytes.len() - tail_cap..]);
        } else {
            self.tail.extend_from_slice(bytes);
            // Trim in bulk: amortised O(1) a byte.
            if self.tail.len() > 2 * tail_cap.max(4096) {
                self.tail.drain(..self.tail.len() - tail_cap);
            }
        }
    }

    /// Store the tail ring after the head: as it is when nothing fell out
    /// of it; else after a marker line that says what was dropped, from the
    /// first whole line on, its chunks numbered as in the whole output.
    fn store_tail(&mut self, sink: &mut ChunkSink, ring: &super::tail::TailRing) -> Result<(), TailError> {
        let mut cut = Cutter::default();
        let mut failed: Option<ArtifactError> = None;
        let mut skip = 0usize;
        if ring.overwritten() > 0 {
            // First pass: the newlines the ring holds, and where its first
            // whole line starts (within its first piece; else no trim).
            let (mut held_newlines, mut first_piece) = (0u64, true);
            ring.read_in_order(&mut |piece| {
                if first_piece {
                    skip = memchr::memchr(b'\n', piece).map_or(0, |i| i + 1);
                    first_piece = false;
                }
                held_newlines += memchr::memchr_iter(b'\n', piece).count() as u64;
            })
            .map_err(TailError::Read)?;
            let dropped_newlines = ring.newlines - held_newlines + u64::from(skip > 0);
            let dropped_bytes = ring.overwritten() + skip as u64;
            let cap = self.sink.limits.stored_bytes;
            // The marker ends the line it is on (a head's last, cut line,
            // or its own) only when a line break was dropped: then the
            // tail's lines, numbered on from it, keep their numbers. With
            // none dropped, one line lost its middle, and the marker sits
            // in it.
            let marker_newlines = dropped_newlines.min(1);
            let marker = format!(
                "[confine: {} bytes ({} lines) dropped here: the output passed its stored cap of {}; the first {} and the last {} are kept]{}",
                dropped_bytes,
                dropped_newlines,
                super::human_size(cap),
                super::human_size(self.head_cap),
                super::human_size(cap - self.head_cap),
                if marker_newlines == 1 { "\n" } else { "" },
            );
            let head_lines = self.stored_lines;
            self.keep_stored(marker.as_bytes());
            cut.push(sink, marker.as_bytes()).and_then(|()| cut.flush(sink))?;
            sink.skip_lines(dropped_newlines - marker_newlines);
            self.truncated = true;
            self.dropped = Some(Dropped {
                after_line: head_lines,
                resume_line: head_lines + dropped_newlines + 1,
                bytes: dropped_bytes,
                lines: dropped_newlines,
            });
        }
        ring.read_in_order(&mut |mut piece| {
            if skip > 0 {
                let n = skip.min(piece.len());
                piece = &piece[n..];
                skip -= n;
            }
            if failed.is_some() || piece.is_empty() {
                return;
            }
            self.keep_stored(piece);
            if let Err(e) = cut.push(sink, piece) {
                failed = Some(e);
            }
        })
        .map_err(TailError::Read)?;
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(cut.flush(sink)?),
        }
    }

    /// Count and hash stored bytes written at the end (the tail).
    fn keep_stored(&mut self, bytes: &[u8]) {
        if let Some(&last) = bytes.last() {
            self.count_stored(bytes, memchr::memchr_iter(b'\n', bytes).count() as u64, last);
        }
    }

    fn count_stored(&mut self, bytes: &[u8], lines: u64, last: u8) {
        self.hasher.update(bytes);
        self.stored_bytes += bytes.len() as u64;
        self.stored_lines += lines;
        self.stored_last = Some(last);
    }

    pub(crate) fn finish(mut self) -> StreamSummary {
        if let Some(mut r) = self.sink.redact.take() {
            let mut out = Vec::new();
            r.finish(&mut out);
            self.take(out);
            self.sink.redact = Some(r);
        }
        let mut stored = StoredStream::default();
        let stream = self.sink.stream;
        // Small output: stored here, as the store thread would have (one
        // chunk: it is under CHUNK_BYTES).
        let mut sink = None;
        if let Some(mut s) = self.chunks.take() {
            if !self.held.is_empty() {
                if let Err(e) = s.write_chunk(&self.held) {
                    self.error.get_or_insert_with(|| format!("storing {}: {e}", self.sink.stream));
                }
            }
            sink = Some(s);
        }
        if let Some(Storer { tx, thread }) = self.storer.take() {
            drop(tx);
            match thread.join() {
                Ok((s, error)) => {
                    if self.error.is_none() {
                        self.error = error;
                    }
                    sink = Some(s);
                }
                Err(_) => {
                    self.error
                        .get_or_insert_with(|| format!("storing {}: the store thread panicked", self.sink.stream));
                }
            }
        }
        if let Some(mut s) = sink.filter(|_| self.error.is_none()) {
            if let Some(ring) = self.ring.take() {
                if let Err(e) = self.store_tail(&mut s, &ring) {
                    self.error.get_or_insert_with(|| format!("storing {stream}: {e}"));
                }
            }
            if self.error.is_none() {
                match s.finish() {
                    Ok(s) => stored = s,
                    Err(e) => self.error = Some(format!("storing {stream}: {e}")),
                }
            }
        }
        let unterminated = |b: Option<u8>| u64::from(b.is_some_and(|b| b != b'\n'));
        let tail_cap = self.sink.limits.inline_bytes - self.sink.limits.inline_bytes / 2;
        if self.tail.len() > tail_cap {
            self.tail.drain(..self.tail.len() - tail_cap);
        }
        let meta = StreamMeta {
            total_bytes: self.total_bytes,
            total_lines: self.total_lines + unterminated(self.last_byte),
            stored_bytes: self.stored_bytes,
            stored_lines: self.stored_lines + unterminated(self.stored_last),
            compressed_bytes: stored.compressed_bytes,
            sha256: hex::encode(self.hasher.finalize()),
            truncated: self.truncated,
            redactions: self.sink.redact.as_ref().map_or(0, |r| r.redactions),
            chunks: stored.chunks,
            blob: stored.blob,
            dropped: self.dropped,
        };
        let gap_bytes = self.seen - self.head.len() as u64 - self.tail.len() as u64;
        StreamSummary { stream: self.sink.stream, meta, head: self.head, tail: self.tail, gap_bytes, error: self.error }
    }
}
