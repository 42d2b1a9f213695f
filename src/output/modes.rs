//! The response of `confine exec --output-mode` and MCP `runtime_execute`:
//! one [`OutputView`] shape whose optional parts depend on the mode.
//!
//! - `minimal`: status, exit code, signal, duration, handle, line and byte
//!   counts (about 50 tokens; `truncation` only when something was cut).
//! - `summary`: + head and tail of stdout (`maxResponseLines`, 10–1000,
//!   default 100), tail of stderr, excerpts matching `queryTerms`.
//! - `intent`: excerpts, and for large output the BM25-ranked sections.
//! - `digest`: counts, and error and warning lines deduplicated with counts.
//!
//! Every line shown is capped at 500 characters (`[truncated]`).

use super::capture::Captured;
use super::chunked::ArtifactLines;
use super::digest::{digest, Digest};
use super::lines::{InlineLines, LineSource, Terms};
use super::query::{query_sources, ArtifactQuery, OutputExcerpt};
use super::sections::{rank, Section};
use super::{cap_line, OutputError, OutputMode};
use crate::job::Status;
use crate::store::artifacts::{ArtifactMeta, Artifacts, JobInfo, StreamName};
use serde::{Deserialize, Serialize};

pub const DEFAULT_RESPONSE_LINES: u32 = 100;
/// Output up to this many bytes (stdout and stderr together) is in the
/// response itself, whatever the mode: a job that prints `42` needs one
/// call, not a second one to read it.
pub const DEFAULT_INLINE_BYTES: u32 = 1024;
/// The most a caller may ask to have inline.
pub const MAX_INLINE_BYTES: u32 = 64 * 1024;
/// Output above this many bytes gets ranked sections in intent mode.
pub const INTENT_SECTIONS_ABOVE: u64 = 5 * 1024;
/// Intent mode without terms looks for failures.
pub const DEFAULT_INTENT_TERMS: &[&str] = &["error", "fail", "panic", "exception", "traceback", "warning"];
const SUMMARY_CONTEXT: u32 = 2;
const MAX_SECTIONS: usize = 10;

/// What the caller asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderOptions {
    #[serde(default)]
    pub output_mode: OutputMode,
    pub max_response_lines: Option<u32>,
    #[serde(default)]
    pub query_terms: Vec<String>,
    /// Output up to this many bytes is inline (default
    /// [`DEFAULT_INLINE_BYTES`], at most [`MAX_INLINE_BYTES`]; 0: never).
    #[serde(default)]
    pub inline_bytes: Option<u32>,
}

/// Whether a stream was cut at its stored cap, and its real size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputTruncation {
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub total_stdout_bytes: u64,
    pub total_stderr_bytes: u64,
}

/// The output part of a job's response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputView {
    pub status: Option<Status>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub artifact_handle: Option<String>,
    /// Lines of stdout and stderr together.
    pub output_lines: u64,
    /// Bytes of stdout and stderr together, as the job wrote them.
    pub output_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<OutputTruncation>,
    /// The whole stdout, when the output fits in the inline cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// The whole stderr, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excerpts: Option<Vec<OutputExcerpt>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sections: Option<Vec<Section>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Digest>,
    /// A failed job whose output is not in the answer: the digest's terms,
    /// for `runtime_query_output` (its failing lines in context).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggested_terms: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Everything a render reads. `full` is the whole output (stored, or only
