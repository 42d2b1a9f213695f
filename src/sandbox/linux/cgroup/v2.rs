//! cgroup v2: one directory, controllers switched on from above through
//! `cgroup.subtree_control`. This file knows the v2 file names, the
//! `cgroup.kill` tree kill and its `cgroup.freeze` fallback for kernels
//! older than 5.14; it never decides what a job gets (that is `mod.rs`).

use super::{v1, write_file, CgroupError, JobDir, Stats};
use std::path::Path;
use std::time::{Duration, Instant};

/// How long a freeze may take before we kill what we have anyway.
const FREEZE_WAIT: Duration = Duration::from_millis(200);

/// The controllers `dir` may hand down (its `cgroup.controllers`).
pub fn available(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(|c| c.trim_start_matches('+').to_string()).collect())
        .unwrap_or_default()
}

/// Switch `controllers` on for the children of `dir`, in one write (the
/// kernel applies a list all or nothing). Already enabled ones are skipped,
/// so the common case costs one read.
pub fn enable(dir: &Path, controllers: &[&str]) -> std::io::Result<()> {
    let file = dir.join("cgroup.subtree_control");
    let current = std::fs::read_to_string(&file)?;
    let on: Vec<&str> = current.split_whitespace().map(|c| c.trim_start_matches('+')).collect();
    let missing: Vec<String> = controllers.iter().filter(|c| !on.contains(c)).map(|c| format!("+{c}")).collect();
    if missing.is_empty() {
        return Ok(());
    }
    write_file(&file, &missing.join(" "))
}

pub fn set_memory(dir: &JobDir, bytes: u64) -> Result<(), CgroupError> {
    dir.set("memory.max", &bytes.to_string())?;
    // No swap: over its limit a job is OOM-killed instead of thrashing.
    // The file is missing when the kernel has no swap accounting.
    dir.set_optional("memory.swap.max", "0")?;
    Ok(())
}

pub fn set_cpu(dir: &JobDir, quota_us: u64) -> Result<(), CgroupError> {
    dir.set("cpu.max", &format!("{quota_us} {}", v1::CFS_PERIOD_US))
}

/// A job's CPU weight against its siblings: the default (100), or that of
/// nice 10 (`cpu.weight.nice`'s mapping) for a sandbox built in the
/// background.
pub fn set_weight(dir: &JobDir, background: bool) -> Result<(), CgroupError> {
    dir.set("cpu.weight", if background { "11" } else { "100" })
}

/// Kill every process of the cgroup: `cgroup.kill` where the kernel has
/// it (5.14+), else freeze, SIGKILL the members, thaw.
pub fn kill(dir: &JobDir) -> Result<(), CgroupError> {
    if dir.path.join("cgroup.kill").exists() {
        return dir.set("cgroup.kill", "1");
    }
    dir.set("cgroup.freeze", "1")?;
    let start = Instant::now();
    while dir.read_flat("cgroup.events").get("frozen").is_none_or(|v| *v != 1) && start.elapsed() < FREEZE_WAIT {
        std::thread::sleep(Duration::from_micros(200));
    }
    let killed = v1::kill_members(dir);
    let thawed = dir.set("cgroup.freeze", "0");
    killed.and(thawed)
}

/// Fill what this directory accounts for. `cpu.stat` is core in v2: it
/// is there even without the cpu controller.
pub fn read_stats(dir: &JobDir, stats: &mut Stats) {
    let cpu = dir.read_flat("cpu.stat");
    let usec = |k: &str| Duration::from_micros(cpu.get(k).copied().unwrap_or(0).max(0) as u64);
    if cpu.contains_key("user_usec") {
        stats.cpu_user = usec("user_usec");
        stats.cpu_sys = usec("system_usec");
    }
    if dir.has("memory") {
        stats.memory_peak = dir.read_u64("memory.peak").or(stats.memory_peak);
        stats.oom_kills = dir.read_flat("memory.events").get("oom_kill").map(|v| *v as u64);
    }
    if dir.has("pids") {
        stats.pids_peak = dir.read_u64("pids.peak").or(stats.pids_peak);
    }
}

/// Total CPU time, for the CPU-time limit.
pub fn cpu_usage(dir: &JobDir) -> Option<Duration> {
    dir.read_flat("cpu.stat").get("usage_usec").map(|v| Duration::from_micros((*v).max(0) as u64))
}
