//! The `unix-fallback` backend (macOS; Linux without namespaces): the job
//! in its own process group and session, with rlimits, a scrubbed
//! environment, its cwd in the workspace or a private /tmp, and a tree kill.
//! On Linux the `__fallback-init` stage is a child subreaper, so processes
//! that escape the group with `setsid` are still killed; macOS has no such
//! thing and only the job's process group is killed.
//!
//! This is much weaker than the Linux sandbox — no namespaces, landlock,
//! seccomp or cgroups; the host filesystem and network are the job's — so
//! it only runs with `--allow-degraded`, and every outcome says so.
//!
//! The supervisor side (here) runs in tokio and never forks into the job:
//! it starts `confine __fallback-init` (see [`stage`]) whose `pre_exec`
//! makes only async-signal-safe calls.

pub mod stage;

use super::host_paths::{self, HostLayout};
use super::{Backend, BackendKind, SandboxError, StdioSpec};
use crate::job::{JobSpec, LandlockLayer, Layers, Outcome, Status, Usage};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::{sleep_until, Instant};

/// The stage's end of the control socket.
pub const STAGE_FD: i32 = 3;
/// Sent to the stage: kill the whole tree now (also its parent-death signal).
pub const KILL_TREE_SIGNAL: libc::c_int = libc::SIGUSR1;
/// After the tree-kill request, how long the stage gets before SIGKILL.
const STAGE_KILL_GRACE: Duration = Duration::from_secs(3);
/// An rlimit resource, by name: the numbers differ between platforms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Resource {
    Cpu,
    As,
    Nproc,
    Fsize,
    Nofile,
    Core,
}

impl Resource {
    /// The platform's constant. (glibc types it as an unsigned enum.)
    #[allow(clippy::unnecessary_cast)]
    pub fn raw(self) -> libc::c_int {
        (match self {
            Resource::Cpu => libc::RLIMIT_CPU,
            Resource::As => libc::RLIMIT_AS,
            Resource::Nproc => libc::RLIMIT_NPROC,
            Resource::Fsize => libc::RLIMIT_FSIZE,
            Resource::Nofile => libc::RLIMIT_NOFILE,
            Resource::Core => libc::RLIMIT_CORE,
        }) as libc::c_int
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FallbackRlimit {
    pub resource: Resource,
    pub soft: u64,
    pub hard: u64,
}

/// What the stage needs, sent as JSON on [`STAGE_FD`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StageSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// A host path.
    pub cwd: PathBuf,
    pub rlimits: Vec<FallbackRlimit>,
    /// Switch to these ids before exec (when confine runs as root).
    pub ids: Option<(u32, u32)>,
    pub no_new_privs: bool,
}

/// How the job ended, sent back by the stage.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StageReport {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
    pub cpu_user_ms: u64,
    pub cpu_sys_ms: u64,
    pub peak_memory_bytes: u64,
    /// Processes that were still alive below the stage after the job ended.
    pub escapees_killed: u32,
}

/// Largest RLIMIT_NOFILE a job gets.
const MAX_NOFILE: u64 = 1024;

/// The job's rlimits. RLIMIT_AS stands in for a memory cgroup (macOS does
/// not enforce it); RLIMIT_NPROC counts every process of the job's uid,
/// not only the job's; RLIMIT_FSIZE caps each file the job writes.
pub fn rlimits(spec: &JobSpec) -> Vec<FallbackRlimit> {
    let l = &spec.limits;
    let mut out = vec![FallbackRlimit { resource: Resource::Core, soft: 0, hard: 0 }];
    if let Some(ms) = l.cpu_time_ms {
        let secs = ms.div_ceil(1000).max(1);
        out.push(FallbackRlimit { resource: Resource::Cpu, soft: secs, hard: secs + 1 });
    }
    if let Some(bytes) = l.memory_bytes.filter(|_| cfg!(not(target_os = "macos"))) {
        out.push(FallbackRlimit { resource: Resource::As, soft: bytes, hard: bytes });
    }
    if let Some(n) = l.pids {
        out.push(FallbackRlimit { resource: Resource::Nproc, soft: n, hard: n });
    }
    if l.memory_bytes.is_some() || l.pids.is_some() || l.cpu_time_ms.is_some() {
        out.push(FallbackRlimit { resource: Resource::Fsize, soft: l.tmp_size_bytes, hard: l.tmp_size_bytes });
    }
    let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills the struct we own.
    let hard = if unsafe { libc::getrlimit(Resource::Nofile.raw() as _, &mut cur) } == 0 {
        cur.rlim_max.min(MAX_NOFILE)
    } else {
        MAX_NOFILE
    };
    out.push(FallbackRlimit { resource: Resource::Nofile, soft: hard, hard });
    out
}

