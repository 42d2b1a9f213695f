//! Small things a user trips over (issue 54, item 12), each against the
//! real binary: addresses written as people write them, `-` for stdout, a
//! hostname checked before anything starts, the OS's words for a missing
//! file, hints that name the flag given, completions that know the values.

use crate::common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A config with execution enabled and its own store (never the user's).
fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let repo = readable_repo(dir);
    let config = dir.join("confine.toml");
    std::fs::write(&config, exec_config(&dir.join("store"), "demo", &repo)).unwrap();
    config
}

/// The address `confine serve --http ADDR --no-token` says it listens on.
fn listening_on(addr: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let mut child = Command::new(bin())
        .arg("--config")
        .arg(&config)
        .args(["serve", "--http", addr, "--no-token"])
        .env("XDG_RUNTIME_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split("streamable HTTP at http://").nth(1) {
                let _ = tx.send(Ok(rest.split("/mcp").next().unwrap_or_default().to_string()));
                return;
            }
            said.push_str(&line);
            said.push('\n');
        }
        let _ = tx.send(Err(said));
    });
    let got = rx.recv_timeout(Duration::from_secs(30) * slow());
    let _ = child.kill();
    let _ = child.wait();
    match got {
        Ok(Ok(addr)) => addr,
        other => panic!("--http {addr}: no address printed: {other:?}"),
    }
}

