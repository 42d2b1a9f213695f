//! The `__init` stage: a single-threaded re-exec of our own binary that
//! builds the sandbox and becomes its pid 1. Three processes, in order:
//!
//! 1. **outer** (host namespaces, host root): reads the [`InitSpec`],
//!    resets what a job must not inherit, joins the job's cgroups, clones
//!    pid 1 into new namespaces (as the namespace's dedicated owner uid),
//!    writes its uid/gid maps, opens every mount source in pid 1's mount
//!    namespace and hands the fds over, forwards signals and exits with the
//!    job's status;
//! 2. **pid 1** (new namespaces): switches to the mapped ids, builds the
//!    root and pivots into it, forks the job, reaps zombies, forwards
//!    signals; when the job ends it exits, and the kernel kills every
//!    process left in the pid namespace;
//! 3. **job**: a session of its own (and, with `--tty`, its pty as the
//!    controlling terminal), rlimits, drop capabilities, no_new_privs,
//!    landlock, seccomp (last), execve.
//!
//! No tokio here, ever: this code forks.

use super::namespaces::{Nested, NestedJob, NestedPid1, NotNested, Readiness};
use super::protocol::IdMap;
use super::protocol::{
    encode_report, read_spec, write_spec, InitReport, InitSpec, MountOp, RequestPart, CONTROL_FD, PROXY_READY,
    PROXY_SOCKET, RELEASE, SECCOMP_FD, STREAMS,
};
use super::sys::{self, SysError};
use super::{caps, exec, inherit, landlock, mounts, namespaces, rlimits, seccomp, signals};
use nix::sys::signal::{kill, sigprocmask, SigSet, SigmaskHow, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, pipe2, read, write, ForkResult, Pid};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};

/// Entry point of `confine __init`. Never returns.
pub fn main() -> ! {
    std::process::exit(run())
}

fn run() -> i32 {
    // If the supervisor dies, this stage dies, and pid 1 after it. Set
    // here, first, because posix_spawn can't set it in the child: had the
    // supervisor died before this line, its end of the control socket is
    // closed and the spec's read below ends at EOF, with nothing built.
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    // Signals for the job wait, blocked, until there is one to pass them
    // to: their default action must never end a stage (`signals`).
    let _ = signals::block_stage_set();
    // Anything the supervisor's caller leaked to us (a shell's fd 5, say)
    // must not reach the job.
    let cloexec = close_range_cloexec(CONTROL_FD as u32);
    // SAFETY: the supervisor placed its end of the control socket at fd 3
    // for us; nothing else in this process owns that fd.
    let mut ctl = unsafe { File::from_raw_fd(CONTROL_FD) };
    if let Err(e) = cloexec {
        report(&ctl, &InitReport::SetupFailed { step: "close inherited fds".into(), error: e.to_string() });
        return 125;
    }
    let spec: InitSpec = match read_spec(&mut ctl) {
        Ok(spec) => spec,
        Err(e) => {
            report(&ctl, &InitReport::SetupFailed { step: "read spec".into(), error: e.to_string() });
            return 125;
        }
    };
    // The proxy's socket follows the spec (`proxy_listen`).
    let proxy = match spec.proxy_port.map(|_| receive_proxy_socket(&ctl)).transpose() {
        Ok(p) => p,
        Err(e) => {
            report(&ctl, &InitReport::SetupFailed { step: "network proxy".into(), error: e.to_string() });
            return 125;
        }
    };
    match outer(&spec, &ctl, proxy) {
        Ok(code) => code,
        Err(e) => {
            report(&ctl, &InitReport::SetupFailed { step: e.step().into(), error: e.to_string() });
            125
        }
    }
}

fn report(ctl: &File, r: &InitReport) {
    // A lost report can't be reported; the supervisor sees the exit code.
    let _ = (&*ctl).write_all(&encode_report(r));
}

/// Mark every fd from `first` on close-on-exec. `CLOSE_RANGE_CLOEXEC` is
/// Linux 5.11; before it (Debian 11's 5.10 refuses the flag) each open fd
/// listed in /proc/self/fd is marked instead. Neither possible: an error,
/// not a job with the caller's fds.
fn close_range_cloexec(first: u32) -> std::io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets flags on our
    // own fds; it takes no pointers.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if ret == 0 {
        return Ok(());
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first as i32)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on an fd number; a closed one (the listing's own
        // directory fd, gone by now) fails with EBADF, which is fine.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EBADF) {
                return Err(err);
            }
        }
    }
    Ok(())
}

