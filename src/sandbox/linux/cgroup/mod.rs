//! Job cgroups, v1 and v2: limits (memory, CPU quota, pids), accounting
//! (CPU time, peak memory, pids peak, OOM kills), the whole-tree kill, and
//! cleanup — of each job's cgroups when it ends, of a crashed supervisor's
//! at start.
//!
//! A job's cgroups are `<parent>/confine/<job-id>.<pid>.<start>` in every
//! hierarchy it uses, where `<parent>` is the supervisor's own cgroup of
//! that hierarchy (what a delegated systemd service gets) unless configured,
//! and `<pid>.<start>` names the supervisor that owns it (its pid and start
//! time, so a recycled pid is not mistaken for the owner). The init stage
//! joins them before it creates anything (`InitSpec::cgroup_procs`), so no
//! process of the job ever runs outside.
//!
//! Which hierarchies: the unified v2 one whenever it is mounted (for
//! `cgroup.kill` and `cpu.stat`, which v2 has without any controller);
//! `memory` and `pids` for limits and accounting; `cpu` only for a quota;
//! on v1, `cpuacct` only when there is no v2 `cpu.stat`, and `freezer`
//! only when there is no `cgroup.kill`. Each extra hierarchy costs a mkdir,
//! an rmdir and a `cgroup.procs` write per job, so none is made in vain.
//!
//! Why not cgroups-rs for all of it: `hierarchies::auto()` picks v1 on a
//! hybrid host and never uses the unified `cgroup.kill`; its v2 root is
//! fixed at /sys/fs/cgroup (no fake cgroupfs for tests); it creates a
//! directory in every v1 hierarchy; `Cgroup::kill()` is v2-only and there
//! is no v1 freezer kill nor Drop. We use its flat-keyed file parser.
//!
//! Never: put a job at a hierarchy's root cgroup itself, touch a cgroup
//! whose name we did not make, or remove one whose owner is alive.

mod job;
pub mod layout;
#[cfg(test)]
mod tests;
mod v1;
mod v2;

pub use job::{JobCgroup, Stats};
pub use layout::{Hierarchy, Layout, LayoutKind, Version};

use job::{kill_mode, read_pids, write_file, JobDir};

use crate::job::Limits;
use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// The per-supervisor directory under the parent cgroup.
pub const BASE: &str = "confine";

/// How many of confine's init processes a job's pids cgroup holds. The pids
/// limit the user gives counts the job's own processes, so these are added
/// to `pids.max` and taken from the reported peak. On v1 the outer stage
/// joins (`tasks`) so that pid 1 is born inside: outer and pid 1. On v2
/// pid 1 is placed at birth (clone3 CLONE_INTO_CGROUP, or moved in before
/// it is released on older kernels) and the outer stage never joins.
pub fn init_processes(version: Version) -> u64 {
    match version {
        Version::V1 => 2,
        Version::V2 => 1,
    }
}

/// How long removal waits for the kernel to finish tearing a tree down.
const REMOVE_WAIT: Duration = Duration::from_secs(2);

/// Smallest CFS quota the kernel accepts.
const MIN_QUOTA_US: u64 = 1000;

/// How an unprivileged user gets cgroup limits on this host, naming only
/// ways that work here: their systemd user manager when it is reachable
/// (its bus exists) on a pure v2 host; else a subtree from root, or no
/// limits at all.
pub fn rootless_hint() -> String {
    let uid = nix::unistd::geteuid();
    let runtime = std::env::var_os("XDG_RUNTIME_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| format!("/run/user/{uid}").into());
    let bus = runtime.join("bus");
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "this host's controllers are cgroup v1's, which are not delegated to users: run confine as root for \
         limits, or pass --allow-degraded (rlimits stand in for them)"
            .into()
    } else if bus.exists() {
        "run under a delegated cgroup (systemd-run --user --scope -p Delegate=yes confine …), or pass \
         --allow-degraded (rlimits stand in for the limits)"
            .into()
    } else {
        format!(
            "no systemd user manager is reachable here (no {}); have root give uid {uid} a cgroup v2 subtree \
             (mkdir one under /sys/fs/cgroup and chown it and its cgroup.procs, cgroup.subtree_control and \
             cgroup.threads to {uid}, then start confine from it), or pass --allow-degraded (rlimits stand \
             in for the limits)",
            bus.display()
        )
    }
}

