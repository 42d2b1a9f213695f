//! The Linux backend, supervisor side: turn a [`JobSpec`] into an
//! [`InitSpec`], start `/proc/self/exe __init` with the control socket at
//! fd 3, and turn its reports into an [`Outcome`].
//!
//! This side runs inside tokio and therefore never forks into the jail
//! itself: `pre_exec` below only makes async-signal-safe syscalls.

pub mod caps;
pub mod exec;
pub mod init;
pub mod landlock;
pub mod mounts;
pub mod namespaces;
pub mod protocol;
pub mod rlimits;
pub mod seccomp;
pub mod sys;

use crate::job::{JobSpec, Layers, Network, Outcome, Status, Usage};
use crate::sandbox::{SandboxError, StdioSpec};
use protocol::{IdMap, InitSpec, LandlockPlan, MountOp, Report, CONTROL_FD, SECCOMP_FD};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Instant;
use tokio::io::AsyncReadExt;

/// Host uid/gid a job runs as when the supervisor is root and the workspace
/// does not name a better one.
pub const NOBODY: u32 = 65534;

/// A started job.
pub struct RunningJob {
    pub job_id: String,
    child: tokio::process::Child,
    ctl: tokio::net::UnixStream,
    started: Instant,
    base_layers: Layers,
    spec: JobSpec,
}

/// Which ids the job has, inside and on the host.
///
/// As root, the job runs as the owner of the workspace when that owner is
/// not root (so files it writes belong to the project's owner, as a user
/// expects), and as `nobody` otherwise. Rootless, the only id we may map is
/// our own. Inside, the ids are the same numbers as outside.
pub fn sandbox_ids(spec: &JobSpec) -> (IdMap, IdMap, bool) {
    let euid = nix::unistd::geteuid().as_raw();
    let egid = nix::unistd::getegid().as_raw();
    if euid != 0 {
        return (IdMap { inside: euid, outside: euid }, IdMap { inside: egid, outside: egid }, true);
    }
    let owner = spec.workspace.as_ref().and_then(|w| std::fs::metadata(w).ok()).map(|m| (m.uid(), m.gid()));
    let (uid, gid) = match owner {
        Some((u, g)) if u != 0 => (u, if g != 0 { g } else { NOBODY }),
        _ => (NOBODY, NOBODY),
    };
    (IdMap { inside: uid, outside: uid }, IdMap { inside: gid, outside: gid }, false)
}

/// Landlock rules that match the mount plan: read what was bound, write
/// only /tmp, /dev/shm and what was bound read-write.
pub fn landlock_plan(ops: &[MountOp], spec: &JobSpec) -> LandlockPlan {
    let mut plan = LandlockPlan { deny_tcp: spec.network == Network::None, scope: true, ..LandlockPlan::default() };
    for op in ops {
        if let MountOp::Bind { dst, rw, dev: false, .. } = op {
            if *rw {
                plan.write.push(dst.clone());
            } else {
                plan.read.push(dst.clone());
            }
        }
    }
    plan.read.push("/proc".into());
    plan.read.push("/dev".into());
    plan.write.push("/tmp".into());
    plan.write.push("/dev/shm".into());
    plan
}

fn check_workspace(spec: &JobSpec) -> Result<(), SandboxError> {
    if let Some(ws) = &spec.workspace {
        match std::fs::metadata(ws) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(SandboxError::Workspace { path: ws.clone(), reason: "not a directory".into() }),
            Err(e) => return Err(SandboxError::Workspace { path: ws.clone(), reason: e.to_string() }),
        }
    }
    if spec.argv.is_empty() {
        return Err(SandboxError::NoCommand);
    }
    Ok(())
}

/// The [`InitSpec`] for `spec`: every decision made here, as data.
pub fn init_spec(spec: &JobSpec) -> InitSpec {
    let (uid, gid, rootless) = sandbox_ids(spec);
    let mounts = mounts::plan(spec, &mounts::RealHost);
    let landlock = Some(landlock_plan(&mounts, spec));
    InitSpec {
        argv: spec.argv.clone(),
        env: spec.env.clone(),
        cwd: spec.cwd.clone(),
        hostname: spec.hostname.clone(),
        new_netns: spec.network == Network::None,
        uid,
        gid,
        rootless,
        mounts,
        cgroup_procs: Vec::new(),
        rlimits: Vec::new(),
        landlock,
        seccomp: None,
        allow_degraded: spec.allow_degraded,
    }
}

fn new_job_id() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let mut rnd = [0u8; 4];
    let _ = getrandom(&mut rnd);
    format!("job-{now}-{:02x}{:02x}{:02x}{:02x}", rnd[0], rnd[1], rnd[2], rnd[3])
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    // SAFETY: buf is a valid writable slice of the given length.
    let ret = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if ret < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Start `spec` in a fresh sandbox. Must be called from a tokio worker
