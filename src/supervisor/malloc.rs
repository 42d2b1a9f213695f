//! The supervisor's allocator settings, applied once when a long-lived
//! supervisor starts (`confine serve`, `confine exec`), before its threads.
//!
//! Why: output capture passes buffers of ~130 KiB between threads. glibc
//! raises its mmap threshold dynamically each time such a buffer is freed,
//! after which they come from the per-thread arenas instead, and freed
//! memory stays there: peak RSS over repeated floods grew several times
//! over (benches/output.rs; docs/benchmarks.md has the figures). A fixed
//! 128 KiB threshold (which also turns the dynamic adjustment off) keeps
//! large buffers in their own mappings, returned to the kernel when freed.
//! Fewer arenas did not help those floods reliably.
//!
//! A server also bounds its arenas to one per core ([`bound_arenas`]).
//! glibc's default is eight per core, and a server's threads come and go
//! (the runtime's blocking pool, output readers, sled's), each taking an
//! arena of its own when another thread holds the one it last used. Each
//! arena keeps partly used pages of its own that no trim returns, and the
//! idle server's RSS crept with the number of arenas (docs/reliability.md).
//!
//! A long-lived server also hands the allocator's free memory back to the
//! kernel once it has gone idle after work ([`trim_when_idle`]). glibc
//! returns a free region only from the top of a heap on its own; a burst of
//! concurrent jobs leaves free regions below live ones, in each arena its
//! threads used, and the idle server kept them: its RSS rose by steps from
//! one burst to the next while its live allocations did not.
//! `malloc_trim(0)` releases every free page of every arena.
//!
//! This only tunes the allocator; it must never change what the program
//! computes. Off glibc (musl, macOS, Windows) it does nothing: those
//! allocators have no such threshold to set.

/// Allocations at or above this size get their own mapping (glibc's
/// default before its dynamic adjustment kicks in).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Apply the settings; an operator's own `MALLOC_MMAP_THRESHOLD_` or
/// `GLIBC_TUNABLES` choice wins. Returns whether anything was changed.
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        set_unless_chosen(
            ("MALLOC_MMAP_THRESHOLD_", "mmap_threshold"),
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
            "RSS may grow over large outputs",
        )
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Bound the allocator's arenas to one per core, at least two, for a
/// long-lived server, before its threads start. An operator's own
/// `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` choice wins. Returns whether
/// anything was changed. Off glibc: nothing to do.
pub fn bound_arenas() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).max(2);
        let arenas = libc::c_int::try_from(cores).unwrap_or(libc::c_int::MAX);
        set_unless_chosen(
            ("MALLOC_ARENA_MAX", "arena_max"),
            libc::M_ARENA_MAX,
            arenas,
            "a long-running server's RSS may creep",
        )
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// `mallopt(param, value)`, unless the operator chose the parameter: its
/// environment variable is set, or `GLIBC_TUNABLES` names the tunable.
/// Returns whether glibc took the value; `unless` says what a refusal risks.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_unless_chosen((env, tunable): (&str, &str), param: libc::c_int, value: libc::c_int, unless: &str) -> bool {
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if std::env::var_os(env).is_some() || tunables.contains(tunable) {
        return false;
    }
    // SAFETY: mallopt only sets an allocator parameter (it takes the arena
    // locks itself); any value is validated by glibc.
    let ok = unsafe { libc::mallopt(param, value) };
    if ok != 1 {
        tracing::debug!(param, value, "mallopt refused; {unless}");
    }
    ok == 1
}

/// How often [`trim_when_idle`] looks: a trim comes one to two periods
/// after the last request answered.
#[cfg(target_os = "linux")]
pub const IDLE_TRIM_PERIOD: std::time::Duration = std::time::Duration::from_secs(3);

/// Hand every free page the allocator holds back to the kernel. Returns
/// whether any was. Off glibc: nothing to do.
#[cfg(target_os = "linux")]
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim takes the arena locks itself and only
        // releases pages of free chunks; no allocation changes.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// What the idle watcher knows between two looks.
#[cfg(target_os = "linux")]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IdleWatch {
    /// The count of jobs let run at the last look.
    seen: u64,
    /// The count at the last trim.
    trimmed: u64,
}

