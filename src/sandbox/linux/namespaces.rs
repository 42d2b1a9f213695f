//! Namespace creation flags, uid/gid maps, the switch to the mapped ids,
//! and the job's own user namespace nested in the sandbox's, which locks
//! the sandbox's mounts ([`clone_nested`]).
//!
//! The maps are written by the outer init stage, which stays in the parent
//! user namespace (as bwrap and runc do): only a writer there may map an id
//! other than its own. The child then *really* switches to the mapped ids;
//! a process that keeps its host credentials in a user namespace where they
//! are unmapped can't create a file (EOVERFLOW).

use super::protocol::{IdMap, InitSpec};
use super::sys::SysError;
use nix::errno::Errno;
use nix::unistd::{setgroups, setresgid, setresuid, Gid, Pid, Uid};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// The clone flags of a job: every namespace, the network one on request.
pub fn clone_flags(spec: &InitSpec) -> libc::c_int {
    let mut flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWCGROUP;
    if spec.new_netns {
        flags |= libc::CLONE_NEWNET;
    }
    flags
}

fn write_proc(pid: Pid, file: &str, content: &str) -> Result<(), SysError> {
    let path = format!("/proc/{}/{}", pid.as_raw(), file);
    std::fs::write(&path, content).map_err(|e| SysError::io("write", Path::new(&path), e))
}

/// Write `child`'s uid and gid maps from the parent user namespace. A rootless
/// writer must first deny setgroups, or the kernel refuses the gid map.
pub fn write_id_maps(child: Pid, uid: IdMap, gid: IdMap, rootless: bool) -> Result<(), SysError> {
    write_proc(child, "uid_map", &format!("{} {} 1\n", uid.inside, uid.outside))?;
    if rootless {
        write_proc(child, "setgroups", "deny")?;
    }
    write_proc(child, "gid_map", &format!("{} {} 1\n", gid.inside, gid.outside))
}

/// Become the mapped ids. Dropping host supplementary groups matters as root:
/// they are kernel gids and would otherwise follow the job (e.g. gid 0).
/// Capabilities in the new namespace survive the switch, since the old
/// uid was not the namespace's root.
pub fn become_mapped(uid: IdMap, gid: IdMap, rootless: bool) -> Result<(), SysError> {
    if !rootless {
        setgroups(&[]).map_err(|e| SysError::call("setgroups", e))?;
    }
    let g = Gid::from_raw(gid.inside);
    setresgid(g, g, g).map_err(|e| SysError::call("setresgid", e))?;
    let u = Uid::from_raw(uid.inside);
    setresuid(u, u, u).map_err(|e| SysError::call("setresuid", e))
}

/// The first of the host uids that own jobs' user namespaces. The kernel
/// charges what a process allocates in a user namespace (inotify
/// instances and watches, namespaces, queued signals, message queue bytes)
/// to the namespace's owner in the parent namespace as well: owned by
/// root, every job's share came out of root's own limits (eight jobs took
/// all of root's 128 inotify instances). Each job's namespace is owned by
/// a uid of its own from this range instead, which no process of the host
/// runs as: systemd's UID allocation leaves 0x70000000–0x7FFDFFFF unused
/// (below its "foreign" range), and user databases and container ranges
/// (subuid, nspawn's 0x80000–0x6FFFFFFF) stay below it. The owner has
/// every capability over the namespace from outside; a uid nothing runs
/// as hands that to nobody.
pub const USERNS_OWNER_BASE: u32 = 0x7C00_0000;
/// How many owner uids jobs draw from at random (two jobs that draw the
/// same one share those counters, nothing more).
pub const USERNS_OWNER_SLOTS: u32 = 1 << 20;

const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;

/// The outer stage (host root) with `uid` as its effective uid, for the
/// clone that creates the job's user namespace, which then belongs to
/// `uid`. `SECBIT_NO_SETUID_FIXUP` keeps the capabilities a uid change
/// would clear: joining the job's cgroup at birth (`CLONE_INTO_CGROUP`)
/// needs them, and so does AppArmor's mediation of user namespaces on
/// Ubuntu. [`AsOwner::leave`] goes back to root; the cloned child must
/// `std::mem::forget` its copy (its credentials are the new namespace's).
pub struct AsOwner {
    securebits: libc::c_ulong,
}

