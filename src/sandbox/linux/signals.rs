//! Which signals reach a job, how the init stages wait for them, and the
//! watchdog that holds a job's timeout where no stop of the supervisor
//! reaches.
//!
//! A signal sent to confine is passed on to the job, as `docker run
//! --sig-proxy` and tini do: every signal that can be caught, real-time
//! ones included, except those that are about the receiving process itself
//! ([`is_forwarded`]). The init stages start with every forwarded signal
//! blocked (`stage_process` spawns them so) and take them with
//! `sigtimedwait`: none can kill a stage before it is ready to pass it on.
//!
//! The watchdog: the supervisor queues [`watchdog`] to the outer init
//! stage with the job's deadline and the kill grace ([`arm`]). The outer stage is a process of its own, in a process group
//! of its own, so a terminal's Ctrl-Z, a SIGSTOP or a SIGTTOU of the
//! supervisor leaves it running: it sends SIGTERM at the deadline and
//! kills pid 1 (and with it the pid namespace) a grace later. It trusts
//! the signal only when queued (`SI_QUEUE`) by its parent; the same number
//! sent any other way is a user's, and is forwarded like any other.
//!
//! Nothing here allocates or locks: the outer stage and pid 1 are
//! single-threaded processes that fork.

use nix::errno::Errno;
use std::time::Duration;

/// Whether `sig` is passed on to the job. Not: SIGKILL and SIGSTOP (no
/// process can catch them); the faults a process's own code raises
/// (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT); SIGCHLD and
/// SIGPIPE, about the receiver's own children and pipes; SIGTTIN and
/// SIGTTOU, a terminal's answer to a process that touched it from the
/// background; and glibc's two reserved real-time signals (32, 33).
pub fn is_forwarded(sig: i32) -> bool {
    const OWN: [i32; 13] = [
        libc::SIGKILL,
        libc::SIGSTOP,
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGSYS,
        libc::SIGABRT,
        libc::SIGCHLD,
        libc::SIGPIPE,
        libc::SIGTTIN,
        libc::SIGTTOU,
    ];
    (1..=libc::SIGRTMAX()).contains(&sig) && !OWN.contains(&sig) && !(32..libc::SIGRTMIN()).contains(&sig)
}

/// Every forwarded signal, in order.
pub fn forwarded() -> impl Iterator<Item = i32> {
    (1..=libc::SIGRTMAX()).filter(|s| is_forwarded(*s))
}

/// The signal that arms the watchdog (queued by the supervisor).
pub fn watchdog() -> i32 {
    libc::SIGRTMIN()
}

/// The set the init stages block and wait on: every forwarded signal and
/// SIGCHLD.
pub fn stage_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it and
    // sigaddset only sets bits of valid numbers (forwarded() gives none
    // that glibc refuses).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for sig in forwarded() {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Block [`stage_set`] in this thread (the init stages are single-threaded).
pub fn block_stage_set() -> Result<(), Errno> {
    let set = stage_set();
    // SAFETY: valid set; the old mask is not asked for.
    Errno::result(unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) }).map(drop)
}

/// A signal taken by [`wait`].
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub sig: i32,
    /// `si_code`: `SI_USER` for kill(), `SI_QUEUE` for sigqueue(), …
    pub code: i32,
    /// The sender's pid, as this process's pid namespace sees it.
    pub pid: i32,
    /// The value queued with it (sigqueue), else 0.
    pub value: u64,
}

