//! Faults through `confine serve` (stdio):
//! - the server killed with SIGKILL while its jobs run and write output:
//!   no process of the jobs outlives it, the next server's start removes
//!   the job cgroups it left, the store opens, the audit trail verifies and
//!   no artifact reads back half-written;
//! - a remote OPA that is down, slow past `policy.timeout_ms`, or answers
//!   garbage: each request is a denial that says why, and the server goes
//!   on answering;
//! - the server killed at each point of the store's write path
//!   (`CONFINE_TEST_CRASH_AT`): nothing answered is lost;
//! - a full disk and exhausted file descriptors: clear answers, and the
//!   server recovers when the pressure goes.

use crate::common;
use common::rpc::job_cgroups;
use common::{readable_repo, sandbox_available};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_confine")
}

/// `confine serve` over stdio.
struct Server(common::rpc::Rpc);

impl Server {
    fn start(config: &Path) -> Server {
        Server::start_with(config, Command::new(exe()))
    }

    /// With `cmd` (the binary, with the caller's environment) for the server.
    fn start_with(config: &Path, mut cmd: Command) -> Server {
        cmd.arg("--config").arg(config).arg("serve").env("CONFINE_LOG", "warn");
        Server(common::rpc::Rpc::start(cmd, "faults"))
    }

    fn pid(&self) -> u32 {
        self.0.child.id()
    }

    /// A tool's structured answer, or its error text as `{"error": …}`.
    fn call(&mut self, tool: &str, args: Value) -> Value {
        let v = self.0.request("tools/call", json!({"name": tool, "arguments": args}));
        let r = &v["result"];
        if r["structuredContent"].is_object() {
            r["structuredContent"].clone()
        } else {
            json!({"error": r["content"][0]["text"], "raw": v})
        }
    }

    /// Close stdin: the server ends its session and exits.
    fn stop(mut self) {
        self.0.close();
        let ended = common::mcp::wait_for(&mut self.0.child, Duration::from_secs(30));
        assert!(ended.is_some_and(|s| s.success()), "the server did not end cleanly: {ended:?}");
    }
}

fn config(dir: &Path, extra: &str) -> PathBuf {
    let repo = readable_repo(dir);
    let path = dir.join("confine.toml");
    std::fs::write(
        &path,
        format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n\n{extra}",
            dir.join("store").display(),
            repo.display()
        ),
    )
    .unwrap();
    path
}

/// Processes whose command line carries `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

