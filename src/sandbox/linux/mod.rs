//! The Linux backend, supervisor side: turn a [`JobSpec`] into an
//! [`InitSpec`], start `/proc/self/exe __init` with the control socket at
//! fd 3, and turn its reports into an [`Outcome`].
//!
//! This side runs inside tokio and therefore never forks into the jail
//! itself: the stage is started with `posix_spawn` ([`stage_process`]),
//! and no code of ours runs in the child before its execve.

pub mod caps;
pub mod cgroup;
pub mod exec;
mod idmap_check;
pub mod inherit;
pub mod init;
pub mod landlock;
mod mount_point;
pub mod mounts;
pub mod namespaces;
pub mod protocol;
pub mod rlimits;
pub mod seccomp;
pub mod signals;
mod stage_process;
pub mod supervise;
pub mod sweep;
pub mod sys;
pub mod warm;

use crate::job::{JobSpec, Layers, Network, Outcome, Status, Usage};
use crate::sandbox::{SandboxError, StdioSpec};
use protocol::{IdMap, InitReport, InitSpec, LandlockPlan, MountOp, CONTROL_FD, SECCOMP_FD};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

/// A started job.
pub struct RunningJob {
    pub job_id: String,
    child: stage_process::StageProcess,
    ctl: tokio::net::UnixStream,
    started: Instant,
    base_layers: Layers,
    spec: JobSpec,
    /// Dropped after `child`, so its Drop kills and removes a tree whose
    /// init stage was already told to die.
    cgroup: Option<cgroup::JobCgroup>,
    /// The sweep for repositories the job made in read-write idmapped
    /// trees (`sweep`), done after its tree is killed. A job dropped
    /// before its end leaves its record to a later supervisor.
    sweeps: sweep::Pending,
    /// The network allowlist's proxy (`--net allow:…`).
    proxy: Option<crate::proxy::serve::Attached>,
}

/// What [`init_spec_on`] learns from the host rather than from the spec:
/// a parameter, so that the plan is testable without root and without
/// the host's files. [`mounts::RealHost`] asks the kernel.
pub trait Host: mounts::HostFs {
    /// Our effective uid and gid.
    fn effective_ids(&self) -> (u32, u32);
    /// The owner (uid, gid) of `path`, symlinks followed (`stat`, not
    /// `lstat`); None when it can't be read.
    fn owner(&self, path: &std::path::Path) -> Option<(u32, u32)>;
    /// A dedicated owner uid for a job's user namespace
    /// ([`namespaces::USERNS_OWNER_BASE`]'s range).
    fn userns_owner(&self) -> u32;
}

impl Host for mounts::RealHost {
    fn effective_ids(&self) -> (u32, u32) {
        (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
    }

    fn owner(&self, path: &std::path::Path) -> Option<(u32, u32)> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).ok().map(|m| (m.uid(), m.gid()))
    }

    fn userns_owner(&self) -> u32 {
        userns_owner()
    }
}

/// Which ids the job has, inside and on the host: as root, those of
/// [`crate::sandbox::identity`] (never the workspace's group, never a
/// system account); rootless, our own, the only ones we may map. Inside,
/// the ids are the same numbers as outside.
///
/// `--user` changes the ids inside only (`spec.user`): any number, 0
/// included, is the job's own namespace's, mapped onto the same host ids.
pub fn sandbox_ids(spec: &JobSpec, host: &impl Host) -> (IdMap, IdMap, bool) {
    let (euid, egid) = host.effective_ids();
    let (uid, gid, rootless) = if euid != 0 {
        (euid, egid, true)
    } else {
        let owner = spec.workspace.as_deref().and_then(|w| host.owner(w)).map(|(uid, _)| uid);
        let (uid, gid) = crate::sandbox::identity::as_root_for(owner);
        (uid, gid, false)
    };
    let (in_uid, in_gid) = spec.user.unwrap_or((uid, gid));
    (IdMap { inside: in_uid, outside: uid }, IdMap { inside: in_gid, outside: gid }, rootless)
}

