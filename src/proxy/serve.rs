//! The proxy of one job, in the supervisor: HTTP CONNECT and plain HTTP
//! forwarding (hyper), on listening sockets that the job's pid 1 made in
//! the job's network namespace and handed over before the job ran. The
//! job reaches them on its own loopback; the proxy connects out from the
//! host's network namespace, to what its allowlist grants and nothing else.
//!
//! Every connection, allowed or denied, is recorded for the outcome and
//! the audit record: the job's limits (connections at once, bytes in all,
//! idle time) are enforced here.

use super::addr::{own_addresses, permitted, resolve};
use super::allowlist::{normalize_name, Allowlist, Grant, Target};
use super::tls;
use crate::job::{NetConnection, NetDecision, NetLimits, NetworkReport};
use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Debug builds only: the proxy refuses to start (tests of exit 125).
pub const TEST_FAIL_ENV: &str = "CONFINE_TEST_PROXY_FAIL";

/// The port the proxy listens on inside the job's network namespace.
pub const PROXY_PORT: u16 = 3128;
/// Connections kept in a job's report; more are counted, not listed.
const MAX_RECORDS: usize = 1000;
/// Time to resolve a name, to connect upstream, and for a client to send
/// its request headers or its TLS ClientHello.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, hyper::Error>;

/// One connection's record while it lives.
struct Conn {
    method: String,
    host: String,
    port: u16,
    started: Instant,
    /// Milliseconds after `started` of the last byte either way.
    last: AtomicU64,
    up: AtomicU64,
    down: AtomicU64,
    /// In the report already ([`State::keep`]).
    kept: std::sync::atomic::AtomicBool,
    state: Mutex<ConnState>,
}

#[derive(Default)]
struct ConnState {
    decision: Option<NetDecision>,
    reason: Option<String>,
    entry: Option<String>,
    address: Option<String>,
    duration_ms: Option<u64>,
}

impl Conn {
    fn set(&self, f: impl FnOnce(&mut ConnState)) {
        if let Ok(mut s) = self.state.lock() {
            f(&mut s);
        }
    }
    fn deny(&self, reason: String) {
        self.set(|s| {
            s.decision = Some(NetDecision::Denied);
            s.reason = Some(clip_reason(reason));
        });
        self.end();
    }
    /// Allowed, but the upstream could not be reached.
    fn fail(&self, grant: &Grant, reason: String) {
        self.set(|s| {
            s.decision = Some(NetDecision::Failed);
            s.entry = Some(grant.entry.clone());
            s.reason = Some(clip_reason(reason));
        });
        self.end();
    }
    fn end(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.set(|s| {
            s.duration_ms.get_or_insert(ms);
        });
    }
    fn touch(&self) {
        self.last.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    fn record(&self) -> NetConnection {
        let s = self
            .state
            .lock()
            .map(|s| (s.decision, s.reason.clone(), s.entry.clone(), s.address.clone(), s.duration_ms));
        let (decision, reason, entry, address, duration) = s.unwrap_or_default();
        NetConnection {
            method: self.method.clone(),
            host: self.host.clone(),
            port: self.port,
            decision: decision.unwrap_or(NetDecision::Denied),
            reason: match (decision, reason) {
                (None, None) => Some("the job ended before the proxy decided".into()),
                (_, r) => r.map(clip_reason),
            },
            entry,
            address,
            bytes_up: self.up.load(Ordering::Relaxed),
            bytes_down: self.down.load(Ordering::Relaxed),
            duration_ms: duration.unwrap_or_else(|| self.started.elapsed().as_millis() as u64),
        }
    }
}

/// What all of one job's connections share.
struct State {
    allow: Allowlist,
    limits: NetLimits,
    permits: Arc<Semaphore>,
    /// Connections decided, allowed and denied kept apart: a flood of
    /// denied ones can't push an allowed one out of the report.
    conns: Mutex<Kept>,
    denied: AtomicU64,
    total: AtomicU64,
    stop: CancellationToken,
}

impl State {
    /// A connection to decide on. The job chose `method` and `host`: they
    /// are kept to [`MAX_FIELD`] bytes.
    fn open(&self, method: &str, host: &str, port: u16) -> Arc<Conn> {
        Arc::new(Conn {
            method: clip(method),
            host: clip(host),
            port,
            started: Instant::now(),
            last: AtomicU64::new(0),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            kept: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::default(),
        })
    }