fn eventually(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After the server `pid` died: its init stages died with it (parent-death
/// signal), and with them every process of its jobs' pid namespaces; the
/// next server opens the store and its start removes the dead one's job
/// cgroups.
fn nothing_outlives(config: &Path, pid: u32, marker: &str, what: &str) {
    eventually(&format!("{what}: the jobs die with their server"), Duration::from_secs(10), || {
        with_marker(marker).is_empty()
    });
    let mut next = Server::start(config);
    let info = next.call("info", json!({}));
    assert!(info.get("error").is_none(), "{what}: {info}");
    eventually(&format!("{what}: the dead server's cgroups are swept"), Duration::from_secs(10), || {
        job_cgroups(pid).is_empty()
    });
    next.stop();
}

fn cli(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(exe()).arg("--config").arg(config).args(args).output().unwrap()
}

/// Every audit record, newest first (`confine audit ls --json`).
fn audit_records(config: &Path) -> Vec<Value> {
    let ls = cli(config, &["audit", "ls", "--json", "--limit", "1000"]);
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    String::from_utf8_lossy(&ls.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn a_server_killed_mid_job_leaves_nothing_running_and_a_whole_store() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let marker = format!("faultmark{}", std::process::id());
    for (round, delay_ms) in [200u64, 700, 1500].into_iter().enumerate() {
        let mut server = Server::start(&config);
        let pid = server.pid();
        // A finished job (an artifact and an audit record), then jobs that
        // run and write when the server dies: a sleeper, and a flood whose
        // artifact is being written.
        let done = server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo before"}));
        assert_eq!(done["status"], "success", "{done}");
        for code in [format!("sh -c 'sleep 300; true' {marker}"), format!("yes {marker} | head -c 400000000")] {
            let r = server.call(
                "runtime_execute",
                json!({"repoId": "demo", "runtime": "shell", "code": code, "background": true}),
            );
            assert_eq!(r["status"], "running", "{r}");
        }
        eventually("the jobs start", Duration::from_secs(30), || with_marker(&marker).len() >= 2);
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = server.0.child.wait();
        nothing_outlives(&config, pid, &marker, &format!("round {round}"));
    }
    // The store: the trail verifies and holds every job that was let run,
    // the killed ones marked unfinished (their starts were pending), and
    // every artifact listed reads whole or is refused, never half.
    let verify = cli(&config, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&verify.stdout).to_string();
    assert!(verify.status.success(), "{said}");
    let records: usize = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap();
    assert_eq!(records, 9, "3 rounds of a finished job and 2 killed ones: {said}");
    let unfinished = audit_records(&config)
        .iter()
        .filter(|r| r["note"].as_str().is_some_and(|n| n.starts_with("unfinished")))
        .count();
    assert_eq!(unfinished, 6, "the killed jobs' records are marked unfinished");
    let ls = cli(&config, &["artifacts", "ls", "--json"]);
    assert!(ls.status.success(), "{}", String::from_utf8_lossy(&ls.stderr));
    let listed: Vec<Value> =
        String::from_utf8_lossy(&ls.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let handles: Vec<String> = listed
        .iter()
        .filter_map(|a| a["handle"].as_str().or_else(|| a["artifactHandle"].as_str()).map(str::to_string))
        .collect();
    assert!(handles.len() >= 3, "{listed:?}");
    for h in &handles {
        let shown = cli(&config, &["artifacts", "show", h]);
        let err = String::from_utf8_lossy(&shown.stderr);
        assert!(shown.status.success() || err.contains("incomplete"), "{h}: {err}");
    }
    let gc = cli(&config, &["gc"]);
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
}

/// The server killed (SIGKILL, from inside: a debug build's
/// CONFINE_TEST_CRASH_AT) at each point of the store's write path, while
/// jobs, floods and denials come in: an artifact's first and last
/// metadata, a blob's append, an audit record committed but not flushed,
/// and flushed but not yet answered. Each time the next server opens the
/// store, the trail verifies and holds a record of every request that was
/// answered, every artifact reads back whole or is refused as incomplete,
/// and no job outlives the server.
#[test]
fn a_server_killed_at_each_store_write_loses_nothing_it_answered() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    let marker = format!("crashmark{}", std::process::id());
    let mut answered = 0;
    let mut sent = 0;
    for (point, n) in
        [("artifact-meta", 1), ("artifact-meta", 4), ("blob-append", 2), ("audit-committed", 2), ("audit-flushed", 4)]
    {
        let mut cmd = Command::new(exe());
        cmd.env("CONFINE_TEST_CRASH_AT", format!("{point}:{n}"));
        let mut server = Server::start_with(&config, cmd);
        let pid = server.pid();
        let requests = [
            json!({"code": format!("echo {marker}")}),
            json!({"code": format!("head -c 3000000 /dev/urandom | od; echo {marker}")}),
            json!({"code": "true", "network": {"allow": ["example.com"]}}),
        ];
        let mut died = false;
        for i in 0..12 {
            let mut args = requests[i % requests.len()].clone();
            args["repoId"] = json!("demo");
            args["runtime"] = json!("shell");
            sent += 1;
            match server.0.try_request("tools/call", json!({"name": "runtime_execute", "arguments": args})) {
                Some(v) => {
                    let r = &v["result"]["structuredContent"];
                    assert!(r["status"].is_string(), "{point}:{n}: {v}");
                    assert!(!r.to_string().contains("audit record"), "{point}:{n}: {r}");
                    answered += 1;
                }
                None => {
                    died = true;
                    break;
                }
            }
        }
        assert!(died, "{point}:{n}: the server did not reach its crash point");
        let status = server.0.child.wait().unwrap();
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{point}:{n}");
        nothing_outlives(&config, pid, &marker, &format!("{point}:{n}"));

        let verify = cli(&config, &["audit", "verify"]);
        let said = String::from_utf8_lossy(&verify.stdout).to_string();
        assert!(verify.status.success(), "{point}:{n}: {said} {}", String::from_utf8_lossy(&verify.stderr));
        let records: usize = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap();
        // Every answered request has its record; the one that died may
        // have one too (committed, or flushed, before the kill).
        assert!(
            records >= answered && records <= sent,
            "{point}:{n}: {records} records, {answered} answered, {sent} sent"
        );
        let ls = cli(&config, &["artifacts", "ls", "--json"]);
        assert!(ls.status.success(), "{point}:{n}: {}", String::from_utf8_lossy(&ls.stderr));
        for a in String::from_utf8_lossy(&ls.stdout).lines().map(|l| serde_json::from_str::<Value>(l).unwrap()) {
            let h = a["handle"].as_str().or_else(|| a["artifactHandle"].as_str()).unwrap().to_string();
            let shown = cli(&config, &["artifacts", "show", &h]);
            let err = String::from_utf8_lossy(&shown.stderr);
            assert!(shown.status.success() || err.contains("incomplete"), "{point}:{n}: {h}: {err}");
        }
    }
    let gc = cli(&config, &["gc"]);
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));
}

/// A fake OPA on 127.0.0.1: `down` (nothing listens), `slow` (answers
/// after 5 s), `garbage` (200 and not JSON). Returns its URL.
fn fake_opa(kind: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    if kind == "down" {
        return url; // dropped here: connections are refused
    }
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                let _ = sock.read(&mut buf);
                if kind == "slow" {
                    std::thread::sleep(Duration::from_secs(5));
                }
                let body = "{\"result\": {\"allow\": tru";
                let _ = write!(sock, "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
            });
        }
    });
    url
}