/// Landlock rules that match the mount plan: read what was bound, write
/// only /tmp, /dev/shm and what was bound read-write.
///
/// No TCP rules: an isolated job has a network namespace of its own, whose
/// only interface is its own `lo` (and, with `allow:`, its proxy there), so
/// the namespace already keeps every host address and service out of
/// reach. Landlock's rules name ports, not addresses: they could only take
/// the job's own loopback away, which test suites with local servers need.
pub fn landlock_plan(ops: &[MountOp], spec: &JobSpec) -> LandlockPlan {
    let mut plan = LandlockPlan { scope: true, tty: spec.tty, ..LandlockPlan::default() };
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

/// The [`InitSpec`] for `spec` on this host: every decision made here, as data.
pub fn init_spec(spec: &JobSpec) -> InitSpec {
    init_spec_on(spec, &mounts::RealHost)
}

/// [`init_spec`] with the host's facts taken from `host`.
pub fn init_spec_on(spec: &JobSpec, host: &impl Host) -> InitSpec {
    let (uid, gid, rootless) = sandbox_ids(spec, host);
    let mut mounts = mounts::plan(spec, host);
    let idmap_refused = mark_idmaps(&mut mounts, spec, (uid.outside, gid.outside), host);
    let landlock = Some(landlock_plan(&mounts, spec));
    let proxy_port = matches!(spec.network, Network::Allow(_)).then_some(crate::proxy::serve::PROXY_PORT);
    let mut env = spec.env.clone();
    if let Some(port) = proxy_port {
        // Ours replace any the caller passed: there is no other way out.
        env.retain(|(k, _)| !crate::proxy::is_proxy_var(k));
        env.extend(crate::proxy::proxy_env(port));
    }
    InitSpec {
        argv: spec.argv.clone(),
        env,
        cwd: spec.cwd.clone(),
        hostname: spec.hostname.clone(),
        new_netns: spec.network.isolated(),
        proxy_port,
        uid,
        gid,
        rootless,
        mounts,
        files: spec.files.clone(),
        cgroup_procs: Vec::new(),
        rlimits: Vec::new(),
        landlock,
        seccomp: None,
        allow_degraded: spec.allow_degraded,
        hold: spec.hold,
        tty: spec.tty,
        userns_owner: (!rootless).then(|| host.userns_owner()),
        idmap_refused,
        sweep_record: None,
        warm: false,
        idmap_owners: Vec::new(),
    }
}

/// Ask for an idmapped mount of the workspace and of the user's binds
/// whose owner is not the job's host uid and gid (root's checkout, as a
/// CI runner has; a user's, whose group the job never gets elsewhere):
/// the outer stage maps that owner onto the job, or says why not. Returns
/// `dst: why` for those refused here (reached through a symlink).
fn mark_idmaps(ops: &mut [MountOp], spec: &JobSpec, job: (u32, u32), host: &impl Host) -> Vec<String> {
    let mut refused = Vec::new();
    let wanted = |src: &std::path::Path, dst: &std::path::Path| {
        (dst == spec.workspace_at && spec.workspace.as_deref() == Some(src))
            || spec.binds.iter().any(|b| b.idmap && b.source == src && b.dest == dst)
    };
    for op in ops {
        if let MountOp::Bind { src, dst, exact: true, dev: false, idmap, .. } = op {
            // The host's root is never idmapped: root's own files (its
            // keys, /root) would be the job's.
            if !wanted(src, dst) || !mounts::recursive(src) {
                continue;
            }
            // Not there: the outer stage says so when it opens it.
            if let Some(owner) = host.owner(src) {
                if owner == job {
                    continue;
                }
                if spec.through_symlink.iter().any(|p| p == src) {
                    refused.push(format!(
                        "{}: its path goes through a symbolic link (give its real path, {}, to have it idmapped; \
                         its owner is uid {})",
                        dst.display(),
                        src.display(),
                        owner.0
                    ));
                    continue;
                }
                *idmap = Some(owner);
            }
        }
    }
    refused
}

/// The trees to sweep after the job: read-write binds that may be
/// idmapped (another owner's), whose repositories are protected. Opened
/// now, before the job runs, from `/` without following any link.
fn sweeps_for(init: &InitSpec) -> Vec<sweep::Sweep> {
    // Most jobs have no read-write idmap candidate: nothing is opened for them.
    let candidate = |op: &MountOp| matches!(op, MountOp::Bind { rw: true, idmap: Some(_), .. });
    if init.rootless || !init.mounts.iter().any(candidate) {
        return Vec::new();
    }
    let Ok(root) =
        nix::fcntl::open("/", nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for op in &init.mounts {
        let MountOp::Bind { src, dst, rw: true, idmap: Some((owner, _)), workspace, .. } = op else { continue };
        let protected = mounts::protected_under(&init.mounts, dst);
        // The workspace with --no-protect: the job may plant hooks in its
        // repository anyway, so there is nothing to sweep for. A bind has
        // no protection of its own: it is always swept (and refused with
        // a repository in it: `mounts::open_sources`).
        if *workspace && protected.is_empty() {
            continue;
        }
        let rel = src.strip_prefix("/").unwrap_or(src);
        let resolve = libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
        if let Ok(dir) = sys::openat2(&root, rel, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, resolve) {
            // Only what is there now is mounted read-only: a protected
            // `.git` that does not exist yet is the job's to make, and is
            // swept like any other.
            let beneath = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
            let skip = protected
                .into_iter()
                .filter(|p| sys::openat2(&dir, p, libc::O_PATH | libc::O_CLOEXEC, beneath).is_ok())
                .collect();
            out.push(sweep::Sweep { dir, src: src.clone(), dst: dst.clone(), owner: *owner, skip });
        }
    }
    out
}

/// What a long-lived supervisor (`confine serve`) does as it starts, not
/// at its first job: remove the job cgroups of crashed supervisors (their
/// trees are killed with them: `cgroup::supervisor`) and sweep what they
/// left unswept. An idle server would otherwise keep them until a job.
pub async fn startup_sweep() {
    match tokio::task::spawn_blocking(cgroup::supervisor).await {
        Ok(Err(e)) => tracing::debug!(error = %e, "no cgroups here; nothing of a crashed supervisor to remove"),
        Err(e) => tracing::warn!(error = %e, "the start-up sweep failed"),
        Ok(Ok(_)) => {}
    }
    sweep_stale_once().await;
}

/// Sweep what crashed supervisors left unswept (`sweep::sweep_stale`),
/// after `cgroup::supervisor` removed their jobs: at a process's first
/// job, and in a long-lived one (`serve`) again at a job a minute later.
async fn sweep_stale_once() {
    static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
    {
        let Ok(mut last) = LAST.lock() else { return };
        if last.is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(60)) {
            return;
        }
        *last = Some(Instant::now());
    }
    // Most starts find no record owed: a listing, on this thread. A sweep
    // walks trees, on a blocking thread.
    let names = sweep::owed();
    if names.is_empty() {
        return;
    }
    if let Ok(n) = tokio::task::spawn_blocking(move || sweep::sweep_stale(names)).await {
        if n > 0 {
            tracing::info!(records = n, "swept the trees of crashed supervisors' jobs");
        }
    }
}

/// A dedicated owner uid for a job's user namespace, drawn at random from
/// [`namespaces::USERNS_OWNER_BASE`]'s range.
fn userns_owner() -> u32 {
    let mut rnd = [0u8; 4];
    let _ = getrandom(&mut rnd);
    namespaces::USERNS_OWNER_BASE + u32::from_le_bytes(rnd) % namespaces::USERNS_OWNER_SLOTS
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
    spawn_adjusted(spec, stdio, seccomp, |_| {}).await
}

/// As [`spawn`], with a last change to the init stage's plan. For
/// benchmarks that price one layer (`benches/spawn.rs` drops landlock
/// and seccomp to measure what they add); not for production use.
#[doc(hidden)]
pub async fn spawn_adjusted(
    spec: &JobSpec,
    stdio: StdioSpec,
    seccomp: Option<(&str, &OwnedFd)>,
    adjust: impl FnOnce(&mut InitSpec),
) -> Result<RunningJob, SandboxError> {
    // `configure` checks the workspace, before it makes anything.
    let stage = InitStage::start(stdio, seccomp.map(|(_, fd)| fd))?;
    stage.configure(spec, seccomp.map(|(name, _)| name), adjust).await
}

/// Start `spec` through the backend-neutral lifecycle: in the sandbox
/// `launch.early` already built for it if it was built from this spec, in
/// the init stage started early if that is what there is, else afresh.
pub(crate) async fn spawn_job(
    spec: &JobSpec,
    stdio: StdioSpec,
    launch: crate::sandbox::Launch<'_>,
) -> Result<Box<dyn crate::sandbox::Job>, SandboxError> {
    use crate::sandbox::Early;
    // Fail closed: a caller that forgot the profile must not get a job
    // without a syscall filter (only the outcome's layers would say so).
    let Some(profile) = launch.seccomp else {
        return Err(SandboxError::Unavailable(
            "the linux backend was asked to start a job without a seccomp profile; this is a bug in confine".into(),
        ));
    };
    let seccomp = Some((profile.name.as_str(), &profile.fd));
    let fresh = || spawn(spec, stdio, seccomp);
    let mut job = match launch.early {
        // Killed by `adopt` before the job's own sandbox is built.
        Some(Early::Held(held)) => match held.adopt(spec) {
            Some(held) => held,
            None => fresh().await?,
        },
        Some(Early::Stage(stage)) => stage.configure(spec, seccomp.map(|(name, _)| name), |_| {}).await?,
        Some(Early::Warm(warm, part)) => {
            check_workspace(spec)?;
            match warm.take(spec, *part).await {
                Ok(job) => job,
                // Nothing ran in it; the job gets a sandbox of its own.
                Err(e) => {
                    tracing::warn!(error = %e, "the warm sandbox failed: the job starts cold");
                    fresh().await?
                }
            }
        }
        None => fresh().await?,
    };
    if let Some(id) = launch.job_id {
        job.job_id = id.to_string();
    }
    Ok(Box::new(job))
}

/// An `__init` stage started and waiting for its spec: nothing is built
/// yet, and it runs nothing. A one-shot supervisor starts it before it has
/// decided on the request (`Supervisor::open_one_shot`), so that the stage
/// loads and builds the sandbox beside the policy's compile. Dropped, it is
/// killed; it also exits at EOF on its control socket, having read no spec.
pub struct InitStage {
    child: stage_process::StageProcess,
    ours: std::os::unix::net::UnixStream,
    /// Whether the seccomp memfd was placed (a spec naming a profile
    /// needs it).
    has_seccomp: bool,
}

impl InitStage {
    /// Start the stage with the job's standard streams and, if any, the
    /// compiled seccomp profile's memfd.
    pub fn start(stdio: StdioSpec, seccomp_fd: Option<&OwnedFd>) -> Result<InitStage, SandboxError> {
        if std::env::var_os(INIT_MARKER).is_some() {
            // We are an init stage that the program did not dispatch: spawning
            // again would re-exec ourselves without end.
            return Err(SandboxError::Spawn(std::io::Error::other(
                "this process was started as confine's __init stage but ran the program instead: \
                 call confine::sandbox::linux::init::main() when argv[1] is \"__init\", \
                 or point set_init_executable() at a confine binary",
            )));
        }
        let seccomp_raw = seccomp_fd.map(|fd| fd.as_raw_fd());
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().map_err(SandboxError::Spawn)?;
        let mut fds = vec![(theirs.as_raw_fd(), CONTROL_FD)];
        fds.extend(seccomp_raw.map(|fd| (fd, SECCOMP_FD)));
        // An empty environment but the marker (and, in a debug build, a
        // test's refusal: `crashpoint::refused`). The stage sets its own
        // parent-death signal first thing (posix_spawn can't).
        let refuse = test_refusal();
        let env: Vec<&std::ffi::CStr> = std::iter::once(INIT_MARKER_ENV).chain(refuse.as_deref()).collect();
        let child = stage_process::spawn(init_executable(), &[c"confine-init", c"__init"], &env, stdio, &fds)
            .map_err(SandboxError::Spawn)?;
        tracing::debug!(pid = child.id(), "init stage started");
        drop(theirs);
        Ok(InitStage { child, ours, has_seccomp: seccomp_raw.is_some() })
    }

    /// Give the stage its job: make the job's cgroups, then send the spec
    /// (the stage can't create a process before it has joined them). On an
    /// error the stage is killed and reaped, having read no spec.
    pub async fn configure(
        self,
        spec: &JobSpec,
        seccomp_name: Option<&str>,
        adjust: impl FnOnce(&mut InitSpec),
    ) -> Result<RunningJob, SandboxError> {
        let InitStage { mut child, ours, has_seccomp } = self;
        if seccomp_name.is_some() && !has_seccomp {
            let _ = child.kill().await;
            return Err(SandboxError::Spawn(std::io::Error::other(
                "the init stage was started without the seccomp profile its job names",
            )));
        }
        if let Err(e) = check_workspace(spec) {
            let _ = child.kill().await;
            return Err(e);
        }
        let started = Instant::now();
        let job_id = crate::ids::job_id();
        let mut init = init_spec(spec);
        init.seccomp = seccomp_name.map(str::to_string);
        let sweeps = sweeps_for(&init);
        // The cgroups are made while the init stage loads (its dynamic loader
        // alone takes about as long), and before it has the spec: it can't
        // create a process before it has joined them. On an error here the
        // child is killed and reaped, having read no spec.
        let mut missing = Vec::new();
        // A held job runs nothing of its request before its release, which
        // comes after this returns: its limits are set after the spec is
        // sent, while the stage builds the sandbox, instead of before. In
        // degraded mode a limit the kernel refuses falls back to rlimits,
        // which the spec carries: they are set first there, as for a job
        // that is not held.
        let limits_later = spec.hold && !spec.allow_degraded;
        let cgroup = match job_cgroup(&job_id, spec, limits_later, &mut missing) {
            Ok(cgroup) => cgroup,
            Err(e) => {
                let _ = child.kill().await;
                return Err(e);
            }
        };
        tracing::debug!(cgroup = cgroup.is_some(), "job cgroup ready");
        if !init.rootless {
            sweep_stale_once().await;
        }
        // The record the outer stage writes (for the trees it idmaps)
        // before the job runs, so that a supervisor killed before its sweep
        // leaves the sweep to the next one.
        let job_ids = (init.uid.outside, init.gid.outside);
        if !sweeps.is_empty() {
            let procs = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
            let cgroup_dirs: Vec<_> =
                procs.iter().filter_map(|p| p.parent().map(std::path::Path::to_path_buf)).collect();
            match sweep::plan(&sweeps, job_ids, child.id().unwrap_or(0), &cgroup_dirs) {
                Ok(record) => init.sweep_record = Some((job_id.clone(), record)),
                Err(e) => {
                    let _ = child.kill().await;
                    return Err(SandboxError::Unavailable(e.to_string()));
                }
            }
        }
        let sweeps = sweep::Pending::new(sweeps, job_ids, &job_id);
        init.rlimits = limit_rlimits(&spec.limits, cgroup.is_some());
        init.cgroup_procs = cgroup.as_ref().map(|c| c.procs_files()).unwrap_or_default();
        adjust(&mut init);
        let proxy_sockets = match init.proxy_port.map(|_| proxy_sockets(spec)).transpose() {
            Ok(p) => p,
            Err(e) => {
                let _ = child.kill().await;
                return Err(e);
            }
        };
        {
            let mut w = &ours;
            protocol::write_spec(&mut w, &init).map_err(SandboxError::Spawn)?;
        }
        // The proxy's socket follows the spec; pid 1 sends its listeners
        // back on it, and the job starts only once the proxy serves them.
        let proxy = match proxy_sockets {
            Some((allow, sup, stage)) => {
                use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
                let iov = [std::io::IoSlice::new(&[protocol::PROXY_SOCKET])];
                let sent = sendmsg::<()>(
                    ours.as_raw_fd(),
                    &iov,
                    &[ControlMessage::ScmRights(&[stage.as_raw_fd()])],
                    MsgFlags::empty(),
                    None,
                );
                drop(stage);
                if let Err(e) = sent {
                    let _ = child.kill().await;
                    return Err(SandboxError::Spawn(e.into()));
                }
                Some(crate::proxy::serve::attach(sup, allow, spec.net_limits.clone()))
            }
            None => None,
        };
        if let (true, Some(cg)) = (limits_later, &cgroup) {
            if let Err(e) = cg.apply_limits(&spec.limits) {
                // Killed before its job was released; the cgroups go with
                // `cg`, dropped.
                let _ = child.kill().await;
                return Err(SandboxError::Cgroup(e));
            }
        }
        ours.set_nonblocking(true).map_err(SandboxError::Spawn)?;
        let ctl = tokio::net::UnixStream::from_std(ours).map_err(SandboxError::Spawn)?;
        let base_layers = base_layers(&init, cgroup.as_ref(), missing);
        Ok(RunningJob { job_id, child, ctl, started, base_layers, spec: spec.clone(), sweeps, cgroup, proxy })
    }
}

/// The layers a job of `init` has before its own reports add landlock's,
/// seccomp's and the mounts'.
fn base_layers(init: &InitSpec, cgroup: Option<&cgroup::JobCgroup>, missing: Vec<String>) -> Layers {
    Layers {
        userns: true,
        mountns: true,
        pidns: true,
        netns: init.new_netns,
        net_proxy: init.proxy_port.is_some(),
        ipcns: true,
        utsns: true,
        cgroupns: true,
        host_uid: init.uid.outside,
        host_gid: init.gid.outside,
        uid: (init.uid.inside != init.uid.outside).then_some(init.uid.inside),
        cgroup: cgroup.map(|c| c.layer().to_string()),
        missing,
        ..Layers::default()
    }
}

/// The allowlist of a `--net allow:…` job, and the socket pair its proxy
/// and its pid 1 talk over (the supervisor's end first).
fn proxy_sockets(spec: &JobSpec) -> Result<(crate::proxy::allowlist::Allowlist, OwnedFd, OwnedFd), SandboxError> {
    let Network::Allow(entries) = &spec.network else {
        return Err(SandboxError::Unavailable("a proxy for a job without an allowlist".into()));
    };
    let allow =
        crate::proxy::allowlist::Allowlist::parse(entries).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
    let (sup, stage) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| SandboxError::Spawn(e.into()))?;
    Ok((allow, sup, stage))
}

