//! Arguments and results of `runtime_query_output`, `runtime_jobs` and
//! `runtime_kill`.

use super::*;

/// Arguments of `runtime_query_output`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueryOutputRequest {
    /// runtime_execute's artifactHandle.
    pub artifact_handle: String,
    /// A line matches if it contains any, in any case.
    #[serde(default)]
    #[schemars(length(max = 10))]
    pub query_terms: Vec<String>,
    /// Most windows returned. Default 10.
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub max_excerpts: Option<u32>,
    /// Lines of context. Default 3.
    #[serde(default)]
    #[schemars(range(min = 0, max = 20))]
    pub context_lines: Option<u32>,
    /// Default both.
    #[serde(default)]
    pub stream: Option<StreamSelect>,
    /// [start, end], 1-based: these lines (at most 1000).
    #[serde(default)]
    pub line_range: Option<[u64; 2]>,
}

impl QueryOutputRequest {
    pub fn validate(&self) -> Result<(), ServiceError> {
        non_empty("artifactHandle", &self.artifact_handle, 200)?;
        query_terms(&self.query_terms)?;
        if self.query_terms.is_empty() && self.line_range.is_none() {
            return Err(invalid("give queryTerms or a lineRange"));
        }
        if let Some(n) = self.max_excerpts {
            if !(1..=100).contains(&n) {
                return Err(invalid(format!("maxExcerpts must be between 1 and 100 (got {n})")));
            }
        }
        if let Some(n) = self.context_lines {
            if n > 20 {
                return Err(invalid(format!("contextLines must be between 0 and 20 (got {n})")));
            }
        }
        if let Some([start, end]) = self.line_range {
            if start == 0 || end < start || end - start >= 1000 {
                return Err(invalid(format!(
                    "lineRange must be [start, end] with 1 <= start <= end and at most 1000 lines (got [{start}, {end}])"
                )));
            }
        }
        Ok(())
    }
}

/// Result of `runtime_query_output`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueryOutputResponse {
    pub artifact_handle: String,
    pub excerpts: Vec<Excerpt>,
    pub total_lines: u64,
    pub total_bytes: u64,
    pub searched_streams: Vec<Stream>,
    /// More windows matched than maxExcerpts allowed.
    #[serde(default)]
    pub more: bool,
}

/// Arguments of `runtime_jobs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobsRequest {
    /// That job only, with its stdout from `offset`.
    #[serde(default)]
    pub job_id: Option<String>,
    /// The previous answer's output.nextOffset. Default 0.
    #[serde(default)]
    pub offset: Option<u64>,
}

/// One job as `runtime_jobs` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobSummary {
    pub job_id: String,
    pub repo_id: String,
    pub runtime: String,
    pub status: ExecStatus,
    pub background: bool,
    /// Unix time in ms.
    pub started_at_ms: u64,
    pub duration_ms: u64,
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_handle: Option<String>,
    pub output_bytes: u64,
}

/// A slice of a job's stdout.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobOutput {
    pub offset: u64,
    pub next_offset: u64,
    pub text: String,
    /// The job ended and everything it wrote was read.
    pub complete: bool,
}

/// Result of `runtime_jobs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobsResponse {
    pub jobs: Vec<JobSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<JobOutput>,
}

/// Arguments of `runtime_kill`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KillRequest {
    /// A background job's jobId.
    pub job_id: String,
}
