//! `confine artifacts ls | show | rm | query | view` and `confine gc`: the
//! stored output of jobs, in the store named by the configuration.
//!
//! Exit status: 0 success; 1 an unknown or incomplete handle, or a query
//! that asks for nothing; 125 the store or the configuration could not be
//! opened or read.

use super::Io;
use crate::config::Config;
use crate::output::modes::render_stored;
use crate::output::query::query_output;
use crate::output::{ArtifactQuery, OutputError, OutputMode, QueryStreams, RenderOptions};
use crate::relay::RelayedCommand as Relayed;
use crate::store::artifacts::{now_ms, ArtifactError, ArtifactMeta, Artifacts, StreamName};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// Exit code of a user error (unknown handle, empty query).
pub const EXIT_NOT_FOUND: i32 = 1;

#[derive(Debug, Subcommand, Serialize, Deserialize)]
pub enum ArtifactsCommand {
    /// List the stored artifacts, oldest first (incomplete and expired ones too).
    Ls {
        /// One JSON object per line instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write an artifact's output byte for byte: stdout to standard output and
    /// stderr to standard error, or only the stream named.
    Show {
        handle: String,
        /// Only this stream, to standard output: stdout or stderr.
        #[arg(long, value_parser = ["stdout", "stderr"])]
        stream: Option<String>,
    },
    /// Remove artifacts.
    Rm {
        #[arg(required = true)]
        handles: Vec<String>,
    },
    /// Excerpt windows around the lines matching any term (case-insensitive
    /// substrings), or a range of lines.
    #[command(
        after_help = "Examples:\n  confine artifacts query run-x-1774356909696-fc5a --terms error,FAIL --context 5\n  \
confine artifacts query run-x-1774356909696-fc5a --stream stderr --lines 100:200"
    )]
    Query(ArtifactQueryArgs),
    /// Show a stored artifact as a response mode would (minimal, summary, intent, digest).
    View(ViewArgs),
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct ArtifactQueryArgs {
    pub handle: String,
    /// Comma-separated search terms.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub terms: Vec<String>,
    /// Lines of context around each match (0–20).
    #[arg(long, value_name = "N")]
    pub context: Option<u32>,
    /// Excerpt windows to return (1–100).
    #[arg(long, value_name = "N")]
    pub max_excerpts: Option<u32>,
    /// stdout, stderr or both.
    #[arg(long, default_value = "both")]
    pub stream: String,
    /// Only lines START to END (1-based, inclusive); `START:` or `:END` work too.
    #[arg(long, value_name = "START:END")]
    pub lines: Option<String>,
    /// The response as JSON (the MCP `runtime_query_output` shape).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct ViewArgs {
    pub handle: String,
    /// minimal, summary, intent or digest.
    #[arg(long, default_value = "summary")]
    pub mode: String,
    /// Comma-separated terms for the excerpts and sections.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub terms: Vec<String>,
    /// Lines of stdout in a summary (10–1000).
    #[arg(long, value_name = "N")]
    pub max_response_lines: Option<u32>,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct GcArgs {
    /// Cap on the artifacts' total stored size, in bytes (default:
    /// `output.max_store_bytes` of the configuration, 1 GiB).
    #[arg(long, value_name = "BYTES")]
    pub max_bytes: Option<u64>,
    /// The report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// A failure and its exit code.
struct Failure(i32, String);

impl From<ArtifactError> for Failure {
    fn from(e: ArtifactError) -> Self {
        let code = match e {
            ArtifactError::NotFound(_) | ArtifactError::Incomplete(_) => EXIT_NOT_FOUND,
            _ => super::EXIT_CONFINE_FAILED,
        };
        Failure(code, e.to_string())
    }
}

impl From<OutputError> for Failure {
    fn from(e: OutputError) -> Self {
        match e {
            OutputError::Artifact(a) => a.into(),
            other => Failure(EXIT_NOT_FOUND, other.to_string()),
        }
    }
}

fn io_failure(e: std::io::Error) -> Failure {
    Failure(super::EXIT_CONFINE_FAILED, format!("cannot write the output: {e}"))
}

fn finish(io: &mut Io, result: Result<(), Failure>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(Failure(code, msg)) => {
            let _ = writeln!(io.err, "confine: {msg}");
            code
        }
    }
}

/// Run `command` on the store: relayed to the `confine serve` that holds
/// it, or here.
fn dispatch(config: Option<&Path>, command: Relayed) -> i32 {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return finish(&mut Io::std(), Err(Failure(super::EXIT_CONFINE_FAILED, e.to_string()))),
    };
    super::with_store(&cfg, command, |store, command, io| match Artifacts::open(&store) {
        Ok(a) => match command {
            Relayed::Artifacts(cmd) => run(&a, cmd, io),
            Relayed::Gc(args) => gc(&a, &cfg, args, io),
            _ => {
                finish(io, Err(Failure(super::EXIT_CONFINE_FAILED, "internal error: not an artifacts command".into())))
            }
        },
        Err(e) => finish(io, Err(Failure(super::EXIT_CONFINE_FAILED, e.to_string()))),
    })
}