/// The job's cgroups. Without them (rootless and not delegated, or no
/// cgroupfs) the job still runs when it asked for no limit, or when
/// degraded mode is allowed: then rlimits stand in and `missing` says so.
/// `limits_later`: make the cgroups but leave the limits to the caller.
fn job_cgroup(
    job_id: &str,
    spec: &JobSpec,
    limits_later: bool,
    missing: &mut Vec<String>,
) -> Result<Option<cgroup::JobCgroup>, SandboxError> {
    let create = |c: &cgroup::Cgroups| {
        if limits_later {
            c.create_unlimited(job_id, &spec.limits)
        } else {
            c.create(job_id, &spec.limits)
        }
    };
    match cgroup::supervisor().and_then(create) {
        Ok(cg) => Ok(Some(cg)),
        // The operator's own setting is wrong: say so, whatever the limits.
        Err(e @ (cgroup::CgroupError::BadParent(_) | cgroup::CgroupError::ParentMissing { .. })) => {
            Err(SandboxError::Cgroup(e))
        }
        Err(e) if !cgroup::limits_need_cgroup(&spec.limits) => {
            tracing::debug!(error = %e, "job runs without a cgroup");
            Ok(None)
        }
        Err(e) if spec.allow_degraded => {
            tracing::warn!(error = %e, "cgroup limits unavailable: falling back to rlimits");
            missing.push("cgroup".into());
            Ok(None)
        }
        Err(e) => Err(SandboxError::Cgroup(e)),
    }
}

