//! What to run and how it ended: [`JobSpec`] goes in, [`Outcome`] comes out.
//!
//! These are plain data, shared by the CLI, the supervisor and the MCP server.
//! They hold no sandbox logic and never touch the kernel.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Network mode of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// A fresh network namespace holding only `lo`.
    #[default]
    None,
    /// The host's network namespace (policy must allow it).
    Host,
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
    /// Host directory mounted at /workspace.
    pub workspace: Option<PathBuf>,
    pub workspace_rw: bool,
    /// Working directory inside the sandbox.
    pub cwd: PathBuf,
    pub network: Network,
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
            cwd: PathBuf::from("/tmp"),
            network: Network::None,
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
    pub landlock: LandlockLayer,
    /// Name of the seccomp profile in force, or `null`.
    pub seccomp: Option<String>,
    /// `v2`, `v2-freeze`, `v1`, `v1-signal`, `v1+unified-kill` (see
    /// `cgroup::Job::layer`), or `null` when no cgroup was used.
    pub cgroup: Option<String>,
    pub caps_dropped: bool,
    pub no_new_privs: bool,
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