/// Step 1, in the host namespaces.
fn outer(spec: &InitSpec, ctl: &File, proxy: Option<OwnedFd>) -> Result<i32, SysError> {
    // A supervisor run under a real-time policy (chrt, a systemd unit's
    // CPUSchedulingPolicy), a negative nice, a protective oom_score_adj or
    // raised rlimits must not hand them to untrusted code: a SCHED_FIFO
    // busy loop starves the host's other work on that CPU.
    inherit::reset()?;
    // v1 hierarchies (`tasks`): "0" moves the writer, and every process we
    // create is then born inside. The v2 one (`cgroup.procs`) is joined by
    // pid 1 at birth instead (clone3 + CLONE_INTO_CGROUP): a write there
    // waits for an RCU grace period.
    let mut v2_dir = None;
    for procs in &spec.cgroup_procs {
        if procs.file_name().is_some_and(|n| n == "cgroup.procs") && v2_dir.is_none() {
            if let Some(dir) = procs.parent() {
                let fd = nix::fcntl::open(
                    dir,
                    nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
                    nix::sys::stat::Mode::empty(),
                )
                .map_err(|e| SysError::path("open cgroup", dir, e))?;
                v2_dir = Some((fd, procs));
                continue;
            }
        }
        std::fs::write(procs, "0").map_err(|e| SysError::io("join cgroup", procs, e))?;
    }
    // Already blocked since the spawn (`stage_process`); kept so here too,
    // for a stage started another way.
    signals::block_stage_set().map_err(|e| SysError::call("block signals", e))?;
    let (go_rd, go_wr) = pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SysError::call("pipe", e))?;
    // Where the mount sources go to pid 1: fds, opened here as host root.
    let (fds_out, fds_in) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::SeqPacket,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| SysError::call("socketpair", e))?;

    let flags = namespaces::clone_flags(spec);
    // The job's user namespace is created by (and so belongs to) a uid of
    // its own, not root: what the job allocates in it is charged there.
    let owner = match spec.userns_owner.filter(|_| !spec.rootless) {
        Some(uid) => Some(namespaces::AsOwner::enter(uid)?),
        None => None,
    };
    // Kernels before 5.7 (or a cgroup fd they refuse): pid 1 is moved in
    // by pid below, before it is released, so it still runs nothing outside
    // and the outer stage stays out (the pids limit counts on that).
    let mut move_in = None;
    let pid = match &v2_dir {
        Some((fd, procs)) => match sys::clone3_into_cgroup(flags, fd) {
            Ok(pid) => pid,
            Err(nix::errno::Errno::ENOSYS | nix::errno::Errno::E2BIG | nix::errno::Errno::EINVAL) => {
                move_in = Some(procs.to_path_buf());
                sys::clone_fork(flags).map_err(|e| SysError::call("clone namespaces", e))?
            }
            Err(e) => return Err(SysError::call("clone3 into the job's cgroup", e)),
        },
        None => sys::clone_fork(flags).map_err(|e| SysError::call("clone namespaces", e))?,
    };
    drop(v2_dir);
    if pid == 0 {
        // The credentials here are the new namespace's: nothing to restore.
        std::mem::forget(owner);
        drop(go_wr);
        drop(fds_out);
        let code = match pid1(spec, ctl, go_rd, fds_in, proxy) {
            Ok(code) => code,
            Err(e) => {
                report(ctl, &InitReport::SetupFailed { step: e.step().into(), error: e.to_string() });
                125
            }
        };
        std::process::exit(code);
    }
    drop(go_rd);
    drop(fds_in);
    drop(proxy);
    let pid1 = Pid::from_raw(pid);
    let left = match owner {
        Some(o) => o.leave(),
        None => Ok(()),
    };
    let joined = left.and_then(|()| match &move_in {
        Some(procs) => std::fs::write(procs, pid.to_string()).map_err(|e| SysError::io("join cgroup", procs, e)),
        None => Ok(()),
    });
    let ready = joined
        .and_then(|()| namespaces::write_id_maps(pid1, spec.uid, spec.gid, spec.rootless))
        .and_then(|()| {
            mounts::open_sources(
                pid,
                &spec.mounts,
                (spec.uid.outside, spec.gid.outside),
                spec.rootless,
                spec.sweep_record.as_ref().map(|(_, r)| r),
                false,
                Vec::new(),
            )
        })
        .and_then(|opened| {
            let mut not_idmapped = opened.not_idmapped;
            not_idmapped.extend(spec.idmap_refused.iter().cloned());
            mounts::send_sources(&fds_out, opened.sources, &not_idmapped).map(|()| opened.idmapped)
        });
    let idmapped = match ready {
        Ok(idmapped) => idmapped,
        Err(e) => {
            let _ = kill(pid1, Signal::SIGKILL);
            let _ = waitpid(pid1, None);
            return Err(e);
        }
    };
    // A warm sandbox: pid 1 builds the base now, and both wait for the
    // request; then its binds are opened and sent as the base's were.
    let whole;
    let (spec, idmapped, built_base) = if spec.warm {
        let request = write(&go_wr, b"1")
            .map_err(|e| SysError::call("release pid 1", e))
            .and_then(|_| warm_request(spec, ctl, pid, &go_wr, &fds_out));
        match request {
            Ok(Some((joined, idmapped))) => {
                whole = joined;
                (&whole, idmapped, true)
            }
            // The supervisor let the sandbox go unused (it closed the
            // control socket): nothing ran, nothing to report.
            Ok(None) => {
                let _ = kill(pid1, Signal::SIGKILL);
                let _ = waitpid(pid1, None);
                return Ok(125);
            }
            Err(e) => {
                let _ = kill(pid1, Signal::SIGKILL);
                let _ = waitpid(pid1, None);
                return Err(e);
            }
        }
    } else {
        (spec, idmapped, false)
    };
    drop(fds_out);
    // pid 1 builds the sandbox while the record of the trees the job may
    // write is made durable (`sweep`: for a sweep after the job even if
    // the supervisor dies); it starts the job only at the second byte.
    let record = spec.sweep_record.as_ref().filter(|_| !idmapped.is_empty());
    let release: &[u8] = match (record.is_some(), built_base) {
        (true, false) => b"1",
        (false, false) => b"12",
        (true, true) => b"",
        (false, true) => b"2",
    };
    if !release.is_empty() {
        write(&go_wr, release).map_err(|e| SysError::call("release pid 1", e))?;
    }
    if let Some((job_id, record)) = record {
        if let Err(e) = super::sweep::write_record(job_id, record, &idmapped) {
            let _ = kill(pid1, Signal::SIGKILL);
            let _ = waitpid(pid1, None);
            return Err(SysError::other("record the sweep", e));
        }
        // pid 1 may have failed already (and said why): its end decides.
        let _ = write(&go_wr, b"2");
    }
    drop(go_wr);
    report(ctl, &InitReport::Started { pid1: pid });
    forward_until_pid1_ends(ctl, pid1)
}

