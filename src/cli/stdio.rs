//! The caller's standard streams, as `confine run` hands them to a job.
//!
//! A job never gets the caller's terminal or files themselves: with its
//! caller's tty it could take the terminal's foreground (`TIOCSPGRP`) or
//! type into the shell behind it (`TIOCSTI`), and with a regular file it
//! could truncate or rewrite the caller's log (`ftruncate`, `pwrite`,
//! `fchmod`). A pipe passes through (it can't be rewound or truncated),
//! opened afresh so that the job's file status flags (`O_NONBLOCK`) stay
//! its own and don't reach the caller's other readers and writers, and
//! `/dev/null` passes as it is; anything else is relayed by this process
//! through a pipe of its own, as `docker run` does. With `--tty`
//! the job gets a terminal of its own: a pty whose other side is relayed
//! here, with the caller's terminal in raw mode and its size kept in step
//! (`docker run -t`).
//!
//! The relays are threads doing blocking reads and writes (no tokio in
//! the copy path, so a slow consumer holds nothing else up); the caller
//! waits for the output relays to drain after the job ends, and a stop
//! request (SIGTERM, SIGINT, SIGHUP) ends that wait at once.

use crate::sandbox::{Job, StdioSpec, StdioTarget};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread::JoinHandle;

/// How one of the caller's streams reaches the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    /// Passed as it is: /dev/null.
    Pass,
    /// A pipe, opened again (a new open file description of it).
    Reopen,
    /// Relayed through a pipe by this process.
    Relay,
    /// Not open in the caller (or a terminal the caller can't read now):
    /// the job gets /dev/null.
    Null,
}

/// The plan for the caller's three streams, made before the job starts.
pub struct CallerStdio {
    routes: [Route; 3],
    /// The fresh descriptions of the pipes routed [`Route::Reopen`].
    reopened: [Option<OwnedFd>; 3],
    pty: Option<Pty>,
}

impl CallerStdio {
    /// Look at fds 0, 1 and 2. `tty`: give the job a pty of its own.
    /// `interactive`: relay a terminal stdin (else the job gets /dev/null
    /// there, and what the user types ahead stays for the shell).
    pub fn detect(tty: bool, interactive: bool) -> io::Result<CallerStdio> {
        let mut routes = [route(0), route(1), route(2)];
        if routes[0] == Route::Relay && is_tty(0) && !interactive {
            routes[0] = Route::Null;
        }
        let mut reopened = [None, None, None];
        for fd in 0..3 {
            if routes[fd] == Route::Reopen {
                match reopen_pipe(fd as RawFd) {
                    Ok(copy) => reopened[fd] = Some(copy),
                    // Not ours to open again (another user's FIFO): relayed.
                    Err(_) => routes[fd] = Route::Relay,
                }
            }
        }
        let pty = if tty { Some(Pty::open()?) } else { None };
        Ok(CallerStdio { routes, reopened, pty })
    }

    /// What the sandbox's stage gets as fds 0, 1 and 2. With a pty, all
    /// three are its terminal side (kept open by `self` until the job is
    /// started).
    pub fn stdio(&self) -> StdioSpec {
        if let Some(pty) = &self.pty {
            let fd = StdioTarget::Fd(pty.terminal.as_raw_fd());
            return StdioSpec { stdin: fd, stdout: fd, stderr: fd };
        }
        let stream = |fd: usize| match self.routes[fd] {
            Route::Pass => StdioTarget::Inherit,
            Route::Reopen => self.reopened[fd].as_ref().map_or(StdioTarget::Null, |f| StdioTarget::Fd(f.as_raw_fd())),
            Route::Relay => StdioTarget::Piped,
            Route::Null => StdioTarget::Null,
        };
        StdioSpec { stdin: stream(0), stdout: stream(1), stderr: stream(2) }
    }

    /// Start the relays of a job just spawned with [`CallerStdio::stdio`].
    pub fn start(self, job: &mut dyn Job) -> io::Result<Relays> {
        let mut relays = Relays { outputs: Vec::new(), raw: None, master: None };
        if let Some(pty) = self.pty {
            // Only the job's side may hold the terminal open now: the
            // master reads EIO (the end) once the job's last process exits.
            drop(pty.terminal);
            let master = pty.master;
            if let Some(size) = window_size(0).or_else(|| window_size(1)) {
                set_window_size(&master, &size);
            }
            relays.raw = RawMode::enter(0);
            let to_job = File::from(master.try_clone()?);
            relays.outputs.push(spawn_copy("confine-pty-out", File::from(master.try_clone()?), dup(1)?)?);
            spawn_detached("confine-pty-in", dup(0)?, to_job)?;
            relays.master = Some(master);
            return Ok(relays);
        }
        if self.routes[0] == Route::Relay {
            if let Some(to_job) = job.stdin_pipe() {
                spawn_detached("confine-stdin", dup(0)?, File::from(to_job?))?;
            }
        }
        for (fd, pipe) in [(1, job.stdout_pipe()), (2, job.stderr_pipe())] {
            if let Some(pipe) = pipe {
                let pipe = pipe?;
                relays.outputs.push(spawn_copy("confine-relay", File::from(pipe), dup(fd)?)?);
            }
        }
        Ok(relays)
    }
}

