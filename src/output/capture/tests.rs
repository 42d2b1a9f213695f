use super::*;
use crate::store::artifacts::{ArtifactBackend, ArtifactError, SledBackend, CHUNK_BYTES};
use crate::store::Store;
use sha2::{Digest, Sha256};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::ReadBuf;

/// A reader that hands out at most `step` bytes a read.
struct Trickle {
    data: Vec<u8>,
    at: usize,
    step: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let n = self.step.min(self.data.len() - self.at).min(buf.remaining());
        let at = self.at;
        buf.put_slice(&self.data[at..at + n]);
        self.at += n;
        Poll::Ready(Ok(()))
    }
}

fn limits(inline_bytes: usize, stored_bytes: u64) -> StreamLimits {
    StreamLimits { inline_bytes, stored_bytes }
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[tokio::test]
async fn counts_hashes_and_keeps_head_and_tail() {
    let data: Vec<u8> = (1..=1000).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
    let sink = StreamSink::new(StreamName::Stdout, limits(100, 1 << 20), None, None);
    let s = capture(&data[..], sink).await;
    assert_eq!(s.meta.total_bytes, data.len() as u64);
    assert_eq!((s.meta.total_lines, s.meta.stored_lines), (1000, 1000));
    assert_eq!(s.meta.sha256, sha(&data));
    assert!(!s.meta.truncated && s.meta.chunks.is_empty());
    assert_eq!(s.head, &data[..50]);
    assert_eq!(s.tail, &data[data.len() - 50..]);
    assert_eq!(s.gap_bytes, data.len() as u64 - 100);
}

#[tokio::test]
async fn past_the_stored_cap_output_is_drained_and_counted() {
    let data = b"0123456789\n".repeat(1000);
    let sink = StreamSink::new(StreamName::Stderr, limits(64, 105), None, None);
    let s = capture(Trickle { data: data.clone(), at: 0, step: 7 }, sink).await;
    assert!(s.meta.truncated);
    assert_eq!((s.meta.total_bytes, s.meta.stored_bytes), (11_000, 105));
    assert_eq!((s.meta.total_lines, s.meta.stored_lines), (1000, 10));
    assert_eq!(s.meta.sha256, sha(&data[..105]));
    assert_eq!(s.tail, &data[data.len() - 32..]);
}

#[tokio::test]
async fn stored_chunks_reproduce_the_output_and_end_at_newlines() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig::default();
    let cap = Capture::start(Some(&artifacts), "r", &cfg, None, true);
    let data: Vec<u8> =
        (0..200_000u32).flat_map(|i| format!("{i} {}\n", "x".repeat(i as usize % 40)).into_bytes()).collect();
    let out = capture(&data[..], cap.sink(StreamName::Stdout)).await;
    let err = capture(&b"oops"[..], cap.sink(StreamName::Stderr)).await;
    let captured = cap.finish(JobInfo::default(), out, err);
    let meta = artifacts.get(captured.handle().unwrap()).unwrap();
    assert!(meta.stdout.chunks.len() > 3);
    for c in &meta.stdout.chunks[..meta.stdout.chunks.len() - 1] {
        assert!(c.ends_with_newline && c.raw_len as usize <= CHUNK_BYTES);
    }
    assert_eq!(meta.stderr.stored_lines, 1);
    let mut back = Vec::new();
    artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(meta.stdout.sha256, sha(&data));
    assert!(meta.stdout.compressed_bytes < data.len() as u64 / 3);
}

#[tokio::test]
async fn secrets_are_redacted_before_storage_even_when_split() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig { redact_env: vec!["TOKEN".into()], ..OutputConfig::default() };
    let redactor = cfg.redactor(|k| (k == "TOKEN").then(|| "s3cr3t-value".to_string()));
    let cap = Capture::start(Some(&artifacts), "r", &cfg, redactor, true);
    let data = b"key AKIAIOSFODNN7EXAMPLE and s3cr3t-value\n".repeat(50);
    let out = capture(Trickle { data, at: 0, step: 5 }, cap.sink(StreamName::Stdout)).await;
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let captured = cap.finish(JobInfo::default(), out, err);
    let meta = captured.artifact.unwrap();
    let mut back = Vec::new();
    artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
    assert_eq!(back, b"key [REDACTED] and [REDACTED]\n".repeat(50));
    assert_eq!(meta.stdout.redactions, 100);
    assert_eq!(meta.stdout.sha256, sha(&back));
    assert!(!captured.stdout.head.windows(6).any(|w| w == b"s3cr3t"));
}