    /// Keep `conn` for the report, once, now that it is decided.
    fn keep(&self, conn: &Arc<Conn>, allowed: bool) {
        if conn.kept.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Ok(mut guard) = self.conns.lock() {
            let k = &mut *guard;
            let (list, unlisted) = if allowed {
                (&mut k.allowed, &mut k.unlisted_allowed)
            } else {
                (&mut k.denied, &mut k.unlisted_denied)
            };
            if list.len() < MAX_RECORDS {
                list.push(conn.clone());
            } else {
                *unlisted += 1;
            }
        }
    }
}

#[derive(Default)]
struct Kept {
    allowed: Vec<Arc<Conn>>,
    denied: Vec<Arc<Conn>>,
    unlisted_allowed: u64,
    unlisted_denied: u64,
}

/// Longest method or host kept in a record.
const MAX_FIELD: usize = 256;

fn clip(s: &str) -> String {
    super::clip_text(s, MAX_FIELD)
}

/// Longest reason kept in a record: reasons quote what the job sent.
const MAX_REASON: usize = 384;

fn clip_reason(s: String) -> String {
    if s.len() <= MAX_REASON {
        s
    } else {
        super::clip_text(&s, MAX_REASON)
    }
}

/// Denials logged at info per job; the rest at debug, so that a job that
/// keeps asking can't fill the server's log (the report counts them all).
const LOGGED_DENIALS: u64 = 20;

/// A job's proxy. Dropped, every connection of it is cut.
pub struct Proxy {
    state: Arc<State>,
    listening: Vec<String>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.cancel();
    }
}

impl Proxy {
    /// Serve the job's listeners.
    pub fn start(listeners: Vec<std::net::TcpListener>, allow: Allowlist, limits: NetLimits) -> std::io::Result<Proxy> {
        let state = Arc::new(State {
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            allow,
            limits,
            conns: Mutex::default(),
            denied: AtomicU64::new(0),
            total: AtomicU64::new(0),
            stop: CancellationToken::new(),
        });
        let mut listening = Vec::new();
        for l in listeners {
            l.set_nonblocking(true)?;
            let l = TcpListener::from_std(l)?;
            listening.push(l.local_addr()?.to_string());
            let state = state.clone();
            tokio::spawn(async move {
                let stop = state.stop.clone();
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = accept_loop(l, state) => {}
                }
            });
        }
        Ok(Proxy { state, listening })
    }

    /// Stop serving and say what happened: connections still open are cut.
    pub fn finish(self) -> NetworkReport {
        self.state.stop.cancel();
        let denied = self.state.denied.load(Ordering::Relaxed);
        if denied >= LOGGED_DENIALS {
            tracing::info!(denied, "network: the job's denials in all (past the first, logged at debug level)");
        }
        let (mut conns, unlisted_allowed, unlisted_denied) = match self.state.conns.lock() {
            Ok(k) => {
                let all = k.allowed.iter().chain(&k.denied).map(|c| (c.started, c.record())).collect::<Vec<_>>();
                (all, k.unlisted_allowed, k.unlisted_denied)
            }
            Err(_) => (Vec::new(), 0, 0),
        };
        conns.sort_by_key(|(started, _)| *started);
        NetworkReport {
            proxy: self.listening.clone(),
            allow: self.state.allow.to_strings(),
            denied: self.state.denied.load(Ordering::Relaxed),
            bytes: self.state.total.load(Ordering::Relaxed),
            unlisted_allowed,
            unlisted_denied,
            connections: conns.into_iter().map(|(_, r)| r).collect(),
        }
    }
}

/// A job's proxy being attached: its listeners come from the job's pid 1
/// on `sock`, and it answers there once it serves them (or why not).
/// Dropped, the proxy stops.
pub struct Attached {
    slot: Arc<Mutex<Option<Proxy>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Attached {
    /// Stop the proxy and say what went through it (`None`: it never started).
    pub fn finish(&mut self) -> Option<NetworkReport> {
        self.task.abort();
        let proxy = self.slot.lock().ok().and_then(|mut p| p.take());
        proxy.map(Proxy::finish)
    }
}

/// Attach a proxy for `allow` to the socket pid 1 hands its listeners over.
pub fn attach(sock: std::os::fd::OwnedFd, allow: Allowlist, limits: NetLimits) -> Attached {
    let slot: Arc<Mutex<Option<Proxy>>> = Arc::default();
    let task = {
        let slot = slot.clone();
        tokio::spawn(async move {
            let started = receive_listeners(&sock).await.and_then(|l| {
                // Debug builds: the tests' way to see a proxy that can't start.
                if cfg!(debug_assertions) && std::env::var_os(TEST_FAIL_ENV).is_some() {
                    return Err(std::io::Error::other(format!("{TEST_FAIL_ENV} is set")));
                }
                Proxy::start(l, allow, limits)
            });
            let answer = match started {
                Ok(proxy) => {
                    tracing::debug!(listening = ?proxy.listening, "network proxy serving");
                    if let Ok(mut s) = slot.lock() {
                        *s = Some(proxy);
                    }
                    crate::sandbox::linux::protocol::PROXY_READY.to_vec()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "network proxy could not start");
                    e.to_string().into_bytes()
                }
            };
            // pid 1 waits for this on a socket with nothing else in it.
            let _ = nix::sys::socket::send(
                std::os::fd::AsRawFd::as_raw_fd(&sock),
                &answer,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            );
        })
    };
    Attached { slot, task }
}