/// rlimits of the job process. RLIMIT_CPU always backs `--cpu-time` (the
/// supervisor also polls the cgroup's CPU time, which counts every
/// process). The others only stand in for a missing cgroup: RLIMIT_AS
/// breaks runtimes that reserve address space (Go, the JVM), and
/// RLIMIT_NPROC and RLIMIT_FSIZE count per process or per user, not per
/// job, so none of them is worth having beside a cgroup.
fn limit_rlimits(limits: &crate::job::Limits, with_cgroup: bool) -> Vec<protocol::Rlimit> {
    let mut out = Vec::new();
    let mut push = |resource: i32, soft: u64, hard: u64| out.push(protocol::Rlimit { resource, soft, hard });
    if let Some(ms) = limits.cpu_time_ms {
        // SIGXCPU at the soft limit, SIGKILL a second later. With a cgroup
        // the supervisor enforces the tree's total first; this per-process
        // limit is a backstop one second behind.
        let secs = ms.div_ceil(1000).max(1) + u64::from(with_cgroup);
        push(libc::RLIMIT_CPU as i32, secs, secs + 1);
    }
    if !with_cgroup {
        if let Some(bytes) = limits.memory_bytes {
            push(libc::RLIMIT_AS as i32, bytes, bytes);
        }
        if let Some(n) = limits.pids {
            push(libc::RLIMIT_NPROC as i32, n, n);
        }
        if limits.memory_bytes.is_some() || limits.pids.is_some() || limits.cpu_time_ms.is_some() {
            let size = limits.tmp_size_bytes;
            push(libc::RLIMIT_FSIZE as i32, size, size);
        }
    }
    out
}

