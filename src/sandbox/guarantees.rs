//! What a backend guarantees, row by row, in the words of the README's
//! table: filesystem, network, syscalls, memory, CPU, pids, tree kill and
//! environment scrub, each `enforced`, `partial` or `none` with the
//! mechanism behind it.
//!
//! Pure data. For the Linux backend it is derived from the [`Layers`] that
//! were really in force (an outcome) or that the host can give (doctor,
//! `info`), so a missing cgroup or landlock shows up as a weaker row; the
//! fallback backends have fixed rows per platform. It never probes the host.

use super::BackendKind;
use crate::job::Layers;
use serde::{Deserialize, Serialize};

/// How far a guarantee holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Enforced by the kernel for the whole job tree.
    Enforced,
    /// Some of it: per process instead of per job, or one layer of two.
    Partial,
    /// Not at all.
    #[default]
    None,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Enforced => "enforced",
            Level::Partial => "partial",
            Level::None => "none",
        }
    }
}

/// One row: the level and the mechanism (or what is missing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Guarantee {
    pub level: Level,
    pub how: String,
}

fn row(level: Level, how: impl Into<String>) -> Guarantee {
    Guarantee { level, how: how.into() }
}

/// Every row of the README's table of guarantees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Guarantees {
    pub filesystem: Guarantee,
    pub network: Guarantee,
    pub syscalls: Guarantee,
    pub memory: Guarantee,
    pub cpu: Guarantee,
    pub pids: Guarantee,
    pub tree_kill: Guarantee,
    pub env_scrub: Guarantee,
}

/// Every backend builds the job's environment from nothing.
fn env_scrub() -> Guarantee {
    row(Level::Enforced, "only PATH, a private HOME and TMPDIR, and allowlisted variables reach the job")
}

impl Guarantees {
    /// What `backend` guarantees given the layers in force. Only the Linux
    /// backend reads `layers`; the others have no optional layers.
    pub fn of(backend: BackendKind, layers: &Layers) -> Guarantees {
        match backend {
            BackendKind::Linux => Guarantees::linux(layers),
            BackendKind::UnixFallback => Guarantees::unix_fallback(cfg!(target_os = "linux")),
            BackendKind::Windows => Guarantees::windows(),
        }
    }