/// The listening sockets pid 1 sends: each must be a listening TCP
/// socket on the loopback at [`PROXY_PORT`], or none is used.
async fn receive_listeners(sock: &std::os::fd::OwnedFd) -> std::io::Result<Vec<std::net::TcpListener>> {
    use nix::sys::socket::{
        getsockname, getsockopt, recvmsg, sockopt, ControlMessageOwned, MsgFlags, SockType, SockaddrStorage,
    };
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let dup = sock.try_clone()?;
    let flags = nix::fcntl::fcntl(&dup, nix::fcntl::FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&dup, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(std::io::Error::from)?;
    // SAFETY: the AsyncFd owns `dup`, which stays open and the same fd
    // until the AsyncFd is dropped at the end of this function.
    let afd = unsafe { tokio::io::unix::AsyncFd::register(dup) }?;
    let fds: Vec<OwnedFd> = loop {
        let mut guard = afd.readable().await?;
        let got = guard.try_io(|inner| {
            let mut byte = [0u8; 1];
            let mut iov = [std::io::IoSliceMut::new(&mut byte)];
            let mut space = nix::cmsg_space!([std::os::fd::RawFd; 4]);
            let msg =
                recvmsg::<()>(inner.get_ref().as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
                    .map_err(std::io::Error::from)?;
            let mut fds = Vec::new();
            for cmsg in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(raw) = cmsg {
                    // SAFETY: SCM_RIGHTS gave us these fds; nothing else owns them.
                    fds.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                }
            }
            if msg.bytes == 0 {
                return Err(std::io::Error::other("the sandbox's pid 1 ended before it listened"));
            }
            Ok(fds)
        });
        match got {
            Ok(r) => break r?,
            Err(_would_block) => continue,
        }
    };
    let mut out = Vec::new();
    for fd in fds {
        let stream = getsockopt(&fd, sockopt::SockType).map_err(std::io::Error::from)? == SockType::Stream;
        let listening = getsockopt(&fd, sockopt::AcceptConn).map_err(std::io::Error::from)?;
        let addr: SockaddrStorage = getsockname(fd.as_raw_fd()).map_err(std::io::Error::from)?;
        let on_port = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
            (Some(a), _) => a.ip().is_loopback() && a.port() == PROXY_PORT,
            (_, Some(a)) => a.ip().is_loopback() && a.port() == PROXY_PORT,
            _ => false,
        };
        if !(stream && listening && on_port) {
            return Err(std::io::Error::other("pid 1 sent something that is not the proxy's listener"));
        }
        out.push(std::net::TcpListener::from(fd));
    }
    if out.is_empty() {
        return Err(std::io::Error::other("pid 1 sent no listener"));
    }
    Ok(out)
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let sock = match listener.accept().await {
            Ok((sock, _)) => sock,
            // Out of fds or memory: the supervisor's pressure, not the
            // job's fault; try again shortly rather than stop serving.
            Err(e) => {
                tracing::warn!(error = %e, "network proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let state = state.clone();
        let stop = state.stop.clone();
        match state.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = serve_conn(sock, state, permit) => {}
                    }
                });
            }
            Err(_) => {
                tokio::spawn(async move {
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = refuse_busy(sock, &state) => {}
                    }
                });
            }
        }
    }
}

/// Past the job's connection limit: a 503 and the end, with no request read.
async fn refuse_busy(mut sock: TcpStream, state: &State) {
    let n = state.limits.max_connections;
    let conn = state.open("-", "-", 0);
    state.denied.fetch_add(1, Ordering::Relaxed);
    state.keep(&conn, false);
    conn.deny(format!("the job has {n} connections open, its limit (network.max_connections)"));
    let body = format!("confine: denied: the job's connection limit ({n}) is reached\n");
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(body.as_bytes()).await?;
        sock.shutdown().await
    })
    .await;
}

async fn serve_conn(sock: TcpStream, state: Arc<State>, permit: OwnedSemaphorePermit) {
    // A CONNECT's tunnel outlives the HTTP exchange: its task is kept
    // here, and the permit with it, until the tunnel closes.
    let tunnel: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>> = Arc::default();
    let svc = {
        let (state, tunnel) = (state.clone(), tunnel.clone());
        hyper::service::service_fn(move |req| handle(state.clone(), tunnel.clone(), req))
    };
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(STEP_TIMEOUT)
        .max_buf_size(64 * 1024)
        .serve_connection(TokioIo::new(sock), svc)
        .with_upgrades()
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "network proxy: client connection ended");
    }
    let task = tunnel.lock().ok().and_then(|mut t| t.take());
    if let Some(task) = task {
        let _ = task.await;
    }
    drop(permit);
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let body = Full::new(Bytes::from(format!("confine: {msg}\n"))).map_err(|never| match never {}).boxed();
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

