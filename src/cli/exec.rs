//! `confine exec`: one request through the whole governed pipeline (the
//! same one MCP uses), with the job's output passed through live by
//! default, or rendered in a response mode with `--output-mode`.

use crate::config::Config;
use crate::env::EnvArg;
use crate::job::{Network, Status};
use crate::output::modes::RenderOptions;
use crate::output::OutputMode;
use crate::relay::server::{Context, Listener};
use crate::relay::{ExecRelay, RelayError, RelayedCommand};
use crate::store::{StoreError, StoreLock};
use crate::supervisor::exec::{JobControl, JobRequest, JobResponse, Live};
use crate::supervisor::Supervisor;
use clap::Args;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  confine exec --repo . --runtime python --code 'print(6*7)'\n  \
confine exec --repo . --runtime shell -- -c 'make test'\n  \
confine exec --repo . --runtime rust --code-file main.rs --output-mode digest\n  \
echo data | confine exec --repo . --runtime shell -e MODE=ci -- -c 'echo \"$MODE\"; wc -c'\n\n\
Execution must be enabled in confine.toml ([runtime] enabled = true). Exit status follows `confine run`; \
125 when the request was denied, confine failed, or the job ran and its audit record could not be written; 130 when Ctrl-C cancelled it (128+N for signal N).")]
pub struct ExecArgs {
    /// Runtime: node typescript python shell go java kotlin rust c cpp csharp ruby php perl r elixir.
    #[arg(long, value_parser = super::args::runtime_names(), hide_possible_values = true)]
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
    /// Where the repository is inside: `/workspace`, `host` (its own real
    /// path, for a virtualenv or an editable install that holds it), or
    /// an absolute PATH (see `confine run --help`) [default: the
    /// repository's workspace_at in confine.toml, else /workspace].
    #[arg(long, value_name = "host|PATH")]
    pub workspace_at: Option<crate::sandbox::workspace_at::WorkspaceAt>,
    /// Working directory relative to the repository root.
    #[arg(long, value_name = "REL")]
    pub cwd: Option<String>,
    /// Feed FILE to the job's stdin (`-`: this process's stdin, as -i).
    /// At most limits.max_stdin_bytes of UTF-8 text (more is an error).
    #[arg(long, value_name = "FILE", conflicts_with = "interactive")]
    pub stdin_file: Option<PathBuf>,
    /// Pass this process's stdin to the job (`echo hi | confine exec -i
    /// …`), as docker's -i: read whole before the job starts, a terminal
    /// until end of file (Ctrl-D). Without it the job's stdin is empty and
    /// nothing is read, so that an exec inside `while read …; done < list`
    /// leaves the rest of the list to the loop.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Hard timeout (e.g. 30s, 500ms, 2m); the queue wait counts against it.
    #[arg(long, value_parser = parse_duration_ms, value_name = "DURATION")]
    pub timeout: Option<u64>,
    /// Override the runtime's executable (must be compatible, e.g. pypy3 for python).
    #[arg(long)]
    pub executable: Option<String>,
    /// Pass KEY from this environment, or set KEY=VAL; every KEY must be
    /// in sandbox.env_allowlist, set here or not. Repeatable.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VAL]")]
    pub env: Vec<EnvArg>,
    /// Read --env arguments from FILE, one per line, as `confine run
    /// --env-file` does (KEY=VAL or a bare KEY; every KEY must be in
    /// sandbox.env_allowlist). Repeatable; --env wins over it.
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
    /// Network: none, host, or allow:HOST,… (a proxy reaching only those
    /// hosts; see `confine run --help`). host and allow need the policy's consent.
    #[arg(long, value_name = "MODE", default_value = "none", value_parser = super::args::network_modes(), hide_possible_values = true)]
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
    /// Neither relay to the store's holder nor serve others: open the
    /// store in this process (failing on its lock, naming the holder, if
    /// another process has it). Without it, a `confine serve` holding the
    /// store runs the request (its queue, policy, warm sandboxes); a
    /// `confine exec` holding it runs it as this command would have; and
    /// an `exec` that takes the store runs the others' meanwhile.
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
    let max_stdin = config.limits.max_stdin_bytes;
    let stdin = match args.stdin_file.as_deref() {
        None if args.interactive => match read_stdin(bound(max_stdin), max_stdin) {
            Ok(s) => Some(s),
            Err(e) => return fail(e),
        },
        Some(f) if f == Path::new("-") => match read_stdin(bound(max_stdin), max_stdin) {
            Ok(s) => Some(s),
            Err(e) => return fail(format!("--stdin-file -: {e}")),
        },
        Some(f) => match crate::safe_fs::read_regular_string(f, bound(max_stdin)) {
            Ok(s) => Some(s),
            Err(e) => return fail(format!("--stdin-file: {e}")),
        },
        None => None,
    };
    let repo_id = match (&args.repo, &args.repo_id) {
        // Said here, naming the flag: the pipeline would name [[repos]].
        (Some(dir), _) if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) => {
            return fail(format!(
                "--repo {}: not a directory; give the repository's root directory (a file to run goes to \
                 --code-file)",
                dir.display()
            ))
        }
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
    // A root no repository of the configuration has: registered ad hoc.
    let adhoc_repo = (config.repos != loaded.repos)
        .then(|| repo_id.as_deref().and_then(|id| config.repo(id).ok()).map(|r| r.root.clone()))
        .flatten();
    if let Some(at) = &args.workspace_at {
        let Some(id) = &repo_id else {
            return fail(format!("--workspace-at {at}: name the repository with --repo or --repo-id"));
        };
        // An unknown id is the pipeline's to refuse, audited.
        if let Some(repo) = config.repos.iter_mut().find(|r| &r.id == id) {
            repo.workspace_at = at.clone();
        }
    }
    let mut given = Vec::new();
    for file in &args.env_file {
        // Every name is checked against the allowlist by the pipeline.
        match crate::env::read_env_file(file, |_| true) {
            Ok(args) => given.extend(args),
            Err(e) => return fail(e),
        }
    }
    given.extend(args.env.iter().cloned());
    let (env, env_unset) = request_env(&given, |k| std::env::var(k).ok());
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
        env_unset,
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
    if args.no_server {
        return run_here(config, req, live, &args, None);
    }
    let relayed = ExecRelay {
        request: req,
        live,
        adhoc_repo,
        workspace_at: args.workspace_at.clone(),
        allow_degraded: args.allow_degraded,
        path: std::env::var_os("PATH"),
        home: std::env::var_os("HOME").map(PathBuf::from),
    };
    let command = RelayedCommand::Exec(relayed);
    match hold_or_relay(&config.store_path(), &loaded, &command, &args) {
        Turn::Relayed(code) => code,
        Turn::Hold(lock) => {
            let RelayedCommand::Exec(relayed) = command else { return fail("not an exec") };
            run_here(config, relayed.request, live, &args, Some((lock, loaded)))
        }
    }
}