/// Guarantees this run lacks beyond the fixed list: they depend on the
/// platform and on what the job asked for.
pub fn missing(spec: &JobSpec, ids: Option<(u32, u32)>) -> Vec<String> {
    let mut m: Vec<String> = BackendKind::UnixFallback.lost().iter().map(|s| s.to_string()).collect();
    if cfg!(not(target_os = "linux")) {
        m.extend(["noNewPrivs".into(), "subreaper".into()]);
        if spec.limits.memory_bytes.is_some() {
            m.push("memoryLimit".into());
        }
    }
    if spec.limits.cpus.is_some() {
        m.push("cpuQuota".into());
    }
    if !spec.binds.is_empty() {
        m.push("binds".into());
    }
    if spec.workspace.is_some() && !spec.workspace_rw {
        m.push("readOnlyWorkspace".into());
    }
    // SAFETY: geteuid has no preconditions.
    if ids.is_none() && unsafe { libc::geteuid() } == 0 {
        m.push("capsDropped".into());
    }
    m
}

/// Ids of the job: as root, those of `sandbox::identity`; otherwise our
/// own (no switch).
fn job_ids(spec: &JobSpec) -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    Some(super::identity::as_root(spec.workspace.as_deref()))
}

static STAGE_EXECUTABLE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Use `path` (a `confine` binary) for the `__fallback-init` stage instead
/// of the running executable. Only the first call has an effect.
pub fn set_stage_executable(path: PathBuf) {
    let _ = STAGE_EXECUTABLE.set(path);
}

fn stage_executable() -> Result<PathBuf, SandboxError> {
    match STAGE_EXECUTABLE.get() {
        Some(p) => Ok(p.clone()),
        None => std::env::current_exe().map_err(SandboxError::Spawn),
    }
}

/// A job's private /tmp on the host, removed when the run ends, whatever
/// happens. Made by [`spawn`], or beforehand by a caller that must know
/// the host paths first (the supervisor's code mode).
pub struct PrivateTmp {
    job_id: String,
    path: PathBuf,
}

impl PrivateTmp {
    /// A new, empty directory for a new job id (mode 0700).
    pub fn create() -> std::io::Result<PrivateTmp> {
        let job_id = crate::ids::job_id();
        let path = host_paths::private_tmp(&job_id)?;
        Ok(PrivateTmp { job_id, path })
    }

    /// Where the sandbox's `/tmp` (and `/workspace`) are on the host.
    pub fn layout(&self, workspace: Option<PathBuf>) -> HostLayout {
        HostLayout { tmp: self.path.clone(), workspace }
    }
}

impl Drop for PrivateTmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A started job: the stage, its control socket, the job's private /tmp.
pub struct FallbackJob {
    child: tokio::process::Child,
    ctl: tokio::net::UnixStream,
    started: std::time::Instant,
    spec: JobSpec,
    ids: Option<(u32, u32)>,
    /// The id its outcome carries: its private /tmp's, unless the caller
    /// named the job.
    job_id: String,
    /// Last field: the directory goes after the stage is gone.
    tmp: PrivateTmp,
}

/// Start `spec` through the backend-neutral lifecycle, in the caller's
/// private /tmp if it made one.
pub(crate) fn spawn_job(
    spec: &JobSpec,
    stdio: StdioSpec,
    launch: super::Launch<'_>,
) -> Result<Box<dyn super::Job>, SandboxError> {
    let mut job = spawn(spec, stdio, launch.private_tmp)?;
    if let Some(id) = launch.job_id {
        job.job_id = id.to_string();
    }
    Ok(Box::new(job))
}