async fn handle(
    state: Arc<State>,
    tunnel: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Body>, Infallible> {
    Ok(if req.method() == Method::CONNECT { connect(state, tunnel, req).await } else { forward(state, req).await })
}

impl State {
    /// Deny `conn` with `reason`: recorded, and the client's answer.
    fn refuse(&self, conn: &Arc<Conn>, status: StatusCode, reason: String) -> Response<Body> {
        self.keep(conn, false);
        let reason = clip_reason(reason);
        let msg = format!("denied: {reason}");
        self.deny(conn, reason);
        text(status, &msg)
    }

    /// Count, log (the first [`LOGGED_DENIALS`] at info) and record a denial.
    fn deny(&self, conn: &Conn, reason: String) {
        let n = self.denied.fetch_add(1, Ordering::Relaxed) + 1;
        let reason = clip_reason(reason);
        if n < LOGGED_DENIALS {
            tracing::info!(host = %conn.host, port = conn.port, %reason, "network: denied");
        } else if n == LOGGED_DENIALS {
            tracing::info!(host = %conn.host, port = conn.port, %reason, "network: denied; this job's further denials are logged at debug level only (its report counts them all)");
        } else {
            tracing::debug!(host = %conn.host, port = conn.port, %reason, "network: denied");
        }
        conn.deny(reason);
    }
}

/// Decide `host:port` and connect to it: the allowlist's grant and the
/// upstream socket, with `conn` marked allowed and kept for the report at
/// once (a tunnel open when the job ends is listed, and one whose first
/// flight is refused then says so in its record); else the answer to send
/// (403 refused, 502 unreachable), with `conn` marked and kept so.
async fn open_upstream(
    state: &State,
    conn: &Arc<Conn>,
    host: &str,
    port: u16,
) -> Result<(Grant, TcpStream), Response<Body>> {
    let (grant, addrs) =
        decide(state, host, port).await.map_err(|e| state.refuse(conn, StatusCode::FORBIDDEN, e.to_string()))?;
    let upstream = connect_upstream(&addrs).await.map_err(|e| {
        let reason = e.to_string();
        state.keep(conn, false);
        conn.fail(&grant, reason.clone());
        text(StatusCode::BAD_GATEWAY, &reason)
    })?;
    let peer = upstream.peer_addr().map(|a| a.to_string()).ok();
    conn.set(|s| {
        s.decision = Some(NetDecision::Allowed);
        s.entry = Some(grant.entry.clone());
        s.address = peer;
    });
    state.keep(conn, true);
    Ok((grant, upstream))
}

/// The allowlist's entry for the target and the addresses to connect to.
async fn decide(state: &State, host: &str, port: u16) -> Result<(Grant, Vec<SocketAddr>), Denied> {
    if let Some(max) = state.limits.max_bytes.filter(|max| state.total.load(Ordering::Relaxed) >= *max) {
        return Err(Denied::ByteLimit(byte_limit(max)));
    }
    let grant = state.allow.grant(host, port)?;
    let addrs = match Target::parse(host)? {
        Target::Ip(ip) => vec![SocketAddr::new(ip, port)],
        Target::Name(name) => match tokio::time::timeout(STEP_TIMEOUT, resolve(&name, port)).await {
            Ok(r) => r?,
            Err(_) => return Err(Denied::SlowResolve { name, secs: STEP_TIMEOUT.as_secs() }),
        },
    };
    Ok((grant, permitted(addrs, &state.allow, host, &own_addresses()?)?))
}

/// Why the proxy refuses a target (the job's record says it).
#[derive(Debug, thiserror::Error)]
enum Denied {
    /// The job's byte budget is spent.
    #[error("{0}")]
    ByteLimit(std::io::Error),
    #[error(transparent)]
    Refused(#[from] super::allowlist::Refused),
    #[error(transparent)]
    Address(#[from] super::addr::AddrError),
    #[error("resolving {name} took longer than {secs}s")]
    SlowResolve { name: String, secs: u64 },
}

/// Why none of a target's addresses could be reached: the last one's
/// failure.
#[derive(Debug, thiserror::Error)]
enum Unreachable {
    #[error("could not connect: no address")]
    NoAddress,
    #[error("could not connect: {addr}: {source}")]
    Refused { addr: SocketAddr, source: std::io::Error },
    #[error("could not connect: {addr}: no answer within {secs}s")]
    Silent { addr: SocketAddr, secs: u64 },
}

async fn connect_upstream(addrs: &[SocketAddr]) -> Result<TcpStream, Unreachable> {
    let mut last = Unreachable::NoAddress;
    for a in addrs.iter().take(4) {
        match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Ok(Err(e)) => last = Unreachable::Refused { addr: *a, source: e },
            Err(_) => last = Unreachable::Silent { addr: *a, secs: STEP_TIMEOUT.as_secs() },
        }
    }
    Err(last)
}

async fn connect(
    state: Arc<State>,
    tunnel: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
    req: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let Some((host, port)) = req.uri().authority().and_then(|a| Some((a.host().to_string(), a.port_u16()?))) else {
        let conn = state.open("CONNECT", &req.uri().to_string(), 0);
        return state.refuse(&conn, StatusCode::BAD_REQUEST, "CONNECT needs host:port".into());
    };
    let conn = state.open("CONNECT", &host, port);
    let (grant, upstream) = match open_upstream(&state, &conn, &host, port).await {
        Ok(pair) => pair,
        Err(resp) => return resp,
    };
    let task = {
        let state = state.clone();
        let stop = state.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => conn.set(|s| s.reason = Some("cut: the job ended".into())),
                _ = run_tunnel(req, upstream, &state, &conn, &host, &grant) => {}
            }
            conn.end();
        })
    };
    if let Ok(mut slot) = tunnel.lock() {
        *slot = Some(task);
    }
    Response::new(http_body_util::Empty::new().map_err(|never| match never {}).boxed())
}