/// How long a `confine exec` keeps trying to either take the store or
/// reach its holder: the holder may be starting (the lock taken, its
/// socket not bound yet) or stopping (its socket gone, the lock not yet
/// released), each a matter of milliseconds. Past it, a holder that does
/// not serve (a `--no-server` exec, `confine audit`…) is named.
const HANDOVER_WAIT: Duration = Duration::from_secs(10);

/// Answers from a socket whose server does not hold the store, taken as a
/// holder that just left before the socket is reported (planted?).
const NOT_HOLDER_TRIES: u32 = 8;

/// What this `confine exec` does: run its request here, holding the store
/// (and serving others'), or have the store's holder run it.
enum Turn {
    Hold(StoreLock),
    Relayed(i32),
}

/// Relay `command` to the store's holder, or take the store. A holder
/// that closes the connection before it took the command was stopping: it
/// ran nothing, and the store is tried again, until [`HANDOVER_WAIT`].
fn hold_or_relay(store: &Path, loaded: &Config, command: &RelayedCommand, args: &ExecArgs) -> Turn {
    let stop = match StopWatch::start() {
        Ok(s) => s,
        Err(e) => return Turn::Relayed(fail(format!("cannot watch for Ctrl-C: {e}"))),
    };
    let turn = handover(store, loaded, command, args, &stop);
    if let Turn::Hold(_) = turn {
        stop.end();
    }
    turn
}

