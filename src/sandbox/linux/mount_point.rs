//! Where a bind lands in the job's root while pid 1 builds it: the mount
//! point of a destination, found as the job will see it and made when it
//! is missing.
//!
//! A destination may lie inside a tree already bound read-only from the
//! host (`--ro-bind /etc/hostname:/etc/hostname`, a workspace at its host
//! path under `/usr/src`): an existing path there is used as it is, never
//! opened for writing. Symbolic links on the way are followed as the job
//! will see them: an absolute one from the job's root, and `..` never
//! above it, so no lookup leaves the root being built. What is missing is
//! made only in the sandbox's own directories: never in a tree bound from
//! the host, read-only (the kernel would refuse) or read-write (the
//! directory would appear on the host). This module must never write
//! outside the staging root's own file systems.

use super::sys::SysError;
use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// The most symbolic links followed for one destination (the kernel's own bound).
const MAX_LINKS: usize = 40;

/// Why a destination has no mount point, in the job's words: every
/// message names the destination as the user gave it.
#[derive(Debug, thiserror::Error)]
pub enum MountPointError {
    #[error(
        "{dst}: not in the sandbox, and {parent} is read-only there (bound from the host): its mount point \
         can't be made without writing to the host; bind to a path that exists there, or outside the host's \
         system directories (for example under /opt or /mnt)"
    )]
    ReadOnly { dst: PathBuf, parent: PathBuf },
    #[error(
        "{dst}: not in the sandbox, and {parent} is {bind}, bound read-write from the host: its mount point \
         would be made on the host; bind it elsewhere"
    )]
    HostTree { dst: PathBuf, parent: PathBuf, bind: PathBuf },
    #[error("{dst}: {what} is not a directory in the sandbox")]
    NotADirectory { dst: PathBuf, what: PathBuf },
    #[error("{dst}: a directory can't be bound over a file (or a file over a directory); the source is {kind}")]
    Kind { dst: PathBuf, kind: &'static str },
    #[error("{dst}: more than {MAX_LINKS} symbolic links on the way")]
    Loop { dst: PathBuf },
    #[error("{dst}: {step} {path}: {source}")]
    Io { dst: PathBuf, step: &'static str, path: PathBuf, source: std::io::Error },
}

impl From<MountPointError> for SysError {
    fn from(e: MountPointError) -> SysError {
        SysError::other("bind", e)
    }
}

/// The mount point of `dst` in the root at `root` (the staging root, in
/// pid 1's own view), with no symbolic link left on it; made if missing,
/// a directory when `dir`, else an empty file. `host_trees`: the mount
/// points (as returned here) of the trees bound read-write from the host
/// so far, where nothing may be made.
pub fn find_or_make(root: &Path, dst: &Path, dir: bool, host_trees: &[PathBuf]) -> Result<PathBuf, MountPointError> {
    let io = |step, path: &Path| {
        let path = path.to_path_buf();
        move |source| MountPointError::Io { dst: dst.to_path_buf(), step, path, source }
    };
    let mut pending: VecDeque<OsString> = names(dst);
    let mut at = root.to_path_buf();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            if at != root {
                at.pop();
            }
            continue;
        }
        let next = at.join(&name);
        let last = pending.is_empty();
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(MountPointError::Loop { dst: dst.into() });
                }
                let target = std::fs::read_link(&next).map_err(io("read link", &next))?;
                if target.is_absolute() {
                    at = root.to_path_buf();
                }
                for n in names(&target).into_iter().rev() {
                    pending.push_front(n);
                }
            }
            Ok(meta) if last => {
                if meta.is_dir() != dir {
                    return Err(MountPointError::Kind {
                        dst: dst.into(),
                        kind: if dir { "a directory" } else { "not a directory" },
                    });
                }
                at = next;
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(MountPointError::NotADirectory { dst: dst.into(), what: shown(root, &next) });
            }
            Ok(_) => at = next,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(bind) = host_trees.iter().find(|t| at.starts_with(t)) {
                    return Err(MountPointError::HostTree {
                        dst: dst.into(),
                        parent: shown(root, &at),
                        bind: shown(root, bind),
                    });
                }
                let made = if last && !dir { touch(&next) } else { mkdir(root, &next, last) };
                match made {
                    Ok(()) => at = next,
                    Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                        return Err(MountPointError::ReadOnly { dst: dst.into(), parent: shown(root, &at) })
                    }
                    Err(e) => return Err(io(if dir || !last { "mkdir" } else { "create" }, &shown(root, &next))(e)),
                }
            }
            Err(e) => return Err(io("stat", &shown(root, &next))(e)),
        }
    }
    Ok(at)
}