async fn run_tunnel(
    req: Request<hyper::body::Incoming>,
    mut upstream: TcpStream,
    state: &State,
    conn: &Arc<Conn>,
    host: &str,
    grant: &Grant,
) {
    let Ok(upgraded) = hyper::upgrade::on(req).await else {
        conn.set(|s| s.reason = Some("the client left before the tunnel opened".into()));
        return;
    };
    // The client's socket back from hyper, and what hyper read past the
    // CONNECT: the start of the client's first flight.
    let (mut client, early) = match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => (parts.io.into_inner(), parts.read_buf.to_vec()),
        Err(_) => {
            conn.set(|s| s.reason = Some("the tunnel's client is not a socket".into()));
            return;
        }
    };
    // Every tunnel carries TLS to the host it was opened for, whatever
    // the port, unless its entry says +raw: plain HTTP inside a tunnel
    // would name any site of the address in its Host header.
    let first = if !grant.allow_raw {
        match first_flight(&mut client, early, host, grant).await {
            Ok(hello) => hello,
            Err(reason) => {
                state.deny(conn, format!("cut: {reason}"));
                return;
            }
        }
    } else {
        early
    };
    if !first.is_empty() {
        let granted = reserve(state, first.len()).unwrap_or(0);
        if granted != first.len() {
            refund(state, granted);
            let max = state.limits.max_bytes.unwrap_or_default();
            conn.set(|s| s.reason = Some(format!("cut: {}", byte_limit(max))));
            return;
        }
        conn.up.fetch_add(first.len() as u64, Ordering::Relaxed);
        conn.touch();
        if upstream.write_all(&first).await.is_err() {
            return;
        }
    }
    let idle = Duration::from_millis(state.limits.idle_timeout_ms.max(1));
    tokio::select! {
        r = splice::both_ways(&client, &upstream, conn, state) => {
            if let Err(e) = r {
                conn.set(|s| s.reason = Some(format!("ended: {e}")));
            }
        }
        _ = idle_watch(conn, idle) => {
            conn.set(|s| s.reason = Some(format!("cut: idle for {}s (network.idle_timeout_ms)", idle.as_secs())));
        }
    }
}

/// A tunnel's bytes, moved with splice(2) through a pipe each way: they
/// never enter the supervisor's memory, which is what keeps a download
/// through the proxy near a direct one's speed.
mod splice {
    use super::{refund, reserve, Conn, State};
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::sync::atomic::Ordering;
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    /// The pipe's capacity asked for (the unprivileged maximum,
    /// `/proc/sys/fs/pipe-max-size`, is 1 MiB by default): fewer, larger
    /// moves. Refused, the default 64 KiB serves.
    const PIPE_SIZE: i32 = 1 << 20;

    pub(super) async fn both_ways(
        client: &TcpStream,
        upstream: &TcpStream,
        conn: &Conn,
        state: &State,
    ) -> std::io::Result<()> {
        let up = one_way(client, upstream, conn, state, true);
        let down = one_way(upstream, client, conn, state, false);
        tokio::try_join!(up, down).map(|_| ())
    }

