//! Resource limits set with setrlimit in the job process: a second line
//! behind the cgroup limits, and the only one in rootless mode without a
//! delegated cgroup.

use super::protocol::Rlimit;
use super::sys::SysError;
use nix::errno::Errno;

pub fn apply(limits: &[Rlimit]) -> Result<(), SysError> {
    for l in limits {
        let rl = libc::rlimit { rlim_cur: l.soft, rlim_max: l.hard };
        // SAFETY: rl is a valid rlimit we own; setrlimit only reads it.
        let ret = unsafe { libc::setrlimit(l.resource as _, &rl) };
        Errno::result(ret).map_err(|e| SysError::call("setrlimit", e))?;
    }
    Ok(())
}
