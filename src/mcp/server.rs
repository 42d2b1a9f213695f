//! [`ConfineServer`]: the rmcp server handler. It owns the tool routers,
//! the session usage counters, and the translation of service results
//! into MCP results (structured content, tool errors); it holds no sandbox
//! logic and decides nothing about what may run.
//!
//! Tool groups live in their own files and are summed into one router:
//! `tools.rs` (runtime_*, info, usage_stats), and `memory_tools.rs`
//! (memory_store, memory_query, memory_remove, memory_surface,
//! agent_feedback, agent_feedback_query), added by
//! [`ConfineServer::with_memory`] when the server keeps memories (with a
//! memory service, `info` also reports a repository's stale memories).

use super::access::Caller;
use super::service::{RuntimeService, ServiceError};
use super::usage::{CallRecord, SessionUsage};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, JsonObject, ServerCapabilities, ServerConfig};
use rmcp::{tool_handler, ServerHandler};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// What a client reads at `initialize`: how to use the tools well.
const INSTRUCTIONS: &str = "confine runs untrusted code in a hardened sandbox \
(no network by default, read-only system, scrubbed environment, hard timeouts) under a policy that is \
evaluated and audited on every call. Start with `info` to see the runtimes, limits and env allowlist. \
Run code with `runtime_execute`: the answer has status, exit code, the output when it is small, and \
an artifactHandle; read a longer output with `runtime_query_output` (queryTerms such as ['error', 'FAIL']). Long jobs: background: true, then `runtime_jobs` and \
`runtime_kill`. `usage_stats` shows how many bytes the minimal+query pattern saved.";

/// The MCP server: a thin adapter over a [`RuntimeService`].
#[derive(Clone)]
pub struct ConfineServer {
    pub(crate) service: Arc<dyn RuntimeService>,
    pub(crate) usage: Arc<SessionUsage>,
    pub(crate) progress_interval: Duration,
    /// The memory and feedback tools' service (`None`: those tools are not offered).
    pub(crate) memory: Option<Arc<crate::store::memory::MemoryService>>,
    /// Served over HTTP: every call must carry the caller the guard found
    /// (`access.rs`); else the transport is stdio, the operator's.
    pub(crate) over_http: bool,
    tool_router: ToolRouter<ConfineServer>,
}

impl ConfineServer {
    pub fn new(service: Arc<dyn RuntimeService>) -> Self {
        let mut tool_router = Self::runtime_tools() + Self::diagnostic_tools();
        super::schema::lean_router(&mut tool_router);
        ConfineServer {
            service,
            usage: Arc::new(SessionUsage::default()),
            progress_interval: super::progress::PROGRESS_INTERVAL,
            memory: None,
            over_http: false,
            // `with_memory` adds `Self::memory_tools()`.
            tool_router,
        }
    }

    /// Offer the memory and feedback tools, backed by `memory`.
    pub fn with_memory(mut self, memory: Arc<crate::store::memory::MemoryService>) -> Self {
        if self.memory.is_none() {
            let mut memory_tools = Self::memory_tools();
            super::schema::lean_router(&mut memory_tools);
            self.tool_router.merge(memory_tools);
        }
        self.memory = Some(memory);
        self
    }

    /// A clone for one HTTP session: its calls are served as the caller of
    /// each request's token, never as the operator.
    pub fn over_http(&self) -> Self {
        ConfineServer { over_http: true, ..self.clone() }
    }

    /// The caller of one call (`access.rs`).
    pub(crate) fn caller(&self, ctx: &rmcp::service::RequestContext<rmcp::RoleServer>) -> Result<Caller, ServiceError> {
        Caller::of(ctx, self.over_http)
    }

    /// The service behind the tools (to shut it down after the transports).
    pub fn service(&self) -> &Arc<dyn RuntimeService> {
        &self.service
    }

    /// This server's usage counters.
    pub fn usage(&self) -> &SessionUsage {
        &self.usage
    }

    /// Every tool with its schemas (what `tools/list` returns).
    pub fn tools(&self) -> Vec<rmcp::model::Tool> {
        self.tool_router.list_all()
    }

    /// A successful (or, with `is_error`, refused) result carrying `value`
    /// as structured content, counted in the usage stats.
    pub(crate) fn structured<T: Serialize>(&self, tool: &str, value: &T, call: CallOutcome<'_>) -> CallToolResult {
        match serde_json::to_value(value) {
            Ok(v) => {
                let mut result = CallToolResult::structured(v);
                result.is_error = Some(call.is_error);
                self.count(tool, result, call)
            }
            Err(e) => self.error(tool, &ServiceError::Internal(format!("cannot encode the result: {e}"))),
        }
    }

    /// `value` as structured content, and beside it `text`, a short
    /// rendering for a reader (not the JSON again).
    pub(crate) fn structured_with_text(
        &self,
        tool: &str,
        value: serde_json::Value,
        text: String,
        call: CallOutcome<'_>,
    ) -> CallToolResult {
        let mut result = CallToolResult::structured(value);
        result.content = vec![ContentBlock::text(text)];
        result.is_error = Some(call.is_error);
        self.count(tool, result, call)
    }

