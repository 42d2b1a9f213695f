//! The sled store across many short lives, as users live them: `confine
//! exec` run again and again, each a process that opens the store, writes
//! an artifact and an audit record (a transaction), flushes and exits
//! without closing. After enough of them for sled to free and reuse log
//! segments, every record must still verify and every artifact read back.
//!
//! Then the store against what the field does to it: processes killed
//! with SIGKILL at random points while they write, a disk that fills up,
//! and blob files damaged on disk.

use crate::common;

use confine::store::artifacts::{Artifacts, JobInfo, StreamMeta, StreamName};
use confine::store::audit::{AuditEntry, AuditLog, AuditSink};
use confine::store::Store;
use sha2::{Digest, Sha256};
use std::process::{Command, Output};

/// `confine exec` runs in the test: enough for sled to free and reuse
/// log segments.
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

/// xorshift64: test data and kill points, from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// `n` bytes: incompressible, or log-like lines.
    fn bytes(&mut self, n: usize, text: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 64);
        while out.len() < n {
            let x = self.next();
            if text {
                out.extend_from_slice(format!("line {x:x}: compiling crate {}\n", x % 97).as_bytes());
            } else {
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
        out.truncate(n);
        out
    }
}

fn entry(id: &str) -> AuditEntry {
    AuditEntry {
        repo_id: Some("t".into()),
        runtime: "shell".into(),
        operation: "exec".into(),
        executable: "/bin/sh".into(),
        cwd: "/".into(),
        status: confine::job::Status::Success,
        duration_ms: 1,
        exit_code: Some(0),
        ..AuditEntry::bare(id)
    }
}

/// Store `text` as one stream of a new artifact, in chunks of up to
/// 1 MiB, with its SHA-256 in the metadata, as capture does.
fn store_artifact(a: &Artifacts, stdout: &[u8], stderr: &[u8]) -> confine::store::artifacts::ArtifactMeta {
    let w = a.begin("t", confine::store::artifacts::DEFAULT_TTL_MS).unwrap();
    let mut metas = Vec::new();
    for (s, text) in [(StreamName::Stdout, stdout), (StreamName::Stderr, stderr)] {
        let mut sink = w.chunk_sink(s);
        for c in text.chunks(confine::store::artifacts::CHUNK_BYTES) {
            sink.write_chunk(c).unwrap();
        }
        let stored = sink.finish().unwrap();
        metas.push(StreamMeta {
            total_bytes: text.len() as u64,
            stored_bytes: text.len() as u64,
            compressed_bytes: stored.compressed_bytes,
            sha256: hex::encode(Sha256::digest(text)),
            chunks: stored.chunks,
            blob: stored.blob,
            ..Default::default()
        });
    }
    let err = metas.pop().unwrap();
    let out = metas.pop().unwrap();
    w.finish(JobInfo::default(), out, err).unwrap()
}

/// The writer that `a_writer_killed_at_random_points_leaves_a_whole_store`
/// kills: artifacts small and large, text and noise, each followed by an
/// audit record that names it (flushed), an occasional GC and removal.
#[test]
#[ignore = "helper process for a_writer_killed_at_random_points_leaves_a_whole_store"]
fn store_writer() {
    let Some(dir) = std::env::var_os("CONFINE_STORE_WRITER_DIR") else { return };
    let seed: u64 = std::env::var("CONFINE_STORE_WRITER_SEED").unwrap().parse().unwrap();
    // The test's own process checked the store just before: it is alive,
    // and a child that another test in it was forking at that moment may
    // still hold a copy of its lock's descriptor until its exec. Retried,
    // as the check's own open is.
    let store = common::open_store_with(std::path::Path::new(&dir), Store::open_flushed_by_caller);
    let (a, log) = (Artifacts::open(&store).unwrap(), AuditLog::open(&store).unwrap().with_block_len(8));
    let mut rng = Rng(seed | 1);
    for i in 0.. {
        let size = [10, 3_000, 70_000, 400_000, 2_500_000][rng.below(5) as usize];
        let text = rng.below(2) == 0;
        let out = rng.bytes(size, text);
        let err_len = rng.below(2_000) as usize;
        let err = rng.bytes(err_len, true);
        let meta = store_artifact(&a, &out, &err);
        log.append(entry(&format!("{seed}-{i}-{}", meta.handle))).unwrap();
        if log.seal_due().unwrap() {
            log.seal().unwrap();
        }
        match rng.below(8) {
            0 => drop(a.gc(4 << 20).unwrap()),
            1 => drop(a.remove(&meta.handle).unwrap()),
            _ => {}
        }
    }
}

