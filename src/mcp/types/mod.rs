//! Request and response types of the runtime tools, in the MCP wire shape
//! (camelCase, JSON Schema from the types), and the argument checks every
//! implementation of [`super::RuntimeService`] can rely on.
//!
//! `validate` checks shape and ranges only: whether a runtime, a cwd or an
//! env key is *allowed* is the service's decision, never this module's.

mod execute;
mod info;
mod jobs;

pub use execute::{ExecuteRequest, ExecuteResponse};
pub use info::{Finding, Info, InfoLimits, InfoRequest, RepoInfo, RuntimeInfo};
pub use jobs::{
    JobOutput, JobSummary, JobsRequest, JobsResponse, KillRequest, QueryOutputRequest, QueryOutputResponse,
};

use super::service::ServiceError;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Shortest and longest `timeoutMs`.
pub const TIMEOUT_MS_RANGE: (u64, u64) = (100, 300_000);
/// Most `queryTerms`.
pub const MAX_QUERY_TERMS: usize = 10;
/// Fewest and most `maxResponseLines`.
pub const RESPONSE_LINES_RANGE: (u32, u32) = (10, 1000);
/// Largest inline `code` and `stdin`.
pub const MAX_CODE_BYTES: usize = 1 << 20;
/// Most `args`.
pub const MAX_ARGS: usize = 100;
/// Most `env` entries.
pub const MAX_ENV: usize = 64;
/// How much output a response carries inline: the output module's modes.
pub use crate::output::OutputMode;

/// How a job ended, or `running` for a background job that has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecStatus {
    Running,
    Success,
    Failure,
    Timeout,
    Oom,
    Killed,
    Cancelled,
    Denied,
}

impl ExecStatus {
    /// The wire name (`success`, `running`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ExecStatus::Running => "running",
            ExecStatus::Success => "success",
            ExecStatus::Failure => "failure",
            ExecStatus::Timeout => "timeout",
            ExecStatus::Oom => "oom",
            ExecStatus::Killed => "killed",
            ExecStatus::Cancelled => "cancelled",
            ExecStatus::Denied => "denied",
        }
    }
}

impl From<crate::job::Status> for ExecStatus {
    fn from(s: crate::job::Status) -> Self {
        use crate::job::Status;
        match s {
            Status::Success => ExecStatus::Success,
            Status::Failure => ExecStatus::Failure,
            Status::Timeout => ExecStatus::Timeout,
            Status::Oom => ExecStatus::Oom,
            Status::Killed => ExecStatus::Killed,
            Status::Cancelled => ExecStatus::Cancelled,
            Status::Denied => ExecStatus::Denied,
        }
    }
}

/// An output stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Which streams a query searches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamSelect {
    Stdout,
    Stderr,
    #[default]
    Both,
}
/// Whether an output field was cut, and the real sizes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Truncation {
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub total_stdout_bytes: u64,
    pub total_stderr_bytes: u64,
}

/// A window of output lines around matches (1-based, inclusive).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Excerpt {
    pub line_start: u64,
    pub line_end: u64,
    pub content: String,
    pub source: Stream,
}

/// The policy's verdict on a call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecision {
    pub allowed: bool,
    /// SHA-256 over the canonical policy input, the decision and the policy digest; the key of the audit record.
    #[serde(default)]
    pub audit_hash: Option<String>,
    #[serde(default)]
    pub denied_reasons: Vec<String>,
}

impl PolicyDecision {
    /// An allowing decision with nothing to show: left out of a lean answer.
    pub fn is_plain_allow(&self) -> bool {
        self.allowed && self.audit_hash.is_none() && self.denied_reasons.is_empty()
    }
}
pub(crate) fn invalid(msg: impl Into<String>) -> ServiceError {
    ServiceError::Invalid(msg.into())
}

pub(crate) fn non_empty(name: &str, value: &str, max: usize) -> Result<(), ServiceError> {
    if value.trim().is_empty() {
        return Err(invalid(format!("{name} must not be empty")));
    }
    if value.len() > max {
        return Err(invalid(format!("{name} is longer than {max} bytes")));
    }
    if value.contains('\0') {
        return Err(invalid(format!("{name} must not contain NUL bytes")));
    }
    Ok(())
}

pub(crate) fn max_bytes(name: &str, value: Option<&str>, max: usize) -> Result<(), ServiceError> {
    match value {
        Some(v) if v.len() > max => Err(invalid(format!("{name} is {} bytes; at most {max}", v.len()))),
        _ => Ok(()),
    }
}

pub(crate) fn query_terms(terms: &[String]) -> Result<(), ServiceError> {
    if terms.len() > MAX_QUERY_TERMS {
        return Err(invalid(format!("at most {MAX_QUERY_TERMS} queryTerms (got {})", terms.len())));
    }
    if terms.iter().any(|t| t.trim().is_empty() || t.len() > 200) {
        return Err(invalid("each queryTerm must be 1 to 200 bytes"));
    }
    Ok(())
}

pub(crate) fn is_env_name(k: &str) -> bool {
    // The rule of `-e` and `--env-file`, and a length a schema can state.
    crate::env::invalid_name(k).is_none() && k.len() <= 128
}

/// A caller-supplied string shortened for an error message.
pub(crate) fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests;