    /// A job's answer: `resp` as structured content, and beside it a short
    /// rendering for a reader (`ExecuteResponse::text`), not the JSON again.
    pub(crate) fn job_answer(
        &self,
        tool: &str,
        resp: &super::types::ExecuteResponse,
        call: CallOutcome<'_>,
    ) -> CallToolResult {
        match serde_json::to_value(resp) {
            Ok(v) => {
                let mut result = CallToolResult::structured(v);
                result.content = vec![ContentBlock::text(resp.text())];
                result.is_error = Some(call.is_error);
                self.count(tool, result, call)
            }
            Err(e) => self.error(tool, &ServiceError::Internal(format!("cannot encode the result: {e}"))),
        }
    }

    /// A tool error: one line, `status: message`, no structured content
    /// (so clients that validate outputSchema accept it).
    pub(crate) fn error(&self, tool: &str, e: &ServiceError) -> CallToolResult {
        tracing::debug!(tool, error = %e, "tool error");
        let result = CallToolResult::error(vec![ContentBlock::text(e.one_line())]);
        self.count(tool, result, CallOutcome { is_error: true, raw_output_bytes: 0, status: Some(e.status()) })
    }

    fn count(&self, tool: &str, result: CallToolResult, call: CallOutcome<'_>) -> CallToolResult {
        let returned_bytes = serde_json::to_vec(&result).map(|v| v.len() as u64).unwrap_or(0);
        let status = if tool == "runtime_execute" { call.status } else { None };
        self.usage.record(CallRecord {
            tool,
            is_error: call.is_error,
            raw_output_bytes: call.raw_output_bytes,
            returned_bytes,
            status,
        });
        result
    }
}

/// How a call went, for the result flags and the usage counters.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CallOutcome<'a> {
    pub is_error: bool,
    pub raw_output_bytes: u64,
    pub status: Option<&'a str>,
}

/// Tool arguments into a request type; a mismatch is an `invalid` tool
/// error naming the field, never a protocol error (MCP wants input
/// validation failures reported as tool results the model can read).
pub(crate) fn parse_args<T: DeserializeOwned>(args: JsonObject) -> Result<T, ServiceError> {
    serde_path_to_error::deserialize(serde_json::Value::Object(args)).map_err(|e| {
        let path = e.path().to_string();
        let why = readable(&e.inner().to_string());
        // serde's unknown-field message names the field already.
        let named = path == "." || why.starts_with("unknown field");
        ServiceError::Invalid(if named { why } else { format!("{path}: {why}") })
    })
}

/// serde's message in a caller's words: `invalid type: string "5000",
/// expected u64` is `expected an integer, got "5000"`.
fn readable(msg: &str) -> String {
    let Some(rest) = msg.strip_prefix("invalid type: ").or_else(|| msg.strip_prefix("invalid value: ")) else {
        return msg.to_string();
    };
    let Some((got, expected)) = rest.rsplit_once(", expected ") else {
        return msg.to_string();
    };
    let expected = match expected {
        "u8" | "u16" | "u32" | "u64" | "usize" => "an integer, 0 or more",
        "i8" | "i16" | "i32" | "i64" | "isize" => "an integer",
        "f32" | "f64" => "a number",
        "a sequence" => "a list",
        "a map" => "an object",
        "a boolean" => "true or false",
        other => other,
    };
    // `string "5000"` → `"5000"`; `integer `5`` → `5`.
    let got = got
        .strip_prefix("string ")
        .map(str::to_string)
        .or_else(|| {
            ["integer ", "floating point ", "boolean "]
                .iter()
                .find_map(|p| got.strip_prefix(p))
                .map(|v| v.trim_matches('`').to_string())
        })
        .unwrap_or_else(|| got.to_string());
    format!("expected {expected}, got {got}")
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ConfineServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("confine", env!("CARGO_PKG_VERSION"))
                    .with_title("confine sandbox supervisor")
                    .with_description("Governed, sandboxed code execution for agents"),
            )
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn a_bad_argument_names_its_field_and_what_was_expected() {
        let args = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
        let e = parse_args::<super::super::types::ExecuteRequest>(args(serde_json::json!({
            "runtime": "python", "code": "1", "timeoutMs": "5000"
        })))
        .unwrap_err();
        assert_eq!(e.to_string(), "invalid: timeoutMs: expected an integer, 0 or more, got \"5000\"");
        let e = parse_args::<super::super::types::ExecuteRequest>(args(serde_json::json!({
            "runtime": "python", "args": "x"
        })))
        .unwrap_err();
        assert_eq!(e.to_string(), "invalid: args: expected a list, got \"x\"");
        let e = parse_args::<super::super::types::ExecuteRequest>(args(serde_json::json!({
            "runtime": "python", "code": "1", "background": 1
        })))
        .unwrap_err();
        assert_eq!(e.to_string(), "invalid: background: expected true or false, got 1");
        let e = parse_args::<super::super::types::ExecuteRequest>(args(serde_json::json!({"runtme": "python"})))
            .unwrap_err();
        assert!(e.to_string().starts_with("invalid: unknown field `runtme`, expected one of"), "{e}");
    }
}