impl AsOwner {
    pub fn enter(uid: u32) -> Result<AsOwner, SysError> {
        // SAFETY: PR_GET_SECUREBITS takes no further arguments.
        let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
        let securebits = Errno::result(bits).map_err(|e| SysError::call("read securebits", e))? as libc::c_ulong;
        // SAFETY: PR_SET_SECUREBITS takes an integer and no pointers.
        let ret = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, securebits | SECBIT_NO_SETUID_FIXUP, 0, 0, 0) };
        Errno::result(ret).map_err(|e| SysError::call("keep capabilities across a uid change", e))?;
        let guard = AsOwner { securebits };
        // SAFETY: setresuid takes integers; -1 keeps the real and saved ids (0).
        let ret = unsafe { libc::setresuid(u32::MAX, uid, u32::MAX) };
        Errno::result(ret).map_err(|e| SysError::call("take the namespace owner's uid", e))?;
        Ok(guard)
    }

    /// Back to root, with the securebits as they were; the parent-death
    /// signal, which a credential change clears, is armed again.
    pub fn leave(self) -> Result<(), SysError> {
        let securebits = self.securebits;
        std::mem::forget(self);
        restore(securebits)
    }
}

fn restore(securebits: libc::c_ulong) -> Result<(), SysError> {
    // SAFETY: setresuid takes integers; the saved uid is 0, so this is allowed.
    let ret = unsafe { libc::setresuid(u32::MAX, 0, u32::MAX) };
    Errno::result(ret).map_err(|e| SysError::call("return to root after the clone", e))?;
    // SAFETY: PR_SET_SECUREBITS takes an integer and no pointers.
    let ret = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, securebits, 0, 0, 0) };
    Errno::result(ret).map_err(|e| SysError::call("restore securebits", e))?;
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and no pointers.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    Ok(())
}

impl Drop for AsOwner {
    /// An early return (an error between enter and leave): back to root.
    fn drop(&mut self) {
        let _ = restore(self.securebits);
    }
}

/// A user namespace for an idmapped mount: files that `disk` (uid, gid)
/// owns on the file system show as owned by `job` (the job's host ids),
/// and what the job creates there lands as `disk`. No other id is mapped:
/// files of anyone else show as the overflow id and are not the job's.
///
/// Made by the outer stage, as host root (only a writer with CAP_SETUID
/// over the parent namespace may map ids other than its own): a child is
/// cloned into a new user namespace and waits on a pipe while its maps are
/// written and its `ns/user` is opened, then exits. The namespace lives on
/// with the mounts that use it.
pub fn idmap_userns(disk: (u32, u32), job: (u32, u32)) -> Result<std::os::fd::OwnedFd, SysError> {
    use std::os::fd::AsFd;
    let (wait_rd, wait_wr) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| SysError::call("pipe for an idmap", e))?;
    let pid = super::sys::clone_fork(libc::CLONE_NEWUSER).map_err(|e| SysError::call("clone an idmap namespace", e))?;
    if pid == 0 {
        drop(wait_wr);
        let mut byte = [0u8; 1];
        // Returns at EOF, when the parent is done with us (or died).
        let _ = nix::unistd::read(wait_rd.as_fd(), &mut byte);
        // SAFETY: _exit ends this cloned child without running any of the
        // outer stage's exit handlers.
        unsafe { libc::_exit(0) }
    }
    drop(wait_rd);
    let child = Pid::from_raw(pid);
    let made = write_proc(child, "uid_map", &format!("{} {} 1\n", disk.0, job.0))
        .and_then(|()| write_proc(child, "gid_map", &format!("{} {} 1\n", disk.1, job.1)))
        .and_then(|()| {
            let path = format!("/proc/{pid}/ns/user");
            std::fs::File::open(&path)
                .map(std::os::fd::OwnedFd::from)
                .map_err(|e| SysError::io("open the idmap namespace", Path::new(&path), e))
        });
    drop(wait_wr);
    let _ = nix::sys::wait::waitpid(child, None);
    made
}

/// The job's end of [`clone_nested`], or pid 1's.
pub enum Nested {
    /// In the job process: its user namespace is new, its mount namespace
    /// still pid 1's.
    Job(NestedJob),
    /// In pid 1: the job's pid.
    Pid1(NestedPid1),
}

/// What the job process does before the rest of its confinement.
pub struct NestedJob {
    ready: OwnedFd,
    go: OwnedFd,
}

/// pid 1's hold on a job process made by [`clone_nested`].
pub struct NestedPid1 {
    pid: Pid,
    ready: OwnedFd,
    go: OwnedFd,
}

/// Why a job got no user namespace of its own.
pub enum NotNested {
    /// The kernel or an LSM refused it (AppArmor's restriction of user
    /// namespaces, a low `user.max_user_namespaces`): with
    /// `--allow-degraded` the job runs without the lock, said so.
    Refused(String),
    Failed(SysError),
}

/// What [`NestedPid1::ready`] learnt.
pub enum Readiness {
    Ready,
    /// The job could not set its namespace's counters for want of a
    /// capability there (an LSM denies them in nested namespaces); it has
    /// ended.
    Refused,
    /// The job failed, has reported why, and has ended.
    Ended,
}