/// Start `spec` under the `__fallback-init` stage, in `tmp` (else a new
/// private /tmp). Must be called inside a tokio runtime.
pub fn spawn(spec: &JobSpec, stdio: StdioSpec, tmp: Option<PrivateTmp>) -> Result<FallbackJob, SandboxError> {
    if spec.argv.is_empty() {
        return Err(SandboxError::NoCommand);
    }
    if let crate::job::Network::Allow(_) = spec.network {
        return Err(SandboxError::Unavailable(super::NET_ALLOW_NEEDS_LINUX.into()));
    }
    if let Some(ws) = &spec.workspace {
        if !ws.is_dir() {
            return Err(SandboxError::Workspace { path: ws.clone(), reason: "not a directory".into() });
        }
    }
    let tmp = match tmp {
        Some(t) => t,
        None => PrivateTmp::create().map_err(SandboxError::Spawn)?,
    };
    let layout = tmp.layout(spec.workspace.clone());
    let ids = job_ids(spec);
    layout.write_files(&spec.files).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
    if let Some((uid, gid)) = ids {
        // The job's own: the directory, and what was written into it for
        // the job (code mode compiles next to its source).
        for f in &spec.files {
            let mut path = layout.host_path(&f.path).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
            while path.starts_with(&tmp.path) && path != tmp.path {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(SandboxError::Spawn)?;
                if !path.pop() {
                    break;
                }
            }
        }
        std::os::unix::fs::chown(&tmp.path, Some(uid), Some(gid)).map_err(SandboxError::Spawn)?;
    }
    let stage_spec = StageSpec {
        argv: spec.argv.clone(),
        env: layout.host_env(&spec.env),
        cwd: layout.host_path(&spec.cwd).map_err(|e| SandboxError::Unavailable(format!("--cwd {e}")))?,
        rlimits: rlimits(spec),
        ids,
        no_new_privs: cfg!(target_os = "linux"),
    };

    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SandboxError::Spawn)?;
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = stage_command(&stage_executable()?, "confine-fallback", "__fallback-init", stdio);
    // SAFETY: runs in the forked child before exec; only async-signal-safe
    // syscalls (dup2/fcntl, setpgid, prctl) on an fd open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            place_fd(theirs_fd, STAGE_FD)?;
            // Out of the terminal's foreground group: confine forwards ^C.
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = std::time::Instant::now();
    let child = cmd.spawn().map_err(SandboxError::Spawn)?;
    drop(theirs);
    {
        use std::io::Write;
        let mut w = &ours;
        let body = serde_json::to_vec(&stage_spec).map_err(|e| SandboxError::Spawn(std::io::Error::other(e)))?;
        w.write_all(&body).map_err(SandboxError::Spawn)?;
        ours.shutdown(std::net::Shutdown::Write).map_err(SandboxError::Spawn)?;
    }
    ours.set_nonblocking(true).map_err(SandboxError::Spawn)?;
    let ctl = tokio::net::UnixStream::from_std(ours).map_err(SandboxError::Spawn)?;
    let job_id = tmp.job_id.clone();
    Ok(FallbackJob { child, ctl, started, spec: spec.clone(), ids, job_id, tmp })
}

impl FallbackJob {
    /// The job's stdin, when it was piped.
    pub fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// The job's stdout, when it was piped.
    pub fn stdout(&mut self) -> Option<tokio::process::ChildStdout> {
        self.child.stdout.take()
    }