static INIT_EXECUTABLE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Set in the `__init` stage's (otherwise empty) environment, so that a
/// program embedding this library that re-executes itself without handling
/// `__init` fails at once instead of spawning itself recursively. The job
/// never sees it: pid 1 executes it with the spec's environment.
const INIT_MARKER: &str = "CONFINE_INIT_STAGE";
/// [`INIT_MARKER`] set, as the stage's whole environment.
const INIT_MARKER_ENV: &std::ffi::CStr = c"CONFINE_INIT_STAGE=1";

/// `CONFINE_TEST_REFUSE=…` for the init stage, in a debug build whose
/// tests set it (`crashpoint::refused`); never in a release build.
fn test_refusal() -> Option<std::ffi::CString> {
    if !cfg!(debug_assertions) {
        return None;
    }
    let v = std::env::var(crate::crashpoint::REFUSE_ENV).ok()?;
    std::ffi::CString::new(format!("{}={v}", crate::crashpoint::REFUSE_ENV)).ok()
}

/// Use `path` (a `confine` binary) for the `__init` stage instead of
/// `/proc/self/exe`: for programs that embed the library, and its tests.
/// Only the first call has an effect.
pub fn set_init_executable(path: PathBuf) {
    let _ = INIT_EXECUTABLE.set(path);
}