/// The outer stage's last step: pass every signal on to pid 1, keep the
/// watchdog's deadlines once the supervisor arms it (`signals`), and end
/// with pid 1's status.
fn forward_until_pid1_ends(ctl: &File, pid1: Pid) -> Result<i32, SysError> {
    use std::time::Instant;
    let set = signals::stage_set();
    let parent = nix::unistd::getppid().as_raw();
    // (when, signal) of the watchdog's next step.
    let mut steps: Vec<(Instant, Signal)> = Vec::new();
    loop {
        let now = Instant::now();
        while let Some(&(_, sig)) = steps.first().filter(|(at, _)| *at <= now) {
            steps.remove(0);
            if sig == Signal::SIGTERM {
                // Said before the signal: the job's end, which may follow at
                // once, must not be read without it.
                report(ctl, &InitReport::TimedOut);
            }
            let _ = kill(pid1, sig);
        }
        let timeout = steps.first().map(|(at, _)| at.saturating_duration_since(now));
        let Some(got) = signals::wait(&set, timeout).map_err(|e| SysError::call("sigtimedwait", e))? else {
            continue;
        };
        if got.sig != libc::SIGCHLD {
            match signals::Watchdog::from_signal(&got, parent) {
                Some(w) => arm(&mut steps, Instant::now() + w.left(), w.grace),
                None => raw_kill(pid1, got.sig),
            }
            continue;
        }
        match reap(Some(pid1)) {
            Some((_, Ended::Exited(code))) => return Ok(code),
            Some((_, Ended::Signaled(sig))) => return Ok(128 + sig),
            None => {}
        }
    }
}

/// Arm the watchdog for a deadline at `term`, unless one at least as
/// early is armed or has fired. The parent check on the arming signal is
/// only as good as `si_pid`, which a sender of `rt_sigqueueinfo` chooses:
/// the earliest deadline holds, so a forged arm can shorten the job's
/// time (what a signal could do anyway) but never lift the supervisor's.
fn arm(steps: &mut Vec<(std::time::Instant, Signal)>, term: std::time::Instant, grace: std::time::Duration) {
    let armed = steps.iter().find(|(_, s)| *s == Signal::SIGTERM).map(|(at, _)| *at);
    let fired = !steps.is_empty() && armed.is_none();
    if !fired && armed.is_none_or(|at| term < at) {
        *steps = vec![(term, Signal::SIGTERM), (term + grace, Signal::SIGKILL)];
    }
}

/// kill(2) with any signal number, real-time ones included (nix's
/// `Signal` has none of those). An error (the target gone) is ignored.
fn raw_kill(pid: Pid, sig: i32) {
    // SAFETY: kill takes a pid and a signal number, no pointers.
    unsafe { libc::kill(pid.as_raw(), sig) };
}

/// A warm sandbox's request, in the outer stage: read its part from the
/// supervisor, hand it to pid 1 (on the pipe that releases it), then open
/// its binds (as detached copies: pid 1's namespace has its root built
/// over the host's /tmp by now) and send them. None: the supervisor closed
/// the control socket instead. Returns the whole spec and the binds that
/// were idmapped.
fn warm_request(
    base: &InitSpec,
    ctl: &File,
    pid1: libc::pid_t,
    go: &OwnedFd,
    fds_out: &OwnedFd,
) -> Result<Option<(InitSpec, Vec<std::path::PathBuf>)>, SysError> {
    // While pid 1 builds the base: the idmap namespaces the request will
    // likely need, off its path. One that can't be made now is tried
    // again on the path, and says why there.
    let job = (base.uid.outside, base.gid.outside);
    let premade: Vec<mounts::IdmapNamespace> =
        base.idmap_owners.iter().filter_map(|owner| mounts::IdmapNamespace::make(*owner, job).ok()).collect();
    wait_for_request(ctl, pid1)?;
    let part: RequestPart = match read_spec(&mut &*ctl) {
        Ok(part) => part,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(SysError::other("read the request", e)),
    };
    // Maybe built at a lower priority; the job runs at the request's. Not
    // below 0, whatever the part says. Only what differs is changed: a
    // server without CAP_SYS_NICE builds at its own nice value, and could
    // not lower it again.
    let nice = part.nice.max(0);
    // pid 1, this stage, and the job pid 1 cloned while it built (its
    // only child by now, if it is done cloning; pid 1 checks, and clones
    // another if it was missed).
    let children = std::fs::read_to_string(format!("/proc/{pid1}/task/{pid1}/children")).unwrap_or_default();
    let job = children.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok());
    for who in [pid1, 0].into_iter().chain(job) {
        nix::errno::Errno::clear();
        // SAFETY: getpriority takes integers; -1 is a valid value, told
        // apart from an error by errno, cleared above.
        let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, who as libc::id_t) };
        if now == nice && nix::errno::Errno::last_raw() == 0 {
            continue;
        }
        // SAFETY: setpriority takes integers and no pointers.
        let ret = unsafe { libc::setpriority(libc::PRIO_PROCESS, who as libc::id_t, nice) };
        nix::errno::Errno::result(ret).map_err(|e| SysError::call("set the job's nice value", e))?;
    }
    let request_ops = part.mounts.clone();
    // The caller's streams, when the job is to have them: received before
    // pid 1 is given the part, so that it never waits for streams that
    // can't come.
    let streams = if part.streams { Some(receive_streams(ctl, "receive the job's streams")?) } else { None };
    let mut pipe = File::from(go.try_clone().map_err(|e| SysError::other("hand the request to pid 1", e))?);
    write_spec(&mut pipe, &part).map_err(|e| SysError::other("hand the request to pid 1", e))?;
    drop(pipe);
    let mut whole = base.clone();
    whole.join(part);
    let opened = mounts::open_sources(
        pid1,
        &request_ops,
        (whole.uid.outside, whole.gid.outside),
        whole.rootless,
        whole.sweep_record.as_ref().map(|(_, r)| r),
        true,
        premade,
    )?;
    let mut not_idmapped = opened.not_idmapped;
    not_idmapped.extend(whole.idmap_refused.iter().cloned());
    mounts::send_sources(fds_out, opened.sources, &not_idmapped)?;
    if let Some(streams) = streams {
        send_streams(fds_out, &streams)?;
    }
    Ok(Some((whole, opened.idmapped)))
}

