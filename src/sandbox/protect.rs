//! What stays read-only in a read-write workspace: what a host's `git`
//! runs, or reads its settings from, the next time the user works in the
//! repository. A job that could write there would have its code run on
//! the host.
//!
//! - The whole `.git` is kept read-only, as Codex's sandbox keeps it: a
//!   list of files inside it can't be complete (`config`, `hooks`,
//!   `commondir`, which redirects both, the index, which can gain a
//!   submodule, `modules`, `worktrees/*`). A job then can't commit;
//!   `--no-protect` lifts it, at that price.
//! - What git is told to read or run from the worktree itself: a gitfile's
//!   gitdir and a `commondir` inside the workspace, a `core.hooksPath`
//!   (husky's `.husky`), files named by `include.path` and
//!   `includeIf.*.path`, and the targets of hooks that are symlinks, as the
//!   repository's, the owner's (`~/.gitconfig`) and the system's
//!   configuration say. Those that git would read but that are missing are
//!   refused: a job could create them.
//! - The `.git` of every repository nested in the workspace, three
//!   directories deep (`vendor/lib/.git`).
//! - A file git runs or reads that has other names (hard links) is
//!   refused: a job could write it through one of them (an earlier run
//!   without the protection can have made one).
//!
//! Configuration files are read here through directory fds (never through
//! a symlink inside the workspace, bounded) for those few settings only.
//! What stays out of reach: settings that name worktree files as programs
//! (`filter.*`, `diff.*.command`, aliases running `!./script`) and hook
//! managers' own configuration (`.pre-commit-config.yaml`): see the threat
//! model's residual risks.

use crate::dirfd::Dir;
use std::path::{Component, Path, PathBuf};

/// Paths of a read-write workspace kept read-only by default.
pub const DEFAULT_PROTECTED: &[&str] = &[".git"];

/// Largest git file read (a config, a gitfile, `commondir`).
const MAX_FILE_BYTES: u64 = 1 << 20;
/// How deep nested repositories are looked for, and how many directories
/// at most (a workspace's `node_modules` can hold a million).
const NESTED_DEPTH: usize = 3;
const NESTED_DIRS: usize = 4096;
/// How deep `include.path` is followed (git's own limit is 10).
const INCLUDE_DEPTH: usize = 10;

/// The default protected paths of `workspace` (relative to it), in the
/// order found. Err: something git reads from the workspace is missing
/// (a job could create it) or has other names (a job could write it).
pub fn defaults(workspace: &Path) -> Result<Vec<PathBuf>, ProtectError> {
    let Ok(ws) = Dir::open(workspace) else { return Ok(DEFAULT_PROTECTED.iter().map(PathBuf::from).collect()) };
    let mut found = Found { workspace, ws: &ws, paths: Vec::new() };
    found.add(PathBuf::from(".git"));
    found.repository(Path::new(""))?;
    found.nested()?;
    Ok(found.paths)
}

/// Why a read-write workspace can't be protected as it is: each says
/// what to change.
#[derive(Debug, thiserror::Error)]
pub enum ProtectError {
    /// Something git reads from the workspace is missing: a job could
    /// create it.
    #[error(
        "{what} names {rel}, inside the workspace, which does not exist: a job could create it, and your next \
         git command would use it; create it, or change that setting"
    )]
    Missing { what: String, rel: PathBuf },
    /// A file git reads is a symlink: a job could change its target.
    #[error(
        "{rel} is a symbolic link: git would read what it points at, which a job could change; replace it \
         with the file itself"
    )]
    Symlink { rel: PathBuf },
    /// A file git reads or runs has other names: a job could write it.
    #[error(
        "{rel} has {names} names (hard links): a job could write it through another one in the workspace, and your \
         next git command would read or run it; remove the other links (find . -samefile {rel})"
    )]
    HardLinks { rel: PathBuf, names: u64 },
}

struct Found<'a> {
    workspace: &'a Path,
    ws: &'a Dir,
    paths: Vec<PathBuf>,
}