const READY: u8 = 1;
const REFUSED: u8 = 2;
/// pid 1's go to a job that has all it needs (cloned after the request).
pub const GO: u8 = 1;
/// pid 1's go to a warm sandbox's job, cloned before its request: the
/// request follows on [`NestedJob::channel`].
pub const REQUEST: u8 = 2;

/// Clone the job process into a user namespace of its own, nested in the
/// sandbox's (pid 1's); the job maps its ids to themselves there
/// ([`NestedJob::enter`]).
///
/// Why: the kernel locks mounts (`MNT_LOCKED`, and their read-only and
/// other flags) only when it copies them into a mount namespace owned by
/// a less privileged user namespace. pid 1 built the sandbox's mounts in
/// the sandbox's namespace, where it held every capability, so they are
/// not locked there: whatever regained CAP_SYS_ADMIN in that namespace
/// could unmount a host mount below the workspace, or a mask, or make a
/// read-only bind writable. The job's mount namespace, copied at
/// [`NestedPid1::release`] from its own user namespace, has every one of
/// them locked; and the job holds no capability over the sandbox's
/// network, UTS and IPC namespaces at all, which belong to pid 1's.
///
/// Called before the pivot: the job sets its namespace's counters through
/// the host's /proc, which the pivot takes away (the sandbox's /proc/sys
/// is read-only). pid 1 sets its own after this clone, so that its
/// `max_user_namespaces` of 0 does not refuse this one.
pub fn clone_nested() -> Result<Nested, NotNested> {
    use nix::fcntl::OFlag;
    let failed = NotNested::Failed;
    let (ready_rd, ready_wr) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| failed(SysError::call("pipe", e)))?;
    // A socket, not a pipe: a warm sandbox's job gets its request on it,
    // its streams included (`SCM_RIGHTS`).
    let (go_rd, go_wr) = nix::sys::socket::socketpair(
        nix::sys::socket::AddressFamily::Unix,
        nix::sys::socket::SockType::Stream,
        None,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| failed(SysError::call("socketpair", e)))?;
    let cloned = match crate::crashpoint::refused("nested-userns") {
        true => Err(Errno::EPERM),
        false => super::sys::clone_fork(libc::CLONE_NEWUSER),
    };
    let pid = match cloned {
        Ok(0) => return Ok(Nested::Job(NestedJob { ready: ready_wr, go: go_rd })),
        Ok(pid) => Pid::from_raw(pid),
        Err(e @ (Errno::EPERM | Errno::EACCES | Errno::ENOSPC | Errno::EUSERS)) => {
            return Err(NotNested::Refused(format!("a user namespace for the job inside the sandbox's: {}", e.desc())))
        }
        Err(e) => return Err(failed(SysError::call("clone the job into a user namespace of its own", e))),
    };
    Ok(Nested::Pid1(NestedPid1 { pid, ready: ready_rd, go: go_wr }))
}