/// Wait until the request is there on the control socket, or pid 1 is
/// gone: a warm sandbox whose pid 1 died (its base failed to build, the
/// OOM killer) ends here, so that its supervisor sees its stage exit and
/// never hands it a request.
fn wait_for_request(ctl: &File, pid1: libc::pid_t) -> Result<(), SysError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    // Before pidfds (Linux 5.3): the read alone, as a cold stage waits.
    let Ok(pidfd) = sys::pidfd_open(pid1) else { return Ok(()) };
    loop {
        let mut fds = [PollFd::new(ctl.as_fd(), PollFlags::POLLIN), PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(SysError::call("wait for the request", e)),
            Ok(_) => {}
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[0]) {
            return Ok(());
        }
        if ready(&fds[1]) {
            return Err(SysError::other("wait for the request", "pid 1 of the warm sandbox died before its request"));
        }
    }
}

/// Step 2, pid 1 of the new pid namespace.
fn pid1(spec: &InitSpec, ctl: &File, go: OwnedFd, fds_in: OwnedFd, proxy: Option<OwnedFd>) -> Result<i32, SysError> {
    // If the outer stage dies, so do we, and with us the whole namespace.
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    let mut byte = [0u8; 1];
    if read(go.as_fd(), &mut byte).map_err(|e| SysError::call("wait for id maps", e))? != 1 {
        return Ok(125); // the outer stage failed and has reported why
    }
    // SAFETY: PR_SET_NAME reads a NUL-terminated name of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"confine-init".as_ptr(), 0, 0, 0) };

    // Opened by the outer stage, as host root (root-owned trees such as
    // /root/.rustup included), in our mount namespace.
    let (sources, not_idmapped) = mounts::receive_sources(&fds_in, &spec.mounts)?;
    namespaces::become_mapped(spec.uid, spec.gid, spec.rootless)?;
    // Changing credentials clears the parent-death signal: arm it again.
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    nix::unistd::sethostname(&spec.hostname).map_err(|e| SysError::call("sethostname", e))?;
    if spec.new_netns {
        sys::loopback_up()?;
    }
    // The listeners go to the supervisor now; its answer is awaited just
    // before the job starts, so that it starts serving while we build.
    if let (Some(port), Some(sock)) = (spec.proxy_port, &proxy) {
        proxy_listen(sock, port)?;
    }
    let mut built = mounts::build(&spec.mounts, &sources)?;
    drop(sources);
    // A warm sandbox clones its job's namespace now, while nothing waits
    // for it (`namespaces::clone_nested`): the job caps its counters and
    // maps its ids before the request, which reaches it when it comes.
    let mut early = if spec.warm {
        let cloned = match namespaces::clone_nested() {
            Ok(Nested::Job(end)) => {
                drop(go);
                drop(fds_in);
                drop(proxy);
                warm_nested_job(ctl, end, spec.uid, spec.gid)
            }
            Ok(Nested::Pid1(end)) => Ok(end),
            Err(e) => Err(e),
        };
        match settle(spec, cloned)? {
            Settled::Ready(end) => Some(end),
            Settled::Unlocked => None,
            Settled::Ended => return Ok(125),
        }
    } else {
        None
    };
    // The streams of a warm job cloned early, sent to it with its request.
    let mut streams_for_job = None;
    // A warm sandbox waits here, built but for its request's binds, and
    // before the pivot: its request comes on the pipe (the outer stage
    // read it), its binds on the socket.
    let whole;
    let (spec, not_idmapped) = if spec.warm {
        let mut pipe = File::from(go.try_clone().map_err(|e| SysError::other("wait for the request", e))?);
        let part: RequestPart = match read_spec(&mut pipe) {
            Ok(part) => part,
            // The outer stage failed, or was let go unused.
            Err(_) => return Ok(125),
        };
        // The early job must be alive and at the request's nice value,
        // which the outer stage gave us before the part: else it is
        // dropped, and a job is cloned for the request as for a cold
        // sandbox (below). A failure there is the request's to report.
        if early.as_ref().is_some_and(|end| crate::crashpoint::refused("early-job") || !end.fits()) {
            if let Some(end) = early.take() {
                end.abandon();
            }
        }
        let request_ops = part.mounts.clone();
        let streams = part.streams;
        let mut joined = spec.clone();
        joined.join(part);
        whole = joined;
        let (sources, not_idmapped) = mounts::receive_sources(&fds_in, &request_ops)?;
        if streams {
            // The job's stdin, stdout and stderr: sent to a job cloned
            // early, or inherited at its fork.
            let fds = receive_streams(&fds_in, "take the job's streams")?;
            if early.is_some() {
                streams_for_job = Some(fds);
            } else {
                take_streams(fds)?;
            }
        }
        let more = mounts::build_request(&request_ops, &sources)?;
        built.protected.extend(more.protected);
        built.idmapped.extend(more.idmapped);
        (&whole, not_idmapped)
    } else {
        (spec, not_idmapped)
    };
    drop(fds_in);
    // While we still hold CAP_SYS_RESOURCE in the job's user namespace,
    // after the mounts (a detached mount tree is a mount namespace) and
    // before the pivot (the job's /proc/sys is read-only): what the job
    // allocates in its namespaces is charged to their creator. After the
    // job's clone, whose namespace a `max_user_namespaces` of 0 would
    // refuse.
    let start = match early {
        Some(end) => {
            inherit::limit_ucounts()?;
            Start::Request(end)
        }
        None => {
            // The job process, in a user namespace of its own nested in
            // this one, which locks the sandbox's mounts; made while the
            // host's /proc is still reachable for its counters, which it
            // caps while we cap ours.
            let cloned = match namespaces::clone_nested() {
                Ok(Nested::Job(end)) => {
                    drop(go);
                    drop(proxy);
                    nested_job(spec, ctl, end, built, not_idmapped)
                }
                Ok(Nested::Pid1(end)) => Ok(end),
                Err(e) => Err(e),
            };
            inherit::limit_ucounts()?;
            match settle(spec, cloned)? {
                Settled::Ready(end) => Start::Go(end),
                Settled::Unlocked => Start::Fork,
                Settled::Ended => return Ok(125),
            }
        }
    };
    mounts::enter()?;
    // The job's /tmp, measured when the job ends (`mounts::tmp_out`):
    // opened now, before anything of the job runs there.
    let tmp = nix::fcntl::open(
        "/tmp",
        nix::fcntl::OFlag::O_PATH
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok();
    write_files(&spec.files)?;
    sys::set_not_dumpable()?;
    // The outer stage's second byte: what the job may write is recorded
    // for its sweep (`sweep`). Nothing of the job runs before it.
    if read(go.as_fd(), &mut byte).map_err(|e| SysError::call("wait for the sweep record", e))? != 1 {
        return Ok(125); // the outer stage failed and has reported why
    }
    drop(go);
    if let Some(sock) = proxy {
        proxy_ready(&sock)?;
    }

    let job = match start {
        Start::Request(end) => {
            let part = JobPart {
                spec: spec.clone(),
                protected: built.protected,
                idmapped: built.idmapped,
                not_idmapped,
                streams: streams_for_job.is_some(),
            };
            send_request(&end, &part, streams_for_job.as_ref())?;
            // The job holds its streams now; pid 1 keeps no copy.
            drop(streams_for_job.take());
            end.pid()
        }
        Start::Go(end) => end.release()?,
        // SAFETY: this process is single-threaded (it was cloned from the
        // single-threaded outer stage), so the child may run ordinary Rust code.
        Start::Fork => match unsafe { fork() }.map_err(|e| SysError::call("fork job", e))? {
            ForkResult::Child => job(spec, ctl, built, not_idmapped, false),
            ForkResult::Parent { child } => child,
        },
    };
    // pid 1 keeps no privilege it does not need to reap and forward.
    caps::drop_all()?;
    let set = signals::stage_set();
    loop {
        let got = signals::wait(&set, None).map_err(|e| SysError::call("sigtimedwait", e))?;
        let Some(signals::Received { sig, .. }) = got else { continue };
        if sig != libc::SIGCHLD {
            forward_to_job(job, sig);
            continue;
        }
        // Reap every zombie; the job's own end decides ours.
        while let Some((pid, ended)) = reap(None) {
            if pid != job {
                continue;
            }
            return Ok(match ended {
                Ended::Exited(code) => {
                    let tmp_out = tmp.as_ref().and_then(mounts::tmp_out);
                    report(ctl, &InitReport::Exited { code: Some(code), signal: None, tmp_out });
                    code
                }
                Ended::Signaled(sig) => {
                    let tmp_out = tmp.as_ref().and_then(mounts::tmp_out);
                    report(ctl, &InitReport::Exited { code: None, signal: Some(sig), tmp_out });
                    128 + sig
                }
            });
        }
    }
}

/// How a reaped child ended.
enum Ended {
    Exited(i32),
    Signaled(i32),
}

/// Reap one ended child (`pid`, or any), without waiting. None: none has
/// ended. waitpid(2) itself, not nix's: nix fails on a real-time signal's
/// status (its `Signal` has none), and a child so ended would be reaped
/// and its end lost.
fn reap(pid: Option<Pid>) -> Option<(Pid, Ended)> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes the status we own; WNOHANG never blocks.
        let got = unsafe { libc::waitpid(pid.map_or(-1, Pid::as_raw), &mut status, libc::WNOHANG) };
        if got <= 0 {
            return None;
        }
        let ended = if libc::WIFEXITED(status) {
            Ended::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Ended::Signaled(libc::WTERMSIG(status))
        } else {
            continue;
        };
        return Some((Pid::from_raw(got), ended));
    }
}