/// Take one signal of `set` (blocked), waiting at most `timeout` (None:
/// for ever). `Ok(None)`: the time ran out.
pub fn wait(set: &libc::sigset_t, timeout: Option<Duration>) -> Result<Option<Received>, Errno> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: libc::time_t::try_from(t.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    loop {
        // SAFETY: zeroed siginfo_t is valid storage for the kernel to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: rt_sigtimedwait reads the set and the timeout (or none)
        // and writes the siginfo; the kernel's sigset is the first 8 bytes
        // of glibc's.
        let ret = unsafe {
            libc::syscall(libc::SYS_rt_sigtimedwait, set as *const libc::sigset_t, &mut info, ts_ptr, 8usize)
        };
        match Errno::result(ret) {
            Ok(sig) => {
                // SAFETY: the kernel filled the siginfo for this signal; the
                // pid and value fields are read as the kill/queue layout,
                // which every signal a process sends has (0 otherwise).
                let (pid, value) = unsafe { (info.si_pid(), info.si_value().sival_ptr as u64) };
                return Ok(Some(Received { sig: sig as i32, code: info.si_code, pid, value }));
            }
            Err(Errno::EAGAIN) => return Ok(None),
            // A stop and continue of this process, or ptrace.
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The clock both ends of the watchdog read: CLOCK_MONOTONIC, the one the
/// supervisor's timers run on (the outer stage shares the host's, it has
/// no time namespace), in milliseconds.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000 + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}

/// What the watchdog keeps, once armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watchdog {
    /// The job's deadline, on [`monotonic_ms`]'s clock: SIGTERM then.
    /// Absolute, so that a stage still building when it is armed does
    /// not push it back.
    pub deadline_ms: u64,
    /// Then pid 1 is killed this long after the SIGTERM.
    pub grace: Duration,
}

/// Bits of the queued value that carry the deadline (the rest, the
/// grace): 2^40 ms is about 34 years of uptime, 2^24 ms about 4.6 hours
/// of grace.
const DEADLINE_BITS: u32 = 40;

impl Watchdog {
    /// The watchdog for a deadline `left` from now.
    pub fn after(left: Duration, grace: Duration) -> Watchdog {
        let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
        Watchdog { deadline_ms: monotonic_ms().saturating_add(left), grace }
    }

    /// How long from now until the deadline.
    pub fn left(&self) -> Duration {
        Duration::from_millis(self.deadline_ms.saturating_sub(monotonic_ms()))
    }

    /// The value queued with [`watchdog`]. None: a time too far to carry,
    /// which the supervisor then keeps alone.
    pub fn encode(&self) -> Option<u64> {
        let grace = u64::try_from(self.grace.as_millis()).ok()?;
        if self.deadline_ms >> DEADLINE_BITS != 0 || grace >> (64 - DEADLINE_BITS) != 0 {
            return None;
        }
        Some((grace << DEADLINE_BITS) | self.deadline_ms)
    }

    pub fn decode(value: u64) -> Watchdog {
        Watchdog {
            deadline_ms: value & ((1 << DEADLINE_BITS) - 1),
            grace: Duration::from_millis(value >> DEADLINE_BITS),
        }
    }

    /// Whether `r` arms the watchdog: [`watchdog`], queued by `parent`.
    pub fn from_signal(r: &Received, parent: i32) -> Option<Watchdog> {
        (r.sig == watchdog() && r.code == libc::SI_QUEUE && r.pid == parent).then(|| Watchdog::decode(r.value))
    }
}

/// Arm the watchdog of the outer init stage `pid` (our child, not reaped).
/// `Ok(false)`: the times can't be carried; nothing was sent.
pub fn arm(pid: libc::pid_t, w: Watchdog) -> Result<bool, Errno> {
    let Some(value) = w.encode() else { return Ok(false) };
    let val = libc::sigval { sival_ptr: value as usize as *mut libc::c_void };
    // SAFETY: sigqueue takes a pid, a signal number and a value, which the
    // kernel copies; the pointer is never dereferenced.
    Errno::result(unsafe { libc::sigqueue(pid, watchdog(), val) }).map(|_| true)
}

/// Send `sig` to the process of `pidfd` (no pid that could have been
/// reused meanwhile). ESRCH: it has ended.
pub fn pidfd_send(pidfd: &std::os::fd::OwnedFd, sig: i32) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal takes an fd, a signal number, no siginfo
    // (null: as kill() would send it) and flags.
    let ret = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), sig, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    Errno::result(ret).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_signals_are_those_a_user_sends() {
        for sig in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGWINCH, libc::SIGQUIT, libc::SIGALRM, libc::SIGCONT] {
            assert!(is_forwarded(sig), "{sig}");
        }
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGTSTP, libc::SIGURG, libc::SIGRTMIN()] {
            assert!(is_forwarded(sig), "{sig}");
        }
        assert!(is_forwarded(libc::SIGRTMAX()));
        for sig in [0, libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD, libc::SIGPIPE, libc::SIGSEGV, libc::SIGTTOU, 32, 33]
        {
            assert!(!is_forwarded(sig), "{sig}");
        }
        assert!(!is_forwarded(libc::SIGRTMAX() + 1));
    }

    #[test]
    fn the_watchdog_carries_both_times() {
        let w = Watchdog::after(Duration::from_millis(1234), Duration::from_secs(2));
        assert_eq!(Watchdog::decode(w.encode().unwrap()), w);
        assert!(w.left() <= Duration::from_millis(1234) && w.left() > Duration::from_millis(1000));
        let far = Watchdog::after(Duration::from_secs(40 * 365 * 86400), Duration::ZERO);
        assert_eq!(far.encode(), None);
        let long_grace = Watchdog::after(Duration::ZERO, Duration::from_secs(5 * 3600));
        assert_eq!(long_grace.encode(), None);
    }

    #[test]
    fn the_watchdog_is_armed_only_by_the_parent_queueing_it() {
        let r = Received { sig: watchdog(), code: libc::SI_QUEUE, pid: 10, value: 5 };
        assert!(Watchdog::from_signal(&r, 10).is_some());
        assert!(Watchdog::from_signal(&r, 11).is_none());
        assert!(Watchdog::from_signal(&Received { code: libc::SI_USER, ..r }, 10).is_none());
        assert!(Watchdog::from_signal(&Received { sig: libc::SIGUSR1, ..r }, 10).is_none());
    }
}
