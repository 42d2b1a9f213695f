//! `confine serve`: the MCP server, over stdio (default) or streamable HTTP.
//! Parses options, builds the service once, runs a transport until the
//! client leaves or SIGTERM/SIGINT arrives, then shuts the service down so
//! its jobs die and its store is flushed before the process exits.

use crate::mcp::http::{serve_http, HttpOptions};
use crate::mcp::token::TOKEN_ENV;
use crate::mcp::{serve_stdio, ConfineServer, McpError};
use clap::Args;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  confine serve                                  # stdio, for an MCP client that spawns it\n  \
confine serve --http 127.0.0.1:8765            # streamable HTTP at http://127.0.0.1:8765/mcp, token generated\n  \
confine serve --http :8765                     # the same: no host (or localhost) means loopback, never all interfaces\n  \
confine serve --http 0.0.0.0:8765 --token-file /etc/confine/token\n\n\
HTTP always requires a bearer token (Authorization: Bearer <token>), on loopback too: any local process, a job \
run with --net host included, can reach it. The tokens are --token-file (else $CONFINE_TOKEN) and the \
[[mcp.tokens]] of confine.toml, each scoped to repositories. With none of them, a random token is generated and \
written, 0600, to $XDG_RUNTIME_DIR/confine/mcp-<port>.token (as root without XDG_RUNTIME_DIR: \
/run/confine/mcp-<port>.token); its path is printed on stderr, and it is removed at shutdown. --no-token serves \
without one, on a loopback address only, with a warning.\n\n\
Logs go to stderr (filter with CONFINE_LOG, e.g. CONFINE_LOG=debug); stdout carries only the protocol."
)]
pub struct ServeArgs {
    /// Serve streamable HTTP on ADDR (path /mcp) instead of stdio: IP:PORT, localhost:PORT or :PORT, the last
    /// two meaning 127.0.0.1:PORT (loopback only; every interface is 0.0.0.0:PORT, said in full). Port 0 picks a
    /// free port; the address is printed on stderr.
    #[arg(long, value_name = "ADDR", value_parser = parse_http_addr)]
    pub http: Option<SocketAddr>,
    /// File whose first line is the bearer token HTTP clients must send, for every repository [default: $CONFINE_TOKEN; none given: one is generated].
    #[arg(long, value_name = "FILE", requires = "http", conflicts_with = "no_token")]
    pub token_file: Option<PathBuf>,
    /// Serve HTTP without a token: loopback addresses only, and any local process can use the server.
    #[arg(long, requires = "http")]
    pub no_token: bool,
    /// Also accept requests from this browser Origin, as scheme://host[:port]; repeatable. Loopback origins are always accepted.
    #[arg(long = "allow-origin", value_name = "ORIGIN", requires = "http")]
    pub allow_origin: Vec<String>,
}

/// `--http`'s address. A host left out (`:PORT`) or named `localhost` is
/// IPv4 loopback: all interfaces are never reached by leaving something
/// out, only by writing `0.0.0.0` or `[::]`.
pub(crate) fn parse_http_addr(s: &str) -> Result<SocketAddr, String> {
    let loopback = |port: &str| port.parse::<u16>().ok().map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
    let parsed = match s.rsplit_once(':') {
        Some(("", port)) => loopback(port),
        Some((host, port)) if host.eq_ignore_ascii_case("localhost") => loopback(port),
        _ => s.parse().ok(),
    };
    parsed.ok_or_else(|| {
        format!(
            "'{s}' is not an address to listen on: use IP:PORT, localhost:PORT or :PORT (both loopback), \
             e.g. 127.0.0.1:8765, or [::1]:8765"
        )
    })
}

pub fn main(config: Option<&Path>, args: ServeArgs) -> i32 {
    // Before the runtime's threads: a long-lived supervisor's RSS must not creep.
    crate::supervisor::tune_allocator();
    crate::supervisor::bound_arenas();
    // Relayed commands write to their clients' terminals. A server started
    // in the background of the same terminal would be stopped by SIGTTOU
    // there (`stty tostop`); ignored, the write goes through. Jobs start
    // with every disposition back to its default (the init stage).
    #[cfg(unix)]
    // SAFETY: SIG_IGN installs no handler: no code of ours runs on a signal.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("confine serve: cannot start the async runtime: {e}");
            return super::EXIT_CONFINE_FAILED;
        }
    };
    let result = rt.block_on(run(config, args));
    // Don't wait for a blocking stdin read (stdin is a terminal, not a pipe):
    // the service is shut down, nothing is left to finish.
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("confine serve: {e}");
            super::EXIT_CONFINE_FAILED
        }
    }
}

