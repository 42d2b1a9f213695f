//! `runtime_query_output` and `confine artifacts query`: excerpt windows of
//! a stored artifact around lines that match the terms, or a line range.
//!
//! Terms match case-insensitively (ASCII) as substrings. Each match gets
//! `contextLines` lines on both sides; windows that overlap or touch are
//! merged. Out-of-range knobs are clamped, never refused, and the response
//! says so in `notes`.

use super::chunked::ArtifactLines;
use super::lines::{LineSource, Terms};
use super::{cap_line, OutputError};
use crate::store::artifacts::{Artifacts, StreamName};
use serde::{Deserialize, Serialize};

pub const DEFAULT_CONTEXT: u32 = 3;
pub const MAX_CONTEXT: u32 = 20;
pub const DEFAULT_EXCERPTS: u32 = 10;
pub const MAX_EXCERPTS: u32 = 100;
/// Lines a line-range read returns per stream.
pub const MAX_RANGE_LINES: u64 = 1000;

/// Which streams to search.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueryStreams {
    Stdout,
    Stderr,
    #[default]
    Both,
}

impl QueryStreams {
    pub fn streams(self) -> &'static [StreamName] {
        match self {
            QueryStreams::Stdout => &[StreamName::Stdout],
            QueryStreams::Stderr => &[StreamName::Stderr],
            QueryStreams::Both => &StreamName::BOTH,
        }
    }
}

impl std::str::FromStr for QueryStreams {
    type Err = OutputError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stdout" => Ok(QueryStreams::Stdout),
            "stderr" => Ok(QueryStreams::Stderr),
            "both" => Ok(QueryStreams::Both),
            _ => Err(OutputError::BadStream(s.to_string())),
        }
    }
}

/// A query, as MCP's `runtime_query_output` takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactQuery {
    pub artifact_handle: String,
    #[serde(default)]
    pub query_terms: Vec<String>,
    /// Lines of context around each match (0–20, default 3).
    pub context_lines: Option<u32>,
    /// Excerpt windows returned (1–100, default 10).
    pub max_excerpts: Option<u32>,
    #[serde(default)]
    pub stream: QueryStreams,
    /// First line of a range (1-based), alone or with `lineEnd`.
    pub line_start: Option<u64>,
    /// Last line of a range, inclusive.
    pub line_end: Option<u64>,
}

impl ArtifactQuery {
    /// Parse `START:END`, `START:` or `:END` into the range fields.
    pub fn set_range(&mut self, spec: &str) -> Result<(), OutputError> {
        let bad = || OutputError::BadRange(spec.to_string());
        let (a, b) = spec.split_once(':').ok_or_else(bad)?;
        let num =
            |s: &str| if s.trim().is_empty() { Ok(None) } else { s.trim().parse::<u64>().map(Some).map_err(|_| bad()) };
        self.line_start = num(a)?;
        self.line_end = num(b)?;
        Ok(())
    }
}

/// One excerpt window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputExcerpt {
    pub line_start: u64,
    pub line_end: u64,
    /// The lines, joined by `\n`, each capped at 500 characters.
    pub content: String,
    pub source: StreamName,
}

/// The answer to a query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueryResponse {
    pub artifact_handle: String,
    pub excerpts: Vec<OutputExcerpt>,
    /// Lines stored in the searched streams.
    pub total_lines: u64,
    /// Bytes the job wrote to the searched streams.
    pub total_bytes: u64,
    pub searched_streams: Vec<StreamName>,
    /// Lines that matched a term, in all windows, kept or not.
    pub matched_lines: u64,
    /// More windows matched than `maxExcerpts`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more_excerpts: bool,
    /// Clamped knobs, truncated streams, ranges past the end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Query a stored artifact.
pub fn query_output(artifacts: &Artifacts, req: &ArtifactQuery) -> Result<QueryResponse, OutputError> {
    if req.query_terms.iter().all(|t| t.trim().is_empty()) && req.line_start.is_none() && req.line_end.is_none() {
        return Err(OutputError::NoTerms);
    }
    let meta = artifacts.get(&req.artifact_handle)?;
    let sources: Vec<ArtifactLines> =
        req.stream.streams().iter().map(|&s| ArtifactLines::new(artifacts, &meta, s)).collect();
    let sources: Vec<&dyn LineSource> = sources.iter().map(|s| s as &dyn LineSource).collect();
    query_sources(&req.artifact_handle, &sources, req)
}