pub fn main(config: Option<&Path>, cmd: ArtifactsCommand) -> i32 {
    dispatch(config, Relayed::Artifacts(cmd))
}

/// Run `cmd` on `a`, writing to `io`.
pub(crate) fn run(a: &Artifacts, cmd: ArtifactsCommand, io: &mut Io) -> i32 {
    let result = match cmd {
        ArtifactsCommand::Ls { json } => ls(a, json, io),
        ArtifactsCommand::Show { handle, stream } => show(a, &handle, stream.as_deref(), io),
        ArtifactsCommand::Rm { handles } => rm(a, &handles),
        ArtifactsCommand::Query(args) => query(a, args, io),
        ArtifactsCommand::View(args) => view(a, args, io),
    };
    finish(io, result)
}

/// `confine gc`.
pub fn gc_main(config: Option<&Path>, args: GcArgs) -> i32 {
    dispatch(config, Relayed::Gc(args))
}

/// Run `confine gc` on `a`, writing to `io`.
pub(crate) fn gc(a: &Artifacts, cfg: &Config, args: GcArgs, io: &mut Io) -> i32 {
    let result = (|| {
        let report = a.gc(args.max_bytes.unwrap_or(cfg.output.max_store_bytes))?;
        let text = if args.json {
            serde_json::to_string(&report).unwrap_or_default()
        } else {
            format!(
                "removed {} expired, {} incomplete, {} orphaned; evicted {} to fit the cap; freed {}; kept {} ({})",
                report.expired,
                report.incomplete,
                report.orphans,
                report.evicted,
                size(report.freed_bytes),
                report.kept,
                size(report.kept_bytes)
            )
        };
        writeln!(io.out, "{text}").map_err(io_failure)
    })();
    finish(io, result)
}

fn size(b: u64) -> String {
    match b {
        b if b < 1024 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b if b < 1 << 30 => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
        b => format!("{:.1} GiB", b as f64 / f64::from(1 << 30)),
    }
}

