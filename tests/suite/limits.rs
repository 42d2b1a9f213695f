//! Resource limits and the whole-tree kill, on this machine's real cgroups:
//! every test runs the built `confine` binary with `--json-status` and
//! checks what a user would see — the outcome, the exit status, the host's
//! /proc and cgroup filesystem afterwards.
//!
//! Needs root (cgroups are not delegated to users here). Without it the
//! tests skip with a reason, and fail under CONFINE_REQUIRE_ISOLATION=1.

use crate::common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Tests that load the CPUs or memory run one at a time, so that one's
/// fork bomb does not skew another's CPU measurement.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

fn ready() -> bool {
    if !is_root() {
        skip("cgroup limits need root here (no delegated cgroup v2 subtree)");
        return false;
    }
    let layout = confine::sandbox::linux::cgroup::Layout::from_proc(Path::new("/proc"));
    if layout.map(|l| l.kind().is_none()).unwrap_or(true) {
        skip("no cgroup hierarchy is mounted");
        return false;
    }
    sandbox_available()
}

struct Run {
    status: ExitStatus,
    json: serde_json::Value,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    fn status(&self) -> &str {
        self.json["status"].as_str().unwrap()
    }
    fn usage(&self, key: &str) -> u64 {
        self.json["usage"][key].as_u64().unwrap()
    }
}

/// `confine run --json-status F ARGS…`, to its end.
fn run_json(args: &[&str]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let status_file = dir.path().join("status.json");
    let start = Instant::now();
    let out =
        confine().arg("run").arg("--json-status").arg(&status_file).args(args).stdin(Stdio::null()).output().unwrap();
    let elapsed = start.elapsed();
    let json = std::fs::read(&status_file)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_else(|e| panic!("no --json-status ({e}); stderr: {}", stderr(&out)));
    Run { status: out.status, json, stdout: stdout(&out), stderr: stderr(&out), elapsed }
}

/// `confine run ARGS…` in the background, output discarded.
fn spawn(args: &[&str], json: Option<&Path>) -> Child {
    let mut cmd = confine();
    cmd.arg("run");
    if let Some(j) = json {
        cmd.arg("--json-status").arg(j);
    }
    cmd.args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
}