fn init_executable() -> &'static std::path::Path {
    INIT_EXECUTABLE.get().map(PathBuf::as_path).unwrap_or(std::path::Path::new("/proc/self/exe"))
}

impl RunningJob {
    /// Whether the job waits for [`RunningJob::release`] before its execve.
    pub fn held(&self) -> bool {
        self.spec.hold
    }

    /// Take this held job, built before its supervisor had decided on it,
    /// as the job of `spec`: if its sandbox was built from the same spec,
    /// but for `hold` and the timeout, which the supervisor enforces from
    /// outside (it then takes `spec`'s; the deadline still counts from the
    /// sandbox's start). None drops it, which kills it unreleased.
    pub fn adopt(mut self, spec: &JobSpec) -> Option<RunningJob> {
        let mut wanted = spec.clone();
        wanted.hold = self.spec.hold;
        wanted.limits.timeout_ms = self.spec.limits.timeout_ms;
        if !self.spec.hold || wanted != self.spec {
            tracing::debug!("the held sandbox was built from another spec: killed");
            return None;
        }
        self.spec.limits.timeout_ms = spec.limits.timeout_ms;
        Some(self)
    }

    /// Let a job spawned with [`JobSpec::hold`] execve. Its sandbox is
    /// built (or being built); dropping the job unreleased kills it.
    pub async fn release(&mut self) -> Result<(), SandboxError> {
        use tokio::io::AsyncWriteExt;
        self.ctl.write_all(&[protocol::RELEASE]).await.map_err(SandboxError::Spawn)
    }

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

