#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The sled store across many short lives, as users live them: `confine
//! exec` run again and again, each a process that opens the store, writes
//! an artifact and an audit record (a transaction), flushes and exits
//! without closing. After enough of them for sled to free and reuse log
//! segments, every record must still verify and every artifact read back.
//!
//! Why: confine's vendored sled changes what sled does at start
//! (`vendor/sled/CONFINE-PATCH.md`). One tried change, a snapshot written
//! only every few MiB of log, passed single-session tests and broke the
//! store here after about 120 runs: sled reuses log segments on the
//! strength of the snapshot it wrote at start.

mod common;

use confine::store::Store;
use std::process::{Command, Output};

/// `confine exec` runs in the test: about twice what broke the store.
const EXECS: usize = 240;

/// A run that hangs (a deadlock in the store) fails the test instead.
const RUN_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

fn confine(config: &std::path::Path, args: &[&str]) -> Output {
    common::output_within(Command::new(common::bin()).arg("--config").arg(config).args(args), RUN_LIMIT)
}

#[test]
fn hundreds_of_execs_leave_a_store_that_verifies() {
    if !common::is_root() {
        return common::skip("confine exec needs the sandbox (run as root)");
    }
    if !common::sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("repo")).unwrap();
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, common::exec_config(&dir.path().join("store"), "t", &dir.path().join("repo"))).unwrap();
    let mut handles = Vec::new();
    for i in 0..EXECS {
        let code = format!("echo run {i}; echo err {i} >&2");
        let out = confine(&config, &["exec", "--repo-id", "t", "--runtime", "shell", "--json", "--code", &code]);
        assert!(out.status.success(), "exec {i}: {}", common::stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        handles.push(v["artifactHandle"].as_str().unwrap().to_string());
    }
    let verify = confine(&config, &["audit", "verify"]);
    assert!(verify.status.success(), "{}{}", common::stdout(&verify), common::stderr(&verify));
    assert!(
        common::stdout(&verify).contains(&format!("ok: {EXECS} records, hash chain intact")),
        "{}",
        common::stdout(&verify)
    );
    // Every artifact, old and new, reads back as written.
    for (i, h) in handles.iter().enumerate().step_by(7).chain(handles.iter().enumerate().rev().take(3)) {
        let out = confine(&config, &["artifacts", "show", h]);
        assert!(out.status.success(), "artifact {i}: {}", common::stderr(&out));
        assert_eq!(common::stdout(&out), format!("run {i}\n"), "artifact {i}");
    }
}

fn record(i: u64) -> Vec<u8> {
    vec![(i % 251) as u8; 600]
}

/// Bytes this thread has passed to write calls (`wchar`) and got from
/// read calls (`rchar`) so far.
fn thread_io() -> (u64, u64) {
    let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    let field = |name: &str| -> u64 { io.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().parse().unwrap() };
    (field("wchar: "), field("rchar: "))
}