/// thread that outlives the job (the init stage dies with its parent thread).
pub async fn spawn(
    spec: &JobSpec,
    stdio: StdioSpec,
    seccomp: Option<(&str, &OwnedFd)>,
) -> Result<RunningJob, SandboxError> {
    check_workspace(spec)?;
    let mut init = init_spec(spec);
    init.seccomp = seccomp.map(|(name, _)| name.to_string());
    let seccomp_fd = seccomp.map(|(_, fd)| fd.as_raw_fd());

    let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SandboxError::Spawn)?;
    let theirs_fd = theirs.as_raw_fd();
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("confine-init")
        .arg("__init")
        .env_clear()
        .stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr)
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and only
    // calls async-signal-safe syscalls (dup2, fcntl, prctl) on fds that
    // stay open in the parent until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            place_fd(theirs_fd, CONTROL_FD)?;
            if let Some(fd) = seccomp_fd {
                place_fd(fd, SECCOMP_FD)?;
            }
            // If the supervisor dies, the init stage dies, and pid 1 after it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(SandboxError::Spawn)?;
    drop(theirs);
    {
        let mut w = &ours;
        protocol::write_spec(&mut w, &init).map_err(SandboxError::Spawn)?;
    }
    ours.set_nonblocking(true).map_err(SandboxError::Spawn)?;
    let ctl = tokio::net::UnixStream::from_std(ours).map_err(SandboxError::Spawn)?;
    let base_layers = Layers {
        userns: true,
        mountns: true,
        pidns: true,
        netns: init.new_netns,
        ipcns: true,
        utsns: true,
        cgroupns: true,
        host_uid: init.uid.outside,
        ..Layers::default()
    };
    Ok(RunningJob { job_id: new_job_id(), child, ctl, started, base_layers, spec: spec.clone() })
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

impl RunningJob {
    /// Host pid of the outer init stage.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Send `sig` to the job (the init stages forward it).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
        }
    }

    /// Kill the whole tree: SIGKILL to the init stage, whose death kills
    /// pid 1 (parent-death signal), whose death empties the pid namespace.
    pub fn kill(&mut self) {
        let _ = self.child.start_kill();
    }

    pub fn stdout(&mut self) -> Option<tokio::process::ChildStdout> {
        self.child.stdout.take()
    }

    pub fn stderr(&mut self) -> Option<tokio::process::ChildStderr> {
        self.child.stderr.take()
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Wait for the job to end and gather its outcome.
    pub async fn wait(mut self) -> Outcome {
        let mut buf = Vec::new();
        let (status, _) = tokio::join!(self.child.wait(), self.ctl.read_to_end(&mut buf));
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let reports: Vec<Report> = buf
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| serde_json::from_slice(l).ok())
            .collect();
        let mut layers = self.base_layers.clone();
        let mut outcome = Outcome {
            job_id: self.job_id.clone(),
            status: Status::Failure,
            exit_code: None,
            signal: None,
            duration_ms,
            queued_ms: 0,
            usage: Usage::default(),
            backend: "linux".into(),
            layers: Layers::default(),
            limits: self.spec.limits.clone(),
            error: None,
        };
        let mut exited = false;
        for r in reports {
            match r {
                Report::Started { .. } => {}
                Report::Confined { landlock, seccomp, missing } => {
                    layers.landlock = landlock;
                    layers.seccomp = seccomp;
                    layers.missing = missing;
                    layers.caps_dropped = true;
                    layers.no_new_privs = true;
                }
                Report::ExecFailed { errno, command } => {
                    let reason = nix::errno::Errno::from_raw(errno).desc();
                    outcome.error = Some(if exec::exit_code_for(errno) == 127 {
                        format!("{command}: command not found in the sandbox ({reason})")
                    } else {
                        format!("{command}: cannot execute ({reason})")
                    });
                }
                Report::SetupFailed { step, error } => {
                    outcome.error.get_or_insert(format!("sandbox setup failed at '{step}': {error}"));
                }
                Report::Exited { code, signal } => {
                    exited = true;
                    outcome.exit_code = code;
                    outcome.signal = signal;
                }
            }
        }
        if !exited {
            // The init stage failed before the job could run (or was killed).
            match status {
                Ok(s) if s.code() == Some(125) || outcome.error.is_some() => {
                    outcome.exit_code = Some(125);
                    outcome.error.get_or_insert("sandbox setup failed".into());
                }
                Ok(s) => {
                    outcome.exit_code = s.code().map(|c| if c > 128 { c } else { 125 });
                    if outcome.error.is_none() {
                        outcome.error = Some("the sandbox's init stage ended before the job reported".into());
                    }
                }
                Err(e) => {
                    outcome.exit_code = Some(125);
                    outcome.error = Some(format!("waiting for the sandbox failed: {e}"));
                }
            }
        }
        outcome.status = match (outcome.exit_code, outcome.signal) {
            (Some(0), _) => Status::Success,
            (None, Some(_)) => Status::Killed,
            _ => Status::Failure,
        };
        if outcome.error.is_some() && outcome.exit_code == Some(125) {
            layers.caps_dropped = false;
            layers.no_new_privs = false;
        }
        outcome.layers = layers;
        outcome
    }
}

/// Host paths a job's sandbox reads (for doctor and tests).
pub fn system_paths() -> Vec<PathBuf> {
    mounts::SYSTEM_PATHS.iter().map(PathBuf::from).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landlock_follows_the_mount_plan() {
        let mut spec = JobSpec::new(vec!["true".into()]);
        spec.workspace = Some("/w".into());
        spec.workspace_rw = true;
        let ops = vec![
            MountOp::Bind { src: "/usr".into(), dst: "/usr".into(), rw: false, dev: false, optional: true },
            MountOp::Bind { src: "/w".into(), dst: "/workspace".into(), rw: true, dev: false, optional: false },
            MountOp::Bind { src: "/dev/null".into(), dst: "/dev/null".into(), rw: true, dev: true, optional: false },
        ];
        let plan = landlock_plan(&ops, &spec);
        assert!(plan.read.contains(&"/usr".into()));
        assert!(plan.write.contains(&"/workspace".into()));
        assert!(!plan.write.contains(&"/dev/null".into()), "devices get their own narrow rule");
        assert!(plan.deny_tcp);
        spec.network = Network::Host;
        assert!(!landlock_plan(&ops, &spec).deny_tcp);
    }

    #[test]
    fn job_ids_are_unique() {
        assert_ne!(new_job_id(), new_job_id());
    }
}