async fn run(config: Option<&Path>, args: ServeArgs) -> Result<(), McpError> {
    // One config and one sled store for every service (sled allows one open per process).
    let services = crate::mcp::services(config)?;
    let service = services.runtime.clone();
    let memory = crate::mcp::serve_memory(&services.config, &services.store).await?;
    let server = match memory.clone() {
        Some(memory) => ConfineServer::new(service.clone()).with_memory(memory),
        None => ConfineServer::new(service.clone()),
    };
    // After the config set the cgroup parent (services), before any call.
    #[cfg(target_os = "linux")]
    tokio::spawn(crate::sandbox::linux::startup_sweep());
    // Sandboxes for the first request, built from now on.
    #[cfg(target_os = "linux")]
    services.supervisor.prewarm();
    let shutdown = CancellationToken::new();
    watch_signals(shutdown.clone());
    let relay = start_relay(&services, memory, shutdown.clone());
    // What bursts of jobs leave free in the allocator goes back to the host.
    #[cfg(target_os = "linux")]
    tokio::spawn(crate::supervisor::trim_when_idle(services.supervisor.clone(), shutdown.clone()));
    let served = match args.http {
        Some(addr) => {
            let env = std::env::var(TOKEN_ENV).ok();
            match crate::mcp::token::load(args.token_file.as_deref(), env, &services.config.mcp) {
                Ok(tokens) => {
                    let opts = HttpOptions { addr, tokens, no_token: args.no_token, allow_origins: args.allow_origin };
                    serve_http(server.clone(), opts, shutdown.clone()).await
                }
                Err(e) => Err(e),
            }
        }
        None => serve_stdio(server.clone(), shutdown.clone()).await,
    };
    // Transports are closed: no new calls. Kill what still runs, keep the
    // session's usage, and let the service flush its store.
    shutdown.cancel();
    // Relayed jobs are killed and recorded, and the socket removed, before
    // the store closes.
    if let Some(relay) = relay {
        let _ = relay.await;
    }
    if let Err(e) = service.record_usage(&server.usage().snapshot()).await {
        tracing::warn!(error = %e, "could not record this session's usage");
    }
    service.shutdown().await;
    served
}

/// Listen on the store's socket, so that the CLI's store commands reach
/// this server while it holds the store ([`crate::relay`]). Without it the
/// server still serves MCP; those commands then say which pid holds the store.
#[cfg(target_os = "linux")]
fn start_relay(
    services: &crate::mcp::Services,
    memory: Option<std::sync::Arc<crate::store::memory::MemoryService>>,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    use crate::relay::server::{Context, Listener};
    let listener = match Listener::bind(services.store.path()) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen on the store's socket: `confine exec`, `audit`, `artifacts`, `memory` and `gc` cannot reach this server");
            return None;
        }
    };
    tracing::info!(socket = %listener.path().display(), "the CLI's store commands are relayed here");
    let ctx = Context::new(services.config.clone(), services.supervisor.clone(), memory, shutdown);
    Some(tokio::spawn(listener.serve(std::sync::Arc::new(ctx))))
}

/// No governed runtime off Linux, so no server to relay to (`services` fails first).
#[cfg(not(target_os = "linux"))]
fn start_relay(
    _services: &crate::mcp::Services,
    _memory: Option<std::sync::Arc<crate::store::memory::MemoryService>>,
    _shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    None
}

/// Cancel `shutdown` on SIGTERM or SIGINT.
fn watch_signals(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the server cleanly");
                    let _ = tokio::signal::ctrl_c().await;
                    shutdown.cancel();
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        shutdown.cancel();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_addresses_without_a_host_are_loopback() {
        let lo = |p| SocketAddr::from(([127, 0, 0, 1], p));
        assert_eq!(parse_http_addr(":8765"), Ok(lo(8765)));
        assert_eq!(parse_http_addr("localhost:0"), Ok(lo(0)));
        assert_eq!(parse_http_addr("LocalHost:80"), Ok(lo(80)));
        assert_eq!(parse_http_addr("127.0.0.1:9"), Ok(lo(9)));
        assert_eq!(parse_http_addr("[::1]:9"), Ok("[::1]:9".parse().unwrap()));
        assert_eq!(parse_http_addr("0.0.0.0:9"), Ok("0.0.0.0:9".parse().unwrap()));
        for bad in ["", ":", "8765", ":99999", "localhost", "localhost:x", "example.com:80", "::1:80"] {
            let e = parse_http_addr(bad).unwrap_err();
            assert!(e.contains("IP:PORT, localhost:PORT or :PORT"), "{bad}: {e}");
        }
    }
}