#[test]
fn a_remote_opa_down_slow_or_answering_garbage_denies_and_the_server_goes_on() {
    if !sandbox_available() {
        return;
    }
    for (kind, why) in [("down", "cannot reach the OPA server"), ("slow", "time"), ("garbage", "not JSON")] {
        let dir = tempfile::tempdir().unwrap();
        let url = fake_opa(kind);
        let config =
            config(dir.path(), &format!("[policy]\ntimeout_ms = 500\n\n[[policy.evaluators]]\nurl = \"{url}\"\n"));
        let mut server = Server::start(&config);
        for _ in 0..2 {
            let r = server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo ran"}));
            assert_eq!(r["status"], "denied", "{kind}: {r}");
            let text = r.to_string();
            assert!(text.contains(why), "{kind}: the denial does not say why ({why}): {text}");
            assert!(!text.contains("\"ran"), "{kind}: the job ran: {text}");
        }
        let info = server.call("info", json!({}));
        assert!(info.get("error").is_none(), "{kind}: the server stopped answering: {info}");
        server.stop();
    }
}

/// The cgroup file system refuses the memory limit's write (a debug-build
/// hook, CONFINE_TEST_CGROUP_REFUSE): the job never runs, with exit 125
/// and the reason from `confine run`, and an answer that says so from the
/// server, which goes on serving.
#[test]
fn a_cgroup_write_refused_stops_the_job_before_it_runs() {
    if !sandbox_available() {
        return;
    }
    let refuse = ("CONFINE_TEST_CGROUP_REFUSE", "memory.max,memory.limit_in_bytes");
    let out = Command::new(exe())
        .args(["run", "--memory", "64M", "--", "sh", "-c", "echo RAN"])
        .env(refuse.0, refuse.1)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(125), "{stdout} / {stderr}");
    assert!(!stdout.contains("RAN"), "the job ran: {stdout}");
    assert!(stderr.contains("memory"), "the reason is not given: {stderr}");

    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "[limits]\nmemory_bytes = 67108864\n");
    let mut child = Command::new(exe());
    child.env(refuse.0, refuse.1);
    let mut server = Server::start_with(&config, child);
    let r = server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo RAN"}));
    let text = r.to_string();
    assert_ne!(r["status"], "success", "{text}");
    assert!(!text.contains("RAN\\n"), "the job ran: {text}");
    assert!(text.contains("memory"), "the answer does not say why: {text}");
    let info = server.call("info", json!({}));
    assert!(info.get("error").is_none(), "the server stopped answering: {info}");
    server.stop();
}

