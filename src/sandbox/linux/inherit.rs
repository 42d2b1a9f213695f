//! What a job would inherit from its supervisor and must not, reset in the
//! outer init stage (host root, before the namespaces are cloned, so pid 1
//! and the job inherit the reset values), and the limits of the kernel
//! counters that a job's namespaces charge to their creator, set in pid 1.
//!
//! A supervisor may run with favours an operator gave it: a real-time
//! scheduling policy, a negative nice, a real-time I/O class, an
//! `oom_score_adj` that shields it, raised rlimits, a low timer slack. None
//! of that may pass to untrusted code, which would then starve the host or
//! outlive the supervisor under memory pressure. What an operator uses to
//! make jobs *less* favoured (a positive nice, the idle I/O class, CPU
//! affinity) is kept. docs/design.md lists each attribute and why.
//!
//! The counters: root clones the job's user namespace, so the kernel
//! charges what the job allocates there (inotify instances and watches,
//! namespaces, queued signals, POSIX message queue bytes) to root's own
//! per-user counts as well. A job that took all 128 inotify instances left
//! root's `inotify_init1` failing with EMFILE on the host. Each counter
//! is capped inside the job's namespace (`/proc/sys/user/max_*`, and the
//! rlimits behind the others), so no job can take more than a small share.

use super::sys::SysError;
use nix::errno::Errno;

/// `oom_score_adj` of every job: the first process the OOM killer picks,
/// ahead of the supervisor and the host's services.
pub const OOM_SCORE_ADJ: i32 = 1000;

/// The kernel's default timer slack (50 µs).
const TIMER_SLACK_NS: libc::c_ulong = 50_000;

/// Per-user-namespace limits written in the job's namespace. What the job
/// allocates there is charged to the namespace's dedicated owner uid
/// (`namespaces::AsOwner`), never to root or another job: these caps bound
/// one job's own use. No user namespace (seccomp refuses their creation
/// too; each layer holds alone): without one, a job can create no other
/// namespace either, for want of CAP_SYS_ADMIN in any of its own. inotify:
/// what watchers in build tools need, and no more.
pub const UCOUNT_LIMITS: &[(&str, u64)] =
    &[("max_user_namespaces", 0), ("max_inotify_instances", 16), ("max_inotify_watches", 16384)];

/// rlimits every job gets (hard = soft), or less if the supervisor's hard
/// limit is lower already. RTPRIO and NICE 0: no real-time policy and no nice below
/// 0, even for code that asks. CORE 0: no core file in the workspace, and
/// no dump of the job's memory handed to the host's core handler.
/// SIGPENDING and MSGQUEUE are counted per user and charged up to the
/// namespace's creator: a job may hold a small share of root's.
pub const RLIMITS: &[(libc::__rlimit_resource_t, u64)] = &[
    (libc::RLIMIT_RTPRIO, 0),
    (libc::RLIMIT_RTTIME, 0),
    (libc::RLIMIT_NICE, 0),
    (libc::RLIMIT_CORE, 0),
    (libc::RLIMIT_SIGPENDING, 4096),
    (libc::RLIMIT_MSGQUEUE, 64 * 1024),
];

/// Reset the calling process (the outer init stage, as host root) to a
/// job's starting attributes. Its children inherit them.
pub fn reset() -> Result<(), SysError> {
    reset_realtime_scheduling()?;
    reset_nice()?;
    reset_io_priority()?;
    write_own("oom_score_adj", &OOM_SCORE_ADJ.to_string())?;
    // SAFETY: PR_SET_TIMERSLACK takes an integer and no pointers.
    let ret = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, TIMER_SLACK_NS, 0, 0, 0) };
    Errno::result(ret).map_err(|e| SysError::call("reset timer slack", e))?;
    // setarch -R and the like: ASLR and the other personality flags are
    // the kernel's defaults again. (The job's seccomp filter refuses the
    // values that weaken them; an inherited one would bypass it.)
    // SAFETY: personality takes an integer and no pointers.
    let ret = unsafe { libc::personality(0) };
    Errno::result(ret).map_err(|e| SysError::call("reset personality", e))?;
    // A umask of 0 would leave the job's files in the workspace writable
    // by everyone on the host.
    // SAFETY: umask only sets this process's mask.
    unsafe { libc::umask(0o022) };
    // Features an operator may have given the supervisor that a child
    // keeps: KSM page merging (a side channel between jobs) and the I/O
    // flusher's memory reserves. Kernels without them refuse with EINVAL;
    // the flusher can only be read with CAP_SYS_RESOURCE, and a supervisor
    // without it (EPERM) can't have been made one by itself either.
    // SAFETY: prctl with integer arguments only.
    let ret = unsafe { libc::prctl(PR_SET_MEMORY_MERGE, 0, 0, 0, 0) };
    match Errno::result(ret) {
        Ok(_) | Err(Errno::EINVAL) => {}
        Err(e) => return Err(SysError::call("turn memory merging off", e)),
    }
    // SAFETY: prctl with integer arguments only.
    let flusher = unsafe { libc::prctl(PR_GET_IO_FLUSHER, 0, 0, 0, 0) };
    if flusher > 0 {
        // SAFETY: prctl with integer arguments only.
        let ret = unsafe { libc::prctl(PR_SET_IO_FLUSHER, 0, 0, 0, 0) };
        Errno::result(ret).map_err(|e| SysError::call("stop being an I/O flusher", e))?;
    }
    lower_rlimits()
}

