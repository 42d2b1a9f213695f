//! Capabilities: the job process drops every one of them, in all five sets,
//! right before it is confined by landlock and seccomp.

use super::sys::SysError;
use caps::CapSet;
use nix::errno::Errno;

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;

/// Clear the bounding, ambient, inheritable, effective and permitted sets.
/// The bounding set goes first: dropping from it needs CAP_SETPCAP, which
/// the effective set still holds at that point.
pub fn drop_all() -> Result<(), SysError> {
    // uid 0 inside (`--user 0`) gains nothing by an execve either, and
    // can't undo that: the kernel's "root gets every capability at exec"
    // is off and locked. (An empty bounding set and no_new_privs would
    // stop it too; each holds alone.) Needs CAP_SETPCAP, held until below.
    // SAFETY: PR_GET_SECUREBITS takes no further arguments.
    let bits = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    let bits = Errno::result(bits).map_err(|e| SysError::call("read securebits", e))? as libc::c_ulong;
    // SAFETY: PR_SET_SECUREBITS takes an integer and no pointers.
    let ret = unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits | SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0) };
    Errno::result(ret).map_err(|e| SysError::call("set SECBIT_NOROOT", e))?;
    // Capabilities newer than the running kernel can't be named (EINVAL).
    for cap in caps::runtime::thread_all_supported() {
        caps::drop(None, CapSet::Bounding, cap)
            .map_err(|_| SysError::call("drop bounding capability", Errno::EPERM))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|_| SysError::call("clear ambient capabilities", Errno::EPERM))?;
    caps::clear(None, CapSet::Inheritable)
        .map_err(|_| SysError::call("clear inheritable capabilities", Errno::EPERM))?;
    caps::clear(None, CapSet::Effective).map_err(|_| SysError::call("clear effective capabilities", Errno::EPERM))?;
    caps::clear(None, CapSet::Permitted).map_err(|_| SysError::call("clear permitted capabilities", Errno::EPERM))?;
    Ok(())
}
