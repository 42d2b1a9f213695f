//! The store's local socket, `<store>/serve.sock`: while `confine serve`
//! holds the store, the CLI's store commands (`exec`, `audit`,
//! `artifacts`, `memory`, `gc`) are relayed to it, and run there on the
//! store it has open, instead of failing on the store's lock.
//!
//! Trust. The socket is made mode 0600 in the store's directory, and each
//! side checks the other's credentials (`SO_PEERCRED`), as the directory's
//! mode may have been loosened:
//! - the server serves only clients of its own uid, which could open the
//!   store themselves were it free;
//! - the client talks only to the process that holds the store's lock,
//!   under its own uid: a socket planted in the directory is never sent
//!   a command, a file descriptor or a configuration.
//!
//! The server runs a command only under the configuration it runs with:
//! a client whose configuration differs is refused, and says so, rather
//! than have its command run under another policy.
//!
//! Wire: one request per connection. The client sends its request as a
//! frame (a little-endian `u32` length, then JSON) and passes its
//! standard output and error with it (`SCM_RIGHTS`); the command's output
//! goes straight to them. A `run` passes the job's stdin, stdout and
//! stderr instead, which the job gets as they are. The server answers
//! with one frame, a [`Reply`].
//! A client that goes away (Ctrl-C) closes the connection: a relayed job
//! is killed then, as a cancelled MCP call's is.
//!
//! Holders. `confine serve` listens for as long as it runs. A `confine
//! exec` that takes the store's lock listens too, for as long as a job of
//! its own or a relayed one runs (docs/design.md, "Parallel `confine
//! exec`"): each `exec` it relays runs as its client would have run it,
//! under the client's configuration, PATH and HOME, in a supervisor of its
//! own on the holder's store.

// Off Linux (no `SO_PEERCRED`, no governed runtime) nothing is relayed:
// the framing is unused there.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod server;

use crate::cli::artifacts::{ArtifactsCommand, GcArgs};
use crate::cli::audit::AuditCommand;
use crate::cli::memory::MemoryCommand;
use crate::config::Config;
use serde::{Deserialize, Serialize};

/// The socket's name in the store's directory.
pub const SOCKET_NAME: &str = "serve.sock";

/// The wire's version: a server refuses a request of another version
/// (3: an exec's `envUnset`, which an older server would ignore, and let
/// a name off its allowlist pass unchecked; and the `taken` frame before a
/// relayed exec's job starts, which tells a retry from a job that ran).
pub const PROTOCOL: u32 = 3;

/// A command a client relays.
#[derive(Debug, Serialize, Deserialize)]
pub enum RelayedCommand {
    Audit(AuditCommand),
    Artifacts(ArtifactsCommand),
    Gc(GcArgs),
    Memory(MemoryCommand),
    /// A governed execution, resolved by the client (code and stdin read,
    /// environment values taken, the repository named by id).
    #[cfg(target_os = "linux")]
    Exec(ExecRelay),
    /// `confine run`: the job as the client planned it, with the client's
    /// three streams passed for it (pipes or /dev/null only).
    #[cfg(target_os = "linux")]
    Run(RunRelay),
}

/// `confine run`, relayed. After the request the client may send one
/// byte: the number of the signal it was stopped by, which the job gets
/// as in-process (the tree is killed `kill_grace` later). A client that
/// goes away without one has its job killed at once.
#[cfg(target_os = "linux")]
#[derive(Debug, Serialize, Deserialize)]
pub struct RunRelay {
    pub spec: crate::job::JobSpec,
    pub kill_grace: std::time::Duration,
}

/// `confine exec`, relayed.
#[cfg(target_os = "linux")]
#[derive(Debug, Serialize, Deserialize)]
pub struct ExecRelay {
    pub request: crate::supervisor::exec::JobRequest,
    /// Copy the job's output to the client's descriptors as it comes.
    pub live: bool,
    /// `--repo`: the root the client registered ad hoc (as id `cli`).
    /// A `confine exec` that holds the store runs it, as the client
    /// would have; `confine serve` runs only its configured repositories.
    #[serde(default)]
    pub adhoc_repo: Option<std::path::PathBuf>,
    /// `--workspace-at`: where the request's repository is mounted. An
    /// exec holder mounts it there, as the client would have; `confine
    /// serve` only where its own configuration says.
    #[serde(default)]
    pub workspace_at: Option<crate::sandbox::workspace_at::WorkspaceAt>,
    /// `--allow-degraded`.
    #[serde(default)]
    pub allow_degraded: bool,
    /// The client's PATH and HOME, where a `confine exec` that holds the
    /// store resolves the job's toolchain, as the client would have.
    #[serde(default)]
    pub path: Option<std::ffi::OsString>,
    #[serde(default)]
    pub home: Option<std::path::PathBuf>,
}

/// What a client sends.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub protocol: u32,
    /// The client's working directory: relative paths of its
    /// configuration are its own (see [`absolute`]).
    #[serde(default)]
    pub cwd: std::path::PathBuf,
    /// The client's configuration: the server runs the command only if it
    /// is the one the server runs with.
    pub config: Config,
    pub command: RelayedCommand,
}

