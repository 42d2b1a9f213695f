//! One job's cgroups once made: the kill, the counters, and removal —
//! the same code for a live job and for a crashed supervisor's leftovers.
//! Creating them, and deciding which, is `mod.rs`'s.

use super::{init_processes, v1, v2, CgroupError, FsOps, Version, MIN_QUOTA_US, REMOVE_WAIT};
use crate::job::Limits;
use std::collections::HashMap;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Debug builds only: cgroup files (comma-separated names, such as
/// `memory.max`) whose writes fail with EACCES.
pub const TEST_REFUSE_ENV: &str = "CONFINE_TEST_CGROUP_REFUSE";

fn apply_limits(job: &JobCgroup, limits: &Limits) -> Result<(), CgroupError> {
    for dir in &job.dirs {
        if let (Some(bytes), true) = (limits.memory_bytes, dir.has("memory")) {
            match dir.version {
                Version::V1 => v1::set_memory(dir, bytes)?,
                Version::V2 => v2::set_memory(dir, bytes)?,
            }
        }
        if let (Some(cpus), true) = (limits.cpus, dir.has("cpu")) {
            let quota = ((cpus * v1::CFS_PERIOD_US as f64).round() as u64).max(MIN_QUOTA_US);
            match dir.version {
                Version::V1 => v1::set_cpu(dir, quota)?,
                Version::V2 => v2::set_cpu(dir, quota)?,
            }
        }
        if let (Some(n), true) = (limits.pids, dir.has("pids")) {
            dir.set("pids.max", &n.saturating_add(init_processes(dir.version)).to_string())?;
        }
    }
    Ok(())
}

/// How a job's tree is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KillMode {
    /// `cgroup.kill` (or its freeze fallback) of the v2 directory.
    V2(usize),
    /// v1 freezer: freeze, SIGKILL all, thaw.
    Freezer(usize),
    /// No freezer anywhere: SIGKILL what `cgroup.procs` lists.
    Members,
}

pub(super) fn kill_mode(dirs: &[JobDir]) -> KillMode {
    let v2 = dirs.iter().position(|d| d.version == Version::V2);
    if let Some(i) = v2.filter(|i| dirs[*i].path.join("cgroup.kill").exists()) {
        return KillMode::V2(i);
    }
    if let Some(i) = dirs.iter().position(|d| d.version == Version::V1 && d.has("freezer")) {
        return KillMode::Freezer(i);
    }
    v2.map_or(KillMode::Members, KillMode::V2)
}

/// One directory of a job, in one hierarchy.
#[derive(Debug)]
pub(super) struct JobDir {
    pub(super) version: Version,
    /// Mount point of its hierarchy (identifies it).
    pub(super) mount: PathBuf,
    /// `memory:/parent/confine/job-…` for messages: no host paths.
    pub(super) cgroup: String,
    pub(super) path: PathBuf,
    /// v1: the hierarchy's controllers. v2: those switched on for it.
    pub(super) controllers: Vec<String>,
    pub(super) removed: bool,
}

impl JobDir {
    pub(super) fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    pub(super) fn set(&self, file: &'static str, value: &str) -> Result<(), CgroupError> {
        // Debug builds: the tests' way to see a cgroup file system that
        // refuses a write (a job must then never run, exit 125).
        let refused =
            cfg!(debug_assertions) && std::env::var(TEST_REFUSE_ENV).is_ok_and(|f| f.split(',').any(|f| f == file));
        let written = if refused {
            Err(io::Error::from_raw_os_error(libc::EACCES))
        } else {
            write_file(&self.path.join(file), value)
        };
        written.map_err(|source| CgroupError::Write { cgroup: self.cgroup.clone(), file, value: value.into(), source })
    }

