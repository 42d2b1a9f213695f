//! The server's warm pool (`[sandbox] warm`): sandboxes built before
//! their requests arrive, of the shape the last request had.
//!
//! A thread of its own builds them, at a lower priority (nice 10), so
//! that a refill yields the CPU to the jobs that run. It is the stages'
//! parent thread, for as long as the pool lives: their parent-death
//! signal is tied to it, so a server that dies takes its warm sandboxes
//! with it, and the next one's start-up sweep removes their cgroups.
//! A sandbox that waited past `max_idle` is replaced; one whose stage died
//! is dropped. Each serves one job.

use crate::job::Limits;
use crate::sandbox::linux::protocol::InitSpec;
use crate::sandbox::linux::warm::{WarmSandbox, WarmShape};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The nice value sandboxes are built at.
const BUILD_NICE: i32 = 10;
/// How long a failed build waits before the next try.
const RETRY: Duration = Duration::from_secs(5);

/// What the pool builds: the last request's shape.
#[derive(Clone)]
struct Want {
    shape: WarmShape,
    base: InitSpec,
    limits: Limits,
}

#[derive(Default)]
struct State {
    ready: Vec<WarmSandbox>,
    want: Option<Want>,
    stopping: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

/// N sandboxes kept ready; dropped, they are killed.
pub(crate) struct WarmPool {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WarmPool {
    /// Start the builder thread, which builds nothing until a request
    /// shows what to build. `seccomp_fd`: the compiled profile's memfd.
    pub(crate) fn start(size: usize, max_idle: Duration, seccomp_fd: OwnedFd) -> std::io::Result<WarmPool> {
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), wake: Condvar::new() });
        let thread = std::thread::Builder::new().name("confine-warm".into()).spawn({
            let shared = shared.clone();
            move || builder(&shared, size, max_idle, &seccomp_fd)
        })?;
        Ok(WarmPool { shared, thread: Some(thread) })
    }

    /// A ready sandbox of `shape`, if there is one; either way the pool
    /// now builds for this shape.
    pub(crate) fn take(&self, shape: &WarmShape, base: &InitSpec, limits: &Limits) -> Option<WarmSandbox> {
        let Ok(mut st) = self.shared.state.lock() else { return None };
        let found = st.ready.iter_mut().position(|w| w.fits(shape) && w.alive());
        let taken = found.map(|i| st.ready.swap_remove(i));
        if st.want.as_ref().is_none_or(|w| w.shape != *shape) {
            st.want = Some(Want { shape: shape.clone(), base: base.clone(), limits: limits.clone() });
        }
        self.shared.wake.notify_one();
        taken
    }
}

impl WarmPool {
    /// Build for `shape` from now on, before any request of it.
    fn want(&self, shape: WarmShape, base: InitSpec, limits: Limits) {
        let Ok(mut st) = self.shared.state.lock() else { return };
        st.want = Some(Want { shape, base, limits });
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

impl Drop for WarmPool {
    fn drop(&mut self) {
        if let Ok(mut st) = self.shared.state.lock() {
            st.stopping = true;
        }
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn builder(shared: &Shared, size: usize, max_idle: Duration, seccomp_fd: &OwnedFd) {
    // SAFETY: setpriority takes integers and no pointers; 0 is this thread
    // (Linux keeps a nice value per thread), which the stages inherit.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, BUILD_NICE) };
    let Ok(mut st) = shared.state.lock() else { return };
    loop {
        if st.stopping {
            st.ready.clear();
            return;
        }
        // Dead or stale ones go; what is left of another shape goes when
        // room is needed for this one.
        st.ready.retain_mut(|w| w.alive() && w.age() < max_idle);
        let want = st.want.clone();
        let fitting = want.as_ref().map_or(0, |w| st.ready.iter().filter(|r| r.fits(&w.shape)).count());
        let Some(want) = want.filter(|_| fitting < size) else {
            // Wake to replace the oldest when it turns stale.
            let oldest = st.ready.iter().map(WarmSandbox::age).max().unwrap_or_default();
            let wait = max_idle.saturating_sub(oldest).max(Duration::from_secs(1));
            st = match shared.wake.wait_timeout(st, wait) {
                Ok((st, _)) => st,
                Err(_) => return,
            };
            continue;
        };
        while st.ready.len() >= size {
            if let Some(i) = st.ready.iter().position(|r| !r.fits(&want.shape)) {
                st.ready.swap_remove(i);
            } else {
                break;
            }
        }
        drop(st);
        let built = WarmSandbox::start(&want.shape, &want.base, &want.limits, want.shape.stdio(), seccomp_fd);
        st = match shared.state.lock() {
            Ok(st) => st,
            Err(_) => return,
        };
        match built {
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
