//! The server side: listen on the store's socket, check each client's
//! credentials, and run its command on the server's own handles of the
//! store (its supervisor for `exec`, its audit log, artifacts and memory
//! service for the rest).

use super::{ExecRelay, RelayError, RelayedCommand, Reply, Request, PROTOCOL, SOCKET_NAME};
use crate::cli::Io;
use crate::config::Config;
use crate::runtimes::toolchain::Host;
use crate::store::memory::MemoryService;
use crate::supervisor::exec::{JobControl, Live};
use crate::supervisor::Supervisor;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a client may take to send its whole request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to read its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; one more is closed unanswered. Each holds
/// a few descriptors, and a command being run a thread.
pub const MAX_CLIENTS: usize = 64;
/// How long a stopping server waits for its relayed commands to end.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);
/// Descriptors one message can carry (`SCM_MAX_FD`): room for all of
/// them, so that none is ever cut off, left open and unowned.
const SCM_MAX_FD: usize = 253;

/// What relayed commands run on: the server's configuration and handles.
pub struct Context {
    pub config: Config,
    /// `config` with its relative paths made absolute from our working
    /// directory: what a client's must equal.
    absolute: Config,
    pub supervisor: Arc<Supervisor>,
    /// The MCP server's memory service, when it has one: a second one on
    /// the same store would keep its own sequence and indexes.
    memory: OnceLock<Result<Arc<MemoryService>, Arc<MemoryUnavailable>>>,
    /// Cancelled when the server shuts down: relayed jobs are killed.
    shutdown: CancellationToken,
    /// Which process this is.
    holder: Holder,
}

/// The process that holds the store and serves its socket.
#[derive(Debug, Clone)]
pub enum Holder {
    /// `confine serve`: its configuration, queue and warm sandboxes serve
    /// every relayed command, for as long as it runs.
    Serve,
    /// A `confine exec` that took the store's lock: it serves for as long
    /// as anything runs. Its own job's end cancels `own_done`; then it
    /// stops listening as soon as no client is being served. A relayed
    /// `exec` runs under its client's own configuration, PATH and HOME.
    Exec { own_done: CancellationToken },
}

impl Context {
    pub fn new(
        config: Config,
        supervisor: Arc<Supervisor>,
        memory: Option<Arc<MemoryService>>,
        shutdown: CancellationToken,
    ) -> Context {
        let slot = OnceLock::new();
        if let Some(m) = memory {
            let _ = slot.set(Ok(m));
        }
        let absolute = super::absolute(config.clone(), &std::env::current_dir().unwrap_or_default());
        Context { config, absolute, supervisor, memory: slot, shutdown, holder: Holder::Serve }
    }

    /// The context of a `confine exec` holding the store ([`Holder::Exec`]):
    /// `config` as it loaded it (before its own `--repo` and flags).
    pub fn for_exec(
        config: Config,
        supervisor: Arc<Supervisor>,
        shutdown: CancellationToken,
        own_done: CancellationToken,
    ) -> Context {
        Context { holder: Holder::Exec { own_done }, ..Context::new(config, supervisor, None, shutdown) }
    }

    /// The memory service, opened at the first use; a failure is kept, so
    /// every later use reports the same one.
    fn memory(&self) -> Result<&Arc<MemoryService>, Arc<MemoryUnavailable>> {
        self.memory
            .get_or_init(|| {
                let store = &self.supervisor.stores().map_err(|e| Arc::new(MemoryUnavailable::Store(e)))?.store;
                MemoryService::open(store, &self.config.repos)
                    .map(Arc::new)
                    .map_err(|e| Arc::new(MemoryUnavailable::Open(e)))
            })
            .as_ref()
            .map_err(Arc::clone)
    }
}

/// Why a relayed `confine memory` has no memory service.
#[derive(Debug, thiserror::Error)]
enum MemoryUnavailable {
    #[error(transparent)]
    Store(crate::supervisor::SupervisorError),
    #[error(transparent)]
    Open(crate::store::memory::MemoryError),
}

