//! The checks every memory argument passes before anything is written:
//! lengths and counts, ids that are safe file names, and `fileRelPaths`
//! that stay inside the repository: lexically here, then, when a linked
//! file is opened, through the repository root's fd with no symlink
//! followed ([`open_linked`]), so nothing a job swaps in can lead out.
//!
//! Messages name the argument as the caller gave it and never a host path.

use super::types::*;
use super::{invalid, MemoryError};
use crate::dirfd::{self, Dir, Stat};
use std::path::{Component, Path};

/// Longest memoryId (it is a file name).
pub const MAX_ID_CHARS: usize = 64;

/// The checked, normalised fields of a memory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fields {
    pub memory_type: MemoryType,
    pub title: String,
    pub content: String,
    pub tags: Vec<String>,
    pub confidence: f64,
    pub symbol_ids: Vec<String>,
    pub file_rel_paths: Vec<String>,
}

/// A memoryId is a file name: ASCII letters, digits, `_` and `-`, 1–64.
pub(crate) fn memory_id(id: &str) -> Result<(), MemoryError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_ID_CHARS
        && id.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "memoryId '{}' is not a memory id (1–{MAX_ID_CHARS} letters, digits, '_' or '-')",
            clip(id)
        )))
    }
}

/// Check a memory's fields (not its files' existence: see [`resolve_file`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn fields(
    memory_type: MemoryType,
    title: &str,
    content: &str,
    tags: &[String],
    confidence: Option<f64>,
    symbol_ids: &[String],
    file_rel_paths: &[String],
) -> Result<Fields, MemoryError> {
    let title_chars = title.chars().count();
    if title.trim().is_empty() {
        return Err(invalid("title must not be empty"));
    }
    if title_chars > MAX_TITLE_CHARS {
        return Err(invalid(format!(
            "title is {title_chars} characters; at most {MAX_TITLE_CHARS} (put the detail in content)"
        )));
    }
    if title.chars().any(char::is_control) {
        return Err(invalid("title must be one line without control characters"));
    }
    let content_chars = content.chars().count();
    if content.trim().is_empty() {
        return Err(invalid("content must not be empty"));
    }
    if content_chars > MAX_CONTENT_CHARS {
        return Err(invalid(format!(
            "content is {content_chars} characters; at most {MAX_CONTENT_CHARS} (split it into several memories)"
        )));
    }
    if content.contains('\0') {
        return Err(invalid("content must not contain NUL characters"));
    }
    let confidence = confidence.unwrap_or(DEFAULT_CONFIDENCE);
    if !(0.0..=1.0).contains(&confidence) {
        return Err(invalid(format!(
            "confidence must be between 0 and 1 (got {confidence}); use 0.9 for a verified fact, 0.7 for a hypothesis"
        )));
    }
    let tags = labels("tags", tags, MAX_TAGS, MAX_TAG_CHARS)?;
    let symbol_ids = labels("symbolIds", symbol_ids, MAX_LINKS, MAX_SYMBOL_CHARS)?;
    if file_rel_paths.len() > MAX_LINKS {
        return Err(invalid(format!("at most {MAX_LINKS} fileRelPaths (got {})", file_rel_paths.len())));
    }
    let mut files = Vec::with_capacity(file_rel_paths.len());
    for raw in file_rel_paths {
        let rel = rel_path(raw)?;
        if !files.contains(&rel) {
            files.push(rel);
        }
    }
    Ok(Fields {
        memory_type,
        title: title.to_string(),
        content: content.to_string(),
        tags,
        confidence,
        symbol_ids,
        file_rel_paths: files,
    })
}

