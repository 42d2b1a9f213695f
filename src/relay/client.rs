//! The client side: find a running server at the store's socket, check
//! that it is the store's holder, and relay one command to it.

use super::{RelayError, RelayedCommand, Reply, PROTOCOL, SOCKET_NAME};
use crate::config::Config;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// A connection to the `confine serve` that holds a store, checked.
pub struct Connection {
    stream: UnixStream,
    path: std::path::PathBuf,
    pid: u32,
}

/// Relay `command` to the `confine serve` holding the store at `store`.
/// `None`: no server answers there, and the caller opens the store itself.
pub fn call(store: &Path, config: &Config, command: &RelayedCommand) -> Option<Result<Reply, RelayError>> {
    connect(store).map(|c| c.and_then(|c| c.call(config, command)))
}

/// Connect to the server at the store's socket. `None`: no server answers
/// there (no socket, or one a dead server left).
pub fn connect(store: &Path) -> Option<Result<Connection, RelayError>> {
    let path = store.join(SOCKET_NAME);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_socket() => {}
        // Absent, or not a socket: nobody serves here.
        _ => return None,
    }
    let stream = match UnixStream::connect(&path) {
        Ok(s) => s,
        // A server killed before it could remove its socket.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED) | Some(libc::ENOENT)) => return None,
        Err(source) => return Some(Err(RelayError::Io { path, source })),
    };
    Some(check(path, store, stream))
}

/// The peer must be the store's holder, under our uid: a socket planted in
/// the directory is never sent a command, a descriptor or a configuration.
fn check(path: std::path::PathBuf, store: &Path, stream: UnixStream) -> Result<Connection, RelayError> {
    let peer = match nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials) {
        Ok(p) => p,
        Err(e) => return Err(RelayError::Io { path, source: e.into() }),
    };
    let untrusted = |path, message: String| RelayError::Untrusted { path, message };
    let uid = nix::unistd::geteuid().as_raw();
    if peer.uid() != uid {
        let message =
            format!("it is served by uid {}, not this user (uid {uid}): remove it, or stop that process", peer.uid());
        return Err(untrusted(path, message));
    }
    // The lock is read after the connection: a server that took the store
    // over wrote its pid there before it listened.
    let holder = crate::store::holder_pid(store);
    let pid = u32::try_from(peer.pid()).unwrap_or(0);
    if holder != Some(pid) {
        let held = holder.map(|h| format!("pid {h}")).unwrap_or_else(|| "nobody".into());
        return Err(RelayError::NotHolder { path, pid, held });
    }
    Ok(Connection { stream, path, pid })
}

impl Connection {
    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Send `command`, with our standard output and error, and wait for
    /// the reply. The command's output is written there by the server.
    /// The connection's socket, for a signal handler to shut for writing
    /// (the server reads that as the caller gone).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.stream)
    }

    pub fn call(self, config: &Config, command: &RelayedCommand) -> Result<Reply, RelayError> {
        let io = |source| RelayError::Io { path: self.path.clone(), source };
        let cwd = std::env::current_dir().map_err(io)?;
        let request = RequestRef { protocol: PROTOCOL, cwd: &cwd, config, command };
        let bytes = super::frame(&request).map_err(io)?;
        let not_taken = RelayError::NotTaken { pid: self.pid };
        match send_with_stdio(&self.stream, &bytes) {
            // Closed unread: a holder that stopped listening meanwhile.
            Err(e) if closed(&e) => return Err(not_taken),
            r => r.map_err(io)?,
        }
        let mut reply = match read_reply(&self.stream) {
            Err(RelayError::Closed) => return Err(not_taken),
            r => r?,
        };
        if reply.taken {
            reply = match read_reply(&self.stream) {
                Err(RelayError::Closed) => {
                    return Err(RelayError::Malformed(format!(
                        "the process holding the store (pid {}) closed the connection while it ran the command: \
                     did it die? (nothing was run twice)",
                        self.pid
                    )))
                }
                r => r?,
            };
        }
        match reply.refused {
            Some(message) => Err(RelayError::Refused { pid: self.pid, message }),
            None => Ok(reply),
        }
    }
}