impl Found<'_> {
    fn add(&mut self, rel: PathBuf) {
        if !self.paths.iter().any(|p| rel.starts_with(p)) {
            self.paths.retain(|p| !p.starts_with(&rel));
            self.paths.push(rel);
        }
    }

    /// `path` (absolute) as a path inside the workspace, if it is one.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        inside(self.workspace, path)
    }

    /// The regular file `path`, read whole: through the workspace's fd
    /// (no symlink on the way) when it is inside, else by name (the
    /// owner's and the system's files). None: not there (or unreadable).
    fn read(&self, path: &Path) -> Option<String> {
        let bytes = match self.inside(path) {
            Some(rel) if !rel.as_os_str().is_empty() => self.ws.read_regular(&rel, MAX_FILE_BYTES).ok()??.bytes,
            Some(_) => return None,
            None => read_host_config(path)?,
        };
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `rel` (inside the workspace) must exist, or git could be handed
    /// what a job creates there; and a file must have no other name.
    fn must_exist(&mut self, rel: PathBuf, what: &str) -> Result<(), ProtectError> {
        let full = self.workspace.join(&rel);
        let meta = std::fs::symlink_metadata(&full)
            .map_err(|_| ProtectError::Missing { what: what.to_string(), rel: rel.clone() })?;
        single_name(&rel, &meta)?;
        self.add(rel);
        Ok(())
    }

    /// The repository whose worktree is `top` (relative to the workspace):
    /// its gitdir and commondir, configuration and hooks.
    fn repository(&mut self, top: &Path) -> Result<(), ProtectError> {
        let worktree = self.workspace.join(top);
        let dot_git = worktree.join(".git");
        let Ok(meta) = std::fs::symlink_metadata(&dot_git) else { return Ok(()) };
        // A symlinked .git is refused by the init stage, which protects it.
        let gitdir = if meta.is_file() {
            single_name(&top.join(".git"), &meta)?;
            let text = self.read(&dot_git).unwrap_or_default();
            let Some(target) = text.lines().find_map(|l| l.strip_prefix("gitdir:")).map(str::trim) else {
                return Ok(());
            };
            let target = worktree.join(target);
            if let Some(rel) = self.inside(&target) {
                self.must_exist(rel, "the .git file's gitdir")?;
            }
            target
        } else if meta.is_dir() {
            dot_git
        } else {
            return Ok(());
        };
        let common = match self.read(&gitdir.join("commondir")) {
            Some(text) => {
                if let Some(rel) = self.inside(&gitdir.join("commondir")) {
                    self.check_single(&rel)?;
                }
                let common = gitdir.join(text.trim());
                if let Some(rel) = self.inside(&common) {
                    self.must_exist(rel, "the repository's commondir")?;
                }
                common
            }
            None => gitdir.clone(),
        };
        // Configuration in git's order; the last core.hooksPath wins.
        let mut hooks_path: Option<(PathBuf, String)> = None;
        let mut files: Vec<(PathBuf, &str)> = vec![(PathBuf::from("/etc/gitconfig"), "/etc/gitconfig")];
        if let Some(home) = owner_home(self.workspace) {
            files.push((home.join(".config/git/config"), "~/.config/git/config"));
            files.push((home.join(".gitconfig"), "~/.gitconfig"));
        }
        files.push((common.join("config"), "the repository's config"));
        files.push((gitdir.join("config.worktree"), "config.worktree"));
        for (file, what) in files {
            if let Some(rel) = self.inside(&file) {
                self.check_single(&rel)?;
            }
            self.config(&file, what, &worktree, &mut hooks_path, 0)?;
        }
        let hooks = match hooks_path {
            Some((dir, what)) => {
                if let Some(rel) = self.inside(&dir) {
                    self.must_exist(rel, &format!("core.hooksPath ({what})"))?;
                }
                dir
            }
            None => common.join("hooks"),
        };
        self.hooks(&hooks)
    }

    /// One configuration file: its `core.hooksPath`, and the files it
    /// includes (followed, and protected when in the workspace).
    fn config(
        &mut self,
        file: &Path,
        what: &str,
        worktree: &Path,
        hooks_path: &mut Option<(PathBuf, String)>,
        depth: usize,
    ) -> Result<(), ProtectError> {
        let Some(text) = self.read(file) else { return Ok(()) };
        let base = file.parent().unwrap_or(Path::new("/"));
        for (section, key, value) in entries(&text) {
            let section = section.to_ascii_lowercase();
            if section == "core" && key.eq_ignore_ascii_case("hookspath") {
                // Relative: to where hooks run, the worktree's top.
                *hooks_path = expand(&value, self.workspace).map(|p| (worktree.join(p), what.to_string()));
            } else if (section == "include" || section.starts_with("includeif")) && key.eq_ignore_ascii_case("path") {
                let Some(included) = expand(&value, self.workspace).map(|p| base.join(p)) else { continue };
                if let Some(rel) = self.inside(&included) {
                    self.must_exist(rel, &format!("include.path of {what}"))?;
                }
                if depth < INCLUDE_DEPTH {
                    self.config(&included, what, worktree, hooks_path, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Hooks in `dir`: a symlink into the workspace has its target kept
    /// read-only (and present); a file with other names is refused.
    fn hooks(&mut self, dir: &Path) -> Result<(), ProtectError> {
        // A hooks directory that is itself a link: git runs what it points at.
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            if let Ok(target) = std::fs::read_link(dir) {
                let parent = dir.parent().unwrap_or(Path::new("/"));
                if let Some(rel) = self.inside(&normalize(&parent.join(target))) {
                    self.must_exist(rel, &format!("the hooks directory {}", dir.display()))?;
                }
            }
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
            if meta.file_type().is_symlink() {
                let Ok(target) = std::fs::read_link(&path) else { continue };
                if let Some(rel) = self.inside(&normalize(&dir.join(target))) {
                    self.must_exist(rel, &format!("the hook {}", path.display()))?;
                }
            } else if let Some(rel) = self.inside(&path) {
                single_name(&rel, &meta)?;
            }
        }
        Ok(())
    }

    /// A file git reads, inside the workspace: one name, and no symlink
    /// (git would read whatever it points at).
    fn check_single(&self, rel: &Path) -> Result<(), ProtectError> {
        match std::fs::symlink_metadata(self.workspace.join(rel)) {
            Ok(meta) if meta.file_type().is_symlink() => Err(ProtectError::Symlink { rel: rel.to_path_buf() }),
            Ok(meta) => single_name(rel, &meta),
            Err(_) => Ok(()),
        }
    }

    /// The `.git` of repositories nested in the workspace, a few levels
    /// down, and what each tells git to read from the workspace.
    fn nested(&mut self) -> Result<(), ProtectError> {
        let mut queue: std::collections::VecDeque<(PathBuf, usize)> = [(PathBuf::new(), 0)].into();
        let mut seen = 0;
        while let Some((rel, depth)) = queue.pop_front() {
            let Ok(dir) = (if rel.as_os_str().is_empty() { Dir::open(self.workspace) } else { self.ws.dir(&rel) })
            else {
                continue;
            };
            let Ok(names) = dir.names() else { continue };
            for name in names {
                if name == ".git" {
                    if !rel.as_os_str().is_empty() {
                        self.add(rel.join(".git"));
                        self.repository(&rel)?;
                    }
                    continue;
                }
                if depth + 1 > NESTED_DEPTH || name == "node_modules" {
                    continue;
                }
                seen += 1;
                if seen > NESTED_DIRS {
                    return Ok(());
                }
                if dir.lstat(&name).ok().flatten().is_some_and(|s| s.is_dir) {
                    queue.push_back((rel.join(&name), depth + 1));
                }
            }
        }
        Ok(())
    }
}

/// A config file outside the workspace (the owner's, the system's, an
/// `include.path` a repository names), followed as git follows it, but
/// opened only once it is known to be a regular file: first `O_PATH`
/// (which opens nothing: no FIFO to block on, no device woken), then, if
/// that inode is a regular file, that very inode reopened to read,
/// without blocking. A repository's config may name any path; root must
/// not hang on it, or open `/dev/watchdog` for it.
#[cfg(target_os = "linux")]
fn read_host_config(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let pinned = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(path).ok()?;
    if !pinned.metadata().ok()?.is_file() {
        return None;
    }
    let reopen = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&pinned));
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(reopen).ok()?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(not(unix))]
fn read_host_config(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(all(unix, not(target_os = "linux")))]
fn read_host_config(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let f = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path).ok()?;
    let mut bytes = Vec::new();
    f.take(MAX_FILE_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// A file git reads or runs must have one name: through another, in the
/// workspace, a job could write it.
fn single_name(rel: &Path, meta: &std::fs::Metadata) -> Result<(), ProtectError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if meta.is_file() && meta.nlink() > 1 {
            return Err(ProtectError::HardLinks { rel: rel.to_path_buf(), names: meta.nlink() });
        }
    }
    #[cfg(not(unix))]
    let _ = (rel, meta);
    Ok(())
}

/// The (section, key, value) entries of a git config file, as git reads
/// the common forms: `[section]` and `[section "sub"]` (the subsection
/// kept, so `includeIf "gitdir:…"` reads as `includeif`), keys, values
/// optionally quoted, comments after `#` or `;`.
fn entries(config: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in config.lines() {
        let mut line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some((head, after)) = rest.split_once(']') else { continue };
            section = head.split_whitespace().next().unwrap_or("").to_string();
            line = after.trim();
            if line.is_empty() {
                continue;
            }
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = value.trim();
        let value = match value.strip_prefix('"') {
            Some(rest) => rest.split('"').next().unwrap_or(""),
            None => value.split(['#', ';']).next().unwrap_or("").trim(),
        };
        out.push((section.clone(), key.trim().to_string(), value.to_string()));
    }
    out
}

/// A config path value: `~/` is the workspace owner's home; None when it
/// can't be placed.
fn expand(value: &str, workspace: &Path) -> Option<PathBuf> {
    if value.is_empty() {
        return None;
    }
    match value.strip_prefix("~/") {
        Some(rest) => owner_home(workspace).map(|h| h.join(rest)),
        None if value.starts_with('~') => None,
        None => Some(PathBuf::from(value)),
    }
}

/// The home directory of the workspace's owner, whose `git` reads it.
fn owner_home(workspace: &Path) -> Option<PathBuf> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata(workspace).ok()?.uid();
        nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).ok()?.map(|u| u.dir)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = workspace;
        None
    }
}

/// `path` with `.` and `..` taken out by name (no lookup).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `path` (absolute, or relative to the workspace) as a path inside
/// `workspace`; None when it is elsewhere.
fn inside(workspace: &Path, path: &Path) -> Option<PathBuf> {
    let abs = normalize(&if path.is_absolute() { path.to_path_buf() } else { workspace.join(path) });
    abs.strip_prefix(workspace).ok().map(Path::to_path_buf)
}

#[cfg(test)]
mod tests;