/// `:PORT` and `localhost:PORT` as people write them; both loopback,
/// never every interface.
#[test]
fn http_addresses_without_a_host_or_with_localhost_listen_on_loopback() {
    for given in [":0", "localhost:0"] {
        let addr = listening_on(given);
        assert!(addr.starts_with("127.0.0.1:"), "--http {given} listens on {addr}");
    }
    let out = Command::new(bin()).args(["serve", "--http", "example.com:80"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("IP:PORT, localhost:PORT or :PORT"), "{}", stderr(&out));
    let help = Command::new(bin()).args(["serve", "--help"]).output().unwrap();
    assert!(stdout(&help).contains("loopback"), "{}", stdout(&help));
}

/// `--json-status -`: the outcome on stdout, after the job's output, and
/// no file named `-`.
#[test]
fn json_status_dash_writes_the_outcome_to_stdout() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = confine()
        .current_dir(dir.path())
        .args(["run", "--json-status", "-", "--", "/bin/echo", "from the job"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    let json = text.strip_prefix("from the job\n").unwrap_or_else(|| panic!("job output first: {text}"));
    let outcome: serde_json::Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(outcome["exitCode"], 0, "{outcome}");
    assert!(!dir.path().join("-").exists(), "a file named '-' was written");
}

/// A hostname the kernel or RFC 1123 would refuse is a usage error (2),
/// before any sandbox is made.
#[test]
fn hostname_is_checked_as_a_usage_error() {
    let long = "a".repeat(65);
    for bad in ["bad_host", "-lead", "a..b", "", long.as_str()] {
        let out = run(&[&format!("--hostname={bad}"), "--", "/bin/true"]);
        assert_eq!(out.status.code(), Some(2), "--hostname {bad:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("invalid hostname"), "{}", stderr(&out));
    }
    if !sandbox_available() {
        return;
    }
    let out = run(&["--hostname", "build-1.ci", "--", "/bin/hostname"]);
    assert_eq!(stdout(&out), "build-1.ci\n", "{}", stderr(&out));
}

/// A missing file is named with the OS's words, as every other one is,
/// never Rust's `entity not found`.
#[test]
fn a_missing_file_is_named_with_no_such_file_or_directory() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let missing = dir.path().join("missing.py");
    let m = missing.to_str().unwrap();
    let c = config.to_str().unwrap();
    for args in [
        vec!["--config", c, "exec", "--repo-id", "demo", "--runtime", "python", "--code-file", m],
        vec!["--config", c, "exec", "--repo-id", "demo", "--runtime", "python", "--stdin-file", m, "--code", "1"],
        vec!["--config", c, "run", "--env-file", m, "--", "/bin/true"],
    ] {
        let out = confine().args(&args).stdin(Stdio::null()).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(m) && err.contains("No such file or directory"), "{args:?}: {err}");
        assert!(!err.contains("entity not found"), "{args:?}: {err}");
    }
    // A repository root that is gone: no host path to name to an MCP
    // client, the OS's words still.
    let gone = dir.path().join("gone.toml");
    let text = format!(
        "[store]\npath = \"{}\"\n\n[[repos]]\nid = \"gone\"\nroot = \"{}\"\n",
        dir.path().join("store-gone").display(),
        dir.path().join("gone").display()
    );
    std::fs::write(&gone, text).unwrap();
    let out = confine().arg("--config").arg(&gone).args(["memory", "sync", "--repo-id", "gone"]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("the repository root is unavailable: No such file or directory"), "{err}");
}

/// `exec --repo FILE`: the hint names `--repo`, not `[[repos]]` of a
/// configuration the user never wrote.
#[test]
fn exec_repo_naming_a_file_says_repo() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    std::fs::write(dir.path().join("afile"), "x").unwrap();
    let out = confine()
        .current_dir(dir.path())
        .arg("--config")
        .arg(&config)
        .args(["exec", "--repo", "./afile", "--runtime", "python", "--code", "print(1)"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("--repo ./afile: not a directory"), "{err}");
    assert!(!err.contains("[[repos]]"), "{err}");
}

/// Completion scripts offer the runtimes and the network modes.
#[test]
fn completions_offer_runtimes_and_network_modes() {
    let out = Command::new(bin()).args(["completions", "bash"]).output().unwrap();
    let script = stdout(&out);
    for (flag, words) in [("--runtime", "node typescript python"), ("--net", "none host allow:")] {
        let case = script.split(&format!("{flag})")).nth(1).unwrap_or_else(|| panic!("no case for {flag}"));
        let case = case.split(";;").next().unwrap_or_default();
        assert!(case.contains(words), "{flag} completes: {case}");
    }
    // Offered, not enforced by the parser: an unknown runtime is still the
    // pipeline's to refuse (and audit), with the list.
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let out = confine()
        .arg("--config")
        .arg(&config)
        .args(["exec", "--repo-id", "demo", "--runtime", "pyth", "--code", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("unknown runtime 'pyth'"), "{}", stderr(&out));
}

/// `confine serve` over stdio, spoken to in raw lines (a broken one too).
struct StdioServer {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    /// The server's lines, read by a thread: a line that never comes is a
    /// failure after a while, not a hang.
    lines: std::sync::mpsc::Receiver<String>,
    config: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl StdioServer {
    fn start() -> StdioServer {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut child = Command::new(bin())
            .arg("--config")
            .arg(&config)
            .arg("serve")
            .envs(degraded_env())
            .env("XDG_DATA_HOME", dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut s = StdioServer { child, stdin, lines, config, dir };
        s.line(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"papercuts","version":"1"}}}"#);
        s.read();
        s.line(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        s
    }

    fn line(&mut self, text: &str) {
        use std::io::Write;
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{text}").unwrap();
        stdin.flush().unwrap();
    }

    /// The next line the server writes, as the client reads it.
    fn read(&mut self) -> String {
        match self.lines.recv_timeout(Duration::from_secs(20) * slow()) {
            Ok(line) => line,
            Err(e) => panic!("no line from the server: {e}"),
        }
    }

    /// The answer line to `tools/call name(arguments)` (`id` 1 and up).
    fn call(&mut self, id: u64, name: &str, arguments: serde_json::Value) -> String {
        let req = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": name, "arguments": arguments}});
        self.line(&req.to_string());
        loop {
            let line = self.read();
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return line;
            }
        }
    }

    /// The server's store, after it stopped: `confine audit export`.
    fn audit_after_stop(mut self) -> Vec<serde_json::Value> {
        drop(self.stdin.take());
        let _ = self.child.wait();
        let out = Command::new(bin())
            .arg("--config")
            .arg(&self.config)
            .args(["audit", "export", "--jsonl"])
            .env("XDG_DATA_HOME", self.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for StdioServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A line that is not JSON gets a parse error, and the session goes on;
/// JSON of another shape gets rmcp's invalid request.
#[test]
fn stdio_answers_a_garbage_line_with_a_parse_error() {
    let mut s = StdioServer::start();
    s.line("this is not json");
    let v: serde_json::Value = serde_json::from_str(&s.read()).unwrap();
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().starts_with("Parse error"), "{v}");
    s.line(r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#);
    let v: serde_json::Value = serde_json::from_str(&s.read()).unwrap();
    assert_eq!(v["id"], 7, "the session goes on: {v}");
}

/// `info` is the first call of every session: small, with what an agent
/// needs; the rest behind `verbose`.
#[test]
fn info_answers_in_under_2_kb_and_verbose_has_the_rest() {
    let mut s = StdioServer::start();
    let line = s.call(1, "info", serde_json::json!({}));
    assert!(line.len() < 2048, "info is {} bytes: {line}", line.len());
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let info = &v["result"]["structuredContent"];
    for key in ["version", "backend", "runtimeEnabled", "runtimes", "limits"] {
        assert!(info.get(key).is_some(), "{key}: {info}");
    }
    assert!(info["limits"]["envAllowlist"].is_array(), "{info}");
    assert!(info["layers"]["fullIsolation"].is_boolean(), "{info}");
    let text = v["result"]["content"][0]["text"].as_str().unwrap();
    assert!(!text.starts_with('{'), "the text is a rendering, not the JSON again: {text}");
    let verbose = s.call(2, "info", serde_json::json!({"verbose": true}));
    let v: serde_json::Value = serde_json::from_str(&verbose).unwrap();
    let info = &v["result"]["structuredContent"];
    assert!(info["guarantees"]["filesystem"]["level"].is_string(), "{info}");
    assert!(info["policyDigest"].is_string(), "{info}");
    eprintln!("info: {} bytes, verbose: {} bytes", line.len(), verbose.len());
}

/// A denial carries the hash of its audit record, as the record has it.
#[test]
fn a_denial_carries_its_audit_hash() {
    let mut s = StdioServer::start();
    let args = serde_json::json!({"repoId": "demo", "runtime": "python", "code": "print(1)", "network": {"allow": ["example.com"]}});
    let v: serde_json::Value = serde_json::from_str(&s.call(1, "runtime_execute", args)).unwrap();
    let r = &v["result"]["structuredContent"];
    assert_eq!(r["status"], "denied", "{v}");
    let hash = r["policyDecision"]["auditHash"].as_str().unwrap_or_else(|| panic!("no auditHash: {v}")).to_string();
    assert_eq!(hash.len(), 64, "{hash}");
    let records = s.audit_after_stop();
    assert!(records.iter().any(|rec| rec["auditHash"] == hash && rec["status"] == "denied"), "{records:?}");
}

/// `runtime_kill` answers `killed`, and the audit record says the same.
#[test]
fn runtime_kill_and_its_audit_record_agree() {
    if !sandbox_available() {
        return;
    }
    let mut s = StdioServer::start();
    let args = serde_json::json!({"repoId": "demo", "runtime": "shell", "code": "sleep 30", "background": true});
    let v: serde_json::Value = serde_json::from_str(&s.call(1, "runtime_execute", args)).unwrap();
    let job = v["result"]["structuredContent"]["jobId"].as_str().unwrap_or_else(|| panic!("{v}")).to_string();
    std::thread::sleep(Duration::from_millis(300));
    let v: serde_json::Value =
        serde_json::from_str(&s.call(2, "runtime_kill", serde_json::json!({"jobId": job}))).unwrap();
    assert_eq!(v["result"]["structuredContent"]["status"], "killed", "{v}");
    let listed: serde_json::Value = serde_json::from_str(&s.call(3, "runtime_jobs", serde_json::json!({}))).unwrap();
    assert_eq!(listed["result"]["structuredContent"]["jobs"][0]["status"], "killed", "{listed}");
    let records = s.audit_after_stop();
    let rec = records.iter().find(|r| r["id"] == job).unwrap_or_else(|| panic!("no record of {job}: {records:?}"));
    assert_eq!(rec["status"], "killed", "{rec}");
}

/// `confine serve --http 127.0.0.1:0 --no-token`, killed on drop.
struct Http {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Http {
    fn start() -> Http {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path());
        let mut child = Command::new(bin())
            .arg("--config")
            .arg(&config)
            .args(["serve", "--http", "127.0.0.1:0", "--no-token"])
            .env("XDG_RUNTIME_DIR", dir.path())
            .env("XDG_DATA_HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("streamable HTTP at http://").nth(1) {
                    let _ = tx.send(rest.split("/mcp").next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(30) * slow()).expect("no address printed");
        Http { child, addr, _dir: dir }
    }

    /// Status and body of a POST to /mcp with `content_type`.
    fn post(&self, content_type: &str, body: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: {content_type}\r\nAccept: application/json, \
             text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        s.write_all(req.as_bytes()).unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }
}

impl Drop for Http {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Malformed JSON over HTTP: 400 and a JSON-RPC parse error (not 415,
/// which says the type was wrong); JSON of another shape: 400 and an
/// invalid request; a body of another type is still 415.
#[test]
fn http_answers_malformed_json_with_400_and_a_parse_error() {
    let server = Http::start();
    let (status, body) = server.post("application/json", "{\"jsonrpc\": \"2.0\", oops");
    assert_eq!(status, 400, "{body}");
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["error"]["code"], -32700, "{v}");
    assert_eq!(v["jsonrpc"], "2.0", "{v}");
    let (status, body) = server.post("application/json; charset=utf-8", "{\"not\": \"a message\"}");
    assert_eq!(status, 400, "{body}");
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["error"]["code"], -32600, "{v}");
    assert_eq!(server.post("text/plain", "hello").0, 415);
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    assert_eq!(server.post("application/json", init).0, 200);
}
