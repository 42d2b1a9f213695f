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
mod tail;
mod worker;

pub use crate::store::artifacts::{ArtifactError, JobInfo, StreamMeta, StreamName};
#[cfg(unix)]
pub use capture::capture_pipe;
pub use capture::{capture, Capture, Captured, StreamSink, StreamSummary};
pub use modes::{render, OutputView, RenderOptions};
pub use query::{query_output, ArtifactQuery, OutputExcerpt, QueryResponse, QueryStreams};
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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

/// Output settings: the `[output]` table of confine.toml. It is the one
/// place for output caps and artifact lifetime (`confine.default.toml`
/// documents each key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutputConfig {
    pub stdout_inline_bytes: usize,
    /// Bytes of stdout kept in the artifact; past it output is drained,
    /// counted and marked truncated. A policy can lower it (`outputBytes`).
    pub stdout_stored_bytes: u64,
    pub stderr_inline_bytes: usize,
    /// As `stdout_stored_bytes`, for stderr.
    pub stderr_stored_bytes: u64,
    /// How long artifacts are kept.
    pub ttl_secs: u64,
    /// Total size of all artifacts; past it `gc` evicts the oldest.
    pub max_store_bytes: u64,
    /// GC runs by itself after a job at most this often (0: only `confine gc`).
    pub gc_interval_secs: u64,
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
            gc_interval_secs: 600,
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

    /// The larger stored cap of the two streams: what the policy input
    /// document calls `limits.outputBytes` (bytes stored per stream).
    pub fn max_stored_bytes(&self) -> u64 {
        self.stdout_stored_bytes.max(self.stderr_stored_bytes)
    }

    /// These settings with both stored caps lowered to `bytes` (a job's
    /// `outputBytes` after policy), never raised.
    pub fn with_stored_cap(&self, bytes: u64) -> OutputConfig {
        OutputConfig {
            stdout_stored_bytes: self.stdout_stored_bytes.min(bytes),
            stderr_stored_bytes: self.stderr_stored_bytes.min(bytes),
            ..self.clone()
        }
    }

    /// The redactor for these settings, `None` when redaction is off.
    /// `lookup` gives the value of an environment variable (the job's own
    /// environment and confine's, as the caller sees fit).
    pub fn redactor(&self, lookup: impl Fn(&str) -> Option<String>) -> Option<Redactor> {
        self.job_redactor(&[], lookup)
    }

    /// The redactor for one job: as [`OutputConfig::redactor`], plus the
    /// values of the variables the caller passes to the job (`job_env`)
    /// whose names look like secrets ([`redact::secret_name`]), and of the
    /// listed ones as the job sees them.
    pub fn job_redactor(
        &self,
        job_env: &[(String, String)],
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Option<Redactor> {
        if !self.redact {
            return None;
        }
        let listed = self.redact_env.iter().flat_map(|name| {
            let in_job = job_env.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.clone());
            in_job.chain(lookup(name))
        });
        let passed = job_env.iter().filter(|(k, _)| redact::secret_name(k)).map(|(_, v)| v.clone());
        Some(Redactor::new(listed.chain(passed).collect::<Vec<_>>()))
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

/// `12 B`, `3.5 KiB`, `64.0 MiB`.
pub(crate) fn human_size(bytes: u64) -> String {
    match bytes {
        b if b < 1024 => format!("{b} B"),
        b if b < 1 << 20 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{:.1} MiB", b as f64 / f64::from(1 << 20)),
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
    fn job_env_values_named_like_secrets_are_redacted() {
        let cfg = OutputConfig { redact_env: vec!["LISTED".into()], ..OutputConfig::default() };
        let env: Vec<(String, String)> =
            [("API_TOKEN", "tok-123456"), ("LISTED", "job-listed-value"), ("MODE", "verbose-mode")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let r = cfg.job_redactor(&env, |k| (k == "LISTED").then(|| "host-listed-value".to_string())).unwrap();
        let (out, n) = r.redact_all(b"tok-123456 job-listed-value host-listed-value verbose-mode\n");
        assert_eq!(String::from_utf8(out).unwrap(), "[REDACTED] [REDACTED] [REDACTED] verbose-mode\n");
        assert_eq!(n, 3);
        let off = OutputConfig { redact: false, ..cfg };
        assert!(off.job_redactor(&env, |_| None).is_none());
    }

    #[test]
    fn a_stored_cap_only_lowers() {
        let c = OutputConfig::default();
        assert_eq!(c.max_stored_bytes(), 64 << 20);
        let low = c.with_stored_cap(1 << 20);
        assert_eq!((low.stdout_stored_bytes, low.stderr_stored_bytes), (1 << 20, 1 << 20));
        let high = c.with_stored_cap(u64::MAX);
        assert_eq!((high.stdout_stored_bytes, high.stderr_stored_bytes), (64 << 20, 16 << 20));
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
