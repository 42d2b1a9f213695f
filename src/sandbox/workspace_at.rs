//! Where the workspace is mounted inside the sandbox: `/workspace` (the
//! default), its own host path (`host`, as `docker run -v "$PWD:$PWD" -w
//! "$PWD"` users do, so that what holds the checkout's absolute path, a
//! virtualenv's scripts, an editable install, `compile_commands.json`,
//! works inside), or another absolute path.
//!
//! Pure: it decides a destination and refuses one that would hide or
//! replace the sandbox's own layout. It touches no file.

use std::path::{Path, PathBuf};

/// The workspace's mount point when nothing else is asked for.
pub const DEFAULT: &str = "/workspace";

/// Where the user asked for the workspace (`--workspace-at`,
/// `workspace_at` of a `[[repos]]` entry).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum WorkspaceAt {
    /// `/workspace`.
    #[default]
    Default,
    /// The workspace's real path on the host.
    Host,
    /// An absolute path of the user's choosing.
    Path(PathBuf),
}

/// Why the workspace can't be mounted where asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspaceAtError {
    #[error("'{0}': give `host`, `/workspace`, or an absolute path without '.' or '..'")]
    Malformed(String),
    #[error("{at}: {why}; mount the workspace elsewhere (--workspace-at /workspace, or a path such as /src/project)")]
    Collides { at: PathBuf, why: &'static str },
}

impl std::str::FromStr for WorkspaceAt {
    type Err = WorkspaceAtError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "host" {
            return Ok(WorkspaceAt::Host);
        }
        let p = Path::new(s);
        // Checked on the text: `Path::components` drops a `.` in the middle.
        let normal = s.split('/').all(|name| name != "." && name != "..");
        if !p.is_absolute() || !normal {
            return Err(WorkspaceAtError::Malformed(s.to_string()));
        }
        let p: PathBuf = p.components().collect();
        if p == Path::new(DEFAULT) {
            return Ok(WorkspaceAt::Default);
        }
        check(&p)?;
        Ok(WorkspaceAt::Path(p))
    }
}

impl std::fmt::Display for WorkspaceAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkspaceAt::Default => f.write_str(DEFAULT),
            WorkspaceAt::Host => f.write_str("host"),
            WorkspaceAt::Path(p) => write!(f, "{}", p.display()),
        }
    }
}

impl serde::Serialize for WorkspaceAt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for WorkspaceAt {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl WorkspaceAt {
    /// The mount point inside for the workspace whose real path is
    /// `workspace`, or why it can't be there.
    pub fn resolve(&self, workspace: &Path) -> Result<PathBuf, WorkspaceAtError> {
        match self {
            WorkspaceAt::Default => Ok(PathBuf::from(DEFAULT)),
            WorkspaceAt::Path(p) => Ok(p.clone()),
            WorkspaceAt::Host => {
                let p: PathBuf = workspace.components().collect();
                check(&p)?;
                Ok(p)
            }
        }
    }
}

/// Paths the sandbox makes for each job: nothing of the user's goes there.
const OWN: &[(&str, &str)] = &[("/proc", "/proc is made for each job"), ("/dev", "/dev is made for each job")];

/// Paths a workspace can't replace, though it may be mounted below them:
/// the private /tmp and the system directories bound from the host (the
/// Linux sandbox's `mounts::SYSTEM_PATHS`, which a test holds equal).
pub const NOT_REPLACED: &[&str] = &["/tmp", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc"];

/// Refuse a mount point that would replace the sandbox's root, one of its
/// own trees, or a system directory as a whole. Below a system directory
/// (`/usr/src/project`) or the private /tmp (`/tmp/ci/checkout`, where a
/// CI or a test's temporary checkout lives) is allowed: it is mounted on
/// top of what is there, after the sandbox's own mounts.
fn check(p: &Path) -> Result<(), WorkspaceAtError> {
    let collides = |why| Err(WorkspaceAtError::Collides { at: p.to_path_buf(), why });
    if p == Path::new("/") {
        return collides("the workspace would replace the sandbox's whole root");
    }
    if let Some((_, why)) = OWN.iter().find(|(own, _)| p.starts_with(own)) {
        return collides(why);
    }
    if NOT_REPLACED.iter().any(|d| p == Path::new(d)) {
        return collides("the workspace would hide that whole directory of the sandbox");
    }
    let source = Path::new(crate::runtimes::plan::SOURCE_DIR);
    if p.starts_with(source) || source.starts_with(p) {
        return collides("code mode writes its source there");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_as_a_user_types_them() {
        assert_eq!("host".parse(), Ok(WorkspaceAt::Host));
        assert_eq!("/workspace".parse(), Ok(WorkspaceAt::Default));
        assert_eq!("/workspace/".parse(), Ok(WorkspaceAt::Default));
        assert_eq!("/src/app".parse(), Ok(WorkspaceAt::Path("/src/app".into())));
        for bad in ["", "rel/path", "/a/../b", "/a/./b", "/a/.", "Host"] {
            assert!(matches!(bad.parse::<WorkspaceAt>(), Err(WorkspaceAtError::Malformed(_))), "{bad}");
        }
    }

    /// The attack: a mount point that hides or replaces what the sandbox
    /// makes for the job.
    #[test]
    fn the_sandbox_layout_is_never_replaced() {
        for own in ["/", "/proc", "/proc/self", "/dev", "/dev/shm", "/tmp", "/usr", "/etc", "/lib64"] {
            let e = own.parse::<WorkspaceAt>();
            assert!(matches!(e, Err(WorkspaceAtError::Collides { .. })), "{own}: {e:?}");
            let e = WorkspaceAt::Host.resolve(Path::new(own));
            assert!(matches!(e, Err(WorkspaceAtError::Collides { .. })), "host {own}: {e:?}");
        }
        for own in ["/tmp/confine-src", "/tmp/confine-src/x"] {
            assert!(matches!(own.parse::<WorkspaceAt>(), Err(WorkspaceAtError::Collides { .. })), "{own}");
        }
        for fine in ["/tmp/ci/checkout", "/usr/src/app", "/home/u/proj", "/root/proj"] {
            assert_eq!(WorkspaceAt::Host.resolve(Path::new(fine)).unwrap(), Path::new(fine));
        }
        let e = "/dev/shm/x".parse::<WorkspaceAt>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/shm/x: /dev is made for each job; mount the workspace elsewhere (--workspace-at /workspace, or a \
             path such as /src/project)"
        );
    }
}