/// Pass `sig` on to the job. Ctrl-Z (SIGTSTP) stops the job's process
/// group with SIGSTOP: the job's group has no terminal and its parent is
/// in another session, so the kernel would discard a SIGTSTP that is not
/// caught; SIGCONT continues the same group. Any other signal goes to the
/// job's main process, as a shell's `kill` would send it.
fn forward_to_job(job: Pid, sig: i32) {
    let group = Pid::from_raw(-job.as_raw());
    match sig {
        libc::SIGTSTP => raw_kill(group, libc::SIGSTOP),
        libc::SIGCONT => raw_kill(group, libc::SIGCONT),
        _ => raw_kill(job, sig),
    }
}

/// The socket to the supervisor's proxy: one byte ([`PROXY_SOCKET`])
/// after the spec, carrying it.
fn receive_proxy_socket(ctl: &File) -> Result<OwnedFd, SysError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::AsRawFd;
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(ctl.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(|e| SysError::call("receive the proxy's socket", e))?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(|e| SysError::call("receive the proxy's socket", e))? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: SCM_RIGHTS gave us these fds; nothing else owns them.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    match (msg.bytes, byte[0], fds.len()) {
        (1, PROXY_SOCKET, 1) => Ok(fds.remove(0)),
        _ => Err(SysError::other("network proxy", "the supervisor sent no socket for the proxy")),
    }
}

/// A job's three standard streams: one byte ([`STREAMS`]) carrying
/// exactly three fds, on the supervisor's control socket or, in pid 1,
/// on the outer stage's socket.
fn receive_streams(sock: &impl std::os::fd::AsRawFd, what: &'static str) -> Result<[OwnedFd; 3], SysError> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 3]);
    let msg = loop {
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(|e| SysError::call(what, e))?,
        }
    };
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs().map_err(|e| SysError::call(what, e))? {
        if let ControlMessageOwned::ScmRights(raw) = cmsg {
            // SAFETY: SCM_RIGHTS gave us these fds; nothing else owns them.
            fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    match (msg.bytes, byte[0], <[OwnedFd; 3]>::try_from(fds), truncated) {
        (1, STREAMS, Ok(fds), false) => Ok(fds),
        _ => Err(SysError::other(what, "not the three streams of a job")),
    }
}

/// Hand pid 1 the job's streams ([`receive_streams`]).
fn send_streams(sock: &OwnedFd, fds: &[OwnedFd; 3]) -> Result<(), SysError> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::os::fd::AsRawFd;
    let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(&[STREAMS])];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::empty(), None)
        .map_err(|e| SysError::call("hand the job's streams to pid 1", e))?;
    Ok(())
}

