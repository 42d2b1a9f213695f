//! Watching a running job to its end: the hard timeout (SIGTERM, then the
//! tree kill after a grace period), the CPU-time limit, cancellation, the
//! tree kill once the job's main process is gone, and the cgroup's
//! counters turned into the outcome's usage and status.
//!
//! Library code shared by the CLI and the MCP server: it never prints and
//! never decides exit codes ([`Outcome::cli_exit_code`] does).

use super::{signals, RunningJob};
use crate::job::{Outcome, Status, Usage};
use crate::sandbox::{Teardown, DEFAULT_KILL_GRACE};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::future::Future;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::time::{sleep_until, Instant};

/// How often the CPU-time limit (and, on kernels without `pids.peak`, the
/// pids count) is checked.
const POLL: Duration = Duration::from_millis(50);

/// How long after the watchdog's kill this process kills the tree itself,
/// should the init stage not have done it.
const WATCHDOG_SLACK: Duration = Duration::from_millis(500);

/// Why the supervisor ended a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Timeout,
    CpuTime,
    Cancelled,
}

impl RunningJob {
    /// Wait for the job to end, enforcing its timeout and CPU-time limit
    /// with the default grace period.
    pub async fn wait(self) -> Outcome {
        self.supervise(DEFAULT_KILL_GRACE, std::future::pending()).await
    }

    /// Wait for the job to end, enforcing its limits. When `cancel`
    /// resolves, its signal is sent to the job (status `cancelled`); on
    /// timeout SIGTERM is (status `timeout`). Either way the whole tree is
    /// killed `kill_grace` later if it is still there. When the main
    /// process exits, whatever it left behind is killed at once.
    pub async fn supervise<C>(self, kill_grace: Duration, cancel: C) -> Outcome
    where
        C: Future<Output = Signal>,
    {
        let (outcome, teardown) = self.supervise_until_dead(kill_grace, cancel).await;
        teardown.finish().await;
        outcome
    }

