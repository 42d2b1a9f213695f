//! Faults through `confine serve` (stdio):
//! - the server killed with SIGKILL while its jobs run and write output:
//!   no process of the jobs outlives it, the next server's start removes
//!   the job cgroups it left, the store opens, the audit trail verifies and
//!   no artifact reads back half-written;
//! - a remote OPA that is down, slow past `policy.timeout_ms`, or answers
//!   garbage: each request is a denial that says why, and the server goes
//!   on answering.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
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

fn cli(config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(exe()).arg("--config").arg(config).args(args).output().unwrap()
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
        // Its init stages die with it (parent-death signal), and with them
        // every process of the jobs' pid namespaces.
        eventually(&format!("round {round}: the jobs die with their server"), Duration::from_secs(10), || {
            with_marker(&marker).is_empty()
        });
        // The next server's start removes what the dead one left.
        let mut next = Server::start(&config);
        let info = next.call("info", json!({}));
        assert!(info.get("error").is_none(), "{info}");
        eventually(&format!("round {round}: the dead server's cgroups are swept"), Duration::from_secs(10), || {
            job_cgroups(pid).is_empty()
        });
        next.stop();
    }
    // The store: the trail verifies, and every artifact listed reads whole
    // or is refused, never half.
    let verify = cli(&config, &["audit", "verify"]);
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
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
