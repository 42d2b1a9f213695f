//! The cwd jail: a request's `relativeCwd` becomes a real directory inside
//! the repository root, or a denial that says why.
//!
//! The root is opened once and the directory is resolved from its fd by
//! the kernel, `openat2(RESOLVE_BENEATH)`: a symlink that stays inside is
//! followed, one that leaves (absolute, or `..` past the root) is refused,
//! and a rename racing the lookup can't carry it out. Nothing is opened
//! but directories (`O_PATH`), so a FIFO can't block it. Where `openat2` is
//! missing, every component is opened `O_NOFOLLOW` and any symlink is
//! refused. The relative path handed to the sandbox is what the kernel
//! says the opened directory is. Error texts name the path as the caller
//! gave it, never where a symlink pointed on the host.

use std::path::{Component, Path, PathBuf};

/// Why a working directory was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CwdError {
    #[error("relativeCwd '{0}' is absolute; give a path relative to the repository root")]
    Absolute(String),
    #[error("relativeCwd '{0}' contains '..'; give a path inside the repository")]
    ParentDir(String),
    #[error("relativeCwd '{0}' leads outside the repository (through a symlink)")]
    Escapes(String),
    /// Only without openat2 (Linux before 5.6, or filtered): no symlink is followed.
    #[error(
        "relativeCwd '{0}' passes through a symlink, which this host can't follow safely; give the real directory"
    )]
    Symlink(String),
    #[error("relativeCwd '{0}' does not exist in the repository")]
    NotFound(String),
    #[error("relativeCwd '{0}' is not a directory")]
    NotADirectory(String),
    #[error("relativeCwd contains a NUL byte")]
    Nul,
    #[error("the repository root is unavailable: {0} (check [[repos]] in confine.toml)")]
    Root(String),
}

/// A working directory that was checked to be inside its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailedCwd {
    /// The real repository root.
    pub root: PathBuf,
    /// The real working directory on the host (under `root`).
    pub host: PathBuf,
    /// The working directory relative to `root` (empty for the root).
    pub relative: PathBuf,
}

impl JailedCwd {
    /// Where the directory is inside a sandbox that mounts the root at `mount`.
    pub fn in_sandbox(&self, mount: &Path) -> PathBuf {
        mount.join(&self.relative)
    }
}

/// Resolve `relative` (default ".") inside `root`.
pub fn jail(root: &Path, relative: Option<&str>) -> Result<JailedCwd, CwdError> {
    let rel = relative.unwrap_or(".");
    if rel.contains('\0') {
        return Err(CwdError::Nul);
    }
    let p = Path::new(rel);
    if p.is_absolute() {
        return Err(CwdError::Absolute(rel.into()));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(CwdError::ParentDir(rel.into()));
    }
    let dir = crate::dirfd::Dir::open(root).map_err(|e| CwdError::Root(crate::dirfd::reason(&e)))?;
    let root = match dir.current_path() {
        Some(real) => real,
        None => std::fs::canonicalize(root).map_err(|e| CwdError::Root(crate::dirfd::reason(&e)))?,
    };
    if crate::dirfd::components(p).is_none() {
        // "." (or "./"): the root itself.
        return Ok(JailedCwd { host: root.clone(), root, relative: PathBuf::new() });
    }
    let host = match dir.dir_beneath(p) {
        Ok(d) => match d.current_path() {
            Some(h) => h,
            // No /proc/self/fd off Linux: the kernel checked the way in;
            // realpath names it.
            None => std::fs::canonicalize(root.join(p)).map_err(|_| CwdError::NotFound(rel.into()))?,
        },
        Err(e) => return Err(refusal(&e, rel)),
    };
    let Ok(relative) = host.strip_prefix(&root).map(Path::to_path_buf) else {
        return Err(CwdError::Escapes(rel.into()));
    };
    Ok(JailedCwd { root, host, relative })
}