/// Errors of the cgroup layer, each with what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read the cgroup layout from /proc: {0} (is /proc mounted?)")]
    Proc(#[source] io::Error),
    #[error(
        "no cgroup hierarchy is mounted: mount cgroup2 at /sys/fs/cgroup, or pass --allow-degraded to fall back to rlimits"
    )]
    NotMounted,
    #[error(
        "cgroup parent '{0}' (--cgroup-parent or sandbox.cgroup_parent): give an absolute cgroup path \
         without '..', such as /confine.slice"
    )]
    BadParent(String),
    #[error(
        "cgroup parent '{cgroup}' (--cgroup-parent or sandbox.cgroup_parent) does not exist: there is no {dir}; \
         create it (mkdir {dir}) or give an existing cgroup"
    )]
    ParentMissing { cgroup: String, dir: String },
    #[error("job id {0:?} can't name a cgroup: use letters, digits, '-' and '_'")]
    BadName(String),
    #[error("{cgroup} is not visible under the {hierarchy} mount; set --cgroup-parent to a cgroup inside it")]
    NotVisible { hierarchy: String, cgroup: String },
    #[error("no cgroup is delegated to uid {uid}: {hint}")]
    NotDelegated { uid: u32, hint: String },
    #[error("the {controller} controller is not available for jobs ({reason}); {hint}")]
    ControllerMissing { controller: &'static str, reason: String, hint: &'static str },
    #[error(
        "cannot enable the {controllers} controller(s) below {cgroup}: {source}. cgroup v2 hands controllers \
         down only from a cgroup without processes of its own: run confine in a delegated leaf \
         (systemd: Delegate=yes, DelegateSubgroup=supervisor) or set --cgroup-parent to an empty cgroup"
    )]
    Enable { controllers: String, cgroup: String, source: io::Error },
    #[error("cannot create cgroup {cgroup}: {source} (is the cgroup filesystem writable for confine?)")]
    Create { cgroup: String, source: io::Error },
    #[error("cannot set {file} to {value} in cgroup {cgroup}: {source}")]
    Write { cgroup: String, file: &'static str, value: String, source: io::Error },
    #[error("cannot kill the processes of cgroup {cgroup}: {source}")]
    Kill { cgroup: String, source: io::Error },
    #[error("cannot remove cgroup {cgroup}: {source}")]
    Remove { cgroup: String, source: io::Error },
}

/// The two operations whose semantics differ between cgroupfs and a plain
/// directory: the kernel fills a new cgroup with control files and lets
/// rmdir remove them. A parameter so tests run against a fake cgroupfs.
#[derive(Debug, Clone, Copy)]
pub struct FsOps {
    pub mkdir: fn(&Path) -> io::Result<()>,
    pub rmdir: fn(&Path) -> io::Result<()>,
}

fn kernel_mkdir(p: &Path) -> io::Result<()> {
    std::fs::create_dir(p)
}

fn kernel_rmdir(p: &Path) -> io::Result<()> {
    std::fs::remove_dir(p)
}

impl FsOps {
    pub const KERNEL: FsOps = FsOps { mkdir: kernel_mkdir, rmdir: kernel_rmdir };
}

/// Operator settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupConfig {
    /// Parent of `confine/` as a cgroup path (`/confine.slice`), the same in
    /// every hierarchy. `None`: our own cgroup of each hierarchy. `/` puts
    /// jobs under the root, and only when said so.
    pub parent: Option<PathBuf>,
}

/// The supervisor a job cgroup belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22).
    pub start: u64,
}

impl Owner {
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner { pid, start: start_time(pid).unwrap_or(0) }
    }

    /// The process `pid` as it is now (start 0: no such process).
    pub fn of(pid: u32) -> Owner {
        Owner { pid, start: start_time(pid).unwrap_or(0) }
    }

    pub fn dir_name(&self, job_id: &str) -> String {
        format!("{job_id}.{}.{}", self.pid, self.start)
    }

    /// The owner named by a job cgroup's directory name.
    pub fn parse(name: &str) -> Option<Owner> {
        let mut it = name.rsplitn(3, '.');
        let start = it.next()?.parse().ok()?;
        let pid = it.next()?.parse().ok()?;
        let job = it.next()?;
        (!job.is_empty() && valid_name(job)).then_some(Owner { pid, start })
    }

    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // comm (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// True when `limits` ask for something only a cgroup enforces fully.