#[tokio::test]
async fn persist_false_keeps_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cap = Capture::start(Some(&artifacts), "r", &OutputConfig::default(), None, false);
    assert!(cap.handle().is_none());
    let out = capture(&b"hello\n"[..], cap.sink(StreamName::Stdout)).await;
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let captured = cap.finish(JobInfo::default(), out, err);
    assert!(captured.artifact.is_none() && captured.notes.is_empty());
    assert_eq!(captured.stdout.head, b"hello\n");
    assert!(artifacts.list().unwrap().is_empty());
}

/// A store whose chunk writes fail after the first one.
struct Failing(SledBackend, std::sync::atomic::AtomicU32);

impl ArtifactBackend for Failing {
    fn put_meta(&self, m: &ArtifactMeta) -> Result<(), ArtifactError> {
        self.0.put_meta(m)
    }
    fn get_meta(&self, h: &str) -> Result<Option<ArtifactMeta>, ArtifactError> {
        self.0.get_meta(h)
    }
    fn list_meta(&self) -> Result<Vec<ArtifactMeta>, ArtifactError> {
        self.0.list_meta()
    }
    fn put_chunk(&self, h: &str, s: StreamName, i: u32, b: &[u8]) -> Result<(), ArtifactError> {
        if self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            return Err(ArtifactError::Incomplete("disk full".into()));
        }
        self.0.put_chunk(h, s, i, b)
    }
    fn get_chunk(&self, h: &str, s: StreamName, i: u32) -> Result<Option<Vec<u8>>, ArtifactError> {
        self.0.get_chunk(h, s, i)
    }
    fn remove(&self, h: &str) -> Result<(), ArtifactError> {
        self.0.remove(h)
    }
    fn chunk_handles(&self) -> Result<std::collections::BTreeSet<String>, ArtifactError> {
        self.0.chunk_handles()
    }
    fn flush(&self) -> Result<(), ArtifactError> {
        self.0.flush()
    }
}

#[tokio::test]
async fn a_store_failure_still_drains_and_leaves_the_artifact_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Failing(SledBackend::open(&Store::open(dir.path()).unwrap()).unwrap(), 0.into());
    let artifacts = Artifacts::new(Arc::new(backend));
    let cap = Capture::start(Some(&artifacts), "r", &OutputConfig::default(), None, true);
    let handle = cap.handle().unwrap().to_string();
    let data = vec![b'y'; 5 << 20];
    let out = capture(&data[..], cap.sink(StreamName::Stdout)).await;
    assert_eq!(out.meta.total_bytes, 5 << 20);
    assert!(out.error.as_deref().unwrap().contains("storing stdout"));
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let captured = cap.finish(JobInfo::default(), out, err);
    assert!(captured.artifact.is_none());
    assert!(captured.notes[0].starts_with("output was not stored"), "{:?}", captured.notes);
    assert!(matches!(artifacts.get(&handle), Err(ArtifactError::Incomplete(_))));
}

/// Small output is stored by the capture thread itself at the end, larger
/// output by a store thread started once `STORE_THREAD_AFTER` bytes came:
/// both read back byte for byte, on either side of the switch, from reads
/// of any size.
#[tokio::test]
async fn output_around_the_store_thread_threshold_reads_back_exactly() {
    use crate::output::worker::STORE_THREAD_AFTER as T;
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig::default();
    for (len, step) in [(1usize, 1usize), (100_000, 997), (T - 1, 4096), (T, 1 << 20), (T + 1, 333), (3 << 20, 65_536)]
    {
        let data: Vec<u8> = (0..len).map(|i| if i % 61 == 60 { b'\n' } else { b'a' + (i % 26) as u8 }).collect();
        let cap = Capture::start(Some(&artifacts), "r", &cfg, None, true);
        let out = capture(Trickle { data: data.clone(), at: 0, step }, cap.sink(StreamName::Stdout)).await;
        assert!(out.error.is_none(), "{len}: {:?}", out.error);
        let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
        let captured = cap.finish(JobInfo::default(), out, err);
        let meta = artifacts.get(captured.handle().unwrap()).unwrap();
        let mut back = Vec::new();
        artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
        assert!(back == data, "{len} bytes in reads of {step}: {} came back", back.len());
        assert_eq!(meta.stdout.sha256, sha(&data));
        // Chunks end at newlines, so a large output takes one or two more.
        let chunks = meta.stdout.chunks.len();
        assert!(chunks >= len.div_ceil(CHUNK_BYTES) && chunks <= len.div_ceil(CHUNK_BYTES) + 2, "{len}: {chunks}");
        assert!(meta.stderr.chunks.is_empty());
    }
}

