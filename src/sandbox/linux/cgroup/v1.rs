//! cgroup v1: one directory per controller hierarchy. This file knows the
//! v1 file names (limits, accounting) and the freezer-based tree kill; it
//! never decides which hierarchies a job gets (that is `mod.rs`).

use super::{read_pids, CgroupError, JobDir, Stats};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::time::{Duration, Instant};

/// CFS period: the kernel default, long enough for low scheduling cost,
/// short enough that a throttled job is not paused for visible stretches.
pub const CFS_PERIOD_US: u64 = 100_000;

/// How long a freeze may take before we kill what we have anyway.
const FREEZE_WAIT: Duration = Duration::from_millis(200);

pub fn set_memory(dir: &JobDir, bytes: u64) -> Result<(), CgroupError> {
    dir.set("memory.limit_in_bytes", &bytes.to_string())?;
    // With swap accounting, the same value for memory+swap means no swap:
    // a job over its limit is OOM-killed instead of thrashing the host's swap.
    // The file exists only when the kernel accounts swap.
    dir.set_optional("memory.memsw.limit_in_bytes", &bytes.to_string())?;
    Ok(())
}

pub fn set_cpu(dir: &JobDir, quota_us: u64) -> Result<(), CgroupError> {
    dir.set("cpu.cfs_period_us", &CFS_PERIOD_US.to_string())?;
    dir.set("cpu.cfs_quota_us", &quota_us.to_string())
}

/// A job's CPU share against its siblings: the default (1024), or that of
/// a process at nice 10 against one at 0 (110 to 1024) for a sandbox built
/// in the background.
pub fn set_weight(dir: &JobDir, background: bool) -> Result<(), CgroupError> {
    dir.set("cpu.shares", if background { "110" } else { "1024" })
}

/// Freeze, SIGKILL every member, thaw. Frozen tasks can neither fork nor
/// exit, so the pid list we read is complete and no pid in it can be
/// recycled before our signal lands. SIGKILL is delivered on thaw.
pub fn freeze_kill_thaw(dir: &JobDir) -> Result<(), CgroupError> {
    dir.set("freezer.state", "FROZEN")?;
    let start = Instant::now();
    while dir.read("freezer.state").as_deref().map(str::trim) != Some("FROZEN") && start.elapsed() < FREEZE_WAIT {
        std::thread::sleep(Duration::from_micros(200));
    }
    let killed = kill_members(dir);
    // Thaw even when the kill failed: a frozen tree can't be torn down.
    let thawed = dir.set("freezer.state", "THAWED");
    killed.and(thawed)
}

/// SIGKILL every pid listed in the directory's `cgroup.procs`.
pub fn kill_members(dir: &JobDir) -> Result<(), CgroupError> {
    let pids = read_pids(&dir.path.join("cgroup.procs")).map_err(|e| dir.kill_error(e))?;
    for pid in pids {
        // ESRCH: it exited meanwhile, which is what we want.
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    Ok(())
}

/// Fill what this directory's controllers account for.
pub fn read_stats(dir: &JobDir, stats: &mut Stats) {
    if dir.has("memory") {
        stats.memory_peak = dir.read_u64("memory.max_usage_in_bytes").or(stats.memory_peak);
        let oom = dir.read_flat("memory.oom_control");
        // `oom_kill` appeared in Linux 4.13; before it, the failure counter
        // together with a SIGKILL is the cgroup's own evidence.
        stats.oom_kills = oom.get("oom_kill").map(|v| *v as u64);
        stats.memory_failcnt = dir.read_u64("memory.failcnt").unwrap_or(0);
    }
    if dir.has("cpuacct") {
        let ns = |f: &str| dir.read_u64(f).map(Duration::from_nanos);
        let (user, sys) = match (ns("cpuacct.usage_user"), ns("cpuacct.usage_sys")) {
            (Some(user), Some(sys)) => (user, sys),
            _ => {
                // Linux < 4.7: only clock ticks.
                let stat = dir.read_flat("cpuacct.stat");
                let tick = clock_tick();
                let ticks = |k: &str| tick * stat.get(k).copied().unwrap_or(0).max(0) as u32;
                (ticks("user"), ticks("system"))
            }
        };
        (stats.cpu_user, stats.cpu_sys) = split_total(user, sys, cpu_usage(dir));
    }
    if dir.has("pids") {
        stats.pids_peak = dir.read_u64("pids.peak").or(stats.pids_peak);
    }
}

/// Total CPU time, for the CPU-time limit.
pub fn cpu_usage(dir: &JobDir) -> Option<Duration> {
    dir.read_u64("cpuacct.usage").map(Duration::from_nanos)
}

/// User and system time that add up to `total`, the scheduler's exact
/// count (`cpuacct.usage`, what the CPU-time limit is checked against), in
/// the proportion of the sampled `user` and `sys`. v1's split is sampled at
/// clock ticks, which can miss a share of the time (a guest whose timer
/// ticks are emulated): reported as read, a job stopped at its CPU-time
/// limit would show less than the limit. This is what the kernel does for
/// v2's `cpu.stat` and for a process's times (`cputime_adjust`).
fn split_total(user: Duration, sys: Duration, total: Option<Duration>) -> (Duration, Duration) {
    let Some(total) = total.filter(|t| *t > Duration::ZERO) else { return (user, sys) };
    let (u, s, t) = (user.as_nanos(), sys.as_nanos(), total.as_nanos());
    if u + s == 0 {
        return (total, Duration::ZERO);
    }
    let user = u64::try_from(t * u / (u + s)).unwrap_or(u64::MAX);
    let user = Duration::from_nanos(user);
    (user, total.saturating_sub(user))
}

fn clock_tick() -> Duration {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => Duration::from_nanos(1_000_000_000 / hz as u64),
        _ => Duration::from_millis(10),
    }
}