/// Listen on `port` of the loopback, IPv4 and (where the kernel has it)
/// IPv6, and hand both listeners to the supervisor's proxy. No process of
/// the job exists yet: nothing else in this namespace can hold the port.
fn proxy_listen(sock: &OwnedFd, port: u16) -> Result<(), SysError> {
    use nix::sys::socket::{
        bind, listen, sendmsg, setsockopt, socket, sockopt, AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag,
        SockType, SockaddrIn, SockaddrIn6,
    };
    use std::os::fd::AsRawFd;
    let backlog = Backlog::new(1024).unwrap_or(Backlog::MAXCONN);
    let v4 = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| SysError::call("proxy: socket", e))?;
    bind(v4.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port))
        .map_err(|e| SysError::call("proxy: bind 127.0.0.1", e))?;
    listen(&v4, backlog).map_err(|e| SysError::call("proxy: listen", e))?;
    let mut listeners = vec![v4];
    // Without IPv6 (disabled, or no ::1 on lo) the IPv4 listener serves alone.
    if let Ok(v6) = socket(AddressFamily::Inet6, SockType::Stream, SockFlag::SOCK_CLOEXEC, None) {
        let loopback = SockaddrIn6::from(std::net::SocketAddrV6::new(std::net::Ipv6Addr::LOCALHOST, port, 0, 0));
        let bound = setsockopt(&v6, sockopt::Ipv6V6Only, &true)
            .and_then(|()| bind(v6.as_raw_fd(), &loopback))
            .and_then(|()| listen(&v6, backlog));
        if bound.is_ok() {
            listeners.push(v6);
        }
    }
    let raw: Vec<i32> = listeners.iter().map(|l| l.as_raw_fd()).collect();
    let iov = [std::io::IoSlice::new(b"L")];
    sendmsg::<()>(sock.as_raw_fd(), &iov, &[ControlMessage::ScmRights(&raw)], MsgFlags::empty(), None)
        .map_err(|e| SysError::call("proxy: hand the listeners to the supervisor", e))?;
    Ok(())
}

/// The supervisor's answer: it serves the listeners, or why it can't.
/// The job never runs with a proxy that is not there.
fn proxy_ready(sock: &OwnedFd) -> Result<(), SysError> {
    let mut buf = [0u8; 512];
    let n = loop {
        match read(sock.as_fd(), &mut buf) {
            Err(nix::errno::Errno::EINTR) => continue,
            r => break r.map_err(|e| SysError::call("network proxy", e))?,
        }
    };
    if &buf[..n] == PROXY_READY {
        return Ok(());
    }
    let why = match n {
        0 => "the supervisor's proxy did not start (it closed its socket)".to_string(),
        _ => format!("the supervisor's proxy did not start: {}", String::from_utf8_lossy(&buf[..n])),
    };
    Err(SysError::other("network proxy", why))
}

/// Write the job's files (code mode's source) into its private /tmp, as
/// the job's own uid, refusing any path that leaves /tmp.
fn write_files(files: &[crate::job::JobFile]) -> Result<(), SysError> {
    use std::path::{Component, Path};
    for f in files {
        let inside_tmp = f.path.starts_with("/tmp/")
            && f.path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if !inside_tmp {
            return Err(SysError::path("job file outside /tmp", &f.path, nix::errno::Errno::EPERM));
        }
        if let Some(parent) = f.path.parent().filter(|p| *p != Path::new("/tmp")) {
            std::fs::create_dir_all(parent).map_err(|e| SysError::io("create job file dir", parent, e))?;
        }
        std::fs::write(&f.path, &f.contents).map_err(|e| SysError::io("write job file", &f.path, e))?;
    }
    Ok(())
}

/// What a warm sandbox's job, cloned before its request
/// (`warm_nested_job`), gets when the request comes.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct JobPart {
    spec: InitSpec,
    protected: Vec<String>,
    idmapped: Vec<String>,
    not_idmapped: Vec<String>,
    /// The job's three streams follow ([`STREAMS`]).
    streams: bool,
}

/// Make `fds` this process's stdin, stdout and stderr.
fn take_streams(fds: [OwnedFd; 3]) -> Result<(), SysError> {
    for (fd, target) in fds.into_iter().zip(0..) {
        use std::os::fd::{AsRawFd, IntoRawFd};
        let raw = fd.as_raw_fd();
        // SAFETY: dup2 and fcntl take integers; `raw` is open (owned
        // here) and 0–2 are ours to replace. A received fd already at its
        // target only loses close-on-exec, and is kept open.
        let ret = unsafe {
            if raw == target {
                libc::fcntl(fd.into_raw_fd(), libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, target)
            }
        };
        nix::errno::Errno::result(ret).map_err(|e| SysError::call("take the job's streams", e))?;
    }
    Ok(())
}