/// A number no other process on the host has on its command line:
/// `sleep <marker>` is then findable in the host's /proc.
fn marker(n: u32) -> String {
    format!("{}.{}", 1000 + n, std::process::id())
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout * slow(), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Host pids of `sleep <marker>` processes (not of the shells or the
/// confine whose command lines merely mention it).
fn sleepers(marker: &str) -> Vec<u32> {
    host_pids_with(marker)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep"))
        .collect()
}

fn assert_no_survivors(marker: &str) {
    let left = sleepers(marker);
    assert!(left.is_empty(), "processes with {marker} survived: {left:?}");
}

#[test]
fn fork_bomb_is_contained_and_the_host_stays_responsive() {
    if !ready() {
        return;
    }
    let _g = heavy();
    let tok = token("forkbomb");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    // Every process loops forking; $0 (the token) marks them all on the host.
    let timeout = format!("{}s", 4 * slow());
    let mut child = spawn(
        &[
            "--pids",
            "64",
            "--timeout",
            &timeout,
            "--kill-grace",
            "1s",
            "--",
            "sh",
            "-c",
            "b(){ while :; do b & done; }; b",
            &tok,
        ],
        Some(&json),
    );
    let start = Instant::now();
    // While it rages, the host still starts processes promptly.
    let prompt = Duration::from_secs(slow().into());
    for _ in 0..5 {
        let t = Instant::now();
        assert!(Command::new("/bin/true").status().unwrap().success());
        assert!(t.elapsed() < prompt, "host unresponsive: /bin/true took {:?}", t.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = child.wait().unwrap();
    assert!(start.elapsed() < Duration::from_secs(15) * slow(), "the run did not end");
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let peak = out["usage"]["pidsPeak"].as_u64().unwrap();
    assert!((8..=64).contains(&peak), "pids peak {peak} (limit 64): {out}");
    assert!(status.code().is_some(), "confine itself died: {status:?}");
    assert_eq!(out["limits"]["pids"], 64);
    assert_no_survivors(&tok);
}

#[test]
fn memory_limit_ends_as_oom_with_137() {
    if !ready() {
        return;
    }
    if !Path::new("/usr/bin/perl").exists() {
        skip("perl is needed to allocate 1 GiB at once");
        return;
    }
    let _g = heavy();
    let r = run_json(&["--memory", "64M", "--", "perl", "-e", "$x = 'a' x (1 << 30); print length($x)"]);
    assert_eq!(r.status(), "oom", "{}\n{}", r.json, r.stderr);
    assert_eq!(r.status.code(), Some(137));
    assert_eq!(r.stderr.trim().lines().count(), 1, "one line: {}", r.stderr);
    assert!(r.stderr.contains("out of memory") && r.stderr.contains("64M"), "{}", r.stderr);
    // cgroup v2 counts a peak from Linux 5.19 (`memory.peak`); before it a
    // v2 job's peak is not measured, and the outcome says null, not 0.
    let layer = r.json["layers"]["cgroup"].as_str().unwrap_or_default();
    if layer.starts_with("v2") && kernel_version() < (5, 19) {
        assert!(r.json["usage"]["peakMemoryBytes"].is_null(), "{}", r.json);
    } else {
        let peak = r.usage("peakMemoryBytes");
        assert!(peak > 32 << 20 && peak <= 65 << 20, "peak {peak}");
    }
    assert_eq!(r.json["limits"]["memoryBytes"], 64 << 20);
    assert!(r.stdout.is_empty());
}

#[test]
fn cpu_quota_gives_about_half_a_core() {
    if !ready() {
        return;
    }
    let _g = heavy();
    let r = run_json(&["--cpus", "0.5", "--timeout", "3s", "--", "sh", "-c", "while :; do :; done"]);
    assert_eq!(r.status(), "timeout", "{}", r.json);
    let cpu = (r.usage("cpuUserMs") + r.usage("cpuSysMs")) as f64;
    let wall = r.json["durationMs"].as_u64().unwrap() as f64;
    let share = cpu / wall;
    // The quota is a ceiling (50 ms per 100 ms period): a free hog takes
    // 0.50. The floor only shows it ran, and allows for a busy host.
    assert!((0.2..=0.6).contains(&share), "used {share:.2} of a core ({cpu} ms CPU in {wall} ms)");
}

#[test]
fn cpu_time_limit_ends_as_timeout() {
    if !ready() {
        return;
    }
    let _g = heavy();
    // The wall-clock timeout is only the backstop: long enough for a
    // second of CPU on a loaded, emulated guest.
    let backstop = format!("{}s", 20 * slow());
    let r = run_json(&["--cpu-time", "1s", "--timeout", &backstop, "--", "sh", "-c", "while :; do :; done"]);
    assert_eq!(r.status(), "timeout", "{}", r.json);
    assert_eq!(r.status.code(), Some(124));
    assert!(r.stderr.contains("CPU time limit of 1s"), "{} / {}", r.stderr, r.json);
    let cpu = r.usage("cpuUserMs") + r.usage("cpuSysMs");
    assert!((900..3000).contains(&cpu), "{cpu} ms of CPU");
    assert!(r.elapsed < Duration::from_secs(10) * slow(), "{:?}", r.elapsed);
}

#[test]
fn timeout_ends_sleep_near_one_second() {
    if !ready() {
        return;
    }
    let r = run_json(&["--timeout", "1s", "--", "sleep", "100"]);
    assert_eq!(r.status(), "timeout", "{}", r.json);
    assert_eq!(r.status.code(), Some(124));
    assert!(
        r.elapsed >= Duration::from_millis(950) && r.elapsed < Duration::from_millis(2500) * slow(),
        "{:?}",
        r.elapsed
    );
    assert_eq!(r.stderr.trim(), "confine: timed out after 1s; the job was stopped");
    assert_eq!(r.json["limits"]["timeoutMs"], 1000);
}

/// Prints how many `sleep` processes the job's pid namespace holds.
const COUNT_SLEEPERS: &str =
    "n=0; for p in /proc/[0-9]*; do [ \"$(cat $p/comm 2>/dev/null)\" = sleep ] && n=$((n+1)); done; echo $n";

#[test]
fn double_fork_and_setsid_die_after_exit_and_after_timeout() {
    if !ready() {
        return;
    }
    // Normal exit: the main process leaves an orphan in a new session.
    let m = marker(1);
    let script = format!("(setsid sleep {m} &); sleep 0.2; {COUNT_SLEEPERS}");
    let r = run_json(&["--", "sh", "-c", &script]);
    assert_eq!(r.status(), "success", "{}\n{}", r.json, r.stderr);
    assert_eq!(r.stdout.trim(), "1", "the orphan ran");
    assert_no_survivors(&m);

    // Timeout.
    let m = marker(2);
    let r = run_json(&["--timeout", "1s", "--", "sh", "-c", &format!("(setsid sleep {m} &); sleep 100")]);
    assert_eq!(r.status(), "timeout", "{}", r.json);
    assert_no_survivors(&m);
}

#[test]
fn stopped_processes_are_killed() {
    if !ready() {
        return;
    }
    // A SIGSTOPped child, and a main process that stops itself (so SIGTERM
    // can't end it): only the tree kill after the grace period does.
    let m = marker(3);
    let script = format!("sleep {m} & kill -STOP $!; kill -STOP $$");
    let r = run_json(&["--timeout", "1s", "--kill-grace", "1s", "--", "sh", "-c", &script]);
    assert_eq!(r.status(), "timeout", "{}", r.json);
    assert_eq!(r.status.code(), Some(124));
    assert!(r.elapsed < Duration::from_secs(5) * slow(), "{:?}", r.elapsed);
    assert_no_survivors(&m);
}

#[test]
fn a_grandchild_holding_stdout_does_not_hang_confine() {
    if !ready() {
        return;
    }
    let m = marker(4);
    let script = format!("(setsid sleep {m} &); echo done");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // output() reads stdout to EOF: a surviving grandchild would hold it.
        let out = confine().args(["run", "--", "sh", "-c", &script]).stdin(Stdio::null()).output();
        let _ = tx.send(out);
    });
    let out =
        rx.recv_timeout(Duration::from_secs(20) * slow()).expect("confine hung on a grandchild's stdout").unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "done");
    assert_no_survivors(&m);
}

#[test]
fn sigterm_to_confine_cancels_and_kills_the_tree() {
    if !ready() {
        return;
    }
    let m = marker(5);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    // The job ignores SIGTERM: only the tree kill after the grace ends it.
    let script = format!("trap '' TERM; (setsid sleep {m} &); sleep {m}");
    let mut child = spawn(&["--kill-grace", "1s", "--", "sh", "-c", &script], Some(&json));
    wait_until("the job to start", Duration::from_secs(10), || sleepers(&m).len() >= 2);
    let t = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4) * slow(), "{took:?}");
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(out["status"], "cancelled", "{out}");
    assert_eq!(status.code(), Some(137), "killed by SIGKILL after the grace");
    assert_no_survivors(&m);
}

