//! Where the cgroup hierarchies are and where we sit in each: parsed from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`, as plain data.
//!
//! This module reads two text files and never writes anything. The texts
//! are parameters (see [`Layout::parse`]) so every layout — pure v1, pure
//! v2, hybrid, a container whose cgroup mount starts below the real root —
//! is tested without the kernel.

use std::path::{Component, Path, PathBuf};

/// The two cgroup APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// How the host mounts its hierarchies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    /// Only v1 controller hierarchies.
    V1,
    /// One unified v2 hierarchy (modern distros).
    V2,
    /// v1 controllers plus a v2 hierarchy, usually at /sys/fs/cgroup/unified
    /// (systemd's "hybrid" mode).
    Hybrid,
}

/// One mounted hierarchy that we are a member of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub version: Version,
    /// v1: the controllers bound to it (`["cpu", "cpuacct"]`, or
    /// `["name=systemd"]` for a named one). v2: empty; see `cgroup.controllers`.
    pub controllers: Vec<String>,
    /// Where it is mounted on the host.
    pub mount_point: PathBuf,
    /// The cgroup the mount shows at `mount_point` (mountinfo field 4):
    /// `/` on a host, a deeper path for a bind-mounted subtree.
    pub mount_root: PathBuf,
    /// Our own cgroup in it, as `/proc/self/cgroup` says.
    pub own: PathBuf,
}

impl Hierarchy {
    /// The host directory of the cgroup `path` of this hierarchy, or `None`
    /// when it lies outside what the mount shows.
    pub fn dir_of(&self, path: &Path) -> Option<PathBuf> {
        let rel = path.strip_prefix(&self.mount_root).ok()?;
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return None;
        }
        Some(self.mount_point.join(rel))
    }

    pub fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    /// A short name for messages: `memory`, `cpu,cpuacct`, `unified`.
    pub fn label(&self) -> String {
        match self.version {
            Version::V2 => "unified".into(),
            Version::V1 => self.controllers.join(","),
        }
    }
}

/// The hierarchies of this process, in mountinfo order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    pub hierarchies: Vec<Hierarchy>,
}

/// One cgroup mount, before we know whether we belong to it.
struct Mount {
    version: Version,
    options: Vec<String>,
    mount_point: PathBuf,
    mount_root: PathBuf,
}

impl Layout {
    /// Read the layout of the calling process from `proc` (normally `/proc`).
    pub fn from_proc(proc: &Path) -> std::io::Result<Layout> {
        let mountinfo = std::fs::read_to_string(proc.join("self/mountinfo"))?;
        let cgroup = std::fs::read_to_string(proc.join("self/cgroup"))?;
        Ok(Layout::parse(&mountinfo, &cgroup))
    }

    /// Match the cgroup mounts of `mountinfo` with the memberships listed
    /// in `self_cgroup`. Hierarchies we are not a member of are left out;
    /// so are mounts that do not show our own cgroup.
    pub fn parse(mountinfo: &str, self_cgroup: &str) -> Layout {
        let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mount).collect();
        let mut hierarchies = Vec::new();
        for line in self_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(list), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
            let own = PathBuf::from(path);
            let (version, controllers): (Version, Vec<String>) = if id == "0" && list.is_empty() {
                (Version::V2, Vec::new())
            } else if list.is_empty() {
                continue;
            } else {
                (Version::V1, list.split(',').map(str::to_string).collect())
            };
            let found = mounts.iter().find(|m| {
                m.version == version
                    && controllers.iter().all(|c| m.options.contains(c))
                    && own.starts_with(&m.mount_root)
            });
            if let Some(m) = found {
                hierarchies.push(Hierarchy {
                    version,
                    controllers,
                    mount_point: m.mount_point.clone(),
                    mount_root: m.mount_root.clone(),
                    own,
                });
            }
        }
        Layout { hierarchies }
    }

    /// A single v2 hierarchy at `root` (tests, and operators who know better).
    pub fn v2_at(root: &Path, own: &Path) -> Layout {
        Layout {
            hierarchies: vec![Hierarchy {
                version: Version::V2,
                controllers: Vec::new(),
                mount_point: root.to_path_buf(),
                mount_root: "/".into(),
                own: own.to_path_buf(),
            }],
        }
    }

    pub fn kind(&self) -> Option<LayoutKind> {
        let v1 = self
            .hierarchies
            .iter()
            .any(|h| h.version == Version::V1 && !h.controllers.iter().all(|c| c.starts_with("name=")));
        let v2 = self.unified().is_some();
        match (v1, v2) {
            (true, true) => Some(LayoutKind::Hybrid),
            (true, false) => Some(LayoutKind::V1),
            (false, true) => Some(LayoutKind::V2),
            (false, false) => None,
        }
    }

    /// The v1 hierarchy `controller` is bound to.
    pub fn v1(&self, controller: &str) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|h| h.version == Version::V1 && h.has(controller))
    }

    /// The v2 hierarchy, when one is mounted.
    pub fn unified(&self) -> Option<&Hierarchy> {
        self.hierarchies.iter().find(|h| h.version == Version::V2)
    }
}