    /// Kill the whole tree through its cgroup (`cgroup.kill`, or the v1
    /// freezer), then SIGKILL the init stage as the second guarantee.
    pub fn kill_tree(&mut self) {
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill_tree() {
                tracing::warn!(error = %e, "cgroup kill failed; relying on the pid namespace");
            }
        }
        self.kill();
    }

    /// The job's cgroups, when it has any.
    pub fn cgroup(&self) -> Option<&cgroup::JobCgroup> {
        self.cgroup.as_ref()
    }

    /// The job's stdin, when it was piped, for async writes.
    pub fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        let fd = self.child.stdin.take()?;
        tokio::process::ChildStdin::from_std(fd.into())
            .map_err(|e| tracing::warn!(error = %e, "the job's stdin could not be registered; it gets EOF"))
            .ok()
    }

    /// The write end of the job's stdin pipe, when it was piped (blocking).
    pub fn stdin_fd(&mut self) -> Option<OwnedFd> {
        self.child.stdin.take()
    }

    /// The read end of the job's stdout pipe, when it was piped (blocking).
    pub fn stdout_fd(&mut self) -> Option<OwnedFd> {
        self.child.stdout.take()
    }

    /// The read end of the job's stderr pipe, when it was piped (blocking).
    pub fn stderr_fd(&mut self) -> Option<OwnedFd> {
        self.child.stderr.take()
    }

    /// The job's stdout, when it was piped, for async reads.
    pub fn stdout(&mut self) -> Option<std::io::Result<tokio::process::ChildStdout>> {
        self.stdout_fd().map(|fd| tokio::process::ChildStdout::from_std(fd.into()))
    }

    /// The job's stderr, when it was piped, for async reads.
    pub fn stderr(&mut self) -> Option<std::io::Result<tokio::process::ChildStderr>> {
        self.stderr_fd().map(|fd| tokio::process::ChildStderr::from_std(fd.into()))
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// The outcome, from the init stage's exit `status` and its reports
    /// (`buf`). `killed`: we signalled or killed the tree (a kill, a
    /// cancellation, a timeout), so an init stage that died without a
    /// report is no failure of the sandbox.
    fn outcome(&self, status: std::io::Result<std::process::ExitStatus>, buf: &[u8], killed: bool) -> Outcome {
        let duration_ms = self.started.elapsed().as_millis() as u64;
        let reports: Vec<InitReport> = buf
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
            guarantees: Default::default(),
            limits: self.spec.limits.clone(),
            error: None,
            setup_step: None,
            network: None,
            tmp_full: None,
        };
        let mut exited = false;
        for r in reports {
            match r {
                InitReport::Started { .. } | InitReport::TimedOut => {}
                InitReport::Confined {
                    landlock,
                    seccomp,
                    missing,
                    mounts_locked,
                    protected,
                    idmapped,
                    not_idmapped,
                } => {
                    layers.mounts_locked = mounts_locked;
                    layers.protected = protected;
                    layers.idmapped = idmapped;
                    layers.not_idmapped = not_idmapped;
                    layers.landlock = landlock;
                    layers.seccomp = seccomp;
                    layers.missing.extend(missing);
                    layers.caps_dropped = true;
                    layers.no_new_privs = true;
                }
                InitReport::ExecFailed { errno, command } => {
                    let reason = nix::errno::Errno::from_raw(errno).desc();
                    let relative = command.contains('/') && !command.starts_with('/');
                    outcome.error =
                        Some(if exec::exit_code_for(errno) == 127 && relative && self.spec.workspace.is_none() {
                            format!(
                            "{command}: the command is not in the sandbox (no workspace was given, and the job starts \
                             in /tmp); did you mean --workspace . ?"
                        )
                        } else if exec::exit_code_for(errno) == 127 {
                            // Never a bind into the workspace: what lies there the job chose.
                            let host = crate::runtimes::toolchain::Host::from_env()
                                .with_repos(self.spec.workspace.iter().map(|w| w.as_path()));
                            match crate::runtimes::toolchain::bind_hint(&command, &host) {
                                Some(fix) => format!(
                                    "{command}: command not found in the sandbox ({reason}); the host has it \
                                     outside what the sandbox binds: run it with {fix}"
                                ),
                                None => format!("{command}: command not found in the sandbox ({reason})"),
                            }
                        } else {
                            format!("{command}: cannot execute ({reason})")
                        });
                }
                InitReport::SetupFailed { step, error } => {
                    // The error names its step too: once is enough.
                    let error = error.strip_prefix(&format!("{step}: ")).unwrap_or(&error);
                    outcome.error.get_or_insert(format!("sandbox setup failed at '{step}': {error}"));
                    outcome.setup_step.get_or_insert(step);
                }
                InitReport::Exited { code, signal, tmp_out } => {
                    exited = true;
                    outcome.exit_code = code;
                    outcome.signal = signal;
                    outcome.tmp_full = tmp_out.map(|o| crate::job::TmpFull::of(self.spec.limits.tmp_size_bytes, o));
                }
            }
        }
        if !exited && killed {
            // Ended by us (a kill, a cancellation, a timeout): the signal
            // that ended the init stage, which took the job with it.
            use std::os::unix::process::ExitStatusExt;
            outcome.signal = status.as_ref().ok().and_then(|s| s.signal()).or(Some(libc::SIGKILL));
        } else if !exited {
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
            layers.mounts_locked = false;
        }
        outcome.guarantees = crate::sandbox::Guarantees::of(crate::sandbox::BackendKind::Linux, &layers);
        outcome.layers = layers;
        outcome
    }
}