/// A list of short labels (tags, symbol ids): at most `max`, each 1–`max_chars`
/// characters without control characters; duplicates dropped, order kept.
pub(crate) fn labels(name: &str, list: &[String], max: usize, max_chars: usize) -> Result<Vec<String>, MemoryError> {
    if list.len() > max {
        return Err(invalid(format!("at most {max} {name} (got {})", list.len())));
    }
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        let n = item.chars().count();
        if item.trim().is_empty() || n > max_chars || item.chars().any(char::is_control) {
            return Err(invalid(format!(
                "each of {name} must be 1–{max_chars} characters without control characters (got '{}')",
                clip(item)
            )));
        }
        if !out.contains(item) {
            out.push(item.clone());
        }
    }
    Ok(out)
}

/// A `fileRelPath`, lexically: relative, no `..`, no NUL; `.` parts and
/// repeated slashes dropped. Returns the normalised form (`a/b.rs`).
pub(crate) fn rel_path(raw: &str) -> Result<String, MemoryError> {
    let shown = clip(raw);
    if raw.contains('\0') {
        return Err(invalid("fileRelPath contains a NUL byte"));
    }
    let p = Path::new(raw);
    if p.is_absolute() || raw.starts_with('/') {
        return Err(invalid(format!("fileRelPath '{shown}' is absolute; give a path relative to the repository root")));
    }
    let mut parts = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(invalid(format!("fileRelPath '{shown}' contains '..'; give a path inside the repository")))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(format!(
                    "fileRelPath '{shown}' is absolute; give a path relative to the repository root"
                )))
            }
        }
    }
    if parts.is_empty() {
        return Err(invalid(format!("fileRelPath '{shown}' names no file")));
    }
    Ok(parts.join("/"))
}

/// The repository's root, open: everything the memory store reads or
/// writes in it is reached from this fd. The configured path is the
/// operator's and may hold symlinks; nothing below it is followed.
pub(crate) fn repo_root(repo: &RepoRef) -> Result<Dir, MemoryError> {
    Dir::open(&repo.root).map_err(|e| MemoryError::Repo {
        repo: repo.id.clone(),
        message: format!("the repository root is unavailable: {} (check [[repos]] in confine.toml)", dirfd::reason(&e)),
    })
}

/// A linked file (`rel` normalised by [`rel_path`]) opened for reading
/// below `root`: `Ok(Some)` a regular file, `Ok(None)` nothing there, `Err`
/// a symlink on the way (never followed: it could lead outside), or not a
/// regular file (a FIFO is refused without blocking).
pub(crate) fn open_linked(root: &Dir, rel: &str) -> Result<Option<(std::fs::File, Stat)>, MemoryError> {
    let shown = clip(rel);
    match root.open_regular(Path::new(rel)) {
        Ok(x) => Ok(Some(x)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.kind() == std::io::ErrorKind::NotADirectory => Ok(None),
        Err(e) if dirfd::is_symlink_error(&e) => Err(invalid(format!(
            "fileRelPath '{shown}' leads through a symlink, which confine never follows in a repository (it \
             could lead outside it); link the file itself"
        ))),
        Err(e) if dirfd::is_not_regular(&e) => Err(invalid(format!(
            "fileRelPath '{shown}' is not a regular file; link files, not directories, FIFOs or devices"
        ))),
        Err(e) => Err(invalid(format!("fileRelPath '{shown}' can't be read: {}", dirfd::reason(&e)))),
    }
}

/// A `limit` within `(min, max, default)`.
pub(crate) fn limit(value: Option<u32>, (min, max, default): (u32, u32, u32)) -> Result<usize, MemoryError> {
    match value {
        None => Ok(default as usize),
        Some(v) if (min..=max).contains(&v) => Ok(v as usize),
        Some(v) => Err(invalid(format!("limit must be {min}–{max} (got {v})"))),
    }
}

/// A caller-supplied string shortened for an error message.
pub(crate) fn clip(s: &str) -> String {
    let mut out: String = s.chars().take(60).map(|c| if c.is_control() { ' ' } else { c }).collect();
    if s.chars().count() > 60 {
        out.push('…');
    }
    out
}
