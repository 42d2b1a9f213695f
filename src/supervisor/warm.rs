//! The server's warm pool (`[sandbox] warm`): sandboxes built before
//! their requests arrive, of the shapes the last requests had.
//!
//! The pool keeps the last N shapes asked for (N its size), most recent
//! first, and shares its N sandboxes among them: one shape gets all N;
//! two (an MCP client's jobs and `confine run`s, say) get N/2 each, the
//! most recent one the odd one. A sandbox of a shape no longer wanted
//! is the first to go when room is needed.
//!
//! A thread of its own builds them, at a lower priority (nice 10) where
//! the server may raise it again (CAP_SYS_NICE), so that a refill yields
//! the CPU to the jobs that run. It is the stages' parent thread, for as
//! long as the pool lives: their parent-death signal is tied to it, so a
//! server that dies takes its warm sandboxes with it, and the next one's
//! start-up sweep removes their cgroups.
//!
//! A sandbox a request took is replaced at once: that build is the one
//! the request did not make on its path, moved, not added. Any other
//! build (the first ones, and those that replace sandboxes dropped for
//! their age, a change of the host's mounts or a new shape) waits until
//! the host's CPUs had idle time lately (half a CPU, [`super::cpu_idle`]),
//! up to [`BUSY_MAX_WAIT`] a sandbox: on a host whose mounts keep
//! changing while its jobs keep the CPUs busy, sandboxes that are built
//! only to be dropped would take their time from those jobs.
//!
//! A sandbox that waited past `max_idle` is replaced; one whose stage died
//! is dropped. When the host's mount table changes, every waiting sandbox
//! is replaced: its root was bound from the host's as it was (a mask put
//! over a path of /etc since must reach the next job), and it would keep
//! a file system the host unmounts busy. Each serves one job.

use crate::job::Limits;
use crate::sandbox::linux::protocol::InitSpec;
use crate::sandbox::linux::warm::{WarmSandbox, WarmShape};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The nice value sandboxes are built at.
const BUILD_NICE: i32 = 10;
/// How long a failed build waits before the next try.
const RETRY: Duration = Duration::from_secs(5);
/// How often a build put off for busy CPUs looks again.
const BUSY_RECHECK: Duration = Duration::from_millis(250);
/// The longest a build is put off for busy CPUs: on a host that stays
/// busy, one sandbox at most this often, so that the pool still fills
/// (each one it builds replaces a request's cold build).
const BUSY_MAX_WAIT: Duration = Duration::from_secs(2);

/// A shape the pool builds for: one a request had.
#[derive(Clone)]
struct Want {
    shape: WarmShape,
    base: InitSpec,
    limits: Limits,
}

#[derive(Default)]
struct State {
    ready: Vec<WarmSandbox>,
    /// The shapes built for, the most recently asked for first.
    wants: Vec<Want>,
    /// How many shapes are kept: the pool's size.
    size: usize,
    stopping: bool,
    /// Bumped at each change of the host's mount table: a sandbox whose
    /// build began before it is not kept.
    mounts: u64,
    /// Sandboxes taken by requests and not yet replaced: built without
    /// waiting for idle CPU.
    owed: usize,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// The host's idle CPU, read by the mount watch's tick and by the
    /// builder before each build.
    gauge: Mutex<super::cpu_idle::Gauge>,
}

/// N sandboxes kept ready; dropped, they are killed.
pub(crate) struct WarmPool {
    shared: Arc<Shared>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl WarmPool {
    /// Start the builder thread, which builds nothing until it is told
    /// what to build, and the watch on the host's mounts. `seccomp_fd`:
    /// the compiled profile's memfd. `lower`: build at a lower priority
    /// (the server may give the job its own back: CAP_SYS_NICE).
    pub(crate) fn start(
        size: usize,
        max_idle: Duration,
        seccomp_fd: OwnedFd,
        lower: bool,
    ) -> std::io::Result<WarmPool> {
        let state = State { size, ..State::default() };
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            wake: Condvar::new(),
            gauge: Mutex::new(super::cpu_idle::Gauge::new()),
        });
        let mountinfo = std::fs::File::open("/proc/self/mountinfo")?;
        let builder = std::thread::Builder::new().name("confine-warm".into()).spawn({
            let shared = shared.clone();
            move || builder(&shared, size, max_idle, &seccomp_fd, lower)
        })?;
        let mut pool = WarmPool { shared, threads: vec![builder] };
        let watch = std::thread::Builder::new().name("confine-warm-mounts".into()).spawn({
            let shared = pool.shared.clone();
            move || watch_mounts(&shared, &mountinfo)
        })?;
        pool.threads.push(watch);
        Ok(pool)
    }

    /// A ready sandbox of `shape`, if there is one; either way the pool
    /// now builds for this shape.
    pub(crate) fn take(&self, shape: &WarmShape, base: &InitSpec, limits: &Limits) -> Option<WarmSandbox> {
        let Ok(mut st) = self.shared.state.lock() else { return None };
        let found = st.ready.iter_mut().position(|w| w.fits(shape) && w.alive());
        let taken = found.map(|i| st.ready.swap_remove(i));
        st.owed += usize::from(taken.is_some());
        match st.wants.first_mut() {
            Some(w) if w.shape == *shape => {
                // The same shape, maybe of another owner's checkout: the
                // next builds make that owner's idmap namespace.
                if w.base.idmap_owners != base.idmap_owners {
                    w.base.idmap_owners = base.idmap_owners.clone();
                }
            }
            _ => st.asked(Want { shape: shape.clone(), base: base.clone(), limits: limits.clone() }),
        }
        self.shared.wake.notify_one();
        taken
    }
}