/// A tmpfs of `bytes` on `at`, unmounted (detached) when dropped, even by
/// a failed assertion: the store's "disk", which a test can fill.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(at: &Path, bytes: u64) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700"), "confine-faults"])
            .arg(at)
            .status()
            .unwrap();
        assert!(ok.success(), "mount a tmpfs on {}", at.display());
        SmallDisk(at.to_path_buf())
    }

    /// Fill the disk but `leave` bytes: a file written until then (or
    /// until the write fails with ENOSPC).
    fn fill(&self, leave: u64) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let block = vec![7u8; 64 << 10];
        loop {
            let free = nix_free(&self.0);
            if free <= leave {
                break;
            }
            let n = block.len().min((free - leave) as usize);
            match f.write(&block[..n]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        f.sync_all().unwrap();
        path
    }
}

/// Free bytes on the file system of `path` (root's view: every free block).
fn nix_free(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs is plain old data; all zeroes is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs(2) on a NUL-terminated path, into a struct we own.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    st.f_bfree * st.f_frsize
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The store's disk is full: each request is refused with an answer that
/// says the disk is full and what to do, nothing runs that could not be
/// audited, the server goes on answering, and once space is freed the
/// next request runs. Afterwards the trail verifies with a record for
/// every request that was answered as run.
#[test]
fn a_full_disk_refuses_requests_clearly_and_the_server_recovers() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&dir.path().join("disk"), 48 << 20);
    let repo = readable_repo(dir.path());
    let config = dir.path().join("confine.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
            disk.0.join("store").display(),
            repo.display()
        ),
    )
    .unwrap();
    let marker = format!("diskfull{}", std::process::id());
    let mut server = Server::start(&config);
    let mut ran = 0;
    let run = |server: &mut Server, code: &str| {
        server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": code}))
    };
    let r = run(&mut server, "echo first");
    assert_eq!(r["status"], "success", "{r}");
    ran += 1;

    // Room for a job (the reserve is 32 MiB) but not for its output: the
    // output stops being stored at half the reserve, the job's record is
    // written, and the answer says what was not kept.
    let filler = disk.fill(40 << 20);
    // The least free space while the job runs: sampled beside it.
    let watching = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let watcher = {
        let (at, watching) = (disk.0.clone(), watching.clone());
        std::thread::spawn(move || {
            let mut least = u64::MAX;
            while watching.load(std::sync::atomic::Ordering::Relaxed) {
                least = least.min(nix_free(&at));
                std::thread::sleep(Duration::from_millis(2));
            }
            least
        })
    };
    let r = run(&mut server, "head -c 40000000 /dev/urandom; echo done >&2");
    watching.store(false, std::sync::atomic::Ordering::Relaxed);
    let least = watcher.join().unwrap();
    let text = r.to_string();
    // Half the reserve stays free, less a chunk (1 MiB) in flight.
    assert!(least >= 15 << 20, "the job's output took the reserve: {least} bytes were free at the least");
    assert_eq!(r["status"], "success", "{text}");
    assert!(text.contains("not stored"), "the answer does not say the output was not all stored: {text}");
    assert!(!text.contains("audit record"), "the record was not written: {text}");
    ran += 1;

    // Full: nothing runs, the answer says why, the server goes on.
    disk.fill(0);
    for _ in 0..3 {
        let r = run(&mut server, &format!("echo {marker}"));
        let text = r.to_string();
        assert_ne!(r["status"], "success", "{text}");
        assert!(text.contains("disk is nearly full"), "the answer does not say the disk is full: {text}");
        assert!(text.contains("store.min_free_bytes"), "the answer does not say what to change: {text}");
        assert!(!text.contains(&format!("{marker}\\n")), "a job ran: {text}");
        let info = server.call("info", json!({}));
        assert!(info.get("error").is_none(), "the server stopped answering: {info}");
    }

    // Space again: the store was never broken, and jobs run.
    std::fs::remove_file(&filler).unwrap();
    let r = run(&mut server, "echo after");
    assert_eq!(r["status"], "success", "the server did not recover when space came back: {r}");
    assert!(r.get("error").is_none(), "{r}");
    ran += 1;
    server.stop();
    let verify = cli(&config, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&verify.stdout).to_string();
    assert!(verify.status.success(), "{said} {}", String::from_utf8_lossy(&verify.stderr));
    let records: usize = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap();
    assert_eq!(records, ran, "one record per job that ran (the refused ones found no room): {said}");
}