/// Whether a failed write in the job's new namespace was a refusal (a
/// capability or a file an LSM denies there) rather than a fault.
fn refused(e: &SysError) -> bool {
    matches!(e, SysError::Io { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied)
}

impl NestedJob {
    /// Map the job's own ids (the only mapping a process may write for
    /// itself without a capability in the parent namespace; its gid's
    /// needs setgroups denied, and the job has no CAP_SETGID to call it
    /// anyway). Its /proc files are writable by it only while it is
    /// dumpable: a process that changed its ids (pid 1 did) is not, and
    /// its files belong to a root that is not mapped here. Through
    /// /proc/self, which is the host's /proc or the sandbox's, whichever
    /// side of pid 1's pivot this runs on.
    fn map_ids(uid: IdMap, gid: IdMap) -> Result<(), SysError> {
        let write_self = |file: &str, content: &str| {
            let path = Path::new("/proc/self").join(file);
            std::fs::write(&path, content).map_err(|e| SysError::io("write", &path, e))
        };
        super::sys::set_dumpable(true)?;
        let mapped = write_self("setgroups", "deny")
            .and_then(|()| write_self("uid_map", &format!("{0} {0} 1\n", uid.inside)))
            .and_then(|()| write_self("gid_map", &format!("{0} {0} 1\n", gid.inside)));
        super::sys::set_dumpable(false)?;
        mapped
    }

    /// In the job process: cap its namespace's counters as pid 1 caps its
    /// own (through the host's /proc: before pid 1's pivot, which waits
    /// for this), tell pid 1, and map its ids while pid 1 goes on. An
    /// error here is the job's to report. `Ok(false)`: the limits were
    /// refused (an LSM that denies capabilities in nested namespaces
    /// denies that first), and pid 1 knows.
    pub fn prepare(&self, uid: IdMap, gid: IdMap) -> Result<bool, SysError> {
        let limited = match crate::crashpoint::refused("nested-userns-caps") {
            true => {
                Err(SysError::io("write", Path::new("/proc/sys/user"), std::io::ErrorKind::PermissionDenied.into()))
            }
            false => super::inherit::limit_ucounts(),
        };
        match limited {
            Ok(()) => {}
            Err(e) if refused(&e) => {
                let _ = nix::unistd::write(&self.ready, &[REFUSED]);
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        nix::unistd::write(&self.ready, &[READY]).map_err(|e| SysError::call("tell pid 1 the job is ready", e))?;
        Self::map_ids(uid, gid)?;
        Ok(true)
    }

    /// pid 1's go: [`GO`], [`REQUEST`], or `None` if pid 1 let the job go
    /// unstarted (it closed the socket).
    pub fn wait(&self) -> Result<Option<u8>, SysError> {
        let mut byte = [0u8; 1];
        let n = loop {
            match nix::unistd::read(self.go.as_fd(), &mut byte) {
                Err(Errno::EINTR) => continue,
                r => break r.map_err(|e| SysError::call("wait for pid 1", e))?,
            }
        };
        Ok((n == 1).then_some(byte[0]))
    }

    /// The socket pid 1's go and a warm job's request come on.
    pub fn channel(&self) -> &OwnedFd {
        &self.go
    }

    /// A mount namespace of the job's own: a copy of the finished tree,
    /// made from its user namespace, so every mount in it is locked.
    pub fn lock(self) -> Result<(), SysError> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(|e| SysError::call("lock the sandbox's mounts (a mount namespace of the job's own)", e))
    }

    /// [`prepare`](Self::prepare), pid 1's [`GO`], [`lock`](Self::lock):
    /// a job cloned when all it needs was known. `Ok(false)`: the job must
    /// not go on (refused, or let go unstarted).
    pub fn enter(self, uid: IdMap, gid: IdMap) -> Result<bool, SysError> {
        if !self.prepare(uid, gid)? || self.wait()? != Some(GO) {
            return Ok(false);
        }
        self.lock()?;
        Ok(true)
    }
}

impl NestedPid1 {
    /// Wait until the job has set its counters.
    pub fn ready(&self) -> Result<Readiness, SysError> {
        let mut byte = [0u8; 1];
        let n = loop {
            match nix::unistd::read(self.ready.as_fd(), &mut byte) {
                Err(Errno::EINTR) => continue,
                r => break r.map_err(|e| SysError::call("wait for the job's namespace", e))?,
            }
        };
        let gone = match (n, byte[0]) {
            (1, READY) => return Ok(Readiness::Ready),
            (1, REFUSED) => Readiness::Refused,
            _ => Readiness::Ended,
        };
        let _ = nix::sys::wait::waitpid(self.pid, None);
        Ok(gone)
    }

    /// Let the job go on: it makes its mount namespace and confines itself.
    /// EPIPE: the job failed after it was ready, and has reported why;
    /// pid 1 reaps it as any job.
    pub fn release(self) -> Result<Pid, SysError> {
        match nix::unistd::write(&self.go, &[GO]) {
            Ok(_) | Err(Errno::EPIPE) => Ok(self.pid),
            Err(e) => Err(SysError::call("release the job", e)),
        }
    }

    /// The socket the job waits on ([`NestedJob::channel`]).
    pub fn channel(&self) -> &OwnedFd {
        &self.go
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Whether the job is alive and at pid 1's own nice value (a warm
    /// sandbox's job, cloned while the base built at a lower priority,
    /// and reniced with pid 1 at the request).
    pub fn fits(&self) -> bool {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        if !matches!(waitpid(self.pid, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive)) {
            return false;
        }
        let nice = |who: libc::pid_t| {
            Errno::clear();
            // SAFETY: getpriority takes integers; -1 is a valid value,
            // told apart from an error by errno, cleared above.
            let n = unsafe { libc::getpriority(libc::PRIO_PROCESS, who as libc::id_t) };
            (Errno::last_raw() == 0).then_some(n)
        };
        nice(self.pid.as_raw()).is_some_and(|n| Some(n) == nice(0))
    }

    /// The job must not start: killed and reaped.
    pub fn abandon(self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(self.pid, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_namespace_only_on_request() {
        let mut spec: InitSpec = serde_json::from_value(serde_json::json!({
            "argv": ["true"], "env": [], "cwd": "/", "hostname": "h", "newNetns": true,
            "uid": {"inside": 1, "outside": 1}, "gid": {"inside": 1, "outside": 1},
            "rootless": false, "mounts": [], "cgroupProcs": [], "rlimits": [],
            "landlock": null, "seccomp": null, "allowDegraded": false
        }))
        .unwrap();
        assert_ne!(clone_flags(&spec) & libc::CLONE_NEWNET, 0);
        spec.new_netns = false;
        assert_eq!(clone_flags(&spec) & libc::CLONE_NEWNET, 0);
        assert_ne!(clone_flags(&spec) & libc::CLONE_NEWUSER, 0);
    }
}
