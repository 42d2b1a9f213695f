//! Warm sandboxes: a job's sandbox built before its request arrives.
//!
//! A warm sandbox is an `__init` stage given only the base of a spec
//! ([`InitSpec::split`]): its namespaces, its root with the system's
//! paths, `/proc`, `/dev` and a fresh `/tmp`, and its cgroups, made
//! without limits. Its pid 1 waits before the pivot, having run nothing.
//! A request whose spec has the same base takes it ([`WarmSandbox::take`]):
//! its limits go to the cgroups, then its part (argv, environment, the
//! workspace and binds, landlock, rlimits) to the stage, whose outer
//! stage opens the binds as detached copies from the host and hands them
//! to pid 1, which mounts them, pivots, and starts the job as a cold
//! sandbox would. The job's confinement is the same: only the order of
//! the work differs. Each warm sandbox serves one job and is never
//! reused; dropped unused, it is killed with its cgroups.

use super::protocol::{self, InitSpec, RequestPart};
use super::{cgroup, init_spec, limit_rlimits, sweep, sweeps_for, InitStage, RunningJob};
use crate::job::{JobSpec, Limits};
use crate::sandbox::{SandboxError, StdioSpec};
use std::os::fd::OwnedFd;
use std::time::Instant;

/// Which cgroup controllers a job's limits need: a warm sandbox's
/// cgroups were made for one such set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupShape {
    memory: bool,
    pids: bool,
    cpu: bool,
}

impl CgroupShape {
    fn of(limits: &Limits) -> CgroupShape {
        CgroupShape { memory: limits.memory_bytes.is_some(), pids: limits.pids.is_some(), cpu: limits.cpus.is_some() }
    }
}

/// What a request needs of a warm sandbox to be served by it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmShape {
    key: Vec<u8>,
    cgroup: CgroupShape,
    stdin_piped: bool,
}

impl WarmShape {
    /// The streams a sandbox of this shape is started with: output
    /// captured, stdin piped or not.
    pub fn stdio(&self) -> StdioSpec {
        let mut stdio = StdioSpec::piped();
        if self.stdin_piped {
            stdio.stdin = crate::sandbox::StdioTarget::Piped;
        }
        stdio
    }
}

/// A request's spec, split, and the shape of the warm sandbox that can
/// serve it; None for a request no warm sandbox serves: rootless (no
/// detached copy of a host mount without host root), a terminal, or a
/// network allowlist (its proxy's sockets are made per job).
pub fn shape_of(spec: &JobSpec, seccomp: &str, stdin_piped: bool) -> Option<(WarmShape, InitSpec, RequestPart)> {
    let mut init = init_spec(spec);
    init.seccomp = Some(seccomp.to_string());
    if init.rootless || init.tty || init.proxy_port.is_some() || spec.allow_degraded {
        return None;
    }
    let sweeps = !sweeps_for(&init).is_empty();
    let (mut base, part) = init.split();
    // A job whose trees are swept after it has a record made for it by the
    // cold path; not warm.
    if sweeps {
        return None;
    }
    let shape = WarmShape { key: base.base_key(), cgroup: CgroupShape::of(&spec.limits), stdin_piped };
    base.idmap_owners = idmap_owners(&part.mounts);
    Some((shape, base, part))
}

/// The owners whose trees `mounts` idmap, each once.
fn idmap_owners(mounts: &[protocol::MountOp]) -> Vec<(u32, u32)> {
    let mut owners = Vec::new();
    for op in mounts {
        if let protocol::MountOp::Bind { idmap: Some(owner), .. } = op {
            if !owners.contains(owner) {
                owners.push(*owner);
            }
        }
    }
    owners
}

/// The calling thread's nice value (0 if it can't be read).
fn current_nice() -> i32 {
    nix::errno::Errno::clear();
    // SAFETY: getpriority takes integers; -1 is a valid value, told apart
    // from an error by errno, cleared above.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if nice == -1 && nix::errno::Errno::last_raw() != 0 {
        return 0;
    }
    nice
}

/// A sandbox built up to its request, waiting.
pub struct WarmSandbox {
    stage: InitStage,
    job_id: String,
    cgroup: cgroup::JobCgroup,
    shape: WarmShape,
    built: Instant,
    /// The job's stdin, stdout and stderr, when they are not the ones the
    /// sandbox was built with ([`WarmSandbox::with_streams`]).
    streams: Option<[OwnedFd; 3]>,
}

impl WarmSandbox {
    /// Start building a sandbox of `base` (a request's base, from
    /// [`shape_of`]), with fresh streams as `stdio` says and the seccomp
    /// profile's memfd. Returns at once; the stage builds meanwhile.
    pub fn start(
        shape: &WarmShape,
        base: &InitSpec,
        limits: &Limits,
        stdio: StdioSpec,
        seccomp_fd: &OwnedFd,
    ) -> Result<WarmSandbox, SandboxError> {
        let stage = InitStage::start(stdio, Some(seccomp_fd))?;
        // Named apart from the jobs' own, which a listing of the job
        // cgroups may need to tell from the pool's.
        let job_id = format!("warm-{}", crate::ids::job_id());
        // The job's controllers, no limit yet: those are the request's.
        let cgroup = cgroup::supervisor().and_then(|c| c.create_unlimited(&job_id, limits))?;
        // Built in the background: the stage joins these cgroups before
        // its heavy part, where its nice value weighs nothing against the
        // jobs' cgroups.
        cgroup.set_background(true)?;
        let mut spec = base.clone();
        spec.warm = true;
        spec.cgroup_procs = cgroup.procs_files();
        // A random owner of the user namespace of its own, as every job has.
        spec.userns_owner = Some(super::userns_owner());
        let mut w = &stage.ours;
        protocol::write_spec(&mut w, &spec).map_err(SandboxError::Spawn)?;
        Ok(WarmSandbox { stage, job_id, cgroup, shape: shape.clone(), built: Instant::now(), streams: None })
    }