/// What the server answers.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Reply {
    /// Sent alone before a relayed `exec` starts, the final reply after:
    /// a connection closed before it was never taken (its holder was
    /// stopping), and the client may try again; closed after it, the job
    /// may have run, and it is not run twice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub taken: bool,
    /// The command's exit status.
    pub exit: i32,
    /// Why the server did not run the command (nothing was run then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// A relayed `exec`'s response, which the client reports.
    #[cfg(target_os = "linux")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<Box<crate::supervisor::exec::JobResponse>>,
    /// A relayed `run`'s outcome, which the client reports as its own.
    #[cfg(target_os = "linux")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<Box<crate::job::Outcome>>,
    /// Why a relayed `run` could not start its job (as an in-process run
    /// would have failed: not a refusal, so the client reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Errors of the relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("the store's socket {path}: {source}")]
    Io { path: std::path::PathBuf, source: std::io::Error },
    #[error("the store's socket {path}: {message}")]
    Untrusted { path: std::path::PathBuf, message: String },
    #[error("the process holding the store (pid {pid}) did not run the command: {message}")]
    Refused { pid: u32, message: String },
    /// The holder closed the connection before it took the request: it
    /// was stopping (or had too many clients). Nothing ran; try again.
    #[error("the process holding the store (pid {pid}) closed the connection before it took the command")]
    NotTaken { pid: u32 },
    /// The socket answers, but from a process that does not hold the store
    /// (now): a holder that just left, or a socket planted there.
    #[error("the store's socket {path}: it is served by pid {pid}, but the store is held by {held}: remove the socket if no server runs")]
    NotHolder { path: std::path::PathBuf, pid: u32, held: String },
    #[error("the store's socket: a malformed message: {0}")]
    Malformed(String),
    /// The connection was closed before a reply's first byte.
    #[error("the store's socket: the server closed the connection without an answer (too many clients at once, or it is stopping)")]
    Closed,
}

/// An option of a relayed command that its client should have resolved,
/// as the command line names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} must be resolved by the client before it is relayed")]
pub(crate) struct Unresolved(&'static str);

/// `config` with its relative paths made absolute from `cwd`: the same
/// text read in two directories is two configurations.
pub(crate) fn absolute(mut config: Config, cwd: &std::path::Path) -> Config {
    let abs = |p: &mut std::path::PathBuf| {
        if p.is_relative() {
            *p = cwd.join(&*p);
        }
    };
    config.store.path.as_mut().map(abs);
    config.repos.iter_mut().for_each(|r| abs(&mut r.root));
    config.policy.evaluators.iter_mut().filter_map(|e| e.path.as_mut()).for_each(abs);
    config.mcp.tokens.iter_mut().filter_map(|t| t.file.as_mut()).for_each(abs);
    config
}

/// Whether a relayed command was resolved by its client, as an honest
/// one does before sending: a server never reads its own standard input
/// or a file a client named for it to read, and never takes a path
/// relative to its own working directory.
pub(crate) fn resolved(command: &RelayedCommand) -> Result<(), Unresolved> {
    use crate::cli::memory::MemoryCommand as M;
    let unresolved = |what: &'static str| Err(Unresolved(what));
    let repo = |r: &crate::cli::memory::RepoArgs| if r.repo.is_some() { unresolved("--repo") } else { Ok(()) };
    match command {
        RelayedCommand::Memory(M::Store(a)) if a.content_file.is_some() || a.content.is_none() => {
            unresolved("--content-file")
        }
        RelayedCommand::Memory(M::Store(a)) => repo(&a.repo),
        RelayedCommand::Memory(M::Query(a)) => repo(&a.repo),
        RelayedCommand::Memory(M::Rm(a)) => repo(&a.repo),
        RelayedCommand::Memory(M::Surface(a)) => repo(&a.repo),
        RelayedCommand::Memory(M::Log(a)) => repo(&a.repo),
        RelayedCommand::Audit(AuditCommand::Export(a)) if a.output.as_ref().is_some_and(|p| p.is_relative()) => {
            unresolved("--output")
        }
        _ => Ok(()),
    }
}

/// How long a client's descriptor may refuse bytes before a write to it
/// gives up: a client whose reader stopped (`| sleep`) must not hold the
/// server's threads, nor a relayed job's capture.
#[cfg(target_os = "linux")]
pub(crate) const LIVE_STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// Write to a client's descriptor without blocking for more than
/// [`LIVE_STALL`] at a time. The file description is the client's, so it
/// stays blocking: each write waits for room (`POLLOUT`: at least
/// `PIPE_BUF` bytes free in a pipe) and is at most that size.
#[cfg(target_os = "linux")]
pub(crate) fn write_unstalled(file: &std::fs::File, bytes: &[u8]) -> std::io::Result<usize> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    const PIPE_BUF: usize = 4096;
    if bytes.is_empty() {
        return Ok(0);
    }
    let timeout = PollTimeout::try_from(LIVE_STALL).unwrap_or(PollTimeout::MAX);
    loop {
        let mut fds = [PollFd::new(file.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, timeout) {
            Ok(0) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the reader stopped reading")),
            Ok(_) => return std::io::Write::write(&mut &*file, &bytes[..bytes.len().min(PIPE_BUF)]),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// A client's descriptor (owned or borrowed), written with
/// [`write_unstalled`].
#[cfg(target_os = "linux")]
pub(crate) struct Unstalled<F>(pub F);

#[cfg(target_os = "linux")]
impl<F: std::borrow::Borrow<std::fs::File>> std::io::Write for Unstalled<F> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        write_unstalled(self.0.borrow(), bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `value` as one frame's bytes.
pub(crate) fn frame<T: Serialize>(value: &T) -> std::io::Result<Vec<u8>> {
    let body = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(|_| std::io::Error::other("message too large"))?;
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}