    /// As [`RunningJob::supervise`], but returning as soon as the tree is
    /// dead and counted, with the removal of the job's cgroups for the
    /// caller to [`Teardown::finish`] after its own work. On a server that
    /// removal runs on a blocking thread meanwhile (the supervisor stores
    /// the output and appends the audit record in that time, instead of
    /// after it); a one-shot command removes in place at `finish`
    /// ([`Teardown::start`]), unless the caller sends the removal beside
    /// its own work ([`Teardown::beside`]).
    pub async fn supervise_until_dead<C>(mut self, kill_grace: Duration, cancel: C) -> (Outcome, Teardown)
    where
        C: Future<Output = Signal>,
    {
        let cpu_limit = self.spec.limits.cpu_time_ms.map(Duration::from_millis);
        let deadline =
            self.spec.limits.timeout_ms.map(|ms| Instant::from_std(self.started) + Duration::from_millis(ms));
        let outer = self.child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw);
        let poll = self.cgroup.as_ref().is_some_and(|c| cpu_limit.is_some() || c.tracks_pids());
        // The outer stage holds the deadline too (`signals`): a stop of this
        // process (Ctrl-Z, SIGSTOP) can't suspend it. Armed, it sends the
        // SIGTERM and the kill, and this process only follows, with its own
        // kill as the second guarantee a little after.
        let watchdog = match (deadline, outer) {
            (Some(at), Some(pid)) => {
                let w = signals::Watchdog::after(at.saturating_duration_since(Instant::now()), kill_grace);
                signals::arm(pid.as_raw(), w)
                    .map_err(|e| tracing::warn!(error = %e, "the init stage's watchdog is not armed; the timeout is ours alone"))
                    .unwrap_or(false)
            }
            _ => false,
        };
        let mut ending = None;
        let mut killed = false;
        let mut buf = Vec::new();
        let mut tmp = None;
        // Once the init stage is reaped its pid may be reused: no signal after that.
        let reaped = AtomicBool::new(false);
        let status = {
            let RunningJob { child, ctl, cgroup, .. } = &mut self;
            let cgroup = cgroup.as_ref();
            let signal = |sig: Signal| {
                if !reaped.load(Ordering::SeqCst) {
                    send(outer, sig);
                }
            };
            let kill_now = |killed: &mut bool| {
                *killed = true;
                if let Some(cg) = cgroup {
                    if let Err(e) = cg.kill_tree() {
                        tracing::warn!(error = %e, "cgroup kill failed; relying on the pid namespace");
                    }
                }
                // Second guarantee: the init stage's death tears the pid namespace down.
                signal(Signal::SIGKILL);
            };
            let exit = async {
                // pid 1's `Exited` report is the job's end: pid 1 is exiting,
                // and the outer stage has nothing left but to wait for it.
                // Ending the outer stage now lets its exit overlap pid 1's
                // namespace teardown instead of following it.
                let mut reports = read_until_exited(ctl, &mut buf, outer).await;
                tmp = reports.tmp.take().flatten();
                if reports.exited {
                    send(outer, Signal::SIGKILL);
                }
                let status = child.wait().await;
                tracing::debug!("init stage reaped");
                reaped.store(true, Ordering::SeqCst);
                // pid 1 (and with it every process of its pid namespace) is
                // gone once its pidfd polls readable: the cgroups are empty.
                if let Some((_, pid1)) = reports.pid1 {
                    // SAFETY: the AsyncFd owns the OwnedFd, which stays open
                    // and the same fd until the AsyncFd is dropped below.
                    if let Ok(fd) = unsafe { tokio::io::unix::AsyncFd::register(pid1) } {
                        let _ = tokio::time::timeout(Duration::from_secs(5), fd.readable()).await;
                    }
                }
                // Any report left sits in the socket buffer, and every
                // writer is gone, so EOF is near.
                let _ = ctl.read_to_end(&mut buf).await;
                status
            };
            tokio::pin!(exit);
            tokio::pin!(cancel);
            let mut cancelled = false;
            let mut kill_at: Option<Instant> = None;
            let mut ticker = tokio::time::interval(POLL);
            let never = Instant::now() + Duration::from_secs(100 * 365 * 86400);
            loop {
                tokio::select! {
                    status = &mut exit => break status,
                    _ = sleep_until(deadline.unwrap_or(never)), if deadline.is_some() && ending.is_none() => {
                        ending = Some(Ending::Timeout);
                        let mut grace = kill_grace;
                        if watchdog {
                            grace += WATCHDOG_SLACK;
                        } else {
                            signal(Signal::SIGTERM);
                        }
                        kill_at = Some(Instant::now().checked_add(grace).unwrap_or(never));
                    }
                    sig = &mut cancel, if !cancelled => {
                        cancelled = true;
                        ending.get_or_insert(Ending::Cancelled);
                        signal(sig);
                        let at = Instant::now().checked_add(kill_grace).unwrap_or(never);
                        kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                    }
                    _ = sleep_until(kill_at.unwrap_or(never)), if kill_at.is_some() && !killed => kill_now(&mut killed),
                    _ = ticker.tick(), if poll && !killed => {
                        if let Some(cg) = cgroup {
                            cg.sample_pids();
                            if cpu_limit.is_some_and(|limit| cg.cpu_usage().is_some_and(|used| used >= limit)) {
                                ending.get_or_insert(Ending::CpuTime);
                                kill_now(&mut killed);
                            }
                        }
                    }
                }
            }
        };
        // The watchdog's timeout, seen here when this process was stopped
        // past the deadline: the reports say it.
        if timed_out_in(&buf) {
            ending.get_or_insert(Ending::Timeout);
        }
        // The main process is gone: so is everything it started.
        if let Some(cg) = &self.cgroup {
            if let Err(e) = cg.kill_tree() {
                tracing::warn!(error = %e, "cgroup kill after the job's end failed");
            }
        }
        tracing::debug!("job tree killed");
        // Nothing of the job runs any more: the repositories it made in a
        // read-write idmapped tree are handed to its host ids, where git
        // distrusts them as it did before idmaps (`idmap_check`).
        self.sweeps.finish(&idmapped_in(&buf));
        let mut outcome = self.outcome(status, &buf, killed || ending.is_some());
        self.account(&mut outcome, ending);
        // Nothing writes there any more; the tmpfs goes with the fd.
        // Without one (rootless: pid 1's root is out of our reach), pid 1's
        // measure of the job's end stands (`outcome`).
        if let Some(fd) = tmp {
            let out = super::mounts::tmp_out(&fd);
            outcome.tmp_full = out.map(|o| crate::job::TmpFull::of(self.spec.limits.tmp_size_bytes, o));
        }
        outcome.network = self.proxy.as_mut().and_then(|p| p.finish());
        let teardown = self.cgroup.take().map_or_else(Teardown::none, |cg| {
            Teardown::start(move || {
                if let Err(e) = cg.remove_blocking() {
                    tracing::warn!(error = %e, "job cgroup left behind");
                }
                tracing::debug!("job cgroup removed");
            })
        });
        (outcome, teardown)
    }

    /// Usage from the cgroup's counters, and the status the supervisor
    /// knows better than the exit code: cancelled, timeout, oom.
    fn account(&self, outcome: &mut Outcome, ending: Option<Ending>) {
        let stats = self.cgroup.as_ref().map(|c| c.stats());
        if let Some(s) = &stats {
            outcome.usage = Usage {
                cpu_user_ms: Some(s.cpu_user.as_millis() as u64),
                cpu_sys_ms: Some(s.cpu_sys.as_millis() as u64),
                peak_memory_bytes: s.memory_peak,
                pids_peak: s.pids_peak,
            };
        }
        let oom = stats.as_ref().is_some_and(|s| s.oom_killed(outcome.signal == Some(libc::SIGKILL)));
        // The job's RLIMIT_CPU (SIGXCPU) may beat our poll of the cgroup.
        let cpu_limit = self.spec.limits.cpu_time_ms.map(Duration::from_millis);
        let cpu_hit = cpu_limit.is_some_and(|limit| {
            outcome.signal == Some(libc::SIGXCPU) || stats.as_ref().is_some_and(|s| s.cpu_user + s.cpu_sys >= limit)
        });
        outcome.status = match ending {
            Some(Ending::Cancelled) => Status::Cancelled,
            Some(Ending::Timeout | Ending::CpuTime) => Status::Timeout,
            None if oom && outcome.status != Status::Success => Status::Oom,
            None if cpu_hit && outcome.status != Status::Success => Status::Timeout,
            None => outcome.status,
        };
    }
}

