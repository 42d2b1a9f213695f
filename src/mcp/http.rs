//! `confine serve --http ADDR`: the streamable HTTP transport at `/mcp`
//! (rmcp's tower service under axum), behind [`Guard`]: token, Host and
//! Origin allowlists, 4 MiB bodies. A token is always required, unless
//! `--no-token` on loopback: when none is given one is generated
//! ([`super::token`]).
//!
//! rmcp's own Host/Origin checks are turned off on purpose: the guard is
//! the single place those rules live (its wildcard-bind rule has no rmcp
//! equivalent), and it runs first. rmcp still enforces the body cap while
//! streaming, for chunked bodies that carry no Content-Length.

use super::http_guard::{Auth, Guard, MAX_BODY_BYTES};
use super::token::{self, Credential, TokenFile};
use super::{ConfineServer, McpError};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long open connections get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What the HTTP listener needs.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub addr: SocketAddr,
    /// The tokens given (`--token-file` or `$CONFINE_TOKEN`, and
    /// `[[mcp.tokens]]`); none: one is generated at start.
    pub tokens: Vec<Credential>,
    /// `--no-token`: serve without a token (loopback only).
    pub no_token: bool,
    pub allow_origins: Vec<String>,
}

/// Serve MCP over streamable HTTP until `shutdown` fires, then stop
/// accepting, cancel running calls (their sessions end), remove a
/// generated token's file, and return.
pub async fn serve_http(server: ConfineServer, opts: HttpOptions, shutdown: CancellationToken) -> Result<(), McpError> {
    if opts.no_token && !opts.tokens.is_empty() {
        return Err(McpError::Config(
            "--no-token conflicts with the tokens given (--token-file, CONFINE_TOKEN or [[mcp.tokens]])".into(),
        ));
    }
    if opts.no_token {
        // Before binding: a public address without a token is refused here.
        Guard::new(opts.addr, &opts.allow_origins, Auth::Open)?;
    }
    let listener =
        tokio::net::TcpListener::bind(opts.addr).await.map_err(|source| McpError::Bind { addr: opts.addr, source })?;
    let local = listener.local_addr().map_err(|source| McpError::Bind { addr: opts.addr, source })?;
    // Kept until we return: dropping it removes the file.
    let mut generated = None;
    let auth = if opts.no_token {
        eprintln!(
            "confine: warning: --no-token: any local process, a job run with --net host included, can use this \
             server and everything it serves"
        );
        Auth::Open
    } else if opts.tokens.is_empty() {
        let token = token::generate()?;
        let dir = token::runtime_dir(|k| std::env::var_os(k), token::is_root())?;
        let file = TokenFile::create(&dir, &format!("mcp-{}.token", local.port()), &token)?;
        eprintln!(
            "confine: no token was given: generated one in {} (send 'Authorization: Bearer <its contents>'; the \
             file is removed at shutdown)",
            file.path().display()
        );
        generated = Some(file);
        Auth::Tokens(vec![Credential::operator(&token)])
    } else {
        Auth::Tokens(opts.tokens)
    };
    let guard = Guard::new(local, &opts.allow_origins, auth)?;
    let router = router(server, guard.clone(), shutdown.child_token());
    // The one line a wrapper (or a test) reads to find the port of `--http 127.0.0.1:0`.
    eprintln!(
        "confine: serving MCP over streamable HTTP at http://{local}/mcp{}",
        if guard.requires_token() { " (bearer token required)" } else { "" }
    );
    // Every accepted connection without Nagle's algorithm: a keep-alive
    // client (the TypeScript SDK) sends a request's headers and body in
    // two writes, and the answer would otherwise wait on its delayed ACK.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set on an MCP connection: {e}");
        }
    });
    let serve = axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let mut task = tokio::spawn(async move { serve.await });
    let result = tokio::select! {
        joined = &mut task => match joined {
            Ok(result) => result.map_err(McpError::Http),
            Err(e) => Err(McpError::Task(e.to_string())),
        },
        () = shutdown.cancelled() => {
            if tokio::time::timeout(SHUTDOWN_GRACE, task).await.is_err() {
                tracing::warn!("HTTP connections still open {SHUTDOWN_GRACE:?} after shutdown; dropping them");
            }
            Ok(())
        }
    };
    drop(generated);
    result
}

/// The axum app: `/mcp` behind the guard. Public for tests that drive it
/// without a socket.
pub fn router(server: ConfineServer, guard: Guard, calls: CancellationToken) -> axum::Router {
    // Every MCP session gets a clone of the server: one service, one set of
    // usage counters; each call is served as the caller the guard found
    // for its token (`access.rs`). Cancelling `calls` ends every session,
    // which cancels their running calls.
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(calls)
        .with_max_request_body_bytes(MAX_BODY_BYTES)
        .disable_allowed_hosts()
        .disable_allowed_origins();
    let mcp: StreamableHttpService<ConfineServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(server.over_http()), Arc::new(LocalSessionManager::default()), config);
    let gate_state = Arc::new(Gate { guard, sessions: std::sync::Mutex::new(std::collections::HashMap::new()) });
    axum::Router::new().nest_service("/mcp", mcp).layer(middleware::from_fn_with_state(gate_state, gate))
}

/// The guard, and which principal opened each MCP session: rmcp routes a
/// request to a session by its `Mcp-Session-Id` alone, so a holder of
/// another token who learnt a session's id could send into it (cancel its
/// calls, say). A session answers only to the token that opened it.
struct Gate {
    guard: Guard,
    sessions: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

const SESSION_HEADER: &str = "mcp-session-id";
/// Sessions whose opener the gate remembers.
const MAX_SESSIONS: usize = 65_536;

async fn gate(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let authority = req.uri().authority().map(|a| a.as_str().to_string());
    match gate.guard.check(req.headers(), authority.as_deref()) {
        Ok(caller) => {
            let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
            if let Some(id) = &session {
                // A poisoned lock knows nothing for sure: refuse.
                let Ok(sessions) = gate.sessions.lock() else {
                    return (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "session table unavailable\n")
                        .into_response();
                };
                // Unknown here (never opened, or forgotten) or another's: as
                // rmcp answers an unknown session, nothing to learn.
                if sessions.get(id).is_none_or(|p| *p != caller.principal) {
                    return (axum::http::StatusCode::NOT_FOUND, "Not Found: Session not found\n").into_response();
                }
            }
            let deleting = req.method() == axum::http::Method::DELETE;
            let principal = caller.principal.clone();
            // rmcp hands the request's parts, extensions included, to the
            // tool handlers: they read the caller there.
            let mut req = req;
            req.extensions_mut().insert(caller);
            let mut resp = next.run(req).await;
            // rmcp answers a closed session 202; clients (the Python SDK)
            // expect 200 or 204 and warn otherwise.
            if deleting && resp.status() == axum::http::StatusCode::ACCEPTED {
                *resp.status_mut() = axum::http::StatusCode::NO_CONTENT;
            }
            if let Ok(mut sessions) = gate.sessions.lock() {
                match (&session, resp.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok())) {
                    // A session was opened by this request. Sessions a client
                    // left without a DELETE stay in the table: past its
                    // bound it is cleared, and the sessions it forgot answer
                    // no one (their clients open new ones).
                    (None, Some(opened)) => {
                        if sessions.len() >= MAX_SESSIONS {
                            sessions.clear();
                        }
                        sessions.insert(opened.to_string(), principal);
                    }
                    (Some(id), _) if deleting && resp.status().is_success() => {
                        sessions.remove(id);
                    }
                    _ => {}
                }
            }
            resp
        }
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
