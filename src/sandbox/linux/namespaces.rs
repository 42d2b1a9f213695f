//! Namespace creation flags, uid/gid maps, and the switch to the mapped ids.
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