    /// Bytes in the socket's receive queue (FIONREAD).
    fn waiting(sock: &TcpStream) -> Option<usize> {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int through the pointer, which points
        // at a local that outlives the call; the fd is open (we hold it).
        let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::FIONREAD, &mut n) };
        (r == 0).then(|| usize::try_from(n).unwrap_or(0))
    }

    fn splice(from: i32, to: i32, len: usize) -> std::io::Result<usize> {
        let flags = libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK;
        // SAFETY: splice takes two fds we hold open for the call, null
        // offsets (sockets and pipes have none) and plain integers.
        let n = unsafe { libc::splice(from, std::ptr::null_mut(), to, std::ptr::null_mut(), len, flags) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    async fn one_way(src: &TcpStream, dst: &TcpStream, conn: &Conn, state: &State, up: bool) -> std::io::Result<()> {
        let (pipe_r, pipe_w): (OwnedFd, OwnedFd) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let chunk = nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE))
            .or_else(|_| nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_GETPIPE_SZ))
            .map_or(64 * 1024, |n| n.max(4096) as usize);
        let counter = if up { &conn.up } else { &conn.down };
        loop {
            // The pipe is empty here: EAGAIN can only be the socket's.
            src.readable().await?;
            // Under a byte cap, only what is waiting is reserved: a whole
            // pipe's worth held by each move would refuse other tunnels
            // near the cap, though the bytes were never sent. At least one
            // byte, so that a move of 0 still means the end of the stream.
            let want =
                if state.limits.max_bytes.is_some() { waiting(src).unwrap_or(chunk).clamp(1, chunk) } else { chunk };
            let granted = reserve(state, want)?;
            let moved = src.try_io(Interest::READABLE, || splice(src.as_raw_fd(), pipe_w.as_raw_fd(), granted));
            refund(state, granted - moved.as_ref().map_or(0, |n| *n));
            let n = match moved {
                Ok(0) => {
                    nix::sys::socket::shutdown(dst.as_fd().as_raw_fd(), nix::sys::socket::Shutdown::Write)
                        .or_else(|e| if e == nix::errno::Errno::ENOTCONN { Ok(()) } else { Err(e) })?;
                    return Ok(());
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            };
            counter.fetch_add(n as u64, Ordering::Relaxed);
            conn.touch();
            let mut left = n;
            while left > 0 {
                dst.writable().await?;
                match dst.try_io(Interest::WRITABLE, || splice(pipe_r.as_raw_fd(), dst.as_raw_fd(), left)) {
                    Ok(m) => left -= m,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

/// Why a tunnel was cut before its first byte reached the host.
#[derive(Debug, thiserror::Error)]
enum TunnelRefusal {
    #[error(
        "not TLS ({0}): a tunnel carries TLS to the host it was opened for (add +raw to the entry for another protocol)"
    )]
    NotTls(String),
    #[error("no ClientHello in the first 64 KiB")]
    NoHello,
    #[error("{0}")]
    Read(std::io::Error),
    #[error("the client closed the tunnel before its TLS ClientHello")]
    Closed,
    #[error("no TLS ClientHello within {0}s")]
    Slow(u64),
    #[error(
        "the TLS ClientHello is encrypted (ECH), which hides its server name; add +ech to the entry {0} to allow it"
    )]
    Ech(String),
    #[error("the TLS ClientHello names no server (SNI); add +nosni to the entry {0} to allow it")]
    NoSni(String),
    #[error("the TLS server name '{sni}' is not the tunnel's host '{host}'")]
    OtherHost { sni: String, host: String },
}

