//! The cwd jail: a request's `relativeCwd` becomes a real directory inside
//! the repository root, or a denial that says why.
//!
//! Resolution uses realpath, so symlinks are followed and then checked: a
//! path that leaves the root by any route is refused. Error texts name the
//! path as the caller gave it, never where a symlink pointed on the host.

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
    let root = std::fs::canonicalize(root).map_err(|e| CwdError::Root(e.kind().to_string()))?;
    if !root.is_dir() {
        return Err(CwdError::Root("not a directory".into()));
    }
    let host = match std::fs::canonicalize(root.join(p)) {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A dangling symlink whose target is outside is an escape, not a typo.
            return Err(if escapes_via_link(&root, p) {
                CwdError::Escapes(rel.into())
            } else {
                CwdError::NotFound(rel.into())
            });
        }
        Err(_) => return Err(CwdError::NotFound(rel.into())),
    };
    let Ok(relative) = host.strip_prefix(&root).map(Path::to_path_buf) else {
        return Err(CwdError::Escapes(rel.into()));
    };
    if !host.is_dir() {
        return Err(CwdError::NotADirectory(rel.into()));
    }
    Ok(JailedCwd { root, host, relative })
}

/// Whether a symlink on the way to `rel` points outside `root`.
fn escapes_via_link(root: &Path, rel: &Path) -> bool {
    let mut at = root.to_path_buf();
    for c in rel.components() {
        at.push(c);
        if let Ok(target) = std::fs::read_link(&at) {
            let resolved = at.parent().map(|d| d.join(&target)).unwrap_or(target);
            let mut norm = PathBuf::new();
            for part in resolved.components() {
                match part {
                    Component::ParentDir => {
                        norm.pop();
                    }
                    Component::CurDir => {}
                    other => norm.push(other),
                }
            }
            return !norm.starts_with(root);
        }
    }
    false
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

    #[test]
    fn missing_files_and_bad_roots_are_named() {
        let (t, root) = repo();
        assert_eq!(jail(&root, Some("nope")), Err(CwdError::NotFound("nope".into())));
        assert_eq!(jail(&root, Some("README")), Err(CwdError::NotADirectory("README".into())));
        assert_eq!(jail(&root, Some("a\0b")), Err(CwdError::Nul));
        assert!(matches!(jail(&t.path().join("none"), None), Err(CwdError::Root(_))));
    }
}
