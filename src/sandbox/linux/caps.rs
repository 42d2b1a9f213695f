//! Capabilities: the job process drops every one of them, in all five sets,
//! right before it is confined by landlock and seccomp.

use super::sys::SysError;
use caps::CapSet;
use nix::errno::Errno;

/// Clear the bounding, ambient, inheritable, effective and permitted sets.
/// The bounding set goes first: dropping from it needs CAP_SETPCAP, which
/// the effective set still holds at that point.
pub fn drop_all() -> Result<(), SysError> {
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
