//! How much CPU the host left idle lately, on the CPUs the server (and so
//! its jobs and its warm sandboxes) may run on: the warm pool builds a
//! sandbox ahead of a request only when there is idle CPU to build it
//! with.
//!
//! Why: a warm sandbox is built in the background, but it is still built
//! on the host's CPUs. On a host whose CPUs the running jobs keep busy, a
//! refill takes its time from them, at whatever weight or nice value
//! (docs/benchmarks.md measures it). There, the pool waits, and a request
//! that finds no warm sandbox builds its own on its path, as with no pool:
//! it costs the running jobs what a cold request does.
//!
//! What it reads: `/proc/stat`'s per-CPU lines (idle and iowait against
//! the whole), for the CPUs of the server's affinity mask. That file is
//! the kernel's, in the server's own mount namespace; a job can change
//! what it says only by using CPU, which makes the pool wait, never build
//! more. PSI (`/proc/pressure/cpu`) would say it too, but it is off by
//! default on Debian's kernels.

use std::time::{Duration, Instant};

/// The shortest span a reading is made over: `/proc/stat` counts in
/// ticks of 10 ms a CPU.
const MIN_SPAN: Duration = Duration::from_millis(100);

/// How much idle CPU, in CPUs, the host must have had over the last
/// span for a build to start: half a CPU. A build needs about one CPU
/// for a few milliseconds.
const ENOUGH_IDLE_CPUS: f64 = 0.5;

/// The CPU time of the server's CPUs at one moment, in ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Times {
    /// Idle and waiting for I/O.
    pub idle: u64,
    /// Everything, idle included.
    pub total: u64,
}

/// How many CPUs' worth were idle between `from` and `to`, given how
/// many CPUs they count; `None` when no time passed between them.
pub(crate) fn idle_cpus(from: Times, to: Times, cpus: usize) -> Option<f64> {
    let total = to.total.checked_sub(from.total)?;
    let idle = to.idle.checked_sub(from.idle)?;
    if total == 0 {
        return None;
    }
    Some(idle.min(total) as f64 / total as f64 * cpus as f64)
}

/// The sums of `stat`'s lines of the CPUs in `mine` (sorted; all of them
/// when `mine` is `None`), and how many were counted. Lines it can't read
/// are skipped: a kernel adding a field must not stop the pool.
pub(crate) fn parse(stat: &str, mine: Option<&[usize]>) -> (Times, usize) {
    let mut times = Times { idle: 0, total: 0 };
    let mut cpus = 0;
    for line in stat.lines() {
        let mut fields = line.split_ascii_whitespace();
        let Some(name) = fields.next() else { continue };
        let Some(Ok(cpu)) = name.strip_prefix("cpu").filter(|n| !n.is_empty()).map(str::parse::<usize>) else {
            continue;
        };
        if mine.is_some_and(|m| m.binary_search(&cpu).is_err()) {
            continue;
        }
        // user nice system idle iowait irq softirq steal; guest time is
        // inside user already.
        let v: Vec<u64> = fields.take(8).map_while(|f| f.parse().ok()).collect();
        if v.len() < 5 {
            continue;
        }
        times.idle = times.idle.saturating_add(v[3]).saturating_add(v[4]);
        times.total = times.total.saturating_add(v.iter().fold(0u64, |a, x| a.saturating_add(*x)));
        cpus += 1;
    }
    (times, cpus)
}

/// The CPUs this thread may run on, sorted, if the kernel says (nix's
/// mask holds 1,024 CPUs: on a bigger host, every CPU counts).
fn affinity() -> Option<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok()?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count()).filter(|&i| set.is_set(i).unwrap_or(false)).collect();
    (!cpus.is_empty()).then_some(cpus)
}

/// A reading of `/proc/stat` for the server's CPUs.
fn read(mine: Option<&[usize]>) -> Option<(Times, usize)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (times, cpus) = parse(&stat, mine);
    (cpus > 0).then_some((times, cpus))
}

/// Readings kept between calls: the last tick's, and what the last span
/// long enough said.
#[derive(Debug)]
pub(crate) struct Gauge {
    mine: Option<Vec<usize>>,
    last: Option<(Instant, Times)>,
    /// Idle CPUs over the last span of at least [`MIN_SPAN`].
    said: Option<f64>,
}

