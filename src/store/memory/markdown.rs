//! The markdown mirror of a memory: `<repo>/.confine-memory/<memoryId>.md`,
//! YAML front matter between `---` lines, then the content as the body, so
//! a team can version and review its memories.
//!
//! ```text
//! ---
//! memoryId: mem_3f2a…
//! repoId: demo
//! type: bugfix
//! title: Race in authenticate()
//! tags: [auth]
//! confidence: 0.9
//! symbolIds: []
//! fileRelPaths: [src/auth.rs]
//! fileHashes: {src/auth.rs: 9f86d0…}   # SHA-256 when stored: the staleness baseline
//! createdAt: 2026-05-20T12:34:56.789Z
//! updatedAt: 2026-05-20T12:34:56.789Z
//! deleted: false
//! ---
//! The content, verbatim, then one newline.
//! ```
//!
//! A job with a read-write workspace can change this directory while the
//! supervisor (root) works in it, so everything here goes through the fd
//! of `.confine-memory` ([`crate::dirfd`]), opened once from the fd of the
//! repository root, never through a path: a symlink at the directory or at
//! a file is refused, never followed; a FIFO is refused without blocking.
//! Reading is strict (unknown keys are errors) and bounded (1 MiB, regular
//! files only). Writing goes to a new temp file (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`) in the directory, fsync, `renameat` within it, fsync the
//! directory: a reader sees the old file or the new one. This module
//! never writes outside `.confine-memory/`.

use super::types::{Memory, MemoryType};
use super::MemoryError;
use crate::dirfd::{self, Dir};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;

/// The directory of the mirrors, under the repository root.
pub const MEMORY_DIR: &str = ".confine-memory";
/// Largest `.md` file read back.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The front matter. `stale` is not in it: staleness is re-derived on each
/// machine from `fileHashes`, so the file only changes when the memory does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FrontMatter {
    #[serde(default)]
    pub memory_id: Option<String>,
    /// Informational: on read the directory decides the repository.
    #[serde(default)]
    pub repo_id: Option<String>,
    #[serde(rename = "type")]
    pub memory_type: MemoryType,
    pub title: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub confidence: Option<f64>,
    #[serde(default)]
    pub symbol_ids: Vec<String>,
    #[serde(default)]
    pub file_rel_paths: Vec<String>,
    /// SHA-256 of each linked file when the memory was stored (null: absent).
    #[serde(default)]
    pub file_hashes: BTreeMap<String, Option<String>>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
    #[serde(default)]
    pub deleted: bool,
}

/// A parsed file: its front matter and body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parsed {
    pub front: FrontMatter,
    pub content: String,
}

/// `.confine-memory/<id>.md`, as error messages and reports name it.
pub(crate) fn shown(id: &str) -> String {
    format!("{MEMORY_DIR}/{id}.md")
}

/// The file text of a memory.
pub(crate) fn render(m: &Memory, file_hashes: &BTreeMap<String, Option<String>>) -> Result<String, MemoryError> {
    let front = FrontMatter {
        memory_id: Some(m.memory_id.clone()),
        repo_id: Some(m.repo_id.clone()),
        memory_type: m.memory_type,
        title: m.title.clone(),
        tags: m.tags.clone(),
        confidence: Some(m.confidence),
        symbol_ids: m.symbol_ids.clone(),
        file_rel_paths: m.file_rel_paths.clone(),
        file_hashes: file_hashes.clone(),
        created_at: Some(m.created_at.clone()),
        updated_at: Some(m.updated_at.clone()),
        deleted: m.deleted,
    };
    let yaml = serde_yaml_ng::to_string(&front)
        .map_err(|e| MemoryError::File { path: shown(&m.memory_id), message: format!("cannot encode: {e}") })?;
    let mut text = String::with_capacity(yaml.len() + m.content.len() + 16);
    text.push_str("---\n");
    text.push_str(&yaml);
    if !yaml.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("---\n");
    text.push_str(&m.content);
    text.push('\n');
    Ok(text)
}

/// Why a file's text is not a memory. Each says what to fix, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ParseError {
    #[error("the file must start with a '---' line (YAML front matter)")]
    NoFrontMatter,
    #[error("the front matter has no closing '---' line")]
    Unclosed,
    /// `line` counts from the file's first line.
    #[error("line {line} of the file: {message}")]
    Line { line: usize, message: String },
    #[error("front matter: {0}")]
    FrontMatter(String),
}

