//! The memory and feedback tools of `confine serve` end to end, with the
//! official MCP Python SDK (pinned, in target/mcp-venv, shared with
//! tests/mcp_e2e.rs) over stdio, both protocol generations:
//! store → query → surface → remove → query, dedup, upsert, staleness and
//! `info`'s staleMemories, refused input, feedback
//! (tests/mcp_client/memory_scenarios.py).
//!
//! Without Python or PyPI the test prints `SKIP: <why>` and passes, unless
//! CONFINE_REQUIRE_ISOLATION=1, where a skip is a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The MCP Python SDK release the scenarios are written against (as tests/mcp_e2e.rs).
const MCP_PIN: &str = "2.3.0";
/// How many `ok` lines memory_scenarios.py prints.
const SCENARIOS: usize = 6;

fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("mcp-venv")
}

fn skip(reason: &str) {
    if std::env::var("CONFINE_REQUIRE_ISOLATION").as_deref() == Ok("1") {
        panic!("{reason} (a skip is a failure with CONFINE_REQUIRE_ISOLATION=1)");
    }
    eprintln!("SKIP: {reason}");
}

struct Ran {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

fn run_for(cmd: &mut Command, limit: Duration) -> Result<Ran, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status = wait_for(&mut child, limit);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    Ok(Ran { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() })
}

fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn mcp_version(python: &Path) -> Option<String> {
    let out = Command::new(python)
        .args(["-c", "import importlib.metadata as m, mcp; print(m.version('mcp'))"])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// target/mcp-venv with mcp==MCP_PIN, created if missing, under the same
/// file lock as tests/mcp_e2e.rs (both may run at once).
fn setup_venv() -> Result<PathBuf, String> {
    let dir = venv_dir();
    let python = dir.join("bin/python");
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::File::create(&lock_path).map_err(|e| format!("{}: {e}", lock_path.display()))?;
    // SAFETY: flock on a descriptor we own; released when `lock` is closed.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) };
    if locked != 0 {
        return Err(format!("cannot lock {}", lock_path.display()));
    }
    if mcp_version(&python).as_deref() == Some(MCP_PIN) {
        return Ok(python);
    }
    let step = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let ran = run_for(cmd, Duration::from_secs(600))?;
        match ran.status {
            Some(s) if s.success() => Ok(()),
            _ => Err(format!("{what} failed: {}", ran.stderr.lines().last().unwrap_or("timed out"))),
        }
    };
    step(Command::new("python3").args(["-m", "venv"]).arg(&dir), "python3 -m venv")?;
    step(
        Command::new(&python)
            .args(["-m", "pip", "install", "--disable-pip-version-check", "--quiet"])
            .arg(format!("mcp=={MCP_PIN}")),
        &format!("pip install mcp=={MCP_PIN}"),
    )?;
    match mcp_version(&python) {
        Some(v) if v == MCP_PIN => Ok(python),
        other => Err(format!("mcp {MCP_PIN} is not importable after pip install (found {other:?})")),
    }
}

fn python() -> Option<PathBuf> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match VENV.get_or_init(setup_venv) {
        Ok(p) => Some(p.clone()),
        Err(e) => {
            skip(&format!("MCP Python SDK unavailable: {e}"));
            None
        }
    }
}

/// A config with its own store and one repository `demo` holding src/auth.rs.
fn test_config() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(repo.join("src")).unwrap();
    std::fs::write(repo.join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
    let config = dir.path().join("confine.toml");
    let text = format!(
        "[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
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