/// What a store must be after any crash: it opens, its audit chain
/// verifies, every complete artifact reads back whole and matches its
/// SHA-256 (none is half-readable), and GC leaves only blobs that
/// metadata names. Returns how many artifacts were checked.
fn check_whole(dir: &std::path::Path) -> usize {
    let store = common::open_store_with(dir, Store::open_flushed_by_caller);
    let log = AuditLog::open(&store).unwrap();
    let report = log.verify().unwrap();
    assert!(report.ok(), "the audit chain after a crash: {report:?}");
    let a = Artifacts::open(&store).unwrap();
    let mut checked = 0;
    for meta in a.list().unwrap() {
        if !meta.complete {
            continue;
        }
        for s in StreamName::BOTH {
            let mut bytes = Vec::new();
            a.copy_stream(&meta, s, &mut bytes)
                .unwrap_or_else(|e| panic!("complete artifact {} {s} does not read: {e}", meta.handle));
            assert_eq!(hex::encode(Sha256::digest(&bytes)), meta.stream(s).sha256, "{} {s}", meta.handle);
        }
        checked += 1;
    }
    a.gc(u64::MAX).unwrap();
    let (blobs, tmps) = store.blobs().list().unwrap();
    assert!(tmps.is_empty(), "temporary blob files left after GC: {tmps:?}");
    let named: std::collections::BTreeSet<String> =
        a.list().unwrap().iter().flat_map(|m| [m.stdout.blob.clone(), m.stderr.blob.clone()]).flatten().collect();
    for b in &blobs {
        assert!(named.contains(b), "blob {b} is named by no artifact after GC");
    }
    for n in &named {
        assert!(blobs.contains(n), "blob {n} is named but missing");
    }
    checked
}

/// A writer killed with SIGKILL at random points, again and again, never
/// leaves a store that does not open, an audit chain that does not
/// verify, a half-readable artifact, or orphans that GC does not collect.
#[test]
fn a_writer_killed_at_random_points_leaves_a_whole_store() {
    let dir = tempfile::tempdir().unwrap();
    let kills: u64 = std::env::var("CONFINE_STORE_KILLS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let mut rng = Rng(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64);
    let mut artifacts = 0;
    for kill in 0..kills {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "suite::store::store_writer", "--ignored", "--quiet", "--test-threads=1", "--nocapture"])
            .env("CONFINE_STORE_WRITER_DIR", dir.path())
            .env("CONFINE_STORE_WRITER_SEED", rng.next().to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Kill points from the writer's start to several artifacts in
        // (a loaded CI host runs the writer slower).
        std::thread::sleep(std::time::Duration::from_millis(20 + rng.below(400)));
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("kill {kill}: the writer ended by itself ({status}): {err}");
        }
        child.kill().unwrap();
        child.wait().unwrap();
        artifacts += check_whole(dir.path());
    }
    println!("{kills} kills, {artifacts} complete artifacts checked");
    assert!(artifacts >= kills as usize / 2, "the writer stored too little to test anything: {artifacts}");
}

/// A blob whose bytes were changed on disk is reported as damaged when
/// read, by the library and by `confine artifacts show`, never served.
#[test]
fn a_damaged_blob_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let handle;
    {
        let store = Store::open(&store_dir).unwrap();
        let a = Artifacts::open(&store).unwrap();
        let text = Rng(7).bytes(3 << 20, true);
        let meta = store_artifact(&a, &text, b"");
        let blob = meta.stdout.blob.clone().expect("a 3 MiB stream is in a blob");
        let path = store.blobs().path_of(&blob);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 5000;
        bytes[at] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let err = a.copy_stream(&meta, StreamName::Stdout, &mut Vec::new()).unwrap_err().to_string();
        assert!(err.contains("damaged") && err.contains("SHA-256"), "{err}");
        // The first chunks are whole; the damaged one is not served.
        let mut first = Vec::new();
        a.read_chunk(&meta, StreamName::Stdout, 0, &mut first).unwrap();
        assert_eq!(first, text[..first.len()]);
        handle = meta.handle;
    }
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, format!("[store]\npath = {:?}\n", store_dir.to_str().unwrap())).unwrap();
    let out = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&config).args(["artifacts", "show", &handle]),
        RUN_LIMIT,
    );
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains("damaged"), "{}", common::stderr(&out));
    assert!(out.stdout.len() < 3 << 20, "the damaged chunk was served: {} bytes", out.stdout.len());
}

