#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Output capture and query: drain rate of an output flood through the
//! whole capture path (redaction, SHA-256, gzip, sled), the process's peak
//! RSS while draining, and query time over 10 MB and 100 MB artifacts.
//!
//! `cargo bench --bench output` (release build). Targets (issue 6): drain
//! at 500 MB/s or more with RSS under 64 MiB; a 3-term query in 50 ms over
//! 10 MB and 300 ms over 100 MB. `OUTPUT_BENCH_GIB=N` sets the flood size (1);
//! `OUTPUT_BENCH_PARTS=memory,drain,random,query` picks the parts (peak RSS
//! is only meaningful for parts run in a fresh process); with
//! `OUTPUT_BENCH_VERBOSE=1` the RSS before each row is printed.
//!
//! glibc note: freed buffers above the (dynamic) mmap threshold end up
//! retained in per-thread arenas, so RSS creeps up over repeated floods.
//! `confine serve` and `confine exec` fix the threshold at start
//! ([`confine::supervisor::tune_allocator`]); this bench does the same, so
//! its RSS is what those commands do. (An operator's own
//! `MALLOC_MMAP_THRESHOLD_` wins over it, here as there.)

use confine::output::query::query_output;
use confine::output::{capture, capture_pipe, ArtifactQuery, Capture, OutputConfig};
use confine::store::artifacts::{ArtifactBackend, ArtifactError, ArtifactMeta, Artifacts, JobInfo, StreamName};
use confine::store::Store;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Reset the peak RSS counter (Linux: `5` to clear_refs).
fn reset_hwm() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    if std::env::var_os("OUTPUT_BENCH_VERBOSE").is_some() {
        println!("    (RSS before the next row: {:.1} MiB)", status_kib("VmRSS:") as f64 / 1024.0);
    }
}

fn vm_hwm_kib() -> u64 {
    status_kib("VmHWM:")
}

