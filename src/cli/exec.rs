//! `confine exec`: one request through the whole governed pipeline (the
//! same one MCP uses), with the job's output passed through live by
//! default, or rendered in a response mode with `--output-mode`.

use crate::config::Config;
use crate::job::{Network, Status};
use crate::output::modes::RenderOptions;
use crate::output::OutputMode;
use crate::supervisor::exec::{JobControl, JobRequest, JobResponse, Live};
use crate::supervisor::Supervisor;
use clap::Args;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  confine exec --repo . --runtime python --code 'print(6*7)'\n  \
confine exec --repo . --runtime shell -- -c 'make test'\n  \
confine exec --repo . --runtime rust --code-file main.rs --output-mode digest\n\n\
Execution must be enabled in confine.toml ([runtime] enabled = true). Exit status follows `confine run`; \
125 when the request was denied, confine failed, or the job ran and its audit record could not be written; 130 when Ctrl-C cancelled it (128+N for signal N).")]
pub struct ExecArgs {
    /// Runtime: node typescript python shell go java kotlin rust c cpp csharp ruby php perl r elixir.
    #[arg(long)]
    pub runtime: String,
    /// Inline source to run (code mode).
    #[arg(long, conflicts_with_all = ["code_file", "args"])]
    pub code: Option<String>,
    /// Read the source from FILE (code mode).
    #[arg(long, value_name = "FILE", conflicts_with = "args")]
    pub code_file: Option<PathBuf>,
    /// Repository root to mount at /workspace (registered ad hoc).
    #[arg(long, value_name = "DIR", conflicts_with = "repo_id")]
    pub repo: Option<PathBuf>,
    /// A repository of [[repos]] in confine.toml.
    #[arg(long, value_name = "ID")]
    pub repo_id: Option<String>,
    /// Working directory relative to the repository root.
    #[arg(long, value_name = "REL")]
    pub cwd: Option<String>,
    /// Feed FILE to the job's stdin.
    #[arg(long, value_name = "FILE")]
    pub stdin_file: Option<PathBuf>,
    /// Hard timeout (e.g. 30s, 500ms, 2m); the queue wait counts against it.
    #[arg(long, value_parser = parse_duration_ms, value_name = "DURATION")]
    pub timeout: Option<u64>,
    /// Override the runtime's executable (must be compatible, e.g. pypy3 for python).
    #[arg(long)]
    pub executable: Option<String>,
    /// Pass KEY from this environment (it must be in sandbox.env_allowlist). Repeatable.
    #[arg(long = "env", value_name = "KEY")]
    pub env: Vec<String>,
    /// Network: none, host, or allow:HOST,… (a proxy reaching only those
    /// hosts; see `confine run --help`). host and allow need the policy's consent.
    #[arg(long, value_name = "MODE", default_value = "none", value_parser = Network::parse_arg)]
    pub net: Network,
    /// Render the output (minimal, summary, intent, digest) instead of passing it through.
    #[arg(long, value_name = "MODE")]
    pub output_mode: Option<OutputMode>,
    /// Terms for the summary and intent modes (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "TERMS")]
    pub query_terms: Vec<String>,
    /// Lines of head and tail in summary mode (10–1000).
    #[arg(long, value_name = "N")]
    pub max_response_lines: Option<u32>,
    /// Keep no artifact of the output.
    #[arg(long)]
    pub no_persist: bool,
    /// Print the whole response as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Run even when an isolation layer can't be applied (rootless without
    /// a delegated cgroup: rlimits stand in), or on a weaker backend; the
    /// outcome names what is missing. Same as allow_degraded = true under
    /// [runtime] in confine.toml.
    #[arg(long)]
    pub allow_degraded: bool,
    /// Open the store in this process even when a `confine serve` holds it
    /// (the command then fails on the store's lock, naming the server).
    /// Without it, such a server runs the request: its queue, policy and
    /// store, its warm sandboxes.
    #[arg(long)]
    pub no_server: bool,
    /// Arguments of the runtime's executable (args mode).
    #[arg(last = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

/// A positive duration in the grammar of every duration flag
/// ([`super::args::parse_duration`]: `30s`, `500ms`, `1.5s`, `2m`, `1h`, a
/// bare number is seconds), in whole milliseconds, rounded up.
pub fn parse_duration_ms(s: &str) -> Result<u64, super::args::ArgError> {
    let d = super::args::parse_positive_duration(s)?;
    Ok(d.as_nanos().div_ceil(1_000_000).try_into().unwrap_or(u64::MAX))
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("confine: {msg}");
    super::EXIT_CONFINE_FAILED
}

pub fn main(config_path: Option<&Path>, args: ExecArgs) -> i32 {
    let mut config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    // As loaded: what a running server must run with too.
    let loaded = config.clone();
    if args.allow_degraded {
        config.runtime.allow_degraded = true;
    }
    // Read as `safe_fs` reads what a job may have planted (a code file
    // in a repository that jobs write to): never through a symlink, never
    // blocking on a FIFO, and bounded. The bound is twice what a request
    // may carry, so that a file just over the limit still becomes a
    // request, refused by the pipeline and audited like any other.
    let bound = |max: u64| max.saturating_mul(2).max(1 << 20);
    let code = match (&args.code, &args.code_file) {
        (Some(c), _) => Some(c.clone()),
        (None, Some(f)) => match crate::safe_fs::read_regular_string(f, bound(config.limits.max_code_bytes)) {
            Ok(c) => Some(c),
            Err(e) => return fail(format!("--code-file: {e}")),
        },
        (None, None) => None,
    };
    let stdin = match &args.stdin_file {
        Some(f) => match crate::safe_fs::read_regular_string(f, bound(config.limits.max_stdin_bytes)) {
            Ok(s) => Some(s),
            Err(e) => return fail(format!("--stdin-file: {e}")),
        },
        None => None,
    };
    let repo_id = match (&args.repo, &args.repo_id) {
        (Some(dir), _) => match std::fs::canonicalize(dir) {
            // Through a symlink, the path as given is kept, so that the
            // plan sees the link and never idmaps where it leads.
            Ok(root) if crate::safe_fs::through_symlink(dir, &root) => {
                Some(config.add_adhoc_repo("cli", &std::path::absolute(dir).unwrap_or(root)))
            }
            Ok(root) => Some(config.add_adhoc_repo("cli", &root)),
            Err(e) => return fail(format!("--repo {}: {e}", dir.display())),
        },
        (None, id) => id.clone(),
    };
    let adhoc = config.repos != loaded.repos;
    let env = args.env.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.clone(), v))).collect();
    let req = JobRequest {
        repo_id,
        runtime: args.runtime.clone(),
        executable: args.executable.clone(),
        args: args.args.clone(),
        code,
        stdin,
        relative_cwd: args.cwd.clone(),
        timeout_ms: args.timeout,
        network: args.net.clone(),
        env,
        persist_output: Some(!args.no_persist),
        render: RenderOptions {
            output_mode: args.output_mode.unwrap_or_default(),
            max_response_lines: args.max_response_lines,
            query_terms: args.query_terms.clone(),
            inline_bytes: None,
        },
        ..JobRequest::default()
    };
    let live = args.output_mode.is_none() && !args.json;
    if let Some(conn) = crate::relay::client::connect(&config.store_path()).filter(|_| !args.no_server) {
        return relay(conn, &loaded, req, live, adhoc, &args);
    }
    // Before the runtime's threads: output capture must not grow the heap.
    crate::supervisor::tune_allocator();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    // The signal that cancelled the job, for the exit status (0: none).
    let stopped_by = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let got = stopped_by.clone();
    let resp = rt.block_on(async move {
        // One request: the store opens while it is admitted and sandboxed,
        // and its sandbox is built while the policy compiles and decides
        // (held before the job's execve until both are done).
        let sup = Supervisor::open_one_shot(config, Some(&req)).await?;
        let cancel = Box::pin(async move {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
                (Ok(mut i), Ok(mut t), Ok(mut h)) => {
                    let sig = tokio::select! {
                        _ = i.recv() => libc::SIGINT,
                        _ = t.recv() => libc::SIGTERM,
                        _ = h.recv() => libc::SIGHUP,
                    };
                    got.store(sig, std::sync::atomic::Ordering::SeqCst);
                }
                _ => std::future::pending::<()>().await,
            }
        });
        let ctl = JobControl { live: live.then_some(Live::Own), cancel: Some(cancel), ..JobControl::default() };
        Ok::<_, crate::supervisor::SupervisorError>((sup.execute(req, ctl).await, sup))
    });
    let (resp, sup) = match resp {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    // A stage or held sandbox left unused (the request was denied) is killed now.
    sup.discard_prestarted();
    let code = report(&resp, &args, Some(stopped_by.load(std::sync::atomic::Ordering::SeqCst)).filter(|s| *s != 0));
    // After the answer: a GC run the job started finishes before we exit.
    rt.block_on(sup.wait_for_gc());
    // The audit record and the artifact were flushed (one fsync) before the
    // answer, and the GC is done: the process exits now, without sled's
    // drop-time flush and fsync or the joins of its and tokio's threads
    // (a store must survive an exit at any point anyway).
    std::mem::forget(sup);
    rt.shutdown_background();
    code
}

