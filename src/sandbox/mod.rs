//! Backends that run a [`crate::job::JobSpec`]. Linux is the real one;
//! other platforms get a clearly weaker fallback, which says what it lacks
//! (docs/design.md, "Guarantees per backend"). Every backend starts and
//! supervises its jobs through one lifecycle ([`Job`], spawned by
//! [`BackendKind::spawn`]); callers never name a backend's own types.

mod backend;
pub mod guarantees;
pub mod host_paths;
pub mod identity;
mod lifecycle;
#[cfg(target_os = "linux")]
pub mod linux;
pub mod protect;
#[cfg(unix)]
pub mod unix_fallback;
#[cfg(windows)]
pub mod windows;
pub mod workspace_at;

pub use backend::{select, select_with_config, Backend, BackendChoice, BackendKind};
pub use guarantees::{Guarantee, Guarantees, Level};
pub use lifecycle::{
    BoxFuture, Early, Job, Launch, Pipe, SeccompProfile, Signaller, Stop, Teardown, DEFAULT_KILL_GRACE,
};

use std::path::PathBuf;
use std::process::Stdio;

/// Errors of starting a sandbox. Every one maps to exit code 125.
/// Why `--net allow:…` is refused on a backend other than Linux's.
pub const NET_ALLOW_NEEDS_LINUX: &str = "--net allow needs the linux backend: its proxy is the only way out of a \
network namespace, and this backend shares the host's network (use --net none, or run on Linux)";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The workspace can't be used.
    #[error("workspace {path}: {reason} (pass an existing directory to --workspace)")]
    Workspace { path: PathBuf, reason: String },
    /// Nothing to run.
    #[error("no command given")]
    NoCommand,
    /// The init stage could not be started.
    #[error("could not start the sandbox's init stage: {0}")]
    Spawn(#[source] std::io::Error),
    /// A layer is missing and degraded mode was not allowed.
    #[error("{0}")]
    Unavailable(String),
    /// A weaker backend was chosen without `--allow-degraded`.
    #[error(
        "the {backend} backend is weaker than full isolation: it has no {lost}; \
pass --allow-degraded, or set allow_degraded = true under [runtime] in confine.toml, to run anyway \
(the outcome lists what is missing)"
    )]
    Degraded { backend: &'static str, lost: String },
    /// The backend named by `runtime.backend` in a config file can't be used.
    #[error("{source} (the backend was chosen by runtime.backend = \"{backend}\" in {config})")]
    Configured {
        backend: &'static str,
        config: String,
        #[source]
        source: Box<SandboxError>,
    },
    /// The backend is not built into this binary or can't work on this host.
    #[error("the {backend} backend is not available here: {reason}")]
    BackendUnavailable { backend: &'static str, reason: String },
    /// The job's cgroups could not be made, and its limits need them.
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Cgroup(#[from] linux::cgroup::CgroupError),
    /// The seccomp profile could not be compiled; nothing ran.
    #[cfg(target_os = "linux")]
    #[error(transparent)]
    Seccomp(#[from] linux::seccomp::SeccompError),
}

impl SandboxError {
    /// The set-up step this error stopped, as an outcome's `setupStep`.
    pub fn step(&self) -> &'static str {
        match self {
            SandboxError::Workspace { .. } => "workspace",
            SandboxError::NoCommand => "command",
            SandboxError::Spawn(_) => "start",
            SandboxError::Unavailable(_) => "layers",
            SandboxError::Degraded { .. } | SandboxError::BackendUnavailable { .. } => "backend",
            SandboxError::Configured { source, .. } => source.step(),
            #[cfg(target_os = "linux")]
            SandboxError::Cgroup(_) => "cgroup",
            #[cfg(target_os = "linux")]
            SandboxError::Seccomp(_) => "seccomp",
        }
    }
}

/// `error` followed by what to do when, anywhere in its chain of causes,
/// the process or the system ran out of file descriptors: the bare
/// "Too many open files" does not say whose limit, or what raises it.
pub fn describe_start_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(hint) = io.raw_os_error().and_then(out_of_fds_hint) {
                return format!("{error} ({hint})");
            }
        }
        cause = e.source();
    }
    error.to_string()
}

/// What to do about EMFILE (this process's limit) or ENFILE (the system's).
#[cfg(unix)]
fn out_of_fds_hint(errno: i32) -> Option<String> {
    if errno == libc::ENFILE {
        return Some(
            "the system is out of file descriptors: close some, or raise fs.file-max (sysctl), then retry".into(),
        );
    }
    if errno != libc::EMFILE {
        return None;
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2) writes the limit into `lim`, which we own.
    let limit = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => format!("soft {}, hard {}", lim.rlim_cur, lim.rlim_max),
        _ => "unknown".into(),
    };
    let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count().to_string()).unwrap_or_else(|_| "?".into());
    Some(format!(
        "confine is out of file descriptors: {open} open, RLIMIT_NOFILE {limit}; raise its limit \
         (`ulimit -n` in the shell that starts it, LimitNOFILE= in its systemd unit) or run fewer jobs at once \
         (runtime.max_concurrent_jobs); jobs that end give theirs back"
    ))
}

#[cfg(not(unix))]
fn out_of_fds_hint(_errno: i32) -> Option<String> {
    None
}

/// Where one of the job's standard streams goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StdioTarget {
    /// The supervisor's own.
    Inherit,
    /// `/dev/null`.
    Null,
    /// A pipe whose other end the supervisor keeps.
    Piped,
    /// This fd of the supervisor's (a pty's terminal side, say), which the
    /// caller keeps open until the job is started.
    #[cfg(unix)]
    Fd(std::os::fd::RawFd),
}

impl From<StdioTarget> for Stdio {
    fn from(s: StdioTarget) -> Stdio {
        match s {
            StdioTarget::Inherit => Stdio::inherit(),
            StdioTarget::Null => Stdio::null(),
            StdioTarget::Piped => Stdio::piped(),
            #[cfg(unix)]
            StdioTarget::Fd(fd) => {
                // SAFETY: the caller keeps `fd` open across the spawn, and
                // the borrow ends before this returns; the copy is ours.
                let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                match borrowed.try_clone_to_owned() {
                    Ok(copy) => Stdio::from(copy),
                    Err(_) => Stdio::null(),
                }
            }
        }
    }
}

/// Where the job's standard streams go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StdioSpec {
    pub stdin: StdioTarget,
    pub stdout: StdioTarget,
    pub stderr: StdioTarget,
}

impl StdioSpec {
    /// Pass the caller's streams through, as `confine run` does.
    pub fn inherit() -> Self {
        StdioSpec { stdin: StdioTarget::Inherit, stdout: StdioTarget::Inherit, stderr: StdioTarget::Inherit }
    }
    /// Capture stdout and stderr, no stdin.
    pub fn piped() -> Self {
        StdioSpec { stdin: StdioTarget::Null, stdout: StdioTarget::Piped, stderr: StdioTarget::Piped }
    }
    /// Nothing in, nothing kept.
    pub fn null() -> Self {
        StdioSpec { stdin: StdioTarget::Null, stdout: StdioTarget::Null, stderr: StdioTarget::Null }
    }
}