/// `PR_SET_MEMORY_MERGE` (Linux 6.4; not in every libc crate version).
const PR_SET_MEMORY_MERGE: libc::c_int = 67;
/// `PR_SET_IO_FLUSHER` and `PR_GET_IO_FLUSHER` (Linux 5.6).
const PR_SET_IO_FLUSHER: libc::c_int = 57;
const PR_GET_IO_FLUSHER: libc::c_int = 58;

/// Switch to SCHED_OTHER if the process runs under a real-time or
/// deadline policy; children inherit the policy, the job included.
/// SCHED_BATCH and SCHED_IDLE favour the host and are kept.
fn reset_realtime_scheduling() -> Result<(), SysError> {
    // SAFETY: sched_getscheduler takes a pid and no pointers.
    let policy = unsafe { libc::sched_getscheduler(0) } & !libc::SCHED_RESET_ON_FORK;
    if !matches!(policy, libc::SCHED_FIFO | libc::SCHED_RR | SCHED_DEADLINE) {
        return Ok(());
    }
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call.
    let ret = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("leave the real-time scheduling policy", e))
}

/// SCHED_DEADLINE (not in every libc crate version's constants).
const SCHED_DEADLINE: i32 = 6;

/// A negative nice (more CPU than the host's own work) becomes 0; a
/// positive one, which an operator may give jobs on purpose, stays.
fn reset_nice() -> Result<(), SysError> {
    Errno::clear();
    // SAFETY: getpriority takes integers; -1 is a valid value, told apart
    // from an error by errno, cleared above.
    let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    if nice == -1 && Errno::last_raw() != 0 {
        return Err(SysError::call("read the nice value", Errno::last()));
    }
    if nice >= 0 {
        return Ok(());
    }
    // SAFETY: setpriority takes integers and no pointers.
    let ret = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 0) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("reset the nice value", e))
}

const IOPRIO_WHO_PROCESS: libc::c_int = 1;
const IOPRIO_CLASS_SHIFT: libc::c_int = 13;
const IOPRIO_CLASS_RT: libc::c_int = 1;
const IOPRIO_CLASS_BE: libc::c_int = 2;
/// The best-effort level a process gets by default (from nice 0).
const IOPRIO_BE_DEFAULT: libc::c_int = 4;

/// The real-time I/O class, or a best-effort level above the default,
/// becomes "none" (best effort, derived from the nice value). The idle
/// class and lower best-effort levels stay.
fn reset_io_priority() -> Result<(), SysError> {
    // SAFETY: ioprio_get takes integers and no pointers.
    let ret = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    let prio = Errno::result(ret).map_err(|e| SysError::call("read the I/O priority", e))? as libc::c_int;
    let (class, level) = (prio >> IOPRIO_CLASS_SHIFT, prio & ((1 << IOPRIO_CLASS_SHIFT) - 1));
    let favoured = class == IOPRIO_CLASS_RT || (class == IOPRIO_CLASS_BE && level < IOPRIO_BE_DEFAULT);
    if !favoured {
        return Ok(());
    }
    // SAFETY: ioprio_set takes integers and no pointers; 0 is the "none" class.
    let ret = unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, 0) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("reset the I/O priority", e))
}

/// Set each of [`RLIMITS`] to its value, one call each; where the hard
/// limit is lower already (the kernel refuses to raise it: EPERM), it is
/// kept as it is.
fn lower_rlimits() -> Result<(), SysError> {
    for &(resource, value) in RLIMITS {
        let new = libc::rlimit { rlim_cur: value, rlim_max: value };
        // SAFETY: `new` is a valid rlimit we own; setrlimit only reads it.
        let ret = unsafe { libc::setrlimit(resource, &new) };
        match Errno::result(ret) {
            Ok(_) | Err(Errno::EPERM) => {}
            Err(e) => return Err(SysError::call("lower an inherited rlimit", e)),
        }
    }
    Ok(())
}

/// Write `/proc/self/<file>`.
fn write_own(file: &str, value: &str) -> Result<(), SysError> {
    let path = std::path::PathBuf::from("/proc/self").join(file);
    std::fs::write(&path, value).map_err(|e| SysError::io("reset", &path, e))
}

/// Cap the per-user-namespace counters of the calling process's user
/// namespace (pid 1's: the sandbox's; the job's own, nested in it), while
/// it still holds CAP_SYS_RESOURCE there. An inotify limit this kernel
/// does not have is skipped.
pub fn limit_ucounts() -> Result<(), SysError> {
    for (name, value) in UCOUNT_LIMITS {
        let path = std::path::Path::new("/proc/sys/user").join(name);
        match std::fs::write(&path, value.to_string()) {
            Ok(()) => {}
            // A kernel without inotify has no inotify counters to cap;
            // every kernel with user namespaces has their counter, and a
            // /proc that hides it (`subset=pid`) must not go unnoticed.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && *name != "max_user_namespaces" => {}
            Err(e) => return Err(SysError::io("limit the namespace's counters", &path, e)),
        }
    }
    Ok(())
}