#[test]
fn no_cgroup_is_left_after_100_runs() {
    if !ready() {
        return;
    }
    let mut ids = Vec::new();
    for _ in 0..100 {
        let r = run_json(&["--memory", "64M", "--cpus", "1", "--pids", "32", "--", "/bin/true"]);
        assert_eq!(r.status(), "success", "{}\n{}", r.json, r.stderr);
        assert_eq!(r.json["layers"]["cgroup"].as_str().map(|s| s.starts_with('v')), Some(true), "{}", r.json);
        ids.push(r.json["jobId"].as_str().unwrap().to_string());
    }
    let left = cgroup_dirs(&|name| ids.iter().any(|id| name.starts_with(id.as_str())));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `confine exec` removes its job's cgroups on another thread, beside the
/// output's seal and the audit append, and waits for them before it
/// answers: the process must not exit before they are gone, nor leave
/// the job's escapees alive.
#[test]
fn a_governed_job_leaves_no_cgroup_and_no_process() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("repo")).unwrap();
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, exec_config(&dir.path().join("store"), "t", &dir.path().join("repo"))).unwrap();
    for i in 0..10 {
        let m = marker(20 + i);
        let code = format!("setsid sleep {m} & sleep {m} & echo started");
        let child = confine()
            .arg("--config")
            .arg(&config)
            .args(["exec", "--repo-id", "t", "--runtime", "shell", "--code", &code])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
        // Named <job-id>.<supervisor pid>.<start time>; checked the moment
        // the supervisor has exited, before any other start could clean up.
        let left = cgroup_dirs(&|name| name.split('.').nth(1) == Some(pid.as_str()));
        assert!(left.is_empty(), "exec {i} left cgroups behind: {left:?}");
        assert_no_survivors(&m);
    }
}

