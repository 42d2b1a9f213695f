//! Classes that cross the governed pipeline and the MCP server: executables
//! and `#!` lines (2), sessions and repositories kept apart (10), HTTP
//! tokens (11), and what the policy sees (12); and class 1's governance
//! side, the files the memory tools read and write in a repository.

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A scratch deployment: a repository, a store and a confine.toml with
/// execution enabled, all in one temp dir (0755, so a job's uid can enter).
struct Gov {
    dir: tempfile::TempDir,
    repo: PathBuf,
    config: PathBuf,
}

impl Gov {
    fn new(extra: &str) -> Gov {
        Gov::in_dir(tempfile::tempdir().unwrap(), extra)
    }

    /// Outside /tmp: the sandbox mounts a private /tmp over the host's, so
    /// a host directory under /tmp bound into a job would be hidden, and
    /// an exposure would go unseen.
    fn outside_tmp(extra: &str) -> Gov {
        Gov::in_dir(tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(), extra)
    }

    fn in_dir(dir: tempfile::TempDir, extra: &str) -> Gov {
        let repo = readable_repo(dir.path());
        let config = dir.path().join("confine.toml");
        // The policy's deadline is not what these tests are about: it is
        // ten times the default, so that they hold in an emulated VM guest
        // (`./dev vm-test`), where an evaluation takes ten times longer.
        let deadline = "\n[policy]\ntimeout_ms = 10000\n";
        std::fs::write(&config, exec_config(&dir.path().join("store"), "demo", &repo) + extra + deadline).unwrap();
        Gov { dir, repo, config }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `confine --config <ours> exec --json ARGS…`, within a minute.
    fn exec_json(&self, args: &[&str]) -> (serde_json::Value, Output) {
        let mut cmd = confine();
        cmd.arg("--config").arg(&self.config).args(["exec", "--json"]).args(args);
        let out = output_within(&mut cmd, Duration::from_secs(60));
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: stdout {} stderr {}", stdout(&out), stderr(&out)));
        (v, out)
    }
}

fn manifest(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

// ---------------------------------------------------------------------------
// Class 12: the policy sees only the executable's name.
// ---------------------------------------------------------------------------

/// With the example policy that reads code and arguments, `sh -c curl`,
/// code that calls curl or wget, and code too long to be read whole are
/// denied by name; ordinary code still runs.
#[test]
fn class12_the_policy_sees_the_code_and_the_arguments() {
    if !is_root() && !sandbox_available() {
        return;
    }
    let policy = manifest("policies/examples/no-network-tools.rego");
    let g = Gov::new(&format!("\n[[policy.evaluators]]\npath = \"{}\"\n", policy.display()));
    let denied = [
        vec!["--runtime", "shell", "--", "-c", "curl -s http://example.org"],
        vec!["--runtime", "shell", "--code", "wget -q -O- http://example.org"],
        vec!["--runtime", "python", "--code", "import subprocess\nsubprocess.run(['curl', 'http://x'])\n"],
        vec!["--runtime", "shell", "--code", "X=/usr/bin/curl; $X http://x"],
    ];
    for args in &denied {
        let mut all = vec!["--repo-id", "demo"];
        all.extend_from_slice(args);
        let (v, out) = g.exec_json(&all);
        assert_eq!(v["status"], "denied", "{args:?}: {v}\n{}", stderr(&out));
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains("network tool"), "{args:?}: the denial names the rule: {error}");
    }
    // Code longer than the policy can read whole is refused by this policy.
    let long = format!("# {}\necho hi\n", "x".repeat(70 * 1024));
    let (v, _) = g.exec_json(&["--repo-id", "demo", "--runtime", "shell", "--code", &long]);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(v["error"].as_str().unwrap_or_default().contains("64 KiB"), "{v}");
    // Names that merely contain the word pass.
    let (v, out) = g.exec_json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo curling-stone"]);
    assert_eq!(v["status"], "success", "{v}\n{}", stderr(&out));
}

// ---------------------------------------------------------------------------
// Class 2: an executable and its `#!` line chosen by a repository.
// ---------------------------------------------------------------------------

/// A secret directory outside every repository, holding an executable
/// file (what the old `#!` parser needed to bind its directory) and a
/// token; and a repository file named like the runtime whose `#!` line
/// names the secret through `env -S -u`.
fn plant_shebang_attack(g: &Gov) -> (PathBuf, PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let secret = g.path("secret");
    std::fs::create_dir(&secret).unwrap();
    let token = token("class02");
    std::fs::write(secret.join("token.txt"), &token).unwrap();
    std::fs::write(secret.join("file"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(secret.join("file"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = g.repo.join("python3");
    let s = secret.display();
    std::fs::write(&script, format!("#!/usr/bin/env -S -u {s}/file sh -c 'ls {s}; cat {s}/token.txt'\n")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (secret, script, token)
}

/// Class 2's attack set up for a root supervisor that can sandbox: the
/// config, the repository's hostile `python3` and the secret's token.
fn shebang_attack() -> Option<(Gov, PathBuf, String)> {
    if !is_root() {
        skip("class 2's attack needs a root supervisor (it binds host directories)");
        return None;
    }
    if !sandbox_available() {
        return None;
    }
    let g = Gov::outside_tmp("");
    let (_secret, script, token) = plant_shebang_attack(&g);
    Some((g, script, token))
}

/// `confine exec --executable <repo>/python3`: refused before anything
/// runs, naming why; the secret directory is never bound, so its token
/// appears nowhere in the answer.
#[test]
fn class02_an_executable_inside_a_repository_is_refused() {
    let Some((g, script, token)) = shebang_attack() else { return };
    let script = script.to_str().unwrap();
    let (v, out) = g.exec_json(&[
        "--repo-id",
        "demo",
        "--runtime",
        "python",
        "--output-mode",
        "summary",
        "--executable",
        script,
        "--",
        "x",
    ]);
    let all = format!("{v}{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(&token) && !all.contains("token.txt"), "the secret leaked: {all}");
    assert_ne!(v["status"], "success", "{v}");
    assert!(v["outcome"].is_null(), "nothing may run: {v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("is not trusted") && error.contains("repository"), "the refusal says why: {error}");
}

/// A `python3` in a directory outside every repository, but not on the
/// supervisor's PATH, is refused too: an absolute executable must be in
/// a directory of PATH or a system directory.
#[test]
fn class02_an_executable_outside_the_trusted_locations_is_refused() {
    if !is_root() && !sandbox_available() {
        return;
    }
    let g = Gov::outside_tmp("");
    let (secret, _script, token) = plant_shebang_attack(&g);
    let elsewhere = secret.join("python3");
    std::fs::copy(g.repo.join("python3"), &elsewhere).unwrap();
    let (v, out) = g.exec_json(&[
        "--repo-id",
        "demo",
        "--runtime",
        "python",
        "--output-mode",
        "summary",
        "--executable",
        elsewhere.to_str().unwrap(),
        "--",
        "x",
    ]);
    let all = format!("{v}{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(&token), "the secret leaked: {all}");
    assert!(v["outcome"].is_null(), "nothing may run: {v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("is not trusted") && error.contains("PATH"), "the refusal says why: {error}");
    // The same name looked up on PATH is the system's python3, which runs.
    if Command::new("python3").arg("-V").output().is_ok_and(|o| o.status.success()) {
        let (v, out) = g.exec_json(&[
            "--repo-id",
            "demo",
            "--runtime",
            "python",
            "--output-mode",
            "summary",
            "--executable",
            "python3",
            "--",
            "-c",
            "import os; print(os.path.exists(os.environ.get('S', '/nonexistent')))",
        ]);
        assert_eq!(v["status"], "success", "{v}\n{}", stderr(&out));
    }
}

// ---------------------------------------------------------------------------
// An MCP client over streamable HTTP, written against the wire: nothing of
// confine's own code is between the test and the server.
// ---------------------------------------------------------------------------

/// `confine serve --http 127.0.0.1:0 ARGS…` on `g`'s config, killed on drop.
struct Serve {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    log: std::sync::Arc<std::sync::Mutex<String>>,
    /// Where a generated token is written ($XDG_RUNTIME_DIR).
    runtime: tempfile::TempDir,
}

impl Serve {
    fn start(g: &Gov, args: &[&str], env: &[(&str, &str)]) -> Serve {
        use std::io::BufRead;
        let runtime = tempfile::tempdir().unwrap();
        let mut cmd = confine();
        cmd.arg("--config")
            .arg(&g.config)
            .args(["serve", "--http", "127.0.0.1:0"])
            .args(args)
            .env_remove("CONFINE_TOKEN")
            .env("XDG_RUNTIME_DIR", runtime.path())
            .env("CONFINE_LOG", "info");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                // Logged first: whoever gets the address may read the log.
                log2.lock().unwrap().push_str(&format!("{line}\n"));
                if let Some(rest) = line.split("streamable HTTP at http://").nth(1) {
                    let _ = tx.send(rest.split("/mcp").next().unwrap_or_default().to_string());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(a) => a.parse().unwrap(),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the server did not start: {}", log.lock().unwrap());
            }
        };
        Serve { child, addr, log, runtime }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The generated token's file, as the server printed it.
    fn generated(&self) -> PathBuf {
        let log = self.log();
        let rest = log.split("generated one in ").nth(1).unwrap_or_else(|| panic!("no generated token: {log}"));
        PathBuf::from(rest.split(" (").next().unwrap())
    }

    /// SIGTERM, and the exit status within 20 s.
    fn terminate(&mut self) -> std::process::ExitStatus {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "the server did not stop: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 POST to /mcp: status, headers (lower-cased names), body
/// (de-chunked).
fn post(addr: std::net::SocketAddr, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    let mut req = format!("POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\n", body.len());
    req.push_str("Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n");
    req.push_str("MCP-Protocol-Version: 2025-06-18\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let head = head.to_ascii_lowercase();
    let body = if head.contains("transfer-encoding: chunked") { dechunk(rest) } else { rest.to_string() };
    (status, head, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// The JSON-RPC message of a response body: plain JSON, or the `data:`
/// of an event stream that carries a result or an error.
fn message(body: &str) -> serde_json::Value {
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(body) {
        return v;
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in: {body}"))
}

/// One MCP session over HTTP with one bearer token.
struct Session {
    addr: std::net::SocketAddr,
    auth: String,
    id: String,
}

impl Session {
    fn open(addr: std::net::SocketAddr, token: &str) -> Session {
        let auth = format!("Bearer {token}");
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"security","version":"0"}}}"#;
        let (status, head, body) = post(addr, &[("Authorization", &auth)], init);
        assert_eq!(status, 200, "{head}{body}");
        let id = head
            .lines()
            .find_map(|l| l.strip_prefix("mcp-session-id:"))
            .unwrap_or_else(|| panic!("no session id: {head}"))
            .trim()
            .to_string();
        let s = Session { addr, auth, id };
        let (status, _, _) = post(addr, &s.headers(), r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
        assert!(status == 202 || status == 200, "initialized: {status}");
        s
    }

    fn headers(&self) -> [(&str, &str); 2] {
        [("Authorization", self.auth.as_str()), ("Mcp-Session-Id", self.id.as_str())]
    }

    /// `tools/call`: the result (its `isError`, `structuredContent`, text).
    fn call(&self, tool: &str, args: serde_json::Value) -> serde_json::Value {
        let body = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                      "params": {"name": tool, "arguments": args}});
        let (status, head, text) = post(self.addr, &self.headers(), &body.to_string());
        assert_eq!(status, 200, "{tool}: {head}{text}");
        let m = message(&text);
        m.get("result").cloned().unwrap_or_else(|| panic!("{tool}: {m}"))
    }
}

/// A tool result's one-line text (a tool error's `status: message`).
fn text(result: &serde_json::Value) -> String {
    result["content"].as_array().into_iter().flatten().filter_map(|c| c["text"].as_str()).collect()
}

/// A tool error with this status prefix.
fn assert_tool_error(result: &serde_json::Value, status: &str) {
    assert_eq!(result["isError"], true, "not an error: {result}");
    let t = text(result);
    assert!(t.starts_with(&format!("{status}: ")), "wanted '{status}: …', got {t:?}");
}

/// Class 2 through MCP: `runtime_execute` with a repository's `python3`
/// as its executable is refused; the secret never shows.
#[test]
fn class02_mcp_executable_in_a_repository_is_refused() {
    let Some((g, script, token)) = shebang_attack() else { return };
    let server = Serve::start(&g, &[], &[("CONFINE_TOKEN", "class02-token")]);
    let s = Session::open(server.addr, "class02-token");
    let r = s.call(
        "runtime_execute",
        serde_json::json!({"repoId": "demo", "runtime": "python", "executable": script.to_str().unwrap(),
                           "args": ["x"], "outputMode": "summary"}),
    );
    assert!(!r.to_string().contains(&token), "the secret leaked: {r}");
    assert_eq!(r["isError"], true, "{r}");
    assert!(r.to_string().contains("is not trusted"), "{r}");
}

// ---------------------------------------------------------------------------
// Class 11: HTTP without a token on loopback.
// ---------------------------------------------------------------------------

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;

/// Without any token given, `serve --http` on loopback generates one,
/// writes it 0600 in a 0700 directory of XDG_RUNTIME_DIR, says where, and
/// refuses requests without it; the file goes at shutdown. The header is
/// read per RFC 6750: scheme in any case, one or more spaces, one token.
#[test]
fn class11_http_without_a_token_generates_one() {
    use std::os::unix::fs::PermissionsExt;
    let g = Gov::new("");
    let mut server = Serve::start(&g, &[], &[]);
    let file = server.generated();
    assert!(file.starts_with(server.runtime.path().join("confine")), "{}", file.display());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(file.parent().unwrap()), mode(&file)), (0o700, 0o600));
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(token.len() == 64 && token.chars().all(|c| c.is_ascii_hexdigit()), "{token:?}");
    assert!(server.log().contains("(bearer token required)"), "{}", server.log());

    let a = server.addr;
    let status =
        |auth: Option<&str>| post(a, &auth.map(|v| ("Authorization", v)).into_iter().collect::<Vec<_>>(), INITIALIZE).0;
    assert_eq!(status(None), 401, "no token on loopback is refused");
    assert_eq!(status(Some(&format!("Bearer {token}"))), 200);
    // RFC 6750 §2.1 `"Bearer" 1*SP b64token`, the scheme case-insensitive.
    assert_eq!(status(Some(&format!("bearer  {token}"))), 200);
    assert_eq!(status(Some(&format!("BEARER {token}"))), 200);
    for refused in [
        format!("Bearer\t{token}"),
        format!("Bearer {token} x"),
        format!("Bearer{token}"),
        format!("Basic {token}"),
        "Bearer nope".into(),
    ] {
        assert_eq!(status(Some(&refused)), 401, "{refused:?}");
    }
    assert!(server.terminate().success(), "{}", server.log());
    assert!(!file.exists(), "the generated token is removed at shutdown");
}

/// The attack: a job run with `--net host` reaches the loopback server.
/// It gets 401, and can't read the token's file.
#[test]
fn class11_a_job_with_host_network_cannot_use_the_server() {
    if !sandbox_available() {
        return;
    }
    let g = Gov::new("");
    let server = Serve::start(&g, &[], &[]);
    let file = server.generated();
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; \
         printf 'POST /mcp HTTP/1.1\\r\\nHost: 127.0.0.1:{port}\\r\\nContent-Type: application/json\\r\\nAccept: application/json, text/event-stream\\r\\nContent-Length: {len}\\r\\nConnection: close\\r\\n\\r\\n%s' '{body}' >&3; \
         head -1 <&3; cat {file} 2>/dev/null || echo no-token-file",
        port = server.addr.port(),
        len = INITIALIZE.len(),
        body = INITIALIZE,
        file = file.display()
    );
    let out = run(&["--net", "host", "--", "/bin/bash", "-c", &script]);
    let said = stdout(&out);
    assert!(said.starts_with("HTTP/1.1 401"), "{said}\n{}", stderr(&out));
    assert!(said.contains("no-token-file"), "{said}");
}

/// `--no-token`: loopback only, with a warning; never with a token given.
#[test]
fn class11_no_token_is_loopback_only_and_warned() {
    let g = Gov::new("");
    let open = Serve::start(&g, &["--no-token"], &[]);
    assert!(open.log().contains("warning: --no-token"), "{}", open.log());
    assert_eq!(post(open.addr, &[], INITIALIZE).0, 200);
    assert_eq!(std::fs::read_dir(open.runtime.path()).map(|d| d.count()).unwrap_or(0), 0, "nothing generated");
    // sled lets one process open the store: the next servers need it.
    drop(open);
    let refused = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = confine();
        cmd.arg("--config").arg(&g.config).arg("serve").args(args).env_remove("CONFINE_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = output_within(&mut cmd, Duration::from_secs(30));
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", stderr(&out));
        stderr(&out)
    };
    let public = refused(&["--http", "0.0.0.0:0", "--no-token"], &[]);
    assert!(public.contains("requires a bearer token"), "{public}");
    assert!(refused(&["--http", "127.0.0.1:0", "--no-token"], &[("CONFINE_TOKEN", "t")]).contains("conflicts"));
    let bad = refused(&["--http", "127.0.0.1:0"], &[("CONFINE_TOKEN", "has space")]);
    assert!(bad.contains("RFC 6750"), "{bad}");
}

// ---------------------------------------------------------------------------
// Class 10: sessions and repositories kept apart.
// ---------------------------------------------------------------------------

/// Two repositories, `alpha` and `beta`, and two tokens scoped to one each.
fn two_tenants() -> (Gov, &'static str, &'static str) {
    let g = Gov::new("");
    let beta = g.path("beta");
    std::fs::create_dir(&beta).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&beta, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (ta, tb) = ("alpha-token-1", "beta-token-2");
    let token_file = g.path("alpha.token");
    std::fs::write(&token_file, format!("{ta}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    use sha2::Digest;
    let config = format!(
        "[runtime]\nenabled = true\n{degraded}\n[store]\npath = \"{store}\"\n\n\
         [[repos]]\nid = \"alpha\"\nroot = \"{a}\"\n\n[[repos]]\nid = \"beta\"\nroot = \"{b}\"\n\n\
         [[mcp.tokens]]\nid = \"a\"\nfile = \"{tf}\"\nrepos = [\"alpha\"]\n\n\
         [[mcp.tokens]]\nid = \"b\"\nsha256 = \"{hb}\"\nrepos = [\"beta\"]\n",
        degraded = degraded_runtime(),
        store = g.path("store").display(),
        a = g.repo.display(),
        b = beta.display(),
        tf = token_file.display(),
        hb = hex::encode(sha2::Sha256::digest(tb.as_bytes())),
    );
    std::fs::write(&g.config, config).unwrap();
    (g, ta, tb)
}

/// Session B (another token, scoped to `beta`) can't see or kill A's
/// job, nor read A's artifact, nor name `alpha` at all; a second session
/// of A's own token can read alpha's artifact but not A's jobs.
#[test]
fn class10_sessions_and_repositories_are_kept_apart() {
    if !sandbox_available() {
        return;
    }
    let (g, ta, tb) = two_tenants();
    let server = Serve::start(&g, &[], &[]);
    assert!(!server.log().contains("generated one"), "configured tokens: nothing generated: {}", server.log());
    let a = Session::open(server.addr, ta);
    let secret = token("class10");
    let r = a.call(
        "runtime_execute",
        serde_json::json!({"repoId": "alpha", "runtime": "shell", "code": format!("echo {secret}")}),
    );
    assert_eq!(r["structuredContent"]["status"], "success", "{r}");
    let handle = r["structuredContent"]["artifactHandle"].as_str().unwrap().to_string();
    let r = a.call(
        "runtime_execute",
        serde_json::json!({"repoId": "alpha", "runtime": "shell", "code": "echo up; sleep 60", "background": true}),
    );
    let job = r["structuredContent"]["jobId"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();

    let b = Session::open(server.addr, tb);
    let listed = b.call("runtime_jobs", serde_json::json!({}));
    assert_eq!(listed["structuredContent"]["jobs"], serde_json::json!([]), "B lists nobody else's jobs: {listed}");
    assert_tool_error(&b.call("runtime_jobs", serde_json::json!({"jobId": job})), "not_found");
    assert_tool_error(&b.call("runtime_kill", serde_json::json!({"jobId": job})), "not_found");
    let q = b.call("runtime_query_output", serde_json::json!({"artifactHandle": handle, "queryTerms": [secret]}));
    assert_tool_error(&q, "not_found");
    assert!(!q.to_string().contains(&secret), "{q}");
    // The same words for A's artifact as for one that never existed.
    let none =
        b.call("runtime_query_output", serde_json::json!({"artifactHandle": "run-alpha-1-00", "queryTerms": ["x"]}));
    assert_eq!(text(&q).replace(&handle, "H"), text(&none).replace("run-alpha-1-00", "H"));
    for (tool, args) in [
        ("runtime_execute", serde_json::json!({"repoId": "alpha", "runtime": "shell", "code": "ls"})),
        ("info", serde_json::json!({"repoId": "alpha"})),
        ("memory_query", serde_json::json!({"repoId": "alpha"})),
        ("memory_store", serde_json::json!({"repoId": "alpha", "type": "decision", "title": "t", "content": "c"})),
    ] {
        let r = b.call(tool, args);
        assert_tool_error(&r, "denied");
        assert!(text(&r).contains("not available to this token (it may use: beta)"), "{tool}: {}", text(&r));
    }
    // B holding A's session id gets nothing into A's session: not a call,
    // not a cancellation (rmcp routes by the id alone; the gate binds each
    // session to the token that opened it).
    let hijack = [("Authorization", b.auth.as_str()), ("Mcp-Session-Id", a.id.as_str())];
    let cancel = format!(
        r#"{{"jsonrpc":"2.0","method":"notifications/cancelled","params":{{"requestId":2,"reason":"{job}"}}}}"#
    );
    assert_eq!(post(server.addr, &hijack, &cancel).0, 404, "another token's session id must be unknown");
    let list = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"runtime_jobs","arguments":{}}}"#;
    assert_eq!(post(server.addr, &hijack, list).0, 404);
    // B's own repository works.
    let r = b.call("runtime_execute", serde_json::json!({"repoId": "beta", "runtime": "shell", "code": "echo beta"}));
    assert_eq!(r["structuredContent"]["status"], "success", "{r}");

    // Another session of A's token: alpha's artifacts yes, A's jobs no.
    let a2 = Session::open(server.addr, ta);
    let q = a2.call("runtime_query_output", serde_json::json!({"artifactHandle": handle, "queryTerms": [secret]}));
    assert_eq!(q["isError"], false, "{q}");
    assert_tool_error(&a2.call("runtime_kill", serde_json::json!({"jobId": job})), "not_found");

    // A's job ran on through all of that, and A can still follow and kill it.
    let mine = a.call("runtime_jobs", serde_json::json!({"jobId": job}));
    assert_eq!(mine["structuredContent"]["jobs"][0]["status"], "running", "{mine}");
    let k = a.call("runtime_kill", serde_json::json!({"jobId": job}));
    assert_eq!(k["structuredContent"]["status"], "killed", "{k}");
}

// ---------------------------------------------------------------------------
// Class 1, the governance side: what the supervisor reads and writes in a
// repository for the memory tools, while a job may be changing it.
// ---------------------------------------------------------------------------

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "mkfifo {}", path.display());
}

impl Gov {
    /// `confine memory ARGS…` within 30 s: a FIFO that blocked an open
    /// would hang it, and fail the test here instead.
    fn memory(&self, args: &[&str]) -> Output {
        let mut cmd = confine();
        cmd.arg("--config").arg(&self.config).arg("memory").args(args).env_remove("CONFINE_CONFIG");
        output_within(&mut cmd, Duration::from_secs(30))
    }

    fn memory_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.memory(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {}", stdout(&out)))
    }
}

/// A FIFO planted as a memory file or as a linked file is refused at
/// once: no memory operation opens it in a way that waits for a writer.
#[test]
fn class01_memory_fifos_never_hang_the_supervisor() {
    // The repository mirrors its memories (the files under attack).
    let g = Gov::new("memory_files = true\n");
    std::fs::create_dir_all(g.repo.join("src")).unwrap();
    std::fs::write(g.repo.join("src/a.rs"), "fn a() {}\n").unwrap();
    let stored = g.memory_json(&[
        "store",
        "--json",
        "--type",
        "decision",
        "--title",
        "t",
        "--content",
        "c",
        "--file",
        "src/a.rs",
    ]);
    assert!(stored["memoryId"].is_string(), "{stored}");
    // The linked file becomes a FIFO: stale, never read.
    std::fs::remove_file(g.repo.join("src/a.rs")).unwrap();
    mkfifo(&g.repo.join("src/a.rs"));
    let checked = g.memory_json(&["check", "--json"]);
    assert_eq!(checked["stale"], 1, "{checked}");
    // Linking a FIFO is refused, naming why.
    let out =
        g.memory(&["store", "--json", "--type", "decision", "--title", "u", "--content", "d", "--file", "src/a.rs"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
    // A FIFO as a memory file: reported, not read.
    mkfifo(&g.repo.join(".confine-memory/planted.md"));
    let synced = g.memory_json(&["sync", "--json"]);
    let problems = synced["problems"].to_string();
    assert!(problems.contains("planted.md") && problems.contains("not a regular file"), "{synced}");
}

/// A symlinked `.confine-memory`, or a symlink planted at a memory's file,
/// never leads a write (or a removal) out of the repository.
#[test]
fn class01_memory_writes_never_leave_the_repository() {
    let g = Gov::new("memory_files = true\n");
    let outside = g.path("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, g.repo.join(".confine-memory")).unwrap();
    let out = g.memory(&["store", "--json", "--type", "decision", "--title", "t", "--content", "c"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(stderr(&out).contains(".confine-memory is a symlink"), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing written outside");
    assert!(!g.memory(&["sync", "--json"]).status.success());

    std::fs::remove_file(g.repo.join(".confine-memory")).unwrap();
    let id = g.memory_json(&["store", "--json", "--type", "decision", "--title", "t", "--content", "c"])["memoryId"]
        .as_str()
        .unwrap()
        .to_string();
    let victim = outside.join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let md = g.repo.join(format!(".confine-memory/{id}.md"));
    std::fs::remove_file(&md).unwrap();
    std::os::unix::fs::symlink(&victim, &md).unwrap();
    let synced = g.memory_json(&["sync", "--json"]);
    assert!(synced["problems"].to_string().contains("symlink"), "{synced}");
    g.memory_json(&["store", "--json", "--memory-id", &id, "--type", "decision", "--title", "t2", "--content", "c2"]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    assert!(!std::fs::symlink_metadata(&md).unwrap().file_type().is_symlink(), "the link was replaced, not followed");
    std::fs::remove_file(&md).unwrap();
    std::os::unix::fs::symlink(&victim, &md).unwrap();
    g.memory_json(&["rm", "--json", "--delete-file", &id]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
}
