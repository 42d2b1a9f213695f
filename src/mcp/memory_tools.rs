//! The memory and feedback tools: memory_store, memory_query,
//! memory_remove, memory_surface, agent_feedback, agent_feedback_query
//! (the SDL-MCP memory tools, same camelCase parameters). Each parses its
//! arguments, runs the [`MemoryService`] call on a blocking thread (sled and
//! file hashing block), and shapes the result; the rules live in
//! `crate::store::memory`. Registered only when the server was given a
//! memory service ([`ConfineServer::with_memory`]).

use super::server::{parse_args, CallOutcome, ConfineServer};
use super::service::ServiceError;
use crate::store::feedback::{FeedbackQuery, FeedbackQueryResult, FeedbackRequest, FeedbackResult};
use crate::store::memory::{
    MemoryError, MemoryQuery, MemoryService, QueryResult, RemoveRequest, RemoveResult, StoreRequest, StoreResult,
    SurfaceRequest, SurfaceResult,
};
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input};
use rmcp::handler::server::tool::schema_for_output;
use rmcp::model::{CallToolResult, JsonObject};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, RoleServer};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

/// Input schema of a request type (see `tools.rs`: an empty schema and a
/// log line beat a panic in a server).
fn input<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_input::<T>().unwrap_or_else(|e| {
        tracing::error!(error = %e, "invalid input schema");
        schema_for_empty_input()
    })
}

/// The memory service `confine serve` offers, on the server's one store:
/// `None` (no memory tools) when confine.toml has no `[[repos]]`, since
/// every memory belongs to a repository. Before serving, hand edits of
/// every repository's `.md` files are read back and stale memories
/// flagged; a repository that fails is logged, not fatal.
pub async fn serve_memory(
    config: &crate::config::Config,
    store: &crate::store::Store,
) -> Result<Option<Arc<MemoryService>>, super::McpError> {
    if config.repos.is_empty() {
        tracing::info!("no [[repos]] in the configuration: the memory tools are not offered");
        return Ok(None);
    }
    let memory = MemoryService::open(store, &config.repos).map_err(|e| super::McpError::Service(e.to_string()))?;
    let memory = Arc::new(memory);
    let m = memory.clone();
    match tokio::task::spawn_blocking(move || crate::store::releasing(|| m.startup())).await {
        Ok(problems) => {
            for p in problems {
                tracing::warn!("memory: {p}");
            }
        }
        Err(e) => tracing::warn!(error = %e, "memory: the start-up sync and check failed"),
    }
    Ok(Some(memory))
}

/// A memory error as a tool error with a stable status.
pub(crate) fn service_error(e: MemoryError) -> ServiceError {
    match e {
        MemoryError::Invalid(_) | MemoryError::Conflict { .. } => ServiceError::Invalid(e.to_string()),
        MemoryError::NotFound { .. } | MemoryError::UnknownRepo { .. } => ServiceError::NotFound(e.to_string()),
        MemoryError::Repo { .. } | MemoryError::File { .. } | MemoryError::Store(_) | MemoryError::Corrupt { .. } => {
            ServiceError::Internal(e.to_string())
        }
    }
}

/// A memory or feedback request: the repository it is about.
pub(crate) trait RepoScoped {
    fn repo_id(&self) -> &str;
}

macro_rules! repo_scoped {
    ($($t:ty),*) => {$(
        impl RepoScoped for $t {
            fn repo_id(&self) -> &str {
                &self.repo_id
            }
        }
    )*};
}

repo_scoped!(StoreRequest, MemoryQuery, RemoveRequest, SurfaceRequest, FeedbackRequest, FeedbackQuery);