#[test]
fn a_crashed_supervisors_cgroups_are_removed_at_next_start() {
    if !ready() {
        return;
    }
    let (m1, m2) = (marker(6), marker(7));
    let mut child = spawn(&["--", "sh", "-c", &format!("sleep {m1} & sleep {m2}")], None);
    let pid = child.id().to_string();
    wait_until("the job to start", Duration::from_secs(10), || !sleepers(&m1).is_empty() && !sleepers(&m2).is_empty());
    // Its job cgroups are named <job-id>.<supervisor pid>.<start time>.
    let owned_by = |name: &str| name.split('.').nth(1) == Some(pid.as_str());
    let dirs = cgroup_dirs(&owned_by);
    assert!(!dirs.is_empty(), "no job cgroup found for supervisor {pid}");

    child.kill().unwrap(); // SIGKILL: no cleanup of its own
    child.wait().unwrap();
    // The next supervisor start (any run) cleans up.
    let r = run_json(&["--", "/bin/true"]);
    assert_eq!(r.status(), "success", "{}", r.stderr);
    let left: Vec<&PathBuf> = dirs.iter().filter(|d| d.exists()).collect();
    assert!(left.is_empty(), "stale cgroups left: {left:?}");
    wait_until("the crashed job's processes to die", Duration::from_secs(2), || {
        sleepers(&m1).is_empty() && sleepers(&m2).is_empty()
    });
}

#[test]
fn bad_limits_are_clear_errors() {
    let out = confine().args(["run", "--memory", "12X", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("e.g. 256M"), "{}", stderr(&out));
    let out = confine().args(["run", "--timeout", "soon", "--", "true"]).output().unwrap();
    assert!(stderr(&out).contains("e.g. 30s"), "{}", stderr(&out));
    let out = confine().args(["run", "--cpus", "0", "--", "true"]).output().unwrap();
    assert!(stderr(&out).contains("between 0.01"), "{}", stderr(&out));
    if !ready() {
        return;
    }
    let out = confine().args(["run", "--cgroup-parent", "relative", "--pids", "5", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("absolute cgroup path"), "{}", stderr(&out));
}

#[test]
fn the_config_sets_the_cgroup_parent_and_the_flag_wins() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("confine.toml");
    let repo = dir.path().display();
    // (The policy's deadline is not this test's subject: ten times the
    // default, for an emulated guest.)
    let text = format!(
        "[runtime]\nenabled = true\n{}[store]\npath = \"{repo}/store\"\n[sandbox]\ncgroup_parent = \"not/absolute\"\n[[repos]]\nid = \"r\"\nroot = \"{repo}\"\n\
         [policy]\ntimeout_ms = 10000\n",
        degraded_runtime()
    );
    std::fs::write(&config, text).unwrap();
    let cfg = config.to_str().unwrap();
    // The config's parent is used (and this one is refused, naming the key)...
    let out = confine().args(["--config", cfg, "run", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("sandbox.cgroup_parent"), "{}", stderr(&out));
    assert!(stderr(&out).contains("not/absolute"), "{}", stderr(&out));
    // The governed path reads it too.
    let out = confine()
        .args(["--config", cfg, "exec", "--repo-id", "r", "--runtime", "shell", "--code", "true"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("sandbox.cgroup_parent"), "{}", stderr(&out));
    // ...unless the flag names another ("/": the hierarchies' roots, which
    // only an explicit choice may pick).
    let out = confine().args(["--config", cfg, "run", "--cgroup-parent", "/", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}