/// A small output's store failure (written at the end, by the capture
/// thread) is reported like a large one's.
#[tokio::test]
async fn a_small_outputs_store_failure_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    // The first chunk write succeeds: stderr's goes first here.
    let backend = Failing(SledBackend::open(&Store::open(dir.path()).unwrap()).unwrap(), 0.into());
    let artifacts = Artifacts::new(Arc::new(backend));
    let cap = Capture::start(Some(&artifacts), "r", &OutputConfig::default(), None, true);
    let handle = cap.handle().unwrap().to_string();
    let err = capture(&b"warning\n"[..], cap.sink(StreamName::Stderr)).await;
    assert!(err.error.is_none());
    let out = capture(&b"hello\n"[..], cap.sink(StreamName::Stdout)).await;
    let error = out.error.as_deref().unwrap_or_default();
    assert!(error.starts_with("storing stdout: ") && error.contains("disk full"), "{error}");
    let captured = cap.finish(JobInfo::default(), out, err);
    assert!(captured.artifact.is_none());
    assert!(matches!(artifacts.get(&handle), Err(ArtifactError::Incomplete(_))));
}

/// Past its stored cap a stream keeps its head (a quarter of the cap) and
/// its tail (the rest), with a marker line between them that says what
/// was dropped; the tail's lines keep their numbers, and a query finds
/// what was at the very end.
#[tokio::test]
async fn past_the_cap_the_head_and_the_tail_are_kept_with_a_marker_between() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig { stdout_stored_bytes: 4 << 20, ..OutputConfig::default() };
    let cap = Capture::start(Some(&artifacts), "r", &cfg, None, true);
    let lines = 1_000_000u64;
    let mut data: Vec<u8> = (1..=lines).flat_map(|i| format!("filler line {i}\n").into_bytes()).collect();
    data.extend_from_slice(b"FATAL: the end\n");
    let out = capture(Trickle { data: data.clone(), at: 0, step: 100_000 }, cap.sink(StreamName::Stdout)).await;
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let captured = cap.finish(JobInfo::default(), out, err);
    let meta = captured.artifact.unwrap();
    let m = &meta.stdout;
    assert!(m.truncated);
    assert_eq!((m.total_bytes, m.total_lines), (data.len() as u64, lines + 1));
    let d = m.dropped.clone().expect("a dropped middle");
    assert!(m.stored_bytes <= (4 << 20) + 200, "{}", m.stored_bytes);
    // What is stored: the head, the marker, the tail from a whole line on.
    let mut back = Vec::new();
    artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
    assert_eq!(m.sha256, sha(&back));
    let head = &data[..1 << 20];
    assert!(back.starts_with(head));
    let marker_end = back[head.len()..].iter().position(|b| *b == b'\n').unwrap();
    let marker_line = String::from_utf8_lossy(&back[head.len()..head.len() + marker_end]).into_owned();
    assert!(
        marker_line.starts_with(&format!("[confine: {} bytes ({} lines) dropped here", d.bytes, d.lines)),
        "{marker_line}"
    );
    assert!(back.ends_with(b"FATAL: the end\n"));
    let kept_tail = back.len() - head.len() - marker_end - 1;
    assert_eq!(d.bytes as usize + head.len() + kept_tail, data.len());
    assert_eq!(d.resume_line, d.after_line + d.lines + 1);
    // The tail's first line is numbered as in the whole output.
    let tail_first = &back[head.len() + marker_end + 1..];
    let tail_first =
        String::from_utf8_lossy(&tail_first[..tail_first.iter().position(|b| *b == b'\n').unwrap()]).into_owned();
    assert_eq!(tail_first, format!("filler line {}", d.resume_line));
    // A query finds the end, at its real line number, and says what was dropped.
    let req: crate::output::ArtifactQuery = serde_json::from_value(
        serde_json::json!({"artifactHandle": meta.handle, "queryTerms": ["FATAL"], "contextLines": 1}),
    )
    .unwrap();
    let r = crate::output::query::query_output(&artifacts, &req).unwrap();
    assert_eq!(r.matched_lines, 1);
    let ex = &r.excerpts[0];
    assert_eq!(ex.line_end, lines + 1, "{ex:?}");
    assert!(ex.content.contains("FATAL: the end") && ex.content.contains(&format!("filler line {lines}")), "{ex:?}");
    assert!(r.notes.iter().any(|n| n.contains("were dropped to fit its stored cap")), "{:?}", r.notes);
    // A range inside the dropped part returns nothing, not a line after it.
    let req: crate::output::ArtifactQuery = serde_json::from_value(
        serde_json::json!({"artifactHandle": meta.handle, "lineStart": d.after_line + 3, "lineEnd": d.after_line + 3}),
    )
    .unwrap();
    let r = crate::output::query::query_output(&artifacts, &req).unwrap();
    assert!(r.excerpts.iter().all(|e| e.line_start <= d.after_line + 3), "{:?}", r.excerpts);
    // A line range across the tail reads the lines by their real numbers.
    let req: crate::output::ArtifactQuery = serde_json::from_value(
        serde_json::json!({"artifactHandle": meta.handle, "lineStart": lines - 2, "lineEnd": lines + 1}),
    )
    .unwrap();
    let r = crate::output::query::query_output(&artifacts, &req).unwrap();
    let text = r.excerpts.iter().map(|e| e.content.clone()).collect::<Vec<_>>().join("\n");
    assert!(text.contains(&format!("filler line {}", lines - 2)) && text.contains("FATAL"), "{text}");
    assert_eq!(r.excerpts[0].line_start, lines - 2);
}

