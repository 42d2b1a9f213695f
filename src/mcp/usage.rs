//! `usage_stats`: per-tool call counts, raw output bytes the jobs produced,
//! bytes actually returned to the client, and the saving between them.
//!
//! This module owns the in-memory counters of the running server (the
//! "session": since `confine serve` started, across all MCP sessions it
//! serves). History across restarts is not kept here: it comes from
//! [`super::RuntimeService::usage_history`], backed by the store later.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Which counters `usage_stats` returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum UsageScope {
    Session,
    History,
    #[default]
    Both,
}

/// Arguments of `usage_stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UsageStatsRequest {
    /// session, history or both (default).
    #[serde(default)]
    pub scope: UsageScope,
    /// Record this session's counters in the history now.
    #[serde(default)]
    pub persist: Option<bool>,
    /// History from this Unix time in ms.
    #[serde(default)]
    pub since_ms: Option<u64>,
}

/// Counters of one tool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolUsage {
    pub calls: u64,
    /// Calls that ended as a tool error.
    pub errors: u64,
    /// Output the jobs wrote (stdout + stderr), whether shown or not.
    pub raw_output_bytes: u64,
    /// Size of the results sent back to the client.
    pub returned_bytes: u64,
}

/// A set of counters and what they add up to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageSnapshot {
    /// Unix time in ms from which these counters run.
    pub since_ms: u64,
    pub tools: BTreeMap<String, ToolUsage>,
    /// How runtime_execute calls ended, by status.
    pub statuses: BTreeMap<String, u64>,
    pub total_calls: u64,
    pub raw_output_bytes: u64,
    pub returned_bytes: u64,
    /// 1 - returned/raw (0 when nothing was produced): the share of output the client never had to read.
    pub saving_ratio: f64,
}

/// Result of `usage_stats`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UsageStatsResponse {
    pub scope: UsageScope,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<UsageSnapshot>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history: Option<UsageSnapshot>,
    /// false when this server has no history store yet.
    pub history_available: bool,
    /// Set when persist was asked and worked.
    #[serde(default)]
    pub persisted: bool,
}

/// The live counters of this server process.
#[derive(Debug)]
pub struct SessionUsage {
    since_ms: u64,
    inner: Mutex<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    tools: BTreeMap<String, ToolUsage>,
    statuses: BTreeMap<String, u64>,
}

/// One finished tool call, as the server measured it.
#[derive(Debug, Clone, Copy)]
pub struct CallRecord<'a> {
    pub tool: &'a str,
    pub is_error: bool,
    pub raw_output_bytes: u64,
    pub returned_bytes: u64,
    /// runtime_execute's status (success, cancelled, …), if the call had one.
    pub status: Option<&'a str>,
}

impl Default for SessionUsage {
    fn default() -> Self {
        SessionUsage { since_ms: now_ms(), inner: Mutex::new(Counters::default()) }
    }
}

impl SessionUsage {
    pub fn record(&self, call: CallRecord<'_>) {
        // A poisoned lock only means another call panicked mid-update; the
        // counters stay usable, so take them anyway.
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let t = c.tools.entry(call.tool.to_string()).or_default();
        t.calls += 1;
        t.errors += u64::from(call.is_error);
        t.raw_output_bytes += call.raw_output_bytes;
        t.returned_bytes += call.returned_bytes;
        if let Some(s) = call.status {
            *c.statuses.entry(s.to_string()).or_default() += 1;
        }
    }

    pub fn snapshot(&self) -> UsageSnapshot {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        summarise(self.since_ms, c.tools.clone(), c.statuses.clone())
    }
}

/// Totals and saving ratio of a set of per-tool counters.
pub fn summarise(since_ms: u64, tools: BTreeMap<String, ToolUsage>, statuses: BTreeMap<String, u64>) -> UsageSnapshot {
    let total_calls = tools.values().map(|t| t.calls).sum();
    let raw: u64 = tools.values().map(|t| t.raw_output_bytes).sum();
    let returned: u64 = tools.values().map(|t| t.returned_bytes).sum();
    let saving_ratio = if raw == 0 { 0.0 } else { (1.0 - returned as f64 / raw as f64).max(0.0) };
    UsageSnapshot {
        since_ms,
        tools,
        statuses,
        total_calls,
        raw_output_bytes: raw,
        returned_bytes: returned,
        saving_ratio,
    }
}

pub(crate) use crate::ids::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_ratio() {
        let s = SessionUsage::default();
        let call = |tool, raw, ret, status| CallRecord {
            tool,
            is_error: false,
            raw_output_bytes: raw,
            returned_bytes: ret,
            status,
        };
        s.record(call("runtime_execute", 10_000, 200, Some("success")));
        s.record(call("runtime_query_output", 0, 800, None));
        s.record(CallRecord { is_error: true, ..call("runtime_execute", 0, 50, Some("denied")) });
        let snap = s.snapshot();
        assert_eq!(snap.total_calls, 3);
        assert_eq!(snap.tools["runtime_execute"].calls, 2);
        assert_eq!(snap.tools["runtime_execute"].errors, 1);
        assert_eq!(snap.statuses["denied"], 1);
        assert_eq!(snap.returned_bytes, 1050);
        assert!((snap.saving_ratio - 0.895).abs() < 1e-9);
        assert_eq!(summarise(0, BTreeMap::new(), BTreeMap::new()).saving_ratio, 0.0);
    }
}