#[cfg(target_os = "linux")]
impl IdleWatch {
    /// One look: `admitted` requests started so far, `busy` whether any is
    /// in the pipeline now. True when it is time to trim: work happened
    /// since the last trim, and none started since the last look.
    pub fn look(&mut self, admitted: u64, busy: bool) -> bool {
        let quiet = !busy && admitted == self.seen;
        self.seen = admitted;
        if quiet && admitted != self.trimmed {
            self.trimmed = admitted;
            return true;
        }
        false
    }
}

/// Requests in the governed pipeline, from `execute`'s first step to its
/// answer: what [`trim_when_idle`] watches.
// Off Linux there is no governed execution yet: nothing enters or looks.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct Activity {
    started: std::sync::atomic::AtomicU64,
    in_flight: std::sync::atomic::AtomicUsize,
}

#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
impl Activity {
    /// Count a request in until the guard is dropped.
    pub(crate) fn enter(&self) -> Active<'_> {
        use std::sync::atomic::Ordering;
        self.started.fetch_add(1, Ordering::SeqCst);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        Active(self)
    }

    /// Requests started so far, and how many have not answered yet.
    pub(crate) fn now(&self) -> (u64, usize) {
        use std::sync::atomic::Ordering;
        (self.started.load(Ordering::SeqCst), self.in_flight.load(Ordering::SeqCst))
    }
}

/// A request counted in by [`Activity::enter`].
pub(crate) struct Active<'a>(&'a Activity);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Free what sled retired ([`crate::store::collect_garbage`]) and trim
/// ([`release_free_memory`]) each time the supervisor goes idle after
/// requests, until `stop`: when no request started since the last look and
/// none is in the pipeline (from its first check to its answer, audit and
/// cgroup teardown included). Best effort: a request that arrives while
/// the trim runs may wait on an arena's lock for as long as the trim takes
/// there, and MCP and relayed commands that run no job (queries, memory,
/// audit) are not watched.
#[cfg(target_os = "linux")]
pub async fn trim_when_idle(sup: std::sync::Arc<super::Supervisor>, stop: tokio_util::sync::CancellationToken) {
    let mut watch = IdleWatch::default();
    let mut tick = tokio::time::interval(IDLE_TRIM_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (started, in_flight) = sup.activity.now();
        if watch.look(started, in_flight > 0) {
            let took = std::time::Instant::now();
            let (collected, released) =
                tokio::task::spawn_blocking(|| (crate::store::collect_garbage(), release_free_memory()))
                    .await
                    .unwrap_or((false, false));
            let took_us = took.elapsed().as_micros() as u64;
            tracing::debug!(collected, released, took_us, "idle: retired memory freed, free memory trimmed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    use super::IdleWatch;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_trim_comes_once_per_quiet_spell_after_work() {
        let mut w = IdleWatch::default();
        assert!(!w.look(0, false), "nothing ran yet");
        assert!(!w.look(3, false), "jobs were let run since the last look");
        assert!(w.look(3, false), "quiet for a whole period after work");
        assert!(!w.look(3, false), "already trimmed for that work");
        assert!(!w.look(3, true), "a job waits");
        assert!(!w.look(4, true), "a job runs");
        assert!(w.look(4, false), "it ended, and none started since the last look");
        assert!(!w.look(6, false), "two were let run and ended between two looks");
        assert!(w.look(6, false));
    }

    #[test]
    fn a_request_counts_as_in_flight_until_its_guard_drops() {
        let a = super::Activity::default();
        let first = a.enter();
        let second = a.enter();
        assert_eq!(a.now(), (2, 2));
        drop(first);
        assert_eq!(a.now(), (2, 1));
        drop(second);
        assert_eq!(a.now(), (2, 0));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn releasing_free_memory_is_harmless() {
        let v: Vec<Vec<u8>> = (0..64).map(|_| vec![1u8; 64 << 10]).collect();
        drop(v);
        super::release_free_memory();
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_arena_bound() {
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() && std::env::var_os("GLIBC_TUNABLES").is_none() {
            assert!(super::bound_arenas());
        }
    }

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_threshold() {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            assert!(super::tune_allocator());
        }
    }
}