/// Hand a warm sandbox's early job its request: [`REQUEST`], the part,
/// then its streams. EPIPE: the job failed after it was ready and has
/// reported why; it is reaped as any job.
fn send_request(end: &NestedPid1, part: &JobPart, streams: Option<&[OwnedFd; 3]>) -> Result<(), SysError> {
    let step = "hand the job its request";
    let mut sock = File::from(end.channel().try_clone().map_err(|e| SysError::other(step, e))?);
    let written = sock.write_all(&[namespaces::REQUEST]).and_then(|()| write_spec(&mut sock, part));
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(SysError::other(step, e)),
    }
    match streams.map_or(Ok(()), |fds| send_streams(end.channel(), fds)) {
        Ok(()) | Err(SysError::Call { source: nix::errno::Errno::EPIPE, .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Step 3 of a warm sandbox, in its own user namespace, cloned while the
/// base was built: its counters and ids now, then its request (the whole
/// spec, what the mounts did, its streams) when it comes, its mount
/// namespace, and the rest of the job.
fn warm_nested_job(ctl: &File, end: NestedJob, uid: IdMap, gid: IdMap) -> ! {
    // A failure before the request is not reported: pid 1 sees this job
    // gone when the request comes, and clones one for it then.
    if !sys::set_not_dumpable().and_then(|()| end.prepare(uid, gid)).unwrap_or(false) {
        std::process::exit(125)
    }
    let request = (|| -> Result<Option<JobPart>, SysError> {
        if end.wait()? != Some(namespaces::REQUEST) {
            return Ok(None);
        }
        let mut sock = File::from(end.channel().try_clone().map_err(|e| SysError::other("take the job's request", e))?);
        let part: JobPart = read_spec(&mut sock).map_err(|e| SysError::other("take the job's request", e))?;
        if part.streams {
            take_streams(receive_streams(end.channel(), "take the job's streams")?)?;
        }
        end.lock()?;
        Ok(Some(part))
    })();
    match request {
        Ok(Some(part)) => {
            let built = mounts::Built { protected: part.protected, idmapped: part.idmapped };
            job(&part.spec, ctl, built, part.not_idmapped, true)
        }
        // Refused (pid 1 knows), or let go unused.
        Ok(None) => std::process::exit(125),
        Err(e) => setup_failed(ctl, e),
    }
}

/// How pid 1 starts the job once the sandbox is ready.
enum Start {
    /// A warm sandbox's job, cloned while the base built: it is sent its
    /// request.
    Request(NestedPid1),
    /// A job cloned with all it needs: it is let go.
    Go(NestedPid1),
    /// A degraded run without a user namespace of the job's own: forked.
    Fork,
}

/// What became of a job cloned into a user namespace of its own.
enum Settled {
    /// It capped its counters and waits for pid 1's go.
    Ready(NestedPid1),
    /// It could not be made, or was refused its capabilities, and this is
    /// a degraded run: the job is forked without the lock.
    Unlocked,
    /// It failed, and has reported why.
    Ended,
}

/// Wait for a job [`namespaces::clone_nested`] made, or decide what its
/// refusal means ([`unlocked`]).
fn settle(spec: &InitSpec, cloned: Result<NestedPid1, NotNested>) -> Result<Settled, SysError> {
    match cloned {
        Ok(end) => match end.ready()? {
            Readiness::Ready => Ok(Settled::Ready(end)),
            Readiness::Ended => Ok(Settled::Ended),
            Readiness::Refused => {
                unlocked(spec, "the job was refused capabilities in a user namespace of its own (an LSM)")
                    .map(|()| Settled::Unlocked)
            }
        },
        Err(NotNested::Refused(why)) => {
            unlocked(spec, &format!("the kernel refused {why}")).map(|()| Settled::Unlocked)
        }
        Err(NotNested::Failed(e)) => Err(e),
    }
}

/// A job that can't be given a user namespace of its own: an error, or
/// with `--allow-degraded` a job whose outcome names the lock as missing.
fn unlocked(spec: &InitSpec, why: &str) -> Result<(), SysError> {
    if spec.allow_degraded {
        return Ok(());
    }
    Err(SysError::other(
        "lock the sandbox's mounts",
        format!(
            "{why}. Without it the job would run where the sandbox's mounts are not locked. An LSM may refuse \
             nested user namespaces (on Ubuntu, kernel.apparmor_restrict_unprivileged_userns); run with \
             --allow-degraded to run the job without the lock, which its outcome then names as missing"
        ),
    ))
}

/// Step 3 in its own user namespace ([`namespaces::clone_nested`]): its
/// counters, pid 1's go, its mount namespace, then the rest of the job.
fn nested_job(spec: &InitSpec, ctl: &File, end: NestedJob, built: mounts::Built, not_idmapped: Vec<String>) -> ! {
    // As a job forked after pid 1 made itself undumpable would be, until
    // its execve: nothing in the sandbox may ptrace or read it before.
    match sys::set_not_dumpable().and_then(|()| end.enter(spec.uid, spec.gid)) {
        Ok(true) => job(spec, ctl, built, not_idmapped, true),
        // pid 1 let the job go unstarted, or runs it unlocked instead.
        Ok(false) => std::process::exit(125),
        Err(e) => setup_failed(ctl, e),
    }
}

/// A job process whose setup failed: say why, and end.
fn setup_failed(ctl: &File, e: SysError) -> ! {
    report(ctl, &InitReport::SetupFailed { step: e.step().into(), error: e.to_string() });
    std::process::exit(125)
}

/// Step 3, the job process. Never returns.
fn job(spec: &InitSpec, ctl: &File, built: mounts::Built, not_idmapped: Vec<String>, mounts_locked: bool) -> ! {
    match confine_self(spec, built, not_idmapped, mounts_locked) {
        Ok(confined) => {
            report(ctl, &confined);
            if spec.hold && !released(ctl) {
                // The supervisor gave up on this job (and is killing it).
                std::process::exit(125)
            }
            // Signals blocked for the init loops are not blocked for the job,
            // and none is ignored: Rust ignores SIGPIPE in this stage, and a
            // supervisor started under `nohup` ignores SIGHUP; a job must
            // start as a shell would start it.
            default_signal_dispositions();
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
            let errno = exec::execvpe(&spec.argv, &spec.env);
            report(
                ctl,
                &InitReport::ExecFailed {
                    errno: errno as i32,
                    command: spec.argv.first().cloned().unwrap_or_default(),
                },
            );
            std::process::exit(exec::exit_code_for(errno as i32))
        }
        Err(e) => setup_failed(ctl, e),
    }
}

/// Every signal libc lets us set back to its default action, real-time
/// ones included. SIGKILL and SIGSTOP cannot be changed, and glibc keeps
/// 32 and 33 for itself (it refuses them with EINVAL, and installs its own
/// handlers there when a program needs them).
fn default_signal_dispositions() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: SIG_DFL installs no handler, so no code of ours can run
        // in a signal context; this process is single-threaded. An invalid
        // or reserved number only makes the call fail, which is ignored.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}

/// Wait for the supervisor's go: one [`RELEASE`] byte on the control
/// socket. Anything else, or EOF, means no.
fn released(ctl: &File) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match read(ctl.as_fd(), &mut byte) {
            Ok(1) => return byte[0] == RELEASE,
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return false,
        }
    }
}

/// The job's own confinement, in the order docs/design.md gives: seccomp last,
/// since it may forbid what the earlier steps need.
fn confine_self(
    spec: &InitSpec,
    built: mounts::Built,
    not_idmapped: Vec<String>,
    mounts_locked: bool,
) -> Result<InitReport, SysError> {
    let mut missing = Vec::new();
    if !mounts_locked {
        missing.push("mount lock".to_string());
    }
    // A session of its own: no controlling terminal, so no TIOCSPGRP or
    // TIOCSTI on its caller's (even where legacy_tiocsti allows the
    // latter), and no job-control signals from it.
    nix::unistd::setsid().map_err(|e| SysError::call("setsid", e))?;
    if spec.tty {
        // The pty the supervisor allocated and relays, at fd 0.
        // SAFETY: TIOCSCTTY takes an integer argument and no pointers.
        let ret = unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) };
        nix::errno::Errno::result(ret).map_err(|e| SysError::call("make the pty the controlling terminal", e))?;
    }
    rlimits::apply(&spec.rlimits)?;
    caps::drop_all()?;
    // As the job will be, before anything of it runs.
    usable_binds(spec, &not_idmapped)?;
    nix::unistd::chdir(spec.cwd.as_path()).map_err(|e| SysError::path("chdir", &spec.cwd, e))?;
    sys::set_no_new_privs()?;
    let landlock = match &spec.landlock {
        Some(plan) => landlock::apply(plan, spec.allow_degraded)?,
        None => crate::job::LandlockLayer { abi: 0, status: "off".into(), skipped: vec![] },
    };
    if spec.landlock.is_some() && landlock.status == "none" {
        missing.push("landlock".to_string());
    }
    if spec.seccomp.is_some() {
        seccomp::load_from_fd(SECCOMP_FD)?;
    }
    Ok(InitReport::Confined {
        landlock,
        seccomp: spec.seccomp.clone(),
        missing,
        mounts_locked,
        protected: built.protected,
        idmapped: built.idmapped,
        not_idmapped,
    })
}