impl ConfineServer {
    /// Parse `args`, run `call` on the memory service off the async
    /// threads, and answer with its result or a one-line tool error.
    async fn memory_call<Req, Resp>(
        &self,
        tool: &str,
        args: JsonObject,
        ctx: RequestContext<RoleServer>,
        call: impl FnOnce(&MemoryService, &Req) -> Result<Resp, MemoryError> + Send + 'static,
    ) -> CallToolResult
    where
        Req: DeserializeOwned + RepoScoped + Send + 'static,
        Resp: Serialize + Send + 'static,
    {
        let Some(memory) = self.memory.clone() else {
            let e = ServiceError::Internal(
                "memory is not configured on this server (add [[repos]] to confine.toml)".into(),
            );
            return self.error(tool, &e);
        };
        let req = match parse_args::<Req>(args) {
            Ok(r) => r,
            Err(e) => return self.error(tool, &e),
        };
        // Memories belong to a repository: only a caller that may use it
        // reads or writes them.
        if let Err(e) = self.caller(&ctx).and_then(|c| c.check_repo(req.repo_id())) {
            return self.error(tool, &e);
        }
        let joined = tokio::task::spawn_blocking(move || crate::store::releasing(|| call(&memory, &req))).await;
        match joined {
            Ok(Ok(resp)) => self.structured(tool, &resp, CallOutcome::default()),
            Ok(Err(e)) => self.error(tool, &service_error(e)),
            Err(e) => self.error(tool, &ServiceError::Internal(format!("the memory call failed: {e}"))),
        }
    }

    /// `info`'s answer with `staleMemories` (live memories of `repo_id`
    /// whose linked files changed), when this server keeps memories.
    pub(crate) async fn info_with_memory<T: Serialize>(&self, repo_id: Option<&str>, info: &T) -> serde_json::Value {
        let mut value = serde_json::to_value(info).unwrap_or_default();
        let (Some(memory), Some(repo_id)) = (self.memory.clone(), repo_id) else { return value };
        let id = repo_id.to_string();
        match tokio::task::spawn_blocking(move || crate::store::releasing(|| memory.stale_count(&id))).await {
            Ok(Ok(n)) => {
                if let Some(obj) = value.as_object_mut() {
                    obj.insert("staleMemories".into(), n.into());
                }
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "info: no stale memory count"),
            Err(e) => tracing::warn!(error = %e, "info: the stale memory count failed"),
        }
        value
    }
}

#[tool_router(router = memory_tools, vis = "pub(crate)")]
impl ConfineServer {
    #[tool(
        name = "memory_store",
        description = "Store what a later session should know about repoId, with the files and symbols it concerns (stale when they change).",
        input_schema = input::<StoreRequest>(),
        output_schema = schema_for_output::<StoreResult>(),
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn memory_store(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("memory_store", args, ctx, |m, r: &StoreRequest| m.store(r)).await
    }

    #[tool(
        name = "memory_query",
        description = "Search repoId's memories by words, types, tags or symbolIds; staleOnly: those whose files changed.",
        input_schema = input::<MemoryQuery>(),
        output_schema = schema_for_output::<QueryResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn memory_query(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("memory_query", args, ctx, |m, r: &MemoryQuery| m.query(r)).await
    }

    #[tool(
        name = "memory_remove",
        description = "Remove memoryId of repoId from queries and surface.",
        input_schema = input::<RemoveRequest>(),
        output_schema = schema_for_output::<RemoveResult>(),
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn memory_remove(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("memory_remove", args, ctx, |m, r: &RemoveRequest| m.remove(r)).await
    }

    #[tool(
        name = "memory_surface",
        description = "Before coding: memories linked to the symbolIds or fileRelPaths you touch, best first. Verify stale ones.",
        input_schema = input::<SurfaceRequest>(),
        output_schema = schema_for_output::<SurfaceResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn memory_surface(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("memory_surface", args, ctx, |m, r: &SurfaceRequest| m.surface(r)).await
    }

    #[tool(
        name = "agent_feedback",
        description = "After a task: which returned handles were useful, and what was missing.",
        input_schema = input::<FeedbackRequest>(),
        output_schema = schema_for_output::<FeedbackResult>(),
        annotations(read_only_hint = false, destructive_hint = false, open_world_hint = false)
    )]
    async fn agent_feedback(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("agent_feedback", args, ctx, |m, r: &FeedbackRequest| m.feedback(r)).await
    }

    #[tool(
        name = "agent_feedback_query",
        description = "Feedback for repoId, newest first; the most useful and most missed entries.",
        input_schema = input::<FeedbackQuery>(),
        output_schema = schema_for_output::<FeedbackQueryResult>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn agent_feedback_query(&self, args: JsonObject, ctx: RequestContext<RoleServer>) -> CallToolResult {
        self.memory_call("agent_feedback_query", args, ctx, |m, r: &FeedbackQuery| m.feedback_query(r)).await
    }
}

#[cfg(test)]
mod tests;