impl Connection {
    /// Send a `run` (`command`) with the job's three streams, which go
    /// to the server. The signal `stop` resolves to is sent on to the job
    /// (once); then the reply, the job's outcome, is awaited. Until the
    /// stop, the signals `others` gives are sent on as they come (the
    /// server passes them to the job without stopping it).
    #[cfg(target_os = "linux")]
    pub async fn call_run(
        self,
        config: &Config,
        command: &RelayedCommand,
        streams: [std::os::fd::OwnedFd; 3],
        stop: impl std::future::Future<Output = i32>,
        mut others: tokio::sync::mpsc::UnboundedReceiver<i32>,
    ) -> Result<Reply, RelayError> {
        let io = |source| RelayError::Io { path: self.path.clone(), source };
        let cwd = std::env::current_dir().map_err(io)?;
        let request = RequestRef { protocol: PROTOCOL, cwd: &cwd, config, command };
        let bytes = super::frame(&request).map_err(io)?;
        let raw = streams.each_ref().map(|f| f.as_raw_fd());
        send_with_fds(&self.stream, &bytes, &raw).map_err(io)?;
        // The job's now: the caller sees the end of its output when the
        // job's tree and the server let go of them.
        drop(streams);
        let stream = self.stream.try_clone().and_then(|s| {
            s.set_nonblocking(true)?;
            tokio::net::UnixStream::from_std(s)
        });
        let (mut reader, mut writer) = stream.map_err(io)?.into_split();
        let reply = async move {
            use tokio::io::AsyncReadExt;
            let mut head = [0u8; 4];
            reader.read_exact(&mut head).await.map_err(reply_error)?;
            let mut body = vec![0u8; reply_len(head)?];
            reader.read_exact(&mut body).await.map_err(reply_error)?;
            serde_json::from_slice::<Reply>(&body).map_err(|e| RelayError::Malformed(e.to_string()))
        };
        tokio::pin!(reply, stop);
        let mut forwarded = false;
        let reply = loop {
            tokio::select! {
                r = &mut reply => break r?,
                sig = &mut stop, if !forwarded => {
                    use tokio::io::AsyncWriteExt;
                    forwarded = true;
                    // A server gone meanwhile answers nothing, which the
                    // reply's read says.
                    let _ = writer.write_all(&[u8::try_from(sig).unwrap_or(libc::SIGTERM as u8)]).await;
                }
                Some(sig) = others.recv(), if !forwarded => {
                    use tokio::io::AsyncWriteExt;
                    if let Ok(byte) = u8::try_from(sig) {
                        let _ = writer.write_all(&[byte]).await;
                    }
                }
            }
        };
        match reply.refused {
            Some(message) => Err(RelayError::Refused { pid: self.pid, message }),
            None => Ok(reply),
        }
    }
}

/// A [`super::Request`] by reference, as sent.
#[derive(serde::Serialize)]
struct RequestRef<'a> {
    protocol: u32,
    cwd: &'a Path,
    config: &'a Config,
    command: &'a RelayedCommand,
}

/// Send `bytes`, passing our standard output and error with the first part.
fn send_with_stdio(stream: &UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    send_with_fds(stream, bytes, &[libc::STDOUT_FILENO, libc::STDERR_FILENO])
}

/// Send `bytes`, passing `fds` with the first part.
fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[std::os::fd::RawFd]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    use std::io::Write;
    let cmsg = [ControlMessage::ScmRights(fds)];
    let iov = [std::io::IoSlice::new(bytes)];
    let sent = loop {
        match sendmsg::<()>(stream.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut w = stream;
    w.write_all(&bytes[sent..])?;
    w.flush()
}

/// The largest reply read (a relayed `exec --json` carries the rendered
/// output).
const MAX_REPLY_BYTES: u32 = 256 << 20;

/// Whether `e` says the peer closed the connection.
fn closed(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
    )
}

/// Read one frame of the server's. [`RelayError::Closed`]: the connection
/// was closed before its first byte.
fn read_reply(mut stream: &UnixStream) -> Result<Reply, RelayError> {
    use std::io::Read;
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match stream.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(RelayError::Closed),
            Ok(0) => return Err(reply_error(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if got == 0 && closed(&e) => return Err(RelayError::Closed),
            Err(e) => return Err(reply_error(e)),
        }
    }
    let mut body = vec![0u8; reply_len(head)?];
    stream.read_exact(&mut body).map_err(reply_error)?;
    serde_json::from_slice(&body).map_err(|e| RelayError::Malformed(e.to_string()))
}

/// The length a reply's header gives, if it is one a reply may have.
fn reply_len(head: [u8; 4]) -> Result<usize, RelayError> {
    let len = u32::from_le_bytes(head);
    if len > MAX_REPLY_BYTES {
        return Err(RelayError::Malformed(format!("a message of {len} bytes (at most {MAX_REPLY_BYTES})")));
    }
    Ok(len as usize)
}

/// A failed read of the reply, said as the user needs it.
fn reply_error(e: std::io::Error) -> RelayError {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => RelayError::Malformed(
            "the server closed the connection without an answer (too many clients at once, or it is stopping)".into(),
        ),
        _ => RelayError::Malformed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Closed before a byte of the reply: the server never took the
    /// request (the client may try again). Closed within a frame: an
    /// answer cut off, which is never taken for that.
    #[test]
    fn a_connection_closed_before_the_reply_is_told_from_one_cut_off() {
        let (client, server) = UnixStream::pair().unwrap();
        drop(server);
        assert!(matches!(read_reply(&client), Err(RelayError::Closed)));
        let (client, mut server) = UnixStream::pair().unwrap();
        server.write_all(&[9, 0]).unwrap();
        drop(server);
        assert!(matches!(read_reply(&client), Err(RelayError::Malformed(_))));
        let (client, mut server) = UnixStream::pair().unwrap();
        server.write_all(&super::super::frame(&Reply { taken: true, ..Reply::default() }).unwrap()).unwrap();
        assert!(read_reply(&client).unwrap().taken);
    }
}