    /// Like `set`, but a file the kernel does not have is fine.
    pub(super) fn set_optional(&self, file: &'static str, value: &str) -> Result<bool, CgroupError> {
        match self.set(file, value) {
            Ok(()) => Ok(true),
            Err(CgroupError::Write { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(super) fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.path.join(file)).ok()
    }

    pub(super) fn read_u64(&self, file: &str) -> Option<u64> {
        self.read(file)?.trim().parse().ok()
    }

    pub(super) fn read_flat(&self, file: &str) -> HashMap<String, i64> {
        std::fs::File::open(self.path.join(file))
            .ok()
            .and_then(|f| cgroups_rs::fs::flat_keyed_to_hashmap(f).ok())
            .unwrap_or_default()
    }

    pub(super) fn kill_error(&self, source: io::Error) -> CgroupError {
        CgroupError::Kill { cgroup: self.cgroup.clone(), source }
    }
}

/// Write a control file. Never creates one: a missing file means a
/// missing controller, and cgroupfs can't create files anyway.
pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    std::fs::OpenOptions::new().write(true).open(path)?.write_all(value.as_bytes())
}

pub(super) fn read_pids(procs: &Path) -> io::Result<Vec<i32>> {
    Ok(std::fs::read_to_string(procs)?.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// What a job used, as its cgroups counted it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub cpu_user: Duration,
    pub cpu_sys: Duration,
    pub memory_peak: Option<u64>,
    /// Peak number of tasks, init stages included.
    pub pids_peak: Option<u64>,
    /// OOM kills in the cgroup; `None` when the kernel does not count them.
    pub oom_kills: Option<u64>,
    /// v1: times the memory limit was hit.
    pub memory_failcnt: u64,
}

impl Stats {
    /// Whether the cgroup's OOM killer fired. `sigkilled` (the job died of
    /// SIGKILL) is only consulted on kernels without an `oom_kill` counter,
    /// together with the limit's failure counter: never a guess from the
    /// signal alone.
    pub fn oom_killed(&self, sigkilled: bool) -> bool {
        match self.oom_kills {
            Some(n) => n > 0,
            None => sigkilled && self.memory_failcnt > 0,
        }
    }
}

/// The cgroups of one job. Dropping it kills the tree and removes them;
/// [`JobCgroup::remove`] does the same without blocking.
#[derive(Debug)]
pub struct JobCgroup {
    pub(super) name: String,
    pub(super) dirs: Vec<JobDir>,
    /// The `confine/` directories, removed when the last job leaves them.
    pub(super) bases: Vec<PathBuf>,
    pub(super) kill: KillMode,
    ops: FsOps,
    /// Highest `pids.current` seen, where the kernel has no `pids.peak`.
    tracked_pids: AtomicU64,
    done: bool,
}

impl JobCgroup {
    /// Set `limits` on the cgroups (those made for them by
    /// [`super::Cgroups::create_unlimited`]).
    pub fn apply_limits(&self, limits: &Limits) -> Result<(), CgroupError> {
        apply_limits(self, limits)
    }

    /// Weigh the job's CPU time against its siblings' as a background
    /// task's (a warm sandbox being built: nice 10 does not reach across
    /// cgroups, whose weights the scheduler shares the CPU by first), or
    /// as any job's again. Only where the job has the cpu controller;
    /// elsewhere its processes are weighed in their parent's cgroup.
    pub fn set_background(&self, background: bool) -> Result<(), CgroupError> {
        for dir in self.dirs.iter().filter(|d| d.has("cpu")) {
            match dir.version {
                Version::V1 => v1::set_weight(dir, background)?,
                Version::V2 => v2::set_weight(dir, background)?,
            }
        }
        Ok(())
    }

    pub(super) fn new(name: String, ops: FsOps) -> JobCgroup {
        JobCgroup {
            name,
            dirs: Vec::new(),
            bases: Vec::new(),
            kill: KillMode::Members,
            ops,
            tracked_pids: AtomicU64::new(0),
            done: false,
        }
    }

    /// Directory name: `<job-id>.<owner pid>.<owner start>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The files the init stage writes "0" to, joining the job's cgroups.
    ///
    /// v1: `tasks`, which moves only the writing thread — the whole init
    /// stage, since it is single-threaded — and so, on recent kernels,
    /// skips the global threadgroup lock whose write side waits for an RCU
    /// grace period (docs/benchmarks.md, "Figures once in the code"). v2:
    /// `cgroup.procs`, the only way between domain cgroups (one grace
    /// period per spawn; `clone3(CLONE_INTO_CGROUP)` would avoid it).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|d| match d.version {
                Version::V1 => d.path.join("tasks"),
                Version::V2 => d.path.join("cgroup.procs"),
            })
            .collect()
    }

    /// Host directories of the job's cgroups.
    pub fn paths(&self) -> Vec<&Path> {
        self.dirs.iter().map(|d| d.path.as_path()).collect()
    }

    /// For `Layers::cgroup`, the hierarchies and how the tree is killed:
    /// `v2` (`cgroup.kill`), `v2-freeze` (a kernel before `cgroup.kill`:
    /// freeze, SIGKILL, thaw), `v1` (the v1 freezer), `v1-signal` (no
    /// freezer: SIGKILL of what the cgroup lists), `v1+unified-kill`.
    pub fn layer(&self) -> &'static str {
        let v1 = self.dirs.iter().any(|d| d.version == Version::V1);
        let cgroup_kill = |i: usize| self.dirs[i].path.join("cgroup.kill").exists();
        match (v1, self.kill) {
            (false, KillMode::V2(i)) if cgroup_kill(i) => "v2",
            (false, _) => "v2-freeze",
            (true, KillMode::V2(i)) if cgroup_kill(i) => "v1+unified-kill",
            (true, KillMode::Members) => "v1-signal",
            (true, _) => "v1",
        }
    }

    /// Kill every process of the job, wherever it moved in its tree.
    pub fn kill_tree(&self) -> Result<(), CgroupError> {
        match self.kill {
            KillMode::V2(i) => v2::kill(&self.dirs[i]),
            KillMode::Freezer(i) => v1::freeze_kill_thaw(&self.dirs[i]),
            KillMode::Members => self.dirs.iter().try_for_each(v1::kill_members),
        }
    }

    /// Everything the cgroups counted.
    pub fn stats(&self) -> Stats {
        let mut stats = Stats::default();
        for dir in &self.dirs {
            match dir.version {
                Version::V1 => v1::read_stats(dir, &mut stats),
                Version::V2 => v2::read_stats(dir, &mut stats),
            }
        }
        let tracked = self.tracked_pids.load(Ordering::Relaxed);
        if stats.pids_peak.is_none() && tracked > 0 {
            stats.pids_peak = Some(tracked);
        }
        // The job's own processes: confine's init stages are not the user's.
        let ours = self.dirs.iter().find(|d| d.has("pids")).map_or(0, |d| init_processes(d.version));
        stats.pids_peak = stats.pids_peak.map(|p| p.saturating_sub(ours));
        stats
    }

    /// CPU time of the whole tree so far.
    pub fn cpu_usage(&self) -> Option<Duration> {
        let v2 = self.dirs.iter().find(|d| d.version == Version::V2).and_then(v2::cpu_usage);
        v2.or_else(|| self.dirs.iter().find(|d| d.has("cpuacct")).and_then(v1::cpu_usage))
    }

    /// Whether the pids peak must be sampled (no `pids.peak` file).
    pub fn tracks_pids(&self) -> bool {
        self.dirs.iter().any(|d| d.has("pids") && !d.path.join("pids.peak").exists())
    }

    /// Record the current number of tasks, for kernels without `pids.peak`.
    pub fn sample_pids(&self) {
        if let Some(n) = self.dirs.iter().find(|d| d.has("pids")).and_then(|d| d.read_u64("pids.current")) {
            self.tracked_pids.fetch_max(n, Ordering::Relaxed);
        }
    }

    /// One pass of rmdir. `Ok(true)` when everything is gone.
    fn try_remove(&mut self) -> Result<bool, CgroupError> {
        let mut all = true;
        for dir in self.dirs.iter_mut().filter(|d| !d.removed) {
            match (self.ops.rmdir)(&dir.path) {
                Ok(()) => dir.removed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => dir.removed = true,
                // Tasks still exiting, or (v1) the kernel still tearing down.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => all = false,
                Err(source) => return Err(CgroupError::Remove { cgroup: dir.cgroup.clone(), source }),
            }
        }
        if all {
            // Shared with concurrent supervisors: fails while they use it.
            for base in &self.bases {
                let _ = (self.ops.rmdir)(base);
            }
        }
        Ok(all)
    }

    fn busy_error(&self) -> CgroupError {
        let cgroup = self.dirs.iter().find(|d| !d.removed).map(|d| d.cgroup.clone()).unwrap_or_default();
        CgroupError::Remove { cgroup, source: io::Error::from_raw_os_error(libc::EBUSY) }
    }

    /// Kill what is left and remove the cgroups, waiting (without blocking
    /// the runtime) for the kernel to let go of them.
    pub async fn remove(mut self) -> Result<(), CgroupError> {
        let start = Instant::now();
        let mut result = Ok(());
        for round in 0u32.. {
            match self.try_remove() {
                Ok(true) => break,
                Ok(false) if start.elapsed() < REMOVE_WAIT => {
                    if round % 16 == 0 {
                        let _ = self.kill_tree();
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Ok(false) => {
                    result = Err(self.busy_error());
                    break;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.done = true;
        result
    }

    /// [`JobCgroup::remove`] for callers outside async code.
    pub fn remove_blocking(mut self) -> Result<(), CgroupError> {
        let result = self.remove_sync();
        self.done = true;
        result
    }

    fn remove_sync(&mut self) -> Result<(), CgroupError> {
        let start = Instant::now();
        let _ = self.kill_tree();
        for round in 1u32.. {
            if self.try_remove()? {
                return Ok(());
            }
            if start.elapsed() >= REMOVE_WAIT {
                return Err(self.busy_error());
            }
            if round % 16 == 0 {
                let _ = self.kill_tree();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

impl Drop for JobCgroup {
    fn drop(&mut self) {
        if !self.done && !self.dirs.is_empty() {
            if let Err(e) = self.remove_sync() {
                tracing::warn!(error = %e, "job cgroup left behind");
            }
        }
    }
}