/// Split and parse a file's text. Errors say what to fix, in one line.
pub(crate) fn parse(text: &str) -> Result<Parsed, ParseError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let rest = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")).ok_or(ParseError::NoFrontMatter)?;
    let mut offset = 0;
    let mut close = None;
    for line in rest.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n').trim_end_matches('\r');
        if bare == "---" {
            close = Some((offset, offset + line.len(), line.ends_with("\r\n")));
            break;
        }
        offset += line.len();
    }
    let (yaml_end, body_start, crlf) = close.ok_or(ParseError::Unclosed)?;
    let front: FrontMatter = serde_yaml_ng::from_str(&rest[..yaml_end]).map_err(|e| {
        let msg = e.to_string();
        let msg = first_line(&msg);
        // serde_yaml counts lines from the first line after the opening '---'.
        match e.location() {
            Some(loc) => {
                let msg = msg.rfind(" at line ").map_or(msg, |i| &msg[..i]);
                ParseError::Line { line: loc.line() + 1, message: msg.to_string() }
            }
            None => ParseError::FrontMatter(msg.to_string()),
        }
    })?;
    let body = &rest[body_start..];
    let suffix = if crlf { "\r\n" } else { "\n" };
    let content = body.strip_suffix(suffix).or_else(|| body.strip_suffix('\n')).unwrap_or(body);
    Ok(Parsed { front, content: content.to_string() })
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn refuse(repo_id: &str, what: &str) -> MemoryError {
    MemoryError::Repo {
        repo: repo_id.to_string(),
        message: format!("{MEMORY_DIR} is {what}; move it away so confine can keep its memory files there"),
    }
}

fn dir_error(e: std::io::Error) -> MemoryError {
    MemoryError::File { path: MEMORY_DIR.into(), message: dirfd::reason(&e) }
}

