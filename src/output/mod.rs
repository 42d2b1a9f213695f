//! Job output, from the pipe to the response: streaming capture (redaction,
//! SHA-256, gzip chunks into the artifact store), the response modes
//! (`minimal`, `summary`, `intent`, `digest`) and artifact queries
//! (`runtime_query_output`, `confine artifacts query`).
//!
//! Output is never held whole in memory: capture keeps a bounded head and
//! tail inline, and readers decode one chunk at a time. Every line shown to
//! a caller goes through [`cap_line`] (500 characters, then `[truncated]`).
//! Storage itself is [`crate::store::artifacts`]'s business.

pub mod capture;
pub mod chunked;
pub mod digest;
pub mod lines;
pub mod modes;
pub mod query;
pub mod redact;
pub mod sections;
mod worker;

pub use crate::store::artifacts::{ArtifactError, JobInfo, StreamMeta, StreamName};
pub use capture::{capture, Capture, Captured, StreamSink, StreamSummary};
pub use modes::{render, OutputView, RenderOptions};
pub use query::{query_output, Excerpt, QueryRequest, QueryResponse, StreamSelect};
pub use redact::Redactor;

use serde::{Deserialize, Serialize};

/// Longest line shown, in characters.
pub const MAX_LINE_CHARS: usize = 500;
/// Appended to a line that was cut.
pub const TRUNCATED: &str = "[truncated]";

/// Errors of output capture, rendering and queries.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// A query with nothing to look for.
    #[error("nothing to query: give search terms (--terms a,b / queryTerms) or a line range (--lines 100:200)")]
    NoTerms,
    #[error("bad line range '{0}': use START:END with 1 <= START <= END, e.g. 100:200")]
    BadRange(String),
    #[error("unknown output mode '{0}': use minimal, summary, intent or digest")]
    BadMode(String),
    #[error("unknown stream '{0}': use stdout, stderr or both")]
    BadStream(String),
}

/// How much of a job's response is output, from least to most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    /// Status, exit code, signal, duration, handle, line and byte counts.
    #[default]
    Minimal,
    /// Head and tail of stdout, tail of stderr, excerpts matching the terms.
    Summary,
    /// The excerpts and the best sections (BM25) for the terms only.
    Intent,
    /// Counts, and the error and warning lines deduplicated with counts.
    Digest,
}

impl std::str::FromStr for OutputMode {
    type Err = OutputError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "minimal" => Ok(OutputMode::Minimal),
            "summary" => Ok(OutputMode::Summary),
            "intent" => Ok(OutputMode::Intent),
            "digest" => Ok(OutputMode::Digest),
            _ => Err(OutputError::BadMode(s.to_string())),
        }
    }
}

/// Caps of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Kept in memory for the response (half head, half tail).
    pub inline_bytes: usize,
    /// Stored in the artifact; past it output is drained and counted only.
    pub stored_bytes: u64,
}

/// Output settings (a `[output]` table for confine.toml).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    pub stdout_inline_bytes: usize,
    pub stdout_stored_bytes: u64,
    pub stderr_inline_bytes: usize,
    pub stderr_stored_bytes: u64,
    /// How long artifacts are kept.
    pub ttl_secs: u64,
    /// Total size of all artifacts; past it `gc` evicts the oldest.
    pub max_store_bytes: u64,
    /// Replace secrets with `[REDACTED]` before anything is stored or shown.
    pub redact: bool,
    /// Environment variables whose values are secrets to redact.
    pub redact_env: Vec<String>,
}

impl Default for OutputConfig {
    fn default() -> Self {
        OutputConfig {
            stdout_inline_bytes: 1 << 20,
            stdout_stored_bytes: 64 << 20,
            stderr_inline_bytes: 256 << 10,
            stderr_stored_bytes: 16 << 20,
            ttl_secs: 24 * 3600,
            max_store_bytes: crate::store::artifacts::DEFAULT_MAX_TOTAL_BYTES,
            redact: true,
            redact_env: Vec::new(),
        }
    }
}

impl OutputConfig {
    pub fn limits(&self, stream: StreamName) -> StreamLimits {
        match stream {
            StreamName::Stdout => {
                StreamLimits { inline_bytes: self.stdout_inline_bytes, stored_bytes: self.stdout_stored_bytes }
            }
            StreamName::Stderr => {
                StreamLimits { inline_bytes: self.stderr_inline_bytes, stored_bytes: self.stderr_stored_bytes }
            }
        }
    }

    pub fn ttl_ms(&self) -> u64 {
        self.ttl_secs.saturating_mul(1000)
    }

    /// The redactor for these settings, `None` when redaction is off.
    /// `lookup` gives the value of an environment variable (the job's own
    /// environment and confine's, as the caller sees fit).
    pub fn redactor(&self, lookup: impl Fn(&str) -> Option<String>) -> Option<Redactor> {
        self.redact.then(|| Redactor::new(self.redact_env.iter().filter_map(|name| lookup(name))))
    }
}

/// A line as shown to a caller: lossy UTF-8, a trailing `\r` dropped, at
/// most [`MAX_LINE_CHARS`] characters, then `[truncated]` when anything was
/// cut (here, or before: `cut` says the caller saw only a prefix).
pub fn cap_line(line: &[u8], cut: bool) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let text = String::from_utf8_lossy(line);
    match text.char_indices().nth(MAX_LINE_CHARS) {
        Some((at, _)) => format!("{}{TRUNCATED}", &text[..at]),
        None if cut => format!("{text}{TRUNCATED}"),
        None => text.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_capped_at_500_characters() {
        assert_eq!(cap_line(b"short\r", false), "short");
        let long = "é".repeat(600);
        let capped = cap_line(long.as_bytes(), false);
        assert_eq!(capped.chars().count(), MAX_LINE_CHARS + TRUNCATED.len());
        assert!(capped.ends_with("é[truncated]"));
        assert_eq!(cap_line("x".repeat(500).as_bytes(), false).len(), 500);
        assert_eq!(cap_line(b"prefix", true), "prefix[truncated]");
    }

    #[test]
    fn modes_parse_and_default_to_minimal() {
        assert_eq!(OutputMode::default(), OutputMode::Minimal);
        assert_eq!("digest".parse::<OutputMode>().unwrap(), OutputMode::Digest);
        assert!("loud".parse::<OutputMode>().unwrap_err().to_string().contains("minimal, summary"));
    }

    #[test]
    fn default_caps_match_the_issue() {
        let c = OutputConfig::default();
        assert_eq!(c.limits(StreamName::Stdout), StreamLimits { inline_bytes: 1 << 20, stored_bytes: 64 << 20 });
        assert_eq!(c.limits(StreamName::Stderr), StreamLimits { inline_bytes: 256 << 10, stored_bytes: 16 << 20 });
        assert_eq!(c.ttl_ms(), 86_400_000);
        assert!(c.redact);
    }
}