/// Output that passes a quarter of the cap but not the cap is stored whole,
/// with no marker.
#[tokio::test]
async fn output_between_the_head_and_the_cap_is_stored_whole() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig { stdout_stored_bytes: 4 << 20, ..OutputConfig::default() };
    let cap = Capture::start(Some(&artifacts), "r", &cfg, None, true);
    let data: Vec<u8> = (1..=150_000u64).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
    assert!(data.len() > 1 << 20 && data.len() < 4 << 20);
    let out = capture(&data[..], cap.sink(StreamName::Stdout)).await;
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let meta = cap.finish(JobInfo::default(), out, err).artifact.unwrap();
    assert!(!meta.stdout.truncated && meta.stdout.dropped.is_none());
    let mut back = Vec::new();
    artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(meta.stdout.sha256, sha(&data));
    assert_eq!(meta.stdout.last_line(), 150_000);
}

/// A head that ends inside a line, and a drop of one line break only:
/// the marker ends that cut line, and the next line keeps its number.
#[tokio::test]
async fn a_marker_after_a_cut_line_keeps_the_next_lines_number() {
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let cfg = OutputConfig { stdout_stored_bytes: 4 << 20, ..OutputConfig::default() };
    let cap = Capture::start(Some(&artifacts), "r", &cfg, None, true);
    let mut data = vec![b'A'; (1 << 20) + 1000];
    data.push(b'\n');
    data.extend(std::iter::repeat_n(b'x', (3 << 20) - 2));
    data.extend_from_slice(b"\nlast\n");
    let out = capture(&data[..], cap.sink(StreamName::Stdout)).await;
    let err = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let meta = cap.finish(JobInfo::default(), out, err).artifact.unwrap();
    let (m, d) = (&meta.stdout, meta.stdout.dropped.clone().unwrap());
    assert_eq!((d.after_line, d.lines, d.resume_line), (0, 1, 2), "{d:?}");
    assert_eq!((m.total_lines, m.last_line()), (3, 3));
    let req: crate::output::ArtifactQuery =
        serde_json::from_value(serde_json::json!({"artifactHandle": meta.handle, "lineStart": 1, "lineEnd": 3}))
            .unwrap();
    let r = crate::output::query::query_output(&artifacts, &req).unwrap();
    let lines: Vec<&str> = r.excerpts[0].content.lines().collect();
    assert!(lines[0].starts_with("AAAA") && lines[1].starts_with("xxxx") && lines[2] == "last", "{:?}", &lines[2]);
    let mut back = Vec::new();
    artifacts.copy_stream(&meta, StreamName::Stdout, &mut back).unwrap();
    let at = back.iter().position(|b| *b != b'A').unwrap();
    assert_eq!(at, 1 << 20);
    // The A line's last 1000 bytes, its line break and the x line's first
    // 4 bytes fell out of the ring; the x line has no break in the ring's
    // first MiB, so it is kept from there.
    assert_eq!(d.bytes, 1005);
    assert!(back[at..].starts_with(b"[confine: 1005 bytes (1 lines) dropped here"));
    assert_eq!((r.excerpts[0].line_start, r.excerpts[0].line_end), (1, 3));
}