/// Why the kernel refused to open `rel` below the root.
fn refusal(e: &std::io::Error, rel: &str) -> CwdError {
    #[cfg(unix)]
    match e.raw_os_error() {
        // RESOLVE_BENEATH: the way leaves the root (a dangling absolute
        // symlink too: its target can't be checked).
        Some(libc::EXDEV) => return CwdError::Escapes(rel.into()),
        // The walk without openat2 refuses every symlink.
        Some(libc::ELOOP) => return CwdError::Symlink(rel.into()),
        _ => {}
    }
    match e.kind() {
        std::io::ErrorKind::NotADirectory => CwdError::NotADirectory(rel.into()),
        _ if crate::dirfd::is_symlink_error(e) => CwdError::Symlink(rel.into()),
        _ => CwdError::NotFound(rel.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn repo() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("repo");
        std::fs::create_dir_all(root.join("src/app")).unwrap();
        std::fs::write(root.join("README"), "").unwrap();
        std::fs::create_dir_all(t.path().join("secret")).unwrap();
        (t, root)
    }

    #[test]
    fn a_path_inside_resolves_to_the_real_directory() {
        let (_t, root) = repo();
        let j = jail(&root, Some("src/app")).unwrap();
        assert_eq!(j.relative, PathBuf::from("src/app"));
        assert_eq!(j.host, root.canonicalize().unwrap().join("src/app"));
        assert_eq!(j.in_sandbox(Path::new("/workspace")), PathBuf::from("/workspace/src/app"));
        assert_eq!(jail(&root, None).unwrap().relative, PathBuf::new());
        assert_eq!(jail(&root, Some("./src/")).unwrap().relative, PathBuf::from("src"));
    }

    #[test]
    fn dot_dot_is_refused_even_when_it_would_stay_inside() {
        let (_t, root) = repo();
        assert_eq!(jail(&root, Some("../secret")), Err(CwdError::ParentDir("../secret".into())));
        assert_eq!(jail(&root, Some("src/../src")), Err(CwdError::ParentDir("src/../src".into())));
    }

    #[test]
    fn absolute_paths_are_refused() {
        let (_t, root) = repo();
        let err = jail(&root, Some("/etc")).unwrap_err();
        assert_eq!(err.to_string(), "relativeCwd '/etc' is absolute; give a path relative to the repository root");
    }

    #[test]
    fn a_symlink_leading_out_is_refused_without_naming_its_target() {
        let (t, root) = repo();
        symlink(t.path().join("secret"), root.join("out")).unwrap();
        symlink("../../secret", root.join("src/rel")).unwrap();
        symlink(t.path().join("gone"), root.join("dangling")).unwrap();
        for rel in ["out", "src/rel", "dangling"] {
            let err = jail(&root, Some(rel)).unwrap_err();
            assert_eq!(err, CwdError::Escapes(rel.into()), "{rel}");
            assert!(!err.to_string().contains("secret"), "{err}");
        }
        // A symlink that stays inside is fine.
        symlink("src/app", root.join("app")).unwrap();
        assert_eq!(jail(&root, Some("app")).unwrap().relative, PathBuf::from("src/app"));
    }

    /// Only directories are opened (`O_PATH | O_DIRECTORY`): a FIFO in the
    /// way is "not a directory" at once, and a directory symlinked from
    /// inside, or reached through `..`-free links, is where the kernel
    /// says it is.
    #[test]
    fn a_fifo_is_not_a_directory_and_never_blocks() {
        let (_t, root) = repo();
        let c = std::ffi::CString::new(root.join("pipe").to_str().unwrap()).unwrap();
        // SAFETY: c is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        assert_eq!(jail(&root, Some("pipe")), Err(CwdError::NotADirectory("pipe".into())));
        symlink("app", root.join("src/again")).unwrap();
        assert_eq!(jail(&root, Some("src/again/")).unwrap().relative, PathBuf::from("src/app"));
    }

    #[test]
    fn missing_files_and_bad_roots_are_named() {
        let (t, root) = repo();
        assert_eq!(jail(&root, Some("nope")), Err(CwdError::NotFound("nope".into())));
        assert_eq!(jail(&root, Some("README")), Err(CwdError::NotADirectory("README".into())));
        assert_eq!(jail(&root, Some("a\0b")), Err(CwdError::Nul));
        assert!(matches!(jail(&t.path().join("none"), None), Err(CwdError::Root(_))));
    }
}
