//! `confine serve --http ADDR`: the streamable HTTP transport at `/mcp`
//! (rmcp's tower service under axum), behind [`Guard`]: token, Host and
//! Origin allowlists, 4 MiB bodies.
//!
//! rmcp's own Host/Origin checks are turned off on purpose: the guard is
//! the single place those rules live (its wildcard-bind rule has no rmcp
//! equivalent), and it runs first. rmcp still enforces the body cap while
//! streaming, for chunked bodies that carry no Content-Length.

use super::http_guard::{Guard, MAX_BODY_BYTES};
use super::{ConfineServer, McpError};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Environment variable holding the bearer token when no --token-file is given.
pub const TOKEN_ENV: &str = "CONFINE_TOKEN";

/// How long open connections get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What the HTTP listener needs.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    pub token: Option<String>,
    pub allow_origins: Vec<String>,
}

/// The bearer token: the first line of `token_file`, else `$CONFINE_TOKEN`,
/// else none.
pub fn load_token(token_file: Option<&Path>) -> Result<Option<String>, McpError> {
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| McpError::Config(format!("cannot read --token-file {}: {e}", path.display())))?;
        let token = text.lines().next().unwrap_or("").trim().to_string();
        if token.is_empty() {
            return Err(McpError::Config(format!("--token-file {} is empty", path.display())));
        }
        warn_if_readable_by_others(path);
        return Ok(Some(token));
    }
    Ok(std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()))
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "the token file is readable by group or others; chmod 600 it");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// Serve MCP over streamable HTTP until `shutdown` fires, then stop
/// accepting, cancel running calls (their sessions end), and return.
pub async fn serve_http(server: ConfineServer, opts: HttpOptions, shutdown: CancellationToken) -> Result<(), McpError> {
    if !opts.addr.ip().is_loopback() && opts.token.is_none() {
        return Err(McpError::Config(format!(
            "binding to {} (not loopback) requires a bearer token: --token-file FILE or {TOKEN_ENV}",
            opts.addr
        )));
    }
    // Only the bind IP matters to the guard: check the options before binding.
    let guard = Guard::new(opts.addr, &opts.allow_origins, opts.token.as_deref()).map_err(McpError::Config)?;
    let listener =
        tokio::net::TcpListener::bind(opts.addr).await.map_err(|source| McpError::Bind { addr: opts.addr, source })?;
    let local = listener.local_addr().map_err(|source| McpError::Bind { addr: opts.addr, source })?;
    let router = router(server, guard.clone(), shutdown.child_token());
    // The one line a wrapper (or a test) reads to find the port of `--http 127.0.0.1:0`.
    eprintln!(
        "confine: serving MCP over streamable HTTP at http://{local}/mcp{}",
        if guard.requires_token() { " (bearer token required)" } else { "" }
    );
    let serve = axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let mut task = tokio::spawn(async move { serve.await });
    tokio::select! {
        joined = &mut task => return match joined {
            Ok(result) => result.map_err(McpError::Http),
            Err(e) => Err(McpError::Task(e.to_string())),
        },
        () = shutdown.cancelled() => {}
    }
    if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
        tracing::warn!("HTTP connections still open {SHUTDOWN_GRACE:?} after shutdown; dropping them");
    }
    Ok(())
}

/// The axum app: `/mcp` behind the guard. Public for tests that drive it
/// without a socket.
pub fn router(server: ConfineServer, guard: Guard, calls: CancellationToken) -> axum::Router {
    // Every MCP session gets a clone of the server: one service, one set of
    // usage counters. Cancelling `calls` ends every session, which cancels
    // their running calls.
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(calls)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    let mcp: StreamableHttpService<ConfineServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.clone()), Arc::new(LocalSessionManager::default()), config);
    axum::Router::new().nest_service("/mcp", mcp).layer(middleware::from_fn_with_state(Arc::new(guard), gate))
}

async fn gate(State(guard): State<Arc<Guard>>, req: Request, next: Next) -> Response {
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    match guard.check(req.headers(), authority.as_deref()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            tracing::info!(status = refusal.status.as_u16(), reason = %refusal.reason, "HTTP request refused");
            let mut resp = (refusal.status, format!("{}\n", refusal.reason)).into_response();
            if refusal.status == axum::http::StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer realm=\"confine\""),
                );
            }
            resp
        }
    }
}
