//! `confine serve` over stdio, spoken to in raw JSON-RPC lines: what a
//! client reads, byte for byte, with no SDK in between.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

pub struct Rpc {
    pub child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    next: u64,
}

impl Rpc {
    /// Start `cmd` (a `confine … serve`) with piped stdin and stdout, and
    /// make the MCP handshake as `client`.
    pub fn start(mut cmd: Command, client: &str) -> Rpc {
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut s = Rpc { child, stdin, out, next: 1 };
        s.rpc(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": client, "version": "1"}}),
        );
        s.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    pub fn send(&mut self, v: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    }

    /// The response line to one request, as the client reads it
    /// (notifications before it are skipped).
    pub fn rpc(&mut self, method: &str, params: Value) -> String {
        let id = self.next;
        self.next += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the server closed its output");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return line.trim_end().to_string();
            }
        }
    }

    /// [`Rpc::request`], or `None` when the server is gone before it
    /// answered (its stdin or stdout closed).
    pub fn try_request(&mut self, method: &str, params: Value) -> Option<Value> {
        let id = self.next;
        self.next += 1;
        let stdin = self.stdin.as_mut()?;
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(stdin, "{line}").ok()?;
        stdin.flush().ok()?;
        loop {
            let mut line = String::new();
            if self.out.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let v: Value = serde_json::from_str(&line).ok()?;
            if v["id"] == id {
                return Some(v);
            }
        }
    }

    /// [`Rpc::rpc`], parsed.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        serde_json::from_str(&self.rpc(method, params)).unwrap()
    }

    /// Close stdin: the server ends its session and exits.
    pub fn close(&mut self) {
        drop(self.stdin.take());
    }
}

impl Drop for Rpc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Job cgroup directories of the supervisor `pid` (named
/// `<job>.<pid>.<start>`), anywhere under /sys/fs/cgroup.
pub fn job_cgroups(pid: u32) -> Vec<std::path::PathBuf> {
    let mark = format!(".{pid}.");
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name().to_string_lossy().contains(&mark) {
                    found.push(e.path());
                }
                stack.push(e.path());
            }
        }
    }
    found
}