    /// The rows with their names, in the README's order.
    pub fn rows(&self) -> [(&'static str, &Guarantee); 8] {
        [
            ("filesystem", &self.filesystem),
            ("network", &self.network),
            ("syscalls", &self.syscalls),
            ("memory", &self.memory),
            ("cpu", &self.cpu),
            ("pids", &self.pids),
            ("treeKill", &self.tree_kill),
            ("envScrub", &self.env_scrub),
        ]
    }

    /// One line per row, `  name  level  how`, for the human outputs.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, g) in self.rows() {
            out.push_str(&format!("  {name:<10}  {:<8}  {}\n", g.level.as_str(), g.how));
        }
        out
    }

    /// The rows that are not enforced, in one line (`none: filesystem,
    /// network; partial: memory`), or `None` when every row is.
    pub fn weaker(&self) -> Option<String> {
        let names = |level: Level| -> Vec<&str> {
            self.rows().into_iter().filter(|(_, g)| g.level == level).map(|(n, _)| n).collect()
        };
        let parts: Vec<String> = [Level::None, Level::Partial]
            .into_iter()
            .map(|l| (l, names(l)))
            .filter(|(_, n)| !n.is_empty())
            .map(|(l, n)| format!("{}: {}", l.as_str(), n.join(", ")))
            .collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    fn linux(l: &Layers) -> Guarantees {
        let landlock = matches!(l.landlock.status.as_str(), "full" | "partial");
        // Unlocked mounts (no user namespace of the job's own) could be
        // undone by a capability regained in the sandbox's: weaker.
        let unlocked = if l.mounts_locked { "" } else { "; its mounts are not locked (no user namespace of its own)" };
        let filesystem = match (l.mountns, landlock) {
            (true, true) => row(
                if l.mounts_locked { Level::Enforced } else { Level::Partial },
                format!(
                    "private read-only root (mount namespace, pivot_root) and landlock ABI {} ({}){unlocked}",
                    l.landlock.abi, l.landlock.status
                ),
            ),
            (true, false) => row(
                Level::Partial,
                format!(
                    "private read-only root (mount namespace); landlock {}{unlocked}",
                    status_or_off(&l.landlock.status)
                ),
            ),
            (false, true) => row(Level::Partial, "landlock only; no private root"),
            (false, false) => row(Level::None, "no mount namespace and no landlock"),
        };
        let network = if l.netns && l.net_proxy {
            row(Level::Enforced, "a new network namespace with only lo; a proxy in confine reaches the allowlist")
        } else if l.netns {
            row(Level::Enforced, "a new network namespace with only lo")
        } else {
            row(Level::None, "the host's network (requested with --net host)")
        };
        let syscalls = match &l.seccomp {
            Some(profile) => row(Level::Enforced, format!("seccomp profile {profile}, no_new_privs")),
            None => row(Level::None, "no seccomp filter"),
        };
        let (memory, cpu, pids) = match &l.cgroup {
            Some(v) => {
                // The hierarchy (`v2`, `v1`), not how its tree is killed.
                let base = v.split(['-', '+']).next().unwrap_or("");
                let cg = if base.is_empty() { "cgroup".to_string() } else { format!("cgroup {base}") };
                (
                    row(Level::Enforced, format!("{cg} memory limit of the whole tree, no swap; OOM reported")),
                    row(Level::Enforced, format!("{cg} CPU quota; CPU time of the whole tree")),
                    row(Level::Enforced, format!("{cg} pids limit of the whole tree")),
                )
            }
            None => (
                row(Level::Partial, "no cgroup: RLIMIT_AS per process stands in"),
                row(Level::Partial, "no cgroup: RLIMIT_CPU per process, no CPU quota"),
                row(Level::Partial, "no cgroup: RLIMIT_NPROC, which counts per user"),
            ),
        };
        // How the cgroup kills (see `cgroup::Job::layer`): at once, or by
        // freezing first so that nothing forks away, or (no freezer) by
        // signalling what it lists, which a fork can outrun.
        let cgroup_kill = l.cgroup.as_deref().map(|v| match v {
            "v2-freeze" | "v1" => ("cgroup freeze, SIGKILL of every member, thaw", true),
            "v1-signal" => ("SIGKILL of what the cgroup lists (no freezer)", false),
            _ => ("cgroup.kill", true),
        });
        let tree_kill = match (l.pidns, cgroup_kill) {
            (true, Some((how, _))) => row(Level::Enforced, format!("{how}, then the pid namespace's teardown")),
            (true, None) => row(Level::Enforced, "the pid namespace's teardown (init is killed)"),
            (false, Some((how, true))) => row(Level::Enforced, how),
            (false, Some((how, false))) => row(Level::Partial, how),
            (false, None) => row(Level::None, "no pid namespace and no cgroup"),
        };
        Guarantees { filesystem, network, syscalls, memory, cpu, pids, tree_kill, env_scrub: env_scrub() }
    }

    /// `on_linux`: Linux has a subreaper, no_new_privs and an enforced
    /// RLIMIT_AS; macOS has none of them.
    pub fn unix_fallback(on_linux: bool) -> Guarantees {
        Guarantees {
            filesystem: row(
                Level::None,
                "no mount namespace or landlock: the host filesystem, with the job user's permissions; \
                 only /tmp and HOME are a private directory",
            ),
            network: row(Level::None, "the host's network (no network namespace)"),
            syscalls: row(
                Level::None,
                if on_linux { "no seccomp filter (no_new_privs only)" } else { "no syscall filter" },
            ),
            memory: if on_linux {
                row(Level::Partial, "RLIMIT_AS per process, not per job")
            } else {
                row(Level::None, "macOS does not enforce RLIMIT_AS")
            },
            cpu: row(Level::Partial, "RLIMIT_CPU per process (CPU time); no CPU quota"),
            pids: row(Level::Partial, "RLIMIT_NPROC, which counts every process of the job's user"),
            tree_kill: if on_linux {
                row(Level::Enforced, "process group, and a child subreaper that finds and kills setsid escapees")
            } else {
                row(Level::Partial, "process group only: a process that calls setsid escapes the kill")
            },
            env_scrub: env_scrub(),
        }
    }

    pub fn windows() -> Guarantees {
        Guarantees {
            filesystem: row(Level::None, "the host filesystem, with the user's permissions"),
            network: row(Level::None, "the host's network"),
            syscalls: row(Level::None, "no syscall filter"),
            memory: row(Level::Enforced, "Job Object memory limit of the whole job"),
            cpu: row(Level::Enforced, "Job Object hard CPU-rate cap and job CPU-time limit"),
            pids: row(Level::Enforced, "Job Object active-process limit"),
            tree_kill: row(
                Level::Enforced,
                "TerminateJobObject; kill on job close; breakaway not allowed; started suspended",
            ),
            env_scrub: row(
                Level::Enforced,
                "only PATH (the system directories), a private HOME, TMPDIR, TEMP and TMP, the variables that \
                 locate Windows (SystemRoot, SystemDrive, windir, ComSpec, PATHEXT), and allowlisted ones",
            ),
        }
    }
}

