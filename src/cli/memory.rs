//! `confine memory store | query | rm | surface | check | sync | log`: the
//! memories of the repositories in confine.toml, from the shell. Each
//! command is one [`MemoryService`] call; `--json` prints the MCP tool's
//! result shape.
//!
//! Exit status: 0 success; 1 bad input, or an unknown memory or repository
//! (nothing was written), or with `check --strict` stale memories; 125 the
//! configuration or the store could not be opened or written.

use super::Io;
use crate::config::Config;
use crate::relay::RelayedCommand as Relayed;
use crate::store::memory::{
    Memory, MemoryError, MemoryQuery, MemoryService, MemoryType, RemoveRequest, SortBy, StoreRequest, SurfaceRequest,
};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Exit code of a refused call (bad input, unknown id) or stale memories under `check --strict`.
pub const EXIT_REFUSED: i32 = 1;

#[derive(Debug, Subcommand, Serialize, Deserialize)]
pub enum MemoryCommand {
    /// Store a memory (or update one with --memory-id); a duplicate returns the existing id.
    #[command(
        after_help = "Examples:\n  confine memory store --type bugfix --title 'Race in authenticate()' \\\n    \
--content 'The token refresh was not awaited.' --file src/auth.rs --tag auth --confidence 0.9\n  \
git log -1 --format=%B | confine memory store --type decision --title 'Why sled' --content-file -"
    )]
    Store(StoreArgs),
    /// Search memories: words ranked by relevance, and filters.
    #[command(after_help = "Examples:\n  confine memory query 'token refresh'\n  \
confine memory query --type bugfix --tag auth --sort-by confidence\n  confine memory query --stale-only")]
    Query(MemoryQueryArgs),
    /// Remove a memory (soft delete: the log keeps it); --delete-file also removes its .md.
    Rm(RmArgs),
    /// The memories that matter for some symbols and files, best first.
    #[command(after_help = "Example:\n  confine memory surface --file src/auth.rs --symbol 'auth::refresh'")]
    Surface(SurfaceArgs),
    /// Re-hash linked files and flag the memories whose files changed or vanished.
    Check(AllArgs),
    /// Read .confine-memory/*.md files added or edited by hand back into the store.
    Sync(AllArgs),
    /// The log of memory operations, newest first (removed memories stay in it).
    Log(LogArgs),
}