    /// Give the job these streams (stdin, stdout, stderr) instead of the
    /// sandbox's own: a `confine run` through a server passes its
    /// caller's pipes.
    pub fn with_streams(mut self: Box<Self>, streams: [OwnedFd; 3]) -> Box<Self> {
        self.streams = Some(streams);
        self
    }

    /// Whether this sandbox serves a request of `shape`.
    pub fn fits(&self, shape: &WarmShape) -> bool {
        self.shape == *shape
    }

    /// How long it has waited.
    pub fn age(&self) -> std::time::Duration {
        self.built.elapsed()
    }

    /// Whether its stage is still there (it may have failed to build, or
    /// been killed).
    pub fn alive(&mut self) -> bool {
        self.stage.child.try_reap().is_ok_and(|s| s.is_none())
    }

    /// Run `spec` (whose request part is `part`, from [`shape_of`]) in this
    /// sandbox. The caller checked [`WarmSandbox::fits`]. On an error the
    /// sandbox is killed, having run nothing.
    pub async fn take(self, spec: &JobSpec, mut part: RequestPart) -> Result<RunningJob, SandboxError> {
        let WarmSandbox { stage, job_id, cgroup, streams, .. } = self;
        part.streams = streams.is_some();
        let InitStage { mut child, ours, .. } = stage;
        super::check_workspace(spec)?;
        let started = Instant::now();
        super::sweep_stale_once().await;
        part.rlimits = limit_rlimits(&spec.limits, true);
        part.nice = current_nice().max(0);
        // The outer stage may be building still, at the pool's priority: it
        // goes on at the request's, and gives pid 1 the same.
        if let Some(pid) = child.id() {
            // SAFETY: setpriority takes integers and no pointers; the pid is
            // our unreaped child's.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, pid, part.nice) };
        }
        // The limits, and a job's weight, are in force before the stage
        // has its request.
        if let Err(e) = cgroup.set_background(false).and_then(|()| cgroup.apply_limits(&spec.limits)) {
            let _ = child.kill().await;
            return Err(SandboxError::Cgroup(e));
        }
        // The part goes whole or not at all as far as the stage can tell:
        // it starts nothing on a part it could not read to its end, so a
        // caller that falls back to a cold sandbox on an error runs the job
        // once.
        let mut bytes = Vec::new();
        let sent = match protocol::write_spec(&mut bytes, &part)
            .and_then(|()| ours.set_nonblocking(true))
            .and_then(|()| tokio::net::UnixStream::from_std(ours))
        {
            Ok(mut ctl) => {
                use tokio::io::AsyncWriteExt;
                match ctl.write_all(&bytes).await {
                    Ok(()) => match &streams {
                        Some(fds) => send_streams(&ctl, fds).await.map(|()| ctl),
                        None => Ok(ctl),
                    },
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let ctl = match sent {
            Ok(ctl) => ctl,
            Err(e) => {
                let _ = child.kill().await;
                return Err(SandboxError::Spawn(e));
            }
        };
        let init = {
            let mut i = init_spec(spec);
            i.cgroup_procs = cgroup.procs_files();
            i
        };
        let mut base_layers = super::base_layers(&init, Some(&cgroup), Vec::new());
        base_layers.warm = true;
        let sweeps = sweep::Pending::new(Vec::new(), (init.uid.outside, init.gid.outside), &job_id);
        Ok(RunningJob {
            job_id,
            child,
            ctl,
            started,
            base_layers,
            spec: spec.clone(),
            sweeps,
            cgroup: Some(cgroup),
            proxy: None,
        })
    }
}

/// The job's streams, after its part ([`RequestPart::streams`]).
async fn send_streams(ctl: &tokio::net::UnixStream, fds: &[OwnedFd; 3]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    loop {
        ctl.writable().await?;
        let sent = ctl.try_io(tokio::io::Interest::WRITABLE, || {
            let iov = [std::io::IoSlice::new(&[protocol::STREAMS])];
            sendmsg::<()>(ctl.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::MSG_DONTWAIT, None)
                .map_err(std::io::Error::from)
        });
        match sent {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::MountOp;

    fn bind(dst: &str, idmap: Option<(u32, u32)>) -> MountOp {
        MountOp::Bind {
            src: "/src".into(),
            dst: dst.into(),
            rw: false,
            dev: false,
            optional: false,
            exact: true,
            idmap,
            workspace: false,
        }
    }

    #[test]
    fn the_owners_to_premake_are_those_the_request_idmaps_each_once() {
        let mounts =
            [bind("/workspace", Some((0, 0))), bind("/a", None), bind("/b", Some((7, 8))), bind("/c", Some((0, 0)))];
        assert_eq!(idmap_owners(&mounts), vec![(0, 0), (7, 8)]);
    }

    #[test]
    fn a_base_premaking_other_owners_serves_the_same_shape() {
        let spec = crate::job::JobSpec::new(vec!["true".into()]);
        let mut base = init_spec(&spec);
        let key = base.base_key();
        base.idmap_owners = vec![(0, 0)];
        assert_eq!(base.base_key(), key);
    }
}