/// The store's socket, listening; removed when dropped.
pub struct Listener {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    ino: u64,
}

impl Listener {
    /// Listen at the socket of the store at `store`, which this process
    /// holds: a socket found there was left by a dead holder.
    pub fn bind(store: &Path) -> std::io::Result<Listener> {
        let path = store.join(SOCKET_NAME);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&path)?,
            Ok(_) => {
                return Err(std::io::Error::other(format!("{} exists and is not a socket: remove it", path.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let std = std::os::unix::net::UnixListener::bind(&path)?;
        // Never through a link that replaced the socket meanwhile.
        let mode = nix::sys::stat::Mode::from_bits_truncate(0o600);
        if let Err(e) =
            nix::sys::stat::fchmodat(nix::fcntl::AT_FDCWD, &path, mode, nix::sys::stat::FchmodatFlags::NoFollowSymlink)
        {
            let _ = std::fs::remove_file(&path);
            return Err(e.into());
        }
        let ino = std::fs::symlink_metadata(&path)?.ino();
        std.set_nonblocking(true)?;
        Ok(Listener { listener: tokio::net::UnixListener::from_std(std)?, path, ino })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve clients until `ctx`'s shutdown; a `confine exec`'s, until its
    /// own job is done and no client is being served ([`Holder::Exec`]).
    /// Connections then left unaccepted are closed with the listener: their
    /// clients were told nothing, and try again (`relay::client`).
    pub async fn serve(self, ctx: Arc<Context>) {
        let mut clients = tokio::task::JoinSet::new();
        let own_done = match &ctx.holder {
            Holder::Serve => None,
            Holder::Exec { own_done } => Some(own_done.clone()),
        };
        let idle = |clients: &tokio::task::JoinSet<()>| clients.is_empty() && own_done.is_some();
        loop {
            let done = async {
                match &own_done {
                    Some(t) => t.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            let accepted = tokio::select! {
                // A client already waiting is taken before the holder
                // leaves: fewer clients have to try again.
                biased;
                () = ctx.shutdown.cancelled() => break,
                a = self.listener.accept() => a,
                Some(_) = clients.join_next(), if !clients.is_empty() => continue,
                () = done, if idle(&clients) => break,
            };
            match accepted {
                Ok(_) if clients.len() >= MAX_CLIENTS => {
                    tracing::warn!("store socket: {MAX_CLIENTS} clients at once; one more was closed unanswered");
                }
                Ok((stream, _)) => {
                    let ctx = ctx.clone();
                    clients.spawn(async move {
                        if let Err(e) = handle(stream, ctx).await {
                            tracing::warn!(error = %e, "store socket: a client's command was not run");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "store socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if own_done.is_some() && !ctx.shutdown.is_cancelled() {
            // The race the clients retry for: this holder has stopped
            // accepting, and still listens (tests/suite/parallel_exec.rs).
            crate::crashpoint::linger("exec-holder-leaving").await;
        }
        // Relayed jobs were cancelled by the same token: their records are
        // written before the server's store closes.
        let drained = tokio::time::timeout(SHUTDOWN_WAIT, async { while clients.join_next().await.is_some() {} });
        if drained.await.is_err() {
            tracing::warn!("store socket: relayed commands still running at shutdown were stopped");
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Ours only: never a socket another holder made since.
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// A client's standard output and error.
struct Stdio(OwnedFd, OwnedFd);

impl Stdio {
    /// Writers that never block for more than [`super::LIVE_STALL`]: a
    /// client whose reader stopped (`| sleep`) must not hold a thread.
    fn io(self) -> Io {
        let out = super::Unstalled(File::from(self.0));
        Io { out: Box::new(std::io::BufWriter::new(out)), err: Box::new(super::Unstalled(File::from(self.1))) }
    }
}

async fn handle(stream: tokio::net::UnixStream, ctx: Arc<Context>) -> Result<(), RelayError> {
    let io = |source| RelayError::Io { path: PathBuf::from(SOCKET_NAME), source };
    let peer =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).map_err(|e| io(e.into()))?;
    let uid = nix::unistd::geteuid().as_raw();
    if peer.uid() != uid {
        // Not answered: a process of another user learns nothing.
        return Err(RelayError::Untrusted {
            path: PathBuf::from(SOCKET_NAME),
            message: format!("refused pid {} of uid {} (this server serves uid {uid})", peer.pid(), peer.uid()),
        });
    }
    // A sandboxed job runs in a user namespace of its own. Rootless, its
    // uid outside is ours; should a store inside a repository put the
    // socket within its reach, it is still no client.
    if !same_user_namespace(peer.pid()) {
        return Err(RelayError::Untrusted {
            path: PathBuf::from(SOCKET_NAME),
            message: format!("refused pid {}: it is in another user namespace (a sandboxed job?)", peer.pid()),
        });
    }
    let stream = Arc::new(stream);
    // One deadline for the whole request, read without a thread.
    let received = match tokio::time::timeout(REQUEST_TIMEOUT, receive(&stream, request_bound(&ctx.config))).await {
        Ok(r) => r,
        Err(_) => Err(RelayError::Malformed(format!("no whole request within {} s", REQUEST_TIMEOUT.as_secs()))),
    };
    let reply = match received {
        Ok(Some((request, fds))) => answer(request, fds, &stream, &ctx).await,
        // The client decided against sending anything (`exec` with a
        // repository this server does not run).
        Ok(None) => return Ok(()),
        Err(e) => refused(e.to_string()),
    };
    let bytes = super::frame(&reply).map_err(io)?;
    let written = match tokio::time::timeout(REPLY_TIMEOUT, write_all(&stream, &bytes)).await {
        Ok(w) => w,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    };
    match written {
        // The client is gone (Ctrl-C): its job was cancelled.
        Err(e) if matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) => {
            tracing::debug!("store socket: the client left before the reply");
            Ok(())
        }
        w => w.map_err(io),
    }
}

/// Whether `pid` is in our user namespace.
fn same_user_namespace(pid: i32) -> bool {
    same_namespace(pid, "user")
}

/// Whether `pid` is in our namespace of `kind`. Unknown (it left, or its
/// `/proc` entry can't be read): no.
fn same_namespace(pid: i32, kind: &str) -> bool {
    let ns = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    match (ns(&format!("/proc/{pid}/ns/{kind}")), ns(&format!("/proc/self/ns/{kind}"))) {
        (Ok(theirs), Ok(ours)) => theirs == ours,
        _ => false,
    }
}

/// The largest request: the code and stdin a request may carry, twice
/// over for JSON's escapes, and the configuration.
fn request_bound(config: &Config) -> u32 {
    let l = &config.limits;
    let bytes = l.max_code_bytes.saturating_add(l.max_stdin_bytes).saturating_mul(2).saturating_add(16 << 20);
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

async fn write_all(stream: &tokio::net::UnixStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Read more of the request into `buf`; `false` at its end.
async fn read_more(stream: &tokio::net::UnixStream, buf: &mut Vec<u8>, want: usize) -> std::io::Result<bool> {
    let mut part = vec![0u8; want.min(1 << 20)];
    loop {
        stream.readable().await?;
        match stream.try_read(&mut part) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                buf.extend_from_slice(&part[..n]);
                return Ok(true);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Read the request and the two descriptors passed with it; `None` if
/// the client closed the connection without a word.
async fn receive(stream: &tokio::net::UnixStream, max: u32) -> Result<Option<(Request, Vec<OwnedFd>)>, RelayError> {
    let malformed = |m: String| RelayError::Malformed(m);
    // The length first, with the descriptors (they come with the first
    // byte), then exactly the request: what a client sends after it (a
    // `run`'s stop) is left for the command to read.
    let mut buf = vec![0u8; 4];
    let (n, fds, truncated) = loop {
        stream.readable().await.map_err(|e| malformed(e.to_string()))?;
        match stream.try_io(tokio::io::Interest::READABLE, || recv_with_fds(stream, &mut buf)) {
            Ok(r) => break r,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(malformed(format!("receiving the request: {e}"))),
        }
    };
    if n == 0 {
        return Ok(None);
    }
    if truncated || !(2..=3).contains(&fds.len()) {
        return Err(malformed(
            "the request must pass exactly two descriptors (stdout, stderr), or three for `run`".into(),
        ));
    }
    buf.truncate(n);
    while buf.len() < 4 {
        let want = 4 - buf.len();
        if !read_more(stream, &mut buf, want).await.map_err(|e| malformed(e.to_string()))? {
            return Err(malformed("the message ended early".into()));
        }
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len > max {
        return Err(malformed(format!("a message of {len} bytes (at most {max})")));
    }
    let end = 4 + len as usize;
    while buf.len() < end {
        let want = end - buf.len();
        if !read_more(stream, &mut buf, want).await.map_err(|e| malformed(e.to_string()))? {
            return Err(malformed("the message ended early".into()));
        }
    }
    let request: Request = serde_json::from_slice(&buf[4..end]).map_err(|e| malformed(e.to_string()))?;
    Ok(Some((request, fds)))
}

/// One `recvmsg` (non-blocking) with room for every descriptor a message
/// can carry: each one received is owned, and closed unless it is used.
fn recv_with_fds(stream: &tokio::net::UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>, bool)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; SCM_MAX_FD]);
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), flags)?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    match msg.cmsgs() {
        Ok(cmsgs) => {
            for c in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = c {
                    for fd in received {
                        // SAFETY: the kernel just installed `fd` in our
                        // table for this message; nothing else owns it.
                        fds.push(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
                    }
                }
            }
        }
        // Cut off although there was room for SCM_MAX_FD: a control
        // message of another kind. Nothing of it is used.
        Err(e) => tracing::warn!(error = %e, "store socket: a request's control data was cut off"),
    }
    Ok((msg.bytes, fds, truncated))
}

fn refused(message: String) -> Reply {
    Reply { exit: crate::cli::EXIT_CONFINE_FAILED, refused: Some(message), ..Reply::default() }
}

async fn answer(
    request: Request,
    fds: Vec<OwnedFd>,
    stream: &Arc<tokio::net::UnixStream>,
    ctx: &Arc<Context>,
) -> Reply {
    if request.protocol != PROTOCOL {
        return refused(format!(
            "it speaks protocol {PROTOCOL}, this client {}: use the same confine build for both",
            request.protocol
        ));
    }
    let mut theirs = super::absolute(request.config, &request.cwd);
    // A `confine exec` holding the store runs a relayed `exec` under the
    // client's own configuration, as the client would have run it.
    let own_config = matches!((&ctx.holder, &request.command), (Holder::Exec { .. }, RelayedCommand::Exec(_)));
    if own_config {
        if let Some(why) = not_here(&theirs, stream, ctx) {
            return refused(why);
        }
        let command = match request.command {
            RelayedCommand::Exec(e) => e,
            _ => return refused("not an exec".into()),
        };
        let mut fds = fds.into_iter();
        let (Some(out), Some(err), None) = (fds.next(), fds.next(), fds.next()) else {
            return refused("the request must pass exactly two descriptors (stdout, stderr)".into());
        };
        return exec(command, Some(theirs), Stdio(out, err), stream, ctx).await;
    }
    theirs.source = ctx.config.source.clone();
    if theirs != ctx.absolute {
        let file = ctx.config.source.as_ref().map_or("the built-in defaults".into(), |p| p.display().to_string());
        return refused(format!(
            "it runs with another configuration ({file}): give this command the same one (--config), or stop the server"
        ));
    }
    if let Err(e) = super::resolved(&request.command) {
        return refused(e.to_string());
    }
    let command = match request.command {
        // A holder that is a `confine exec` runs no `confine run`: it would
        // start it just as the client does, and outlive its own job for
        // it. The client runs it itself.
        RelayedCommand::Run(_) if matches!(ctx.holder, Holder::Exec { .. }) => {
            return refused("a `confine exec` holds the store; a `confine run` runs in its own process".into())
        }
        RelayedCommand::Run(r) => {
            let Ok(streams) = <[OwnedFd; 3]>::try_from(fds) else {
                return refused("`run` passes three descriptors: the job's stdin, stdout and stderr".into());
            };
            return match streams.iter().find_map(not_a_stream) {
                Some(why) => refused(why),
                None => run_job(r, streams, stream, ctx).await,
            };
        }
        command => command,
    };
    let mut fds = fds.into_iter();
    let (Some(out), Some(err), None) = (fds.next(), fds.next(), fds.next()) else {
        return refused("the request must pass exactly two descriptors (stdout, stderr)".into());
    };
    let stdio = Stdio(out, err);
    match command {
        RelayedCommand::Exec(e) => exec(e, None, stdio, stream, ctx).await,
        command => {
            let ctx = ctx.clone();
            let ran = tokio::task::spawn_blocking(move || {
                crate::store::releasing(|| {
                    let mut io = stdio.io();
                    let exit = run(&ctx, command, &mut io);
                    // A `confine exec` opens the store without sled's
                    // flusher, and may be killed before its own exit's
                    // flush: what a command wrote is made durable before
                    // it is answered, as its own process would have.
                    if let (Holder::Exec { .. }, Ok(stores)) = (&ctx.holder, ctx.supervisor.stores()) {
                        if let Err(e) = stores.store.flush() {
                            use std::io::Write;
                            let _ = writeln!(io.err, "confine: {e}");
                            io.flush();
                            return crate::cli::EXIT_CONFINE_FAILED;
                        }
                    }
                    io.flush();
                    exit
                })
            })
            .await;
            match ran {
                Ok(exit) => Reply { exit, ..Reply::default() },
                Err(e) => refused(format!("the command failed in the server: {e}")),
            }
        }
    }
}

/// A store command on the server's handles.
fn run(ctx: &Context, command: RelayedCommand, io: &mut Io) -> i32 {
    use std::io::Write;
    let stores = match ctx.supervisor.stores() {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(io.err, "confine: {e}");
            return crate::cli::EXIT_CONFINE_FAILED;
        }
    };
    match command {
        RelayedCommand::Audit(c) => crate::cli::audit::run(&stores.audit, c, io),
        RelayedCommand::Artifacts(c) => crate::cli::artifacts::run(&stores.artifacts, c, io),
        RelayedCommand::Gc(a) => crate::cli::artifacts::gc(&stores.artifacts, &ctx.config, a, io),
        RelayedCommand::Memory(c) => match ctx.memory() {
            Ok(m) => crate::cli::memory::run(&ctx.config, m, c, io),
            Err(e) => {
                let _ = writeln!(io.err, "confine memory: {e}");
                crate::cli::EXIT_CONFINE_FAILED
            }
        },
        RelayedCommand::Exec(_) | RelayedCommand::Run(_) => crate::cli::EXIT_CONFINE_FAILED,
    }
}

/// Why a `confine exec` holding the store can't run a client's `exec` as
/// the client would have, if it can't: a cgroup parent is chosen once per
/// process, and paths (the repository, the toolchain) are looked up in
/// this process's mount namespace.
fn not_here(theirs: &Config, stream: &tokio::net::UnixStream, ctx: &Context) -> Option<String> {
    if theirs.sandbox.cgroup_parent != ctx.config.sandbox.cgroup_parent {
        return Some(
            "it runs its jobs under another cgroup parent (sandbox.cgroup_parent): give this command the same \
             configuration, or let that command end first"
                .into(),
        );
    }
    let peer = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials);
    if !peer.as_ref().is_ok_and(|p| same_namespace(p.pid(), "mnt")) {
        return Some(
            "this client is in another mount namespace, where its paths may name other files: run it beside the \
             holder, or let that command end first"
                .into(),
        );
    }
    // The holder builds the client's sandbox with its own privileges: a
    // client of the same uid that was given fewer (a unit's capability
    // bounding set, no_new_privs, a seccomp filter) must not borrow them.
    let ours = Privileges::of("self");
    let theirs = peer.ok().and_then(|p| Privileges::of(&p.pid().to_string()));
    match (ours, theirs) {
        (Some(ours), Some(theirs)) if theirs.covers(&ours) => None,
        _ => Some(
            "this client runs with fewer privileges than the holder (capabilities, no_new_privs or a seccomp \
             filter), which would build its sandbox for it: let that command end first"
                .into(),
        ),
    }
}

/// What a process may do, from `/proc/PID/status` (the kernel's).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Privileges {
    effective: u64,
    bounding: u64,
    no_new_privs: bool,
    seccomp: bool,
}

impl Privileges {
    fn of(pid: &str) -> Option<Privileges> {
        Privileges::parse(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
    }

    fn parse(status: &str) -> Option<Privileges> {
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')).map(str::trim))
        };
        let hex = |name: &str| field(name).and_then(|v| u64::from_str_radix(v, 16).ok());
        let flag = |name: &str| field(name).map(|v| v != "0");
        Some(Privileges {
            effective: hex("CapEff")?,
            bounding: hex("CapBnd")?,
            no_new_privs: flag("NoNewPrivs")?,
            seccomp: flag("Seccomp")?,
        })
    }

    /// Whether a process with these privileges may do all `other` may.
    fn covers(&self, other: &Privileges) -> bool {
        self.effective & other.effective == other.effective
            && self.bounding & other.bounding == other.bounding
            && (other.no_new_privs || !self.no_new_privs)
            && (other.seccomp || !self.seccomp)
    }
}

/// A relayed `exec`: on the server's supervisor, or, for a `confine exec`
/// holding the store, on a supervisor of the client's configuration
/// (`own`) and host. The job is killed when the client goes away, or the
/// server shuts down.
async fn exec(
    e: ExecRelay,
    own: Option<Config>,
    stdio: Stdio,
    stream: &Arc<tokio::net::UnixStream>,
    ctx: &Arc<Context>,
) -> Reply {
    let pid = std::process::id();
    let supervisor = match own {
        Some(mut config) => {
            if e.allow_degraded {
                config.runtime.allow_degraded = true;
            }
            if let Some(root) = &e.adhoc_repo {
                config.add_adhoc_repo("cli", root);
            }
            if let (Some(at), Some(id)) = (&e.workspace_at, e.request.repo_id.as_deref()) {
                if let Some(repo) = config.repos.iter_mut().find(|r| r.id == id) {
                    repo.workspace_at = at.clone();
                }
            }
            let host = Host::from_parts(e.path.clone(), e.home.clone())
                .with_repos(config.repos.iter().map(|r| r.root.as_path()));
            match ctx.supervisor.for_relayed(config, host).await {
                Ok(s) => Arc::new(s),
                // As the client's own process would have failed.
                Err(err) => {
                    let error = Some(err.to_string());
                    return Reply { exit: crate::cli::EXIT_CONFINE_FAILED, error, ..Reply::default() };
                }
            }
        }
        None if e.adhoc_repo.is_some() => {
            return refused(format!(
                "the store is held by `confine serve` (pid {pid}), which runs only the repositories of its \
                 configuration, and --repo is not one of them: add it under [[repos]] in the configuration, \
                 or stop the server"
            ))
        }
        None if e.workspace_at.as_ref().is_some_and(|at| {
            e.request.repo_id.as_deref().and_then(|id| ctx.config.repo(id).ok()).is_some_and(|r| r.workspace_at != *at)
        }) =>
        {
            return refused(format!(
                "--workspace-at: the store is held by `confine serve` (pid {pid}), which mounts its repositories \
                 where its configuration says: set workspace_at = \"{}\" in that repository's [[repos]] entry, \
                 or stop the server",
                e.workspace_at.as_ref().map(ToString::to_string).unwrap_or_default()
            ))
        }
        None if e.allow_degraded && !ctx.config.runtime.allow_degraded => {
            return refused(format!(
                "the store is held by `confine serve` (pid {pid}), whose configuration does not allow degraded \
                 runs: set allow_degraded = true under [runtime] there, or stop the server"
            ))
        }
        None => ctx.supervisor.clone(),
    };
    // Taken: from here on, a connection closed without the final reply
    // means the job may have run (the client does not send it again).
    let taken = Reply { taken: true, ..Reply::default() };
    match super::frame(&taken) {
        Ok(bytes) => {
            if write_all(stream, &bytes).await.is_err() {
                return refused("the client left".into());
            }
        }
        Err(err) => return refused(err.to_string()),
    }
    crate::crashpoint::reached("relayed-exec-taken");
    let watch = stream.clone();
    let shutdown = ctx.shutdown.clone();
    let cancel = Box::pin(async move {
        let gone = async {
            let mut b = [0u8; 256];
            loop {
                if watch.readable().await.is_err() {
                    return;
                }
                match watch.try_read(&mut b) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        };
        tokio::select! { () = gone => {}, () = shutdown.cancelled() => {} }
    });
    let live =
        e.live.then(|| Live::To { stdout: Arc::new(File::from(stdio.0)), stderr: Arc::new(File::from(stdio.1)) });
    let ctl = JobControl { live, cancel: Some(cancel), ..JobControl::default() };
    // The job's id is the server's to give: never one a client chose.
    let request = crate::supervisor::exec::JobRequest { job_id: None, ..e.request };
    let resp = supervisor.execute(request, ctl).await;
    if !Arc::ptr_eq(&supervisor, &ctx.supervisor) {
        supervisor.wait_for_gc().await;
    }
    Reply { exit: 0, exec: Some(Box::new(resp)), ..Reply::default() }
}

/// Why `fd` is not a stream a job may be given, if it is not: only a pipe
/// or /dev/null, as an in-process `confine run` passes (a terminal or a
/// file is relayed by the client through a pipe of its own). The client
/// runs as the server's user, but never has the server hand a job more
/// than the client itself would.
fn not_a_stream(fd: &OwnedFd) -> Option<String> {
    // An O_PATH descriptor is a name, not an open stream: fstat sees the
    // pipe it names, but the job could only open it again.
    match nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFL) {
        Ok(flags) if flags & libc::O_PATH != 0 => {
            return Some(
                "a job's stream must be open for reading or writing; this client passed an O_PATH descriptor".into(),
            )
        }
        Ok(_) => {}
        Err(e) => return Some(format!("a job's stream can't be looked at: {e}")),
    }
    match nix::sys::stat::fstat(fd) {
        Ok(st) => {
            let kind = st.st_mode & libc::S_IFMT;
            let dev_null = kind == libc::S_IFCHR && st.st_rdev == libc::makedev(1, 3);
            (kind != libc::S_IFIFO && !dev_null)
                .then(|| "a job's stream must be a pipe or /dev/null; this client passed something else".into())
        }
        Err(e) => Some(format!("a job's stream can't be looked at: {e}")),
    }
}

/// A relayed `run` on the server's supervisor. The client's stop byte is
/// forwarded to the job as its signal, and so are the other signals it
/// sends before; a client gone, or the server shutting down, ends the job.
async fn run_job(
    r: super::RunRelay,
    streams: [OwnedFd; 3],
    stream: &Arc<tokio::net::UnixStream>,
    ctx: &Arc<Context>,
) -> Reply {
    use crate::sandbox::Stop;
    let watch = stream.clone();
    let shutdown = ctx.shutdown.clone();
    // The client's other signals, for the job as they come (until a stop).
    let (others, others_rx) = tokio::sync::mpsc::unbounded_channel();
    let stop = Box::pin(async move {
        let stopped = async {
            let mut b = [0u8; 1];
            loop {
                if watch.readable().await.is_err() {
                    return Stop::Kill;
                }
                match watch.try_read(&mut b) {
                    // The stops a client forwards (SIGHUP, SIGINT, SIGTERM);
                    // SIGKILL, or anything else, kills at once.
                    Ok(1) if [1, 2, 15].contains(&b[0]) => return Stop::Forward(i32::from(b[0])),
                    // Any other signal a job is given goes to it as it is.
                    Ok(1) if crate::sandbox::linux::signals::is_forwarded(i32::from(b[0])) => {
                        let _ = others.send(i32::from(b[0]));
                    }
                    // Gone (Ctrl-C'd past its handler, SIGKILL), or a byte
                    // that is no signal: the job is killed.
                    Ok(_) => return Stop::Kill,
                    Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return Stop::Kill,
                }
            }
        };
        tokio::select! {
            s = stopped => s,
            () = shutdown.cancelled() => Stop::Forward(libc::SIGTERM),
        }
    });
    // The client's grace, within a server's bound: a job must not outlive
    // the server's own stop by more than its relayed commands are waited
    // for.
    let grace = r.kill_grace.min(SHUTDOWN_WAIT);
    match ctx.supervisor.run_direct(&r.spec, streams, grace, stop, others_rx).await {
        Ok(outcome) => Reply { exit: outcome.cli_exit_code(), run: Some(Box::new(outcome)), ..Reply::default() },
        Err(e) => Reply { exit: crate::cli::EXIT_CONFINE_FAILED, error: Some(e.to_string()), ..Reply::default() },
    }
}

#[cfg(test)]
mod tests {
    use super::{not_a_stream, Privileges};
    use std::os::fd::OwnedFd;

    #[test]
    fn a_client_with_fewer_privileges_than_the_holder_is_told_apart() {
        let status = |eff: &str, bnd: &str, nnp: &str, sec: &str| {
            Privileges::parse(&format!(
                "Name:\tconfine\nCapEff:\t{eff}\nCapBnd:\t{bnd}\nNoNewPrivs:\t{nnp}\nSeccomp:\t{sec}\n"
            ))
            .unwrap()
        };
        let root = status("000001ffffffffff", "000001ffffffffff", "0", "0");
        assert!(root.covers(&root));
        assert!(!status("000001ffffdfffff", "000001ffffffffff", "0", "0").covers(&root), "one capability less");
        assert!(!status("000001ffffffffff", "000001fffffffffe", "0", "0").covers(&root), "a smaller bounding set");
        assert!(!status("000001ffffffffff", "000001ffffffffff", "1", "0").covers(&root), "no_new_privs");
        assert!(!status("000001ffffffffff", "000001ffffffffff", "0", "2").covers(&root), "a seccomp filter");
        let unprivileged = status("0000000000000000", "000001ffffffffff", "0", "0");
        assert!(root.covers(&unprivileged), "more privileges may relay to fewer");
        assert_eq!(Privileges::parse("Name:\tx\n"), None, "a status without the fields is no answer");
    }

    fn open(path: &str, flags: libc::c_int) -> OwnedFd {
        use std::os::fd::FromRawFd;
        let c = std::ffi::CString::new(path).unwrap();
        // SAFETY: a NUL-terminated path; open returns a new fd or -1.
        let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
        assert!(fd >= 0, "{path}: {}", std::io::Error::last_os_error());
        // SAFETY: open just returned this fd; nothing else owns it.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }

    #[test]
    fn only_an_open_pipe_or_dev_null_is_a_stream() {
        let (r, w) = nix::unistd::pipe().unwrap();
        assert_eq!(not_a_stream(&r), None);
        assert_eq!(not_a_stream(&w), None);
        assert_eq!(not_a_stream(&open("/dev/null", libc::O_WRONLY)), None);
        assert!(not_a_stream(&open("/dev/zero", libc::O_RDONLY)).is_some());
        assert!(not_a_stream(&open("/etc/hostname", libc::O_RDONLY)).is_some());
        let by_path = not_a_stream(&open("/dev/null", libc::O_PATH)).unwrap();
        assert!(by_path.contains("O_PATH"), "{by_path}");
        let fifo = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&r));
        assert!(not_a_stream(&open(&fifo, libc::O_PATH)).is_some());
    }
}