/// The names of `path`, `..` kept (resolved against what is already
/// found), `.` and the root left out.
fn names(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// `path` (under `root`) as the job will see it.
fn shown(root: &Path, path: &Path) -> PathBuf {
    Path::new("/").join(path.strip_prefix(root).unwrap_or(path))
}

/// Make the directory `path` under `root`: the mount point itself 0755,
/// one on the way with the permission bits of the host directory at the
/// same path (a 0700 `/root` above a bound `/root/.rustup` stays 0700),
/// or 0700 where the host has none.
fn mkdir(root: &Path, path: &Path, mount_point: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let mode = if mount_point {
        0o755
    } else {
        std::fs::metadata(shown(root, path)).map(|m| m.permissions().mode() & 0o777).unwrap_or(0o700)
    };
    std::fs::DirBuilder::new().mode(mode).create(path)?;
    // The umask may have cut bits the host has.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn touch(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_followed_inside_the_root_and_never_out_of_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        symlink("usr/bin", root.join("bin")).unwrap();
        // Absolute, and `..` past the top: both stay in the root.
        symlink("/usr", root.join("abs")).unwrap();
        symlink("../../../../../usr", root.join("up")).unwrap();
        let found = find_or_make(&root, Path::new("/bin/tool"), false, &[]).unwrap();
        assert_eq!(found, root.join("usr/bin/tool"));
        assert!(root.join("usr/bin/tool").is_file());
        assert_eq!(find_or_make(&root, Path::new("/abs/lib"), true, &[]).unwrap(), root.join("usr/lib"));
        assert_eq!(find_or_make(&root, Path::new("/up/share"), true, &[]).unwrap(), root.join("usr/share"));
        assert!(!t.path().join("usr").exists(), "nothing was made outside the root");
    }

    #[test]
    fn an_existing_destination_is_used_as_it_is() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("etc")).unwrap();
        std::fs::write(t.path().join("etc/hostname"), "host\n").unwrap();
        let found = find_or_make(t.path(), Path::new("/etc/hostname"), false, &[]).unwrap();
        assert_eq!(found, t.path().join("etc/hostname"));
        assert_eq!(std::fs::read_to_string(&found).unwrap(), "host\n");
        let kind = find_or_make(t.path(), Path::new("/etc/hostname"), true, &[]);
        assert!(matches!(kind, Err(MountPointError::Kind { .. })), "{kind:?}");
        let through = find_or_make(t.path(), Path::new("/etc/hostname/x"), true, &[]);
        assert!(matches!(through, Err(MountPointError::NotADirectory { .. })), "{through:?}");
    }

    #[test]
    fn nothing_is_made_in_a_tree_bound_from_the_host() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("data/sub")).unwrap();
        let trees = [t.path().join("data")];
        let e = find_or_make(t.path(), Path::new("/data/sub/new"), true, &trees).unwrap_err();
        assert!(e.to_string().starts_with("/data/sub/new: not in the sandbox, and /data/sub is /data"), "{e}");
        assert!(!t.path().join("data/sub/new").exists());
        // What is there already may be mounted over.
        assert!(find_or_make(t.path(), Path::new("/data/sub"), true, &trees).is_ok());
    }

    #[test]
    fn a_cycle_of_links_ends() {
        let t = tempfile::tempdir().unwrap();
        symlink("b", t.path().join("a")).unwrap();
        symlink("a", t.path().join("b")).unwrap();
        let e = find_or_make(t.path(), Path::new("/a/x"), true, &[]).unwrap_err();
        assert!(matches!(e, MountPointError::Loop { .. }), "{e:?}");
    }
}