/// Host paths a job's sandbox reads (for doctor and tests).
pub fn system_paths() -> Vec<PathBuf> {
    mounts::SYSTEM_PATHS.iter().map(PathBuf::from).collect()
}

impl crate::sandbox::Job for RunningJob {
    fn held(&self) -> bool {
        RunningJob::held(self)
    }

    fn release(&mut self) -> crate::sandbox::BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(RunningJob::release(self))
    }

    fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        RunningJob::take_stdin(self)
    }

    fn stdin_pipe(&mut self) -> Option<std::io::Result<OwnedFd>> {
        self.stdin_fd().map(Ok)
    }

    fn stdout_pipe(&mut self) -> Option<std::io::Result<OwnedFd>> {
        self.stdout_fd().map(Ok)
    }

    fn stderr_pipe(&mut self) -> Option<std::io::Result<OwnedFd>> {
        self.stderr_fd().map(Ok)
    }

    fn kill_tree(&mut self) {
        RunningJob::kill_tree(self)
    }

    fn signaller(&self) -> Option<crate::sandbox::Signaller> {
        // A pidfd of the init stage, opened while it is our unreaped child:
        // no signal can reach a process that reused its pid later.
        let pid = i32::try_from(self.child.id()?).ok()?;
        let fd = sys::pidfd_open(pid).map_err(|e| tracing::warn!(error = %e, "no pidfd of the init stage")).ok()?;
        Some(std::sync::Arc::new(move |sig| {
            // ESRCH: the job has ended.
            let _ = signals::pidfd_send(&fd, sig);
        }))
    }

    fn supervise(
        self: Box<Self>,
        kill_grace: std::time::Duration,
        stop: crate::sandbox::BoxFuture<'static, crate::sandbox::Stop>,
    ) -> crate::sandbox::BoxFuture<'static, (Outcome, crate::sandbox::Teardown)> {
        use nix::sys::signal::Signal;
        let signal = async move {
            match stop.await {
                crate::sandbox::Stop::Kill => Signal::SIGKILL,
                // The stop requests forwarded are real signals; anything
                // else ends the job at once.
                crate::sandbox::Stop::Forward(sig) => Signal::try_from(sig).unwrap_or(Signal::SIGKILL),
            }
        };
        Box::pin((*self).supervise_until_dead(kill_grace, signal))
    }
}

#[cfg(test)]
mod tests;