    /// The job's stderr, when it was piped.
    pub fn stderr(&mut self) -> Option<tokio::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Wait for the job to end, enforcing its timeout. `cancel` resolving
    /// forwards its signal (status `cancelled`); the timeout sends SIGTERM
    /// (status `timeout`); either way the tree is killed `kill_grace` later.
    pub async fn supervise<C>(self, kill_grace: Duration, cancel: C) -> Outcome
    where
        C: Future<Output = libc::c_int>,
    {
        let FallbackJob { mut child, mut ctl, started, spec, ids, job_id, tmp } = self;
        let stage = child.id().and_then(|p| libc::pid_t::try_from(p).ok());
        let reaped = std::sync::atomic::AtomicBool::new(false);
        let send = |sig: libc::c_int| {
            if let (Some(pid), false) = (stage, reaped.load(std::sync::atomic::Ordering::SeqCst)) {
                // SAFETY: kill(2) on our own unreaped child; ESRCH is harmless.
                unsafe { libc::kill(pid, sig) };
            }
        };
        let deadline = spec.limits.timeout_ms.map(|ms| Instant::from_std(started) + Duration::from_millis(ms));
        let never = Instant::now() + Duration::from_secs(100 * 365 * 86400);
        let mut ending: Option<Status> = None;
        let mut kill_at: Option<Instant> = None;
        let mut hard_kill_at: Option<Instant> = None;
        let mut cancelled = false;
        let mut buf = Vec::new();
        let status = {
            let exit = async {
                let status = child.wait().await;
                reaped.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = ctl.read_to_end(&mut buf).await;
                status
            };
            tokio::pin!(exit);
            tokio::pin!(cancel);
            loop {
                tokio::select! {
                    status = &mut exit => break status,
                    _ = sleep_until(deadline.unwrap_or(never)), if deadline.is_some() && ending.is_none() => {
                        ending = Some(Status::Timeout);
                        send(libc::SIGTERM);
                        kill_at = Some(Instant::now() + kill_grace);
                    }
                    sig = &mut cancel, if !cancelled => {
                        cancelled = true;
                        ending.get_or_insert(Status::Cancelled);
                        send(sig);
                        let at = Instant::now() + kill_grace;
                        kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                    }
                    _ = sleep_until(kill_at.unwrap_or(never)), if kill_at.is_some() && hard_kill_at.is_none() => {
                        send(KILL_TREE_SIGNAL);
                        hard_kill_at = Some(Instant::now() + STAGE_KILL_GRACE);
                    }
                    // Last resort: the job dies by its parent-death signal.
                    _ = sleep_until(hard_kill_at.unwrap_or(never)), if hard_kill_at.is_some() => {
                        send(libc::SIGKILL);
                        hard_kill_at = Some(never);
                    }
                }
            }
        };
        let report: Option<StageReport> =
            buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()).find_map(|l| serde_json::from_slice(l).ok());
        drop(tmp);
        outcome(&spec, job_id, started, status, report, ending, ids)
    }
}

impl super::Job for FallbackJob {
    fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        FallbackJob::take_stdin(self)
    }

    fn stdin_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        FallbackJob::take_stdin(self).map(|p| p.into_owned_fd())
    }

    fn stdout_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        self.stdout().map(|p| p.into_owned_fd())
    }

    fn stderr_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        self.stderr().map(|p| p.into_owned_fd())
    }

    /// The stage's "kill the tree now": it kills the job's escapees too.
    fn kill_tree(&mut self) {
        if let Some(pid) = self.child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) on our own child, not yet reaped (`self`
            // holds it unwaited); ESRCH is harmless.
            unsafe { libc::kill(pid, KILL_TREE_SIGNAL) };
        }
    }

    fn supervise(
        self: Box<Self>,
        kill_grace: Duration,
        stop: super::BoxFuture<'static, super::Stop>,
    ) -> super::BoxFuture<'static, (Outcome, super::Teardown)> {
        let signal = async move {
            match stop.await {
                // Not SIGKILL: a killed stage could not kill the job's
                // escapees or report.
                super::Stop::Kill => KILL_TREE_SIGNAL,
                super::Stop::Forward(sig) => sig,
            }
        };
        Box::pin(async move { (FallbackJob::supervise(*self, kill_grace, signal).await, super::Teardown::none()) })
    }
}