fn status_kib(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Make the child's stdout pipe `bytes` big (Linux; best effort).
#[cfg(target_os = "linux")]
fn grow_pipe(out: &tokio::process::ChildStdout, bytes: i32) {
    use std::os::fd::AsRawFd;
    // SAFETY: F_SETPIPE_SZ on a pipe fd we own; the kernel validates the size.
    unsafe { libc::fcntl(out.as_raw_fd(), libc::F_SETPIPE_SZ, bytes) };
}

/// Spawn `script`, capture its stdout and stderr, and return bytes
/// drained and elapsed time. `async_reads`: read the pipes on the runtime
/// (`capture`, any async reader) instead of as `confine exec` does.
async fn drain(
    artifacts: Option<&Artifacts>,
    cfg: &OutputConfig,
    script: &str,
    pipe: i32,
    async_reads: bool,
) -> Drained {
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let (out, err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    #[cfg(target_os = "linux")]
    if pipe > 0 {
        grow_pipe(&out, pipe);
    }
    let t0 = Instant::now();
    let cap = Capture::start(artifacts, "bench", cfg, cfg.redactor(|_| None), artifacts.is_some());
    let (o, e) = if async_reads {
        tokio::join!(capture(out, cap.sink(StreamName::Stdout)), capture(err, cap.sink(StreamName::Stderr)))
    } else {
        // As `confine exec` reads a job's pipes: blocking reads on the
        // stage-1 thread (`capture_pipe`).
        let (out, err) = (out.into_owned_fd().unwrap(), err.into_owned_fd().unwrap());
        tokio::join!(
            capture_pipe(out, |_, _| {}, cap.sink(StreamName::Stdout)),
            capture_pipe(err, |_, _| {}, cap.sink(StreamName::Stderr))
        )
    };
    let drained = t0.elapsed();
    let _ = child.kill().await;
    let bytes = o.meta.total_bytes;
    let c = cap.finish(JobInfo::default(), o, e);
    Drained { bytes, drained, finished: t0.elapsed(), handle: c.artifact.map(|m| m.handle) }
}

/// What [`drain`] measured.
struct Drained {
    bytes: u64,
    /// Until both pipes reached their end.
    drained: Duration,
    /// Until the artifact was durable too (its finish and flush).
    finished: Duration,
    handle: Option<String>,
}

/// A 1 GiB file of base64 of random bytes (made once, in `/tmp`): read by
/// `cat`, it comes faster than `/dev/urandom` and `base64` could make it,
/// so the row measures capture, not the producer.
fn random_base64_file() -> std::path::PathBuf {
    let path = std::path::PathBuf::from("/tmp/confine-bench-base64-1g");
    if std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0) != 1 << 30 {
        let tmp = path.with_extension("tmp");
        let ok = std::process::Command::new("sh")
            .args([
                "-c",
                &format!("head -c 900000000 /dev/urandom | base64 | head -c {} > {}", 1u64 << 30, tmp.display()),
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// Plain pipe reading, nothing else (blocking 128 KiB reads, as `cat`
/// does): the ceiling for the numbers above.
fn baseline(script: &str) -> (u64, Duration) {
    use std::io::Read;
    let mut child = std::process::Command::new("sh").args(["-c", script]).stdout(Stdio::piped()).spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 128 << 10];
    let t0 = Instant::now();
    let mut n = 0u64;
    loop {
        let k = out.read(&mut buf).unwrap();
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    let d = t0.elapsed();
    let _ = child.wait();
    (n, d)
}

/// Keeps metadata, drops chunks: the capture path without sled, to tell
/// the two apart in time and memory.
#[derive(Default)]
#[allow(dead_code)] // kept for comparing against a store that keeps nothing
struct NullBackend(std::sync::Mutex<std::collections::HashMap<String, ArtifactMeta>>);

impl ArtifactBackend for NullBackend {
    fn put_meta(&self, m: &ArtifactMeta) -> Result<(), ArtifactError> {
        self.0.lock().unwrap().insert(m.handle.clone(), m.clone());
        Ok(())
    }
    fn get_meta(&self, h: &str) -> Result<Option<ArtifactMeta>, ArtifactError> {
        Ok(self.0.lock().unwrap().get(h).cloned())
    }
    fn list_meta(&self) -> Result<Vec<ArtifactMeta>, ArtifactError> {
        Ok(self.0.lock().unwrap().values().cloned().collect())
    }
    fn put_chunk(&self, _: &str, _: StreamName, _: u32, _: &[u8]) -> Result<(), ArtifactError> {
        Ok(())
    }
    fn get_chunk(&self, _: &str, _: StreamName, _: u32) -> Result<Option<Vec<u8>>, ArtifactError> {
        Ok(None)
    }
    fn remove(&self, h: &str) -> Result<(), ArtifactError> {
        self.0.lock().unwrap().remove(h);
        Ok(())
    }
    fn chunk_handles(&self) -> Result<std::collections::BTreeSet<String>, ArtifactError> {
        Ok(Default::default())
    }
    fn flush(&self) -> Result<(), ArtifactError> {
        Ok(())
    }
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1e6 / d.as_secs_f64()
}

/// Build-log-like text: ~67 bytes a line, a few rare words to find.
fn log_text(bytes: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes + 100);
    let mut i = 0u64;
    while v.len() < bytes {
        let line = match i % 5000 {
            17 => format!("error[E0308]: mismatched types in module_{} at src/m{}.rs:{}\n", i % 97, i % 13, i % 1000),
            2500 => format!("test suite::case_{i} ... FAILED (timeout after {} ms)\n", i % 9000),
            _ => format!("test suite::case_{i} ... ok (elapsed {} ms) checked {} items\n", i * 7 % 1000, i % 4096),
        };
        v.extend_from_slice(line.as_bytes());
        i += 1;
    }
    v
}

async fn stored_log(a: &Artifacts, bytes: usize) -> String {
    let text = log_text(bytes);
    let cfg = OutputConfig { stdout_stored_bytes: 1 << 30, ..OutputConfig::default() };
    let cap = Capture::start(Some(a), "bench", &cfg, None, true);
    let o = capture(&text[..], cap.sink(StreamName::Stdout)).await;
    let e = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
    let c = cap.finish(JobInfo::default(), o, e);
    c.artifact.unwrap().handle
}

fn time_query(a: &Artifacts, handle: &str) -> (Duration, Duration, u64) {
    let req = ArtifactQuery {
        artifact_handle: handle.into(),
        query_terms: vec!["error[E0308]".into(), "FAILED".into(), "timeout".into()],
        ..ArtifactQuery::default()
    };
    let mut times = Vec::new();
    let mut matched = 0;
    for _ in 0..7 {
        let t0 = Instant::now();
        let r = query_output(a, &req).unwrap();
        times.push(t0.elapsed());
        matched = r.matched_lines;
    }
    times.sort();
    (times[times.len() / 2], times[times.len() - 1], matched)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let tuned = confine::supervisor::tune_allocator();
    println!("allocator: {}", if tuned { "mmap threshold 128 KiB (as confine serve/exec)" } else { "unchanged" });
    let gib: u64 = std::env::var("OUTPUT_BENCH_GIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let parts = std::env::var("OUTPUT_BENCH_PARTS").unwrap_or_else(|_| "memory,drain,random,query".into());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let g = gib << 30;
    let yes = format!("yes | head -c {g}");
    // `cat /dev/zero`, 1 GiB of it: dd writes 128 KiB blocks as cat does
    // (head -c would write 8 KiB ones).
    let zero = format!("dd if=/dev/zero bs=128K count={} status=none", g >> 17);
    let full = OutputConfig { stdout_stored_bytes: 4 << 30, ..OutputConfig::default() };
    let default = OutputConfig::default();

    if parts.contains("memory") {
        println!("capture alone, from memory (the worker's ceiling)");
        rt.block_on(async {
            for (name, byte) in [("y\\n", b'y'), ("zeros", 0u8)] {
                let data: Vec<u8> = if byte == 0 { vec![0; 1 << 30] } else { b"y\n".repeat(1 << 29) };
                let cap = Capture::start(Some(&artifacts), "bench", &full, full.redactor(|_| None), true);
                let t0 = Instant::now();
                let o = capture(&data[..], cap.sink(StreamName::Stdout)).await;
                let d = t0.elapsed();
                let e = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
                cap.finish(JobInfo::default(), o, e);
                println!("  {name:<17} stored                     {:>7.0} MB/s", mbps(1 << 30, d));
            }
        });
    }
    if parts.contains("drain") {
        println!(
            "drain, {gib} GiB per run (MB/s; 'stored' = every byte redacted, hashed, gzipped and written to sled)"
        );
        rt.block_on(async {
            for (name, script) in [("yes | head -c", yes.as_str()), ("cat /dev/zero", zero.as_str())] {
                let (n, d) = baseline(script);
                println!("  {name:<17} pipe read only              {:>7.0} MB/s", mbps(n, d));
                for (label, pipe) in [("64 KiB pipe", 0), ("1 MiB pipe ", 1 << 20)] {
                    reset_hwm();
                    let r = drain(Some(&artifacts), &full, script, pipe, false).await;
                    let (n, d) = (r.bytes, r.drained);
                    assert!(r.handle.is_some());
                    println!(
                        "  {name:<17} stored, {label}       {:>7.0} MB/s  ({:.2} s, peak RSS {:.1} MiB)",
                        mbps(n, d),
                        d.as_secs_f64(),
                        vm_hwm_kib() as f64 / 1024.0
                    );
                }
                let Drained { bytes: n, drained: d, .. } = drain(Some(&artifacts), &full, script, 0, true).await;
                println!("  {name:<17} stored, 64 KiB, async reads {:>7.0} MB/s", mbps(n, d));
                reset_hwm();
                let null = Artifacts::new(std::sync::Arc::new(NullBackend::default()));
                let Drained { bytes: n, drained: d, .. } = drain(Some(&null), &full, script, 1 << 20, false).await;
                println!(
                    "  {name:<17} no sled, 1 MiB pipe         {:>7.0} MB/s  (peak RSS {:.1} MiB)",
                    mbps(n, d),
                    vm_hwm_kib() as f64 / 1024.0
                );
                reset_hwm();
                let Drained { bytes: n, drained: d, .. } = drain(Some(&artifacts), &default, script, 0, false).await;
                println!(
                    "  {name:<17} default caps (64 MiB kept)  {:>7.0} MB/s  (peak RSS {:.1} MiB)",
                    mbps(n, d),
                    vm_hwm_kib() as f64 / 1024.0
                );
                let Drained { bytes: n, drained: d, .. } = drain(None, &default, script, 0, false).await;
                println!("  {name:<17} persistOutput: false        {:>7.0} MB/s", mbps(n, d));
            }
        });
    }
    if parts.contains("random") {
        println!("incompressible output (base64 of /dev/urandom, 256 MB per run, default caps: 64 MiB stored raw)");
        rt.block_on(async {
            for run in 1..=3 {
                reset_hwm();
                let script = "head -c 192000000 /dev/urandom | base64";
                let Drained { bytes: n, drained: d, .. } = drain(Some(&artifacts), &default, script, 0, false).await;
                println!(
                    "  run {run}: {:>7.0} MB/s  ({:.2} s, peak RSS {:.1} MiB)",
                    mbps(n, d),
                    d.as_secs_f64(),
                    vm_hwm_kib() as f64 / 1024.0
                );
            }
        });
    }
    if parts.contains("stored1g") {
        let file = random_base64_file();
        let script = format!("cat {}", file.display());
        let (n, d) = baseline(&script);
        println!("incompressible output, 1 GiB, all of it stored (cap 4 GiB); pipe read only {:.0} MB/s", mbps(n, d));
        rt.block_on(async {
            for run in 1..=3 {
                reset_hwm();
                // Stored means durable: the finish (a blob's sync, the
                // metadata and the flush) is in the time.
                let r = drain(Some(&artifacts), &full, &script, 0, false).await;
                println!(
                    "  run {run}: {:>7.0} MB/s stored durably ({:.2} s; drained in {:.2} s), peak RSS {:.1} MiB",
                    mbps(r.bytes, r.finished),
                    r.finished.as_secs_f64(),
                    r.drained.as_secs_f64(),
                    vm_hwm_kib() as f64 / 1024.0
                );
                artifacts.remove(&r.handle.expect("the artifact was stored")).unwrap();
            }
        });
    }
    if !parts.contains("query") {
        return;
    }
    println!("query, 3 terms (median / max of 7)");
    rt.block_on(async {
        for mb in [10usize, 100] {
            let handle = stored_log(&artifacts, mb * 1_000_000).await;
            let meta = artifacts.get(&handle).unwrap();
            let (p50, max, matched) = time_query(&artifacts, &handle);
            println!(
                "  {mb:>3} MB, {:>8} lines, {:>5} chunks ({:.1} MB stored): {:>6.1} ms / {:>6.1} ms, {matched} matching lines",
                meta.stdout.stored_lines,
                meta.stdout.chunks.len(),
                meta.stdout.compressed_bytes as f64 / 1e6,
                p50.as_secs_f64() * 1e3,
                max.as_secs_f64() * 1e3
            );
        }
    });
}