/// `.confine-memory/` of the repository open at `root`, if it is there.
/// One that is a symlink or not a directory is refused (it could send
/// writes out of the repository), also when it is swapped in after the
/// look: the open itself refuses a symlink.
pub(crate) fn open_dir(root: &Dir, repo_id: &str) -> Result<Option<Dir>, MemoryError> {
    match root.lstat(OsStr::new(MEMORY_DIR)).map_err(dir_error)? {
        None => Ok(None),
        Some(st) if st.is_symlink => Err(refuse(repo_id, "a symlink")),
        Some(st) if !st.is_dir => Err(refuse(repo_id, "not a directory")),
        Some(_) => match root.dir(Path::new(MEMORY_DIR)) {
            Ok(d) => Ok(Some(d)),
            Err(e) if dirfd::is_symlink_error(&e) => Err(refuse(repo_id, "a symlink")),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(refuse(repo_id, "not a directory")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(dir_error(e)),
        },
    }
}

/// `.confine-memory/`, made if needed (0755: the team reviews it).
pub(crate) fn ensure_dir(root: &Dir, repo_id: &str) -> Result<Dir, MemoryError> {
    if let Some(d) = open_dir(root, repo_id)? {
        return Ok(d);
    }
    root.mkdir(OsStr::new(MEMORY_DIR), 0o755).map_err(dir_error)?;
    open_dir(root, repo_id)?.ok_or_else(|| refuse(repo_id, "gone as soon as it was made"))
}

/// Replace `<id>.md` in `dir` with `bytes` atomically.
pub(crate) fn write_atomic(dir: &Dir, id: &str, bytes: &[u8]) -> Result<(), MemoryError> {
    let err = |e: std::io::Error| MemoryError::File { path: shown(id), message: e.to_string() };
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = format!(".{id}.md.{}.{nonce}.tmp", std::process::id());
    let tmp = OsStr::new(&tmp);
    // O_EXCL | O_NOFOLLOW: never follow or reuse something planted at that name.
    let mut f = dir.create_new(tmp, 0o644).map_err(err)?;
    let result = (|| {
        f.write_all(bytes)?;
        f.sync_all()?;
        dir.rename(tmp, OsStr::new(&format!("{id}.md")))?;
        dir.sync()
    })();
    if result.is_err() {
        let _ = dir.unlink(tmp);
    }
    result.map_err(err)
}

/// Remove `<id>.md` from `dir` (a symlink there is removed, not followed);
/// `Ok(false)` when it was not there.
pub(crate) fn remove(dir: &Dir, id: &str) -> Result<bool, MemoryError> {
    match dir.unlink(OsStr::new(&format!("{id}.md"))) {
        Ok(()) => {
            let _ = dir.sync();
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(MemoryError::File { path: shown(id), message: e.to_string() }),
    }
}

/// A mirror's bytes and modification time (ms since the epoch), read
/// from `dir` without following a symlink or blocking on a FIFO, at most
/// [`MAX_FILE_BYTES`]. `Ok(None)` when there is no such file.
pub(crate) fn read(dir: &Dir, name: &str) -> Result<Option<(Vec<u8>, i64)>, Unreadable> {
    match dir.read_regular(Path::new(name), MAX_FILE_BYTES) {
        Ok(got) => Ok(got.map(|r| (r.bytes, r.stat.mtime_ms))),
        Err(e) if dirfd::is_symlink_error(&e) => Err(Unreadable::Symlink),
        Err(e) if dirfd::is_not_regular(&e) => Err(Unreadable::NotRegular),
        // Too large: its message names the limit.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => Err(Unreadable::Invalid(e)),
        Err(e) => Err(Unreadable::Io(dirfd::reason(&e))),
    }
}

/// Why a mirror file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unreadable {
    #[error("a symlink (symlinks are not followed)")]
    Symlink,
    #[error("not a regular file")]
    NotRegular,
    #[error("{0}")]
    Invalid(std::io::Error),
    /// The OS's words ([`dirfd::reason`]).
    #[error("{0}")]
    Io(String),
}

/// A `memoryId` from a file name `<id>.md` (hidden and other files: `None`).
pub(crate) fn id_of(file_name: &str) -> Option<&str> {
    file_name.strip_suffix(".md").filter(|id| !id.starts_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> Memory {
        Memory {
            memory_id: "mem_1".into(),
            repo_id: "demo".into(),
            memory_type: MemoryType::Bugfix,
            title: "Race: in authenticate() # not a comment".into(),
            content: "line one\n---\nafter a rule\n".into(),
            tags: vec!["auth".into(), "yes".into()],
            confidence: 0.9,
            symbol_ids: vec!["sym:1".into()],
            file_rel_paths: vec!["src/a.rs".into()],
            created_at: "2026-05-20T12:34:56.789Z".into(),
            updated_at: "2026-05-20T12:34:56.789Z".into(),
            deleted: false,
            stale: false,
            stale_files: vec![],
        }
    }

    #[test]
    fn render_then_parse_round_trips_tricky_text() {
        let m = memory();
        let hashes = BTreeMap::from([("src/a.rs".to_string(), Some("ab".repeat(32))), ("gone".into(), None)]);
        let text = render(&m, &hashes).unwrap();
        assert!(text.starts_with("---\nmemoryId: mem_1\n"), "{text}");
        let p = parse(&text).unwrap();
        assert_eq!(p.content, m.content);
        assert_eq!(p.front.title, m.title);
        assert_eq!(p.front.tags, m.tags);
        assert_eq!(p.front.file_hashes, hashes);
        assert_eq!(p.front.confidence, Some(0.9));
    }

    #[test]
    fn hand_written_files_parse_and_crlf_is_accepted() {
        let text = "---\r\ntype: decision\r\ntitle: Use sled\r\ntags:\r\n  - storage\r\n---\r\nBecause.\r\n";
        let p = parse(text).unwrap();
        assert_eq!(p.front.memory_type, MemoryType::Decision);
        assert_eq!(p.front.tags, vec!["storage".to_string()]);
        assert_eq!(p.content, "Because.");
    }

    #[test]
    fn bad_files_are_named_precisely() {
        assert_eq!(parse("no front matter").unwrap_err(), ParseError::NoFrontMatter);
        assert!(parse("no front matter").unwrap_err().to_string().contains("must start with"));
        assert!(parse("---\ntype: bugfix\ntitle: x\n").unwrap_err().to_string().contains("no closing"));
        let e = parse("---\ntype: bugfix\ntitle: x\ncolour: red\n---\nbody\n").unwrap_err().to_string();
        assert!(e.contains("unknown field `colour`"), "{e}");
        let e = parse("---\ntype: opinion\ntitle: x\n---\nbody\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "line 2 of the file: type: unknown variant `opinion`, expected one of `decision`, `bugfix`, `task_context`"
        );
    }
}
