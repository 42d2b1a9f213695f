//! `confine run`: one job in a fresh sandbox, streams passed through, the
//! job's exit status returned (docker/podman conventions).

use super::args::{
    parse_cpus, parse_duration, parse_hostname, parse_memory, parse_pids, parse_positive_duration, parse_tmp_size,
    parse_user, Limit,
};
use crate::config::Config;
use crate::env::{scrubbed, EnvArg};
use crate::job::{Bind, JobSpec, Network, Outcome};
use crate::sandbox::workspace_at::WorkspaceAt;
use crate::sandbox::{BackendChoice, BackendKind, Job, Launch, SandboxError, StdioSpec, Stop};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
#[command(after_help = "Defaults: the [limits] of confine.toml apply (512M of memory, 1 CPU, 256 \
processes); lift one with `unlimited`, e.g. --pids unlimited. In a --rw workspace, .git (and a \
core.hooksPath inside the workspace) stays read-only (--protect adds paths, --no-protect lifts them). \
The job has a session of its own and no terminal: a terminal or file on the standard streams \
is relayed through pipes (--tty gives it a pty of its own; -i passes what you type on a \
terminal to its stdin).\n\n\
Signals sent to confine reach the job; TERM, INT and HUP also end it after --kill-grace. \
Ctrl-Z stops the job and confine, `fg` continues both; --timeout runs on meanwhile.\n\n\
Exit status: the command's own; 128+N when killed by signal N; \
124 when --timeout or --cpu-time ended it; 137 when the memory limit's OOM killer did; \
125 when confine failed; 126 when the command can't be executed; 127 when it is not found.")]
pub struct RunArgs {
    /// Host directory mounted at /workspace, or where --workspace-at
    /// says (read-only unless --rw).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Mount the workspace read-write.
    #[arg(long, requires = "workspace")]
    pub rw: bool,
    /// Where the workspace is inside: `/workspace`, `host` (its own real
    /// path, as `docker run -v "$PWD:$PWD" -w "$PWD"`: a virtualenv, an
    /// editable install or compile_commands.json that hold the
    /// checkout's path then work inside), or an absolute PATH. Not /,
    /// /tmp, /usr, /etc…, nor under /proc or /dev [default: /workspace].
    #[arg(long, value_name = "host|PATH", requires = "workspace")]
    pub workspace_at: Option<WorkspaceAt>,
    /// Network: `none` (only the job's own lo, where its local servers
    /// work), `host` (the host's network), or
    /// `allow:HOST,…` (the same lo, and a proxy in confine that reaches these
    /// hosts on ports 443 and 80: `name`, `*.suffix`, `host:port`, an
    /// address, `@list` of confine.toml's [network.allow]).
    #[arg(
        long,
        visible_alias = "network",
        value_name = "MODE",
        default_value = "none",
        value_parser = super::args::network_modes(),
        hide_possible_values = true
    )]
    pub net: Network,
    /// Hostname inside the sandbox: letters, digits and '-' in
    /// dot-separated labels (RFC 1123), at most 64 characters.
    #[arg(long, default_value = "confine", value_parser = parse_hostname)]
    pub hostname: String,
    /// Pass KEY from this environment, or set KEY=VAL (KEY: letters,
    /// digits and _, not starting with a digit). Repeatable. Nothing else
    /// of confine's environment reaches the job.
    #[arg(long = "env", short = 'e', value_name = "KEY[=VAL]")]
    pub env: Vec<EnvArg>,
    /// Read --env arguments from FILE, one per line, as docker does:
    /// KEY=VAL, or a bare KEY to pass this environment's value (a file may
    /// name bare only a KEY of sandbox.env_allowlist in confine.toml or
    /// one given with -e: it may be a file a job wrote); blank lines and
    /// lines starting with # are skipped; no quotes are removed.
    /// Repeatable; --env wins over it.
    #[arg(long, value_name = "FILE")]
    pub env_file: Vec<PathBuf>,
    /// Bind a host path read-only: SRC or SRC:DEST. Repeatable. A DEST in
    /// the read-only /usr or /etc must exist there (as with bwrap). The
    /// host's `/` as SRC is refused: its unix sockets (tmux, ssh-agent)
    /// would reach the host.
    #[arg(long = "ro-bind", value_name = "SRC[:DEST]")]
    pub ro_bind: Vec<String>,
    /// Bind a host path read-write: SRC or SRC:DEST. Repeatable.
    #[arg(long = "bind", value_name = "SRC[:DEST]")]
    pub bind: Vec<String>,
    /// Docker's bind: SRC:DEST, read-write, or SRC:DEST:ro, read-only
    /// (as --bind and --ro-bind). SRC is a host path; docker's named
    /// volumes and its other options do not exist here. Repeatable.
    #[arg(long = "volume", short = 'v', value_name = "SRC:DEST[:ro]")]
    pub volume: Vec<String>,
    /// Working directory inside the sandbox; a relative DIR is taken from
    /// the workspace (default: the workspace, else /tmp).
    #[arg(long, short = 'w', visible_alias = "workdir", value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Write the outcome as JSON to FILE when the job ends (`-`: to
    /// stdout, after the job's output). FILE's directory is opened before
    /// the job starts, and what is at FILE then is removed (a stale
    /// outcome of an earlier run). At the end the file is written whole
    /// beside it and renamed over the name (never opened): what the job
    /// leaves at that name is not followed.
    #[arg(long, value_name = "FILE")]
    pub json_status: Option<PathBuf>,
    /// In a --rw workspace, keep PATH (relative to it) read-only as well.
    /// Repeatable. PATH must exist.
    #[arg(long, value_name = "PATH", requires = "rw")]
    pub protect: Vec<PathBuf>,
    /// Do not keep the .git of a --rw workspace read-only: the job can then
    /// commit, and also plant code your next `git` command runs.
    #[arg(long)]
    pub no_protect: bool,
    /// The uid (and gid) the job has inside, as docker's -u: numbers, or
    /// names the sandbox's /etc/passwd and /etc/group know. 0 (root) is
    /// allowed: it is root of the job's own user namespace, with no
    /// capability, and its host uid stays the unprivileged one the
    /// outcome names (layers.hostUid). Without a GID: the user's group
    /// in /etc/passwd, else 0 [default: the host ids' numbers].
    #[arg(long, short = 'u', value_name = "UID[:GID]", value_parser = parse_user)]
    pub user: Option<(u32, u32)>,
    /// Give the job a terminal of its own (a pty that confine relays, with
    /// yours in raw mode, at /dev/console), as `docker run -t` does.
    /// Without it the job has no terminal; either way it can open ptys of
    /// its own (openpty, pexpect) in its private /dev/pts.
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Pass what is typed on your terminal to the job's stdin (docker's
    /// `-i`). Without it a job whose stdin is your terminal reads end of
    /// file, and what you type ahead stays for your shell. Pipes and files
    /// on stdin always reach the job.
    #[arg(long, short = 'i')]
    pub interactive: bool,
    /// Run even when an isolation layer can't be applied, or on a weaker
    /// backend; the outcome names what is missing. (Also allow_degraded
    /// under [runtime] in confine.toml.)
    #[arg(long)]
    pub allow_degraded: bool,
    /// Sandbox backend: `auto` is the strongest this build has (linux on
    /// Linux) and never silently a weaker one; `unix-fallback` and `windows`
    /// need --allow-degraded [default: runtime.backend in confine.toml, else auto]
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// seccomp profile in OCI/Docker JSON format (default: the embedded seccomp/default.json)
    #[arg(long, value_name = "FILE")]
    pub seccomp: Option<PathBuf>,
    /// Memory limit of the whole job (cgroup; no swap), e.g. 256M or 1G, or
    /// `unlimited` [default: limits.memory_bytes of confine.toml, 512M].
    #[arg(long, value_name = "SIZE", value_parser = parse_memory)]
    pub memory: Option<Limit<u64>>,
    /// CPU quota in cores (cgroup CPU bandwidth), e.g. 0.5, or `unlimited`
    /// [default: limits.cpus of confine.toml, 1].
    #[arg(long, value_name = "CORES", value_parser = parse_cpus)]
    pub cpus: Option<Limit<f64>>,
    /// Most processes and threads the job may have at once (cgroup
    /// pids.max), or `unlimited` [default: limits.pids of confine.toml, 256].
    #[arg(long, value_name = "N", value_parser = parse_pids)]
    pub pids: Option<Limit<u64>>,
    /// Wall-clock limit, e.g. 30s, 500ms or 2m: SIGTERM, then the whole tree
    /// is killed after --kill-grace; exit status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub timeout: Option<Duration>,
    /// CPU-time limit of the whole tree (all cores together), e.g. 20s; exit status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub cpu_time: Option<Duration>,
    /// Size cap of the private /tmp (also HOME) and /dev/shm [default: 64M]; a full /tmp is named.
    #[arg(long, value_name = "SIZE", value_parser = parse_tmp_size)]
    pub tmp_size: Option<u64>,
    /// Time between the signal and the tree kill, on timeout (SIGTERM) or when confine gets TERM, INT or HUP.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub kill_grace: Duration,
    /// Parent of the job cgroups (`<CGROUP>/confine/<job-id>`), as a cgroup path
    /// such as /confine.slice [default: `sandbox.cgroup_parent` of the config, else
    /// confine's own cgroup].
    #[arg(long, value_name = "CGROUP")]
    pub cgroup_parent: Option<PathBuf>,
    /// Run the job in this process even when a `confine serve` holds the
    /// store. Without it, such a server starts the job (in a sandbox it
    /// built ahead, when one fits), with this process's streams, and its
    /// outcome is this command's; --tty, --seccomp, --cgroup-parent,
    /// --backend other than auto or linux, --allow-degraded, and a stdin
    /// that must be copied (a file, or a terminal with -i) always run here.
    #[arg(long)]
    pub no_server: bool,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A bind as given on the command line: its flag and text (for
/// messages), its source and destination, and whether it is writable.
struct BindArg {
    given: String,
    src: String,
    dest: String,
    writable: bool,
}

/// Every bind of the command line, in one order: --ro-bind, --bind, -v.
fn bind_args(args: &RunArgs) -> Result<Vec<BindArg>, SandboxError> {
    let plain = |flag: &str, s: &String, writable: bool| {
        let (src, dest) = s.split_once(':').unwrap_or((s, s));
        BindArg { given: format!("{flag} {s}"), src: src.into(), dest: dest.into(), writable }
    };
    let mut out: Vec<BindArg> = args.ro_bind.iter().map(|b| plain("--ro-bind", b, false)).collect();
    out.extend(args.bind.iter().map(|b| plain("--bind", b, true)));
    for v in &args.volume {
        out.push(parse_volume(v).map_err(|why| SandboxError::Unavailable(format!("-v {v}: {why}")))?);
    }
    Ok(out)
}

/// Docker's `-v SRC:DEST[:OPTIONS]`, for a host path: OPTIONS `ro` (or
/// `readonly`) or `rw`. What else docker takes there (named and anonymous
/// volumes, relabelling, propagation) has no meaning here: refused with a
/// pointer to the flags that exist.
fn parse_volume(v: &str) -> Result<BindArg, String> {
    let parts: Vec<&str> = v.split(':').collect();
    let (src, dest, opts) = match parts[..] {
        [src, dest] => (src, dest, ""),
        [src, dest, opts] => (src, dest, opts),
        [_] => return Err("give SRC:DEST (a host path and where it goes; docker's anonymous volumes do not exist here, the job's scratch space is /tmp)".into()),
        _ => return Err("give SRC:DEST or SRC:DEST:ro (paths with ':' can't be given with -v)".into()),
    };
    if !(src.starts_with('/') || src.starts_with('.') || src.starts_with('~')) {
        return Err(format!(
            "'{src}' is not a host path (docker's named volumes do not exist here): give a path, as /abs/{src} or ./{src}"
        ));
    }
    let mut writable = true;
    for opt in opts.split(',').filter(|o| !o.is_empty()) {
        match opt {
            "ro" | "readonly" => writable = false,
            "rw" => writable = true,
            other => {
                return Err(format!(
                    "option '{other}' is docker's and has no meaning here: -v takes ro or rw (or use --bind SRC:DEST, --ro-bind SRC:DEST)"
                ))
            }
        }
    }
    let given = format!("-v {v}");
    Ok(BindArg { given, src: src.into(), dest: dest.into(), writable })
}

fn parse_bind(b: &BindArg) -> Result<Bind, SandboxError> {
    let (src, dst) = (b.src.as_str(), b.dest.as_str());
    let source =
        std::fs::canonicalize(src).map_err(|e| SandboxError::Unavailable(format!("bind source {src}: {e}")))?;
    let dest = PathBuf::from(dst);
    if !dest.is_absolute() || dest.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        return Err(SandboxError::Unavailable(format!(
            "bind destination {dst}: must be an absolute path without '..'"
        )));
    }
    if dest.parent().is_none() {
        return Err(SandboxError::Unavailable(format!(
            "{}: / is the sandbox's own root; bind to a directory such as /host",
            b.given
        )));
    }
    // The host's root, even read-only and without the file systems below
    // it, holds unix sockets wherever /tmp, /var/tmp or /home are on it
    // (tmux, ssh-agent, X11): a read-only mount does not stop connect(),
    // landlock before ABI 9 has no rule for it, and the job, as root's
    // job, runs as the workspace owner, whose sockets those are. Through
    // them it would act on the host outside the sandbox.
    if source == Path::new("/") {
        return Err(SandboxError::Unavailable(format!(
            "{}: the host's whole root is not bound: it holds other programs' unix sockets (tmux, ssh-agent, X11 \
             under /tmp), which a read-only bind does not close, and through them a job could act outside the \
             sandbox; bind the directories the job needs (e.g. --ro-bind /opt/tool)",
            b.given
        )));
    }
    Ok(Bind { source, dest, writable: b.writable, idmap: true })
}

