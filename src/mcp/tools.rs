//! The tool handlers: runtime_execute, runtime_query_output, runtime_jobs,
//! runtime_kill (the runtime router) and info, usage_stats (the diagnostic
//! router). Each one parses and checks its arguments, works out its
//! caller (`access.rs`: a tool naming a repository is refused one the
//! caller may not use), calls the service, and shapes the result; none of
//! them decides anything about a job.

use super::progress::spawn_reporter;
use super::server::{parse_args, CallOutcome, ConfineServer};
use super::service::{ExecControl, ProgressSink, ServiceError};
use super::types::*;
use super::usage::{UsageScope, UsageStatsRequest, UsageStatsResponse};
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input};
use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use std::sync::Arc;
use std::time::Duration;

/// How long a service may take to stop after a cancellation before the
/// call is dropped anyway (dropping it must kill the job: see the trait).
const CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Input schema of a request type. Schema generation can only fail for a
/// type whose root is not an object, which the tests rule out; an empty
/// schema (and a log line) beats a panic in a server.
fn input<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>().unwrap_or_else(|e| {
        tracing::error!(error = %e, "invalid input schema");
        schema_for_empty_input()
    })
}

#[tool_router(router = runtime_tools, vis = "pub(crate)")]
impl ConfineServer {
    #[tool(
        name = "runtime_execute",
        description = "Run `code` or `args` with `runtime` in a sandbox (read-only system, no network unless `network`, timeout), under policy and audit. Returns status, exitCode, output up to inlineBytes, an artifactHandle.",
        input_schema = input::<ExecuteRequest>(),
        output_schema = schema_for_output::<ExecuteResponse>(),
        annotations(read_only_hint = false, destructive_hint = true, open_world_hint = false)
    )]
    async fn runtime_execute(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        const TOOL: &str = "runtime_execute";
        let parsed = parse_args::<ExecuteRequest>(args).and_then(|mut r| {
            if r.repo_id.is_empty() {
                r.repo_id = self
                    .service
                    .sole_repo()
                    .ok_or_else(|| ServiceError::Invalid("repoId: name the workspace (`info` lists them)".into()))?;
            }
            r.validate().map(|()| r)
        });
        let req = match parsed {
            Ok(r) => r,
            Err(e) => return self.error(TOOL, &e),
        };
        let verbose = req.verbose == Some(true);
        let caller = match self.caller(&ctx).and_then(|c| c.check_repo(&req.repo_id).map(|()| c)) {
            Ok(c) => c,
            Err(e) => return self.error(TOOL, &e),
        };
        let (sink, latest) = ProgressSink::channel();
        let _reporter = ctx
            .meta
            .get_progress_token()
            .map(|token| spawn_reporter(ctx.peer.clone(), token, latest, self.progress_interval));
        let ctl = ExecControl { cancel: ctx.ct.clone(), progress: Some(sink), caller };
        let call = self.service.execute(req, ctl);
        let grace_over = async {
            ctx.ct.cancelled().await;
            tokio::time::sleep(CANCEL_GRACE).await;
        };
        let result = tokio::select! {
            r = call => r,
            () = grace_over => Err(ServiceError::Cancelled(
                "the job did not stop within 5 s of the cancellation; the call was dropped".into(),
            )),
        };
        match result {
            Ok(resp) => {
                let refused = resp.status == ExecStatus::Denied || resp.error.is_some();
                let raw = resp.output_bytes.unwrap_or(0);
                let outcome =
                    CallOutcome { is_error: refused, raw_output_bytes: raw, status: Some(resp.status.as_str()) };
                self.job_answer(TOOL, &resp.clone().lean(verbose), outcome)
            }
            Err(e) => self.error(TOOL, &e),
        }
    }

    #[tool(
        name = "runtime_query_output",
        description = "Read a job's stored output (artifactHandle): lines matching queryTerms, with context, or lineRange [start, end].",
        input_schema = input::<QueryOutputRequest>(),
        output_schema = schema_for_output::<QueryOutputResponse>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn runtime_query_output(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        const TOOL: &str = "runtime_query_output";
        let req = match parse_args::<QueryOutputRequest>(args).and_then(|r| r.validate().map(|()| r)) {
            Ok(r) => r,
            Err(e) => return self.error(TOOL, &e),
        };
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return self.error(TOOL, &e),
        };
        match self.service.query_output(req, &caller).await {
            Ok(resp) => self.structured(TOOL, &resp, CallOutcome::default()),
            Err(e) => self.error(TOOL, &e),
        }
    }

    #[tool(
        name = "runtime_jobs",
        description = "Recent jobs; with jobId, that job and its stdout from offset (follow output.nextOffset to output.complete).",
        input_schema = input::<JobsRequest>(),
        output_schema = schema_for_output::<JobsResponse>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn runtime_jobs(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        const TOOL: &str = "runtime_jobs";
        let (req, caller) = match parse_args::<JobsRequest>(args).and_then(|r| Ok((r, self.caller(&ctx)?))) {
            Ok(x) => x,
            Err(e) => return self.error(TOOL, &e),
        };
        match self.service.jobs(req, &caller).await {
            Ok(resp) => self.structured(TOOL, &resp, CallOutcome::default()),
            Err(e) => self.error(TOOL, &e),
        }
    }

    #[tool(
        name = "runtime_kill",
        description = "Kill a running job's whole process tree (a background jobId); returns its final outcome.",
        input_schema = input::<KillRequest>(),
        output_schema = schema_for_output::<ExecuteResponse>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn runtime_kill(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        const TOOL: &str = "runtime_kill";
        let req = match parse_args::<KillRequest>(args) {
            Ok(r) if !r.job_id.trim().is_empty() => r,
            Ok(_) => return self.error(TOOL, &ServiceError::Invalid("jobId must not be empty".into())),
            Err(e) => return self.error(TOOL, &e),
        };
        let caller = match self.caller(&ctx) {
            Ok(c) => c,
            Err(e) => return self.error(TOOL, &e),
        };
        match self.service.kill(&req.job_id, &caller).await {
            Ok(resp) => self.job_answer(
                TOOL,
                &resp.clone().lean(false),
                CallOutcome { status: Some(resp.status.as_str()), ..CallOutcome::default() },
            ),
            Err(e) => self.error(TOOL, &e),
        }
    }
}

