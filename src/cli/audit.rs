//! `confine audit ls | show | verify | export`: read the audit trail of the
//! store named by the configuration. Read-only: nothing here appends,
//! edits or removes a record.
//!
//! Exit status: 0 success, 1 `verify` found a broken link, 125 the store
//! or the configuration could not be opened.

use super::Io;
use crate::config::Config;
use crate::relay::RelayedCommand as Relayed;
use crate::store::audit::{AuditError, AuditLog, AuditRecord};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Exit code of a `verify` that found a broken link.
pub const EXIT_BROKEN: i32 = 1;

#[derive(Debug, Subcommand, Serialize, Deserialize)]
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

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct LsArgs {
    /// How many records to show.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Serialize, Deserialize)]
pub struct ExportArgs {
    /// JSON Lines: one record per line (the only format for now).
    #[arg(long, required = true)]
    pub jsonl: bool,
    /// Write to FILE instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

fn fail(io: &mut Io, msg: impl std::fmt::Display) -> i32 {
    let _ = writeln!(io.err, "confine: {msg}");
    super::EXIT_CONFINE_FAILED
}

pub fn main(config: Option<&Path>, cmd: AuditCommand) -> i32 {
    let cfg = match Config::load(config) {
        Ok(c) => c,
        Err(e) => return fail(&mut Io::std(), e),
    };
    let cmd = match cmd {
        // The file is named here, where the command runs: a server it is
        // relayed to has another working directory.
        AuditCommand::Export(mut args) => {
            args.output = args.output.map(|p| std::path::absolute(&p).unwrap_or(p));
            AuditCommand::Export(args)
        }
        other => other,
    };
    super::with_store(&cfg, Relayed::Audit(cmd), |store, cmd, io| match (AuditLog::open(&store), cmd) {
        (Ok(log), Relayed::Audit(cmd)) => run(&log, cmd, io),
        (Err(e), _) => fail(io, e),
        (Ok(_), _) => fail(io, "internal error: not an audit command"),
    })
}

/// Run `cmd` on `log`, writing to `io`.
pub(crate) fn run(log: &AuditLog, cmd: AuditCommand, io: &mut Io) -> i32 {
    let result = match cmd {
        AuditCommand::Ls(args) => ls(log, &args, io),
        AuditCommand::Show { id } => log.get(&id).and_then(|r| print_json(&mut io.out, &r, true)),
        AuditCommand::Verify => return verify(log, io),
        AuditCommand::Export(args) => export(log, &args, io),
    };
    match result {
        Ok(()) => 0,
        Err(e) => fail(io, e),
    }
}

fn print_json(out: &mut dyn Write, record: &AuditRecord, pretty: bool) -> Result<(), AuditError> {
    let text = if pretty { serde_json::to_string_pretty(record) } else { serde_json::to_string(record) };
    let text = text.map_err(|e| AuditError::Corrupt { seq: record.seq, message: e.to_string() })?;
    writeln!(out, "{text}")?;
    Ok(())
}

fn ls(log: &AuditLog, args: &LsArgs, io: &mut Io) -> Result<(), AuditError> {
    let records = log.list(args.limit)?;
    let out = &mut io.out;
    if args.json {
        return records.iter().try_for_each(|r| print_json(out, r, false));
    }
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

fn verify(log: &AuditLog, io: &mut Io) -> i32 {
    match log.verify() {
        Ok(report) => match report.first_broken {
            None => {
                let _ = writeln!(io.out, "ok: {} records, hash chain intact", report.records);
                0
            }
            Some(b) => {
                let id = b.id.map(|i| format!(" (id {i})")).unwrap_or_default();
                let _ = writeln!(
                    io.out,
                    "broken: record {}{id}: {}; {} records before it are intact",
                    b.seq, b.reason, report.records
                );
                EXIT_BROKEN
            }
        },
        Err(e) => fail(io, e),
    }
}

fn export(log: &AuditLog, args: &ExportArgs, io: &mut Io) -> Result<(), AuditError> {
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
        None => log.export_jsonl(&mut io.out)?,
    };
    writeln!(io.err, "confine: exported {n} audit records")?;
    Ok(())
}