/// Open the store at `dir`, and the bytes this thread wrote and read
/// doing it.
fn open_counting(dir: &std::path::Path) -> (Store, u64, u64) {
    // sled releases its lock a moment after the last handle is dropped.
    for _ in 0..200 {
        let (w, r) = thread_io();
        if let Ok(s) = Store::open(dir) {
            let (w2, r2) = thread_io();
            return (s, w2 - w, r2 - r);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the store at {} did not open", dir.display());
}

fn open_counting_writes(dir: &std::path::Path) -> (Store, u64) {
    let (s, wrote, _) = open_counting(dir);
    (s, wrote)
}

/// A store at `dir` in its second life (records 0..10 written in the
/// first), once sled's flusher thread, which has its first round right
/// after the start, is asleep for its 500 ms: what the sync counts see is
/// then the test's own.
fn second_life_after_the_flushers_first_round(dir: &std::path::Path) -> Store {
    session(open_counting_writes(dir).0, 0, 10);
    let (s, _) = open_counting_writes(dir);
    std::thread::sleep(std::time::Duration::from_millis(200));
    s
}

/// Write records `from..to` to `audit`, flush, close.
fn session(s: Store, from: u64, to: u64) {
    let t = s.tree("audit").unwrap();
    for i in from..to {
        t.insert(i.to_be_bytes(), record(i)).unwrap();
    }
    s.flush().unwrap();
}

#[test]
fn reopening_a_store_rewrites_almost_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The first two lives lay out the log (the second extends the file to
    // a whole segment, as upstream does).
    session(open_counting_writes(dir.path()).0, 0, 50);
    session(open_counting_writes(dir.path()).0, 50, 60);
    let (s, wrote) = open_counting_writes(dir.path());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 60);
    for i in 0u64..60 {
        assert_eq!(t.get(i.to_be_bytes()).unwrap().unwrap().as_ref(), &record(i)[..]);
    }
    // Upstream sled rewrote the tail of the log's last segment and every
    // free segment on each start (here over 400 KiB), for the next flush
    // to write back. Now it writes only the start's snapshot (under 4 KiB).
    assert!(wrote < 16 * 1024, "opening the store wrote {wrote} bytes");
}

/// A flush makes what was written durable with one sync of the store's
/// file, and does not sync again when nothing was written since
/// (`vendor/sled/CONFINE-PATCH.md`, change 15). Before, every flush
/// synced: a process that only read the store (`confine audit ls`) synced
/// it 11 times on its way out, one per tree dropped.
#[test]
fn a_flush_syncs_the_store_only_when_something_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let s = second_life_after_the_flushers_first_round(dir.path());
    let t = s.tree("audit").unwrap();
    t.insert(10u64.to_be_bytes(), record(10)).unwrap();
    let before = s.file_syncs();
    s.flush().unwrap();
    let after_write = s.file_syncs();
    assert_eq!(after_write, before + 1, "a flush after a write must sync the file once");
    for _ in 0..5 {
        s.flush().unwrap();
    }
    assert_eq!(s.file_syncs(), after_write, "flushes with nothing written synced the file again");
    t.insert(11u64.to_be_bytes(), record(11)).unwrap();
    s.flush().unwrap();
    assert_eq!(s.file_syncs(), after_write + 1, "a flush after the next write must sync again");
    drop((t, s));
    let (s, _) = open_counting_writes(dir.path());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 12);
    assert_eq!(t.get(11u64.to_be_bytes()).unwrap().unwrap().as_ref(), &record(11)[..]);
}