/// A missing blob is damage too.
#[test]
fn a_missing_blob_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = Artifacts::open(&store).unwrap();
    let meta = store_artifact(&a, &Rng(9).bytes(200_000, false), b"");
    std::fs::remove_file(store.blobs().path_of(meta.stdout.blob.as_ref().unwrap())).unwrap();
    let err = a.copy_stream(&meta, StreamName::Stdout, &mut Vec::new()).unwrap_err().to_string();
    assert!(err.contains("damaged") && err.contains("blob"), "{err}");
}

/// Identical output is stored once; removing one of two artifacts that
/// share a blob keeps the blob, removing both frees it.
#[test]
fn a_shared_blob_lives_as_long_as_an_artifact_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let a = Artifacts::open(&store).unwrap();
    let text = Rng(3).bytes(500_000, false);
    let (m1, m2) = (store_artifact(&a, &text, b""), store_artifact(&a, &text, b""));
    assert_eq!(m1.stdout.blob, m2.stdout.blob);
    assert_eq!(store.blobs().list().unwrap().0.len(), 1);
    assert!(a.remove(&m1.handle).unwrap());
    let mut back = Vec::new();
    a.copy_stream(&a.get(&m2.handle).unwrap(), StreamName::Stdout, &mut back).unwrap();
    assert_eq!(back, text);
    assert!(a.remove(&m2.handle).unwrap());
    assert!(store.blobs().list().unwrap().0.is_empty(), "the blob outlived every artifact naming it");
}

