//! The MCP server (`confine serve`): a thin adapter from the Model Context
//! Protocol to a [`RuntimeService`]. It owns the tool surface (names,
//! schemas, descriptions), protocol behaviour (cancellation, progress, tool
//! errors), the transports (stdio, streamable HTTP with its guard) and the
//! session usage counters. It must never hold sandbox or policy logic:
//! every decision about a job is the service's.
//!
//! Layout: `service.rs` the trait (the seam), `types/` the wire types,
//! `server.rs` + `tools.rs` the rmcp handler, `access.rs` who is calling
//! and what they may touch, `progress.rs`, `usage.rs`, `http.rs` +
//! `http_guard.rs` + `token.rs` the HTTP transport and its tokens,
//! `stdio.rs` the stdio transport,
//! `fake/` the test double (tests only: the `test-double` feature, which
//! the crate's dev-dependency on itself turns on for the test binaries).

pub mod access;
#[cfg(any(test, feature = "test-double"))]
pub mod fake;
pub mod http;
pub mod http_guard;
mod memory_tools;
mod progress;
#[cfg(target_os = "linux")]
pub mod real;
mod schema;
pub mod server;
pub mod service;
mod stdio;
pub mod token;
mod tools;
pub mod types;
pub mod usage;

#[cfg(any(test, feature = "test-double"))]
pub use fake::FakeService;
pub use memory_tools::serve_memory;
pub use server::ConfineServer;
pub use service::{ExecControl, Progress, ProgressSink, RuntimeService, ServiceError};

use rmcp::ServiceExt;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Errors of the MCP server layer (startup and transports; tool failures
/// are tool results, never these).
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The client did not complete the MCP handshake.
    #[error("MCP handshake failed: {0}")]
    Handshake(String),
    /// The server task died.
    #[error("MCP server task failed: {0}")]
    Task(String),
    /// The HTTP address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    /// The HTTP server failed while serving.
    #[error("HTTP server: {0}")]
    Http(std::io::Error),
    /// Options that can't work together, or a token that can't be read.
    #[error("{0}")]
    Config(String),
    /// A listener's options can't work (no token on a public bind, a bad origin).
    #[error(transparent)]
    Guard(#[from] crate::mcp::http_guard::GuardError),
    /// The runtime service could not be built.
    #[error("cannot start the runtime service: {0}")]
    Service(String),
}

/// What `confine serve` runs on: the configuration, the one sled store
/// (sled allows one open per process: everything shares this handle), and
/// the runtime service (the real supervisor).
pub struct Services {
    pub config: crate::config::Config,
    pub store: crate::store::Store,
    pub runtime: Arc<dyn RuntimeService>,
    /// The supervisor behind `runtime`: commands relayed over the store's
    /// socket run on it ([`crate::relay`]).
    #[cfg(target_os = "linux")]
    pub supervisor: Arc<crate::supervisor::Supervisor>,
}

/// Load the config, open the store once, and start the supervisor.
#[cfg(target_os = "linux")]
pub fn services(config_path: Option<&Path>) -> Result<Services, McpError> {
    let config = crate::config::Config::load(config_path).map_err(|e| McpError::Service(e.to_string()))?;
    let store = crate::store::Store::open(&config.store_path()).map_err(|e| McpError::Service(e.to_string()))?;
    let sup = crate::supervisor::Supervisor::with_store(config.clone(), store.clone())
        .map_err(|e| McpError::Service(e.to_string()))?;
    let supervisor = Arc::new(sup);
    let runtime: Arc<dyn RuntimeService> = Arc::new(real::SupervisorService::new(supervisor.clone()));
    Ok(Services { config, store, runtime, supervisor })
}

/// The governed runtime needs the Linux sandbox; the degraded backends
/// only serve `confine run --allow-degraded`.
#[cfg(not(target_os = "linux"))]
pub fn services(_config_path: Option<&Path>) -> Result<Services, McpError> {
    Err(McpError::Service(
        "confine serve needs the Linux sandbox; on this platform use `confine run --allow-degraded`".into(),
    ))
}

/// The service `confine serve` exposes: the real supervisor.
#[cfg(target_os = "linux")]
pub fn default_service(config_path: Option<&Path>) -> Result<Arc<dyn RuntimeService>, McpError> {
    services(config_path).map(|s| s.runtime)
}

/// Serve MCP over stdin/stdout until the client closes stdin or `shutdown`
/// fires. Nothing but protocol goes to stdout; a line that is not JSON is
/// answered with a parse error ([`stdio`]). A client that goes away
/// mid-call gets its calls cancelled (rmcp waits up to 5 s for them to
/// answer first); `shutdown` cancels them at once.
pub async fn serve_stdio(server: ConfineServer, shutdown: CancellationToken) -> Result<(), McpError> {
    let ct = shutdown.child_token();
    let (input, output) = rmcp::transport::stdio_pipes();
    let transport = stdio::AnsweringTransport::new(input, output);
    let running = tokio::select! {
        biased;
        () = ct.cancelled() => return Ok(()),
        r = server.serve_with_ct(transport, ct.clone()) => match r {
            Ok(running) => running,
            // Stopped by a signal during the handshake: not a failure.
            Err(_) if ct.is_cancelled() => return Ok(()),
            Err(e) => return Err(McpError::Handshake(e.to_string())),
        },
    };
    let reason = running.waiting().await.map_err(|e| McpError::Task(e.to_string()))?;
    tracing::info!(?reason, "stdio session ended");
    Ok(())
}
