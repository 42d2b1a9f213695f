use super::*;
use crate::config::{LimitRequest, LimitsConfig, PolicyConfig};
use crate::policy::input::ExecRequest;
use crate::policy::PolicyChain;
use std::sync::Arc;

fn entry(id: &str) -> AuditEntry {
    let r = ExecRequest {
        repo_id: Some("web".into()),
        runtime: "python".into(),
        args: vec!["-c".into(), "print('secret-token')".into()],
        ..ExecRequest::default()
    };
    let input = r.to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()));
    let decision = PolicyChain::from_config(&PolicyConfig::default()).unwrap().decide(&input);
    AuditEntry::decided(id, &input, &decision)
}

fn open() -> (tempfile::TempDir, Store, AuditLog) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let log = AuditLog::open(&store).unwrap();
    (dir, store, log)
}

#[test]
fn records_chain_and_verify() {
    let (_d, _s, log) = open();
    assert!(log.verify().unwrap().ok());
    let a = log.append(entry("job-1")).unwrap();
    let b = log.append(entry("job-2")).unwrap();
    assert_eq!((a.seq, b.seq), (1, 2));
    assert_eq!(a.prev_hash, GENESIS);
    assert_eq!(b.prev_hash, a.record_hash);
    assert_eq!(a.record_hash, a.compute_hash());
    assert_eq!(a.entry.audit_hash.len(), 64);
    let report = log.verify().unwrap();
    assert_eq!(report, VerifyReport { records: 2, first_broken: None });
    assert_eq!(log.get("job-2").unwrap(), b);
    assert!(matches!(log.get("job-9"), Err(AuditError::NotFound(_))));
    let listed: Vec<u64> = log.list(10).unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(listed, [2, 1], "newest first");
}

#[test]
fn args_are_stored_as_a_digest_only() {
    let (_d, _s, log) = open();
    let r = log.append(entry("job-1")).unwrap();
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains("secret-token"), "{json}");
    assert_eq!(r.entry.executable, "python3");
    assert_eq!(r.entry.status, Status::Denied);
}

#[test]
fn an_edited_record_breaks_verify_at_that_record() {
    let (dir, store, log) = open();
    for i in 1..=3 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    // Tamper the way an attacker with the db would: rewrite record 2 in place.
    let tree = store.tree(RECORDS_TREE).unwrap();
    let key = 2u64.to_be_bytes();
    let mut v: serde_json::Value = serde_json::from_slice(&tree.get(key).unwrap().unwrap()).unwrap();
    v["exitCode"] = serde_json::json!(0);
    v["allowed"] = serde_json::json!(true);
    tree.insert(key, serde_json::to_vec(&v).unwrap()).unwrap();
    store.flush().unwrap();
    drop((log, tree, store));
    let store = Store::open(dir.path()).unwrap();
    let report = AuditLog::open(&store).unwrap().verify().unwrap();
    let broken = report.first_broken.unwrap();
    assert_eq!((broken.seq, broken.id.as_deref()), (2, Some("job-2")));
    assert!(broken.reason.contains("edited"), "{}", broken.reason);
    assert_eq!(report.records, 1);
}

#[test]
fn a_recomputed_hash_still_breaks_the_next_link() {
    let (_d, store, log) = open();
    for i in 1..=3 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    let tree = store.tree(RECORDS_TREE).unwrap();
    let mut r: AuditRecord = serde_json::from_slice(&tree.get(2u64.to_be_bytes()).unwrap().unwrap()).unwrap();
    r.entry.allowed = !r.entry.allowed;
    r.record_hash = r.compute_hash();
    tree.insert(2u64.to_be_bytes(), serde_json::to_vec(&r).unwrap()).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert_eq!(broken.seq, 3);
    assert!(broken.reason.contains("prevHash"), "{}", broken.reason);
}

#[test]
fn removed_records_are_found_in_the_middle_and_at_the_end() {
    let (_d, store, log) = open();
    for i in 1..=4 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    let tree = store.tree(RECORDS_TREE).unwrap();
    tree.remove(4u64.to_be_bytes()).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert!(broken.reason.contains("head"), "{}", broken.reason);
    tree.remove(2u64.to_be_bytes()).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert_eq!(broken.seq, 3);
    let garbage = b"not json";
    tree.insert(1u64.to_be_bytes(), &garbage[..]).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert!(broken.seq == 1 && broken.reason.starts_with("unreadable"), "{broken:?}");
}