impl WarmPool {
    /// Build for `shape` from now on, before any request of it.
    fn want(&self, shape: WarmShape, base: InitSpec, limits: Limits) {
        let Ok(mut st) = self.shared.state.lock() else { return };
        st.asked(Want { shape, base, limits });
        self.shared.wake.notify_one();
    }
}

impl super::Supervisor {
    /// Have the warm pool build, from the server's start, for what a
    /// request to the first configured repository will most likely be: a
    /// job of its repository with the configured limits (a runtime's
    /// toolchain and the code are the request's part, whatever they are).
    /// The pool learns every other shape from the requests it serves.
    pub fn prewarm(&self) {
        use super::exec::JobRequest;
        let (Some(pool), Some(profile), Some(repo)) = (&self.warm, &self.seccomp, self.config.repos.first()) else {
            return;
        };
        let req = JobRequest {
            repo_id: Some(repo.id.clone()),
            runtime: "shell".into(),
            code: Some("true".into()),
            ..JobRequest::default()
        };
        let planner = self.planner();
        let policy_req = super::plan::policy_request(&req, &self.config.network);
        let limits = self.config.resolve_limits(&policy_req.limits);
        let placed = planner
            .admit(&req, &policy_req)
            .map_err(|e| e.to_string())
            .and_then(|admitted| planner.prepare(&req, &admitted).map_err(|r| r.message))
            .and_then(|prepared| {
                let timeout = Duration::from_millis(limits.timeout_ms);
                planner.place(&req, &prepared, &limits, timeout).map_err(|r| r.message)
            });
        let spec = match placed {
            Ok(placed) => placed.spec,
            Err(e) => {
                tracing::debug!(error = %e, "nothing prewarmed: the first repository's job can't be planned");
                return;
            }
        };
        if let Some((shape, base, _)) = crate::sandbox::linux::warm::shape_of(&spec, &profile.name, false) {
            pool.want(shape, base, spec.limits);
        }
    }
}

impl State {
    /// `want` is now the most recent shape asked for.
    fn asked(&mut self, want: Want) {
        self.wants.retain(|w| w.shape != want.shape);
        self.wants.insert(0, want);
        self.wants.truncate(self.size.max(1));
    }

    /// How many sandboxes the `i`-th wanted shape gets.
    fn share(&self, i: usize) -> usize {
        let n = self.wants.len().max(1);
        self.size / n + usize::from(i < self.size % n)
    }

    /// How many ready sandboxes fit `shape`.
    fn fitting(&self, shape: &WarmShape) -> usize {
        self.ready.iter().filter(|r| r.fits(shape)).count()
    }

    /// The first wanted shape with fewer sandboxes ready than its share.
    fn short(&self) -> Option<Want> {
        (0..self.wants.len())
            .find(|&i| self.fitting(&self.wants[i].shape) < self.share(i))
            .map(|i| self.wants[i].clone())
    }

    /// A ready sandbox to make room with: one of a shape no longer
    /// wanted, else one of a shape with more than its share.
    fn spare(&self) -> Option<usize> {
        let unwanted = self.ready.iter().position(|r| !self.wants.iter().any(|w| r.fits(&w.shape)));
        unwanted.or_else(|| {
            let over = (0..self.wants.len()).find(|&i| self.fitting(&self.wants[i].shape) > self.share(i))?;
            self.ready.iter().position(|r| r.fits(&self.wants[over].shape))
        })
    }
}

/// Those of `ready` that may go on waiting, and those to drop: dead, or
/// waiting for `max_idle` already.
fn sort_out(ready: Vec<WarmSandbox>, max_idle: Duration) -> (Vec<WarmSandbox>, Vec<WarmSandbox>) {
    let (mut keep, mut gone) = (Vec::new(), Vec::new());
    for mut w in ready {
        if w.alive() && w.age() < max_idle {
            keep.push(w);
        } else {
            gone.push(w);
        }
    }
    (keep, gone)
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.stopping = true;
        }
        self.shared.wake.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// How often the mount watch looks whether the pool is stopping, and
/// reads the host's idle CPU.
const WATCH_TICK: Duration = Duration::from_secs(1);

