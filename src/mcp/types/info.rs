//! `info`'s arguments and result: what the host and configuration offer.

use super::*;
use serde_json::Value;

/// Arguments of `info`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InfoRequest {
    // Both described in the tool's description alone: `tools/list` is in
    // every session's context, and has a budget (tests/suite/mcp_wire.rs).
    // repoId: describe this workspace too.
    #[serde(default)]
    pub repo_id: Option<String>,
    // verbose: also each runtime's executable and the missing ones, the
    // isolation layers and guarantees, every host check, the policy digest.
    #[serde(default)]
    pub verbose: Option<bool>,
}

/// One runtime of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeInfo {
    pub name: String,
    pub available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executable: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A doctor finding: `ok`, `warning` or `error`, and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub level: String,
    pub message: String,
}

/// Limits a caller must stay within.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InfoLimits {
    pub min_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub default_timeout_ms: u64,
    pub max_concurrent_jobs: u32,
    /// Bytes of one stream kept in the artifact (`output.*_stored_bytes`).
    pub max_output_bytes: u64,
    pub max_response_lines: u32,
    pub max_query_terms: u32,
    pub max_code_bytes: u64,
    pub max_stdin_bytes: u64,
    pub env_allowlist: Vec<String>,
}

/// What `info` knows of one workspace (never its host path).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepoInfo {
    pub repo_id: String,
    pub known: bool,
    pub writable: bool,
}

/// Result of `info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    pub version: String,
    pub backend: String,
    /// runtime.enabled in confine.toml; when false every runtime_execute is denied.
    pub runtime_enabled: bool,
    pub runtimes: Vec<RuntimeInfo>,
    /// Isolation layers this host can enforce (the doctor report).
    pub layers: Value,
    /// What the backend guarantees here, row by row: filesystem, network,
    /// syscalls, memory, cpu, pids, treeKill, envScrub, each
    /// `{level: enforced|partial|none, how}`.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub guarantees: Value,
    pub findings: Vec<Finding>,
    pub limits: InfoLimits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<RepoInfo>,
}

impl Info {
    /// What an agent needs before its first call (the runtimes it can
    /// use, the limits, whether isolation is full, what needs fixing),
    /// unless the caller asked for `verbose`: `info` is the first call,
    /// and each of its bytes is in every session's context.
    pub fn lean(mut self, verbose: bool) -> Self {
        if verbose {
            return self;
        }
        self.runtimes.retain(|r| r.available);
        for r in &mut self.runtimes {
            r.executable = None;
            r.note = None;
        }
        let full = self.layers.get("fullIsolation").cloned().unwrap_or(Value::Bool(false));
        self.layers = serde_json::json!({ "fullIsolation": full });
        self.guarantees = Value::Null;
        self.findings.retain(|f| f.level != "ok");
        self.policy_digest = None;
        self
    }

    /// The text beside the structured content: a few lines for a reader,
    /// not the JSON again.
    pub fn text(&self) -> String {
        let full = self.layers.get("fullIsolation").and_then(Value::as_bool) == Some(true);
        let mut lines = vec![format!(
            "confine {} on {}: {} isolation; execution {}",
            self.version,
            self.backend,
            if full { "full" } else { "degraded" },
            if self.runtime_enabled { "enabled" } else { "disabled (runtime.enabled in confine.toml)" }
        )];
        let usable: Vec<&str> = self.runtimes.iter().filter(|r| r.available).map(|r| r.name.as_str()).collect();
        lines.push(format!("runtimes: {}", usable.join(" ")));
        let l = &self.limits;
        lines.push(format!(
            "timeout {}..{} ms (default {}), {} jobs at once",
            l.min_timeout_ms, l.max_timeout_ms, l.default_timeout_ms, l.max_concurrent_jobs
        ));
        for f in self.findings.iter().filter(|f| f.level != "ok") {
            lines.push(format!("{}: {}", f.level, f.message));
        }
        lines.join("\n")
    }
}
