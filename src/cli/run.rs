//! `confine run`: one job in a fresh sandbox, streams passed through, the
//! job's exit status returned (docker/podman conventions).

use crate::env::{scrubbed, EnvArg};
use crate::job::{Bind, JobSpec, Network, Outcome};
use crate::sandbox::{SandboxError, StdioSpec};
use clap::{Args, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum NetArg {
    /// A new network namespace with only `lo`.
    None,
    /// Share the host's network.
    Host,
}

#[derive(Debug, Args)]
#[command(after_help = "Exit status: the command's own; 128+N when killed by signal N; \
125 when confine failed; 126 when the command can't be executed; 127 when it is not found.")]
pub struct RunArgs {
    /// Host directory mounted at /workspace (read-only unless --rw).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Mount the workspace read-write.
    #[arg(long, requires = "workspace")]
    pub rw: bool,
    /// Network: `none` (only lo) or `host`.
    #[arg(long, value_enum, default_value = "none")]
    pub net: NetArg,
    /// Hostname inside the sandbox.
    #[arg(long, default_value = "confine")]
    pub hostname: String,
    /// Pass KEY from this environment, or set KEY=VAL. Repeatable.
    /// Nothing else of confine's environment reaches the job.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VAL]")]
    pub env: Vec<EnvArg>,
    /// Bind a host path read-only: SRC or SRC:DEST. Repeatable.
    #[arg(long = "ro-bind", value_name = "SRC[:DEST]")]
    pub ro_bind: Vec<String>,
    /// Bind a host path read-write: SRC or SRC:DEST. Repeatable.
    #[arg(long = "bind", value_name = "SRC[:DEST]")]
    pub bind: Vec<String>,
    /// Working directory inside the sandbox (default: /workspace, else /tmp).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Write the outcome as JSON to FILE when the job ends.
    #[arg(long, value_name = "FILE")]
    pub json_status: Option<PathBuf>,
    /// Run even when an isolation layer can't be applied; the outcome names it.
    #[arg(long)]
    pub allow_degraded: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

fn parse_bind(s: &str, writable: bool) -> Result<Bind, SandboxError> {
    let (src, dst) = match s.split_once(':') {
        Some((a, b)) => (a, b),
        None => (s, s),
    };
    let source =
        std::fs::canonicalize(src).map_err(|e| SandboxError::Unavailable(format!("bind source {src}: {e}")))?;
    let dest = PathBuf::from(dst);
    if !dest.is_absolute() || dest.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(SandboxError::Unavailable(format!(
            "bind destination {dst}: must be an absolute path without '..'"
        )));
    }
    Ok(Bind { source, dest, writable })
}

/// Build the job from the arguments.
pub fn job_spec(args: &RunArgs) -> Result<JobSpec, SandboxError> {
    let mut spec = JobSpec::new(args.command.clone());
    spec.env = scrubbed(&args.env, |k| std::env::var(k).ok());
    if let Some(ws) = &args.workspace {
        let ws = std::fs::canonicalize(ws)
            .map_err(|e| SandboxError::Workspace { path: ws.clone(), reason: e.to_string() })?;
        spec.workspace = Some(ws);
        spec.cwd = PathBuf::from("/workspace");
    }
    if let Some(cwd) = &args.cwd {
        spec.cwd = cwd.clone();
    }
    spec.workspace_rw = args.rw;
    spec.network = match args.net {
        NetArg::None => Network::None,
        NetArg::Host => Network::Host,
    };
    spec.hostname = args.hostname.clone();
    spec.allow_degraded = args.allow_degraded;
    for b in &args.ro_bind {
        spec.binds.push(parse_bind(b, false)?);
    }
    for b in &args.bind {
        spec.binds.push(parse_bind(b, true)?);
    }
    Ok(spec)
}

pub fn main(args: RunArgs) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("confine: cannot start the runtime: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    };
    let outcome = rt.block_on(run(&args));
    let code = match &outcome {
        Ok(o) => {
            if let Some(err) = &o.error {
                eprintln!("confine: {err}");
            }
            o.cli_exit_code()
        }
        Err(e) => {
            eprintln!("confine: {e}");
            super::EXIT_CONFINE_FAILED
        }
    };
    if let (Some(path), Ok(o)) = (&args.json_status, &outcome) {
        let write = serde_json::to_vec_pretty(o).map_err(std::io::Error::other).and_then(|b| std::fs::write(path, b));
        if let Err(e) = write {
            eprintln!("confine: cannot write --json-status {}: {e}", path.display());
            return super::EXIT_CONFINE_FAILED;
        }
    }
    code
}

#[cfg(target_os = "linux")]
async fn run(args: &RunArgs) -> Result<Outcome, SandboxError> {
    use tokio::signal::unix::{signal, SignalKind};
    let spec = job_spec(args)?;
    let job = crate::sandbox::linux::spawn(&spec, StdioSpec::inherit(), None).await?;
    let mut term = signal(SignalKind::terminate()).map_err(SandboxError::Spawn)?;
    let mut int = signal(SignalKind::interrupt()).map_err(SandboxError::Spawn)?;
    let mut hup = signal(SignalKind::hangup()).map_err(SandboxError::Spawn)?;
    let pid = job.pid();
    let forward = move |sig: nix::sys::signal::Signal| {
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        }
    };
    let wait = job.wait();
    tokio::pin!(wait);
    loop {
        tokio::select! {
            outcome = &mut wait => return Ok(outcome),
            _ = term.recv() => forward(nix::sys::signal::Signal::SIGTERM),
            _ = int.recv() => forward(nix::sys::signal::Signal::SIGINT),
            _ = hup.recv() => forward(nix::sys::signal::Signal::SIGHUP),
        }
    }
}

#[cfg(not(target_os = "linux"))]
async fn run(_args: &RunArgs) -> Result<Outcome, SandboxError> {
    Err(SandboxError::Unavailable("no sandbox backend for this platform yet".into()))
}