fn status_or_off(status: &str) -> &str {
    if status.is_empty() {
        "off"
    } else {
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::LandlockLayer;

    fn full_linux() -> Layers {
        Layers {
            userns: true,
            mountns: true,
            pidns: true,
            netns: true,
            ipcns: true,
            utsns: true,
            cgroupns: true,
            landlock: LandlockLayer { abi: 4, status: "full".into(), skipped: Vec::new() },
            seccomp: Some("default".into()),
            cgroup: Some("v2".into()),
            caps_dropped: true,
            no_new_privs: true,
            mounts_locked: true,
            ..Layers::default()
        }
    }

    #[test]
    fn the_full_linux_sandbox_enforces_every_row() {
        let g = Guarantees::of(BackendKind::Linux, &full_linux());
        for (name, row) in g.rows() {
            assert_eq!(row.level, Level::Enforced, "{name}: {}", row.how);
        }
        assert_eq!(g.weaker(), None);
    }

    #[test]
    fn missing_linux_layers_weaken_their_rows_only() {
        let mut l = full_linux();
        l.cgroup = None;
        l.landlock.status = "none".into();
        l.netns = false;
        let g = Guarantees::of(BackendKind::Linux, &l);
        assert_eq!(g.filesystem.level, Level::Partial);
        assert_eq!(g.network.level, Level::None);
        assert_eq!(g.memory.level, Level::Partial);
        assert_eq!(g.pids.level, Level::Partial);
        assert_eq!(g.syscalls.level, Level::Enforced);
        assert_eq!(g.tree_kill.level, Level::Enforced);
    }

    #[test]
    fn unlocked_mounts_weaken_the_filesystem_row() {
        let mut l = full_linux();
        l.mounts_locked = false;
        let g = Guarantees::of(BackendKind::Linux, &l);
        assert_eq!(g.filesystem.level, Level::Partial);
        assert!(g.filesystem.how.contains("not locked"), "{}", g.filesystem.how);
        assert_eq!(g.weaker().as_deref(), Some("partial: filesystem"));
    }

    #[test]
    fn fallbacks_enforce_no_isolation_and_say_what_is_partial() {
        let linux = Guarantees::unix_fallback(true);
        let mac = Guarantees::unix_fallback(false);
        for g in [&linux, &mac, &Guarantees::windows()] {
            assert_eq!(g.filesystem.level, Level::None);
            assert_eq!(g.network.level, Level::None);
            assert_eq!(g.syscalls.level, Level::None);
            assert_eq!(g.env_scrub.level, Level::Enforced);
        }
        assert_eq!(linux.tree_kill.level, Level::Enforced);
        assert_eq!(mac.tree_kill.level, Level::Partial);
        assert!(mac.tree_kill.how.contains("setsid"));
        assert_eq!(mac.memory.level, Level::None);
        assert_eq!(Guarantees::windows().pids.level, Level::Enforced);
        let json = serde_json::to_value(&linux).unwrap();
        assert_eq!(json["treeKill"]["level"], "enforced");
        assert_eq!(json["envScrub"]["level"], "enforced");
        assert_eq!(linux.render().lines().count(), 8);
        assert_eq!(linux.weaker().unwrap(), "none: filesystem, network, syscalls; partial: memory, cpu, pids");
    }
}
