//! What an MCP session pays in bytes (issue 29), on the wire: `confine
//! serve` over stdio, spoken to in raw JSON-RPC lines, so the sizes are
//! the bytes a client reads. They are deterministic, so they are asserted:
//! `tools/list` at most 10,000 bytes; `runtime_execute` of `print(6*7)`
//! at most 400 in `minimal` (with the `42` in it) and 600 in `summary`.

use crate::common;

use common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::Command;

struct Server {
    rpc: common::rpc::Rpc,
    _dir: tempfile::TempDir,
}

impl Server {
    fn repo(&self) -> std::path::PathBuf {
        self._dir.path().join("repo")
    }

    fn start() -> Server {
        Server::start_with("", &[])
    }

    /// A server whose confine.toml ends with `extra`, its environment with `env`.
    fn start_with(extra: &str, env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let repo = readable_repo(dir.path());
        let config = dir.path().join("confine.toml");
        let text = format!("{}{extra}", exec_config(&dir.path().join("store"), "demo", &repo));
        std::fs::write(&config, text).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("--config").arg(&config).arg("serve").env("XDG_DATA_HOME", dir.path()).envs(env.iter().copied());
        Server { rpc: common::rpc::Rpc::start(cmd, "wire"), _dir: dir }
    }

    /// The response line to one request, as the client reads it.
    fn rpc(&mut self, method: &str, params: Value) -> String {
        self.rpc.rpc(method, params)
    }
}