/// Refuse to start a job that can't use what it was given: a workspace
/// or bind it can't read, or a read-write one it can't write (a
/// root-owned 0700 checkout where no idmapped mount could be made). One
/// line says who owns it, who the job is, and what to do, rather than a
/// job that fails on its first write. Checked with the job's own
/// credentials (no capability left), so ACLs count as they will.
fn usable_binds(spec: &InitSpec, not_idmapped: &[String]) -> Result<(), SysError> {
    use nix::unistd::AccessFlags;
    for op in &spec.mounts {
        let MountOp::Bind { src, dst, rw, dev: false, exact: true, idmap, .. } = op else { continue };
        let mut want = if *rw { AccessFlags::W_OK } else { AccessFlags::R_OK };
        if dst.is_dir() {
            want |= AccessFlags::X_OK;
        }
        match nix::unistd::faccessat(nix::fcntl::AT_FDCWD, dst.as_path(), want, nix::fcntl::AtFlags::AT_EACCESS) {
            Err(nix::errno::Errno::EACCES) => {}
            _ => continue,
        }
        let job = spec.uid.outside;
        let refusal = not_idmapped.iter().find_map(|l| l.strip_prefix(&format!("{}: ", dst.display())));
        let owner = match (idmap, refusal) {
            (Some((0, _)), _) => "root (uid 0)".into(),
            (Some((uid, _)), _) => format!("uid {uid}"),
            // Refused before the stage ran: the owner is in the refusal.
            (None, Some(_)) => "another user".into(),
            (None, None) if spec.rootless => "another user".into(),
            (None, None) => "the job's own uid".into(),
        };
        let why = refusal.map(|w| format!(" No idmapped mount could show it as the job's ({w}).")).unwrap_or_default();
        let (can, fix) = match (rw, spec.rootless) {
            (true, false) => ("write", format!("make it writable for uid {job} (chown or chmod), or drop --rw")),
            (true, true) => ("write", format!("make it writable for uid {job}, or run confine as root")),
            (false, false) => ("read", format!("make it readable for uid {job} (chmod o+rX)")),
            (false, true) => ("read", format!("make it readable for uid {job}, or run confine as root")),
        };
        return Err(SysError::other(
            "workspace",
            format!(
                "the job (uid {job} on the host) can't {can} {} (its {}): it belongs to {owner}.{why} Fix: {fix}",
                src.display(),
                dst.display()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_earliest_deadline_holds_and_a_fired_one_is_not_rearmed() {
        let grace = Duration::from_millis(500);
        let now = Instant::now();
        let mut steps = Vec::new();
        arm(&mut steps, now + Duration::from_secs(10), grace);
        assert_eq!(steps[0], (now + Duration::from_secs(10), Signal::SIGTERM));
        // A later deadline (a forged arm) does not lift it…
        arm(&mut steps, now + Duration::from_secs(3600), grace);
        assert_eq!(steps[0].0, now + Duration::from_secs(10));
        // …an earlier one shortens it.
        arm(&mut steps, now + Duration::from_secs(1), grace);
        assert_eq!(
            steps,
            [(now + Duration::from_secs(1), Signal::SIGTERM), (now + Duration::from_secs(1) + grace, Signal::SIGKILL)]
        );
        // TERM sent, KILL pending: nothing re-arms it.
        steps.remove(0);
        arm(&mut steps, now + Duration::from_secs(3600), grace);
        assert_eq!(steps, [(now + Duration::from_secs(1) + grace, Signal::SIGKILL)]);
    }
}