/// A job that fills the file system the store is on (a writable
/// workspace on the same disk, which the reserve can't keep it from):
/// its start was recorded before it ran; its end can't be, so its answer
/// is a failure that says so (never a success without a record), no
/// other job runs until that record is written, the store never enters
/// sled's failed state, and once space is freed the record is written and
/// jobs run again, without a restart. `confine exec` exits 125 for it.
#[test]
fn a_job_that_fills_the_store_s_disk_is_recorded_and_nothing_runs_until_it_is() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&dir.path().join("disk"), 48 << 20);
    let repo = readable_repo(&disk.0);
    let config = dir.path().join("confine.toml");
    let text = format!(
        "[runtime]\nenabled = true\n\n[sandbox]\nworkspace_rw = true\n\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
        disk.0.join("store").display(),
        repo.display()
    );
    std::fs::write(&config, &text).unwrap();
    let marker = format!("shareddisk{}", std::process::id());
    let run = |server: &mut Server, code: &str| {
        server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": code}))
    };
    // A job refused for want of its record is dropped 1.5 s after the
    // refusal (a debug build's pause): one let go by mistake would have
    // the time to show it ran.
    let mut server = Server::start_with(&config, {
        let mut cmd = Command::new(exe());
        cmd.env("CONFINE_TEST_LINGER_AT", "held-job-refused:1500");
        cmd
    });
    let r = run(&mut server, "echo first");
    assert_eq!(r["status"], "success", "{r}");

    // The job writes until the disk is full, then ends well.
    let r = run(&mut server, "head -c 100000000 /dev/zero > fill; echo wrote");
    let filled = r.to_string();
    assert!(nix_free(&disk.0) < 1 << 20, "the job did not fill the disk: {filled}");
    assert_eq!(r["status"], "failure", "a job without its record was answered as run well: {filled}");
    assert!(filled.contains("audit record was not written"), "{filled}");
    assert!(filled.contains("no other job runs"), "{filled}");

    // Nothing runs while the record is not written; the server answers.
    // (Its sandbox may be built meanwhile, its job held before execve:
    // the empty file it would make, which a full disk still has room
    // for, says whether it was let go.)
    for i in 0..2 {
        let r = run(&mut server, &format!("touch ran-{i}; echo {marker}"));
        let text = r.to_string();
        assert_ne!(r["status"], "success", "{text}");
        assert!(text.contains("disk is nearly full"), "{text}");
        assert!(!text.contains(&disk.0.display().to_string()), "the store's path reached the client: {text}");
        assert!(!text.contains(&format!("{marker}\\n")), "a job ran: {text}");
        assert!(!repo.join(format!("ran-{i}")).exists(), "a job ran before its start was recorded: {text}");
        let info = server.call("info", json!({}));
        assert!(info.get("error").is_none(), "the server stopped answering: {info}");
    }

    // Space again: the filler's record is written first, then jobs run.
    std::fs::remove_file(repo.join("fill")).unwrap();
    let r = run(&mut server, "echo after");
    assert_eq!(r["status"], "success", "the server did not recover when space came back: {r}");
    assert!(r.get("error").is_none(), "{r}");
    server.stop();

    // The trail: every job that ran, the filler with its real end.
    let verify = cli(&config, &["audit", "verify"]);
    let said = String::from_utf8_lossy(&verify.stdout).to_string();
    assert!(verify.status.success(), "{said}");
    let records = audit_records(&config);
    assert_eq!(records.len(), 3, "first, the filler, after: {records:?}");
    // Newest first: after, the filler, first.
    let filler = &records[1];
    assert_eq!(filler["exitCode"], 0, "{filler}");
    assert!(filler["note"].as_str().is_some_and(|n| n.starts_with("recorded late")), "{filler}");

    // The one-shot CLI: the same job, answered with exit 125.
    let exec = Command::new(exe())
        .arg("--config")
        .arg(&config)
        .args([
            "exec",
            "--repo-id",
            "demo",
            "--runtime",
            "shell",
            "--code",
            "head -c 100000000 /dev/zero > fill; echo wrote",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&exec.stderr);
    assert_eq!(exec.status.code(), Some(125), "{err}");
    assert!(err.contains("audit record was not written"), "{err}");
    // sled can't open on a full disk (it writes as it opens): the trail
    // reads, and the start becomes a record marked unfinished, once there
    // is room.
    let ls = cli(&config, &["audit", "ls"]);
    assert!(String::from_utf8_lossy(&ls.stderr).contains("disk not full"), "{ls:?}");
    std::fs::remove_file(repo.join("fill")).unwrap();
    let records = audit_records(&config);
    assert_eq!(records.len(), 4, "the CLI's job is recorded unfinished when the store opens again: {records:?}");
    assert!(records[0]["note"].as_str().is_some_and(|n| n.starts_with("unfinished")), "{}", records[0]);

    // A server that stops with a record still kept: written at shutdown
    // when there is room by then, noted as late.
    let mut server = Server::start(&config);
    let r = run(&mut server, "head -c 100000000 /dev/zero > fill; echo wrote");
    assert_eq!(r["unrecorded"], Value::Null, "MCP answers say it in status and error: {r}");
    assert_eq!(r["status"], "failure", "{r}");
    std::fs::remove_file(repo.join("fill")).unwrap();
    server.stop();
    let records = audit_records(&config);
    assert_eq!(records.len(), 5, "{records:?}");
    assert!(records[0]["note"].as_str().is_some_and(|n| n.starts_with("recorded late")), "{}", records[0]);
    assert_eq!(records[0]["exitCode"], 0, "{}", records[0]);
}