/// sled change 18: a flush writes the buffer it seals itself and makes it
/// durable with its one `fdatasync`; upstream handed it to an I/O thread,
/// which waited for the device with `sync_file_range`, and then synced.
/// A transaction over three trees and its flush (an audit append): one
/// sync, and at most one `sync_file_range` on average; upstream waited
/// for the device three times (its manifest, its writes, and the sync).
#[test]
fn a_flush_waits_for_the_device_once_for_what_it_writes() {
    use sled::Transactional;
    let dir = tempfile::tempdir().unwrap();
    let s = second_life_after_the_flushers_first_round(dir.path());
    let waits = |s: &Store| (s.file_syncs(), s.range_syncs());
    // (Opening a tree the first time writes too.)
    let (t, ids, meta) = (s.tree("audit").unwrap(), s.tree("audit_ids").unwrap(), s.tree("audit_meta").unwrap());
    t.insert(10u64.to_be_bytes(), record(10)).unwrap();
    let (syncs, ranges) = waits(&s);
    s.flush().unwrap();
    assert_eq!(waits(&s), (syncs + 1, ranges), "(syncs, sync_file_range runs) of a flush after an insert");

    // A few, well inside the flusher's 500 ms sleep (its rounds write too).
    let (_, ranges_before) = waits(&s);
    for i in 11u64..14 {
        let (syncs, _) = waits(&s);
        (&t, &ids, &meta)
            .transaction(|(t, ids, meta)| {
                t.insert(&i.to_be_bytes(), record(i))?;
                ids.insert(format!("job-{i}").as_bytes(), &i.to_be_bytes())?;
                meta.insert("head", &i.to_be_bytes())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .unwrap();
        s.flush().unwrap();
        assert_eq!(waits(&s).0, syncs + 1, "transaction {i}: one sync");
    }
    // The manifest's buffer is queued before the flush: an I/O thread
    // may take it first (one `sync_file_range`), or the flush with its own.
    // Upstream: two for each transaction.
    let ranges = waits(&s).1 - ranges_before;
    assert!(ranges <= 3, "3 transactions made {ranges} runs stable with sync_file_range");
    drop((t, ids, meta, s));
    let (s, _) = open_counting_writes(dir.path());
    let (t, meta) = (s.tree("audit").unwrap(), s.tree("audit_meta").unwrap());
    assert_eq!(t.len(), 14);
    assert_eq!(t.get(13u64.to_be_bytes()).unwrap().as_deref(), Some(&record(13)[..]));
    assert_eq!(meta.get("head").unwrap().as_deref(), Some(&13u64.to_be_bytes()[..]));
}

#[test]
fn reopening_a_store_maps_its_log_instead_of_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    session(open_counting_writes(dir.path()).0, 0, 50);
    session(open_counting_writes(dir.path()).0, 50, 60);
    let (s, _, read) = open_counting(dir.path());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 60);
    for i in 0u64..60 {
        assert_eq!(t.get(i.to_be_bytes()).unwrap().unwrap().as_ref(), &record(i)[..]);
    }
    // Upstream sled read each log segment whole (512 KiB) into a fresh
    // zeroed buffer: 1.48 MB here. The segments are mapped now; what is
    // read is the snapshot, the config, segment headers and the tail of the
    // last segment, which the start compares with its fill (about 420 KiB:
    // read, not mapped, since a truncation may race with it; see
    // `starts_after_lives_that_free_segments_never_crash`). Under one
    // segment in all: no segment was read whole.
    assert!(read < 512 * 1024, "opening the store read {read} bytes");
}

/// The store's two snapshot slots (`vendor/sled/CONFINE-PATCH.md`, change
/// 16): the newer, by modification time, and the one the next start writes.
/// Callers leave a few ms between starts, so the times differ.
fn snapshot_slots(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (dir.join("snapshot.a"), dir.join("snapshot.b"));
    let modified = |p: &std::path::Path| std::fs::metadata(p).unwrap().modified().unwrap();
    if modified(&a) >= modified(&b) {
        (a, b)
    } else {
        (b, a)
    }
}

/// A start writes its snapshot over the older of two slot files (change
/// 16). A crash that tears that write must leave the store openable, from
/// the other slot, with everything in it. The lives here write their
/// values twice: the first pass is garbage by the next start, which frees
/// its segments, and the next life reuses them. Recovering from the
/// older slot would replay the log through those reused segments.
#[test]
fn a_torn_snapshot_write_leaves_the_store_whole() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let value = |life: u64, pass: u64| vec![((life * 2 + pass) % 251) as u8; 4096];
    let (lives, keys) = (30u64, 150u64);
    let mut torn = 0;
    for life in 0..lives {
        std::thread::sleep(std::time::Duration::from_millis(10));
        if life >= 3 && life % 3 == 0 {
            // The next start's write, torn by a crash: its first page is
            // garbage, the rest the older snapshot.
            let (_, next) = snapshot_slots(dir.path());
            let f = std::fs::OpenOptions::new().write(true).open(&next).unwrap();
            f.write_all_at(&[0xa5; 4096], 0).unwrap();
            torn += 1;
        }
        let (s, _) = open_counting_writes(dir.path());
        let t = s.tree("artifacts.chunks").unwrap();
        if life > 0 {
            for key in 0..keys {
                assert_eq!(
                    t.get(key.to_be_bytes()).unwrap().as_deref(),
                    Some(&value(life - 1, 1)[..]),
                    "life {life}: key {key} as the life before left it"
                );
            }
        }
        for pass in 0..2 {
            for key in 0..keys {
                t.insert(key.to_be_bytes(), value(life, pass)).unwrap();
            }
            s.flush().unwrap();
        }
    }
    assert_eq!(torn, 9);
    let (s, _) = open_counting_writes(dir.path());
    let t = s.tree("artifacts.chunks").unwrap();
    assert_eq!(t.len() as u64, keys);
    assert_eq!(t.get(0u64.to_be_bytes()).unwrap().as_deref(), Some(&value(lives - 1, 1)[..]));
}