pub fn limits_need_cgroup(limits: &Limits) -> bool {
    limits.memory_bytes.is_some() || limits.cpus.is_some() || limits.pids.is_some() || limits.cpu_time_ms.is_some()
}

/// The cgroup side of a supervisor: where job cgroups go, and who owns them.
#[derive(Debug)]
pub struct Cgroups {
    layout: Layout,
    parent: Option<PathBuf>,
    owner: Owner,
    ops: FsOps,
    /// Root may use every hierarchy; anyone else only delegated v2 subtrees.
    privileged: bool,
}

static CONFIG: OnceLock<CgroupConfig> = OnceLock::new();
static SUPERVISOR: OnceLock<Cgroups> = OnceLock::new();

/// Set the operator's settings; call before the first job. Returns the
/// config back when it was already set.
pub fn configure(config: CgroupConfig) -> Result<(), CgroupConfig> {
    CONFIG.set(config)
}

/// This process's [`Cgroups`], detected on first use. The first call is
/// "supervisor start": it kills and removes the job cgroups of crashed
/// supervisors. A failed detection is retried by the next call.
pub fn supervisor() -> Result<&'static Cgroups, CgroupError> {
    if let Some(c) = SUPERVISOR.get() {
        return Ok(c);
    }
    let cgroups = Cgroups::detect(CONFIG.get().cloned().unwrap_or_default())?;
    for name in cgroups.cleanup_stale() {
        tracing::info!(cgroup = %name, "removed the cgroup of a crashed supervisor");
    }
    Ok(SUPERVISOR.get_or_init(|| cgroups))
}

/// Whether `error`, from switching controllers on below `dir`, says that
/// `dir` itself is gone (its own file is not there; another supervisor
/// removed an empty `confine/`), rather than that the write was refused
/// with ENOENT, which is a controller the parent does not hand down.
fn gone(dir: &Path, error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::NotFound && !dir.join("cgroup.subtree_control").exists()
}

impl Cgroups {
    /// The hierarchies of this process, from /proc.
    pub fn detect(config: CgroupConfig) -> Result<Cgroups, CgroupError> {
        let layout = Layout::from_proc(Path::new("/proc")).map_err(CgroupError::Proc)?;
        Cgroups::new(layout, config, FsOps::KERNEL)
    }

    pub fn new(layout: Layout, config: CgroupConfig, ops: FsOps) -> Result<Cgroups, CgroupError> {
        if layout.kind().is_none() {
            return Err(CgroupError::NotMounted);
        }
        if let Some(p) = &config.parent {
            if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
                return Err(CgroupError::BadParent(p.display().to_string()));
            }
        }
        let privileged = nix::unistd::geteuid().is_root();
        Ok(Cgroups { layout, parent: config.parent, owner: Owner::current(), ops, privileged })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The parent cgroup in `h`: its cgroup path and host directory.
    fn parent_of(&self, h: &Hierarchy) -> Result<(PathBuf, PathBuf), CgroupError> {
        let path = self.parent.clone().unwrap_or_else(|| h.own.clone());
        let dir = h.dir_of(&path).ok_or_else(|| CgroupError::NotVisible {
            hierarchy: h.label(),
            cgroup: format!("{}:{}", h.label(), path.display()),
        })?;
        Ok((path, dir))
    }

    /// The parent asked for exists in every hierarchy that shows it: one
    /// that does not is the operator's mistake, said as such rather than
    /// as a cgroup that could not be made.
    fn check_parent(&self) -> Result<(), CgroupError> {
        let Some(parent) = &self.parent else { return Ok(()) };
        let used = ["memory", "pids", "cpu", "cpuacct", "freezer"];
        let hierarchies = self.layout.unified().into_iter().chain(used.iter().filter_map(|c| self.layout.v1(c)));
        for h in hierarchies {
            if let Some(dir) = h.dir_of(parent).filter(|d| !d.is_dir()) {
                return Err(CgroupError::ParentMissing {
                    cgroup: parent.display().to_string(),
                    dir: dir.display().to_string(),
                });
            }
        }
        Ok(())
    }