/// Read the client's first flight on a tunnel (`buf`: what was read
/// already) and check that its TLS server name is the tunnel's host.
/// Returns the bytes read, for the upstream.
async fn first_flight(
    client: &mut (impl AsyncRead + Unpin),
    mut buf: Vec<u8>,
    host: &str,
    grant: &Grant,
) -> Result<Vec<u8>, TunnelRefusal> {
    let hello = tokio::time::timeout(STEP_TIMEOUT, async {
        // Parsed when the first record header is in, then only when a
        // record completes: the work is bounded by the records (at most
        // 16), not by the reads.
        let (mut complete, mut started) = (0, false);
        loop {
            let end = tls::complete_records(&buf, complete);
            if end > complete || (!started && buf.len() >= 5) {
                (complete, started) = (end, true);
                match tls::parse(&buf) {
                    tls::Parse::Incomplete => {}
                    tls::Parse::Hello(h) => return Ok(h),
                    tls::Parse::NotTls(why) => return Err(TunnelRefusal::NotTls(why.to_string())),
                }
            }
            if buf.len() >= tls::MAX_HELLO {
                return Err(TunnelRefusal::NoHello);
            }
            let mut chunk = [0u8; 4096];
            let n = client.read(&mut chunk).await.map_err(TunnelRefusal::Read)?;
            if n == 0 {
                return Err(TunnelRefusal::Closed);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| TunnelRefusal::Slow(STEP_TIMEOUT.as_secs()))??;
    if hello.ech && !grant.allow_ech {
        return Err(TunnelRefusal::Ech(grant.entry.to_string()));
    }
    match hello.sni {
        None if grant.allow_no_sni => {}
        None => return Err(TunnelRefusal::NoSni(grant.entry.to_string())),
        // Its outer name is the ECH provider's, which the entry accepted.
        Some(_) if hello.ech => {}
        Some(sni) => {
            let same = match (normalize_name(&sni), Target::parse(host)) {
                (Ok(s), Ok(Target::Name(h))) => s == h,
                _ => false,
            };
            if !same {
                return Err(TunnelRefusal::OtherHost { sni: clip(&sni).to_string(), host: host.to_string() });
            }
        }
    }
    Ok(buf)
}

async fn idle_watch(conn: &Conn, idle: Duration) {
    loop {
        let since = conn.started.elapsed().saturating_sub(Duration::from_millis(conn.last.load(Ordering::Relaxed)));
        if since >= idle {
            return;
        }
        tokio::time::sleep(idle - since).await;
    }
}

/// Headers that are about one hop, not the request: never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Plain HTTP: an absolute `http://` URL, whose `Host` header (if any)
/// names the same host and port.
async fn forward(state: Arc<State>, mut req: Request<hyper::body::Incoming>) -> Response<Body> {
    let method = req.method().to_string();
    let uri = req.uri().clone();
    let target = match (uri.scheme_str(), uri.authority()) {
        // hyper reads a port past 65535 as none at all, which is 80.
        (Some("http"), Some(a))
            if a.port_u16().is_none() && a.as_str().rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) =>
        {
            let conn = state.open(&method, a.host(), 0);
            return state.refuse(&conn, StatusCode::BAD_REQUEST, "the URL's port is not a port number".into());
        }
        (Some("http"), Some(a)) => Some((a.host().to_string(), a.port_u16().unwrap_or(80))),
        _ => None,
    };
    let Some((host, port)) = target else {
        let conn = state.open(&method, &uri.to_string(), 0);
        let why = if uri.scheme_str() == Some("https") {
            "https:// URLs go through CONNECT (set HTTPS_PROXY)"
        } else {
            "this is a proxy: send an absolute http:// URL, or CONNECT"
        };
        return state.refuse(&conn, StatusCode::BAD_REQUEST, why.into());
    };
    let conn = state.open(&method, &host, port);
    if req.headers().get_all(HOST).iter().count() > 1 {
        return state.refuse(&conn, StatusCode::BAD_REQUEST, "more than one Host header".into());
    }
    if let Err(e) = host_header_matches(req.headers().get(HOST), &host, port) {
        return state.refuse(&conn, StatusCode::FORBIDDEN, e.to_string());
    }
    let upstream = match open_upstream(&state, &conn, &host, port).await {
        Ok((_, upstream)) => upstream,
        Err(resp) => return resp,
    };
    // Origin form upstream, with the Host the check above accepted.
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    *req.uri_mut() = path.parse().unwrap_or_else(|_| hyper::Uri::from_static("/"));
    strip_hop_by_hop(req.headers_mut());
    // The Host upstream is the one checked, as the URL has it.
    let value = if port == 80 { host.clone() } else { format!("{host}:{port}") };
    match HeaderValue::from_str(&value) {
        Ok(v) => {
            req.headers_mut().insert(HOST, v);
        }
        Err(_) => return text(StatusCode::BAD_REQUEST, "denied: the URL's host is not a header value"),
    }
    let io = TokioIo::new(Metered { inner: upstream, conn: conn.clone(), state: state.clone() });
    let (mut sender, connection) = match hyper::client::conn::http1::handshake::<_, hyper::body::Incoming>(io).await {
        Ok(pair) => pair,
        Err(e) => {
            conn.set(|s| s.reason = Some(format!("ended: {e}")));
            conn.end();
            return text(StatusCode::BAD_GATEWAY, &format!("upstream: {e}"));
        }
    };
    {
        let conn = conn.clone();
        let stop = state.stop.clone();
        let idle = Duration::from_millis(state.limits.idle_timeout_ms.max(1));
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.cancelled() => conn.set(|s| s.reason = Some("cut: the job ended".into())),
                r = connection => if let Err(e) = r { conn.set(|s| s.reason = Some(format!("ended: {e}"))) },
                _ = idle_watch(&conn, idle) => conn.set(|s| s.reason = Some(format!("cut: idle for {}s", idle.as_secs()))),
            }
            conn.end();
        });
    }
    match sender.send_request(req).await {
        Ok(mut resp) => {
            strip_hop_by_hop(resp.headers_mut());
            resp.map(|b| b.boxed())
        }
        Err(e) => text(StatusCode::BAD_GATEWAY, &format!("upstream: {e}")),
    }
}