#[test]
fn tools_list_is_at_most_10_000_bytes_and_schemas_are_plain() {
    let mut s = Server::start();
    let line = s.rpc("tools/list", json!({}));
    assert!(line.len() <= 10_000, "tools/list is {} bytes", line.len());
    let v: Value = serde_json::from_str(&line).unwrap();
    let tools = v["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 12, "the memory tools are listed too: {}", tools.len());
    for t in tools {
        let schema = t["inputSchema"].to_string();
        for word in ["\"format\"", "\"$ref\"", "\"$defs\"", "\"$schema\""] {
            assert!(!schema.contains(word), "{}: {word} in {schema}", t["name"]);
        }
        assert!(t.get("outputSchema").is_none(), "{}", t["name"]);
    }
    eprintln!("tools/list: {} bytes", line.len());
}

#[test]
fn a_small_job_answers_in_a_few_hundred_bytes_with_its_output() {
    if !sandbox_available() {
        return;
    }
    let mut s = Server::start();
    for (mode, max) in [("minimal", 400), ("summary", 600)] {
        let line = s.rpc(
            "tools/call",
            json!({"name": "runtime_execute", "arguments": {"repoId": "demo", "runtime": "python", "code": "print(6*7)", "outputMode": mode}}),
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        let r = &v["result"];
        assert_eq!(r["isError"], false, "{line}");
        assert_eq!(r["structuredContent"]["stdout"], "42", "{line}");
        assert_eq!(r["structuredContent"]["isolation"], "full", "{line}");
        assert!(r["content"][0]["text"].as_str().unwrap().ends_with("\n42"), "{line}");
        assert!(line.len() <= max, "{mode}: {} bytes: {line}", line.len());
        eprintln!("{mode}: {} bytes", line.len());
    }
    // What `info` says of every job is there when asked for.
    let line = s.rpc(
        "tools/call",
        json!({"name": "runtime_execute", "arguments": {"runtime": "python", "code": "print(1)", "verbose": true}}),
    );
    let v: Value = serde_json::from_str(&line).unwrap();
    let out = &v["result"]["structuredContent"];
    for k in ["layers", "guarantees", "limits", "usage", "policyDecision"] {
        assert!(out.get(k).is_some(), "verbose lacks {k}: {out}");
    }
    assert_eq!(out["limits"]["timeoutMs"], 30000, "a timeout is reported as asked: {out}");
}

/// The limits the schema documents are the ones enforced: `stdin` up to
/// 512 KiB (the default `limits.max_stdin_bytes`), `code` up to 1 MiB,
/// and `info` says both.
#[test]
fn documented_input_limits_are_the_enforced_ones() {
    if !sandbox_available() {
        return;
    }
    let mut s = Server::start();
    let v: Value = serde_json::from_str(&s.rpc("tools/list", json!({}))).unwrap();
    let exec = v["result"]["tools"].as_array().unwrap().iter().find(|t| t["name"] == "runtime_execute").unwrap();
    let props = &exec["inputSchema"]["properties"];
    assert!(props["stdin"]["description"].as_str().unwrap().contains("512 KiB"), "{}", props["stdin"]);
    assert!(props["code"]["description"].as_str().unwrap().contains("1 MiB"), "{}", props["code"]);
    let v: Value = serde_json::from_str(&s.rpc("tools/call", json!({"name": "info", "arguments": {}}))).unwrap();
    let limits = &v["result"]["structuredContent"]["limits"];
    assert_eq!((limits["maxStdinBytes"].as_u64(), limits["maxCodeBytes"].as_u64()), (Some(512 << 10), Some(1 << 20)));
    let call = |s: &mut Server, n: usize| {
        let line = s.rpc(
            "tools/call",
            json!({"name": "runtime_execute", "arguments": {"runtime": "shell", "code": "wc -c", "stdin": "x".repeat(n)}}),
        );
        serde_json::from_str::<Value>(&line).unwrap()["result"].clone()
    };
    let r = call(&mut s, 512 << 10);
    assert_eq!(r["structuredContent"]["stdout"], "524288", "{r}");
    let r = call(&mut s, (512 << 10) + 1);
    assert_eq!(r["isError"], true, "{r}");
    assert!(r["content"][0]["text"].as_str().unwrap().contains("limits.max_stdin_bytes"), "{r}");
}

/// The context economy on a real failing log (issue 29's benchmark): a
/// small Python package whose real test runner (`unittest -v`, warnings
/// on) fails 3 of 12,003 tests and prints a compile-time warning, 12,000+
/// lines. An agent calls `runtime_execute` (minimal), then one
/// `runtime_query_output` with the terms the answer suggests. Every
/// failing line must come back, in at most 2% of the log's bytes, and the
/// terms must name every distinct error class. The figures go to
/// docs/benchmarks.md.
#[test]
fn a_failing_test_log_costs_two_percent_in_two_calls() {
    if !sandbox_available() {
        return;
    }
    let mut s = Server::start();
    let repo = s.repo();
    std::fs::create_dir_all(repo.join("calc")).unwrap();
    std::fs::create_dir_all(repo.join("tests")).unwrap();
    let calc = r#"import re


def parse(s):
    return int(re.match("\d+", s).group())


def div(a, b):
    return a / b


def lookup(d, k):
    return d[k]
"#;
    let tests = r#"import unittest
from calc import parse, div, lookup


class Passing(unittest.TestCase):
    pass


for i in range(12000):
    setattr(Passing, f"test_case_{i:05d}", lambda self, i=i: self.assertEqual(i + 1 - 1, i))


class Failing(unittest.TestCase):
    def test_parse_negative(self):
        self.assertEqual(parse("-3"), -3)

    def test_div(self):
        self.assertEqual(div(1, 0), 0)

    def test_lookup(self):
        self.assertEqual(lookup({"a": 1}, "a"), 2)
"#;
    std::fs::write(repo.join("calc/__init__.py"), calc).unwrap();
    std::fs::write(repo.join("tests/__init__.py"), "").unwrap();
    std::fs::write(repo.join("tests/test_calc.py"), tests).unwrap();
    let cmd = "python3 -W default -m unittest -v tests.test_calc";
    // The same run on the host, for the lines that tell the failure.
    let host = Command::new("/bin/sh")
        .args(["-c", cmd])
        .current_dir(&repo)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    // Paths as the job sees them.
    let raw = String::from_utf8_lossy(&host.stderr).replace(repo.to_str().unwrap(), "/workspace");
    let failing: Vec<&str> = raw
        .lines()
        .filter(|l| {
            l.ends_with("ERROR")
                || l.ends_with("... FAIL")
                || l.starts_with("ERROR: ")
                || l.starts_with("FAIL: ")
                || l.starts_with("FAILED (")
                || l.contains("Error: ")
                || l.contains("Warning: ")
        })
        .collect();
    assert!(failing.len() >= 10, "the package did not fail as planted ({failing:?}):\n{raw}");

    let first = s.rpc(
        "tools/call",
        json!({"name": "runtime_execute", "arguments": {"runtime": "shell", "code": cmd, "outputMode": "minimal"}}),
    );
    let v: Value = serde_json::from_str(&first).unwrap();
    let out = &v["result"]["structuredContent"];
    assert_eq!(out["status"], "failure", "{first}");
    let log_bytes = out["outputBytes"].as_u64().unwrap();
    assert!(out["outputLines"].as_u64().unwrap() > 12_000, "{first}");
    let terms: Vec<String> =
        out["suggestedTerms"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    for class in ["AttributeError", "ZeroDivisionError", "AssertionError", "DeprecationWarning"] {
        assert!(terms.iter().any(|t| t == class), "the terms miss {class}: {terms:?}");
    }
    let second = s.rpc(
        "tools/call",
        json!({"name": "runtime_query_output", "arguments": {
            "artifactHandle": out["artifactHandle"], "queryTerms": terms, "maxExcerpts": 20, "contextLines": 3}}),
    );
    let v: Value = serde_json::from_str(&second).unwrap();
    let excerpts: String = v["result"]["structuredContent"]["excerpts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["content"].as_str().unwrap().to_string() + "\n")
        .collect();
    let missed: Vec<&&str> = failing.iter().filter(|l| !excerpts.contains(**l)).collect();
    assert!(missed.is_empty(), "failing lines not retrieved: {missed:?}");
    let received = first.len() + second.len();
    let pct = 100.0 * received as f64 / log_bytes as f64;
    eprintln!(
        "failing log: {log_bytes} bytes, {} lines, {} failing lines; received {} + {} = {received} bytes ({pct:.2}%) in 2 calls; terms {terms:?}",
        out["outputLines"], failing.len(), first.len(), second.len()
    );
    assert!(pct <= 2.0, "{received} bytes received for a {log_bytes}-byte log ({pct:.2}%)");
}

/// `runtime_execute`'s `network: {allow}`: the operator's named list
/// reaches its host through the proxy, every connection is in the answer
/// and in the audit record; a host of the client's own choosing is the
/// built-in policy's denial.
#[test]
fn a_network_allowlist_is_the_operators_and_its_connections_are_reported() {
    if !sandbox_available() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { continue };
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut sock, &mut buf);
            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nconnection: close\r\n\r\nfrom-host");
        }
    });
    let extra = format!("\n[network.allow]\nlocal = [\"app.test:{port}\", \"127.0.0.1:{port}\"]\n");
    let resolve = "app.test=127.0.0.1".to_string();
    let mut s = Server::start_with(&extra, &[("CONFINE_TEST_RESOLVE", &resolve)]);
    let code = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://app.test:{port}/', timeout=10).read().decode())"
    );
    let line = s.rpc(
        "tools/call",
        json!({"name": "runtime_execute", "arguments": {"runtime": "python", "code": code, "network": {"allow": ["@local"]}}}),
    );
    let v: Value = serde_json::from_str(&line).unwrap();
    let out = &v["result"]["structuredContent"];
    assert_eq!(out["stdout"], "from-host", "{line}");
    let conns = out["network"]["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 1, "{out}");
    assert_eq!((conns[0]["host"].as_str(), conns[0]["decision"].as_str()), (Some("app.test"), Some("allowed")));
    // The client's own host: refused by the built-in policy, before any job.
    let line = s.rpc(
        "tools/call",
        json!({"name": "runtime_execute", "arguments": {"runtime": "python", "code": "print(1)", "network": {"allow": ["exfil.example"]}}}),
    );
    assert!(
        line.contains("network allowlist entry 'exfil.example' is not in confine.toml's [network.allow] lists"),
        "{line}"
    );
    // A malformed entry: the request's error, naming it.
    let line = s.rpc(
        "tools/call",
        json!({"name": "runtime_execute", "arguments": {"runtime": "python", "code": "print(1)", "network": {"allow": ["*.com"]}}}),
    );
    assert!(line.contains("'*.com' opens every name under the public suffix 'com'"), "{line}");
    // The audit trail has the job's connections.
    let config = s._dir.path().join("confine.toml");
    let data = s._dir.path().to_path_buf();
    let _dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    drop(s);
    let audit = Command::new(bin())
        .arg("--config")
        .arg(&config)
        .args(["audit", "export", "--jsonl"])
        .env("XDG_DATA_HOME", &data)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&audit.stdout);
    assert!(
        text.contains("\"network\"") && text.contains("app.test"),
        "{text} / {}",
        String::from_utf8_lossy(&audit.stderr)
    );
}
