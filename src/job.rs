//! What to run and how it ended: [`JobSpec`] goes in, [`Outcome`] comes out.
//!
//! These are plain data, shared by the CLI, the supervisor and the MCP server.
//! They hold no sandbox logic and never touch the kernel.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Network mode of a job. In JSON: `"none"`, `"host"`, or
/// `{"allow": ["registry.example.org", "@python", …]}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// A fresh network namespace holding only `lo`.
    #[default]
    None,
    /// The host's network namespace (policy must allow it).
    Host,
    /// Only `lo`, and on it a proxy (in the supervisor) that reaches these
    /// hosts and nothing else: entries of `proxy::allowlist`, and `@name`s
    /// of confine.toml's `[network.allow]` lists until the planner expands them.
    Allow(Vec<String>),
}

impl Network {
    /// `none`, `host` or `allow`.
    pub fn mode(&self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Host => "host",
            Network::Allow(_) => "allow",
        }
    }

    /// Parse `--net`: `none`, `host`, or `allow:ENTRY,ENTRY,…` (entries of
    /// `proxy::allowlist`, `@name` for a list of confine.toml's
    /// `[network.allow]`). Entries are checked here, names when expanded.
    pub fn parse_arg(text: &str) -> Result<Network, NetworkArgError> {
        match text {
            "none" => Ok(Network::None),
            "host" => Ok(Network::Host),
            _ => match text.strip_prefix("allow:") {
                Some(list) => {
                    let entries: Vec<String> = list.split(',').map(|e| e.trim().to_string()).collect();
                    for e in entries.iter().filter(|e| !e.starts_with('@')) {
                        crate::proxy::allowlist::Entry::parse(e)?;
                    }
                    Ok(Network::Allow(entries))
                }
                None => Err(NetworkArgError::Mode(text.to_string())),
            },
        }
    }

    /// A fresh network namespace (none and allow).
    pub fn isolated(&self) -> bool {
        !matches!(self, Network::Host)
    }
}

/// Why a `--net` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkArgError {
    #[error("'{0}': give none, host, or allow:HOST[,HOST…] (e.g. allow:registry.example.org,@python)")]
    Mode(String),
    #[error(transparent)]
    Entry(#[from] crate::proxy::allowlist::EntryError),
}

/// Limits of an allowlisted job's network (`[network]` of confine.toml).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NetLimits {
    /// Connections to the proxy open at once; more get a 503.
    pub max_connections: usize,
    /// Bytes through the proxy, both ways, all connections; `None`: no cap.
    pub max_bytes: Option<u64>,
    /// A connection with no byte either way for this long is cut.
    pub idle_timeout_ms: u64,
}

impl Default for NetLimits {
    fn default() -> Self {
        NetLimits { max_connections: 32, max_bytes: None, idle_timeout_ms: 120_000 }
    }
}

/// What the proxy decided for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetDecision {
    Allowed,
    Denied,
    /// Allowed, but the upstream could not be reached.
    Failed,
}

/// One connection through the proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetConnection {
    /// `CONNECT`, or the plain HTTP request's method (`-`: refused unread).
    pub method: String,
    pub host: String,
    pub port: u16,
    pub decision: NetDecision,
    /// Why it was denied, failed, or how it ended when not cleanly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The allowlist entry that allowed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
    /// The address connected to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Bytes from the job to the host it reached, and back.
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration_ms: u64,
}

/// An allowlisted job's network, for the outcome and the audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NetworkReport {
    /// Where the proxy listened, inside the job.
    pub proxy: Vec<String>,
    /// The allowlist, expanded and normalized.
    pub allow: Vec<String>,
    pub denied: u64,
    /// Bytes through the proxy, all connections, both ways.
    pub bytes: u64,
    /// Allowed connections beyond the first 1000, counted but not listed.
    pub unlisted_allowed: u64,
    /// Denied (and failed) connections beyond the first 1000, likewise:
    /// the two are kept apart, so denials never hide an allowed one.
    pub unlisted_denied: u64,
    /// In the order they were opened.
    pub connections: Vec<NetConnection>,
}

/// A read-only or read-write bind of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bind {
    pub source: PathBuf,
    pub dest: PathBuf,
    pub writable: bool,
    /// When another uid owns the source, show its files as the job's own
    /// (an idmapped mount, as root): the user's `--bind`s are. Toolchain
    /// paths the supervisor adds are not: the job reads them as itself,
    /// so an owner's private files there stay private.
    #[serde(default)]
    pub idmap: bool,
}

/// A file written into the sandbox before the job starts (the source of
/// code mode). Its path must be under /tmp, the job's private tmpfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobFile {
    pub path: PathBuf,
    pub contents: String,
}

/// Resource limits. `None` means "not limited by confine".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub cpu_time_ms: Option<u64>,
    pub tmp_size_bytes: u64,
    /// Names of limits that were lowered to a configured maximum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped: Vec<String>,
}

/// Default size cap of the job's private /tmp.
pub const DEFAULT_TMP_SIZE: u64 = 64 * 1024 * 1024;