fn handover(store: &Path, loaded: &Config, command: &RelayedCommand, args: &ExecArgs, stop: &StopWatch) -> Turn {
    let deadline = Instant::now() + HANDOVER_WAIT;
    let mut pause = Duration::from_millis(1);
    let mut not_holder = 0;
    // The last holder that closed a connection unanswered.
    let mut not_taken = None;
    loop {
        match crate::relay::client::connect(store) {
            Some(Ok(conn)) => {
                let pid = conn.pid();
                stop.watch(&conn);
                let answer = conn.call(loaded, command);
                // The connection is closed: its number may be another's next.
                STOP_FD.store(-1, Ordering::SeqCst);
                match answer {
                    Err(RelayError::NotTaken { pid }) => {
                        tracing::debug!(pid, "the holder was stopping, or full; trying again");
                        not_taken = Some(pid);
                    }
                    r => return Turn::Relayed(relayed(r, pid, args, stop.stopped_by())),
                }
            }
            Some(Err(e @ RelayError::NotHolder { .. })) => {
                not_holder += 1;
                if not_holder >= NOT_HOLDER_TRIES {
                    return Turn::Relayed(fail(e));
                }
            }
            Some(Err(e)) => return Turn::Relayed(fail(e)),
            None => {}
        }
        match StoreLock::take(store) {
            Ok(lock) => return Turn::Hold(lock),
            Err(StoreError::Busy { .. }) if Instant::now() >= deadline && not_taken.is_some() => {
                return Turn::Relayed(fail(format!(
                    "the process holding the store (pid {}) took no more commands within {} s: it serves at \
                     most {} at once; try again when fewer run",
                    not_taken.unwrap_or_default(),
                    HANDOVER_WAIT.as_secs(),
                    crate::relay::server::MAX_CLIENTS
                )))
            }
            Err(e @ StoreError::Busy { .. }) if Instant::now() >= deadline => {
                return Turn::Relayed(fail(format!(
                    "{e} (it did not take this command on the store's socket within {} s: a `confine exec \
                     --no-server`, or a confine older than this one?)",
                    HANDOVER_WAIT.as_secs()
                )))
            }
            Err(StoreError::Busy { .. }) => {}
            Err(e) => return Turn::Relayed(fail(e)),
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Run the request in this process. With `hold` (the store's lock, and
/// the configuration as loaded), serve the store's socket meanwhile: other
/// `confine exec`s relay their requests here, and this process stays
/// until the last of them ends. Its own job's answer and exit status are
/// its own; its output streams are let go when its job ends.
fn run_here(config: Config, req: JobRequest, live: bool, args: &ExecArgs, hold: Option<(StoreLock, Config)>) -> i32 {
    // Before the runtime's threads: output capture must not grow the heap.
    crate::supervisor::tune_allocator();
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return fail(format!("cannot start the runtime: {e}")),
    };
    let store = config.store_path();
    let (lock, listener) = match hold {
        Some((lock, loaded)) => {
            let _entered = rt.enter();
            // Bound before anything else: a client waits from the moment
            // the lock is ours until this socket answers.
            match Listener::bind(&store) {
                Ok(l) => (Some(lock), Some((l, loaded))),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot listen on the store's socket: other `confine exec`s wait for this one");
                    (Some(lock), None)
                }
            }
        }
        None => (None, None),
    };
    let own_cancel = CancellationToken::new();
    // The signal that cancelled this command's job, for its exit status (0: none).
    let stopped_by = Arc::new(AtomicI32::new(0));
    let shutdown = CancellationToken::new();
    let own_done = CancellationToken::new();
    let resp = rt.block_on(async {
        watch_signals(own_cancel.clone(), own_done.clone(), shutdown.clone(), stopped_by.clone());
        // One request: the store opens while it is admitted and sandboxed,
        // and its sandbox is built while the policy compiles and decides
        // (held before the job's execve until both are done).
        let sup = Arc::new(Supervisor::open_one_shot_locked(config, Some(&req), lock).await?);
        let relay = listener.map(|(listener, loaded)| {
            let ctx = Context::for_exec(loaded, sup.clone(), shutdown.clone(), own_done.clone());
            tokio::spawn(listener.serve(Arc::new(ctx)))
        });
        let cancel = Box::pin(own_cancel.clone().cancelled_owned());
        let ctl = JobControl { live: live.then_some(Live::Own), cancel: Some(cancel), ..JobControl::default() };
        let resp = sup.execute(req, ctl).await;
        // A stage or held sandbox left unused (the request was denied) is killed now.
        sup.discard_prestarted();
        let code = report(&resp, args, Some(stopped_by.load(Ordering::SeqCst)).filter(|s| *s != 0));
        // After the answer: a GC run the job started finishes before we exit.
        sup.wait_for_gc().await;
        own_done.cancel();
        if let Some(relay) = relay {
            if !relay.is_finished() {
                // The caller has all of this command's output: its pipes
                // see their end now, while relayed jobs still run here.
                let_go_of_output();
            }
            let _ = relay.await;
        }
        Ok::<_, crate::supervisor::SupervisorError>((code, sup))
    });
    let (code, sup) = match resp {
        Ok(r) => r,
        Err(e) => return fail(e.to_string()),
    };
    // The audit record and the artifact were flushed (one fsync) before the
    // answer, and the GC is done: the process exits now, without sled's
    // drop-time flush and fsync or the joins of its and tokio's threads
    // (a store must survive an exit at any point anyway).
    std::mem::forget(sup);
    rt.shutdown_background();
    code
}

/// Cancel `own` on SIGINT, SIGTERM or SIGHUP, recording the first in
/// `got`: this command's job ends, and jobs relayed here run on (they are
/// other commands', each cancelled by its own client). A second one, or
/// one after the own job is `done`, cancels `all`, which ends them too.
fn watch_signals(own: CancellationToken, done: CancellationToken, all: CancellationToken, got: Arc<AtomicI32>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut i), Ok(mut t), Ok(mut h)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup()))
        else {
            return;
        };
        loop {
            let sig = tokio::select! {
                _ = i.recv() => libc::SIGINT,
                _ = t.recv() => libc::SIGTERM,
                _ = h.recv() => libc::SIGHUP,
            };
            if own.is_cancelled() || done.is_cancelled() {
                all.cancel();
                return;
            }
            let _ = got.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
            own.cancel();
        }
    });
}