/// A small mounted tmpfs, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(bytes: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "confine-test"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// The store on an 8 MiB tmpfs (2 MiB kept free, `store.min_free_bytes`),
/// and a job whose output would fill it: its output stops being stored at
/// half the reserve, the client is told, nobody panics, the job's tree is
/// killed, and what was stored before is all there.
#[test]
fn a_disk_that_fills_up_costs_the_new_artifact_only() {
    if !common::is_root() {
        return common::skip("mounting a tmpfs needs root");
    }
    if !common::sandbox_available() {
        return;
    }
    let fs = Tmpfs::mount(8 << 20);
    let dir = tempfile::tempdir().unwrap();
    let repo = common::readable_repo(dir.path());
    let store_dir = fs.0.path().join("store");
    let config = dir.path().join("confine.toml");
    let text = common::exec_config(&store_dir, "t", &repo).replace("[store]\n", "[store]\nmin_free_bytes = 2097152\n");
    std::fs::write(&config, text).unwrap();
    let exec =
        |code: &str| confine(&config, &["exec", "--repo-id", "t", "--runtime", "shell", "--json", "--code", code]);
    // Before: a few artifacts, small and in blobs.
    let mut before = Vec::new();
    for i in 0..3 {
        let out = exec(&format!("echo kept {i}; head -c 300000 /dev/zero | tr '\\0' x"));
        assert!(out.status.success(), "{}", common::stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        before.push(v["artifactHandle"].as_str().unwrap().to_string());
    }
    // Then 40 MB that does not compress, and a sleeper that must die with the job.
    let token = common::token("diskfull");
    let out = exec(&format!("(sleep 1000; echo {token}) & head -c 40000000 /dev/urandom | base64; echo done"));
    let (stdout, stderr) = (common::stdout(&out), common::stderr(&out));
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let notes = v["output"]["notes"].to_string();
    assert!(
        notes.contains("output was not stored") && notes.contains("disk is nearly full"),
        "the client must be told the disk is full: {notes}"
    );
    assert!(v["artifactHandle"].is_null(), "{}", v["artifactHandle"]);
    // And without --json, on stderr, since the output itself went to the terminal.
    let out =
        confine(&config, &["exec", "--repo-id", "t", "--runtime", "shell", "--code", "head -c 20000000 /dev/urandom"]);
    let stderr = common::stderr(&out);
    assert!(stderr.contains("confine: note: output was not stored") && stderr.contains("nearly full"), "{stderr}");
    assert!(common::host_pids_with(&token).is_empty(), "the job's tree survived the failure");
    // Everything from before is whole.
    for (i, h) in before.iter().enumerate() {
        let out = confine(&config, &["artifacts", "show", h]);
        assert!(out.status.success(), "artifact {i} after the disk filled: {}", common::stderr(&out));
        assert!(common::stdout(&out).starts_with(&format!("kept {i}\n")));
    }
    let verify = confine(&config, &["audit", "verify"]);
    assert!(verify.status.success(), "{}{}", common::stdout(&verify), common::stderr(&verify));
    // And the space comes back: GC removes what the failed capture left.
    let gc = confine(&config, &["gc"]);
    assert!(gc.status.success(), "{}", common::stderr(&gc));
    let out = exec("echo after");
    assert!(out.status.success(), "an exec after GC: {}", common::stderr(&out));
}

/// The case: 100 MB of filler, then `FATAL` at the end. The
/// stream is kept head and tail; `confine exec` says "truncated", a query
/// finds `FATAL`, and the marker says what was dropped.
#[test]
fn a_failure_at_the_end_of_a_flood_is_kept_and_found() {
    if !common::is_root() {
        return common::skip("confine exec needs the sandbox (run as root)");
    }
    if !common::sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = common::readable_repo(dir.path());
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, common::exec_config(&dir.path().join("store"), "t", &repo)).unwrap();
    let out = confine(
        &config,
        &[
            "exec",
            "--repo-id",
            "t",
            "--runtime",
            "shell",
            "--code",
            "yes filler | head -c 100000000; echo FATAL: disk on fire",
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let summary = common::stderr(&out);
    let summary = summary.lines().last().unwrap_or_default();
    assert!(summary.contains("truncated=stdout"), "{summary}");
    let handle = summary.split("artifact=").nth(1).unwrap().split_whitespace().next().unwrap();
    let q = confine(&config, &["artifacts", "query", handle, "--terms", "FATAL", "--json"]);
    assert!(q.status.success(), "{}", common::stderr(&q));
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    assert_eq!(v["matchedLines"], 1, "{v}");
    let ex = &v["excerpts"][0];
    assert!(ex["content"].as_str().unwrap().contains("FATAL: disk on fire"), "{ex}");
    // `yes filler` writes 7-byte lines: the match is at its real line number.
    assert_eq!(ex["lineEnd"], 100_000_000 / 7 + 1, "{ex}");
    assert!(v["notes"].to_string().contains("were dropped to fit its stored cap"), "{v}");
    // The marker, right after the head (a quarter of the 64 MiB cap).
    let head_lines = (16u64 << 20) / 7;
    let lines = format!("{}:{}", head_lines, head_lines + 2);
    let r = confine(&config, &["artifacts", "query", handle, "--lines", &lines, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let text = v["excerpts"].to_string();
    assert!(text.contains("dropped here: the output passed its stored cap of 64.0 MiB"), "{text}");
}

/// While a `confine exec --no-server` has the store (it serves nobody
/// else), another command is told which pid has it; once that process is
/// killed with SIGKILL, the next command takes the store over. (Without
/// `--no-server`, `confine exec` and `confine serve` relay commands
/// instead: tests/suite/relay.rs, tests/suite/parallel_exec.rs.)
#[test]
fn a_held_store_names_its_holder_and_is_taken_over_after_sigkill() {
    if !common::is_root() {
        return common::skip("confine exec needs the sandbox (run as root)");
    }
    if !common::sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = common::readable_repo(dir.path());
    let store = dir.path().join("store");
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, common::exec_config(&store, "t", &repo)).unwrap();
    let mut holder = Command::new(common::bin())
        .arg("--config")
        .arg(&config)
        .args([
            "exec",
            "--no-server",
            "--repo-id",
            "t",
            "--runtime",
            "shell",
            "--code",
            "echo started; exec sleep 1000",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line, "started\n");
    let pid = holder.id().to_string();
    let out = confine(&config, &["audit", "ls"]);
    assert!(!out.status.success(), "audit ran beside the holder");
    let err = common::stderr(&out);
    assert!(err.contains(&format!("is in use by pid {pid}")), "{err}");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let out = confine(&config, &["audit", "ls"]);
    assert!(out.status.success(), "after the holder's SIGKILL: {}", common::stderr(&out));
}