/// Replace every waiting sandbox when the host's mount table changes
/// (`/proc/self/mountinfo` polls POLLPRI then).
fn watch_mounts(shared: &Shared, mountinfo: &std::fs::File) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let tick = PollTimeout::try_from(WATCH_TICK.as_millis() as i32).unwrap_or(PollTimeout::NONE);
    loop {
        if let Ok(mut gauge) = shared.gauge.lock() {
            gauge.tick();
        }
        let mut fds = [PollFd::new(mountinfo.as_fd(), PollFlags::POLLPRI)];
        let changed = match poll(&mut fds, tick) {
            Ok(_) => fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLPRI | PollFlags::POLLERR)),
            Err(nix::errno::Errno::EINTR) => false,
            Err(e) => {
                tracing::warn!(error = %e, "the host's mounts can't be watched: warm sandboxes are replaced by age only");
                return;
            }
        };
        let stale = {
            let Ok(mut st) = shared.state.lock() else { return };
            if st.stopping {
                return;
            }
            if !changed {
                continue;
            }
            st.mounts += 1;
            std::mem::take(&mut st.ready)
        };
        if !stale.is_empty() {
            tracing::debug!(sandboxes = stale.len(), "the host's mounts changed: warm sandboxes replaced");
        }
        // Killed outside the lock: a request must not wait for it.
        drop(stale);
        shared.wake.notify_all();
    }
}

fn builder(shared: &Shared, size: usize, max_idle: Duration, seccomp_fd: &OwnedFd, lower: bool) {
    if lower {
        // SAFETY: setpriority takes integers and no pointers; 0 is this
        // thread (Linux keeps a nice value per thread), which the stages
        // inherit.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, BUILD_NICE) };
    }
    let Ok(mut st) = shared.state.lock() else { return };
    // Since when the next build has been put off for busy CPUs, and
    // whether the CPUs were found idle for it since.
    let mut put_off: Option<Instant> = None;
    let mut cleared = false;
    loop {
        if st.stopping {
            let all = std::mem::take(&mut st.ready);
            drop(st);
            drop(all);
            return;
        }
        // Dead or stale ones go (killed outside the lock); what is left of
        // another shape goes when room is needed for this one.
        let (keep, gone) = sort_out(std::mem::take(&mut st.ready), max_idle);
        st.ready = keep;
        if !gone.is_empty() {
            drop(st);
            drop(gone);
            st = match shared.state.lock() {
                Ok(st) => st,
                Err(_) => return,
            };
            continue;
        }
        let Some(want) = st.short() else {
            put_off = None;
            cleared = false;
            st.owed = 0;
            // Wake to replace the oldest when it turns stale.
            let oldest = st.ready.iter().map(WarmSandbox::age).max().unwrap_or_default();
            let wait = max_idle.saturating_sub(oldest).max(Duration::from_secs(1));
            st = match shared.wake.wait_timeout(st, wait) {
                Ok((st, _)) => st,
                Err(_) => return,
            };
            continue;
        };
        let since = *put_off.get_or_insert_with(Instant::now);
        if st.owed == 0 && !cleared && since.elapsed() < BUSY_MAX_WAIT {
            // Read outside the state's lock: a request's take must not
            // wait for /proc. What changed meanwhile (a take, a stop) is
            // looked at again from the top.
            drop(st);
            let idle = shared.gauge.lock().map_or(true, |mut g| g.has_idle());
            st = match shared.state.lock() {
                Ok(st) => st,
                Err(_) => return,
            };
            cleared = idle;
            // Busy, and no take or stop came meanwhile (its wake-up would
            // be lost): look again later.
            if !idle && st.owed == 0 && !st.stopping {
                tracing::trace!("the host's CPUs are busy: the next warm sandbox waits");
                st = match shared.wake.wait_timeout(st, BUSY_RECHECK) {
                    Ok((st, _)) => st,
                    Err(_) => return,
                };
            }
            continue;
        }
        put_off = None;
        cleared = false;
        let owed = st.owed > 0;
        st.owed = st.owed.saturating_sub(1);
        let mut evicted = Vec::new();
        while st.ready.len() >= size {
            match st.spare() {
                Some(i) => evicted.push(st.ready.swap_remove(i)),
                None => break,
            }
        }
        let mounts = st.mounts;
        drop(st);
        drop(evicted);
        let built = WarmSandbox::start(&want.shape, &want.base, &want.limits, want.shape.stdio(), seccomp_fd);
        st = match shared.state.lock() {
            Ok(st) => st,
            Err(_) => return,
        };
        match built {
            // Begun before the host's mounts last changed: built again,
            // and still owed to the request that took one.
            Ok(w) if st.mounts != mounts => {
                st.owed += usize::from(owed);
                drop(st);
                drop(w);
                st = match shared.state.lock() {
                    Ok(st) => st,
                    Err(_) => return,
                };
            }
            Ok(w) => st.ready.push(w),
            Err(e) => {
                tracing::debug!(error = %e, "a warm sandbox could not be built; requests start cold");
                st = match shared.wake.wait_timeout(st, RETRY) {
                    Ok((st, _)) => st,
                    Err(_) => return,
                };
            }
        }
    }
}
