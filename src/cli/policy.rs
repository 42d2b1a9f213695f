//! `confine policy check`: a dry run of admission. It builds the input
//! document a request would produce, runs the configured policy chain, and
//! prints the decision and the input. Nothing is executed.
//!
//! Exit status: 0 allowed, 1 denied, 2 the request itself is malformed,
//! 125 the configuration or a policy could not be loaded.

use crate::config::{Config, LimitRequest};
use crate::job::Network;
use crate::policy::input::ExecRequest;
use crate::policy::PolicyChain;
use crate::runtimes::{self, plan};
use crate::supervisor::cwd;
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Exit code of a denied request.
pub const EXIT_DENIED: i32 = 1;
/// Exit code of a malformed request.
pub const EXIT_BAD_REQUEST: i32 = 2;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Evaluate the policy for a request without running it; print the
    /// decision and the input document.
    #[command(after_help = "Examples:\n  confine policy check --runtime python --repo . --code 'print(1)'\n  \
confine policy check --runtime shell --repo . --executable curl -- https://example.com\n\n\
Exit status: 0 allowed, 1 denied, 2 malformed request, 125 configuration or policy error.")]
    Check(CheckArgs),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// One of: node typescript python shell go java kotlin rust c cpp csharp ruby php perl r elixir.
    #[arg(long, value_parser = super::args::runtime_names(), hide_possible_values = true)]
    pub runtime: String,
    /// Inline source (code mode). Exclusive with ARGS.
    #[arg(long, value_name = "SRC", conflicts_with = "code_file")]
    pub code: Option<String>,
    /// Read the inline source from FILE.
    #[arg(long, value_name = "FILE")]
    pub code_file: Option<PathBuf>,
    /// Override the runtime's default executable (must be compatible).
    #[arg(long)]
    pub executable: Option<String>,
    /// Register DIR as an ad-hoc repository for this request.
    #[arg(long, value_name = "DIR", conflicts_with = "repo_id")]
    pub repo: Option<PathBuf>,
    /// A repository configured in [[repos]].
    #[arg(long, value_name = "ID")]
    pub repo_id: Option<String>,
    /// Working directory relative to the repository root.
    #[arg(long, value_name = "REL")]
    pub cwd: Option<String>,
    /// none, host, or allow:HOST,… (as `confine exec --net`).
    #[arg(long, value_name = "MODE", default_value = "none", value_parser = super::args::network_modes(), hide_possible_values = true)]
    pub net: Network,
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    #[arg(long, value_name = "BYTES")]
    pub memory_bytes: Option<u64>,
    #[arg(long)]
    pub cpus: Option<f64>,
    #[arg(long)]
    pub pids: Option<u64>,
    /// Name of an environment variable the request passes through. Repeatable.
    #[arg(long = "env", value_name = "KEY")]
    pub env: Vec<String>,
    /// Arguments of the runtime's executable (args mode).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn main(config: Option<&Path>, cmd: PolicyCommand) -> i32 {
    match cmd {
        PolicyCommand::Check(args) => check(config, args),
    }
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    eprintln!("confine: {msg}");
    code
}

fn check(config: Option<&Path>, args: CheckArgs) -> i32 {
    let mut cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return fail(super::EXIT_CONFINE_FAILED, e),
    };
    let chain = match PolicyChain::from_config(&cfg.policy) {
        Ok(c) => c,
        Err(e) => return fail(super::EXIT_CONFINE_FAILED, e),
    };
    let code = match (&args.code, &args.code_file) {
        (Some(c), _) => Some(c.clone()),
        (None, Some(f)) => match std::fs::read_to_string(f) {
            Ok(c) => Some(c),
            Err(e) => return fail(EXIT_BAD_REQUEST, format!("--code-file {}: {e}", f.display())),
        },
        (None, None) => None,
    };
    let repo_id = match (&args.repo, &args.repo_id) {
        (Some(dir), _) => match std::fs::canonicalize(dir) {
            Ok(root) => Some(cfg.add_adhoc_repo("local", &root)),
            Err(e) => return fail(EXIT_BAD_REQUEST, format!("--repo {}: {e}", dir.display())),
        },
        (None, Some(id)) => match cfg.repo(id) {
            Ok(r) => Some(r.id.clone()),
            Err(e) => return fail(EXIT_BAD_REQUEST, e),
        },
        (None, None) => None,
    };
    let req = ExecRequest {
        repo_id,
        runtime: args.runtime.clone(),
        executable: args.executable.clone(),
        code,
        args: args.args.clone(),
        relative_cwd: args.cwd.clone(),
        limits: LimitRequest {
            timeout_ms: args.timeout_ms,
            memory_bytes: args.memory_bytes,
            cpus: args.cpus,
            pids: args.pids,
            output_bytes: None,
        },
        network: cfg.network.expand(&args.net).unwrap_or_else(|_| args.net.clone()),
        env_keys: args.env.clone(),
        stdin_bytes: 0,
    };
    if let Err(e) = req.check(&cfg.limits) {
        return fail(EXIT_BAD_REQUEST, e);
    }
    let rt = match runtimes::lookup(&req.runtime) {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_BAD_REQUEST, e),
    };
    if let Some(id) = &req.repo_id {
        let jailed = cfg
            .repo(id)
            .map_err(|e| e.to_string())
            .and_then(|r| cwd::jail(&r.root, req.relative_cwd.as_deref()).map_err(|e| e.to_string()));
        if let Err(e) = jailed {
            return fail(EXIT_BAD_REQUEST, e);
        }
    }
    let code_mode = req.code.is_some();
    let command = plan::requested_command(rt, req.executable.as_deref(), code_mode).to_string();
    let input = req.to_input(&command, cfg.limits.resolve(&req.limits));
    let decision = chain.decide(&input);
    let message = decision.denial_message(runtimes::basename(&command));
    let report = serde_json::json!({
        "allowed": decision.allowed,
        "message": message,
        "runtimeEnabled": cfg.runtime.enabled,
        "gate": (!cfg.runtime.enabled).then_some(crate::policy::DISABLED_REASON),
        "config": cfg.source.as_ref().map(|p| p.display().to_string()),
        "evaluators": chain.len(),
        "decision": decision,
        "input": input,
    });
    match serde_json::to_string_pretty(&report) {
        // A closed stdout (`| head`) is not an error of the check.
        Ok(text) => {
            let _ = writeln!(std::io::stdout(), "{text}");
        }
        Err(e) => return fail(super::EXIT_CONFINE_FAILED, e),
    }
    match message {
        Some(m) => fail(EXIT_DENIED, m),
        None => 0,
    }
}