/// A start recovers from the newer slot and writes its own snapshot over
/// the older one, never over the one it recovered from: that one is what
/// is left if this write tears.
#[test]
fn a_start_writes_its_snapshot_over_the_older_slot() {
    let dir = tempfile::tempdir().unwrap();
    for life in 0..8u64 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let before = (life >= 3).then(|| snapshot_slots(dir.path()));
        // The life before wrote records: this start writes a snapshot.
        let (s, _) = open_counting_writes(dir.path());
        if let Some((newer, older)) = before {
            let (written, kept) = snapshot_slots(dir.path());
            assert_eq!((written, kept), (older, newer), "life {life}: the start wrote over the slot it recovered from");
        }
        session(s, life * 10, life * 10 + 10);
    }
}

/// A store written before change 16 has its snapshot in a `snap.<lsn>`
/// file (the snapshot, its length, its crc32). It opens with everything in
/// it, and the first start that writes a snapshot moves it to a slot and
/// removes the old file.
#[test]
fn a_store_with_an_older_snapshot_file_opens_and_moves_to_the_slots() {
    let dir = tempfile::tempdir().unwrap();
    session(open_counting_writes(dir.path()).0, 0, 50);
    // The second start writes the first snapshot, to slot a.
    session(open_counting_writes(dir.path()).0, 50, 60);
    let slot = dir.path().join("snapshot.a");
    let bytes = std::fs::read(&slot).unwrap();
    assert_eq!(&bytes[..8], b"sledsnp1");
    let field = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    let (len, decompressed) = (field(12) as usize, field(20));
    let payload = &bytes[28..28 + len];
    let mut crc = flate2::Crc::new();
    crc.update(payload);
    let mut legacy = payload.to_vec();
    legacy.extend_from_slice(&decompressed.to_le_bytes());
    legacy.extend_from_slice(&crc.sum().to_le_bytes());
    let old = dir.path().join("snap.0000000000012345");
    std::fs::write(&old, legacy).unwrap();
    std::fs::remove_file(&slot).unwrap();

    let (s, _) = open_counting_writes(dir.path());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 60);
    assert_eq!(t.get(59u64.to_be_bytes()).unwrap().as_deref(), Some(&record(59)[..]));
    drop(t);
    session(s, 60, 70);
    // This start recovered the records 60..70 from the log: it wrote a
    // snapshot, to a slot, and removed the old file.
    let (s, _) = open_counting_writes(dir.path());
    assert!(!old.exists(), "the older-style snapshot file is still there");
    assert!(slot.exists());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 70);
    for i in 0u64..70 {
        assert_eq!(t.get(i.to_be_bytes()).unwrap().as_deref(), Some(&record(i)[..]), "record {i}");
    }
}

/// A start deserializes only the slot whose stable lsn (the payload's
/// first field) is newer (change 20). One whose crc is right but whose
/// page table does not deserialize is passed over for the other slot, as
/// when both were deserialized. (The newer slot is made so here; a crash
/// can't do it.)
#[test]
fn a_slot_that_does_not_deserialize_is_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    session(open_counting_writes(dir.path()).0, 0, 50);
    std::thread::sleep(std::time::Duration::from_millis(10));
    session(open_counting_writes(dir.path()).0, 50, 60);
    std::thread::sleep(std::time::Duration::from_millis(10));
    session(open_counting_writes(dir.path()).0, 60, 70);
    let (newer, older) = snapshot_slots(dir.path());
    let kept = std::fs::read(&older).unwrap();
    // The newer slot's payload with junk after its page table (no page
    // state starts with 0xff), under a header and crc that match.
    let bytes = std::fs::read(&newer).unwrap();
    let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let mut payload = bytes[28..28 + len].to_vec();
    payload.extend_from_slice(&[0xff; 9]);
    let mut covered = Vec::new();
    covered.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    covered.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    covered.extend_from_slice(&payload);
    let mut crc = flate2::Crc::new();
    crc.update(&covered);
    let mut slot = b"sledsnp1".to_vec();
    slot.extend_from_slice(&crc.sum().to_le_bytes());
    slot.extend_from_slice(&covered);
    slot.resize(bytes.len().max(slot.len()), 0);
    std::fs::write(&newer, slot).unwrap();

    let (s, _) = open_counting_writes(dir.path());
    let t = s.tree("audit").unwrap();
    assert_eq!(t.len(), 70);
    for i in 0u64..70 {
        assert_eq!(t.get(i.to_be_bytes()).unwrap().as_deref(), Some(&record(i)[..]), "record {i}");
    }
    // It recovered from the older slot, so it wrote over the newer one.
    assert_eq!(std::fs::read(&older).unwrap(), kept, "the start wrote over the slot it recovered from");
}

