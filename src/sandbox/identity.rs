//! Which host ids a job runs as. Never a privileged one: not root, not a
//! system account, never a group of the host (a workspace in group
//! `shadow` once let a job read `/etc/shadow`), and no supplementary
//! groups. The group is always `nogroup`.
//!
//! As root, the uid is the workspace owner's when that owner is an
//! ordinary user (uid 1000 and up, as `useradd` hands them out on Debian,
//! Ubuntu, Fedora and RHEL): files a job writes to a `--rw` workspace then
//! belong to the project's owner. A system account (`postgres` owning
//! `/srv/db`) is refused that way: it may own files the sandbox shows,
//! under `/etc` for one. Otherwise, and for root-owned workspaces, the job
//! is `nobody`. Rootless, our own ids are the only ones we can map.

use std::path::Path;

/// The overflow ids (`nobody`, `nogroup`).
pub const NOBODY: u32 = 65534;

/// The first uid of an ordinary user (`UID_MIN` of login.defs).
pub const FIRST_USER_UID: u32 = 1000;

/// The host uid and gid of a job whose supervisor is root.
pub fn as_root(workspace: Option<&Path>) -> (u32, u32) {
    #[cfg(unix)]
    let owner = {
        use std::os::unix::fs::MetadataExt;
        workspace.and_then(|w| std::fs::metadata(w).ok()).map(|m| m.uid())
    };
    #[cfg(not(unix))]
    let owner: Option<u32> = {
        let _ = workspace;
        None
    };
    as_root_for(owner)
}

/// [`as_root`] for a workspace whose owner (symlinks followed) is
/// `owner`, None when there is no workspace or it can't be read: the
/// decision alone, for callers that look the owner up themselves.
pub fn as_root_for(owner: Option<u32>) -> (u32, u32) {
    match owner {
        Some(uid) if ordinary_user(uid) => (uid, NOBODY),
        _ => (NOBODY, NOBODY),
    }
}

/// Whether `uid` is an ordinary user's: neither root nor a system account
/// nor the overflow id.
pub fn ordinary_user(uid: u32) -> bool {
    uid >= FIRST_USER_UID && uid != NOBODY && uid != u32::MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_accounts_and_root_become_nobody_and_the_group_never_passes() {
        assert!(!ordinary_user(0));
        assert!(!ordinary_user(42));
        assert!(!ordinary_user(999));
        assert!(ordinary_user(1000));
        assert!(!ordinary_user(NOBODY));
        let dir = tempfile::tempdir().unwrap();
        // A tempdir of ours: owned by whoever runs the tests.
        let (uid, gid) = as_root(Some(dir.path()));
        assert_eq!(gid, NOBODY);
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(uid, if ordinary_user(me) { me } else { NOBODY });
        assert_eq!(as_root(None), (NOBODY, NOBODY));
        assert_eq!(as_root_for(Some(1000)), (1000, NOBODY));
        assert_eq!(as_root_for(Some(0)), (NOBODY, NOBODY));
    }
}