/// Run the request on the `confine serve` that holds the store: the job
/// is that server's, its output comes here as it runs, and Ctrl-C here
/// kills it.
fn relay(
    conn: Result<crate::relay::client::Connection, crate::relay::RelayError>,
    loaded: &Config,
    request: JobRequest,
    live: bool,
    adhoc: bool,
    args: &ExecArgs,
) -> i32 {
    let conn = match conn {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let pid = conn.pid();
    if adhoc {
        return fail(format!(
            "the store is held by `confine serve` (pid {pid}), which runs only the repositories of its \
             configuration, and --repo is not one of them: add it under [[repos]] in the configuration, \
             or stop the server"
        ));
    }
    if args.allow_degraded && !loaded.runtime.allow_degraded {
        return fail(format!(
            "the store is held by `confine serve` (pid {pid}), whose configuration does not allow degraded \
             runs: set allow_degraded = true under [runtime] there, or stop the server"
        ));
    }
    let command = crate::relay::RelayedCommand::Exec(crate::relay::ExecRelay { request, live });
    let stopped_by = match cancel_on_stop(&conn) {
        Ok(s) => s,
        Err(e) => return fail(format!("cannot watch for Ctrl-C: {e}")),
    };
    match conn.call(loaded, &command) {
        Ok(reply) => match reply.exec {
            Some(resp) => {
                report(&resp, args, Some(stopped_by.load(std::sync::atomic::Ordering::SeqCst)).filter(|s| *s != 0))
            }
            None => fail(format!("the running `confine serve` (pid {pid}) answered without a response")),
        },
        Err(e) => fail(e),
    }
}

/// Print the answer and return the exit status. `stopped_by`: the signal
/// that made this process cancel the job, which then exits as a program
/// ended by it would (130 for Ctrl-C), not as the tree kill that followed
/// (137, which means the memory limit).
/// Ctrl-C (SIGINT), SIGTERM or SIGHUP during a relayed `exec`: the server
/// is told (this end of the connection shut for writing, which it reads as
/// the caller gone), cancels the job and still answers, and this process
/// prints that answer's summary line as for any end. A second one exits at
/// once. Returns where the first signal is recorded (0: none).
fn cancel_on_stop(
    conn: &crate::relay::client::Connection,
) -> std::io::Result<std::sync::Arc<std::sync::atomic::AtomicI32>> {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    // Blocked here before the thread starts (it inherits the mask), so
    // that the thread's sigwait takes each one.
    set.thread_block().map_err(std::io::Error::from)?;
    let socket = conn.try_clone_stream()?;
    let got = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let seen = got.clone();
    std::thread::Builder::new().name("confine-stop".into()).spawn(move || {
        let Ok(first) = set.wait() else { return };
        seen.store(first as i32, std::sync::atomic::Ordering::SeqCst);
        let _ = socket.shutdown(std::net::Shutdown::Write);
        if let Ok(second) = set.wait() {
            std::process::exit(128 + second as i32);
        }
    })?;
    Ok(got)
}

fn report(resp: &JobResponse, args: &ExecArgs, stopped_by: Option<i32>) -> i32 {
    if args.json {
        match serde_json::to_string_pretty(resp) {
            Ok(s) => outln!("{s}"),
            Err(e) => return fail(e),
        }
    } else if let (Some(_), Some(view)) = (args.output_mode, &resp.output) {
        print_view(view);
    } else if let Some(view) = &resp.output {
        // The output went to the terminal as it came; what went wrong
        // storing it (a full disk) is said here, or nowhere.
        for n in &view.notes {
            eprintln!("confine: note: {n}");
        }
    }
    let status =
        serde_json::to_value(resp.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
    let mut line = format!("confine: {status}");
    if let Some(c) = resp.exit_code {
        line.push_str(&format!(" exit={c}"));
    }
    if let Some(s) = resp.signal {
        line.push_str(&format!(" signal={s}"));
    }
    line.push_str(&format!(" {}ms", resp.duration_ms));
    if resp.queued_ms > 0 {
        line.push_str(&format!(" (queued {}ms)", resp.queued_ms));
    }
    if let Some(h) = &resp.artifact_handle {
        line.push_str(&format!(" artifact={h}"));
    }
    if let Some(t) = resp.output.as_ref().and_then(|o| o.truncation.as_ref()) {
        let cut: Vec<&str> = [("stdout", t.stdout_truncated), ("stderr", t.stderr_truncated)]
            .into_iter()
            .filter_map(|(name, cut)| cut.then_some(name))
            .collect();
        if !cut.is_empty() {
            line.push_str(&format!(" truncated={}", cut.join(",")));
        }
    }
    if !resp.clamped.is_empty() {
        line.push_str(&format!(" clamped={}", resp.clamped.join(",")));
    }
    if let Some(o) = resp.outcome.as_ref().filter(|o| o.backend != "linux") {
        line.push_str(&format!(" backend={}", o.backend));
        if let Some(weaker) = o.guarantees.weaker() {
            line.push_str(&format!(" ({weaker})"));
        }
    }
    if let Some(e) = &resp.error {
        line.push_str(&format!(": {e}"));
    }
    eprintln!("{line}");
    match (&resp.outcome, resp.status) {
        // The job ran, and the trail lacks its end: not a success.
        _ if resp.unrecorded => super::EXIT_CONFINE_FAILED,
        (Some(_), Status::Cancelled) if stopped_by.is_some() => 128 + stopped_by.unwrap_or_default(),
        (Some(o), _) => o.cli_exit_code(),
        (None, Status::Denied) | (None, _) => super::EXIT_CONFINE_FAILED,
    }
}

fn print_view(view: &crate::output::modes::OutputView) {
    // A small output is whole (`stdout`, `stderr`); a larger one summed up.
    if let Some(s) = view.stdout.as_ref().or(view.stdout_summary.as_ref()) {
        outln!("{s}");
    }
    if let Some(s) = view.stderr.as_ref().or(view.stderr_summary.as_ref()) {
        outln!("--- stderr ---\n{s}");
    }
    for ex in view.excerpts.iter().flatten() {
        outln!("--- {} lines {}-{} ---\n{}", ex.source, ex.line_start, ex.line_end, ex.content);
    }
    for sec in view.sections.iter().flatten() {
        if let Ok(s) = serde_json::to_string(sec) {
            outln!("section: {s}");
        }
    }
    if let Some(d) = &view.digest {
        if let Ok(s) = serde_json::to_string_pretty(d) {
            outln!("{s}");
        }
    }
    for n in &view.notes {
        outln!("note: {n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("500ms"), Ok(500));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("1.5"), Ok(1500));
        assert_eq!(parse_duration_ms("1h"), Ok(3_600_000));
        assert_eq!(parse_duration_ms("0.0004s"), Ok(1));
        assert_eq!(parse_duration_ms("0.0000001"), Ok(1));
        for bad in ["soon", "-1s", "0", "1d"] {
            assert!(parse_duration_ms(bad).is_err(), "{bad}");
        }
    }
}