/// The `Host` header must name the URL's host and port (its default, 80,
/// when it names none): a forged one would reach the allowed address
/// while the server serves another site.
fn host_header_matches(value: Option<&HeaderValue>, host: &str, port: u16) -> Result<(), HostHeaderError> {
    let Some(value) = value else { return Ok(()) };
    let text = value.to_str().map_err(|_| HostHeaderError::NotText)?;
    let forged = || HostHeaderError::Forged { header: clip(text), host: clip(host), port };
    if text.contains('@') {
        return Err(forged());
    }
    let auth: hyper::http::uri::Authority = text.parse().map_err(|_| forged())?;
    let same_host = match (Target::parse(auth.host()), Target::parse(host)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same_host && auth.port_u16().unwrap_or(80) == port {
        Ok(())
    } else {
        Err(forged())
    }
}

/// Why a plain HTTP request's `Host` header is refused. Both names are
/// shown clipped: the job chose them.
#[derive(Debug, thiserror::Error)]
enum HostHeaderError {
    #[error("the Host header is not text")]
    NotText,
    #[error("the Host header '{header}' is not the request's target '{host}:{port}'")]
    Forged { header: String, host: String, port: u16 },
}

/// The upstream side of a plain HTTP request, counting bytes each way
/// against the job's total and marking activity for the idle timeout.
struct Metered {
    inner: TcpStream,
    conn: Arc<Conn>,
    state: Arc<State>,
}

fn byte_limit(max: u64) -> std::io::Error {
    std::io::Error::other(format!("the job's network byte limit ({max}) is reached (network.max_bytes)"))
}

/// Take up to `want` bytes of the job's budget, all of them when it has
/// none: what is moved must fit in what was taken, so no byte past the
/// cap reaches either side. An error when nothing is left.
fn reserve(state: &State, want: usize) -> std::io::Result<usize> {
    let want = want as u64;
    let Some(max) = state.limits.max_bytes else {
        state.total.fetch_add(want, Ordering::Relaxed);
        return Ok(want as usize);
    };
    if want == 0 {
        return Ok(0);
    }
    let mut granted = 0;
    state
        .total
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
            granted = want.min(max.saturating_sub(t));
            (granted > 0).then_some(t + granted)
        })
        .map_err(|_| byte_limit(max))?;
    Ok(granted as usize)
}

/// Give back what was taken and not moved.
fn refund(state: &State, n: usize) {
    if n > 0 {
        state.total.fetch_sub(n as u64, Ordering::Relaxed);
    }
}

fn poll_read_metered(
    inner: Pin<&mut TcpStream>,
    conn: &Conn,
    state: &State,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<std::io::Result<()>> {
    let granted = match reserve(state, buf.remaining()) {
        Ok(g) => g,
        Err(e) => return Poll::Ready(Err(e)),
    };
    let before = buf.filled().len();
    let r = inner.poll_read(cx, buf);
    let mut n = buf.filled().len() - before;
    if n > granted {
        // Past the cap: what came beyond it is not passed on (the next
        // read finds no budget and ends the connection).
        buf.set_filled(before + granted);
        n = granted;
    }
    refund(state, granted - n);
    if n > 0 {
        conn.down.fetch_add(n as u64, Ordering::Relaxed);
        conn.touch();
    }
    r
}

fn poll_write_metered(
    inner: Pin<&mut TcpStream>,
    conn: &Conn,
    state: &State,
    cx: &mut Context<'_>,
    data: &[u8],
) -> Poll<std::io::Result<usize>> {
    let granted = match reserve(state, data.len()) {
        Ok(g) => g,
        Err(e) => return Poll::Ready(Err(e)),
    };
    let r = inner.poll_write(cx, &data[..granted]);
    let n = match &r {
        Poll::Ready(Ok(n)) => *n,
        _ => 0,
    };
    refund(state, granted - n);
    if n > 0 {
        conn.up.fetch_add(n as u64, Ordering::Relaxed);
        conn.touch();
    }
    r
}

impl AsyncRead for Metered {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        poll_read_metered(Pin::new(&mut this.inner), &this.conn, &this.state, cx, buf)
    }
}

impl AsyncWrite for Metered {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        poll_write_metered(Pin::new(&mut this.inner), &this.conn, &this.state, cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_must_name_the_target() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert!(host_header_matches(None, "example.org", 80).is_ok());
        assert!(host_header_matches(Some(&v("example.org")), "example.org", 80).is_ok());
        assert!(host_header_matches(Some(&v("EXAMPLE.org:80")), "example.org", 80).is_ok());
        assert!(host_header_matches(Some(&v("example.org:8080")), "example.org", 8080).is_ok());
        assert!(host_header_matches(Some(&v("[::1]:8080")), "[::1]", 8080).is_ok());
        let e = host_header_matches(Some(&v("internal.example")), "example.org", 80).unwrap_err().to_string();
        assert!(e.contains("'internal.example' is not the request's target"), "{e}");
        assert!(host_header_matches(Some(&v("example.org:81")), "example.org", 80).is_err());
        assert!(host_header_matches(Some(&v("example.org")), "example.org", 8080).is_err());
    }
}
