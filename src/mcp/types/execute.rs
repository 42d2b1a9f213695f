//! `runtime_execute`'s arguments (with their checks) and its result, which
//! `runtime_kill` returns too.

use super::*;
use serde_json::Value;
use std::collections::BTreeMap;

/// Arguments of `runtime_execute`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecuteRequest {
    /// The workspace; optional when only one is configured.
    #[serde(default)]
    pub repo_id: String,
    /// python, node, shell, rust, go... (`info` lists them).
    pub runtime: String,
    /// Another executable of the runtime ("bun" for node).
    #[serde(default)]
    pub executable: Option<String>,
    /// Arguments of the runtime's executable; instead of `code`.
    #[serde(default)]
    #[schemars(length(max = 100))]
    pub args: Option<Vec<String>>,
    /// Source to run (1 MiB by default); instead of `args`.
    #[serde(default)]
    pub code: Option<String>,
    /// Standard input (512 KiB by default).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Working directory, relative to the workspace. Default ".".
    #[serde(default)]
    pub relative_cwd: Option<String>,
    /// Wall-clock limit in ms. Default 30000.
    #[serde(default)]
    #[schemars(range(min = 100, max = 300_000))]
    pub timeout_ms: Option<u64>,
    /// Words whose lines are returned as excerpts.
    #[serde(default)]
    #[schemars(length(max = 10))]
    pub query_terms: Option<Vec<String>>,
    /// Most output lines in a summary. Default 100.
    #[serde(default)]
    #[schemars(range(min = 10, max = 1000))]
    pub max_response_lines: Option<u32>,
    /// Keep the output for runtime_query_output. Default true.
    #[serde(default)]
    pub persist_output: Option<bool>,
    /// minimal, summary (head, tail), intent (queryTerms excerpts), digest (error and warning lines).
    #[serde(default)]
    pub output_mode: OutputMode,
    /// Return a jobId at once; follow with runtime_jobs.
    #[serde(default)]
    pub background: Option<bool>,
    /// Variables to set; keys of `info`'s allowlist.
    #[serde(default)]
    pub env: Option<BTreeMap<String, String>>,
    /// Output up to this size is inline. Default 1024.
    #[serde(default)]
    #[schemars(range(max = 65_536))]
    pub inline_bytes: Option<u32>,
    /// Add layers, guarantees, limits, usage, policy decision.
    #[serde(default)]
    pub verbose: Option<bool>,
    /// Only these hosts, via a proxy: `{allow: [pypi.org, *.example.org, host:8443, @list]}`.
    #[serde(default)]
    pub network: Option<NetworkRequest>,
}

/// `runtime_execute`'s `network`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    // Entries of `proxy::allowlist`, or `@name` of `[network.allow]`; the
    // field's own description is the schema's (tools/list stays small).
    pub allow: Vec<String>,
}