/// Which repository: `--repo-id`, or `--repo DIR` of a configured one, or the only one.
#[derive(Debug, Args, Serialize, Deserialize)]
pub struct RepoArgs {
    /// A repository of [[repos]] in confine.toml (default: the only one configured).
    #[arg(long, value_name = "ID", conflicts_with = "repo")]
    pub repo_id: Option<String>,
    /// The configured repository whose root is DIR (e.g. `--repo .`).
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Print the result as JSON (the MCP tool's shape).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct StoreArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// decision, bugfix or task_context.
    #[arg(long = "type", value_name = "TYPE")]
    pub memory_type: String,
    /// Short title, 1–120 characters.
    #[arg(long)]
    pub title: String,
    /// The content (1–50,000 characters).
    #[arg(long, conflicts_with = "content_file", required_unless_present = "content_file")]
    pub content: Option<String>,
    /// Read the content from FILE (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    pub content_file: Option<PathBuf>,
    /// A tag (repeatable, at most 20).
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// 0–1: 0.9 for a verified fact, 0.7 for a hypothesis (default 0.5).
    #[arg(long)]
    pub confidence: Option<f64>,
    /// A linked symbol id (repeatable).
    #[arg(long = "symbol", value_name = "ID")]
    pub symbols: Vec<String>,
    /// A linked file, relative to the repository root (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<String>,
    /// Update this memory instead of creating one.
    #[arg(long)]
    pub memory_id: Option<String>,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct MemoryQueryArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Words to search for in titles and content.
    pub text: Option<String>,
    /// Only this type (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// Only memories with this tag (repeatable: any of them).
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Only memories linked to this symbol (repeatable: any of them).
    #[arg(long = "symbol", value_name = "ID")]
    pub symbols: Vec<String>,
    /// Only stale memories (re-checks linked files first).
    #[arg(long)]
    pub stale_only: bool,
    /// 1–100.
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// recency or confidence (default: relevance with TEXT, else recency).
    #[arg(long, value_parser = ["recency", "confidence"])]
    pub sort_by: Option<String>,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct RmArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    pub memory_id: String,
    /// Also delete .confine-memory/<memoryId>.md.
    #[arg(long)]
    pub delete_file: bool,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct SurfaceArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// A symbol the task touches (repeatable).
    #[arg(long = "symbol", value_name = "ID")]
    pub symbols: Vec<String>,
    /// A file the task touches, relative to the repository root (repeatable).
    #[arg(long = "file", value_name = "PATH")]
    pub files: Vec<String>,
    /// Only memories of this type: decision, bugfix or task_context (repeatable).
    #[arg(long = "type", value_name = "TYPE")]
    pub types: Vec<String>,
    /// 1–50.
    #[arg(long, default_value_t = 10)]
    pub limit: u32,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct AllArgs {
    /// Only this repository (default: every configured one).
    #[arg(long, value_name = "ID")]
    pub repo_id: Option<String>,
    /// Exit 1 when a memory is stale (check) or a file could not be read (sync).
    #[arg(long)]
    pub strict: bool,
    /// Print the reports as JSON, one per line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct LogArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Only this memory's entries.
    #[arg(long)]
    pub memory_id: Option<String>,
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// A failure and its exit code.
struct Failure(i32, String);

impl From<MemoryError> for Failure {
    fn from(e: MemoryError) -> Self {
        let code = match e {
            MemoryError::Invalid(_)
            | MemoryError::NotFound { .. }
            | MemoryError::UnknownRepo { .. }
            | MemoryError::Conflict { .. } => EXIT_REFUSED,
            _ => super::EXIT_CONFINE_FAILED,
        };
        Failure(code, e.to_string())
    }
}

fn refused(msg: impl Into<String>) -> Failure {
    Failure(EXIT_REFUSED, msg.into())
}

pub fn main(config: Option<&Path>, cmd: MemoryCommand) -> i32 {
    let prepared = Config::load(config)
        .map_err(|e| Failure(super::EXIT_CONFINE_FAILED, e.to_string()))
        .and_then(|cfg| Ok((resolve_here(&cfg, cmd)?, cfg)));
    let (cmd, cfg) = match prepared {
        Ok(p) => p,
        Err(f) => return report(&mut Io::std(), Err(f)),
    };
    super::with_store(&cfg, Relayed::Memory(cmd), |store, cmd, io| {
        let Relayed::Memory(cmd) = cmd else {
            return report(io, Err(Failure(super::EXIT_CONFINE_FAILED, "internal error: not a memory command".into())));
        };
        match MemoryService::open(&store, &cfg.repos) {
            Ok(svc) => run(&cfg, &svc, cmd, io),
            Err(e) => report(io, Err(e.into())),
        }
    })
}

/// What only this process can resolve, resolved before the command runs
/// here or is relayed to a server (another working directory, another
/// standard input): `--content-file` read into `--content`, `--repo DIR`
/// turned into its repository's id.
fn resolve_here(cfg: &Config, cmd: MemoryCommand) -> Result<MemoryCommand, Failure> {
    let by_id = |a: RepoArgs| -> Result<RepoArgs, Failure> {
        match &a.repo {
            Some(_) => Ok(RepoArgs { repo_id: Some(repo_id(cfg, &a)?), repo: None, json: a.json }),
            None => Ok(a),
        }
    };
    Ok(match cmd {
        MemoryCommand::Store(mut a) => {
            a.content = Some(content(&a)?);
            a.content_file = None;
            a.repo = by_id(a.repo)?;
            MemoryCommand::Store(a)
        }
        MemoryCommand::Query(mut a) => {
            a.repo = by_id(a.repo)?;
            MemoryCommand::Query(a)
        }
        MemoryCommand::Rm(mut a) => {
            a.repo = by_id(a.repo)?;
            MemoryCommand::Rm(a)
        }
        MemoryCommand::Surface(mut a) => {
            a.repo = by_id(a.repo)?;
            MemoryCommand::Surface(a)
        }
        MemoryCommand::Log(mut a) => {
            a.repo = by_id(a.repo)?;
            MemoryCommand::Log(a)
        }
        other => other,
    })
}

fn report(io: &mut Io, result: Result<i32, Failure>) -> i32 {
    match result {
        Ok(code) => code,
        Err(Failure(code, msg)) => {
            let _ = writeln!(io.err, "confine memory: {msg}");
            code
        }
    }
}

/// Run `cmd` with `svc`, writing to `io`.
pub(crate) fn run(cfg: &Config, svc: &MemoryService, cmd: MemoryCommand, io: &mut Io) -> i32 {
    let result = run_inner(cfg, svc, cmd, io);
    report(io, result)
}

fn run_inner(cfg: &Config, svc: &MemoryService, cmd: MemoryCommand, io: &mut Io) -> Result<i32, Failure> {
    match cmd {
        MemoryCommand::Store(a) => store_cmd(cfg, svc, a, io),
        MemoryCommand::Query(a) => query_cmd(cfg, svc, a, io),
        MemoryCommand::Rm(a) => {
            let req = RemoveRequest {
                repo_id: repo_id(cfg, &a.repo)?,
                memory_id: a.memory_id,
                delete_file: Some(a.delete_file),
            };
            let r = svc.remove(&req)?;
            let deleted = if r.file_deleted { " and its file" } else { "" };
            emit(io, a.repo.json, &r, |out| writeln!(out, "removed {}{deleted}", r.memory_id))
        }
        MemoryCommand::Surface(a) => surface_cmd(cfg, svc, a, io),
        MemoryCommand::Check(a) => each_repo(cfg, &a, |id| {
            let r = svc.check(id)?;
            let newly = if r.newly_stale.is_empty() {
                String::new()
            } else {
                format!(" (newly: {})", r.newly_stale.join(", "))
            };
            emit(io, a.json, &r, |out| writeln!(out, "{id}: {} checked, {} stale{newly}", r.checked, r.stale))?;
            Ok(a.strict && r.stale > 0)
        }),
        MemoryCommand::Sync(a) => each_repo(cfg, &a, |id| {
            let r = svc.sync(id)?;
            emit(io, a.json, &r, |out| {
                writeln!(
                    out,
                    "{id}: {} imported, {} updated, {} rewritten, {} unchanged, {} missing",
                    r.imported.len(),
                    r.updated.len(),
                    r.rewritten.len(),
                    r.unchanged,
                    r.missing.len()
                )
            })?;
            for p in &r.problems {
                let _ = writeln!(io.err, "confine memory: {id}: {}: {}", p.file, p.message);
            }
            Ok(a.strict && !r.problems.is_empty())
        }),
        MemoryCommand::Log(a) => {
            let entries = svc.log(&repo_id(cfg, &a.repo)?, a.memory_id.as_deref(), a.limit)?;
            for e in &entries {
                if a.repo.json {
                    writeln!(io.out, "{}", serde_json::to_string(e).unwrap_or_default()).map_err(io_failure)?;
                } else {
                    let detail = e.detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default();
                    writeln!(
                        io.out,
                        "{:>6}  {}  {:<16} {}  {}{detail}",
                        e.seq, e.timestamp, e.op, e.memory_id, e.title
                    )
                    .map_err(io_failure)?;
                }
            }
            Ok(0)
        }
    }
}

fn io_failure(e: std::io::Error) -> Failure {
    Failure(super::EXIT_CONFINE_FAILED, format!("cannot write the output: {e}"))
}

/// The repository a command names: `--repo-id`, `--repo DIR` (a configured
/// root), or the only configured repository.
fn repo_id(cfg: &Config, a: &RepoArgs) -> Result<String, Failure> {
    if let Some(id) = &a.repo_id {
        return Ok(id.clone());
    }
    if let Some(dir) = &a.repo {
        let want = std::fs::canonicalize(dir).map_err(|e| refused(format!("--repo {}: {e}", dir.display())))?;
        return cfg
            .repos
            .iter()
            .find(|r| std::fs::canonicalize(&r.root).is_ok_and(|root| root == want))
            .map(|r| r.id.clone())
            .ok_or_else(|| {
                refused(format!(
                    "--repo {}: no [[repos]] entry of confine.toml has this root (memories belong to a configured repository)",
                    dir.display()
                ))
            });
    }
    match cfg.repos.as_slice() {
        [only] => Ok(only.id.clone()),
        [] => Err(refused("no [[repos]] in confine.toml: add one (id and root) to keep memories")),
        many => Err(refused(format!(
            "several repositories are configured ({}): pick one with --repo-id or --repo DIR",
            many.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

fn memory_type(s: &str) -> Result<MemoryType, Failure> {
    MemoryType::parse(s).ok_or_else(|| refused(format!("unknown type '{s}': use decision, bugfix or task_context")))
}

/// Print `value` as JSON, or run `human`.
fn emit<T: Serialize>(
    io: &mut Io,
    json: bool,
    value: &T,
    human: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<i32, Failure> {
    if json {
        let text = serde_json::to_string(value).map_err(|e| Failure(super::EXIT_CONFINE_FAILED, e.to_string()))?;
        writeln!(io.out, "{text}").map_err(io_failure)?;
    } else {
        human(&mut io.out).map_err(io_failure)?;
    }
    Ok(0)
}

/// The content of `memory store`: `--content`, or `--content-file` (`-`:
/// standard input).
fn content(a: &StoreArgs) -> Result<String, Failure> {
    match (&a.content, &a.content_file) {
        (Some(c), _) => Ok(c.clone()),
        (None, Some(p)) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| refused(format!("reading standard input: {e}")))?;
            Ok(s)
        }
        (None, Some(p)) => {
            std::fs::read_to_string(p).map_err(|e| refused(format!("--content-file {}: {e}", p.display())))
        }
        (None, None) => Err(refused("give --content or --content-file")),
    }
}

fn store_cmd(cfg: &Config, svc: &MemoryService, a: StoreArgs, io: &mut Io) -> Result<i32, Failure> {
    let content = content(&a)?;
    let req = StoreRequest {
        repo_id: repo_id(cfg, &a.repo)?,
        memory_type: memory_type(&a.memory_type)?,
        title: a.title,
        content,
        tags: a.tags,
        confidence: a.confidence,
        symbol_ids: a.symbols,
        file_rel_paths: a.files,
        memory_id: a.memory_id,
    };
    let r = svc.store(&req)?;
    emit(io, a.repo.json, &r, |out| {
        let what = match (r.created, r.deduplicated) {
            (true, _) => "stored",
            (false, true) => "already stored as",
            (false, false) => "updated",
        };
        writeln!(out, "{what} {}", r.memory_id)
    })
}

fn query_cmd(cfg: &Config, svc: &MemoryService, a: MemoryQueryArgs, io: &mut Io) -> Result<i32, Failure> {
    let types = a.types.iter().map(|t| memory_type(t)).collect::<Result<Vec<_>, _>>()?;
    let req = MemoryQuery {
        repo_id: repo_id(cfg, &a.repo)?,
        query: a.text,
        types,
        tags: a.tags,
        symbol_ids: a.symbols,
        stale_only: Some(a.stale_only),
        limit: Some(a.limit),
        sort_by: a.sort_by.as_deref().map(|s| if s == "confidence" { SortBy::Confidence } else { SortBy::Recency }),
    };
    let r = svc.query(&req)?;
    emit(io, a.repo.json, &r, |out| {
        for m in &r.memories {
            writeln!(out, "{}", line(m, None))?;
        }
        writeln!(out, "{} of {} shown", r.memories.len(), r.total)
    })
}

fn surface_cmd(cfg: &Config, svc: &MemoryService, a: SurfaceArgs, io: &mut Io) -> Result<i32, Failure> {
    let req = SurfaceRequest {
        repo_id: repo_id(cfg, &a.repo)?,
        symbol_ids: a.symbols,
        file_rel_paths: a.files,
        types: a.types.iter().map(|t| memory_type(t)).collect::<Result<_, _>>()?,
        limit: Some(a.limit),
    };
    let r = svc.surface(&req)?;
    emit(io, a.repo.json, &r, |out| {
        for s in &r.memories {
            let matched: Vec<&str> = s.matched_symbols.iter().chain(&s.matched_files).map(String::as_str).collect();
            writeln!(out, "{}  (matched: {})", line(&s.memory, Some(s.score)), matched.join(", "))?;
        }
        Ok(())
    })
}

/// `mem_…  bugfix        0.90  2026-05-20T12:34:56.789Z  title [stale]`.
fn line(m: &Memory, score: Option<f64>) -> String {
    let score = score.map(|s| format!("{s:.3}  ")).unwrap_or_default();
    let stale = if m.stale { " [stale]" } else { "" };
    format!(
        "{score}{}  {:<12}  {:.2}  {}  {}{stale}",
        m.memory_id,
        m.memory_type.as_str(),
        m.confidence,
        m.updated_at,
        m.title
    )
}

/// Run `f` on `--repo-id` or every configured repository; exit 1 if any
/// run asked for it (`--strict`).
fn each_repo(cfg: &Config, a: &AllArgs, mut f: impl FnMut(&str) -> Result<bool, Failure>) -> Result<i32, Failure> {
    let ids: Vec<String> = match &a.repo_id {
        Some(id) => vec![id.clone()],
        None if cfg.repos.is_empty() => return Err(refused("no [[repos]] in confine.toml: nothing to do")),
        None => cfg.repos.iter().map(|r| r.id.clone()).collect(),
    };
    let mut flagged = false;
    for id in ids {
        flagged |= f(&id)?;
    }
    Ok(if flagged { EXIT_REFUSED } else { 0 })
}
