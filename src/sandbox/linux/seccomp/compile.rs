//! From a [`Plan`] to a libseccomp filter for the native architecture, and
//! from there to BPF. Owns syscall name resolution and the checks that
//! keep libseccomp from silently weakening a profile.
//!
//! libseccomp keeps only the unconditional rule of a syscall that has both
//! an unconditional rule and conditional ones (in either order), and keeps
//! the first of two unconditional rules: a profile that allows `ioctl` and
//! denies `ioctl(TIOCSTI)` would quietly allow TIOCSTI. Such profiles are
//! refused here, naming both entries.

use super::profile::{Action, Cond, Op, Plan, Rule};
use super::SeccompError;
use libseccomp::{ScmpAction, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use std::collections::BTreeMap;
use std::os::fd::AsFd;

/// How a syscall name resolves on this architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallNumber {
    /// The syscall number on this architecture.
    Native(i32),
    /// A real syscall, but of other architectures only: rules for it are moot.
    Elsewhere,
}

/// Resolve a name with libseccomp, then with [`newer_syscall`] for calls
/// newer than the libseccomp we were built with. `None`: no such syscall.
pub fn resolve(name: &str) -> Option<SyscallNumber> {
    match ScmpSyscall::from_name(name) {
        // libseccomp gives names of other architectures negative numbers.
        Ok(nr) if nr.as_raw_syscall() < 0 => Some(SyscallNumber::Elsewhere),
        Ok(nr) => Some(SyscallNumber::Native(nr.as_raw_syscall())),
        Err(_) => newer_syscall(name).map(|nr| nr.map_or(SyscallNumber::Elsewhere, SyscallNumber::Native)),
    }
}

/// Syscalls newer than libseccomp 2.5.4 (Debian 12's), which Docker's
/// profile already names: `Some(Some(nr))` on this architecture,
/// `Some(None)` when they exist only on others. From the kernel's
/// `syscall_64.tbl` and `asm-generic/unistd.h`; since 5.1 new syscalls get
/// the same number on every architecture but alpha and mips. Other
/// architectures have no table, so these names are errors there rather
/// than guesses.
pub fn newer_syscall(name: &str) -> Option<Option<i32>> {
    const UNIFIED: &[(&str, i32)] = &[
        ("statmount", 457),
        ("listmount", 458),
        ("lsm_get_self_attr", 459),
        ("lsm_set_self_attr", 460),
        ("lsm_list_modules", 461),
        ("mseal", 462),
        ("setxattrat", 463),
        ("getxattrat", 464),
        ("listxattrat", 465),
        ("removexattrat", 466),
        ("open_tree_attr", 467),
        ("file_getattr", 468),
        ("file_setattr", 469),
        ("listns", 470),
    ];
    const TABLED: bool = cfg!(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64"));
    if let Some((_, nr)) = UNIFIED.iter().find(|(n, _)| *n == name) {
        return TABLED.then_some(Some(*nr));
    }
    let (x86_64, riscv64) = match name {
        "uretprobe" => (Some(335), None),
        "uprobe" => (Some(336), None),
        "riscv_hwprobe" => (None, Some(258)),
        _ => return None,
    };
    if !TABLED {
        return None;
    }
    Some(if cfg!(target_arch = "x86_64") {
        x86_64
    } else if cfg!(target_arch = "riscv64") {
        riscv64
    } else {
        None
    })
}

/// What every filter does with a syscall of a foreign architecture (i386
/// via `int 0x80`, x32 on x86_64): kill the whole process. Only the native
/// architecture is in the filter, and an ordinary program never makes such
/// a call, so one is an attack or a 32-bit binary that could not work anyway.
pub const BAD_ARCH: Action = Action::KillProcess;

fn scmp_action(a: Action) -> ScmpAction {
    match a {
        Action::Allow => ScmpAction::Allow,
        Action::Log => ScmpAction::Log,
        Action::Errno(n) => ScmpAction::Errno(i32::from(n)),
        Action::Trace(n) => ScmpAction::Trace(n),
        Action::Trap => ScmpAction::Trap,
        Action::KillThread => ScmpAction::KillThread,
        Action::KillProcess => ScmpAction::KillProcess,
    }
}

fn scmp_cond(c: &Cond) -> ScmpArgCompare {
    let op = match c.op {
        Op::Ne => ScmpCompareOp::NotEqual,
        Op::Lt => ScmpCompareOp::Less,
        Op::Le => ScmpCompareOp::LessOrEqual,
        Op::Eq => ScmpCompareOp::Equal,
        Op::Ge => ScmpCompareOp::GreaterEqual,
        Op::Gt => ScmpCompareOp::Greater,
        Op::MaskedEq(mask) => ScmpCompareOp::MaskedEqual(mask),
    };
    ScmpArgCompare::new(c.index, op, c.value)
}

/// The rules of one syscall number, in profile order.
pub(super) struct PerSyscall<'a> {
    pub(super) unconditional: Option<&'a Rule>,
    pub(super) conditional: Vec<&'a Rule>,
}