/// Lives of the store in `CONFINE_STORE_LIVES_DIR`: the helper process of
/// `starts_after_lives_that_free_segments_never_crash`.
#[test]
#[ignore = "helper process for starts_after_lives_that_free_segments_never_crash"]
fn store_life() {
    let Some(dir) = std::env::var_os("CONFINE_STORE_LIVES_DIR") else { return };
    let life: u64 = std::env::var("CONFINE_STORE_LIFE").unwrap().parse().unwrap();
    let s = Store::open(std::path::Path::new(&dir)).unwrap();
    // 400 KiB a life, over what the lives four before wrote: the segments
    // those held turn to garbage, and a later start frees them.
    let t = s.tree("artifacts.chunks").unwrap();
    for j in 0..100u64 {
        t.insert(((life % 4) * 1000 + j).to_be_bytes(), vec![(life % 251) as u8; 4096]).unwrap();
    }
    s.flush().unwrap();
    // As `confine exec` ends: at once, without closing the store.
    std::process::exit(0);
}

/// A start of the store frees the segments earlier lives left as garbage,
/// and may truncate the log's tail on an I/O thread while it goes on. It
/// once read segments through mappings meanwhile: a page the truncation
/// cut off raised SIGBUS: 93 of these 2,000 lives died of it (and 6 of
/// 4,000 `confine exec` runs). Each life is a process, as each exec is;
/// 500 of them take about 3 s.
#[test]
fn starts_after_lives_that_free_segments_never_crash() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let lives: u64 = std::env::var("CONFINE_STORE_LIVES").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    let mut crashes = Vec::new();
    for life in 0..lives {
        let out = common::output_within(
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "store_life", "--ignored", "--quiet", "--test-threads=1"])
                .env("CONFINE_STORE_LIVES_DIR", dir.path())
                .env("CONFINE_STORE_LIFE", life.to_string()),
            RUN_LIMIT,
        );
        match out.status.signal() {
            Some(sig) => crashes.push((life, sig)),
            None => assert!(out.status.success(), "life {life}: {}", String::from_utf8_lossy(&out.stderr)),
        }
    }
    assert!(crashes.is_empty(), "lives killed by a signal (life, signal): {crashes:?}");
    // And the store holds the last lives' values.
    let s = Store::open(dir.path()).unwrap();
    let t = s.tree("artifacts.chunks").unwrap();
    let last = lives - 1;
    assert_eq!(
        t.get(((last % 4) * 1000).to_be_bytes()).unwrap().unwrap().as_ref(),
        &vec![(last % 251) as u8; 4096][..]
    );
}

/// sled change 21: what `confine exec` adds to a store in one run (an
/// audit record, its id, an artifact's metadata, each keyed by something
/// that grows), `runs` times, flushed each run.
fn age(s: &Store, from: u64, runs: u64) {
    let (audit, ids, meta) = (s.tree("audit").unwrap(), s.tree("audit_ids").unwrap(), s.tree("meta").unwrap());
    for seq in from..from + runs {
        audit.insert(seq.to_be_bytes(), vec![b'a'; 714]).unwrap();
        ids.insert(format!("job-{}-1a2b00", 1_790_000_000_000 + seq * 7), &seq.to_be_bytes()).unwrap();
        meta.insert(format!("run-local-{}-{:016x}", 1_790_000_000_000 + seq * 7, seq * 0x9e37), vec![b'm'; 653])
            .unwrap();
        s.flush().unwrap();
    }
}

