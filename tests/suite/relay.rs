//! One store, several processes: while `confine serve` holds the store,
//! the CLI's store commands are relayed to it over the store's socket
//! (`src/relay`), and see the same records; a killed server's store is
//! taken over. And the socket's trust: a client only talks to the
//! store's holder, the server only to its own uid.

use crate::common;

use std::io::{BufRead, Read};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const RUN_LIMIT: Duration = Duration::from_secs(60);

fn confine(config: &Path, args: &[&str]) -> Output {
    common::output_within(Command::new(common::bin()).arg("--config").arg(config).args(args), RUN_LIMIT)
}

/// A store and a configuration that runs the repository `t`.
struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    store: PathBuf,
    config: PathBuf,
    repo: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let repo = common::readable_repo(&root);
    let store = root.join("store");
    let config = root.join("confine.toml");
    std::fs::write(&config, common::exec_config(&store, "t", &repo)).unwrap();
    Fixture { _dir: dir, root, store, config, repo }
}

/// `confine serve`, started, holding the store and listening; killed
/// (by pid) when dropped.
struct Server {
    child: Child,
}

impl Server {
    fn start(f: &Fixture) -> Server {
        let child = Command::new(common::bin())
            .arg("--config")
            .arg(&f.config)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id().to_string();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(f.store.join("LOCK")).unwrap_or_default().trim() != pid
            || !f.store.join("serve.sock").exists()
        {
            assert!(Instant::now() < deadline, "the server never listened on the store's socket");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid, which we have not reaped.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, sig) }, 0);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn needs_sandbox() -> bool {
    if !common::is_root() {
        common::skip("confine exec needs the sandbox (run as root)");
        return false;
    }
    common::sandbox_available()
}

