//! The server side: listen on the store's socket, check each client's
//! credentials, and run its command on the server's own handles of the
//! store (its supervisor for `exec`, its audit log, artifacts and memory
//! service for the rest).

use super::{ExecRelay, RelayError, RelayedCommand, Reply, Request, PROTOCOL, SOCKET_NAME};
use crate::cli::Io;
use crate::config::Config;
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
const MAX_CLIENTS: usize = 64;
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
        Context { config, absolute, supervisor, memory: slot, shutdown }
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

    /// Serve clients until `ctx`'s shutdown.
    pub async fn serve(self, ctx: Arc<Context>) {
        let mut clients = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                () = ctx.shutdown.cancelled() => break,
                Some(_) = clients.join_next(), if !clients.is_empty() => continue,
                a = self.listener.accept() => a,
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

/// Whether `pid` is in our user namespace. Unknown (it left, or its
/// `/proc` entry can't be read): no.
fn same_user_namespace(pid: i32) -> bool {
    let ns = |p: &str| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    match (ns(&format!("/proc/{pid}/ns/user")), ns("/proc/self/ns/user")) {
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
        RelayedCommand::Exec(e) => exec(e, stdio, stream, ctx).await,
        command => {
            let ctx = ctx.clone();
            let ran = tokio::task::spawn_blocking(move || {
                crate::store::releasing(|| {
                    let mut io = stdio.io();
                    let exit = run(&ctx, command, &mut io);
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

/// A relayed `exec` on the server's supervisor. The job is killed when
/// the client goes away, or the server shuts down.
async fn exec(e: ExecRelay, stdio: Stdio, stream: &Arc<tokio::net::UnixStream>, ctx: &Arc<Context>) -> Reply {
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
    let resp = ctx.supervisor.execute(request, ctl).await;
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
    use super::not_a_stream;
    use std::os::fd::OwnedFd;

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