/// Leaves of small records that grow at the end are filled, not left
/// half empty: every start reads, loads and writes back one entry per
/// page, so the pages are what an old store costs each `confine exec`.
/// Upstream split every leaf at 16 keys, in half: 3,000 runs made 1,010
/// pages. Now a leaf holds up to 16 KiB (or 64 keys), and the last leaf of
/// a tree keeps all but 4 keys when it splits.
#[test]
fn records_that_grow_at_the_end_fill_their_pages() {
    let dir = tempfile::tempdir().unwrap();
    for life in 0..3 {
        let s = Store::open_flushed_by_caller(dir.path()).unwrap();
        age(&s, life * 1000, 1000);
    }
    let s = Store::open_flushed_by_caller(dir.path()).unwrap();
    let pages = s.pages_in_use();
    println!("3,000 runs: {pages} pages");
    // 3,000 records of each kind: 3000/19 + 3000/60 + 3000/21 leaves,
    // their indexes and sled's own pages come to about 360.
    assert!(pages < 450, "3,000 runs use {pages} pages");
    let audit = s.tree("audit").unwrap();
    assert_eq!(audit.len(), 3000);
    assert_eq!(s.tree("meta").unwrap().len(), 3000);
    for seq in (0u64..3000).step_by(97) {
        assert_eq!(audit.get(seq.to_be_bytes()).unwrap().unwrap().len(), 714);
    }
}

/// The leaves change 21 makes, bigger and split off-centre, under inserts,
/// overwrites and removals in random order, of sizes from nothing to
/// artifact chunks, over several lives of the store: sled must agree with
/// a `BTreeMap` on every key, in order, after each reopen. Removals empty
/// leaves below the merge threshold, so merges are exercised too.
#[test]
fn bigger_leaves_keep_every_key_across_lives() {
    use std::collections::BTreeMap;
    let dir = tempfile::tempdir().unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut appended = 0u64;
    for life in 0..6 {
        let s = Store::open_flushed_by_caller(dir.path()).unwrap();
        let t = s.tree("t").unwrap();
        let stored: Vec<(Vec<u8>, Vec<u8>)> =
            t.iter().map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).unwrap()).collect();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        assert!(stored == expected, "life {life}: sled holds {} keys, the model {}", stored.len(), expected.len());
        for _ in 0..3000 {
            let r = next();
            let size = match r % 10 {
                0 => (r >> 8) as usize % 40_000,
                1..=3 => 0,
                _ => (r >> 8) as usize % 1_500,
            };
            let key = if r % 3 == 0 {
                // Keys that grow at the end, as sequence numbers do.
                appended += 1;
                [b"z".as_slice(), &appended.to_be_bytes()].concat()
            } else {
                format!("k{:05}", (r >> 20) % 4000).into_bytes()
            };
            if (r >> 40) % 3 == 0 {
                t.remove(&key).unwrap();
                model.remove(&key);
            } else {
                let value = vec![(r >> 50) as u8; size];
                t.insert(&key, value.clone()).unwrap();
                model.insert(key, value);
            }
        }
        s.flush().unwrap();
    }
    let s = Store::open_flushed_by_caller(dir.path()).unwrap();
    let t = s.tree("t").unwrap();
    assert_eq!(t.len(), model.len());
    for (k, v) in &model {
        assert_eq!(t.get(k).unwrap().as_deref(), Some(v.as_slice()));
    }
}

const SEGMENT: u64 = 512 * 1024;

/// A store whose log had 24 MiB written and then most of it removed: many
/// of its segments are free.
fn store_with_free_segments(dir: &std::path::Path) {
    let s = Store::open_flushed_by_caller(dir).unwrap();
    let t = s.tree("t").unwrap();
    for i in 0u64..6000 {
        t.insert(i.to_be_bytes(), vec![(i % 251) as u8; 4096]).unwrap();
    }
    s.flush().unwrap();
    for i in 0u64..6000 {
        if i % 50 != 0 {
            t.remove(i.to_be_bytes()).unwrap();
        }
    }
    s.flush().unwrap();
}