/// `confine exec` of `code` in repository `t`, its stdout piped.
fn spawn_exec(f: &Fixture, code: &str, stderr: Stdio) -> Child {
    Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["exec", "--repo-id", "t", "--runtime", "shell", "--timeout", "50s", "--code", code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

fn summary_artifact(err: &str) -> String {
    let line = err.lines().last().unwrap_or_default();
    line.split("artifact=")
        .nth(1)
        .unwrap_or_else(|| panic!("no artifact in {line:?}"))
        .split_whitespace()
        .next()
        .unwrap()
        .into()
}

/// The issue's case: with `confine serve` running, `exec`, `audit`,
/// `artifacts`, `memory` and `gc` work and see the same records; a second
/// server and a client of another configuration are refused, naming the
/// server; after the server's SIGKILL, the next command takes the store
/// over and finds everything the server stored.
#[test]
fn a_running_server_serves_the_cli_and_a_killed_one_is_taken_over() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let server = Server::start(&f);
    let pid = server.pid();

    // exec: the job is the server's; its output comes here, live.
    let out = confine(
        &f.config,
        &["exec", "--repo-id", "t", "--runtime", "shell", "--code", "echo relayed-out; echo relayed-err >&2"],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout(&out), "relayed-out\n");
    let err = common::stderr(&out);
    assert!(err.starts_with("relayed-err\n"), "{err}");
    assert!(err.contains("confine: success exit=0"), "{err}");
    let handle = summary_artifact(&err);
    // --repo naming a configured root is that repository; another is refused.
    let out =
        confine(&f.config, &["exec", "--repo", f.repo.to_str().unwrap(), "--runtime", "shell", "--code", "exit 3"]);
    assert_eq!(out.status.code(), Some(3), "{}", common::stderr(&out));
    let out = confine(&f.config, &["exec", "--repo", f.root.to_str().unwrap(), "--runtime", "shell", "--code", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = common::stderr(&out);
    assert!(err.contains(&format!("`confine serve` (pid {pid})")) && err.contains("[[repos]]"), "{err}");

    // audit, artifacts, memory, gc: the same records.
    let ls = confine(&f.config, &["audit", "ls", "--json"]);
    assert!(ls.status.success(), "{}", common::stderr(&ls));
    assert_eq!(common::stdout(&ls).lines().count(), 2, "{}", common::stdout(&ls));
    let verify = confine(&f.config, &["audit", "verify"]);
    assert!(common::stdout(&verify).contains("ok: 2 records, hash chain intact"), "{}", common::stdout(&verify));
    let q = confine(&f.config, &["artifacts", "query", &handle, "--terms", "relayed-out", "--json"]);
    assert!(q.status.success(), "{}", common::stderr(&q));
    let v: serde_json::Value = serde_json::from_slice(&q.stdout).unwrap();
    assert_eq!(v["matchedLines"], 1, "{v}");
    let show = confine(&f.config, &["artifacts", "show", &handle]);
    assert_eq!((common::stdout(&show).as_str(), common::stderr(&show).as_str()), ("relayed-out\n", "relayed-err\n"));
    let missing = confine(&f.config, &["artifacts", "show", "run-t-0-nothing"]);
    assert_eq!(missing.status.code(), Some(1), "{}", common::stderr(&missing));
    let mem = confine(&f.config, &["memory", "query", "--repo-id", "t", "--json"]);
    assert!(mem.status.success(), "{}", common::stderr(&mem));
    let gc = confine(&f.config, &["gc", "--json"]);
    assert!(gc.status.success(), "{}", common::stderr(&gc));
    let v: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(v["kept"], 2, "{v}");
    let export = f.root.join("export.jsonl");
    let out = confine(&f.config, &["audit", "export", "--jsonl", "-o", export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(std::fs::read_to_string(&export).unwrap().lines().count(), 2);

    // Refused, naming the server: another configuration, a second server.
    let other = f.root.join("other.toml");
    let text = std::fs::read_to_string(&f.config).unwrap().replace("enabled = true", "enabled = true\nmax_queued = 3");
    std::fs::write(&other, text).unwrap();
    let out = confine(&other, &["audit", "ls"]);
    assert_eq!(out.status.code(), Some(125));
    let err = common::stderr(&out);
    assert!(err.contains(&format!("(pid {pid})")) && err.contains("another configuration"), "{err}");
    let out = confine(&f.config, &["serve"]);
    assert!(!out.status.success());
    assert!(common::stderr(&out).contains(&format!("is in use by pid {pid}")), "{}", common::stderr(&out));

    // SIGKILL: the socket stays behind, answering nobody; the store is taken over.
    server.signal(libc::SIGKILL);
    drop(server);
    assert!(f.store.join("serve.sock").exists());
    let ls = confine(&f.config, &["audit", "ls", "--json"]);
    assert!(ls.status.success(), "after the server's SIGKILL: {}", common::stderr(&ls));
    assert_eq!(common::stdout(&ls).lines().count(), 2, "{}", common::stdout(&ls));
    let show = confine(&f.config, &["artifacts", "show", &handle, "--stream", "stdout"]);
    assert_eq!(common::stdout(&show), "relayed-out\n");
    let out = confine(&f.config, &["exec", "--repo-id", "t", "--runtime", "shell", "--code", "echo local"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout(&out), "local\n");
}

/// A client that goes away (Ctrl-C, or killed) takes its relayed job
/// with it; a server stopped with SIGTERM removes its socket.
#[test]
fn a_client_that_leaves_cancels_its_relayed_job() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let mut server = Server::start(&f);
    let mut client = spawn_exec(&f, "echo started; exec sleep 1000", Stdio::null());
    wait_started(&mut client);
    let started = Instant::now();
    client.kill().unwrap();
    client.wait().unwrap();
    let status = loop {
        if let Some(r) = audit_records(&f).first() {
            break r["status"].as_str().unwrap().to_string();
        }
        assert!(started.elapsed() < Duration::from_secs(20), "the relayed job outlived its client");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status, "cancelled");
    assert!(started.elapsed() < Duration::from_secs(20));
    // SIGTERM with a relayed job running: the job is killed and recorded
    // before the server lets go of the store, and the socket is removed.
    let mut second = spawn_exec(&f, "echo started; exec sleep 1000", Stdio::null());
    wait_started(&mut second);
    server.signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the server did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!f.store.join("serve.sock").exists(), "a server stopped with SIGTERM left its socket");
    let records = audit_records(&f);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[0]["status"], "cancelled", "{records:?}");
    second.wait().unwrap();
}

/// Wait for a spawned `exec`'s first line, `started`.
fn wait_started(client: &mut Child) {
    let mut line = String::new();
    std::io::BufReader::new(client.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
}

/// The audit records, newest first.
fn audit_records(f: &Fixture) -> Vec<serde_json::Value> {
    let ls = confine(&f.config, &["audit", "ls", "--json"]);
    assert!(ls.status.success(), "{}", common::stderr(&ls));
    common::stdout(&ls).lines().map(|l| serde_json::from_str(l).expect(l)).collect()
}

/// The attack: a process that is not the store's holder listens at the
/// store's socket. A command never sends it a request, a descriptor or
/// its configuration (which may hold tokens), and says why it stopped.
#[test]
fn a_socket_planted_in_the_store_is_never_sent_a_command() {
    let f = fixture();
    // The store exists, held by nobody.
    let out = confine(&f.config, &["audit", "ls"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let planted = UnixListener::bind(f.store.join("serve.sock")).unwrap();
    let spy = std::thread::spawn(move || {
        let (mut conn, _) = planted.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut got = Vec::new();
        let _ = conn.read_to_end(&mut got);
        got
    });
    let out = confine(&f.config, &["audit", "ls"]);
    assert_eq!(out.status.code(), Some(125), "{}", common::stdout(&out));
    let err = common::stderr(&out);
    assert!(err.contains(&format!("served by pid {}", std::process::id())), "{err}");
    assert_eq!(spy.join().unwrap(), Vec::<u8>::new(), "the planted socket was sent something");
}

/// The server answers only its own uid, in its own user namespace: a
/// process of another user that reaches the socket (the store's
/// directory loosened) gets no answer, and nothing is run for it; nor
/// does a process of the same uid in a user namespace of its own, as a
/// sandboxed job is (rootless, a job's uid outside is the server's). The
/// same client as root is answered.
#[test]
fn the_server_answers_only_its_own_uid() {
    use std::os::unix::fs::PermissionsExt;
    if !common::is_root() {
        return common::skip("a client of another uid needs root to start");
    }
    let f = fixture();
    let server = Server::start(&f);
    std::fs::set_permissions(&f.root, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&f.store, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(f.store.join("serve.sock"), std::fs::Permissions::from_mode(0o666)).unwrap();
    // A well-formed request for `audit verify`, with stdout and stderr.
    let request =
        format!(r#"{{"protocol": {}, "config": {{}}, "command": {{"Audit": "Verify"}}}}"#, confine::relay::PROTOCOL);
    let sock = f.store.join("serve.sock");
    let run = |uid: Option<u32>, userns: bool| {
        let mut cmd = Command::new(if userns { "unshare" } else { "python3" });
        if userns {
            cmd.args(["--user", "--map-root-user", "python3"]);
        }
        cmd.args(["-c", RAW_CLIENT]).arg(&sock).args([request.as_str(), "stdio"]);
        if let Some(u) = uid {
            std::os::unix::process::CommandExt::uid(&mut cmd, u);
        }
        common::output_within(&mut cmd, RUN_LIMIT)
    };
    let nobody = run(Some(65534), false);
    assert!(common::stderr(&nobody).starts_with("reply:0:\n"), "another uid was answered: {}", common::stderr(&nobody));
    assert_eq!(common::stdout(&nobody), "", "a command ran for another uid");
    let nested = run(None, true);
    assert!(
        common::stderr(&nested).starts_with("reply:0:\n"),
        "a client in another user namespace was answered: {}",
        common::stderr(&nested)
    );
    assert_eq!(common::stdout(&nested), "", "a command ran for another user namespace");
    // Root is answered (refused: its configuration is not the server's).
    let root = run(None, false);
    let err = common::stderr(&root);
    assert!(err.starts_with("reply:") && err.contains("another configuration"), "{err}");
    drop(server);
}

/// A client that stops reading its output (`confine exec … | sleep`)
/// loses the live copy after a stall, not the job: the job finishes, its
/// record and its whole artifact are stored, and the client is answered.
#[test]
fn a_client_that_stops_reading_does_not_hold_the_job() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    let mut client = spawn_exec(&f, "yes filler | head -c 10000000", Stdio::piped());
    // Held, never read: the pipe fills after 64 KiB.
    let _unread = client.stdout.take().unwrap();
    let mut stderr = client.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(40);
    let status = loop {
        if let Some(s) = client.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = client.kill();
            let _ = client.wait();
            panic!("the relayed job was held by a client that does not read");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = reader.join().unwrap();
    assert!(status.success(), "{err}");
    let handle = summary_artifact(&err);
    let ls = confine(&f.config, &["artifacts", "ls", "--json"]);
    let v: serde_json::Value = serde_json::from_str(common::stdout(&ls).lines().next().unwrap()).unwrap();
    assert_eq!(v["handle"], handle.as_str());
    assert_eq!(v["stdout"]["totalBytes"], 10_000_000, "{v}");
}

/// A client's request, sent from Python as any program could send it:
/// `request` is the JSON of `Request` (the config the server runs with is
/// in it), `fds` the descriptors passed with it. Prints `reply:<len>:<json>`
/// on stderr.
const RAW_CLIENT: &str = r#"
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
body = sys.argv[2].encode()
spec = sys.argv[3]
r, w = os.pipe()
if spec == "file":
    fds = [r, os.open(os.environ["RAW_FILE"], os.O_WRONLY), 2]
elif spec == "socket":
    pair = socket.socketpair()
    fds = [r, pair[0].fileno(), 2]
elif spec == "streams":
    fds = [r, 1, 2]
else:
    fds = {"stdio": [1, 2], "three": [w, w, w], "many": [w] * 200}[spec]
got = b""
try:
    socket.send_fds(s, [struct.pack("<I", len(body)) + body], fds)
    if os.environ.get("RAW_STOP"):
        import time
        time.sleep(1)
        s.send(bytes([int(os.environ["RAW_STOP"])]))
except (BrokenPipeError, ConnectionResetError):
    # Refused before the request was sent: closed, unanswered.
    s.close()
    s = None
while s:
    try:
        part = s.recv(65536)
    except ConnectionResetError:
        break
    if not part:
        break
    got += part
sys.stderr.write("reply:%d:%s\n" % (len(got), got[4:].decode(errors="replace")))
# The server holds no copy of the pipe's write end: with ours closed, the
# reader sees its end at once.
os.close(w)
import select
ready, _, _ = select.select([r], [], [], 5)
sys.stderr.write("eof\n" if ready and os.read(r, 1) == b"" else "held\n")
"#;

fn raw_request(f: &Fixture, command: serde_json::Value, fds: &str) -> String {
    raw_request_stopped(f, command, fds, None)
}

/// [`raw_request`], and a second later the stop byte `stop`, if any.
fn raw_request_stopped(f: &Fixture, command: serde_json::Value, fds: &str, stop: Option<u8>) -> String {
    let config = confine::config::Config::load(Some(&f.config)).unwrap();
    let request = serde_json::json!({
        "protocol": confine::relay::PROTOCOL, "cwd": f.root, "config": config, "command": command,
    });
    let mut cmd = Command::new("python3");
    cmd.args(["-c", RAW_CLIENT]).arg(f.store.join("serve.sock")).arg(request.to_string()).arg(fds);
    cmd.env("RAW_FILE", f.root.join("raw-file"));
    if let Some(b) = stop {
        cmd.env("RAW_STOP", b.to_string());
    }
    common::stderr(&common::output_within(&mut cmd, RUN_LIMIT))
}

/// Descriptors a request passes beyond the two it may are all closed, and
/// so are the two of a refused request: a client can't make the server
/// hold descriptors (a pipe's writer kept open, a table filled up).
#[test]
fn descriptors_passed_with_a_request_are_never_kept() {
    let f = fixture();
    let server = Server::start(&f);
    let verify = serde_json::json!({"Audit": "Verify"});
    let ok = raw_request(&f, verify.clone(), "stdio");
    assert!(ok.starts_with("reply:") && ok.contains("\"exit\":0"), "{ok}");
    for spec in ["three", "many"] {
        let err = raw_request(&f, verify.clone(), spec);
        assert!(err.contains("exactly two descriptors"), "{spec}: {err}");
        assert!(err.ends_with("eof\n"), "{spec}: the server kept a descriptor: {err}");
    }
    // Nothing accumulated: the server's table is as it was.
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", server.pid())).unwrap().count();
    let before = fds();
    for _ in 0..20 {
        raw_request(&f, verify.clone(), "many");
    }
    assert!(fds() <= before + 2, "{before} descriptors before, {} after", fds());
}

/// A hostile client sends what an honest one resolves on its side: a
/// `memory store --content-file` (`-` would be the server's own stdin,
/// its MCP transport; `/dev/zero` unbounded), a memory `--repo DIR`, a
/// relative `audit export -o`. Each is refused; nothing is read.
#[test]
fn a_request_the_client_did_not_resolve_is_refused() {
    let f = fixture();
    let _server = Server::start(&f);
    let repo = serde_json::json!({"repo_id": "t", "repo": null, "json": false});
    let store = |content: serde_json::Value, file: &str| {
        serde_json::json!({"Memory": {"Store": {
            "repo": repo, "memory_type": "decision", "title": "x", "content": content,
            "content_file": file, "tags": [], "confidence": null, "symbols": [], "files": [], "memory_id": null,
        }}})
    };
    for (what, command) in [
        ("-", store(serde_json::Value::Null, "-")),
        ("/dev/zero", store(serde_json::Value::Null, "/dev/zero")),
        ("/dev/zero", store(serde_json::json!("text"), "/dev/zero")),
        (
            "--repo",
            serde_json::json!({"Memory": {"Query": {
                "repo": {"repo_id": null, "repo": "/", "json": false}, "text": null, "types": [], "tags": [],
                "symbols": [], "stale_only": false, "limit": 5, "sort_by": null,
            }}}),
        ),
        ("-o", serde_json::json!({"Audit": {"Export": {"jsonl": true, "output": "relative.jsonl"}}})),
    ] {
        let err = raw_request(&f, command, "stdio");
        assert!(err.contains("must be resolved by the client"), "{what}: {err}");
    }
    assert!(!f.root.join("relative.jsonl").exists());
}

/// Clients that connect and send slowly hold neither threads nor
/// descriptors past a bound, and once they are gone the next command is
/// answered at once.
#[test]
fn slow_clients_hold_no_threads() {
    let f = fixture();
    let server = Server::start(&f);
    let count = |what: &str| std::fs::read_dir(format!("/proc/{}/{what}", server.pid())).unwrap().count();
    let (threads, fds) = (count("task"), count("fd"));
    let mut slow = Vec::new();
    for _ in 0..200 {
        let mut s = std::os::unix::net::UnixStream::connect(f.store.join("serve.sock")).unwrap();
        // Past its 64 clients the server closes a connection at once: the
        // write may then meet a closed socket.
        let _ = std::io::Write::write_all(&mut s, &[0xff, 0x00]);
        slow.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let (threads_then, fds_then) = (count("task"), count("fd"));
    assert!(threads_then <= threads + 4, "threads: {threads} before, {threads_then} with 200 slow clients");
    assert!(fds_then <= fds + 64 + 4, "descriptors: {fds} before, {fds_then} with 200 slow clients");
    drop(slow);
    let started = Instant::now();
    let out = confine(&f.config, &["audit", "verify"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
}

/// `confine run` of `script` (sh) with `extra` options, `input` on its
/// stdin and its output piped: the output, and the `--json-status`
/// outcome. Also the inode of the pipe its stdout was.
fn run_script(f: &Fixture, extra: &[&str], script: &str, input: &str) -> (Output, serde_json::Value, u64) {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;
    let status = f.root.join("run-status.json");
    let _ = std::fs::remove_file(&status);
    let mut child = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .arg("run")
        .arg("--json-status")
        .arg(&status)
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let fd = std::os::fd::AsFd::as_fd(child.stdout.as_ref().unwrap()).try_clone_to_owned().unwrap();
    let ino = std::fs::File::from(fd).metadata().unwrap().ino();
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let outcome = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    (out, outcome, ino)
}

/// Run until the server ran it in a warm sandbox (its pool builds at a
/// low priority, for the shapes it was last asked for).
fn run_warm(f: &Fixture, script: &str, input: &str) -> (Output, serde_json::Value, u64) {
    for _ in 0..100 {
        let r = run_script(f, &[], script, input);
        if r.1["layers"]["warm"] == true {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no run through the server was warm");
}

/// The outcome without what differs between any two runs (ids, times,
/// the cgroup's name) and how its sandbox was made.
fn comparable(mut outcome: serde_json::Value) -> serde_json::Value {
    for key in ["jobId", "durationMs", "startedAt", "endedAt", "usage", "wallMs"] {
        outcome.as_object_mut().unwrap().remove(key);
    }
    let layers = outcome["layers"].as_object_mut().unwrap();
    for key in ["warm", "cgroup", "cgroupPath"] {
        layers.remove(key);
    }
    outcome
}

/// With a server holding the store, `confine run` is started by it, in a
/// sandbox built ahead: the job reads the caller's stdin and writes
/// straight to the caller's own pipes (no copy in between), and the exit
/// status, the output and the `--json-status` outcome are those of the
/// same run in-process (`--no-server`), but for `layers.warm`.
#[test]
fn a_run_through_a_server_is_the_same_run_started_warm() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    let script = r#"echo out; echo err >&2; read x; echo "in:$x"; readlink /proc/self/fd/1; exit 3"#;
    let (warm, warm_outcome, warm_ino) = run_warm(&f, script, "hello\n");
    let (cold, cold_outcome, cold_ino) = run_script(&f, &["--no-server"], script, "hello\n");
    for (out, ino, how) in [(&warm, warm_ino, "through the server"), (&cold, cold_ino, "in-process")] {
        assert_eq!(out.status.code(), Some(3), "{how}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout, format!("out\nin:hello\npipe:[{ino}]\n"), "{how}");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n", "{how}");
    }
    assert_eq!(warm_outcome["layers"]["warm"], true);
    assert_eq!(cold_outcome["layers"]["warm"], false, "--no-server ran warm: {cold_outcome:#}");
    assert_eq!(comparable(warm_outcome), comparable(cold_outcome));
}

/// A stop request (SIGTERM, SIGINT) to a `confine run` whose job a server
/// started reaches the job as that signal, as in-process: its trap runs,
/// and its exit status is the command's.
#[test]
fn a_stop_reaches_the_job_a_server_started() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    run_warm(&f, "true", "");
    let script = r#"trap 'echo "got $1"; exit 7' TERM; trap 'echo got int; exit 8' INT; echo ready; while :; do sleep 0.1; done"#;
    for (sig, code, word) in [(libc::SIGTERM, 7, "got"), (libc::SIGINT, 8, "got int")] {
        for extra in [&[][..], &["--no-server"][..]] {
            let status = f.root.join("stop-status.json");
            let mut child = Command::new(common::bin())
                .arg("--config")
                .arg(&f.config)
                .args(["run", "--json-status"])
                .arg(&status)
                .args(extra)
                .args(["--", "sh", "-c", script])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
            let mut first = String::new();
            lines.read_line(&mut first).unwrap();
            assert_eq!(first, "ready\n", "{extra:?}");
            // SAFETY: kill(2) on our own child's pid, not reaped yet.
            assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
            let mut rest = String::new();
            lines.read_to_string(&mut rest).unwrap();
            let ended = child.wait().unwrap();
            assert_eq!(ended.code(), Some(code), "{extra:?} signal {sig}: {rest}");
            assert!(rest.starts_with(word), "{extra:?} signal {sig}: {rest:?}");
            let outcome: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
            assert_eq!(outcome["exitCode"], code, "{outcome:#}");
        }
    }
}

/// A client of the server's own uid that passes a file or a socket as a
/// job's stream is refused: a job gets only pipes and /dev/null, as an
/// in-process run gives it (a file could be truncated or rewritten, a
/// terminal typed into). Nothing runs, and no descriptor is kept.
#[test]
fn a_server_gives_a_job_no_file_or_socket_as_a_stream() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    std::fs::write(f.root.join("raw-file"), "").unwrap();
    let spec = confine::job::JobSpec::new(vec!["sh".into(), "-c".into(), "echo planted".into()]);
    let run = serde_json::json!({"Run": {"spec": spec, "kill_grace": {"secs": 1, "nanos": 0}}});
    for kind in ["file", "socket"] {
        let err = raw_request(&f, run.clone(), kind);
        assert!(err.contains("must be a pipe or /dev/null"), "{kind}: {err}");
        assert!(err.ends_with("eof\n"), "{kind}: the server kept a descriptor: {err}");
    }
    assert_eq!(std::fs::read_to_string(f.root.join("raw-file")).unwrap(), "", "the job ran");
    // The same request with pipes runs; one asking for the job to be held
    // before its execve (and its limits with it) runs too, not held.
    let ok = raw_request(&f, run, "streams");
    assert!(ok.contains("\"exit\":0") && ok.contains("\"run\""), "{ok}");
    let mut held = spec.clone();
    held.hold = true;
    let held = serde_json::json!({"Run": {"spec": held, "kill_grace": {"secs": 1, "nanos": 0}}});
    let ok = raw_request(&f, held, "streams");
    assert!(ok.contains("\"exit\":0") && ok.contains("\"run\""), "a held job: {ok}");
}

/// `--no-server` runs `confine exec` in this process: with the store held
/// by a server, it fails on the store's lock, naming the holder.
#[test]
fn exec_no_server_does_not_relay() {
    let f = fixture();
    let server = Server::start(&f);
    let out = confine(&f.config, &["exec", "--no-server", "--repo-id", "t", "--runtime", "shell", "--code", "true"]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = common::stderr(&out);
    assert!(err.contains(&server.pid().to_string()), "{err}");
}

/// The warm sandboxes of the server `pid` waiting (each has cgroups in
/// several hierarchies, all of one name).
fn warm_waiting(pid: u32) -> usize {
    let names: std::collections::BTreeSet<String> = common::rpc::job_cgroups(pid)
        .iter()
        .filter_map(|d| d.file_name()?.to_str()?.split('.').next().map(str::to_string))
        .filter(|n| n.starts_with("warm-"))
        .collect();
    names.len()
}

/// A server asked for jobs of two shapes in turn (`confine exec` in a
/// repository, and a `confine run` with a hostname of its own) keeps
/// sandboxes of both: with the pool
/// refilled between requests, every one of them starts warm. (A pool of
/// the last shape only would have only the other shape's sandboxes when
/// each request came.)
#[test]
fn a_server_keeps_sandboxes_warm_for_two_shapes_in_turn() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let server = Server::start(&f);
    let exec_warm = || {
        let out = confine(&f.config, &["exec", "--repo-id", "t", "--runtime", "shell", "--code", "true", "--json"]);
        let resp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        resp["outcome"]["layers"]["warm"] == true
    };
    // Another hostname: another base, so another shape than the exec's.
    let run_warm_once = || run_script(&f, &["--hostname", "other"], "true", "").1["layers"]["warm"] == true;
    // Both shapes asked for once: from now on the pool keeps one of each.
    exec_warm();
    run_warm_once();
    let refilled = || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while warm_waiting(server.pid()) < 2 {
            assert!(Instant::now() < deadline, "the pool was not refilled");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for round in 0..4 {
        refilled();
        assert!(exec_warm(), "round {round}: the exec ran cold");
        refilled();
        assert!(run_warm_once(), "round {round}: the run ran cold");
    }
}

/// The CPU weights of the server `pid`'s warm cgroups that have the cpu
/// controller, by name: 110 of 1024 (v1 `cpu.shares`) or 11 of 100 (v2
/// `cpu.weight`) for a background task's, as nice 10 against nice 0.
fn warm_weights(pid: u32) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for d in common::rpc::job_cgroups(pid) {
        let Some(name) = d.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
        if !name.starts_with("warm-") {
            continue;
        }
        for file in ["cpu.shares", "cpu.weight"] {
            if let Ok(w) = std::fs::read_to_string(d.join(file)) {
                found.push((name.clone(), w.trim().to_string()));
            }
        }
    }
    found
}

/// nice 10 does not reach across cgroups: the scheduler shares a core
/// between sibling cgroups by their weights first. So a sandbox the pool
/// builds is weighed as a background task in its cgroups, and a job that
/// takes it as any job.
#[test]
fn warm_sandboxes_are_built_at_a_background_weight_and_jobs_run_at_a_jobs() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let server = Server::start(&f);
    run_warm(&f, "true", "");
    let deadline = Instant::now() + Duration::from_secs(60);
    while warm_waiting(server.pid()) < 2 {
        assert!(Instant::now() < deadline, "the pool was not refilled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let waiting = warm_weights(server.pid());
    assert!(!waiting.is_empty(), "no warm cgroup with the cpu controller");
    assert!(waiting.iter().all(|(_, w)| w == "110" || w == "11"), "{waiting:?}");
    // A job running warm: its cgroups are weighed as any job's.
    let status = f.root.join("weight-status.json");
    let mut job = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["run", "--json-status"])
        .arg(&status)
        .args(["--", "sh", "-c", "echo started; sleep 30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(job.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert_eq!(first, "started\n");
    let running: Vec<(String, String)> =
        warm_weights(server.pid()).into_iter().filter(|(_, w)| w == "1024" || w == "100").collect();
    assert_eq!(running.len(), 1, "one job's cgroup at a job's weight: {:?}", warm_weights(server.pid()));
    // SAFETY: kill(2) on our own child's pid, not reaped yet.
    unsafe { libc::kill(job.id() as i32, libc::SIGTERM) };
    job.wait().unwrap();
    let outcome: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(outcome["layers"]["warm"], true, "{outcome:#}");
}

/// A client's `kill_grace` is its own number: one past what a clock can
/// add (or a century) is bounded by the server, which answers the stopped
/// job's outcome and goes on serving.
#[test]
fn a_clients_kill_grace_is_bounded_by_the_server() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    let spec = confine::job::JobSpec::new(vec!["sleep".into(), "20".into()]);
    let run = serde_json::json!({"Run": {"spec": spec, "kill_grace": {"secs": u64::MAX, "nanos": 0}}});
    let reply = raw_request_stopped(&f, run, "streams", Some(libc::SIGTERM as u8));
    assert!(reply.contains("\"run\"") && reply.contains("\"signal\":15"), "{reply}");
    let out = confine(&f.config, &["audit", "verify"]);
    assert!(out.status.success(), "the server stopped answering: {}", common::stderr(&out));
}

/// `echo hi | confine exec -i -e KEY=VAL …` through a running server: the
/// job gets the pipe's text and the value, and a name off the server's
/// allowlist is refused there, set here or not.
#[test]
fn a_relayed_exec_gets_piped_stdin_and_env_values_within_the_allowlist() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let text = std::fs::read_to_string(&f.config).unwrap() + "\n[sandbox]\nenv_allowlist = [\"FOO\"]\n";
    std::fs::write(&f.config, text).unwrap();
    let server = Server::start(&f);
    let exec = |extra: &[&str], input: &[u8]| {
        let mut child = Command::new(common::bin())
            .arg("--config")
            .arg(&f.config)
            .args(["exec", "-i", "--repo-id", "t", "--runtime", "shell", "--timeout", "20s"])
            .args(extra)
            .args(["--", "-c", "echo \"foo=$FOO\"; tr a-z A-Z"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut pipe, input).unwrap();
        drop(pipe);
        let (mut out, mut err) = (String::new(), String::new());
        child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        (child.wait().unwrap(), out, err)
    };
    let (status, out, err) = exec(&["-e", "FOO=bar"], b"piped through\n");
    assert!(status.success(), "{err}");
    assert_eq!(out, "foo=bar\nPIPED THROUGH\n", "{err}");
    // The server holds the store: only a relayed request could succeed.
    assert!(err.contains("confine: success exit=0"), "{err}");
    let (status, out, err) = exec(&["-e", "NOT_SET_ANYWHERE"], b"x\n");
    assert_eq!(status.code(), Some(125), "{err}");
    assert!(out.is_empty() && err.contains("NOT_SET_ANYWHERE not allowed"), "{out} / {err}");
    drop(server);
}

/// The signals that are not stops reach a job the server started, as
/// in-process: USR1's trap runs and the run goes on, USR2's ends it with
/// its own code. A relayed `exec` cancelled with Ctrl-C prints its summary
/// line, `cancelled`, and exits 130 as the in-process one does.
#[test]
fn other_signals_reach_a_relayed_job_and_a_relayed_exec_says_it_was_cancelled() {
    if !needs_sandbox() {
        return;
    }
    let f = fixture();
    let _server = Server::start(&f);
    let script =
        "trap 'echo got USR1' USR1; trap 'echo got USR2; exit 7' USR2; echo ready; while :; do sleep 0.02; done";
    let status = f.root.join("usr-status.json");
    let mut child = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["run", "--json-status"])
        .arg(&status)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    for (sig, want) in [(libc::SIGUSR1, "ready\n"), (libc::SIGUSR2, "got USR1\n")] {
        let mut line = String::new();
        lines.read_line(&mut line).unwrap();
        assert_eq!(line, want);
        // SAFETY: kill(2) on our own child's pid, not reaped yet.
        assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
    }
    let mut rest = String::new();
    lines.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "got USR2\n");
    assert_eq!(child.wait().unwrap().code(), Some(7));
    let outcome: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(outcome["exitCode"], 7, "{outcome:#}");

    let mut client = spawn_exec(&f, "echo started; exec sleep 1000", Stdio::piped());
    wait_started(&mut client);
    // SAFETY: kill(2) on our own child's pid, not reaped yet.
    assert_eq!(unsafe { libc::kill(client.id() as i32, libc::SIGINT) }, 0);
    let out = client.wait_with_output().unwrap();
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.lines().last().unwrap_or_default().starts_with("confine: cancelled"), "{err}");
    assert_eq!(audit_records(&f)[0]["status"], "cancelled");
}