/// Paths of a read-write workspace kept read-only unless the user lifts
/// them (`--no-protect`); see `sandbox::protect`.
pub use crate::sandbox::protect::DEFAULT_PROTECTED;

/// Everything the sandbox needs to start one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// Command and arguments. `argv[0]` is looked up in the sandbox's PATH.
    pub argv: Vec<String>,
    /// The complete, already scrubbed environment of the job.
    pub env: Vec<(String, String)>,
    /// Host directory mounted at [`JobSpec::workspace_at`].
    pub workspace: Option<PathBuf>,
    pub workspace_rw: bool,
    /// Where the workspace is mounted inside (`--workspace-at`): a path
    /// checked by `sandbox::workspace_at`, `/workspace` unless asked.
    #[serde(default = "default_workspace_at", skip_serializing_if = "is_default_workspace_at")]
    pub workspace_at: PathBuf,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    pub network: Network,
    /// The limits of an allowlisted network.
    #[serde(default)]
    pub net_limits: NetLimits,
    pub hostname: String,
    /// Extra binds (toolchains and the like).
    #[serde(default)]
    pub binds: Vec<Bind>,
    /// Sources (the workspace, binds; canonical) whose path as the user
    /// gave it went through a symbolic link. They are never idmapped: a
    /// link a job planted could otherwise lead a later run to give the job
    /// its owner's rights over any directory (`/etc`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub through_symlink: Vec<PathBuf>,
    /// Files written into the sandbox's /tmp before the job starts.
    #[serde(default)]
    pub files: Vec<JobFile>,
    pub limits: Limits,
    /// Run even when a layer can't be applied; the outcome names what is missing.
    pub allow_degraded: bool,
    /// Build the whole sandbox, then wait for the supervisor's go before
    /// the job's execve (Linux: `RunningJob::release`). The supervisor
    /// overlaps the sandbox's set-up with work it must finish before any
    /// untrusted code runs (opening the audit store), and kills the
    /// sandbox unreleased when that work fails.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Paths of a read-write workspace (relative to it) that stay
    /// read-only: [`DEFAULT_PROTECTED`] unless the caller says otherwise.
    #[serde(default)]
    pub protect: Vec<PathBuf>,
    /// Give the job a terminal of its own (a pty the caller relays).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// The (uid, gid) the job has inside its user namespace (`--user`);
    /// None: the same numbers as its host ids. The host ids never change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<(u32, u32)>,
}

impl JobSpec {
    pub fn new(argv: Vec<String>) -> Self {
        JobSpec {
            argv,
            env: Vec::new(),
            workspace: None,
            workspace_rw: false,
            workspace_at: default_workspace_at(),
            cwd: PathBuf::from("/tmp"),
            network: Network::None,
            net_limits: NetLimits::default(),
            hostname: "confine".into(),
            binds: Vec::new(),
            through_symlink: Vec::new(),
            files: Vec::new(),
            limits: Limits { tmp_size_bytes: DEFAULT_TMP_SIZE, ..Limits::default() },
            allow_degraded: false,
            hold: false,
            protect: DEFAULT_PROTECTED.iter().map(PathBuf::from).collect(),
            tty: false,
            user: None,
        }
    }
}

fn default_workspace_at() -> PathBuf {
    PathBuf::from(crate::sandbox::workspace_at::DEFAULT)
}

fn is_default_workspace_at(p: &Path) -> bool {
    p == Path::new(crate::sandbox::workspace_at::DEFAULT)
}

/// How a job ended, in the words a user checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Success,
    Failure,
    Timeout,
    Oom,
    Killed,
    Cancelled,
    Denied,
}

/// Landlock enforcement as reported by the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct LandlockLayer {
    /// The ABI level that was enforced (0 when none).
    pub abi: u32,
    /// `full`, `partial`, `none` or `off`.
    pub status: String,
    /// Rules that were requested but could not be added (path missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// Which isolation layers were really in force when the job ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Layers {
    pub userns: bool,
    pub mountns: bool,
    pub pidns: bool,
    pub netns: bool,
    pub ipcns: bool,
    pub utsns: bool,
    pub cgroupns: bool,
    /// The network namespace's only way out is the allowlist's proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub net_proxy: bool,
    pub landlock: LandlockLayer,
    /// Name of the seccomp profile in force, or `null`.
    pub seccomp: Option<String>,
    /// `v2`, `v2-freeze`, `v1`, `v1-signal`, `v1+unified-kill` (see
    /// `cgroup::Job::layer`), or `null` when no cgroup was used.
    pub cgroup: Option<String>,
    pub caps_dropped: bool,
    pub no_new_privs: bool,
    /// The job ran in a user namespace of its own, nested in the
    /// sandbox's: the kernel locks every mount of the sandbox there, so
    /// nothing in the job can unmount one or make it writable, whatever
    /// capability it gains.
    #[serde(default)]
    pub mounts_locked: bool,
    /// Host uid the job ran as.
    pub host_uid: u32,
    /// The uid the job saw inside (`--user`), when it is not `hostUid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Host gid the job ran as (never a group of the workspace: see
    /// `sandbox::identity`).
    #[serde(default)]
    pub host_gid: u32,
    /// Paths of the read-write workspace that were kept read-only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protected: Vec<String>,
    /// Mount points (the workspace, the user's binds) whose owner on the
    /// host shows as the job's uid inside, through an idmapped mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idmapped: Vec<String>,
    /// Mount points an idmap was wanted for but not made, as `path: why`
    /// (rootless, or a kernel or file system without idmapped mounts):
    /// they were bound as they are on the host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_idmapped: Vec<String>,
    /// Layers that were requested but missing (only with `--allow-degraded`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The job ran in a sandbox built before its request arrived (a
    /// server's warm pool), rather than one built for it.
    #[serde(default)]
    pub warm: bool,
}