/// One line of mountinfo: `36 25 0:32 / /sys/fs/cgroup/memory rw,… - cgroup cgroup rw,memory`.
fn parse_mount(line: &str) -> Option<Mount> {
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split(' ').collect();
    let mut post = post.split(' ');
    let version = match post.next()? {
        "cgroup" => Version::V1,
        "cgroup2" => Version::V2,
        _ => return None,
    };
    let _source = post.next()?;
    let options = post.next()?.split(',').map(str::to_string).collect();
    Some(Mount {
        version,
        options,
        mount_root: PathBuf::from(unescape(pre.get(3)?)),
        mount_point: PathBuf::from(unescape(pre.get(4)?)),
    })
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|d| (b'0'..=b'7').contains(d)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine (Debian 12, systemd hybrid mode), trimmed.
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "\
9:name=systemd:/
8:pids:/
6:freezer:/
4:memory:/process_api/58a7
2:cpuacct:/
1:cpu:/
0::/
";

    #[test]
    fn hybrid_layout_of_this_machine() {
        let l = Layout::parse(HYBRID_MOUNTS, HYBRID_SELF);
        assert_eq!(l.kind(), Some(LayoutKind::Hybrid));
        let mem = l.v1("memory").unwrap();
        assert_eq!(mem.own, Path::new("/process_api/58a7"));
        assert_eq!(mem.dir_of(&mem.own).unwrap(), Path::new("/sys/fs/cgroup/memory/process_api/58a7"));
        assert_eq!(l.unified().unwrap().mount_point, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(l.v1("pids").unwrap().label(), "pids");
        assert!(l.v1("blkio").is_none(), "not mounted in the sample");
    }

    #[test]
    fn pure_v2_and_co_mounted_v1() {
        let l = Layout::parse(
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
            "0::/system.slice/confine.service\n",
        );
        assert_eq!(l.kind(), Some(LayoutKind::V2));
        let u = l.unified().unwrap();
        assert_eq!(u.dir_of(&u.own).unwrap(), Path::new("/sys/fs/cgroup/system.slice/confine.service"));

        let l = Layout::parse(
            "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
             35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
            "3:memory:/a\n2:cpu,cpuacct:/b\n",
        );
        assert_eq!(l.kind(), Some(LayoutKind::V1));
        assert_eq!(l.v1("cpuacct").unwrap().mount_point, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(std::ptr::eq(l.v1("cpu").unwrap(), l.v1("cpuacct").unwrap()));
    }

    #[test]
    fn container_mount_root_and_escapes() {
        // A container sees its own subtree mounted at /sys/fs/cgroup.
        let l = Layout::parse(
            "700 600 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n\
             701 600 0:27 / /mnt/my\\040cg rw - cgroup2 cgroup2 rw\n",
            "0::/kubepods/pod1/c1\n",
        );
        let u = l.unified().unwrap();
        assert_eq!(u.dir_of(&u.own).unwrap(), Path::new("/sys/fs/cgroup/c1"));
        assert!(u.dir_of(Path::new("/elsewhere")).is_none());
        assert!(u.dir_of(Path::new("/kubepods/pod1/../x")).is_none());
        assert_eq!(unescape("/mnt/my\\040cg"), "/mnt/my cg");
    }

    #[test]
    fn no_cgroups_at_all() {
        let l = Layout::parse("22 1 0:21 / /proc rw - proc proc rw\n", "0::/\n");
        assert_eq!(l.kind(), None);
        assert!(l.hierarchies.is_empty());
    }
}
