//! `runtime_execute`'s arguments (with their checks) and its result, which
//! `runtime_kill` returns too.

use super::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// Arguments of `runtime_execute`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecuteRequest {
    /// Workspace (repository) the job runs in, as registered in confine.toml.
    pub repo_id: String,
    /// One of: node, typescript, python, shell, go, java, kotlin, rust, c, cpp, csharp, ruby, php, perl, r, elixir. `info` lists those available here.
    pub runtime: String,
    /// Override the runtime's default executable (e.g. "bun" for node); must belong to the runtime.
    #[serde(default)]
    pub executable: Option<String>,
    /// Arguments for the runtime's executable (args mode, e.g. ["-m", "pytest", "-q"]). Exclusive with `code`. At most 100.
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub args: Option<Vec<String>>,
    /// Inline source, written to a temp file and run (code mode). Exclusive with `args`. At most 1 MiB.
    #[serde(default)]
    pub code: Option<String>,
    /// Bytes fed to the job's standard input (at most 1 MiB). Default: empty.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Working directory relative to the workspace root; must stay inside it. Default ".".
    #[serde(default)]
    pub relative_cwd: Option<String>,
    /// Hard wall-clock limit in ms (100–300000); the whole process tree is killed at the limit. Default: the configured one (30000).
    #[serde(default)]
    #[schemars(range(min = 100, max = 300_000))]
    pub timeout_ms: Option<u64>,
    /// Keywords whose matching output lines (with context) are returned as excerpts: a built-in grep. At most 10.
    #[serde(default)]
    #[schemars(length(max = 10))]
    pub query_terms: Option<Vec<String>>,
    /// Most lines of output shown inline in summaries (10–1000). Default 100.
    #[serde(default)]
    #[schemars(range(min = 10, max = 1000))]
    pub max_response_lines: Option<u32>,
    /// Keep the full output as an artifact for runtime_query_output. Default true.
    #[serde(default)]
    pub persist_output: Option<bool>,
    /// minimal (default, ~50 tokens: status, counts, artifactHandle), summary (head+tail of stdout, tail of stderr, excerpts), intent (excerpts for queryTerms only), digest (deduplicated error/warning lines with counts).
    #[serde(default)]
    pub output_mode: OutputMode,
    /// Start the job and return at once with a jobId; follow it with runtime_jobs, stop it with runtime_kill.
    #[serde(default)]
    pub background: Option<bool>,
    /// Extra environment variables; only keys on the configured allowlist are accepted (see `info`). The job never sees the server's environment.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
}

impl ExecuteRequest {
    /// Check shape and ranges; the first problem is the error.
    pub fn validate(&self) -> Result<(), ServiceError> {
        non_empty("repoId", &self.repo_id, 200)?;
        non_empty("runtime", &self.runtime, 64)?;
        if let Some(e) = &self.executable {
            non_empty("executable", e, 4096)?;
        }
        let has_args = self.args.as_ref().is_some_and(|a| !a.is_empty());
        let has_code = self.code.as_ref().is_some_and(|c| !c.is_empty());
        if has_args && has_code {
            return Err(invalid("give either code or args, not both"));
        }
        if !has_args && !has_code && self.stdin.is_none() {
            return Err(invalid("give code (inline source) or args (arguments for the runtime's executable)"));
        }
        if let Some(args) = &self.args {
            if args.len() > MAX_ARGS {
                return Err(invalid(format!("at most {MAX_ARGS} args (got {})", args.len())));
            }
            if args.iter().any(|a| a.contains('\0')) {
                return Err(invalid("args must not contain NUL bytes"));
            }
        }
        max_bytes("code", self.code.as_deref(), MAX_CODE_BYTES)?;
        max_bytes("stdin", self.stdin.as_deref(), MAX_CODE_BYTES)?;
        if let Some(cwd) = &self.relative_cwd {
            if cwd.contains('\0') {
                return Err(invalid("relativeCwd must not contain NUL bytes"));
            }
        }
        if let Some(t) = self.timeout_ms {
            let (lo, hi) = TIMEOUT_MS_RANGE;
            if !(lo..=hi).contains(&t) {
                return Err(invalid(format!("timeoutMs must be between {lo} and {hi} (got {t})")));
            }
        }
        query_terms(self.query_terms.as_deref().unwrap_or_default())?;
        if let Some(n) = self.max_response_lines {
            let (lo, hi) = RESPONSE_LINES_RANGE;
            if !(lo..=hi).contains(&n) {
                return Err(invalid(format!("maxResponseLines must be between {lo} and {hi} (got {n})")));
            }
        }
        if let Some(env) = &self.env {
            if env.len() > MAX_ENV {
                return Err(invalid(format!("at most {MAX_ENV} env entries (got {})", env.len())));
            }
            if let Some(k) = env.keys().find(|k| !is_env_name(k)) {
                return Err(invalid(format!("env key '{}' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", clip(k))));
            }
            if env.values().any(|v| v.contains('\0')) {
                return Err(invalid("env values must not contain NUL bytes"));
            }
        }
        Ok(())
    }
}

/// Result of `runtime_execute` and `runtime_kill` (the outcome of docs/design.md, plus the output of the chosen mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub status: ExecStatus,
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the job, if one did.
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub queued_ms: u64,
    /// Pass to runtime_query_output to search the full output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_handle: Option<String>,
    pub policy_decision: PolicyDecision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_lines: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// summary mode: head and tail of stdout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_summary: Option<String>,
    /// summary mode: tail of stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub excerpts: Option<Vec<Excerpt>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncation: Option<Truncation>,
    /// digest mode: deduplicated error and warning lines with counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<Value>,
    /// Isolation backend (linux, unix-fallback, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// CPU time, peak memory, pids (the outcome's `usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Isolation layers really in force (the outcome's `layers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<Value>,
    /// What the backend guaranteed for this job, row by row (the outcome's
    /// `guarantees`: `{level: enforced|partial|none, how}` per row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guarantees: Option<Value>,
    /// Limits applied, and which were clamped (the outcome's `limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Value>,
    /// One line, when confine itself failed or the command could not start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ExecuteResponse {
    /// An outcome with only a status; the rest empty.
    pub fn bare(status: ExecStatus) -> Self {
        ExecuteResponse {
            job_id: None,
            status,
            exit_code: None,
            signal: None,
            duration_ms: 0,
            queued_ms: 0,
            artifact_handle: None,
            policy_decision: PolicyDecision::default(),
            output_lines: None,
            output_bytes: None,
            stdout_summary: None,
            stderr_summary: None,
            excerpts: None,
            truncation: None,
            digest: None,
            backend: None,
            usage: None,
            layers: None,
            guarantees: None,
            limits: None,
            error: None,
        }
    }
}
