//! The `__init` stage's process: started with `posix_spawn(3)`, its fds
//! placed by the spawn's file actions, waited for through a pidfd, and
//! killed (and reaped) when dropped.
//!
//! glibc's `posix_spawn` clones with `CLONE_VM | CLONE_VFORK`: the child
//! runs on the supervisor's memory until its execve, and nothing of the
//! supervisor's address space is copied. `fork(2)`, which std's `Command`
//! falls back to as soon as a `pre_exec` closure is set (and placing the
//! control socket and the seccomp memfd at fixed numbers needed one),
//! copies the page tables and leaves every page the supervisor then writes
//! to fault once, copy-on-write: `confine exec` was measurably slower that
//! way from the CLI, and a warm server, whose heap is larger, pays more
//! (docs/benchmarks.md, "Figures once in the code"). No code of ours runs between the
//! clone and the execve.

use crate::sandbox::{StdioSpec, StdioTarget};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

/// A stage process we spawned. Until it is reaped its pid is ours: no
/// other process can be given it, so signalling it by pid is safe.
pub(crate) struct StageProcess {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    status: Option<ExitStatus>,
    /// Our ends of the streams that were [`StdioTarget::Piped`], blocking.
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Start `program` with `argv` (argv[0] first) and exactly the environment
/// `env` (`KEY=value`), its standard streams as `stdio` says and each
/// `(fd, target)` of `fds` at its target number. Every other fd of ours is
/// close-on-exec (std and tokio open them so) and stays ours.
pub(crate) fn spawn(
    program: &Path,
    argv: &[&CStr],
    env: &[&CStr],
    stdio: StdioSpec,
    fds: &[(RawFd, RawFd)],
) -> io::Result<StageProcess> {
    let path = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the stage's path contains a NUL byte"))?;
    let argv: Vec<*mut libc::c_char> =
        argv.iter().map(|a| a.as_ptr().cast_mut()).chain(std::iter::once(std::ptr::null_mut())).collect();
    let envp: Vec<*mut libc::c_char> =
        env.iter().map(|e| e.as_ptr().cast_mut()).chain(std::iter::once(std::ptr::null_mut())).collect();

    // What the child's fds 0, 1 and 2 are made from, and our ends.
    let (mut placed, mut ours): (Vec<(OwnedFd, RawFd)>, [Option<OwnedFd>; 3]) = (Vec::new(), [None, None, None]);
    for (target, stream) in [stdio.stdin, stdio.stdout, stdio.stderr].into_iter().enumerate() {
        match stream {
            StdioTarget::Inherit => {}
            StdioTarget::Null => placed.push((open_dev_null()?, target as RawFd)),
            StdioTarget::Fd(fd) => placed.push((dup_above(fd, 0)?, target as RawFd)),
            StdioTarget::Piped => {
                let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
                let (theirs, mine) = if target == 0 { (read, write) } else { (write, read) };
                placed.push((theirs, target as RawFd));
                ours[target] = Some(mine);
            }
        }
    }
    // The file actions run in order: a source whose number is another
    // one's target would be overwritten before it is placed (a seccomp
    // memfd at fd 3, where the control socket goes). Every source is
    // copied above all targets first; the copies are close-on-exec, and
    // ours, closed when this returns.
    let above = placed.iter().map(|&(_, t)| t).chain(fds.iter().map(|&(_, t)| t)).max().unwrap_or(2) + 1;
    let mut copies = Vec::with_capacity(placed.len() + fds.len());
    for (fd, target) in placed.iter().map(|(fd, t)| (fd.as_raw_fd(), *t)).chain(fds.iter().copied()) {
        copies.push((dup_above(fd, above)?, target));
    }

    let actions = FileActions::new()?;
    for (copy, target) in &copies {
        // dup2 onto another number clears close-on-exec on the target.
        actions.dup2(copy.as_raw_fd(), *target)?;
    }
    let attr = SpawnAttr::new()?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: path, argv and envp are NUL-terminated strings and
    // null-terminated arrays of them, alive across the call; the file
    // actions and attributes were initialized and are destroyed after it.
    let rc = unsafe { libc::posix_spawn(&mut pid, path.as_ptr(), &actions.0, &attr.0, argv.as_ptr(), envp.as_ptr()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    drop(copies);
    drop(placed);
    let pidfd = match super::sys::pidfd_open(pid).map_err(io::Error::from) {
        Ok(fd) => fd,
        Err(e) => {
            // Not waited for yet, so still ours: kill and reap it.
            // SAFETY: kill and waitpid on our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
            return Err(io::Error::new(e.kind(), format!("pidfd_open of the init stage: {e} (Linux 5.3 or later)")));
        }
    };
    let [stdin, stdout, stderr] = ours;
    Ok(StageProcess { pid, pidfd, status: None, stdin, stdout, stderr })
}

impl StageProcess {
    /// Its host pid, until it is reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// SIGKILL it, unless it was reaped.
    pub fn start_kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        // SAFETY: not reaped, so the pid is still our child's.
        if unsafe { libc::kill(self.pid, libc::SIGKILL) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILL it and wait for it.
    pub async fn kill(&mut self) -> io::Result<()> {
        self.start_kill()?;
        self.wait().await.map(drop)
    }

    /// Wait for it to exit and reap it. Cancel-safe: dropped half-way,
    /// nothing is lost, and it can be called again.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        // The pidfd polls readable once the process has exited.
        // SAFETY: the AsyncFd holds only the number of self.pidfd, which
        // stays open, the same fd, until after the AsyncFd is dropped at
        // the end of this call (self is borrowed throughout).
        let fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(self.pidfd.as_raw_fd(), tokio::io::Interest::READABLE)
        }?;
        loop {
            let mut guard = fd.readable().await?;
            if let Some(status) = self.try_reap()? {
                return Ok(status);
            }
            guard.clear_ready();
        }
    }

    /// Reap it if it has exited.
    pub fn try_reap(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        loop {
            // SAFETY: waitpid on our own child, with a valid out pointer.
            match unsafe { libc::waitpid(self.pid, &mut raw, libc::WNOHANG) } {
                0 => return Ok(None),
                pid if pid == self.pid => {
                    let status = ExitStatus::from_raw(raw);
                    self.status = Some(status);
                    return Ok(Some(status));
                }
                _ => {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::Interrupted {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Drop for StageProcess {
    /// Killed, and reaped: at once if it is already dead, else by a task
    /// of the runtime this runs in, else here, blocking (SIGKILL is not
    /// ignorable; the wait is the kernel's teardown of the process).
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        let _ = self.start_kill();
        if matches!(self.try_reap(), Ok(Some(_)) | Err(_)) {
            return;
        }
        let pid = self.pid;
        match (tokio::runtime::Handle::try_current(), self.pidfd.try_clone()) {
            // The task owns only a pid and a pidfd, nothing with a Drop of
            // its own: a runtime shutting down drops it as it is, leaving
            // a zombie for the process's exit to clear.
            (Ok(rt), Ok(pidfd)) => {
                rt.spawn(async move {
                    // SAFETY: the AsyncFd holds the number of pidfd, which
                    // this task owns and drops after the AsyncFd.
                    let fd = unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            pidfd.as_raw_fd(),
                            tokio::io::Interest::READABLE,
                        )
                    };
                    if let Ok(fd) = fd {
                        let _ = fd.readable().await;
                    }
                    // SAFETY: waitpid on our own killed, unreaped child.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
                });
            }
            _ => {
                // SAFETY: waitpid on our own killed, unreaped child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            }
        }
    }
}

fn open_dev_null() -> io::Result<OwnedFd> {
    Ok(OwnedFd::from(std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?))
}

/// A close-on-exec copy of `fd` numbered `above` or higher.
fn dup_above(fd: RawFd, above: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on an fd the caller keeps open.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, above) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fcntl just returned this new fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// `posix_spawn_file_actions_t`, destroyed on drop.
struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<Self> {
        // SAFETY: an all-zero value is only storage; init fills it in
        // before any other use, and Drop destroys it only after init.
        let mut actions = FileActions(unsafe { std::mem::zeroed() });
        // SAFETY: a valid pointer to storage for the actions.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions.0) })?;
        Ok(actions)
    }

    fn dup2(&self, fd: RawFd, target: RawFd) -> io::Result<()> {
        let actions = std::ptr::addr_of!(self.0).cast_mut();
        // SAFETY: initialized actions, which only this thread uses.
        check(unsafe { libc::posix_spawn_file_actions_adddup2(actions, fd, target) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialized in new, destroyed once.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

/// `posix_spawnattr_t`: the child starts with the signals it forwards
/// blocked, for it to take them with sigtimedwait (`signals`: none may end
/// it before it can pass it on; the job unblocks them all), these,
/// SIGTTIN, SIGTTOU (`confine run` ignores them) and SIGPIPE at their
/// default action (we ignore it, as every Rust program
/// does; an ignored signal stays ignored across execve, and the job, a
/// pipeline's `yes`, must die of it), in a process group of its own: a
/// terminal's signals (Ctrl-C, Ctrl-Z) reach the supervisor alone, which
/// forwards what they mean once, and never the sandbox behind its back.
struct SpawnAttr(libc::posix_spawnattr_t);

impl SpawnAttr {
    fn new() -> io::Result<Self> {
        // SAFETY: as FileActions::new: storage, initialized before use.
        let mut attr = SpawnAttr(unsafe { std::mem::zeroed() });
        // SAFETY: valid pointers to initialized storage throughout; the
        // signal sets are plain values filled by sigemptyset/sigaddset.
        unsafe {
            check(libc::posix_spawnattr_init(&mut attr.0))?;
            let blocked = super::signals::stage_set();
            check(libc::posix_spawnattr_setsigmask(&mut attr.0, &blocked))?;
            let mut default = super::signals::stage_set();
            libc::sigaddset(&mut default, libc::SIGPIPE);
            libc::sigaddset(&mut default, libc::SIGTTIN);
            libc::sigaddset(&mut default, libc::SIGTTOU);
            check(libc::posix_spawnattr_setsigdefault(&mut attr.0, &default))?;
            check(libc::posix_spawnattr_setpgroup(&mut attr.0, 0))?;
            let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF | libc::POSIX_SPAWN_SETPGROUP;
            check(libc::posix_spawnattr_setflags(&mut attr.0, flags as libc::c_short))?;
        }
        Ok(attr)
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: initialized in new, destroyed once.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// posix_spawn's functions return an error number instead of setting errno.
fn check(rc: libc::c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

#[cfg(test)]
mod tests;
