//! Streaming capture of a job's stdout and stderr.
//!
//! A job's pipes are read with blocking reads by the thread that also runs
//! stage 1 of [`super::worker`] ([`capture_pipe`]); any other async reader
//! is read on the runtime and its buffers handed over a small bounded
//! channel to that stage ([`capture`]). Stage 1 redacts, hashes (SHA-256),
//! counts lines and keeps a bounded head and tail inline; the store thread
//! writes gzip chunks of about 1 MiB to the artifact store as they fill.
//! Memory per stream is a few MiB whatever the output size. Past the stored cap the stream is still read
//! to its end and counted, so the job never blocks on a full pipe; a store
//! failure does not stop the draining either, it only leaves the artifact
//! incomplete.

use super::redact::{RedactStream, Redactor};
use super::worker::{Pool, Processor, READ_BYTES};
use super::{OutputConfig, StreamLimits};
use crate::store::artifacts::{ArtifactMeta, ArtifactWriter, Artifacts, ChunkSink, JobInfo, StreamMeta, StreamName};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Reads in flight between the reader and the worker.
const QUEUE: usize = 16;

/// Where one stream goes: its caps, its chunk writer (none when output is
/// not persisted), its redaction state.
pub struct StreamSink {
    pub(crate) stream: StreamName,
    pub(crate) limits: StreamLimits,
    pub(crate) chunks: Option<ChunkSink>,
    pub(crate) redact: Option<RedactStream>,
}

impl StreamSink {
    pub fn new(
        stream: StreamName,
        limits: StreamLimits,
        chunks: Option<ChunkSink>,
        redactor: Option<&Redactor>,
    ) -> Self {
        StreamSink { stream, limits, chunks, redact: redactor.map(Redactor::stream) }
    }
}

/// What capture learned of one stream.
#[derive(Debug, Clone)]
pub struct StreamSummary {
    pub stream: StreamName,
    /// Counts, hash and chunk index (chunks empty when nothing was stored).
    pub meta: StreamMeta,
    /// The first bytes of the (redacted) output, at most half the inline cap.
    pub head: Vec<u8>,
    /// The last bytes, at most the other half; they follow `head` after
    /// `gap_bytes` bytes that are not inline.
    pub tail: Vec<u8>,
    pub gap_bytes: u64,
    /// Why the stream was not fully read or stored, if it wasn't.
    pub error: Option<String>,
}

/// Read `reader` to its end into `sink`.
pub async fn capture<R: AsyncRead + Unpin>(mut reader: R, sink: StreamSink) -> StreamSummary {
    let stream = sink.stream;
    let pool = Arc::new(Pool::default());
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(QUEUE);
    let worker_pool = pool.clone();
    let worker = tokio::task::spawn_blocking(move || {
        let mut p = Processor::new(sink, worker_pool);
        while let Some(buf) = rx.blocking_recv() {
            p.feed(buf);
        }
        p.finish()
    });
    let mut error = None;
    let mut lost = 0u64;
    loop {
        let mut buf = pool.get();
        // At most READ_BYTES a read, whatever the buffer's capacity: a large
        // pipe must not make buffers (and memory) grow.
        match (&mut reader).take(READ_BYTES as u64).read_buf(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if tx.is_closed() || tx.send(buf).await.is_err() {
                    // The worker is gone (a bug): keep draining so the job can't block.
                    lost += n as u64;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                error = Some(format!("reading {stream}: {e}"));
                break;
            }
        }
    }
    drop(tx);
    let mut summary = match worker.await {
        Ok(s) => s,
        Err(e) => StreamSummary::failed(stream, &e),
    };
    summary.meta.total_bytes += lost;
    if summary.error.is_none() {
        summary.error = error;
    }
    summary
}

/// Read the pipe `fd` to its end into `sink`, with blocking reads on the
/// thread that also runs stage 1 ([`Processor`]); `observe` sees every
/// read first (and `(&[], true)` at the end). For a job's stdout and
/// stderr. Against [`capture`], a flood of small writes (`yes | head`
/// writes 8 KiB at a time) costs one wake-up per write instead of an
/// epoll wake-up of a runtime thread plus a futex wake-up of the worker:
/// measured with one core busy, `yes | head -c 1G` through `confine exec`
/// went from 3.3–3.9 s to 2.0–2.1 s (idle: a tie). And while stage 1
/// works, the pipe fills, so reads grow with the load.
#[cfg(unix)]
pub async fn capture_pipe(
    fd: std::os::fd::OwnedFd,
    mut observe: impl FnMut(&[u8], bool) + Send + 'static,
    sink: StreamSink,
) -> StreamSummary {
    let stream = sink.stream;
    let worker = tokio::task::spawn_blocking(move || {
        let pool = Arc::new(Pool::default());
        let mut p = Processor::new(sink, pool.clone());
        let mut error = None;
        loop {
            let mut buf = pool.get();
            match read_pipe(&fd, &mut buf) {
                Ok(0) => {
                    observe(&[], true);
                    break;
                }
                Ok(_) => {
                    observe(&buf, false);
                    p.feed(buf);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    error = Some(format!("reading {stream}: {e}"));
                    break;
                }
            }
        }
        let mut summary = p.finish();
        if summary.error.is_none() {
            summary.error = error;
        }
        summary
    });
    worker.await.unwrap_or_else(|e| StreamSummary::failed(stream, &e))
}