/// Build the job from the arguments, with `defaults` for the limits they
/// leave out.
pub fn job_spec(args: &RunArgs, config: &Config) -> Result<JobSpec, SandboxError> {
    let defaults = &config.limits;
    let mut spec = JobSpec::new(args.command.clone());
    let mut env = Vec::new();
    // A file's bare KEY takes our value only for names the operator or
    // this command line chose: the file may be one a job planted.
    let may_inherit =
        |k: &str| config.sandbox.env_allowlist.iter().any(|a| a == k) || args.env.iter().any(|e| e.key == k);
    for file in &args.env_file {
        env.extend(crate::env::read_env_file(file, may_inherit).map_err(|e| SandboxError::Unavailable(e.to_string()))?);
    }
    env.extend(args.env.iter().cloned());
    // A terminal's type, so that what the job prints to it can use it.
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) && !env.iter().any(|e| e.key == "TERM") {
        env.push(EnvArg { key: "TERM".into(), value: None });
    }
    spec.env = scrubbed(&env, |k| std::env::var(k).ok());
    if let Some(ws) = &args.workspace {
        let real = std::fs::canonicalize(ws)
            .map_err(|e| SandboxError::Workspace { path: ws.clone(), reason: e.to_string() })?;
        if crate::safe_fs::through_symlink(ws, &real) {
            spec.through_symlink.push(real.clone());
        }
        let at = args.workspace_at.clone().unwrap_or_default();
        spec.workspace_at =
            at.resolve(&real).map_err(|e| SandboxError::Unavailable(format!("--workspace-at {at}: {e}")))?;
        spec.workspace = Some(real);
        spec.cwd = spec.workspace_at.clone();
    }
    if let Some(cwd) = &args.cwd {
        // Relative: from where the job starts (the workspace, else /tmp), as
        // docker's -w is from the image's working directory.
        spec.cwd = spec.cwd.join(cwd);
    }
    spec.workspace_rw = args.rw;
    spec.network = config.network.expand(&args.net).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
    spec.net_limits = config.network.limits();
    spec.hostname = args.hostname.clone();
    spec.allow_degraded = args.allow_degraded;
    spec.limits.memory_bytes = Limit::or_default(args.memory, defaults.memory_bytes);
    spec.limits.cpus = Limit::or_default(args.cpus, defaults.cpus);
    spec.limits.pids = Limit::or_default(args.pids, defaults.pids);
    spec.tty = args.tty;
    spec.user = args.user;
    spec.protect.clear();
    if let (Some(ws), true, false) = (&spec.workspace, args.rw, args.no_protect) {
        spec.protect = crate::sandbox::protect::defaults(ws).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
    }
    for p in &args.protect {
        spec.protect.push(protected_path(p, spec.workspace.as_deref(), &spec.workspace_at)?);
    }
    spec.limits.timeout_ms = args.timeout.map(|d| d.as_millis() as u64);
    spec.limits.cpu_time_ms = args.cpu_time.map(|d| d.as_millis() as u64);
    if let Some(size) = args.tmp_size {
        spec.limits.tmp_size_bytes = size;
    }
    let given = bind_args(args)?;
    for b in &given {
        let bind = parse_bind(b)?;
        if crate::safe_fs::through_symlink(std::path::Path::new(&b.src), &bind.source) {
            spec.through_symlink.push(bind.source.clone());
        }
        spec.binds.push(bind);
    }
    check_binds(&given, &mut spec)?;
    Ok(spec)
}