/// The streams a job started by a server gets ([`CallerStdio::for_server`]),
/// and the relays of those this process copies.
pub struct ServerStreams {
    /// The job's stdin, stdout and stderr.
    pub fds: [OwnedFd; 3],
    pub relays: Relays,
}

impl CallerStdio {
    /// The job's three streams as descriptors to pass to a server that
    /// starts it (`confine run` through `confine serve`): pipes and
    /// /dev/null as [`CallerStdio::stdio`] passes them, and for an output
    /// that is a terminal or a file, a pipe of this process's own, copied
    /// to it here. None when the job's stdin would have to be copied here
    /// (a file, or a terminal with -i) or it has a pty: only in this
    /// process can the job be started then without stdin read before it
    /// is known to start.
    pub fn for_server(self) -> io::Result<Option<ServerStreams>> {
        if self.pty.is_some() || self.routes[0] == Route::Relay {
            return Ok(None);
        }
        let mut relays = Relays { outputs: Vec::new(), raw: None, master: None };
        let CallerStdio { routes, mut reopened, .. } = self;
        let mut fds = Vec::with_capacity(3);
        for (fd, route) in routes.iter().enumerate() {
            let raw = fd as RawFd;
            fds.push(match route {
                Route::Pass => OwnedFd::from(dup(raw)?),
                Route::Reopen => match reopened[fd].take() {
                    Some(f) => f,
                    None => dev_null()?,
                },
                Route::Null => dev_null()?,
                Route::Relay => {
                    let (from_job, to_caller) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
                    relays.outputs.push(spawn_copy("confine-relay", File::from(from_job), dup(raw)?)?);
                    to_caller
                }
            });
        }
        let fds = <[OwnedFd; 3]>::try_from(fds).map_err(|_| io::Error::other("three streams"))?;
        Ok(Some(ServerStreams { fds, relays }))
    }
}

/// /dev/null, for reading and writing.
fn dev_null() -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?))
}

/// The relays of a running job.
pub struct Relays {
    outputs: Vec<JoinHandle<()>>,
    /// The caller's terminal settings, restored when this is dropped.
    raw: Option<RawMode>,
    /// The pty's master, for window size changes.
    master: Option<OwnedFd>,
}

impl Relays {
    /// Whether the job has a pty whose size follows the caller's.
    pub fn has_pty(&self) -> bool {
        self.master.is_some()
    }

    /// What copies the caller's window size to the job's terminal, for a
    /// task that runs it on each SIGWINCH.
    pub fn resizer(&self) -> Option<impl Fn() + Send + 'static> {
        let master = self.master.as_ref()?.try_clone().ok()?;
        Some(move || {
            if let Some(size) = window_size(0).or_else(|| window_size(1)) {
                set_window_size(&master, &size);
            }
        })
    }

    /// Wait until everything the job wrote has reached the caller.
    pub async fn drain(&mut self) {
        let outputs = std::mem::take(&mut self.outputs);
        // Nothing relayed (pipes and /dev/null pass through): no thread
        // to start just to wait for none.
        if outputs.is_empty() {
            return;
        }
        let _ = tokio::task::spawn_blocking(move || {
            for t in outputs {
                let _ = t.join();
            }
        })
        .await;
    }
}

fn route(fd: RawFd) -> Route {
    // SAFETY: fstat fills the struct we own; an fd that is not open is
    // an error, not undefined behaviour.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Route::Null;
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => Route::Reopen,
        libc::S_IFCHR if st.st_rdev == libc::makedev(1, 3) => Route::Pass,
        // A terminal stdin is read only by the terminal's foreground
        // process group; read from the background, it would stop us
        // (SIGTTIN). The job then gets no input, as `docker run` without -i.
        libc::S_IFCHR if fd == 0 && is_tty(0) && !in_foreground(0) => Route::Null,
        _ => Route::Relay,
    }
}