#[test]
fn concurrent_appends_keep_one_chain() {
    let (_d, store, log) = open();
    let log = Arc::new(log);
    let second = Arc::new(AuditLog::open(&store).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let log: Arc<dyn AuditSink> = if t % 2 == 0 { log.clone() } else { second.clone() };
            std::thread::spawn(move || {
                for i in 0..10 {
                    log.append(entry(&format!("job-{t}-{i}"))).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(log.len(), 80);
    assert_eq!(log.verify().unwrap(), VerifyReport { records: 80, first_broken: None });
}

#[test]
fn export_writes_one_json_line_per_record() {
    let (_d, _s, log) = open();
    for i in 1..=3 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(log.export_jsonl(&mut out).unwrap(), 3);
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["id"], "job-1");
    for key in [
        "seq",
        "timestamp",
        "repoId",
        "runtime",
        "executable",
        "argsSha256",
        "cwd",
        "allowed",
        "denyReasons",
        "policyDigest",
        "auditHash",
        "prevHash",
        "recordHash",
        "durationMs",
        "exitCode",
        "signal",
        "status",
        "stdoutBytes",
        "stderrBytes",
    ] {
        assert!(lines[2].get(key).is_some(), "missing {key}");
    }
}

#[test]
fn a_finished_job_records_its_outcome() {
    let outcome: Outcome = serde_json::from_value(serde_json::json!({
        "jobId": "job-1", "status": "failure", "exitCode": 3, "signal": null, "durationMs": 12, "queuedMs": 4,
        "usage": {"cpuUserMs": 0, "cpuSysMs": 0, "peakMemoryBytes": 0, "pidsPeak": 0},
        "backend": "linux", "layers": {"userns": true, "mountns": true, "pidns": true, "netns": true, "ipcns": true,
        "utsns": true, "cgroupns": true, "landlock": {"abi": 0, "status": "off"}, "seccomp": null, "cgroup": null,
        "capsDropped": true, "noNewPrivs": true, "hostUid": 0},
        "limits": {"memoryBytes": null, "cpus": null, "pids": null, "timeoutMs": null, "cpuTimeMs": null, "tmpSizeBytes": 0}
    }))
    .unwrap();
    let e = entry("job-1").finished(&outcome, 10, 20);
    assert_eq!(
        (e.status, e.exit_code, e.duration_ms, e.queued_ms, e.stdout_bytes, e.stderr_bytes),
        (Status::Failure, Some(3), 12, 4, 10, 20)
    );
}

#[test]
fn timestamps_are_rfc3339_utc() {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
    assert_eq!(rfc3339_utc(t), "2023-11-14T22:13:20.123Z");
    assert_eq!(rfc3339_utc(std::time::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    assert_eq!(
        rfc3339_utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400)),
        "2000-02-29T00:00:00.000Z"
    );
}

/// p50 of one append (with its flush); run with `--ignored --nocapture`.
#[test]
#[ignore = "benchmark"]
fn bench_audit_append_p50() {
    let (_d, _s, log) = open();
    let mut times: Vec<std::time::Duration> = (0..300)
        .map(|i| {
            let e = entry(&format!("job-{i}"));
            let t = std::time::Instant::now();
            log.append(e).unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    println!("audit append+flush: p50 {:?}, p99 {:?}", times[150], times[297]);
}

/// An append is a transaction over three trees, then a durable flush:
/// each one syncs sled's data file.
#[test]
fn every_append_syncs_the_store() {
    let (_d, store, log) = open();
    log.append(entry("job-0")).unwrap();
    let syncs = store.file_syncs();
    for i in 1..=20 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    assert_eq!(store.file_syncs() - syncs, 20, "every append is durable");
    assert!(log.verify().unwrap().ok());
}

/// A log that seals blocks of 4 records, with `n` records appended.
fn sealing_log(n: u64) -> (tempfile::TempDir, Store, AuditLog, Vec<AuditRecord>) {
    let (dir, store, log) = open();
    let log = log.with_block_len(4);
    let appended = (1..=n).map(|i| log.append(entry(&format!("job-{i}"))).unwrap()).collect();
    (dir, store, log, appended)
}

fn export(log: &AuditLog) -> String {
    let mut out = Vec::new();
    log.export_jsonl(&mut out).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn sealed_records_stay_one_chain_for_every_reader() {
    let (_d, store, log, appended) = sealing_log(20);
    let before = export(&log);
    assert!(log.seal_due().unwrap());
    // 20 live: blocks of 4 are sealed while 8 or more are live.
    assert_eq!(log.seal().unwrap(), 16);
    assert!(!log.seal_due().unwrap());
    assert_eq!(log.seal().unwrap(), 0, "nothing more is due");
    assert_eq!(store.tree(BLOCKS_TREE).unwrap().len(), 4);
    assert_eq!(store.tree(RECORDS_TREE).unwrap().len(), 4, "the newest 4 stay live");
    assert_eq!(store.tree(IDS_TREE).unwrap().len(), 4, "sealed ids leave the index");

    assert_eq!(log.verify().unwrap(), VerifyReport { records: 20, first_broken: None });
    assert_eq!(log.len(), 20);
    assert_eq!(export(&log), before, "the export is the same, byte for byte");
    let listed: Vec<u64> = log.list(7).unwrap().iter().map(|r| r.seq).collect();
    assert_eq!(listed, [20, 19, 18, 17, 16, 15, 14], "newest first, across the seal");
    assert_eq!(log.list(100).unwrap().len(), 20);
    assert_eq!(log.get("job-3").unwrap(), appended[2], "a sealed record is found by id");
    assert_eq!(log.get("job-19").unwrap(), appended[18]);
    assert!(matches!(log.get("job-21"), Err(AuditError::NotFound(_))));

    // The chain goes on from the live head.
    let next = log.append(entry("job-21")).unwrap();
    assert_eq!(next.prev_hash, appended[19].record_hash);
    assert_eq!(log.verify().unwrap().records, 21);
}

#[test]
fn sealing_survives_a_reopen_and_goes_on() {
    let (dir, store, log, _) = sealing_log(9);
    assert_eq!(log.seal().unwrap(), 4);
    drop((log, store));
    let store = Store::open(dir.path()).unwrap();
    let log = AuditLog::open(&store).unwrap().with_block_len(4);
    for i in 10..=16 {
        log.append(entry(&format!("job-{i}"))).unwrap();
    }
    assert_eq!(log.seal().unwrap(), 8);
    assert_eq!(log.verify().unwrap(), VerifyReport { records: 16, first_broken: None });
    let seqs: Vec<u64> = export(&log).lines().map(|l| serde_json::from_str::<AuditRecord>(l).unwrap().seq).collect();
    assert_eq!(seqs, (1..=16).collect::<Vec<_>>());
}

/// Rewrite the block stored under `first` with `edit` applied to its lines.
fn edit_block(store: &Store, first: u64, edit: impl FnOnce(&mut Vec<String>)) {
    use std::io::{Read, Write};
    let blocks = store.tree(BLOCKS_TREE).unwrap();
    let body = blocks.get(first.to_be_bytes()).unwrap().unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    edit(&mut lines);
    let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    z.write_all((lines.join("\n") + "\n").as_bytes()).unwrap();
    blocks.insert(first.to_be_bytes(), z.finish().unwrap()).unwrap();
}

#[test]
fn an_edit_inside_a_sealed_block_breaks_verify_at_that_record() {
    let (_d, store, log, _) = sealing_log(12);
    assert_eq!(log.seal().unwrap(), 8);
    edit_block(&store, 5, |lines| {
        let mut v: serde_json::Value = serde_json::from_str(&lines[1]).unwrap();
        v["allowed"] = serde_json::json!(!v["allowed"].as_bool().unwrap());
        lines[1] = v.to_string();
    });
    let report = log.verify().unwrap();
    let broken = report.first_broken.unwrap();
    assert_eq!((broken.seq, broken.id.as_deref()), (6, Some("job-6")));
    assert!(broken.reason.contains("edited"), "{}", broken.reason);
    assert_eq!(report.records, 5);
}

#[test]
fn a_removed_or_unreadable_block_breaks_verify() {
    let (_d, store, log, _) = sealing_log(16);
    assert_eq!(log.seal().unwrap(), 12);
    // A record dropped from inside a block: the next one is out of place.
    edit_block(&store, 5, |lines| {
        lines.remove(2);
    });
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert_eq!(broken.seq, 7);
    assert!(broken.reason.contains("expected record 7"), "{}", broken.reason);
    // A block removed whole.
    let blocks = store.tree(BLOCKS_TREE).unwrap();
    blocks.remove(5u64.to_be_bytes()).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert_eq!(broken.seq, 9, "{broken:?}");
    // A block that does not decompress.
    blocks.insert(9u64.to_be_bytes(), &b"not gzip"[..]).unwrap();
    blocks.insert(5u64.to_be_bytes(), &b"not gzip"[..]).unwrap();
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert!(broken.seq == 5 && broken.reason.starts_with("unreadable"), "{broken:?}");
    assert!(matches!(log.export_jsonl(&mut Vec::new()), Err(AuditError::Corrupt { seq: 5, .. })));
}

/// Sealing is what keeps an old store small and its start cheap: sled
/// reads its page table at every start (each `confine exec`), and the
/// audit trail is the part of the store that is kept forever. 6,000
/// records with sealing (as the supervisor does it after each job) leave
/// under a third of the keys (at most two blocks stay live), and a
/// database at most three quarters the size.
#[test]
fn sealing_keeps_the_pages_of_a_long_trail_few() {
    let pages_after = |seal: bool| {
        let (_d, store, log) = open();
        for i in 1..=6000 {
            log.append(entry(&format!("job-{i}"))).unwrap();
            if seal && log.seal_due().unwrap() {
                log.seal().unwrap();
            }
        }
        assert_eq!(log.verify().unwrap(), VerifyReport { records: 6000, first_broken: None });
        let keys: usize = [RECORDS_TREE, IDS_TREE, BLOCKS_TREE].iter().map(|t| store.tree(t).unwrap().len()).sum();
        (keys, store.size_on_disk())
    };
    let (sealed, unsealed) = (pages_after(true), pages_after(false));
    println!("6,000 audit records: (keys, bytes) {sealed:?} sealed, {unsealed:?} unsealed");
    assert!(sealed.0 * 3 < unsealed.0, "{sealed:?} sealed, {unsealed:?} unsealed");
    assert!(sealed.1 * 4 < unsealed.1 * 3, "{sealed:?} sealed, {unsealed:?} unsealed");
}

#[test]
fn a_gap_in_the_live_records_stops_sealing_and_verify_still_finds_it() {
    let (_d, store, log, _) = sealing_log(16);
    store.tree(RECORDS_TREE).unwrap().remove(6u64.to_be_bytes()).unwrap();
    // The first block (1–4) is whole and sealed; the next one has a gap.
    assert_eq!(log.seal().unwrap(), 4);
    assert_eq!(store.tree(BLOCKS_TREE).unwrap().len(), 1);
    let broken = log.verify().unwrap().first_broken.unwrap();
    assert_eq!(broken.seq, 7, "{broken:?}");
    assert!(broken.reason.contains("expected record 6"), "{}", broken.reason);
}

/// No record, no job: a job's start is pending until its record is
/// appended (which takes it out); what is still pending when the store is
/// opened again becomes a record of its own, marked unfinished, and the
/// chain verifies.
#[test]
fn a_started_job_is_never_missing_from_the_trail() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path()).unwrap();
        let log = AuditLog::open(&store).unwrap();
        log.begin(&entry("done")).unwrap();
        log.begin(&entry("killed")).unwrap();
        assert_eq!(log.pending_len(), 2);
        log.append(entry("done")).unwrap();
        assert_eq!(log.pending_len(), 1);
        assert_eq!(log.len(), 1);
    }
    let store = Store::open(dir.path()).unwrap();
    let log = AuditLog::open(&store).unwrap();
    assert_eq!(log.pending_len(), 0);
    assert_eq!(log.len(), 2);
    let killed = log.get("killed").unwrap();
    assert_eq!(killed.entry.status, crate::job::Status::Failure);
    let note = killed.entry.note.as_deref().unwrap();
    assert!(note.starts_with(UNFINISHED_NOTE) && note.contains("let run at 20"), "{note}");
    assert_eq!(killed.entry.runtime, "python");
    assert!(log.get("done").unwrap().entry.note.is_none());
    assert!(log.verify().unwrap().ok());
    drop((log, store));
    // Opened again: nothing more is added.
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(AuditLog::open(&store).unwrap().len(), 2);
}
