//! The official MCP Python SDK for end-to-end tests: a venv under
//! target/mcp-venv with a pinned `mcp`, created once (under a file lock)
//! when missing, and a runner with a time limit.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The pinned SDK version (scripts/setup.sh installs the same).
pub const MCP_PIN: &str = "2.3.0";

pub fn venv_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("mcp-venv")
}

pub fn skip(reason: &str) {
    if std::env::var("CONFINE_REQUIRE_ISOLATION").as_deref() == Ok("1") {
        panic!("{reason} (a skip is a failure with CONFINE_REQUIRE_ISOLATION=1)");
    }
    eprintln!("SKIP: {reason}");
}

/// A command's status and output, killed after `limit`.
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

pub fn run_for(cmd: &mut Command, limit: Duration) -> Result<Ran, String> {
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

pub fn wait_for(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

pub fn mcp_version(python: &Path) -> Option<String> {
    let out = Command::new(python)
        .args(["-c", "import importlib.metadata as m, mcp; print(m.version('mcp'))"])
        .output()
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// target/mcp-venv with mcp==MCP_PIN, created if missing. Serialised with a
/// file lock: test runners that use one process per test would otherwise
/// race two pip installs into one venv.
pub fn setup_venv() -> Result<PathBuf, String> {
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

pub fn python() -> Option<PathBuf> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match VENV.get_or_init(setup_venv) {
        Ok(p) => Some(p.clone()),
        Err(e) => {
            skip(&format!("MCP Python SDK unavailable: {e}"));
            None
        }
    }
}