/// A new open file description of the pipe at `fd`, with its access mode
/// and no `O_NONBLOCK`. Opened non-blocking (a pipe opened for writing
/// with no reader left would wait for one), then switched back.
fn reopen_pipe(fd: RawFd) -> io::Result<OwnedFd> {
    let mode = if fd == 0 { libc::O_RDONLY } else { libc::O_WRONLY };
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    // SAFETY: a NUL-terminated path; open returns a new fd or -1.
    let raw = unsafe { libc::open(path.as_ptr(), mode | libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open just returned this fd; nothing else owns it.
    let copy = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: F_SETFL with an integer on an fd we own.
    if unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_SETFL, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(copy)
}

fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the fd.
    unsafe { libc::isatty(fd) == 1 }
}

fn in_foreground(fd: RawFd) -> bool {
    // SAFETY: tcgetpgrp and getpgrp take no pointers.
    unsafe { libc::tcgetpgrp(fd) == libc::getpgrp() }
}

/// A close-on-exec copy of one of our standard streams.
fn dup(fd: RawFd) -> io::Result<File> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a number; a closed fd is an error.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned this new fd; nothing else owns it.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(copy) }))
}

/// Copy `from` to `to` until `from` ends (EOF, or EIO from a pty whose
/// job side is gone) or `to` fails (the caller's reader left: the rest is
/// drained and dropped, so the job never blocks on a full pipe).
fn spawn_copy(name: &str, mut from: File, mut to: File) -> io::Result<JoinHandle<()>> {
    let run = move || {
        let mut buf = vec![0u8; 64 * 1024];
        let mut sink_ok = true;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if sink_ok && to.write_all(&buf[..n]).is_err() {
                sink_ok = false;
            }
        }
        let _ = to.flush();
    };
    std::thread::Builder::new().name(name.into()).spawn(run)
}

/// [`spawn_copy`] for the input side: nobody waits for it (a job that
/// never reads its stdin must not keep us, and a terminal read blocks
/// until the user types). It ends with the process.
fn spawn_detached(name: &str, from: File, to: File) -> io::Result<()> {
    spawn_copy(name, from, to).map(drop)
}

/// A pseudo-terminal: the master stays here, the terminal side goes to
/// the job.
struct Pty {
    master: OwnedFd,
    terminal: OwnedFd,
}

impl Pty {
    fn open() -> io::Result<Pty> {
        use nix::fcntl::OFlag;
        let master = nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
        nix::pty::grantpt(&master)?;
        nix::pty::unlockpt(&master)?;
        let name = nix::pty::ptsname_r(&master)?;
        let terminal = nix::fcntl::open(
            name.as_str(),
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        // SAFETY: posix_openpt returned an fd we now own alone.
        let master = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(master)) };
        Ok(Pty { master, terminal })
    }
}

fn window_size(fd: RawFd) -> Option<libc::winsize> {
    // SAFETY: winsize is plain old data; all-zero is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into the struct we own.
    (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0).then_some(ws)
}

fn set_window_size(master: &OwnedFd, size: &libc::winsize) {
    // SAFETY: TIOCSWINSZ reads the winsize we own; the fd is open.
    unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, size) };
}

/// The caller's terminal in raw mode (every key goes to the job's pty,
/// Ctrl-C included, whose line discipline turns it into the job's
/// SIGINT), restored when dropped.
struct RawMode {
    fd: File,
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    fn enter(fd: RawFd) -> Option<RawMode> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        // A terminal this process does not hold in the foreground is not
        // its to change (from a background group, tcsetattr would stop it
        // with SIGTTOU, or with that ignored change the foreground's).
        if !is_tty(fd) || !in_foreground(fd) {
            return None;
        }
        let file = dup(fd).ok()?;
        let saved = tcgetattr(file.as_fd()).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(file.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { fd: file, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(self.fd.as_fd(), nix::sys::termios::SetArg::TCSANOW, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipes_and_dev_null_pass_files_are_relayed() {
        let (r, _w) = nix::unistd::pipe().unwrap();
        let file = tempfile::tempfile().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(route(r.as_raw_fd()), Route::Reopen);
        assert_eq!(route(null.as_raw_fd()), Route::Pass);
        assert_eq!(route(file.as_raw_fd()), Route::Relay);
        let dir = std::fs::File::open("/").unwrap();
        assert_eq!(route(dir.as_raw_fd()), Route::Relay);
        assert_eq!(route(1_000_000), Route::Null);
    }
}