/// The directories jobs write to, as this run knows them: its workspace
/// (another run may have had it read-write) and its binds' sources; not
/// the host's root, which no run may bind read-write.
fn job_writable(spec: &JobSpec) -> Vec<PathBuf> {
    let sources = spec.binds.iter().map(|b| b.source.clone()).filter(|s| s != Path::new("/"));
    spec.workspace.iter().cloned().chain(sources).collect()
}

/// Binds whose source passes through a symlink a job could have planted
/// (in the workspace, or in another bind), and binds nested in the
/// workspace or in each other, are refused: the first would bind what the
/// job chose, the second leaves what the job sees to the order of mounts.
/// Each source becomes the path the guarded walk reached, so that no
/// symlink is followed between the check and the mount (the init stage
/// opens it refusing any).
fn check_binds(given: &[BindArg], spec: &mut JobSpec) -> Result<(), SandboxError> {
    let roots = job_writable(spec);
    for (arg, bind) in given.iter().zip(spec.binds.iter_mut()) {
        bind.source = crate::safe_fs::resolve_guarded(Path::new(&arg.src), &roots)
            .map_err(|e| SandboxError::Unavailable(format!("bind source {e}")))?;
    }
    let ws = spec.workspace.as_ref().map(|_| spec.workspace_at.as_path());
    for (arg, bind) in given.iter().zip(&spec.binds) {
        let arg = &arg.given;
        let nested = |dest: &Path| bind.dest != dest && bind.dest.starts_with(dest);
        if ws == Some(bind.dest.as_path()) {
            return Err(SandboxError::Unavailable(format!(
                "{arg}: {} is the --workspace's; bind it elsewhere",
                bind.dest.display()
            )));
        }
        let in_workspace = ws.is_some_and(nested);
        let holds_workspace = ws.is_some_and(|w| w != bind.dest && w.starts_with(&bind.dest));
        if in_workspace || holds_workspace || spec.binds.iter().any(|other| nested(&other.dest)) {
            let other = match (in_workspace, holds_workspace) {
                (true, _) => format!("inside the workspace ({})", spec.workspace_at.display()),
                (_, true) => format!("around the workspace ({})", spec.workspace_at.display()),
                _ => "inside another bind".to_string(),
            };
            return Err(SandboxError::Unavailable(format!(
                "{arg}: {} is {other} mounted by this run, which would hide it or be hidden by it; \
                 bind it elsewhere (to keep a path of the workspace read-only, use --protect)",
                bind.dest.display(),
            )));
        }
        if ["/proc", "/dev"].iter().any(|own| bind.dest.starts_with(own)) {
            return Err(SandboxError::Unavailable(format!(
                "{arg}: {} is the sandbox's own (/proc and /dev are made for each job); bind it elsewhere",
                bind.dest.display()
            )));
        }
    }
    Ok(())
}