fn outcome(
    spec: &JobSpec,
    job_id: String,
    started: std::time::Instant,
    status: std::io::Result<std::process::ExitStatus>,
    report: Option<StageReport>,
    ending: Option<Status>,
    ids: Option<(u32, u32)>,
) -> Outcome {
    // SAFETY: geteuid and getegid have no preconditions.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let layers = Layers {
        landlock: LandlockLayer { abi: 0, status: "off".into(), skipped: Vec::new() },
        caps_dropped: ids.is_some() || euid != 0,
        no_new_privs: cfg!(target_os = "linux"),
        host_uid: ids.map_or(euid, |(u, _)| u),
        host_gid: ids.map_or(egid, |(_, g)| g),
        missing: missing(spec, ids),
        ..Layers::default()
    };
    let mut o = Outcome {
        job_id,
        status: Status::Failure,
        exit_code: None,
        signal: None,
        duration_ms: started.elapsed().as_millis() as u64,
        queued_ms: 0,
        usage: Usage::default(),
        backend: BackendKind::UnixFallback.name().into(),
        layers,
        guarantees: super::Guarantees::unix_fallback(cfg!(target_os = "linux")),
        limits: spec.limits.clone(),
        error: None,
        setup_step: None,
        network: None,
        tmp_full: None,
    };
    match (report, status) {
        (Some(r), _) => {
            o.exit_code = r.exit_code;
            o.signal = r.signal;
            o.error = r.error;
            o.usage = Usage {
                cpu_user_ms: Some(r.cpu_user_ms),
                cpu_sys_ms: Some(r.cpu_sys_ms),
                peak_memory_bytes: Some(r.peak_memory_bytes),
                pids_peak: None,
            };
            if o.exit_code.is_none() && o.signal.is_none() {
                o.exit_code = Some(125);
            }
        }
        (None, Ok(s)) => {
            use std::os::unix::process::ExitStatusExt;
            o.signal = s.signal().or(Some(libc::SIGKILL));
            o.error = Some("the fallback stage ended without a report; the job tree was killed".into());
        }
        (None, Err(e)) => {
            o.exit_code = Some(125);
            o.error = Some(format!("waiting for the job failed: {e}"));
        }
    }
    let cpu_hit = spec.limits.cpu_time_ms.is_some_and(|limit| {
        o.signal == Some(libc::SIGXCPU)
            || (o.signal == Some(libc::SIGKILL) && o.usage.cpu_ms().is_some_and(|used| used >= limit))
    });
    o.status = match (ending, o.exit_code, o.signal) {
        (Some(s), _, _) => s,
        (None, Some(0), _) => Status::Success,
        (None, _, Some(_)) if cpu_hit => Status::Timeout,
        (None, None, Some(_)) => Status::Killed,
        _ => Status::Failure,
    };
    o
}

/// A stage of ours (`confine <stage>`, shown as `name`) with an empty
/// environment and the job's streams, killed if dropped: both backends'
/// init stages start this way.
pub(crate) fn stage_command(
    program: &std::path::Path,
    name: &str,
    stage: &str,
    stdio: StdioSpec,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg0(name)
        .arg(stage)
        .env_clear()
        .stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr)
        .kill_on_drop(true);
    cmd
}

/// dup2 `fd` to `target`, clearing close-on-exec even when they are equal.
fn place_fd(fd: i32, target: i32) -> std::io::Result<()> {
    // SAFETY: dup2/fcntl on fds we own; async-signal-safe.
    unsafe {
        if fd == target {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        } else if libc::dup2(fd, target) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rlimits_follow_the_limits() {
        let mut spec = JobSpec::new(vec!["true".into()]);
        spec.limits.cpu_time_ms = Some(1500);
        spec.limits.pids = Some(20);
        spec.limits.memory_bytes = Some(64 << 20);
        let r = rlimits(&spec);
        let get = |res| r.iter().find(|l| l.resource == res).map(|l| (l.soft, l.hard));
        assert_eq!(get(Resource::Cpu), Some((2, 3)));
        assert_eq!(get(Resource::Nproc), Some((20, 20)));
        assert_eq!(get(Resource::Core), Some((0, 0)));
        assert!(get(Resource::Nofile).is_some_and(|(s, h)| s == h && h <= MAX_NOFILE));
        if cfg!(target_os = "linux") {
            assert_eq!(get(Resource::As), Some((64 << 20, 64 << 20)));
        } else {
            // macOS does not enforce RLIMIT_AS: none is set, and the outcome says so.
            assert_eq!(get(Resource::As), None);
            assert!(missing(&spec, None).iter().any(|m| m == "memoryLimit"));
        }
    }

    #[test]
    fn missing_names_every_lost_layer() {
        let mut spec = JobSpec::new(vec!["true".into()]);
        spec.limits.cpus = Some(0.5);
        let nobody = crate::sandbox::identity::NOBODY;
        let m = missing(&spec, Some((nobody, nobody)));
        for layer in ["userns", "netns", "landlock", "seccomp", "cgroup", "cpuQuota"] {
            assert!(m.iter().any(|l| l == layer), "{layer} in {m:?}");
        }
    }
}
