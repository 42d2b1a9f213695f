//! Where executables may come from: the trusted locations of a host.
//!
//! A job with a read-write workspace can write anything in its repository,
//! and a repository can arrive with anything in it; the supervisor binds
//! what it resolves into the next job, as root. So an executable (and a
//! `#!` interpreter) is taken only from:
//!
//! - a directory of the supervisor's PATH that is absolute, not inside a
//!   configured repository (nor reached through a symlink into one), and
//!   not writable by group or others (anyone could plant a name there);
//! - a system directory the sandbox binds anyway (`/usr`, `/bin`, …).
//!
//! and its real path (symlinks followed: these locations are the
//! operator's) must not be inside a repository either. This module reads
//! metadata only; it opens no file.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// The trusted locations of one host, worked out once per resolution.
#[derive(Debug, Clone)]
pub(crate) struct Trust {
    /// Trusted PATH directories: as written in PATH (argv[0] and the
    /// sandbox's PATH keep that spelling) and canonical.
    dirs: Vec<(PathBuf, PathBuf)>,
    /// System directories (canonical where they exist).
    system: Vec<PathBuf>,
    /// Canonical repository roots.
    repos: Vec<PathBuf>,
}

/// Why a path is not a trusted executable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Untrusted {
    /// It, or what it resolves to, is inside a configured repository.
    InRepository,
    /// It is not in a trusted PATH directory or a system directory.
    NotOnPath,
    /// A relative path with a '/', or a `..`.
    NotAbsolute,
}

impl Untrusted {
    /// The reason, for the caller (no host path beyond what it gave).
    pub fn reason(self) -> &'static str {
        match self {
            Untrusted::InRepository => {
                "it is inside a repository; executables come only from the supervisor's PATH and system \
                 directories, never from a repository (name an installed one, e.g. python3)"
            }
            Untrusted::NotOnPath => {
                "it is not in a directory of the supervisor's PATH or a system directory; name it (it is \
                 looked up on PATH) or give its path in one of those directories"
            }
            Untrusted::NotAbsolute => "give a name looked up on PATH or an absolute path without '..'",
        }
    }
}

impl Trust {
    /// The trusted locations for `path` (a PATH value), `system` (the
    /// paths every sandbox binds) and `repos` (canonical roots).
    pub fn new(path: &OsStr, system: &[PathBuf], repos: &[PathBuf]) -> Trust {
        let repos: Vec<PathBuf> = repos.to_vec();
        let system = system.iter().map(|s| std::fs::canonicalize(s).unwrap_or_else(|_| s.clone())).collect();
        let mut dirs: Vec<(PathBuf, PathBuf)> = Vec::new();
        for dir in std::env::split_paths(path) {
            // Relative entries name the supervisor's cwd: never trusted.
            if !dir.is_absolute() || dir.components().any(|c| c == Component::ParentDir) {
                continue;
            }
            let Ok(real) = std::fs::canonicalize(&dir) else { continue };
            if inside_any(&dir, &repos) || inside_any(&real, &repos) || !is_safe_dir(&real) {
                tracing::debug!(dir = %dir.display(), "PATH entry not trusted for toolchains");
                continue;
            }
            if !dirs.iter().any(|(d, _)| *d == dir) {
                dirs.push((dir, real));
            }
        }
        Trust { dirs, system, repos }
    }

    /// Whether `real` (canonical) is inside, or is, a repository root.
    pub fn in_repository(&self, real: &Path) -> bool {
        inside_any(real, &self.repos)
    }

    /// Whether `dir` is a repository root, inside one, or holds one.
    pub fn touches_repository(&self, dir: &Path) -> bool {
        self.repos.iter().any(|r| r.starts_with(dir) || dir.starts_with(r))
    }

    /// Whether canonical `dir` is one of the trusted PATH directories.
    pub fn is_path_dir(&self, dir: &Path) -> bool {
        self.dirs.iter().any(|(_, real)| real == dir)
    }

    /// Look `name` up: a bare name in the trusted PATH directories, in
    /// order; an absolute path only when it is in one of them or in a
    /// system directory. `Ok(None)`: no such executable (not installed).
    /// `alt_path` (from `env -P`) narrows the search to those of its
    /// directories that are trusted.
    pub fn lookup(&self, name: &str, alt_path: Option<&OsStr>) -> Result<Option<PathBuf>, Untrusted> {
        if name.contains('/') {
            let p = Path::new(name);
            if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
                return Err(Untrusted::NotAbsolute);
            }
            return self.check_absolute(p).map(|()| Some(p.to_path_buf()).filter(|p| is_executable_file(p)));
        }
        let alt: Option<Vec<PathBuf>> = alt_path
            .map(|a| std::env::split_paths(a).filter_map(|d| std::fs::canonicalize(d).ok()).collect::<Vec<_>>());
        let mut in_repo = false;
        for (dir, real) in &self.dirs {
            if alt.as_ref().is_some_and(|alt| !alt.contains(real)) {
                continue;
            }
            let candidate = dir.join(name);
            if !is_executable_file(&candidate) {
                continue;
            }
            // A symlink in a trusted directory that leads into a repository
            // is passed over: what it names could have been planted.
            match std::fs::canonicalize(&candidate) {
                Ok(target) if !self.in_repository(&target) => return Ok(Some(candidate)),
                _ => in_repo = true,
            }
        }
        if in_repo {
            return Err(Untrusted::InRepository);
        }
        Ok(None)
    }

    /// An absolute path is trusted when its directory is a trusted PATH
    /// directory or inside a system directory, and neither it nor what it
    /// resolves to is inside a repository.
    pub fn check_absolute(&self, p: &Path) -> Result<(), Untrusted> {
        if inside_any(p, &self.repos) {
            return Err(Untrusted::InRepository);
        }
        let Some(parent) = p.parent() else { return Err(Untrusted::NotOnPath) };
        let Ok(dir) = std::fs::canonicalize(parent) else { return Err(Untrusted::NotOnPath) };
        if self.in_repository(&dir) {
            return Err(Untrusted::InRepository);
        }
        if !(self.is_path_dir(&dir) || inside_any(&dir, &self.system)) {
            return Err(Untrusted::NotOnPath);
        }
        match std::fs::canonicalize(p) {
            Ok(real) if self.in_repository(&real) => Err(Untrusted::InRepository),
            // Missing: the caller reports "not installed".
            _ => Ok(()),
        }
    }
}

/// Whether `p` is one of `roots` or inside one (component-wise).
fn inside_any(p: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| p.starts_with(r))
}

/// A directory nobody but its owner can write (a sticky world-writable
/// directory such as /tmp is refused too: anyone can add a name to it).
#[cfg(unix)]
fn is_safe_dir(real: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(real).is_ok_and(|m| m.is_dir() && m.permissions().mode() & 0o022 == 0)
}

#[cfg(not(unix))]
fn is_safe_dir(real: &Path) -> bool {
    real.is_dir()
}

/// A regular file with an execute bit (any regular file off Unix).
pub(crate) fn is_executable_file(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        std::fs::metadata(p).is_ok_and(|m| m.is_file())
    }
}

/// Canonical repository roots, for [`super::Host::with_repos`]: a root
/// that does not resolve is kept as written (it still names a place no
/// toolchain may come from).
pub(crate) fn canonical_roots<'a>(roots: impl IntoIterator<Item = &'a Path>) -> Vec<PathBuf> {
    roots.into_iter().map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.to_path_buf())).collect()
}