    /// Whether we may create job cgroups in `h`. Without root only a v2
    /// subtree we can write (delegated) is ours; v1 is never delegated.
    fn usable(&self, h: &Hierarchy) -> bool {
        if self.privileged {
            return true;
        }
        use nix::unistd::{access, AccessFlags};
        h.version == Version::V2
            && self.parent_of(h).is_ok_and(|(_, dir)| {
                access(&dir, AccessFlags::W_OK).is_ok() && access(&dir.join("cgroup.procs"), AccessFlags::W_OK).is_ok()
            })
    }

    fn usable_v1(&self, controller: &str) -> Option<&Hierarchy> {
        self.layout.v1(controller).filter(|h| self.usable(h))
    }

    /// Create the cgroups of job `job_id` and apply `limits`. Nothing is
    /// left behind on error.
    pub fn create(&self, job_id: &str, limits: &Limits) -> Result<JobCgroup, CgroupError> {
        let job = self.create_unlimited(job_id, limits)?;
        job.apply_limits(limits)?;
        Ok(job)
    }

    /// Create the cgroups of job `job_id` with the controllers `limits`
    /// need, but none of the limits yet: the caller applies them
    /// ([`JobCgroup::apply_limits`]) before anything of the job runs.
    /// Nothing is left behind on error.
    pub fn create_unlimited(&self, job_id: &str, limits: &Limits) -> Result<JobCgroup, CgroupError> {
        if !valid_name(job_id) {
            return Err(CgroupError::BadName(job_id.into()));
        }
        self.check_parent()?;
        let mut job = JobCgroup::new(self.owner.dir_name(job_id), self.ops);
        let (memory, pids, cpu) = (limits.memory_bytes.is_some(), limits.pids.is_some(), limits.cpus.is_some());
        // v2 first: whether it has cgroup.kill decides if v1 needs a freezer.
        if let Some(h) = self.layout.unified().filter(|h| self.usable(h)) {
            // (controller, required by a limit); memory and pids also serve accounting.
            let wanted: Vec<(&'static str, bool)> = [("memory", memory, true), ("pids", pids, true), ("cpu", cpu, cpu)]
                .into_iter()
                .filter(|(c, _, want)| *want && self.usable_v1(c).is_none())
                .map(|(c, req, _)| (c, req))
                .collect();
            self.add_dir(&mut job, h, &wanted)?;
        }
        let v2_dir = job.dirs.first().map(|d| d.path.clone());
        let v2_kill = v2_dir.as_ref().is_some_and(|d| d.join("cgroup.kill").exists());
        for (c, want) in
            [("memory", true), ("pids", true), ("cpu", cpu), ("cpuacct", v2_dir.is_none()), ("freezer", !v2_kill)]
        {
            let Some(h) = self.usable_v1(c).filter(|_| want) else { continue };
            if !job.dirs.iter().any(|d| d.mount == h.mount_point) {
                self.add_dir(&mut job, h, &[])?;
            }
        }
        if job.dirs.is_empty() {
            return Err(CgroupError::NotDelegated { uid: nix::unistd::geteuid().as_raw(), hint: rootless_hint() });
        }
        for (c, req) in [("memory", memory), ("pids", pids), ("cpu", cpu)] {
            if req && !job.dirs.iter().any(|d| d.has(c)) {
                return Err(CgroupError::ControllerMissing {
                    controller: c,
                    reason: "neither a v1 hierarchy nor the v2 one offers it".into(),
                    hint: "enable it in the kernel or the parent's cgroup.subtree_control, or drop the limit",
                });
            }
        }
        job.kill = kill_mode(&job.dirs);
        Ok(job)
    }

    /// Make `<parent>/confine/<name>` in `h`, switching `controllers` on
    /// along the way on v2. Optional controllers (accounting) that can't
    /// be switched on are left out; required ones are an error.
    fn add_dir(
        &self,
        job: &mut JobCgroup,
        h: &Hierarchy,
        controllers: &[(&'static str, bool)],
    ) -> Result<(), CgroupError> {
        let (path, parent_dir) = self.parent_of(h)?;
        let base = parent_dir.join(BASE);
        let cg_path = path.join(BASE).join(&job.name);
        let display = format!("{}:{}", h.label(), cg_path.display());
        let mut enabled: Vec<&str> = Vec::new();
        if h.version == Version::V2 && !controllers.is_empty() {
            let offered = v2::available(&parent_dir);
            for (c, required) in controllers {
                if offered.iter().any(|o| o == c) {
                    enabled.push(c);
                } else if *required {
                    return Err(CgroupError::ControllerMissing {
                        controller: c,
                        reason: format!("not in cgroup.controllers of {}:{}", h.label(), path.display()),
                        hint: "delegate it to confine's cgroup (systemd: Delegate=yes) or set --cgroup-parent",
                    });
                }
            }
        }
        let required: Vec<&str> = controllers.iter().filter(|(_, r)| *r).map(|(c, _)| *c).collect();
        let enable = |dir: &Path, enabled: &mut Vec<&str>| -> Result<(), CgroupError> {
            if enabled.is_empty() {
                return Ok(());
            }
            match v2::enable(dir, enabled) {
                Ok(()) => Ok(()),
                Err(source) if gone(dir, &source) || !required.is_empty() => Err(CgroupError::Enable {
                    controllers: enabled.join(","),
                    cgroup: format!("{}:{}", h.label(), path.display()),
                    source,
                }),
                Err(e) => {
                    tracing::debug!(error = %e, "cgroup accounting controllers unavailable");
                    enabled.clear();
                    Ok(())
                }
            }
        };
        enable(&parent_dir, &mut enabled)?;
        let dir = base.join(&job.name);
        // Another supervisor may remove an empty `confine/` between our
        // mkdir of it and of the job's own, or before its controllers are
        // switched on; then make it again.
        let mut attempts = 0;
        loop {
            match (self.ops.mkdir)(&base) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(source) => return Err(CgroupError::Create { cgroup: display, source }),
            }
            match enable(&base, &mut enabled) {
                Ok(()) => {}
                Err(CgroupError::Enable { source, .. }) if gone(&base, &source) && attempts < 5 => {
                    attempts += 1;
                    continue;
                }
                Err(e) => return Err(e),
            }
            match (self.ops.mkdir)(&dir) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempts < 5 => attempts += 1,
                Err(source) => return Err(CgroupError::Create { cgroup: display, source }),
            }
        }
        let controllers = match h.version {
            Version::V1 => h.controllers.clone(),
            Version::V2 => enabled.iter().map(|c| c.to_string()).collect(),
        };
        job.bases.push(base);
        job.dirs.push(JobDir {
            version: h.version,
            mount: h.mount_point.clone(),
            cgroup: display,
            path: dir,
            controllers,
            removed: false,
        });
        Ok(())
    }

    /// Kill and remove the job cgroups whose owner is dead. Returns what
    /// was removed. Names we did not make are left alone.
    pub fn cleanup_stale(&self) -> Vec<String> {
        let mut stale: BTreeMap<String, Vec<JobDir>> = BTreeMap::new();
        for h in self.layout.hierarchies.iter().filter(|h| self.usable(h)) {
            let Ok((path, parent_dir)) = self.parent_of(h) else { continue };
            let Ok(entries) = std::fs::read_dir(parent_dir.join(BASE)) else { continue };
            for entry in entries.flatten() {
                let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
                let Some(owner) = Owner::parse(&name) else { continue };
                if owner == self.owner || owner.alive() || !entry.path().is_dir() {
                    continue;
                }
                stale.entry(name.clone()).or_default().push(JobDir {
                    version: h.version,
                    mount: h.mount_point.clone(),
                    cgroup: format!("{}:{}", h.label(), path.join(BASE).join(&name).display()),
                    path: entry.path(),
                    controllers: h.controllers.clone(),
                    removed: false,
                });
            }
        }
        let mut removed = Vec::new();
        for (name, dirs) in stale {
            let mut job = JobCgroup::new(name.clone(), self.ops);
            job.bases = dirs.iter().filter_map(|d| d.path.parent().map(Path::to_path_buf)).collect();
            job.dirs = dirs;
            job.kill = kill_mode(&job.dirs);
            match job.remove_blocking() {
                Ok(()) => removed.push(name),
                Err(e) => tracing::warn!(error = %e, "cannot remove a stale job cgroup"),
            }
        }
        removed
    }
}