/// Point standard output and error at /dev/null: what a caller reads
/// from them ends, while this process stays for jobs relayed to it.
fn let_go_of_output() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else { return };
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 onto a standard descriptor from one we own; the
        // old description is closed by the kernel.
        unsafe {
            libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
        }
    }
}

/// The answer of the store's holder to a relayed request, reported as
/// this process's own.
fn relayed(r: Result<crate::relay::Reply, RelayError>, pid: u32, args: &ExecArgs, stopped_by: Option<i32>) -> i32 {
    match r {
        Ok(crate::relay::Reply { exec: Some(resp), .. }) => report(&resp, args, stopped_by),
        Ok(crate::relay::Reply { error: Some(e), .. }) => fail(e),
        Ok(_) => fail(format!("the process holding the store (pid {pid}) answered without a response")),
        Err(e) => fail(e),
    }
}

/// The variables of a request, later arguments winning, and the names
/// given bare that `lookup` does not know: those set nothing (as docker's
/// `-e KEY` for an unset KEY) but still go to the allowlist.
fn request_env(given: &[EnvArg], lookup: impl Fn(&str) -> Option<String>) -> (Vec<(String, String)>, Vec<String>) {
    let (mut env, mut unset): (Vec<(String, String)>, Vec<String>) = (Vec::new(), Vec::new());
    for arg in given {
        match arg.value.clone().or_else(|| lookup(&arg.key)) {
            Some(value) => match env.iter_mut().find(|(k, _)| *k == arg.key) {
                Some(slot) => slot.1 = value,
                None => env.push((arg.key.clone(), value)),
            },
            None if !unset.contains(&arg.key) => unset.push(arg.key.clone()),
            None => {}
        }
    }
    (env, unset)
}

/// This process's stdin, to end of file: at most `bound` bytes (more is
/// refused here; between `max` and `bound` the pipeline refuses it, and
/// audits the refusal), UTF-8, as a request carries it.
fn read_stdin(bound: u64, max: u64) -> Result<String, String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::io::stdin()
        .lock()
        .take(bound.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read stdin: {e}"))?;
    if buf.len() as u64 > bound {
        return Err(format!(
            "stdin is more than {bound} bytes, above the limit of {max} bytes (limits.max_stdin_bytes); \
             pass less, raise the limit, or run it with `confine run`, which streams stdin"
        ));
    }
    String::from_utf8(buf).map_err(|_| {
        "stdin is not UTF-8 text, which is all a request carries: run it with `confine run`, which passes any \
         bytes"
            .to_string()
    })
}