fn age(ms: i128) -> String {
    let s = ms.unsigned_abs() / 1000;
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn state(m: &ArtifactMeta, now: u64) -> String {
    if !m.complete {
        return "incomplete".into();
    }
    if m.expires_ms <= now {
        return "expired".into();
    }
    match (m.job.exit_code, m.job.signal) {
        (Some(c), _) => format!("exit {c}"),
        (None, Some(s)) => format!("signal {s}"),
        (None, None) => "done".into(),
    }
}

fn ls(a: &Artifacts, json: bool, io: &mut Io) -> Result<(), Failure> {
    let now = now_ms();
    let out = &mut io.out;
    let all = a.list()?;
    if !json {
        writeln!(
            out,
            "{:<48} {:<10} {:>10} {:>10} {:>6} {:>8}",
            "HANDLE", "STATE", "STDOUT", "STDERR", "AGE", "EXPIRES"
        )
        .map_err(io_failure)?;
    }
    for m in &all {
        let line = if json {
            serde_json::json!({
                "handle": m.handle, "repoId": m.repo_id, "complete": m.complete, "createdMs": m.created_ms,
                "expiresMs": m.expires_ms, "job": m.job,
                "stdout": {"totalBytes": m.stdout.total_bytes, "lines": m.stdout.stored_lines, "truncated": m.stdout.truncated, "sha256": m.stdout.sha256},
                "stderr": {"totalBytes": m.stderr.total_bytes, "lines": m.stderr.stored_lines, "truncated": m.stderr.truncated, "sha256": m.stderr.sha256},
                "storedBytes": m.compressed_bytes(),
            })
            .to_string()
        } else {
            let expires = if m.expires_ms > now { age(i128::from(m.expires_ms) - i128::from(now)) } else { "-".into() };
            format!(
                "{:<48} {:<10} {:>10} {:>10} {:>6} {:>8}",
                m.handle,
                state(m, now),
                size(m.stdout.total_bytes),
                size(m.stderr.total_bytes),
                age(i128::from(now) - i128::from(m.created_ms)),
                expires
            )
        };
        writeln!(out, "{line}").map_err(io_failure)?;
    }
    Ok(())
}

fn show(a: &Artifacts, handle: &str, stream: Option<&str>, io: &mut Io) -> Result<(), Failure> {
    let meta = a.get(handle)?;
    let result = match stream {
        Some("stderr") => a.copy_stream(&meta, StreamName::Stderr, &mut io.out),
        Some(_) => a.copy_stream(&meta, StreamName::Stdout, &mut io.out),
        None => a.copy_stream(&meta, StreamName::Stdout, &mut io.out).and_then(|_| {
            let _ = io.out.flush();
            a.copy_stream(&meta, StreamName::Stderr, &mut io.err)
        }),
    };
    match result {
        // A reader that stopped early (`| head`) is not an error.
        Err(ArtifactError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map(|_| ()).map_err(Failure::from),
    }
}

fn rm(a: &Artifacts, handles: &[String]) -> Result<(), Failure> {
    let mut missing = Vec::new();
    for h in handles {
        if !a.remove(h)? {
            missing.push(h.as_str());
        }
    }
    match missing.as_slice() {
        [] => Ok(()),
        [one] => Err(ArtifactError::NotFound(one.to_string()).into()),
        many => {
            Err(Failure(EXIT_NOT_FOUND, format!("artifacts not found (expired or never stored): {}", many.join(", "))))
        }
    }
}

fn query(a: &Artifacts, args: ArtifactQueryArgs, io: &mut Io) -> Result<(), Failure> {
    let mut req = ArtifactQuery {
        artifact_handle: args.handle,
        query_terms: args.terms,
        context_lines: args.context,
        max_excerpts: args.max_excerpts,
        stream: args.stream.parse::<QueryStreams>()?,
        ..ArtifactQuery::default()
    };
    if let Some(spec) = &args.lines {
        req.set_range(spec)?;
    }
    let r = query_output(a, &req)?;
    let out = &mut io.out;
    if args.json {
        return writeln!(out, "{}", serde_json::to_string_pretty(&r).unwrap_or_default()).map_err(io_failure);
    }
    for e in &r.excerpts {
        writeln!(out, "==> {}:{}-{} <==\n{}\n", e.source, e.line_start, e.line_end, e.content).map_err(io_failure)?;
    }
    let streams: Vec<&str> = r.searched_streams.iter().map(|s| s.as_str()).collect();
    writeln!(
        out,
        "{} matching lines; {} excerpts{} ({}: {} lines, {})",
        r.matched_lines,
        r.excerpts.len(),
        if r.more_excerpts { ", more with --max-excerpts" } else { "" },
        streams.join("+"),
        r.total_lines,
        size(r.total_bytes)
    )
    .map_err(io_failure)?;
    for n in &r.notes {
        writeln!(out, "note: {n}").map_err(io_failure)?;
    }
    Ok(())
}

fn view(a: &Artifacts, args: ViewArgs, io: &mut Io) -> Result<(), Failure> {
    let opts = RenderOptions {
        output_mode: args.mode.parse::<OutputMode>()?,
        max_response_lines: args.max_response_lines,
        query_terms: args.terms,
        inline_bytes: None,
    };
    let meta = a.get(&args.handle)?;
    let v = render_stored(a, &meta, &opts)?;
    writeln!(io.out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default()).map_err(io_failure)
}
