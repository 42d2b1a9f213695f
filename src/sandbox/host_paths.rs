//! Sandbox paths on the host, for the fallback backends that have no mount
//! namespace: `/workspace` is the workspace directory itself and `/tmp` a
//! private per-job directory, removed when the job ends.
//!
//! Pure path arithmetic plus the creation of that one directory. It never
//! resolves a path that leaves the workspace or the private directory.

use crate::job::JobFile;
use std::path::{Component, Path, PathBuf};

/// Where the sandbox's two writable roots are on the host.
#[derive(Debug, Clone)]
pub struct HostLayout {
    /// The private directory that stands in for `/tmp` (and `HOME`).
    pub tmp: PathBuf,
    /// The workspace directory, standing in for `/workspace`.
    pub workspace: Option<PathBuf>,
}

/// Why a sandbox path has no host path, or a job file was not written.
#[derive(Debug, thiserror::Error)]
pub enum HostPathError {
    #[error("{0}: use an absolute path without '..'")]
    NotAbsolute(PathBuf),
    #[error("{0}: without a mount namespace only /tmp and /workspace exist for the job; use a directory under them")]
    Outside(PathBuf),
    #[error("{0}: job files must be under /tmp")]
    FileOutsideTmp(PathBuf),
    #[error("{path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Create the private `/tmp` of a job, readable by its owner only.
pub fn private_tmp(job_id: &str) -> std::io::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("confine-{job_id}"));
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(&dir)?;
    Ok(dir)
}

impl HostLayout {
    /// The host path of `path`, a path inside the sandbox. Only paths under
    /// `/workspace` (with a workspace) and `/tmp` have one.
    pub fn host_path(&self, path: &Path) -> Result<PathBuf, HostPathError> {
        if !path.has_root() || path.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(HostPathError::NotAbsolute(path.to_path_buf()));
        }
        // The workspace at its own host path (`--workspace-at host`): that
        // is where it is, without a mount namespace too.
        if let Some(ws) = self.workspace.as_ref().filter(|ws| path.starts_with(ws)) {
            return Ok(ws.join(path.strip_prefix(ws).unwrap_or(Path::new(""))));
        }
        if let (Some(ws), Ok(rest)) = (&self.workspace, path.strip_prefix("/workspace")) {
            return Ok(if rest.as_os_str().is_empty() { ws.clone() } else { ws.join(rest) });
        }
        if let Ok(rest) = path.strip_prefix("/tmp") {
            return Ok(if rest.as_os_str().is_empty() { self.tmp.clone() } else { self.tmp.join(rest) });
        }
        Err(HostPathError::Outside(path.to_path_buf()))
    }

    /// `word` (an argument) as the job must see it: a sandbox path under
    /// `/tmp` or `/workspace` becomes its host path; any other word is kept.
    pub fn host_word(&self, word: &str) -> String {
        if word.starts_with("/tmp") || word.starts_with("/workspace") {
            if let Ok(p) = self.host_path(Path::new(word)) {
                return p.to_string_lossy().into_owned();
            }
        }
        word.to_string()
    }

    /// The job's environment with sandbox paths (`HOME=/tmp`, …) made host paths.
    pub fn host_env(&self, env: &[(String, String)]) -> Vec<(String, String)> {
        env.iter()
            .map(|(k, v)| {
                let mapped = if v.starts_with("/tmp") || v.starts_with("/workspace") {
                    self.host_path(Path::new(v)).ok().map(|p| p.to_string_lossy().into_owned())
                } else {
                    None
                };
                (k.clone(), mapped.unwrap_or_else(|| v.clone()))
            })
            .collect()
    }

    /// Write the job's files into the private `/tmp`.
    pub fn write_files(&self, files: &[JobFile]) -> Result<(), HostPathError> {
        for f in files {
            let path = self.host_path(&f.path)?;
            if !path.starts_with(&self.tmp) {
                return Err(HostPathError::FileOutsideTmp(f.path.clone()));
            }
            let failed = |source| HostPathError::Write { path: f.path.clone(), source };
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(failed)?;
            }
            std::fs::write(&path, &f.contents).map_err(failed)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_map_to_the_two_roots_only() {
        let l = HostLayout { tmp: "/var/tmp/confine-x".into(), workspace: Some("/home/u/proj".into()) };
        assert_eq!(l.host_path(Path::new("/workspace/src")).unwrap(), PathBuf::from("/home/u/proj/src"));
        assert_eq!(l.host_path(Path::new("/tmp")).unwrap(), PathBuf::from("/var/tmp/confine-x"));
        assert!(l.host_path(Path::new("/etc")).is_err());
        assert!(l.host_path(Path::new("/tmp/../etc")).is_err());
        assert!(l.host_path(Path::new("/tmpfoo")).is_err());
        let env = l.host_env(&[("HOME".into(), "/tmp".into()), ("PATH".into(), "/usr/bin".into())]);
        assert_eq!(env[0].1, "/var/tmp/confine-x");
        assert_eq!(env[1].1, "/usr/bin");
        assert_eq!(l.host_word("/tmp/confine-src/main.c"), "/var/tmp/confine-x/confine-src/main.c");
        assert_eq!(l.host_word("/workspace"), "/home/u/proj");
        for kept in ["/tmpfoo", "/tmp/../etc/passwd", "-o", "/usr/bin/cc", "tmp/x"] {
            assert_eq!(l.host_word(kept), kept);
        }
        assert_eq!(l.host_path(Path::new("/home/u/proj/src")).unwrap(), PathBuf::from("/home/u/proj/src"));
        let no_ws = HostLayout { workspace: None, ..l };
        assert!(no_ws.host_path(Path::new("/workspace")).is_err());
        assert!(no_ws.host_path(Path::new("/home/u/proj")).is_err());
    }
}
