#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The store's durable writes: an audit append with its flush (what every
//! request waits for before its answer), on a fresh store and on one that
//! already holds 5,000 records.
//!
//! `cargo bench --bench store` (release build). Target (issue 30): p50
//! at most 1 ms. `STORE_BENCH_APPENDS=N` sets the appends per round (300).

use confine::store::audit::{AuditEntry, AuditLog, AuditSink};
use confine::store::Store;
use std::time::{Duration, Instant};

fn entry(id: &str) -> AuditEntry {
    AuditEntry {
        repo_id: Some("bench".into()),
        runtime: "python".into(),
        operation: "execute".into(),
        executable: "/usr/bin/python3".into(),
        args_sha256: "0".repeat(64),
        cwd: "/work".into(),
        policy_digest: "1".repeat(64),
        audit_hash: "2".repeat(64),
        status: confine::job::Status::Success,
        duration_ms: 12,
        exit_code: Some(0),
        stdout_bytes: 3,
        ..AuditEntry::bare(id)
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let appends: usize = std::env::var("STORE_BENCH_APPENDS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    // Under the user's data directory's file system, as a real store is.
    let base = std::env::var_os("HOME").map(std::path::PathBuf::from).unwrap_or_else(std::env::temp_dir);
    for (name, aged) in [("fresh store", 0usize), ("5,000 records", 5000)] {
        let dir = tempfile::tempdir_in(&base).unwrap();
        let store = Store::open_flushed_by_caller(dir.path()).unwrap();
        let log = AuditLog::open(&store).unwrap();
        for i in 0..aged {
            log.append(entry(&format!("old-{i}"))).unwrap();
            if log.seal_due().unwrap() {
                log.seal().unwrap();
            }
        }
        let mut times: Vec<Duration> = (0..appends)
            .map(|i| {
                let e = entry(&format!("job-{i}"));
                let t = Instant::now();
                log.append(e).unwrap();
                t.elapsed()
            })
            .collect();
        times.sort();
        println!(
            "audit append + durable flush, {name:<14}: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms ({appends} appends)",
            percentile(&times, 0.5).as_secs_f64() * 1e3,
            percentile(&times, 0.9).as_secs_f64() * 1e3,
            percentile(&times, 0.99).as_secs_f64() * 1e3,
        );
    }
}
