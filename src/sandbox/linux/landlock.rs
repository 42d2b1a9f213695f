//! Landlock: the job's filesystem rules and its scopes (abstract unix
//! sockets, signals), applied by the job process after `pivot_root`, so
//! every rule points at the sandbox's own inodes (a ruleset built against
//! the host's /proc would not). The network is the network namespace's
//! (`landlock_plan` says why landlock adds no TCP rule).
//!
//! Best effort above ABI v1, which is a hard requirement whenever the
//! kernel has landlock at all. The status the kernel reports and the rules
//! that could not be added are returned, never hidden.

use super::protocol::LandlockPlan;
use super::sys::SysError;
use crate::job::LandlockLayer;
use landlock::{
    Access, AccessFs, CompatLevel, Compatible, LandlockStatus, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::path::Path;

/// The newest ABI whose semantics confine has been tested against.
pub const TARGET_ABI: ABI = ABI::V7;

/// Device nodes of the minimal /dev the job must be able to write to and
/// use as terminals (`ioctl`): `/dev/tty` is the opener's own controlling
/// terminal, and `/dev/pts` the job's own devpts instance, `ptmx` and all
/// (`/dev/ptmx` is a link to it). `/dev/console` too, when the job has a
/// terminal of its own there (`--tty`).
const WRITABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/pts"];

const NOT_AVAILABLE: &str = "not available on this kernel (Linux 5.13 or later with landlock in the LSM list: \
lsm=landlock,… on the kernel command line), or pass --allow-degraded to run without it";

fn err(step: &'static str, e: impl std::fmt::Display) -> SysError {
    SysError::other(step, e)
}

/// Build and enforce the ruleset on the calling thread (inherited by exec).
pub fn apply(plan: &LandlockPlan, allow_degraded: bool) -> Result<LandlockLayer, SysError> {
    // A kernel without landlock (before 5.13, or not in the LSM list):
    // ABI v1 can't be a requirement of a ruleset that can't exist. The
    // job runs without it only when degraded mode was asked for.
    if kernel_abi() == 0 {
        if allow_degraded {
            return Ok(LandlockLayer { abi: 0, status: "none".into(), skipped: Vec::new() });
        }
        return Err(SysError::other("landlock", NOT_AVAILABLE));
    }
    let abi = TARGET_ABI;
    let mut ruleset = Ruleset::default()
        // ABI v1's filesystem rights are the floor: if landlock exists, they hold.
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V1))
        .map_err(|e| err("landlock: handle ABI v1 rights", e))?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(|e| err("landlock: handle filesystem rights", e))?;
    if plan.scope {
        ruleset = ruleset.scope(Scope::AbstractUnixSocket | Scope::Signal).map_err(|e| err("landlock: scope", e))?;
    }
    let mut created = ruleset.create().map_err(|e| err("landlock: create ruleset", e))?;
    let mut skipped = Vec::new();
    let read = AccessFs::from_read(abi);
    let all = AccessFs::from_all(abi);
    // Directories are listable from the root down; their files are not readable by this.
    let mut rules: Vec<(&Path, _)> = vec![(Path::new("/"), AccessFs::ReadDir.into())];
    rules.extend(plan.read.iter().map(|p| (p.as_path(), read)));
    rules.extend(plan.write.iter().map(|p| (p.as_path(), all)));
    let device_rights = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::IoctlDev;
    rules.extend(WRITABLE_DEVICES.iter().map(|d| (Path::new(*d), device_rights)));
    if plan.tty {
        rules.push((Path::new("/dev/console"), device_rights));
    }
    let file_rights = AccessFs::from_file(abi);
    for (path, access) in rules {
        // Directory-only rights on a file would downgrade the whole ruleset
        // to "partial"; a file rule gets the file rights it asked for.
        let access = if path.is_dir() { access } else { access & file_rights };
        match PathFd::new(path) {
            Ok(fd) => {
                created = created.add_rule(PathBeneath::new(fd, access)).map_err(|e| err("landlock: add rule", e))?;
            }
            Err(_) => skipped.push(path.display().to_string()),
        }
    }
    let status = created.restrict_self().map_err(|e| err("landlock: restrict self", e))?;
    let enforced_abi = match status.landlock {
        LandlockStatus::Available { effective_abi, .. } => (effective_abi.min(abi)) as u32,
        _ => 0,
    };
    let status_name = match status.ruleset {
        RulesetStatus::FullyEnforced => "full",
        RulesetStatus::PartiallyEnforced => "partial",
        _ => "none",
    };
    if status_name == "none" && !allow_degraded {
        return Err(SysError::other("landlock", NOT_AVAILABLE));
    }
    Ok(LandlockLayer { abi: enforced_abi, status: status_name.into(), skipped })
}

/// The status a job's ruleset gets on a kernel offering `kernel_abi`:
/// `none` without landlock; `full` when that ABI has every right and scope
/// confine asks for (ABI 7 added none: only logging); else `partial`.
pub fn expected_status(kernel_abi: u32) -> &'static str {
    if kernel_abi == 0 {
        return "none";
    }
    if kernel_abi >= TARGET_ABI as u32 {
        return "full";
    }
    let kernel = ABI::from(kernel_abi as i32);
    let same = AccessFs::from_all(kernel) == AccessFs::from_all(TARGET_ABI)
        && Scope::from_all(kernel) == Scope::from_all(TARGET_ABI);
    if same {
        "full"
    } else {
        "partial"
    }
}

/// The ABI the running kernel offers (0 when landlock is absent or off).
pub fn kernel_abi() -> u32 {
    // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with a null attr and size 0
    // only queries the version; no memory is read or written.
    let ret = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, 0usize, 0usize, 1u32) };
    if ret < 0 {
        0
    } else {
        ret as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_expected_follows_the_rights_each_abi_has() {
        assert_eq!(expected_status(0), "none");
        assert_eq!(expected_status(2), "partial", "no truncate, ioctl or scopes");
        assert_eq!(expected_status(5), "partial", "no scopes");
        assert_eq!(expected_status(6), "full", "ABI 7 added only logging");
        assert_eq!(expected_status(TARGET_ABI as u32), "full");
        assert_eq!(expected_status(99), "full");
    }
}