impl Gauge {
    /// A gauge of the CPUs the calling thread may run on.
    pub(crate) fn new() -> Gauge {
        Gauge { mine: affinity(), last: None, said: None }
    }

    /// Read the CPUs now; what the span since the last reading (if it
    /// is long enough) said replaces what was known. Called on a steady
    /// tick, so that a reading is never older than the tick.
    pub(crate) fn tick(&mut self) {
        // Too soon to say anything: the span before stands, and the file
        // (long on a big host) is not read.
        if self.last.is_some_and(|(then, _)| then.elapsed() < MIN_SPAN) {
            return;
        }
        let Some((now, cpus)) = read(self.mine.as_deref()) else {
            // No /proc/stat (or none of our CPUs in it): nothing known,
            // and the pool builds as it would without a gauge.
            self.last = None;
            self.said = None;
            return;
        };
        if let Some((_, before)) = self.last {
            if let Some(idle) = idle_cpus(before, now, cpus) {
                self.said = Some(idle);
            }
        }
        self.last = Some((Instant::now(), now));
    }

    /// Whether the host had half a CPU idle lately: over the span since
    /// the last tick if it is long enough, else over the span before it.
    /// True when nothing is known (no `/proc/stat`): the pool then
    /// builds as it always did.
    pub(crate) fn has_idle(&mut self) -> bool {
        self.tick();
        tracing::trace!(idle_cpus = ?self.said, "the host's idle CPU lately");
        match self.said {
            Some(idle) => idle >= ENOUGH_IDLE_CPUS,
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  900 0 100 2000 0 0 0 0 0 0\n\
                        cpu0 400 0 50 1000 0 0 0 0 0 0\n\
                        cpu1 500 0 50 1000 0 0 0 0 0 0\n\
                        intr 12345 0 0\n\
                        ctxt 999\n";

    #[test]
    fn the_cpu_lines_are_summed_and_the_aggregate_is_not_counted_twice() {
        let (t, n) = parse(STAT, None);
        assert_eq!(n, 2);
        assert_eq!(t, Times { idle: 2000, total: 3000 });
    }

    #[test]
    fn only_the_cpus_of_the_mask_count() {
        let (t, n) = parse(STAT, Some(&[1]));
        assert_eq!(n, 1);
        assert_eq!(t, Times { idle: 1000, total: 1550 });
        let (_, none) = parse(STAT, Some(&[7]));
        assert_eq!(none, 0);
    }

    #[test]
    fn iowait_is_idle_and_short_or_garbled_lines_are_skipped() {
        let stat = "cpu0 10 0 10 50 30 0 0 0\ncpu1 x y z\ncpu2 1 2\ncpuX 1 2 3 4 5\n";
        let (t, n) = parse(stat, None);
        assert_eq!(n, 1);
        assert_eq!(t, Times { idle: 80, total: 100 });
    }

    #[test]
    fn idle_cpus_is_the_idle_share_of_the_span_times_the_cpus() {
        let a = Times { idle: 100, total: 200 };
        assert_eq!(idle_cpus(a, Times { idle: 150, total: 300 }, 2), Some(1.0));
        assert_eq!(idle_cpus(a, Times { idle: 100, total: 300 }, 2), Some(0.0));
        assert_eq!(idle_cpus(a, a, 2), None);
        // Counters that went back (a CPU taken offline) say nothing.
        assert_eq!(idle_cpus(a, Times { idle: 90, total: 300 }, 2), None);
    }

    #[test]
    fn a_gauge_reads_this_host() {
        let mut g = Gauge::new();
        g.tick();
        std::thread::sleep(MIN_SPAN + Duration::from_millis(20));
        g.tick();
        let idle = g.said.expect("a span long enough was read");
        // The CPUs of the mask, not available_parallelism (which a cgroup
        // quota lowers).
        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let cpus = parse(&stat, g.mine.as_deref()).1 as f64;
        assert!((0.0..=cpus + 0.01).contains(&idle), "{idle} idle of {cpus} CPUs");
    }
}