/// What [`read_until_exited`] saw.
struct Seen {
    /// pid 1's `Exited` report arrived.
    exited: bool,
    /// A pidfd of pid 1, from its `Started` report.
    pid1: Option<(i32, OwnedFd)>,
    /// The job's `Confined` report arrived: pid 1 has pivoted into its root.
    confined: bool,
    /// The job's /tmp ([`job_tmp`]), once both of the above are known;
    /// looked for once.
    tmp: Option<Option<OwnedFd>>,
}

/// Read reports into `buf` until pid 1's `Exited` (or EOF, or an error).
async fn read_until_exited(ctl: &mut tokio::net::UnixStream, buf: &mut Vec<u8>, outer: Option<Pid>) -> Seen {
    use super::protocol::InitReport;
    let mut seen = Seen { exited: false, pid1: None, confined: false, tmp: None };
    let mut scanned = 0;
    let mut chunk = [0u8; 4096];
    while !seen.exited {
        match ctl.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        while let Some(end) = buf[scanned..].iter().position(|b| *b == b'\n') {
            match serde_json::from_slice::<InitReport>(&buf[scanned..scanned + end]) {
                Ok(InitReport::Started { pid1 }) => seen.pid1 = pid1_fd(pid1, outer).map(|fd| (pid1, fd)),
                Ok(InitReport::Confined { .. }) => seen.confined = true,
                Ok(InitReport::Exited { .. }) => seen.exited = true,
                _ => {}
            }
            scanned += end + 1;
        }
        // The outer stage's `Started` and the job's `Confined` may come in
        // either order.
        if let (true, None, Some((pid, fd))) = (seen.confined, &seen.tmp, &seen.pid1) {
            seen.tmp = Some(job_tmp(*pid, fd));
        }
    }
    seen
}

/// The job's /tmp, opened through pid 1's root while the job runs (after
/// its `Confined` report: pid 1 has pivoted), so that it can be measured
/// once the job is over: the tmpfs outlives the namespace for as long as
/// this fd is held. Nothing the job made is followed: `tmp` is a mount
/// point in pid 1's read-only root, opened without following any link,
/// and it must be a tmpfs. pid 1 must still be unreaped after the open
/// (its pidfd takes a signal 0), or its pid, and the path, could have been
/// another process's by then.
fn job_tmp(pid1: i32, pidfd: &OwnedFd) -> Option<OwnedFd> {
    use nix::fcntl::OFlag;
    let root = nix::fcntl::open(
        format!("/proc/{pid1}/root").as_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let tmp = super::sys::openat2(
        &root,
        std::path::Path::new("tmp"),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        resolve,
    )
    .ok()?;
    // SAFETY: pidfd_send_signal with signal 0 and no siginfo only checks
    // that the process the pidfd names is there; it takes no pointers.
    let ret = unsafe {
        libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0)
    };
    if ret != 0 {
        return None;
    }
    let st = nix::sys::statfs::fstatfs(&tmp).ok()?;
    (st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC).then_some(tmp)
}

/// The mount points the job's `Confined` report says were idmapped (sent
/// before its exec, from a descriptor the job does not inherit): the
/// trees the job could write through an idmap.
fn idmapped_in(buf: &[u8]) -> Vec<String> {
    use super::protocol::InitReport;
    buf.split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<InitReport>(l).ok())
        .find_map(|r| match r {
            InitReport::Confined { idmapped, .. } => Some(idmapped),
            _ => None,
        })
        .unwrap_or_default()
}

/// Whether the outer stage's watchdog reported the job's deadline.
fn timed_out_in(buf: &[u8]) -> bool {
    use super::protocol::InitReport;
    buf.split(|b| *b == b'\n').any(|l| matches!(serde_json::from_slice::<InitReport>(l), Ok(InitReport::TimedOut)))
}

/// A pidfd of pid 1 (host pid `pid`), if that pid is still the outer
/// stage's child: the outer stage is alive and has not reaped it, so the
/// pid can't have been reused.
fn pid1_fd(pid: i32, outer: Option<Pid>) -> Option<OwnedFd> {
    let fd = super::sys::pidfd_open(pid).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state, ppid, …
    let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse::<i32>().ok()?;
    (Some(Pid::from_raw(ppid)) == outer).then_some(fd)
}

fn send(pid: Option<Pid>, sig: Signal) {
    if let Some(pid) = pid {
        // ESRCH: it is already gone.
        let _ = kill(pid, sig);
    }
}