/// Most entries of `network.allow` in one request.
pub const MAX_NET_ENTRIES: usize = 64;

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
        if let Some(net) = &self.network {
            if net.allow.is_empty() || net.allow.len() > MAX_NET_ENTRIES {
                return Err(invalid(format!(
                    "network.allow takes 1 to {MAX_NET_ENTRIES} entries (got {})",
                    net.allow.len()
                )));
            }
            for e in &net.allow {
                if e.len() > 300 {
                    return Err(invalid(format!("network.allow entry '{}' is too long", clip(e))));
                }
                if !e.trim_start().starts_with('@') {
                    crate::proxy::allowlist::Entry::parse(e).map_err(|e| invalid(e.to_string()))?;
                }
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

/// Result of `runtime_execute` and `runtime_kill`: lean unless `verbose`
/// (what `info` says of every job, layers, guarantees, limits, is not
/// repeated on every call; `isolation` says in one word whether this job
/// had all of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    pub status: ExecStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Number of the signal that ended the job, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub duration_ms: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub queued_ms: u64,
    /// Pass to runtime_query_output to search the full output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_handle: Option<String>,
    /// "full", or "degraded: partial: memory, cpu" naming what was not
    /// enforced (`info` and `verbose` say how).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// A denial's reasons; with `verbose`, every decision and its audit hash.
    #[serde(default, skip_serializing_if = "PolicyDecision::is_plain_allow")]
    pub policy_decision: PolicyDecision,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_lines: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    /// The whole stdout, when the output fits in `inlineBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// The whole stderr, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
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
    /// A failure whose output is not here: queryTerms for runtime_query_output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suggested_terms: Vec<String>,
    /// What this answer's output left out or changed, and why: output that
    /// could not be stored (no artifactHandle then), a maxResponseLines
    /// outside its range, a mode that fell back.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
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
    /// With `network.allow`: every connection through the proxy, allowed
    /// or denied, with its reason and bytes each way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Value>,
    /// The job ended with its /tmp (also its HOME) full: `{sizeBytes,
    /// outOf: space|files, message}`, the message naming the cap and how
    /// to raise it (`tmp_size_bytes` under `[sandbox]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp_full: Option<Value>,
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
            isolation: None,
            policy_decision: PolicyDecision::default(),
            output_lines: None,
            output_bytes: None,
            stdout: None,
            stderr: None,
            stdout_summary: None,
            stderr_summary: None,
            excerpts: None,
            truncation: None,
            digest: None,
            suggested_terms: Vec::new(),
            notes: Vec::new(),
            backend: None,
            usage: None,
            layers: None,
            guarantees: None,
            limits: None,
            error: None,
            network: None,
            tmp_full: None,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ExecuteResponse {
    /// Drop what `info` already says of every job (backend, usage,
    /// layers, guarantees, limits), an allowing policy decision, and a
    /// finished job's id, unless the caller asked for them.
    pub fn lean(mut self, verbose: bool) -> Self {
        if !verbose {
            self.backend = None;
            self.usage = None;
            self.layers = None;
            self.guarantees = None;
            self.limits = None;
            self.policy_decision.audit_hash = None;
            // A finished job is known by its artifactHandle; a running
            // one by its jobId (runtime_jobs, runtime_kill).
            if self.status != ExecStatus::Running {
                self.job_id = None;
            }
        }
        self
    }

    /// The text content beside the structured one: a short rendering for
    /// a reader, not a second copy of the JSON. `success exit=0 26ms`,
    /// then the output.
    pub fn text(&self) -> String {
        let mut head = self.status.as_str().to_string();
        if let Some(c) = self.exit_code {
            head.push_str(&format!(" exit={c}"));
        }
        if let Some(s) = self.signal {
            head.push_str(&format!(" signal={s}"));
        }
        head.push_str(&format!(" {}ms", self.duration_ms));
        if let Some(j) = &self.job_id {
            if self.status == ExecStatus::Running {
                head.push_str(&format!(" jobId={j}"));
            }
        }
        if let Some(h) = &self.artifact_handle {
            head.push_str(&format!(" artifact={h}"));
        }
        if let (Some(b), None, None) = (self.output_bytes, &self.stdout, &self.stderr) {
            if b > 0 {
                head.push_str(&format!(" output={b}B/{}lines", self.output_lines.unwrap_or(0)));
            }
        }
        if let Some(i) = self.isolation.as_deref().filter(|i| *i != "full") {
            head.push_str(&format!(" isolation={i}"));
        }
        let mut parts = vec![head];
        if !self.policy_decision.denied_reasons.is_empty() {
            parts.push(format!("denied: {}", self.policy_decision.denied_reasons.join("; ")));
        }
        if let Some(e) = &self.error {
            parts.push(format!("error: {e}"));
        }
        if let Some(m) = self.tmp_full.as_ref().and_then(|t| t.get("message")).and_then(Value::as_str) {
            parts.push(format!("note: {m}"));
        }
        if !self.suggested_terms.is_empty() {
            parts.push(format!("next: runtime_query_output with queryTerms {:?}", self.suggested_terms));
        }
        for (label, text) in [
            ("", &self.stdout),
            ("stdout:\n", &self.stdout_summary),
            ("stderr:\n", &self.stderr),
            ("stderr:\n", &self.stderr_summary),
        ] {
            if let Some(t) = text.as_deref().filter(|t| !t.is_empty()) {
                parts.push(format!("{label}{t}"));
            }
        }
        for x in self.excerpts.iter().flatten() {
            let stream = match x.source {
                Stream::Stdout => "stdout",
                Stream::Stderr => "stderr",
            };
            parts.push(format!("{stream} lines {}-{}:\n{}", x.line_start, x.line_end, x.content));
        }
        if let Some(d) = &self.digest {
            parts.push(serde_json::to_string(d).unwrap_or_default());
        }
        parts.join("\n")
    }
}