/// Group the plan's rules by syscall number, dropping names of other
/// architectures, and refuse what libseccomp would silently reduce.
pub(super) fn group<'a>(file: &str, plan: &'a Plan) -> Result<BTreeMap<i32, PerSyscall<'a>>, SeccompError> {
    let mut by_nr: BTreeMap<i32, PerSyscall<'a>> = BTreeMap::new();
    for rule in &plan.rules {
        let nr = match resolve(&rule.name) {
            Some(SyscallNumber::Native(nr)) => nr,
            Some(SyscallNumber::Elsewhere) => continue,
            None => {
                return Err(SeccompError::Rule {
                    file: file.into(),
                    index: rule.entry,
                    name: rule.name.clone(),
                    reason: "unknown syscall name (neither libseccomp nor confine knows it): \
                             fix the spelling, or remove it if the syscall is newer than libseccomp"
                        .into(),
                });
            }
        };
        let slot = by_nr.entry(nr).or_insert(PerSyscall { unconditional: None, conditional: Vec::new() });
        let conflict = |other: &Rule, what: &str| SeccompError::Rule {
            file: file.into(),
            index: rule.entry,
            name: rule.name.clone(),
            reason: format!(
                "{what} in syscalls[{}] has another action; libseccomp would silently keep only the \
                 unconditional rule: give both the same action, or make both conditional",
                other.entry
            ),
        };
        if rule.conds.is_empty() {
            if let Some(u) = slot.unconditional {
                if u.action != rule.action {
                    return Err(conflict(u, "an unconditional rule for this syscall"));
                }
            }
            if let Some(c) = slot.conditional.iter().find(|c| c.action != rule.action) {
                return Err(conflict(c, "a conditional rule for this syscall"));
            }
            slot.unconditional.get_or_insert(rule);
        } else {
            if let Some(u) = slot.unconditional.filter(|u| u.action != rule.action) {
                return Err(conflict(u, "an unconditional rule for this syscall"));
            }
            // Two conditional rules with other actions on other arguments
            // can both hold, and which wins then is each generator's own
            // order (libseccomp's is by argument): refused, as ambiguous.
            let indexes = |r: &Rule| r.conds.iter().map(|c| c.index).collect::<std::collections::BTreeSet<u32>>();
            if let Some(other) =
                slot.conditional.iter().find(|c| c.action != rule.action && indexes(c) != indexes(rule))
            {
                return Err(SeccompError::Rule {
                    file: file.into(),
                    index: rule.entry,
                    name: rule.name.clone(),
                    reason: format!(
                        "the rule in syscalls[{}] has another action and tests other arguments ({:?} here, {:?} \
                         there): when both hold, which one wins is not defined; test the same arguments in \
                         both, or give them the same action",
                        other.entry,
                        indexes(rule),
                        indexes(other)
                    ),
                });
            }
            slot.conditional.push(rule);
        }
    }
    Ok(by_nr)
}

