//! The memory and feedback tools of `confine serve` end to end, with the
//! official MCP Python SDK (pinned, in target/mcp-venv, shared with
//! tests/mcp_e2e.rs) over stdio, both protocol generations:
//! store → query → surface → remove → query, dedup, upsert, staleness and
//! `info`'s staleMemories, refused input, feedback
//! (tests/mcp_client/memory_scenarios.py).
//!
//! Without Python or PyPI the test prints `SKIP: <why>` and passes, unless
//! CONFINE_REQUIRE_ISOLATION=1, where a skip is a failure.

use crate::common;
use common::mcp::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The MCP Python SDK release the scenarios are written against (as tests/mcp_e2e.rs).
/// How many `ok` lines memory_scenarios.py prints.
const SCENARIOS: usize = 6;

/// A config with its own store and one repository `demo` holding src/auth.rs.
fn test_config() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
    let config = dir.path().join("confine.toml");
    let text = format!(
        "[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\nmemory_files = true\n",
        dir.path().join("store").display(),
        repo.display()
    );
    std::fs::write(&config, text).unwrap();
    (dir, config, repo)
}

fn run_scenarios(python: &Path, mode: &str) {
    let (_dir, config, repo) = test_config();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client/memory_scenarios.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg(env!("CARGO_BIN_EXE_confine")).arg("--config").arg(&config).arg("--repo-root").arg(&repo);
    cmd.args(["--mode", mode]);
    let ran = run_for(&mut cmd, Duration::from_secs(180)).unwrap();
    eprintln!("memory scenarios ({mode}):\n{}", ran.stdout);
    assert!(
        ran.status.is_some_and(|s| s.success()),
        "memory scenarios ({mode}) failed ({:?}):\n{}\n{}",
        ran.status,
        ran.stdout,
        ran.stderr
    );
    assert_eq!(ran.stdout.lines().filter(|l| l.starts_with("ok ")).count(), SCENARIOS, "{}", ran.stdout);
}

#[test]
fn python_sdk_memory_round_trip() {
    let Some(py) = python() else { return };
    for mode in ["auto", "legacy"] {
        run_scenarios(&py, mode);
    }
}