/// The server's file descriptors run out (a low RLIMIT_NOFILE, soft and
/// hard, and background jobs that hold theirs): a request that can't get
/// its fds is refused with an answer that names the limit, the server goes
/// on answering, and once the jobs end, a request runs again.
#[test]
fn running_out_of_file_descriptors_refuses_clearly_and_the_server_recovers() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), "");
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("enabled = true", "enabled = true\nmax_concurrent_jobs = 200"),
    )
    .unwrap();
    let marker = format!("fdmark{}", std::process::id());
    let mut cmd = Command::new(exe());
    // SAFETY: setrlimit(2) between fork and exec, async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            let lim = libc::rlimit { rlim_cur: 96, rlim_max: 96 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut server = Server::start_with(&config, cmd);
    // Background jobs that hold their fds: 40 are more than 96 fds hold.
    let mut held = Vec::new();
    for _ in 0..40 {
        let r = server.call(
            "runtime_execute",
            json!({"repoId": "demo", "runtime": "shell", "code": format!("sh -c 'sleep 300; true' {marker}"), "background": true}),
        );
        assert!(r["jobId"].is_string(), "{r}");
        held.push(r["jobId"].as_str().unwrap().to_string());
    }
    eventually("the jobs that could start run", Duration::from_secs(30), || !with_marker(&marker).is_empty());
    let running = with_marker(&marker).len();
    assert!(running < 40, "40 jobs ran under a limit of 96 fds");
    let refused = server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo RAN"}));
    let text = refused.to_string();
    assert_ne!(refused["status"], "success", "{text}");
    assert!(!text.contains("RAN\\n"), "the job ran: {text}");
    assert!(text.contains("out of file descriptors"), "the answer does not say what ran out: {text}");
    assert!(text.contains("RLIMIT_NOFILE soft 96, hard 96"), "the answer does not name the limit: {text}");
    assert!(text.contains("LimitNOFILE="), "the answer does not say what to raise: {text}");
    let info = server.call("info", json!({}));
    assert!(info.get("error").is_none(), "the server stopped answering: {info}");
    for id in &held {
        // Those that could not start have ended already: their kill is an
        // error or their outcome; either way the server answers.
        let k = server.call("runtime_kill", json!({"jobId": id}));
        assert!(k.is_object(), "{k}");
    }
    eventually("the held jobs end", Duration::from_secs(30), || with_marker(&marker).is_empty());
    let r = server.call("runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo after"}));
    assert_eq!(r["status"], "success", "the server did not recover when its fds came back: {r}");
    server.stop();
    let verify = cli(&config, &["audit", "verify"]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
}
