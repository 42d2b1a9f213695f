//! What stays read-only in a read-write workspace: what a host's `git`
//! runs, or reads its settings from, the next time the user works in the
//! repository. A job that could write there would have its code run on
//! the host.
//!
//! The whole `.git` is kept read-only, as Codex's sandbox keeps it: a list
//! of files inside it can't be complete (`config`, `hooks`, `commondir`,
//! which redirects both, the index, which can gain a submodule, `modules`,
//! `worktrees/*`). A job then can't commit; `--no-protect` lifts it for
//! jobs that must, at that price. A `core.hooksPath` that points into the
//! workspace (husky's `.husky`) is kept read-only too, and must exist: a
//! job could otherwise create it.
//!
//! The repository's `.git/config` is read here (through a directory fd,
//! never through a symlink, bounded) to find that one setting; nothing in
//! it decides anything else.

use crate::dirfd::Dir;
use std::path::{Component, Path, PathBuf};

/// Paths of a read-write workspace kept read-only by default.
pub const DEFAULT_PROTECTED: &[&str] = &[".git"];

/// Largest `.git/config` read.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The default protected paths of `workspace`: `.git`, and the directory
/// `core.hooksPath` names when it is inside the workspace. Err: that
/// directory is inside but missing, and a job could create it.
pub fn defaults(workspace: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out: Vec<PathBuf> = DEFAULT_PROTECTED.iter().map(PathBuf::from).collect();
    let Ok(dir) = Dir::open(workspace) else { return Ok(out) };
    let config = match dir.read_regular(Path::new(".git/config"), MAX_CONFIG_BYTES) {
        Ok(Some(read)) => String::from_utf8_lossy(&read.bytes).into_owned(),
        // No repository here, or one whose config can't be read safely:
        // .git itself is protected either way.
        _ => return Ok(out),
    };
    let Some(hooks) = hooks_path(&config) else { return Ok(out) };
    let Some(rel) = inside(workspace, Path::new(&hooks)) else { return Ok(out) };
    if rel.as_os_str().is_empty() || rel.starts_with(".git") {
        return Ok(out);
    }
    // A first look, for a clear error now; the outer init stage walks the
    // path again, without following anything, when it protects it.
    if std::fs::symlink_metadata(workspace.join(&rel)).is_err() {
        return Err(format!(
            "core.hooksPath of the workspace's git repository names {}, which does not exist: a job could \
             create hooks there that your next git command runs; create the directory (mkdir {}) so that it \
             is kept read-only, or pass --no-protect",
            rel.display(),
            rel.display()
        ));
    }
    out.push(rel);
    Ok(out)
}

/// `core.hooksPath` of a git config file's text (the last one wins), as
/// git reads the common forms: `[core]` sections, keys case-insensitive,
/// a value optionally quoted, comments after `#` or `;`.
fn hooks_path(config: &str) -> Option<String> {
    let mut in_core = false;
    let mut found = None;
    for line in config.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.split(']').next().unwrap_or("").trim();
            in_core = name.eq_ignore_ascii_case("core");
            // `[core] hooksPath = x` on the section's own line.
            let after = rest.split_once(']').map(|(_, a)| a.trim()).unwrap_or("");
            if in_core && !after.is_empty() {
                found = value_of(after).or(found);
            }
            continue;
        }
        if in_core {
            found = value_of(line).or(found);
        }
    }
    found
}

/// The value of a `hooksPath = value` line, or None for another key.
fn value_of(line: &str) -> Option<String> {
    let (key, value) = line.split_once('=')?;
    if !key.trim().eq_ignore_ascii_case("hookspath") {
        return None;
    }
    let value = value.trim();
    let value = match value.strip_prefix('"') {
        Some(rest) => rest.split('"').next().unwrap_or(""),
        None => value.split(['#', ';']).next().unwrap_or("").trim(),
    };
    Some(value.to_string())
}

/// `path` (relative to the workspace, or absolute) as a path inside
/// `workspace`, without `..`; None when it is elsewhere (`~/…`, outside).
fn inside(workspace: &Path, path: &Path) -> Option<PathBuf> {
    if path.as_os_str().to_string_lossy().starts_with('~') {
        return None;
    }
    let rel = if path.is_absolute() { path.strip_prefix(workspace).ok()? } else { path };
    let mut out = PathBuf::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_path_is_read_as_git_writes_it() {
        assert_eq!(hooks_path("[core]\n\thooksPath = .husky/_\n"), Some(".husky/_".into()));
        assert_eq!(hooks_path("[CORE]\n\tHOOKSPATH = \"my hooks\" ; comment\n"), Some("my hooks".into()));
        assert_eq!(hooks_path("[core \"x\"]\n\thooksPath = a\n[user]\n\thooksPath = b\n"), None);
        assert_eq!(hooks_path("[core]\nhooksPath = a # c\n[core]\nhooksPath=b\n"), Some("b".into()));
        assert_eq!(hooks_path("# [core]\n; hooksPath = a\n"), None);
    }

    #[test]
    fn only_paths_inside_the_workspace_count() {
        let ws = Path::new("/srv/ws");
        assert_eq!(inside(ws, Path::new(".husky")), Some(PathBuf::from(".husky")));
        assert_eq!(inside(ws, Path::new("/srv/ws/hooks")), Some(PathBuf::from("hooks")));
        assert_eq!(inside(ws, Path::new("/etc/hooks")), None);
        assert_eq!(inside(ws, Path::new("../hooks")), None);
        assert_eq!(inside(ws, Path::new("~/hooks")), None);
    }

    #[test]
    fn a_hooks_path_in_the_workspace_is_protected_and_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path();
        std::fs::create_dir_all(ws.join(".git")).unwrap();
        assert_eq!(defaults(ws).unwrap(), vec![PathBuf::from(".git")]);
        std::fs::write(ws.join(".git/config"), "[core]\n\thooksPath = .husky\n").unwrap();
        let e = defaults(ws).unwrap_err();
        assert!(e.contains(".husky, which does not exist") && e.contains("--no-protect"), "{e}");
        std::fs::create_dir(ws.join(".husky")).unwrap();
        assert_eq!(defaults(ws).unwrap(), vec![PathBuf::from(".git"), PathBuf::from(".husky")]);
        std::fs::write(ws.join(".git/config"), "[core]\n\thooksPath = /usr/share/hooks\n").unwrap();
        assert_eq!(defaults(ws).unwrap(), vec![PathBuf::from(".git")]);
    }
}