/// Offsets of the segments of the store's file that start with 64 KiB of
/// sled's fill byte (free ones, filled at a start).
fn filled_segments(dir: &std::path::Path) -> Vec<u64> {
    let bytes = std::fs::read(dir.join("db")).unwrap();
    (0..bytes.len() as u64 / SEGMENT)
        .map(|i| i * SEGMENT)
        .filter(|&at| bytes[at as usize..(at + 64 * 1024) as usize].iter().all(|b| *b == 0))
        .collect()
}

/// sled change 23: a start fills the store's free segments with its
/// marker, and upstream read every byte of each free segment again at each
/// start to compare it (change 9): a store with many free segments (after
/// artifacts expired, or the audit trail was sealed) paid milliseconds per
/// `confine exec`. A free segment whose first 4 KiB hold the marker is
/// now taken as filled.
#[test]
fn a_start_does_not_read_free_segments_filled_before() {
    let dir = tempfile::tempdir().unwrap();
    store_with_free_segments(dir.path());
    // The first start after the removals fills the free segments.
    drop(open_counting(dir.path()));
    let free = filled_segments(dir.path()).len() as u64;
    assert!(free >= 10, "only {free} free segments: the test needs more");
    let (s, _, read) = open_counting(dir.path());
    println!("{free} free segments; the next start read {read} bytes");
    assert!(read < free * SEGMENT / 4, "the start read {read} bytes with {free} free segments of 512 KiB");
    let t = s.tree("t").unwrap();
    assert_eq!(t.len(), 120);
}

/// What change 23 leaves behind when a crash cut a start's fill short: a
/// free segment with the marker at its start and old log messages after
/// it, which later starts no longer fill. Recovery skips such a segment by its header; once
/// it is used again, the old messages after the new ones must not be read
/// as part of the log. Here every filled segment gets old messages
/// copied into its last 448 KiB, the segments are used again over several
/// lives, and sled must agree with a model after each reopen.
#[test]
fn old_messages_behind_a_filled_segment_start_are_never_replayed() {
    use std::collections::BTreeMap;
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    store_with_free_segments(dir.path());
    drop(open_counting(dir.path()));
    let filled = filled_segments(dir.path());
    assert!(filled.len() >= 10);
    // Old messages: the body of a segment in use (not free, not the first).
    let db = std::fs::OpenOptions::new().read(true).write(true).open(dir.path().join("db")).unwrap();
    let len = db.metadata().unwrap().len();
    let used = (1..len / SEGMENT).map(|i| i * SEGMENT).find(|at| !filled.contains(at)).unwrap();
    let mut body = vec![0u8; (SEGMENT - 64 * 1024) as usize];
    db.read_exact_at(&mut body, used + 64 * 1024).unwrap();
    for at in &filled {
        db.write_all_at(&body, at + 64 * 1024).unwrap();
    }
    db.sync_all().unwrap();
    drop(db);

    let mut model: BTreeMap<u64, Vec<u8>> =
        (0u64..6000).step_by(50).map(|i| (i, vec![(i % 251) as u8; 4096])).collect();
    for life in 0..4u64 {
        let (s, _, _) = open_counting(dir.path());
        let t = s.tree("t").unwrap();
        let stored: BTreeMap<u64, Vec<u8>> = t
            .iter()
            .map(|kv| kv.map(|(k, v)| (u64::from_be_bytes(k.as_ref().try_into().unwrap()), v.to_vec())).unwrap())
            .collect();
        assert!(stored == model, "life {life}: sled holds {} keys, the model {}", stored.len(), model.len());
        // Enough new data to use the free segments again.
        for i in 0u64..1500 {
            let key = 10_000 + life * 1500 + i;
            let value = vec![(key % 241) as u8; 4096];
            t.insert(key.to_be_bytes(), value.clone()).unwrap();
            model.insert(key, value);
        }
        s.flush().unwrap();
    }
}