/// `config_path`: the global --config. The configuration gives the
/// backend and allow_degraded when the command line does not.
pub fn main(config_path: Option<&Path>, args: RunArgs) -> i32 {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("confine: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    };
    // Before any job code runs: the job may own the directory by the time
    // it ends (a --rw workspace), and must not choose where we write then.
    // A symlink an earlier job left on the way there is refused.
    // `-`: the outcome goes to stdout after the job's own output.
    let status_to_stdout = args.json_status.as_deref() == Some(Path::new("-"));
    let status_file = match args
        .json_status
        .as_deref()
        .filter(|_| !status_to_stdout)
        .map(|p| StatusFile::prepare(p, &args))
        .transpose()
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("confine: cannot write --json-status: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("confine: cannot start the runtime: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    };
    let outcome = rt.block_on(async {
        #[cfg(target_os = "linux")]
        if let Some(relayed) = through_server(&args, &config).await {
            return relayed;
        }
        run(&args, &config).await
    });
    // A run that failed before its sandbox started has an outcome too.
    let failed = outcome.as_ref().err().map(|e| {
        let limits = job_spec(&args, &config).map(|s| s.limits).unwrap_or_default();
        let named = args.backend.and_then(|b| b.to_possible_value()).map(|v| v.get_name().to_string());
        let auto = match std::env::consts::OS {
            "linux" | "windows" => std::env::consts::OS,
            _ => "unix-fallback",
        };
        let backend = named.filter(|n| n != "auto").unwrap_or_else(|| auto.to_string());
        Outcome::setup_failed(e.step(), e.to_string(), &backend, limits)
    });
    let code = match &outcome {
        Ok(o) => {
            if let Some(err) = &o.error {
                eprintln!("confine: {err}");
            }
            if let Some(weaker) = o.guarantees.weaker().filter(|_| o.backend != "linux") {
                eprintln!("confine: ran on the {} backend, degraded ({weaker})", o.backend);
            }
            if let Some(msg) = limit_message(o) {
                eprintln!("confine: {msg}");
            }
            if let Some(full) = &o.tmp_full {
                eprintln!("confine: {}", full.message);
            }
            for line in network_denials(o) {
                eprintln!("confine: {line}");
            }
            o.cli_exit_code()
        }
        Err(e) => {
            eprintln!("confine: {e}");
            super::EXIT_CONFINE_FAILED
        }
    };
    if let (Some(file), Some(o)) = (&status_file, outcome.as_ref().ok().or(failed.as_ref())) {
        if let Err(e) = file.write(o) {
            eprintln!("confine: cannot write --json-status: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    }
    if let (true, Some(o)) = (status_to_stdout, outcome.as_ref().ok().or(failed.as_ref())) {
        if let Err(e) = write_status_to_stdout(o) {
            eprintln!("confine: cannot write --json-status to stdout: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    }
    code
}

/// One line per connection the proxy denied (the first ten), for the
/// user who wonders why a download failed. The job chose these names:
/// anything but printable ASCII is escaped.
fn network_denials(o: &Outcome) -> Vec<String> {
    const SHOWN: usize = 10;
    let Some(net) = &o.network else { return Vec::new() };
    let clean = |s: &str| {
        s.chars()
            .flat_map(|c| if c.is_ascii_graphic() || c == ' ' { vec![c] } else { c.escape_default().collect() })
            .collect::<String>()
    };
    let denied: Vec<_> = net.connections.iter().filter(|c| c.decision != crate::job::NetDecision::Allowed).collect();
    let mut lines: Vec<String> = denied
        .iter()
        .take(SHOWN)
        .map(|c| {
            let verb = if c.decision == crate::job::NetDecision::Failed { "failed" } else { "denied" };
            // Escaping can lengthen what the job chose: the line is cut after.
            let line = format!(
                "network: {verb} {} {}:{}: {}",
                clean(&c.method),
                clean(&c.host),
                c.port,
                clean(c.reason.as_deref().unwrap_or("-"))
            );
            crate::proxy::clip_text(&line, 580)
        })
        .collect();
    let more = denied.len().saturating_sub(SHOWN) as u64 + net.unlisted_denied;
    if more > 0 {
        lines.push(format!("network: {more} more denied (the outcome's network lists them, --json-status)"));
    }
    lines
}

/// `--json-status -`: the outcome as one JSON document on stdout, after
/// everything the job wrote there (its relays are drained by now).
fn write_status_to_stdout(o: &Outcome) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let bytes = serde_json::to_vec_pretty(o).map_err(std::io::Error::other)?;
    out.write_all(&bytes)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// The `--json-status` file: its directory is opened up front and the file
/// replaced by a rename (`safe_fs`), so it never follows what the job
/// planted and never blocks on a FIFO.
struct StatusFile(crate::safe_fs::OutputFile);

impl StatusFile {
    fn prepare(path: &Path, args: &RunArgs) -> Result<StatusFile, crate::safe_fs::SafeFsError> {
        let mut roots: Vec<PathBuf> = args.workspace.iter().filter_map(|w| std::fs::canonicalize(w).ok()).collect();
        for b in bind_args(args).unwrap_or_default() {
            roots.extend(std::fs::canonicalize(&b.src).ok().filter(|s| s != Path::new("/")));
        }
        let file = crate::safe_fs::OutputFile::prepare_guarded(path, &roots)?;
        // The outcome of an earlier run must not pass for this one's, should
        // this one end without writing (confine killed).
        file.remove_stale()?;
        Ok(StatusFile(file))
    }

    fn write(&self, o: &Outcome) -> Result<(), crate::safe_fs::WriteError<serde_json::Error>> {
        let bytes = serde_json::to_vec_pretty(o).map_err(crate::safe_fs::WriteError::Content)?;
        self.0.write(&bytes).map_err(crate::safe_fs::WriteError::Fs)
    }
}

async fn run(args: &RunArgs, config: &Config) -> Result<Outcome, SandboxError> {
    let allow_degraded = args.allow_degraded || config.runtime.allow_degraded;
    let backend = crate::sandbox::select_with_config(
        args.backend,
        config.runtime.backend,
        config.source.as_deref(),
        allow_degraded,
    )?;
    let mut spec = job_spec(args, config)?;
    spec.allow_degraded = allow_degraded;
    if spec.user.is_some() && !matches!(backend, BackendKind::Linux) {
        return Err(SandboxError::Unavailable(
            "--user needs the linux backend (a user namespace); this one runs the job as your own user".into(),
        ));
    }
    let parent = args.cgroup_parent.as_ref().or(config.sandbox.cgroup_parent.as_ref());
    let seccomp = backend.prepare(args.seccomp.as_deref(), parent)?;
    // Before the job starts: a stop request must never kill confine itself
    // and leave the job to the parent-death signal alone.
    let stops = StopRequests::watch(spec.tty)?;
    let caller = CallerStreams::detect(backend, &spec, args).map_err(SandboxError::Spawn)?;
    let launch = Launch { seccomp: seccomp.as_ref(), ..Launch::default() };
    let mut job = backend.spawn(&spec, caller.stdio(), launch).await.map_err(|e| with_limits_hint(e, args))?;
    stops.attach(job.as_ref());
    let relays = match caller.start(job.as_mut()) {
        Ok(r) => r,
        Err(e) => {
            job.kill_tree();
            return Err(SandboxError::Spawn(e));
        }
    };
    let resizer = relays.watch_window_size();
    // Stopping confine cancels the job: the signal is forwarded, and the
    // tree is killed after the grace period.
    let first = stops.clone();
    let (outcome, teardown) = job.supervise(args.kill_grace, Box::pin(async move { first.next(0).await })).await;
    teardown.finish().await;
    if let Some(r) = resizer {
        r.abort();
    }
    relays.drain(&stops, args.kill_grace).await;
    Ok(outcome)
}

/// Whether this run may be started by a server holding the store: what
/// the server does for a run is exactly what this process would (the
/// default seccomp profile and cgroup parent of the configuration both
/// share, the linux backend, never degraded, no terminal of the job's).
#[cfg(target_os = "linux")]
fn server_may_run(args: &RunArgs, config: &Config) -> bool {
    let backend_ok =
        matches!(args.backend.unwrap_or(config.runtime.backend), BackendChoice::Auto | BackendChoice::Linux);
    !args.no_server
        && !args.tty
        && args.seccomp.is_none()
        && args.cgroup_parent.is_none()
        && !args.allow_degraded
        && !config.runtime.allow_degraded
        && backend_ok
}

/// `confine run` through the `confine serve` that holds the store, if one
/// does and the run is one it may start ([`server_may_run`]): the job's
/// streams are this process's (relayed here only where it would relay
/// them itself), a stop request is forwarded to it as in-process, and its
/// outcome is returned as this process's own. None: run in-process (no
/// server; one that refused before anything ran, as one with another
/// configuration; a stdin this process must copy).
#[cfg(target_os = "linux")]
async fn through_server(args: &RunArgs, config: &Config) -> Option<Result<Outcome, SandboxError>> {
    use crate::relay::{RelayError, RelayedCommand, RunRelay};
    if !server_may_run(args, config) {
        return None;
    }
    let conn = match crate::relay::client::connect(&config.store_path())? {
        Ok(c) => c,
        Err(e) => {
            eprintln!("confine: not through the server: {e}; the job runs in this process");
            return None;
        }
    };
    let pid = conn.pid();
    let spec = match job_spec(args, config) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let caller = match super::stdio::CallerStdio::detect(false, args.interactive) {
        Ok(c) => c,
        Err(e) => return Some(Err(SandboxError::Spawn(e))),
    };
    let streams = match caller.for_server() {
        Ok(Some(s)) => s,
        Ok(None) => return None,
        Err(e) => return Some(Err(SandboxError::Spawn(e))),
    };
    let stops = match StopRequests::watch(false) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let super::stdio::ServerStreams { fds, relays } = streams;
    let command = RelayedCommand::Run(RunRelay { spec, kill_grace: args.kill_grace });
    let first = stops.clone();
    let stop = async move {
        match first.next(0).await {
            Stop::Forward(sig) => sig,
            Stop::Kill => libc::SIGKILL,
        }
    };
    let (others, others_rx) = tokio::sync::mpsc::unbounded_channel();
    stops.others.attach(Some(std::sync::Arc::new(move |sig| {
        let _ = others.send(sig);
    })));
    let reply = conn.call_run(config, &command, fds, stop, others_rx).await;
    // What the job wrote is in the relays' pipes: drained as in-process.
    RunningRelays { relays: Some(relays) }.drain(&stops, args.kill_grace).await;
    let server =
        |message: String| SandboxError::Unavailable(format!("the running `confine serve` (pid {pid}): {message}"));
    match reply {
        Ok(crate::relay::Reply { run: Some(outcome), .. }) => Some(Ok(*outcome)),
        Ok(crate::relay::Reply { error: Some(e), .. }) => Some(Err(server(e))),
        Ok(_) => Some(Err(server("it answered without an outcome".into()))),
        // Refused before anything ran: this process runs the job.
        Err(RelayError::Refused { message, .. }) => {
            tracing::debug!(%message, "the server did not take the run; it runs in this process");
            None
        }
        Err(e) => Some(Err(server(e.to_string()))),
    }
}

/// How the caller's streams reach the job: relayed by this process where
/// the backend keeps them from the job (`CallerStdio`), else passed through.
struct CallerStreams {
    #[cfg(target_os = "linux")]
    relayed: Option<super::stdio::CallerStdio>,
}

impl CallerStreams {
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    fn detect(backend: BackendKind, spec: &JobSpec, args: &RunArgs) -> std::io::Result<CallerStreams> {
        #[cfg(target_os = "linux")]
        if crate::sandbox::Backend::relays_caller_streams(&backend) {
            let relayed = super::stdio::CallerStdio::detect(spec.tty, args.interactive)?;
            return Ok(CallerStreams { relayed: Some(relayed) });
        }
        Ok(CallerStreams {
            #[cfg(target_os = "linux")]
            relayed: None,
        })
    }

    /// What the job gets as its standard streams.
    fn stdio(&self) -> StdioSpec {
        #[cfg(target_os = "linux")]
        if let Some(caller) = &self.relayed {
            return caller.stdio();
        }
        StdioSpec::inherit()
    }

    /// Start the relays of a job just spawned with [`CallerStreams::stdio`].
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    fn start(self, job: &mut dyn Job) -> std::io::Result<RunningRelays> {
        #[cfg(target_os = "linux")]
        if let Some(caller) = self.relayed {
            return Ok(RunningRelays { relays: Some(caller.start(job)?) });
        }
        Ok(RunningRelays {
            #[cfg(target_os = "linux")]
            relays: None,
        })
    }
}

/// The relays of a running job, if its streams are relayed.
struct RunningRelays {
    #[cfg(target_os = "linux")]
    relays: Option<super::stdio::Relays>,
}

impl RunningRelays {
    /// Follow the caller's terminal size with the job's pty, if it has one.
    fn watch_window_size(&self) -> Option<tokio::task::JoinHandle<()>> {
        #[cfg(target_os = "linux")]
        if let Some(relays) = self.relays.as_ref().filter(|r| r.has_pty()) {
            return watch_window_size(relays);
        }
        None
    }

    /// Once the job's whole tree is dead its output is all in the relays'
    /// pipes: wait for them to drain. A stop request ends the wait at once
    /// (the caller's reader may have stopped reading); one made during the
    /// job gives it `grace`.
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    async fn drain(self, stops: &StopRequests, grace: Duration) {
        #[cfg(target_os = "linux")]
        if let Some(mut relays) = self.relays {
            let seen = stops.count();
            if seen > 0 {
                let _ = tokio::time::timeout(grace, relays.drain()).await;
            } else {
                tokio::select! {
                    () = relays.drain() => {}
                    _ = stops.next(seen) => {}
                }
            }
        }
    }
}

/// A spawn that failed for want of cgroup limits names the defaults
/// that needed them, and how to run without.
#[cfg(not(target_os = "linux"))]
fn with_limits_hint(e: SandboxError, _args: &RunArgs) -> SandboxError {
    e
}

#[cfg(target_os = "linux")]
fn with_limits_hint(e: SandboxError, args: &RunArgs) -> SandboxError {
    let defaulted = args.memory.is_none() || args.cpus.is_none() || args.pids.is_none();
    match e {
        SandboxError::Cgroup(c)
            if defaulted
                && !matches!(
                    c,
                    crate::sandbox::linux::cgroup::CgroupError::BadParent(_)
                        | crate::sandbox::linux::cgroup::CgroupError::ParentMissing { .. }
                ) =>
        {
            SandboxError::Unavailable(format!(
                "{c}. (The default limits need a cgroup; lift them with --memory unlimited --cpus unlimited \
                 --pids unlimited, or set others in [limits] of confine.toml.)"
            ))
        }
        other => other,
    }
}

/// Follow the caller's terminal size with the job's pty.
#[cfg(target_os = "linux")]
fn watch_window_size(relays: &super::stdio::Relays) -> Option<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut winch = signal(SignalKind::window_change()).ok()?;
    let resize = relays.resizer()?;
    Some(tokio::spawn(async move {
        while winch.recv().await.is_some() {
            resize();
        }
    }))
}

/// The stop requests confine gets (SIGTERM, SIGINT, SIGHUP; Ctrl-C on
/// Windows), counted from the moment they are watched, so that none is
/// lost between two waits; and, on Linux, every other signal a job is
/// given (`sandbox::linux::signals`), passed on as it comes.
#[derive(Clone)]
struct StopRequests {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Stop>>>,
    notify: std::sync::Arc<tokio::sync::Notify>,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    others: std::sync::Arc<Forwarder>,
}

/// Where the signals that are not stop requests go: the job, once it has
/// started; until then they wait (a few), as they would for a program
/// that has not yet installed its handlers.
#[derive(Default)]
struct Forwarder {
    state: std::sync::Mutex<(Option<crate::sandbox::Signaller>, Vec<i32>)>,
}

impl Forwarder {
    /// Signals kept for a job not yet started; more are dropped.
    const HELD: usize = 64;

    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn send(&self, sig: i32) {
        let Ok(mut state) = self.state.lock() else { return };
        match &state.0 {
            Some(to) => to(sig),
            None if state.1.len() < Self::HELD => state.1.push(sig),
            None => {}
        }
    }

    /// The job has started: what waited goes to it, in order.
    fn attach(&self, to: Option<crate::sandbox::Signaller>) {
        let Some(to) = to else { return };
        let Ok(mut state) = self.state.lock() else { return };
        for sig in state.1.drain(..) {
            to(sig);
        }
        state.0 = Some(to);
    }
}

impl StopRequests {
    /// `pty`: the job has a terminal of its own, whose size follows ours
    /// (SIGWINCH is then the resizer's, and the kernel's to send it).
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    fn watch(pty: bool) -> Result<StopRequests, SandboxError> {
        let stops = StopRequests { seen: Default::default(), notify: Default::default(), others: Default::default() };
        #[cfg(target_os = "linux")]
        forward_other_signals(&stops.others, pty)?;
        let record = stops.clone();
        let recorded = move |stop: Stop| {
            if let Ok(mut seen) = record.seen.lock() {
                seen.push(stop);
            }
            record.notify.notify_waiters();
        };
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = signal(SignalKind::terminate()).map_err(SandboxError::Spawn)?;
            let mut int = signal(SignalKind::interrupt()).map_err(SandboxError::Spawn)?;
            let mut hup = signal(SignalKind::hangup()).map_err(SandboxError::Spawn)?;
            tokio::spawn(async move {
                loop {
                    let sig = tokio::select! {
                        _ = term.recv() => libc::SIGTERM,
                        _ = int.recv() => libc::SIGINT,
                        _ = hup.recv() => libc::SIGHUP,
                    };
                    recorded(Stop::Forward(sig));
                }
            });
        }
        // Windows has no signals to forward, only the tree kill.
        #[cfg(windows)]
        tokio::spawn(async move {
            loop {
                let r = tokio::signal::ctrl_c().await;
                recorded(Stop::Kill);
                if r.is_err() {
                    break;
                }
            }
        });
        Ok(stops)
    }

    /// The job has started: the signals that are not stops go to it.
    fn attach(&self, job: &dyn Job) {
        self.others.attach(job.signaller());
    }

    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn count(&self) -> usize {
        self.seen.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// The first request after the first `after` ones.
    async fn next(&self, after: usize) -> Stop {
        loop {
            let notified = self.notify.notified();
            if let Some(stop) = self.seen.lock().ok().and_then(|s| s.get(after).copied()) {
                return stop;
            }
            notified.await;
        }
    }
}

/// Pass every signal a job is given that is not a stop request on to it
/// (`sandbox::linux::signals`). Ctrl-Z (SIGTSTP) stops the job (its init
/// stage stops the job's process group) and then this process, as a
/// foreground program stops for its shell; `fg` continues both (SIGCONT
/// is passed on). The job's timeout runs on meanwhile: the init stage
/// keeps it. SIGTTIN and SIGTTOU are ignored: confine never stops for a
/// terminal, whose settings it changes only from the foreground.
#[cfg(target_os = "linux")]
fn forward_other_signals(to: &std::sync::Arc<Forwarder>, pty: bool) -> Result<(), SandboxError> {
    use tokio::signal::unix::{signal, SignalKind};
    for sig in [libc::SIGTTIN, libc::SIGTTOU] {
        // SAFETY: SIG_IGN installs no handler; the number is valid.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let stops = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];
    for sig in crate::sandbox::linux::signals::forwarded() {
        if stops.contains(&sig) || (pty && sig == libc::SIGWINCH) {
            continue;
        }
        let mut stream = signal(SignalKind::from_raw(sig)).map_err(SandboxError::Spawn)?;
        let to = to.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                to.send(sig);
                if sig == libc::SIGTSTP {
                    // SAFETY: kill with our own pid and a signal number.
                    unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                }
            }
        });
    }
    Ok(())
}

/// The signal of RLIMIT_CPU (Windows has none; no signal there matches).
#[cfg(unix)]
const SIGXCPU: i32 = libc::SIGXCPU;
#[cfg(not(unix))]
const SIGXCPU: i32 = -1;

/// The one line that explains an exit status of 124 or 137.
fn limit_message(o: &Outcome) -> Option<String> {
    use crate::job::Status;
    let l = &o.limits;
    match o.status {
        Status::Timeout => {
            let cpu_used = o.usage.cpu_ms().unwrap_or(0);
            Some(match (l.cpu_time_ms, l.timeout_ms) {
                (Some(cpu), t) if cpu_used >= cpu || o.signal == Some(SIGXCPU) || t.is_none() => {
                    format!("CPU time limit of {} reached; the job was killed", human_ms(cpu))
                }
                (_, Some(t)) => format!("timed out after {}; the job was stopped", human_ms(t)),
                _ => "time limit reached; the job was stopped".to_string(),
            })
        }
        Status::Oom => Some(match l.memory_bytes {
            Some(m) => {
                format!("out of memory: the job reached its {} limit and the OOM killer ended it", human_bytes(m))
            }
            None => "out of memory: the OOM killer ended the job".to_string(),
        }),
        _ => None,
    }
}

fn human_ms(ms: u64) -> String {
    if !ms.is_multiple_of(1000) || ms < 1000 {
        if ms < 1000 {
            return format!("{ms}ms");
        }
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    format!("{}s", ms / 1000)
}

fn human_bytes(b: u64) -> String {
    for (unit, size) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if b >= size && b.is_multiple_of(size) {
            return format!("{}{unit}", b / size);
        }
    }
    format!("{b} bytes")
}

/// A `--protect` path: relative to the workspace (an absolute one under
/// where it is mounted, `at`, is taken as the same), without `..`, and
/// there now.
fn protected_path(p: &Path, workspace: Option<&Path>, at: &Path) -> Result<PathBuf, SandboxError> {
    use std::path::Component;
    let rel = p.strip_prefix(at).unwrap_or(p);
    let bad = |why: &str| SandboxError::Unavailable(format!("--protect {}: {why}", p.display()));
    if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) || rel.as_os_str().is_empty() {
        return Err(bad("give a path inside the workspace, relative to it, without '.' or '..'"));
    }
    if let Some(ws) = workspace {
        if std::fs::symlink_metadata(ws.join(rel)).is_err() {
            return Err(bad("no such path in the workspace"));
        }
    }
    Ok(rel.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_messages() {
        assert_eq!(human_ms(1000), "1s");
        assert_eq!(human_ms(1500), "1.5s");
        assert_eq!(human_ms(250), "250ms");
        assert_eq!(human_bytes(64 << 20), "64M");
    }
}