#[tool_router(router = diagnostic_tools, vis = "pub(crate)")]
impl ConfineServer {
    #[tool(
        name = "info",
        description = "Call first: runtimes, limits, env allowlist, isolation here; repoId: that workspace; verbose: all details.",
        input_schema = input::<InfoRequest>(),
        output_schema = schema_for_output::<Info>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn info(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        const TOOL: &str = "info";
        let req = match parse_args::<InfoRequest>(args) {
            Ok(r) => r,
            Err(e) => return self.error(TOOL, &e),
        };
        // A repository this caller may not use is not described to it.
        if let Err(e) = self.caller(&ctx).and_then(|c| req.repo_id.as_deref().map_or(Ok(()), |r| c.check_repo(r))) {
            return self.error(TOOL, &e);
        }
        match self.service.info(req.repo_id.as_deref()).await {
            Ok(resp) => {
                let resp = resp.lean(req.verbose == Some(true));
                let text = resp.text();
                // With a memory service and a repoId: `staleMemories` too.
                let value = self.info_with_memory(req.repo_id.as_deref(), &resp).await;
                self.structured_with_text(TOOL, value, text, CallOutcome::default())
            }
            Err(e) => self.error(TOOL, &e),
        }
    }

    #[tool(
        name = "usage_stats",
        description = "Output bytes the jobs produced against bytes returned to you, per tool.",
        input_schema = input::<UsageStatsRequest>(),
        output_schema = schema_for_output::<UsageStatsResponse>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn usage_stats(&self, args: JsonObject) -> CallToolResult {
        const TOOL: &str = "usage_stats";
        let req = match parse_args::<UsageStatsRequest>(args) {
            Ok(r) => r,
            Err(e) => return self.error(TOOL, &e),
        };
        let session = self.usage.snapshot();
        let mut resp = UsageStatsResponse { scope: req.scope, ..UsageStatsResponse::default() };
        if req.persist == Some(true) {
            match self.service.record_usage(&session).await {
                Ok(()) => resp.persisted = true,
                Err(e) => return self.error(TOOL, &e),
            }
        }
        if req.scope != UsageScope::Session {
            match self.service.usage_history(&req).await {
                Ok(history) => {
                    resp.history_available = history.is_some();
                    resp.history = history;
                }
                Err(e) => return self.error(TOOL, &e),
            }
        }
        if req.scope != UsageScope::History {
            resp.session = Some(session);
        }
        self.structured(TOOL, &resp, CallOutcome::default())
    }
}