/// Resource usage of the whole job tree. A figure nothing measured (no
/// cgroup, a backend without the counter) is `None`, shown as `null`:
/// a zero would claim the job used nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub cpu_user_ms: Option<u64>,
    pub cpu_sys_ms: Option<u64>,
    pub peak_memory_bytes: Option<u64>,
    pub pids_peak: Option<u64>,
}

impl Usage {
    /// User plus system CPU time, when both were measured.
    pub fn cpu_ms(&self) -> Option<u64> {
        Some(self.cpu_user_ms? + self.cpu_sys_ms?)
    }
}

/// One shape for `--json-status`, `exec` and MCP.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Outcome {
    pub job_id: String,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub queued_ms: u64,
    pub usage: Usage,
    pub backend: String,
    pub layers: Layers,
    /// What the backend guaranteed for this run, row by row (filesystem,
    /// network, syscalls, memory, cpu, pids, treeKill, envScrub), as the
    /// layers above allowed.
    #[serde(default)]
    pub guarantees: crate::sandbox::Guarantees,
    pub limits: Limits,
    /// One line, set when confine itself failed or the command couldn't start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The step of the sandbox's set-up that failed (`error` says how),
    /// when the command never ran: exit status 125.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup_step: Option<String>,
    /// An allowlisted job's connections (`--net allow:…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkReport>,
    /// The job ended with its private /tmp full (`--tmp-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp_full: Option<TmpFull>,
}

/// A job's private /tmp, which is also its `HOME`, was full when the job
/// ended: what it wrote there last likely failed with ENOSPC, which the
/// job alone can't tell from a full disk. Named with the cap that set it
/// and the knobs that raise it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TmpFull {
    /// The cap: `--tmp-size`, or `tmp_size_bytes` under `[sandbox]`.
    pub size_bytes: u64,
    /// What ran out: `space`, or `files` (the inode cap that comes with
    /// the size).
    pub out_of: String,
    /// One line for a reader: the cap and how to raise it.
    pub message: String,
}

impl TmpFull {
    /// The note for a Linux job's /tmp of `size_bytes` that ran out of `out`.
    #[cfg(target_os = "linux")]
    pub fn of(size_bytes: u64, out: crate::sandbox::linux::protocol::TmpOut) -> TmpFull {
        use crate::sandbox::linux::protocol::TmpOut;
        match out {
            TmpOut::Space => TmpFull::new(size_bytes, None),
            TmpOut::Files { total } => TmpFull::new(size_bytes, Some(total)),
        }
    }

    /// The note for a /tmp of `size_bytes` that ran out of space, or, with
    /// `files` (its inode cap), out of inodes.
    pub fn new(size_bytes: u64, files: Option<u64>) -> TmpFull {
        let size = crate::output::human_size(size_bytes);
        let knobs = "--tmp-size; tmp_size_bytes under [sandbox] in confine.toml";
        let (out_of, full) = match files {
            None => ("space", format!("was full when the job ended: its {size} cap ({knobs})")),
            Some(n) => (
                "files",
                format!("had no inode left when the job ended: its {n} files come with its {size} cap ({knobs})"),
            ),
        };
        let message =
            format!("/tmp (also the job's HOME) {full} may be why a write failed with 'No space left on device'");
        TmpFull { size_bytes, out_of: out_of.into(), message }
    }
}

impl Outcome {
    /// The outcome of a run that failed before its sandbox could start
    /// (exit status 125): what failed, at which step, nothing measured.
    pub fn setup_failed(step: &str, error: String, backend: &str, limits: Limits) -> Outcome {
        Outcome {
            job_id: String::new(),
            status: Status::Failure,
            exit_code: Some(125),
            signal: None,
            duration_ms: 0,
            queued_ms: 0,
            usage: Usage::default(),
            backend: backend.into(),
            layers: Layers::default(),
            guarantees: Default::default(),
            limits,
            error: Some(error),
            setup_step: Some(step.into()),
            network: None,
            tmp_full: None,
        }
    }

    /// The exit code a CLI reports, docker/podman style: the job's code,
    /// 128+N for signal N, 124 for a timeout, 137 for an OOM kill.
    pub fn cli_exit_code(&self) -> i32 {
        match self.status {
            Status::Timeout => 124,
            Status::Oom => 137,
            _ => match (self.exit_code, self.signal) {
                (Some(c), _) => c,
                (None, Some(s)) => 128 + s,
                (None, None) => 125,
            },
        }
    }
}
