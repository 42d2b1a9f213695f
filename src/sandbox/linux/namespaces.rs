//! Namespace creation flags, uid/gid maps, and the switch to the mapped ids.
//!
//! The maps are written by the outer init stage, which stays in the parent
//! user namespace (as bwrap and runc do): only a writer there may map an id
//! other than its own. The child then *really* switches to the mapped ids;
//! a process that keeps its host credentials in a user namespace where they
//! are unmapped can't create a file (EOVERFLOW).

use super::protocol::{IdMap, InitSpec};
use super::sys::SysError;
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