/// Query any line sources (stored, or inline output that was not stored).
pub fn query_sources(
    handle: &str,
    sources: &[&dyn LineSource],
    req: &ArtifactQuery,
) -> Result<QueryResponse, OutputError> {
    let terms = Terms::new(&req.query_terms);
    let ranged = req.line_start.is_some() || req.line_end.is_some();
    if terms.is_empty() && !ranged {
        return Err(OutputError::NoTerms);
    }
    let (first, last) = (req.line_start.unwrap_or(1), req.line_end.unwrap_or(u64::MAX));
    if first == 0 || last < first {
        return Err(OutputError::BadRange(format!("{first}:{last}")));
    }
    let mut notes = terms.notes.clone();
    let ctx = clamp("contextLines", req.context_lines.unwrap_or(DEFAULT_CONTEXT), 0, MAX_CONTEXT, &mut notes);
    let max = clamp("maxExcerpts", req.max_excerpts.unwrap_or(DEFAULT_EXCERPTS), 1, MAX_EXCERPTS, &mut notes) as usize;

    let mut per_stream: Vec<Vec<(u64, u64)>> = Vec::new();
    let (mut matched, mut more) = (0, false);
    for src in sources {
        let total = src.total_lines();
        let name = src.stream();
        if ranged && last > total {
            notes.push(format!("{name} has {total} lines; lines {first}..{last} asked"));
        }
        if let Some(d) = &src.meta().dropped {
            let first = d.after_line + 1;
            let what = match d.resume_line.saturating_sub(1) {
                last if last > first => format!("lines {first}..{last}"),
                _ => format!("line {first}"),
            };
            notes.push(format!(
                "{name} was truncated: {} bytes of {what} were dropped to fit its stored cap; the lines before and after are stored",
                d.bytes
            ));
        } else if src.meta().truncated {
            notes.push(format!(
                "{name} was truncated: {} of {} bytes stored",
                src.meta().stored_bytes,
                src.meta().total_bytes
            ));
        }
        if !src.complete() {
            notes.push(format!("{name} was not stored: only its first and last lines were searched"));
        }
        let hi = last.min(total);
        if terms.is_empty() {
            let end = hi.min(first.saturating_add(MAX_RANGE_LINES - 1));
            if end < hi {
                notes.push(format!(
                    "{name}: at most {MAX_RANGE_LINES} lines are returned; ask for {}:{hi} next",
                    end + 1
                ));
            }
            per_stream.push(if first <= end { vec![(first, end)] } else { Vec::new() });
            continue;
        }
        let m = src.find(&terms, first, hi, u64::from(ctx), max)?;
        matched += m.total;
        more |= m.more;
        per_stream.push(windows(&m.lines, u64::from(ctx), first, hi));
    }
    let picked = round_robin(&per_stream, if terms.is_empty() { usize::MAX } else { max });
    more |= picked.iter().map(Vec::len).sum::<usize>() < per_stream.iter().map(Vec::len).sum::<usize>();
    let mut excerpts = Vec::new();
    for (src, wins) in sources.iter().zip(&picked) {
        for &(a, b) in wins {
            let lines = src.lines(a, b)?;
            let content: Vec<String> = lines.iter().map(|l| cap_line(&l.text, l.cut)).collect();
            let (s, e) = (lines.first().map_or(a, |l| l.no), lines.last().map_or(b, |l| l.no));
            excerpts.push(OutputExcerpt {
                line_start: s,
                line_end: e,
                content: content.join("\n"),
                source: src.stream(),
            });
        }
    }
    Ok(QueryResponse {
        artifact_handle: handle.to_string(),
        excerpts,
        total_lines: sources.iter().map(|s| s.total_lines()).sum(),
        total_bytes: sources.iter().map(|s| s.meta().total_bytes).sum(),
        searched_streams: sources.iter().map(|s| s.stream()).collect(),
        matched_lines: matched,
        more_excerpts: more,
        notes,
    })
}

fn clamp(name: &str, v: u32, lo: u32, hi: u32, notes: &mut Vec<String>) -> u32 {
    let c = v.clamp(lo, hi);
    if c != v {
        notes.push(format!("{name} {v} is outside {lo}..{hi}; {c} was used"));
    }
    c
}

/// Windows of `ctx` lines around each match, inside `lo..=hi`, merged when
/// they overlap or touch.
pub fn windows(matches: &[u64], ctx: u64, lo: u64, hi: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &m in matches {
        let (a, b) = (m.saturating_sub(ctx).max(lo), m.saturating_add(ctx).min(hi));
        match out.last_mut() {
            Some(w) if a <= w.1 + 1 => w.1 = w.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// Up to `max` windows, taken from each stream in turn so that one noisy
/// stream can't crowd out the other.
fn round_robin(per_stream: &[Vec<(u64, u64)>], max: usize) -> Vec<Vec<(u64, u64)>> {
    let mut picked: Vec<Vec<(u64, u64)>> = vec![Vec::new(); per_stream.len()];
    let mut taken = 0;
    for i in 0.. {
        let mut any = false;
        for (s, wins) in per_stream.iter().enumerate() {
            if taken < max {
                if let Some(&w) = wins.get(i) {
                    picked[s].push(w);
                    taken += 1;
                    any = true;
                }
            }
        }
        if !any {
            break;
        }
    }
    picked
}

#[cfg(test)]
mod tests;