/// Build the libseccomp filter for `plan` on the native architecture only.
pub fn filter(file: &str, plan: &Plan) -> Result<ScmpFilterContext, SeccompError> {
    let lib = |step: &str, source| SeccompError::Libseccomp { file: file.into(), step: step.into(), source };
    let by_nr = group(file, plan)?;
    let mut ctx = ScmpFilterContext::new(scmp_action(plan.default_action)).map_err(|e| lib("create a filter", e))?;
    ctx.set_act_badarch(scmp_action(BAD_ARCH)).map_err(|e| lib("set the foreign-architecture action", e))?;
    // A binary tree of syscall numbers: a few comparisons per call instead
    // of a walk through some 300 allowed ones.
    ctx.set_ctl_optimize(2).map_err(|e| lib("enable the binary-tree layout", e))?;
    for (nr, rules) in &by_nr {
        let add = |ctx: &mut ScmpFilterContext, rule: &Rule| {
            // A rule with the default action is what the filter does anyway
            // (and libseccomp refuses it); the conflict checks above ran first.
            if rule.action == plan.default_action {
                return Ok(());
            }
            let conds: Vec<ScmpArgCompare> = rule.conds.iter().map(scmp_cond).collect();
            ctx.add_rule_conditional(scmp_action(rule.action), ScmpSyscall::from(*nr), &conds).map(drop).map_err(|e| {
                SeccompError::Rule {
                    file: file.into(),
                    index: rule.entry,
                    name: rule.name.clone(),
                    reason: format!("libseccomp refused the rule: {e}"),
                }
            })
        };
        match rules.unconditional {
            Some(rule) => add(&mut ctx, rule)?,
            None => {
                for rule in &rules.conditional {
                    add(&mut ctx, rule)?;
                }
            }
        }
    }
    Ok(ctx)
}

/// Write the BPF program of `ctx` to `fd` (at its current offset).
pub fn export(file: &str, ctx: &ScmpFilterContext, fd: impl AsFd) -> Result<(), SeccompError> {
    ctx.export_bpf(fd).map_err(|source| SeccompError::Libseccomp {
        file: file.into(),
        step: "export the BPF program".into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::super::profile::{parse, plan, HostFacts, KernelVersion};
    use super::*;

    fn plan_of(json: &str) -> Plan {
        let host = HostFacts { arch: "amd64", kernel: KernelVersion { major: 6, minor: 1 }, caps: vec![] };
        plan("t.json", &parse("t.json", json).unwrap(), &host).unwrap()
    }

    #[test]
    fn names_resolve_natively_elsewhere_or_not_at_all() {
        assert!(matches!(resolve("read"), Some(SyscallNumber::Native(_))));
        assert_eq!(resolve("no_such_call"), None);
        assert_eq!(resolve("ptrcae"), None);
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(resolve("read"), Some(SyscallNumber::Native(0)));
            assert_eq!(resolve("_llseek"), Some(SyscallNumber::Elsewhere));
            assert_eq!(resolve("mseal"), Some(SyscallNumber::Native(462)));
            assert_eq!(resolve("uretprobe"), Some(SyscallNumber::Native(335)));
            assert_eq!(resolve("riscv_hwprobe"), Some(SyscallNumber::Elsewhere));
        }
    }

    #[test]
    fn unknown_syscall_names_are_errors_naming_the_entry() {
        let p = plan_of(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
              {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
              {"names": ["write", "ptrcae"], "action": "SCMP_ACT_ALLOW"}]}"#,
        );
        let e = filter("t.json", &p).err().unwrap().to_string();
        assert!(e.contains("t.json: syscalls[1]: 'ptrcae': unknown syscall name"), "{e}");
    }

    #[test]
    fn conditional_rules_beside_an_unconditional_one_are_refused() {
        let p = plan_of(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
              {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"},
              {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
               "args": [{"index": 1, "value": 4294967295, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"}]}]}"#,
        );
        let e = filter("t.json", &p).err().unwrap().to_string();
        assert!(e.contains("syscalls[1]: 'ioctl'") && e.contains("syscalls[0]") && e.contains("silently"), "{e}");

        // The same in the other order, and two unconditional rules.
        let p = plan_of(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
              {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "args": [{"index": 1, "value": 21522, "op": "SCMP_CMP_EQ"}]},
              {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"}]}"#,
        );
        assert!(filter("t.json", &p).is_err(), "the default-action rule still hides the conditional one");
        let p = plan_of(
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
              {"names": ["read"], "action": "SCMP_ACT_ERRNO"}, {"names": ["read"], "action": "SCMP_ACT_KILL"}]}"#,
        );
        assert!(filter("t.json", &p).is_err());

        // Same action: fine, the unconditional rule covers the other.
        let p = plan_of(
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
              {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]},
              {"names": ["socket"], "action": "SCMP_ACT_ALLOW"}]}"#,
        );
        assert!(filter("t.json", &p).is_ok());
    }
}
