//! `confine audit ls | show | verify | export`: read the audit trail of the
//! store named by the configuration. Read-only: nothing here appends,
//! edits or removes a record.
//!
//! Exit status: 0 success, 1 `verify` found a broken link, 125 the store
//! or the configuration could not be opened.

use crate::config::Config;
use crate::store::audit::{AuditError, AuditLog, AuditRecord};
use crate::store::Store;
use clap::{Args, Subcommand};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Exit code of a `verify` that found a broken link.
pub const EXIT_BROKEN: i32 = 1;

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List the newest records, newest first.
    Ls(LsArgs),
    /// Show one record (by job id) as JSON.
    Show {
        /// The job id.
        id: String,
    },
    /// Walk the hash chain and report the first broken link.
    Verify,
    /// Write every record, oldest first, for SIEM ingestion.
    Export(ExportArgs),
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// How many records to show.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// JSON Lines: one record per line (the only format for now).
    #[arg(long, required = true)]
    pub jsonl: bool,
    /// Write to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("confine: {msg}");
    super::EXIT_CONFINE_FAILED
}

fn open(config: Option<&Path>) -> Result<AuditLog, String> {
    let cfg = Config::load(config).map_err(|e| e.to_string())?;
    let store = Store::open(&cfg.store_path()).map_err(|e| e.to_string())?;
    AuditLog::open(&store).map_err(|e| e.to_string())
}

pub fn main(config: Option<&Path>, cmd: AuditCommand) -> i32 {
    let log = match open(config) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let result = match cmd {
        AuditCommand::Ls(args) => ls(&log, &args),
        AuditCommand::Show { id } => log.get(&id).and_then(|r| print_json(&r, true)),
        AuditCommand::Verify => return verify(&log),
        AuditCommand::Export(args) => export(&log, &args),
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

fn print_json(record: &AuditRecord, pretty: bool) -> Result<(), AuditError> {
    let text = if pretty { serde_json::to_string_pretty(record) } else { serde_json::to_string(record) };
    let text = text.map_err(|e| AuditError::Corrupt { seq: record.seq, message: e.to_string() })?;
    writeln!(std::io::stdout(), "{text}")?;
    Ok(())
}

fn ls(log: &AuditLog, args: &LsArgs) -> Result<(), AuditError> {
    let records = log.list(args.limit)?;
    if args.json {
        return records.iter().try_for_each(|r| print_json(r, false));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{:>6}  {:<24}  {:<28}  {:<12}  {:<10}  {:<14}  {:<9}  EXIT",
        "SEQ", "TIME", "ID", "REPO", "RUNTIME", "EXECUTABLE", "STATUS"
    )?;
    for r in &records {
        let e = &r.entry;
        let status =
            serde_json::to_value(e.status).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default();
        let exit = match (e.exit_code, e.signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("sig {s}"),
            (None, None) => "-".into(),
        };
        writeln!(
            out,
            "{:>6}  {:<24}  {:<28}  {:<12}  {:<10}  {:<14}  {:<9}  {exit}",
            r.seq,
            r.timestamp,
            e.id,
            e.repo_id.as_deref().unwrap_or("-"),
            e.runtime,
            crate::runtimes::basename(&e.executable),
            status
        )?;
    }
    if records.is_empty() {
        writeln!(out, "(no audit records)")?;
    }
    Ok(())
}

fn verify(log: &AuditLog) -> i32 {
    match log.verify() {
        Ok(report) => match report.first_broken {
            None => {
                let _ = writeln!(std::io::stdout(), "ok: {} records, hash chain intact", report.records);
                0
            }
            Some(b) => {
                let id = b.id.map(|i| format!(" (id {i})")).unwrap_or_default();
                let _ = writeln!(
                    std::io::stdout(),
                    "broken: record {}{id}: {}; {} records before it are intact",
                    b.seq,
                    b.reason,
                    report.records
                );
                EXIT_BROKEN
            }
        },
        Err(e) => fail(e),
    }
}

fn export(log: &AuditLog, args: &ExportArgs) -> Result<(), AuditError> {
    let n = match &args.output {
        // Written whole, then renamed over the name (`safe_fs`): an export
        // into a directory a job shares never follows what it planted.
        Some(path) => {
            use crate::safe_fs::{OutputFile, WriteError};
            let out = OutputFile::prepare(path).map_err(|e| AuditError::Io(std::io::Error::other(e)))?;
            let exported = out.write_with(|f| {
                let mut w = std::io::BufWriter::new(f);
                let n = log.export_jsonl(&mut w)?;
                std::io::Write::flush(&mut w)?;
                Ok::<_, AuditError>(n)
            });
            match exported {
                Ok(n) => n,
                Err(WriteError::Content(e)) => return Err(e),
                Err(WriteError::Fs(e)) => return Err(AuditError::Io(std::io::Error::other(e))),
            }
        }
        None => log.export_jsonl(&mut std::io::stdout().lock())?,
    };
    eprintln!("confine: exported {n} audit records");
    Ok(())
}