/// inline when it was not persisted); `ends` gives the head and tail (the
/// inline buffers when there are any: past the stored cap they still hold
/// the real end of the output).
pub struct RenderInput<'a> {
    pub job: &'a JobInfo,
    pub handle: Option<&'a str>,
    pub full: [&'a dyn LineSource; 2],
    pub ends: [&'a dyn LineSource; 2],
    pub notes: &'a [String],
}

/// Render a fresh capture.
pub fn render(
    captured: &Captured,
    artifacts: Option<&Artifacts>,
    job: &JobInfo,
    opts: &RenderOptions,
) -> Result<OutputView, OutputError> {
    let inline = [InlineLines::new(&captured.stdout), InlineLines::new(&captured.stderr)];
    let ends: [&dyn LineSource; 2] = [&inline[0], &inline[1]];
    match (artifacts, &captured.artifact) {
        (Some(a), Some(meta)) => {
            let stored = StreamName::BOTH.map(|s| ArtifactLines::new(a, meta, s));
            let full: [&dyn LineSource; 2] = [&stored[0], &stored[1]];
            render_input(&RenderInput { job, handle: Some(&meta.handle), full, ends, notes: &captured.notes }, opts)
        }
        _ => render_input(&RenderInput { job, handle: None, full: ends, ends, notes: &captured.notes }, opts),
    }
}

/// Render a stored artifact again (`confine artifacts view`).
pub fn render_stored(
    artifacts: &Artifacts,
    meta: &ArtifactMeta,
    opts: &RenderOptions,
) -> Result<OutputView, OutputError> {
    let stored = StreamName::BOTH.map(|s| ArtifactLines::new(artifacts, meta, s));
    let full: [&dyn LineSource; 2] = [&stored[0], &stored[1]];
    render_input(&RenderInput { job: &meta.job, handle: Some(&meta.handle), full, ends: full, notes: &[] }, opts)
}

pub fn render_input(input: &RenderInput, opts: &RenderOptions) -> Result<OutputView, OutputError> {
    let [out, err] = input.full;
    let (om, em) = (out.meta(), err.meta());
    let truncation = OutputTruncation {
        stdout_truncated: om.truncated,
        stderr_truncated: em.truncated,
        total_stdout_bytes: om.total_bytes,
        total_stderr_bytes: em.total_bytes,
    };
    let mode = opts.output_mode;
    let mut view = OutputView {
        status: input.job.status,
        exit_code: input.job.exit_code,
        signal: input.job.signal,
        duration_ms: input.job.duration_ms,
        artifact_handle: input.handle.map(str::to_string),
        output_lines: om.total_lines + em.total_lines,
        output_bytes: om.total_bytes + em.total_bytes,
        truncation: (mode != OutputMode::Minimal || om.truncated || em.truncated).then_some(truncation),
        stdout: None,
        stderr: None,
        stdout_summary: None,
        stderr_summary: None,
        excerpts: None,
        sections: None,
        digest: None,
        suggested_terms: Vec::new(),
        notes: input.notes.to_vec(),
    };
    let asked = opts.max_response_lines.unwrap_or(DEFAULT_RESPONSE_LINES);
    let n = asked.clamp(10, 1000);
    if n != asked && mode != OutputMode::Minimal {
        view.notes.push(format!("maxResponseLines {asked} is outside 10..1000; {n} was used"));
    }
    let mut terms = opts.query_terms.clone();
    match mode {
        OutputMode::Minimal => {}
        OutputMode::Summary => {
            view.stdout_summary = Some(head_and_tail(input.ends[0], u64::from(n))?);
            view.stderr_summary = Some(tail(input.ends[1], u64::from(n / 2))?);
            view.excerpts = excerpts(input, &terms, &mut view.notes)?;
        }
        OutputMode::Intent => {
            if Terms::new(&terms).is_empty() {
                terms = DEFAULT_INTENT_TERMS.iter().map(|t| t.to_string()).collect();
                view.notes.push(format!("no queryTerms: looked for {}", terms.join(", ")));
            }
            view.excerpts = excerpts(input, &terms, &mut view.notes)?;
            if view.output_bytes > INTENT_SECTIONS_ABOVE {
                let (sections, notes) = rank(&input.full, &Terms::new(&terms), MAX_SECTIONS)?;
                view.sections = Some(sections);
                view.notes.extend(notes);
            }
        }
        OutputMode::Digest => view.digest = Some(digest(&input.full, n as usize)?),
    }
    let cap = u64::from(opts.inline_bytes.unwrap_or(DEFAULT_INLINE_BYTES).min(MAX_INLINE_BYTES));
    let whole = !om.truncated && !em.truncated && input.ends.iter().all(|s| s.complete());
    if view.output_bytes <= cap && whole {
        for (slot, src) in [&mut view.stdout, &mut view.stderr].into_iter().zip(input.ends) {
            let total = src.total_lines();
            if total > 0 {
                *slot = Some(join(&src.lines(1, total)?).join("\n"));
            }
        }
        // The whole output is there: a summary of it would be a copy, and
        // a small output has no gap to report.
        view.stdout_summary = None;
        view.stderr_summary = None;
        if mode == OutputMode::Summary {
            view.truncation = None;
        }
    }
    // A failure whose output is not here: what to ask for next, so that
    // the failing lines take one more call.
    let failed = input.job.status.is_some_and(|s| s != Status::Success);
    let inline = view.stdout.is_some() || view.stderr.is_some();
    if failed && !inline && view.digest.is_none() && view.output_bytes > 0 && out.complete() {
        view.suggested_terms = digest(&input.full, 1)?.terms;
    }
    if mode != OutputMode::Minimal && !out.complete() {
        view.notes.push("output was not stored: only its inline head and tail were read".into());
    }
    Ok(view)
}

fn excerpts(
    input: &RenderInput,
    terms: &[String],
    notes: &mut Vec<String>,
) -> Result<Option<Vec<OutputExcerpt>>, OutputError> {
    if Terms::new(terms).is_empty() {
        return Ok(None);
    }
    let req = ArtifactQuery {
        artifact_handle: input.handle.unwrap_or_default().to_string(),
        query_terms: terms.to_vec(),
        context_lines: Some(SUMMARY_CONTEXT),
        ..ArtifactQuery::default()
    };
    let r = query_sources(&req.artifact_handle, &input.full, &req)?;
    for n in r.notes {
        if !notes.contains(&n) && !n.contains("was not stored") {
            notes.push(n);
        }
    }
    if r.more_excerpts {
        notes.push(format!("{} lines matched; more excerpts with runtime_query_output", r.matched_lines));
    }
    Ok(Some(r.excerpts))
}

fn join(lines: &[super::lines::Line]) -> Vec<String> {
    lines.iter().map(|l| cap_line(&l.text, l.cut)).collect()
}

/// At most `n` lines: the first half and the last half, and a marker line
/// for what is between.
fn head_and_tail(src: &dyn LineSource, n: u64) -> Result<String, OutputError> {
    let total = src.total_lines();
    if total <= n {
        return Ok(join(&src.lines(1, total)?).join("\n"));
    }
    let head = src.lines(1, n / 2)?;
    let tail = src.lines(total - (n - n / 2) + 1, total)?;
    let omitted = total - head.len() as u64 - tail.len() as u64;
    let mut out = join(&head);
    out.push(format!("… {omitted} lines omitted …"));
    out.extend(join(&tail));
    Ok(out.join("\n"))
}

fn tail(src: &dyn LineSource, n: u64) -> Result<String, OutputError> {
    let total = src.total_lines();
    Ok(join(&src.lines(total.saturating_sub(n) + 1, total)?).join("\n"))
}

#[cfg(test)]
mod tests;