/// Ctrl-C (SIGINT), SIGTERM or SIGHUP while a relayed `exec` runs: the
/// holder is told (this end of the connection shut for writing, which it
/// reads as the caller gone), cancels the job and still answers, and this
/// process prints that answer's summary line as for any end. A second one,
/// or one before any connection (nothing ran), exits at once.
///
/// A signal handler, not a thread in sigwait: the handover may end with
/// this process taking the store itself, whose runtime then handles these
/// signals its own way, so the watch must be undone ([`StopWatch::end`]),
/// which a thread blocked in sigwait could not be.
struct StopWatch;

/// The connection's socket the handler shuts (-1: none yet).
static STOP_FD: AtomicI32 = AtomicI32::new(-1);
/// The first signal caught (0: none).
static STOP_GOT: AtomicI32 = AtomicI32::new(0);
const STOP_SIGNALS: [nix::sys::signal::Signal; 3] =
    [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGHUP];

extern "C" fn on_stop(sig: libc::c_int) {
    // Only async-signal-safe calls here: atomics, shutdown(2), _exit(2).
    if STOP_GOT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
        let fd = STOP_FD.load(Ordering::SeqCst);
        if fd >= 0 {
            // SAFETY: shutdown on a descriptor number; a stale one fails harmlessly.
            unsafe { libc::shutdown(fd, libc::SHUT_WR) };
            return;
        }
    }
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(128 + sig) };
}

impl StopWatch {
    fn start() -> nix::Result<StopWatch> {
        use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
        let action = SigAction::new(SigHandler::Handler(on_stop), SaFlags::SA_RESTART, SigSet::empty());
        for sig in STOP_SIGNALS {
            // SAFETY: `on_stop` makes only async-signal-safe calls.
            unsafe { sigaction(sig, &action) }?;
        }
        Ok(StopWatch)
    }

    /// Watch `conn` from now on.
    fn watch(&self, conn: &crate::relay::client::Connection) {
        STOP_FD.store(conn.raw_fd(), Ordering::SeqCst);
    }

    /// The signals back to their defaults: this process takes the store.
    /// One caught meanwhile (nothing ran yet) is raised again.
    fn end(self) {
        use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
        STOP_FD.store(-1, Ordering::SeqCst);
        let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        for sig in STOP_SIGNALS {
            // SAFETY: restoring the default disposition.
            let _ = unsafe { sigaction(sig, &default) };
        }
        let got = STOP_GOT.load(Ordering::SeqCst);
        if got != 0 {
            std::process::exit(128 + got);
        }
    }

    fn stopped_by(&self) -> Option<i32> {
        Some(STOP_GOT.load(Ordering::SeqCst)).filter(|s| *s != 0)
    }
}

/// Print the answer and return the exit status. `stopped_by`: the signal
/// that made this process cancel the job, which then exits as a program
/// ended by it would (130 for Ctrl-C), not as the tree kill that followed
/// (137, which means the memory limit).
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
    if let Some(full) = resp.outcome.as_ref().and_then(|o| o.tmp_full.as_ref()) {
        eprintln!("confine: note: {}", full.message);
    }
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
    fn env_arguments_become_values_and_unset_names() {
        let host = |k: &str| (k == "EDITOR").then(|| "vi".to_string());
        let given: Vec<EnvArg> =
            ["A=1", "EDITOR", "NOPE", "A=2", "NOPE", "B="].iter().map(|s| s.parse().unwrap()).collect();
        let (env, unset) = request_env(&given, host);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, [("A", "2"), ("EDITOR", "vi"), ("B", "")]);
        assert_eq!(unset, ["NOPE"]);
    }

    #[test]
    fn exec_takes_env_as_run_does() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            exec: ExecArgs,
        }
        let cli = Cli::try_parse_from(["x", "--runtime", "shell", "-e", "FOO=bar", "--env", "HOME", "--env-file", "f"])
            .unwrap();
        assert_eq!(cli.exec.env[0], EnvArg { key: "FOO".into(), value: Some("bar".into()) });
        assert_eq!(cli.exec.env[1], EnvArg { key: "HOME".into(), value: None });
        assert_eq!(cli.exec.env_file, [PathBuf::from("f")]);
        let e = Cli::try_parse_from(["x", "--runtime", "shell", "-e", "A-B=1"]).err().unwrap().to_string();
        assert!(e.contains("'A-B' is not a variable name"), "{e}");
    }

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