impl StreamSummary {
    /// A stream whose capture thread died (a bug): nothing is known of it.
    fn failed(stream: StreamName, e: &tokio::task::JoinError) -> StreamSummary {
        StreamSummary {
            stream,
            meta: StreamMeta::default(),
            head: Vec::new(),
            tail: Vec::new(),
            gap_bytes: 0,
            error: Some(format!("{stream} capture failed: {e}")),
        }
    }
}

/// One blocking `read` of at most [`READ_BYTES`] into the spare capacity
/// of `buf` (a pool buffer, empty and at least that big: nothing to zero).
#[cfg(unix)]
fn read_pipe(fd: &std::os::fd::OwnedFd, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    buf.clear();
    buf.reserve(READ_BYTES);
    let spare = buf.spare_capacity_mut();
    let want = spare.len().min(READ_BYTES);
    // SAFETY: `spare` is valid for writes of `want` bytes, and read(2)
    // writes at most that many into it.
    let n = unsafe { libc::read(fd.as_raw_fd(), spare.as_mut_ptr().cast(), want) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: read(2) initialised the first `n` bytes (n <= want).
    unsafe { buf.set_len(n as usize) };
    Ok(n as usize)
}

/// One job's capture: both streams, and the artifact they go to.
pub struct Capture {
    writer: Option<ArtifactWriter>,
    config: OutputConfig,
    redactor: Option<Redactor>,
    notes: Vec<String>,
}

/// The result of a capture: what the response modes render.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The stored artifact, complete; `None` when nothing was persisted.
    pub artifact: Option<ArtifactMeta>,
    pub stdout: StreamSummary,
    pub stderr: StreamSummary,
    /// Why output was not stored, when it should have been.
    pub notes: Vec<String>,
}

impl Captured {
    pub fn handle(&self) -> Option<&str> {
        self.artifact.as_ref().map(|a| a.handle.as_str())
    }
}

impl Capture {
    /// Start capturing. With `artifacts` absent or `persist` false nothing is
    /// stored (`persistOutput: false`). A store that can't start an artifact
    /// doesn't fail the job: output is still drained, and a note says why
    /// there is no handle.
    pub fn start(
        artifacts: Option<&Artifacts>,
        repo_id: &str,
        config: &OutputConfig,
        redactor: Option<Redactor>,
        persist: bool,
    ) -> Capture {
        let mut notes = Vec::new();
        let writer = match artifacts.filter(|_| persist).map(|a| a.begin(repo_id, config.ttl_ms())) {
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                notes.push(format!("output was not stored: {e}"));
                None
            }
            None => None,
        };
        Capture { writer, config: config.clone(), redactor, notes }
    }

    /// The handle the artifact will have once finished.
    pub fn handle(&self) -> Option<&str> {
        self.writer.as_ref().map(ArtifactWriter::handle)
    }

    /// The sink of one stream, to hand to [`capture`]. Take each once.
    pub fn sink(&self, stream: StreamName) -> StreamSink {
        let chunks = self.writer.as_ref().map(|w| w.chunk_sink(stream));
        StreamSink::new(stream, self.config.limits(stream), chunks, self.redactor.as_ref())
    }

    /// Seal the artifact (metadata last, `complete: true`, flushed). A stream
    /// that failed to store leaves it incomplete: never served, and `gc`
    /// removes it.
    pub fn finish(self, job: JobInfo, stdout: StreamSummary, stderr: StreamSummary) -> Captured {
        self.seal(job, stdout, stderr, true)
    }

    /// [`Capture::finish`] without flushing the store: the caller must flush
    /// it before it tells anyone of the artifact (the supervisor's audit
    /// append does, one fsync for both).
    pub fn finish_unflushed(self, job: JobInfo, stdout: StreamSummary, stderr: StreamSummary) -> Captured {
        self.seal(job, stdout, stderr, false)
    }

    fn seal(mut self, job: JobInfo, stdout: StreamSummary, stderr: StreamSummary, flush: bool) -> Captured {
        let mut artifact = None;
        if let Some(writer) = self.writer.take() {
            let failed: Vec<&str> = [&stdout, &stderr].iter().filter_map(|s| s.error.as_deref()).collect();
            if failed.is_empty() {
                let sealed = if flush {
                    writer.finish(job, stdout.meta.clone(), stderr.meta.clone())
                } else {
                    writer.finish_unflushed(job, stdout.meta.clone(), stderr.meta.clone())
                };
                match sealed {
                    Ok(meta) => artifact = Some(meta),
                    Err(e) => self.notes.push(format!("output was not stored: {e}")),
                }
            } else {
                self.notes.push(format!("output was not stored: {}", failed.join("; ")));
            }
        }
        Captured { artifact, stdout, stderr, notes: self.notes }
    }
}

#[cfg(test)]
mod tests;
