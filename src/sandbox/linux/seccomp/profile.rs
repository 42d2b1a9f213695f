//! Seccomp profiles as data: the OCI/Docker JSON format (serde types), its
//! validation, and the evaluation of `includes`/`excludes` against the facts
//! of this host into a [`Plan`] — a flat list of rules, one syscall name
//! each, that [`super::compile`] turns into BPF.
//!
//! Pure: no syscalls and no libseccomp here, so every decision is testable
//! without root. It must never drop or weaken a rule it does not
//! understand: anything unknown is an error that names the entry.

use super::SeccompError;
use serde::Deserialize;

/// A seccomp profile in the OCI/Docker format (moby/profiles `Seccomp`).
///
/// Unknown fields are errors, so a typo can't silently drop a rule. The one
/// addition to the format is a top-level `comment`, which Docker ignores.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Profile {
    #[serde(default)]
    pub comment: Option<String>,
    pub default_action: String,
    #[serde(default)]
    pub default_errno_ret: Option<u32>,
    #[serde(default)]
    pub listener_path: Option<String>,
    #[serde(default)]
    pub listener_metadata: Option<String>,
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    #[serde(default)]
    pub arch_map: Option<Vec<ArchMap>>,
    #[serde(default)]
    pub flags: Option<Vec<String>>,
    #[serde(default)]
    pub syscalls: Option<Vec<Syscall>>,
}

/// One `archMap` row: an architecture and the ones it can also run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ArchMap {
    pub architecture: String,
    #[serde(default)]
    pub sub_architectures: Option<Vec<String>>,
}

/// One entry of `syscalls`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Syscall {
    #[serde(default)]
    pub names: Option<Vec<String>>,
    /// Deprecated single-name form, still accepted by Docker.
    #[serde(default)]
    pub name: Option<String>,
    pub action: String,
    #[serde(default)]
    pub errno_ret: Option<u32>,
    #[serde(default)]
    pub args: Option<Vec<Arg>>,
    #[serde(default)]
    pub comment: Option<String>,
    #[serde(default)]
    pub includes: Option<Filter>,
    #[serde(default)]
    pub excludes: Option<Filter>,
}

/// An argument comparison. For `SCMP_CMP_MASKED_EQ`, `value` is the mask
/// and `valueTwo` the value the masked argument must equal.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Arg {
    pub index: u32,
    pub value: u64,
    #[serde(default)]
    pub value_two: u64,
    pub op: String,
}

/// When an entry applies: capabilities, architectures, kernel version.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Filter {
    #[serde(default)]
    pub caps: Option<Vec<String>>,
    #[serde(default)]
    pub arches: Option<Vec<String>>,
    #[serde(default)]
    pub min_kernel: Option<String>,
}

/// What a matching syscall gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    /// Allowed, and logged by the kernel's audit.
    Log,
    Errno(u16),
    /// Hand to a ptrace tracer; without one the call fails with ENOSYS.
    Trace(u16),
    Trap,
    KillThread,
    KillProcess,
}

/// An argument comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Ne,
    Lt,
    Le,
    Eq,
    Ge,
    Gt,
    /// `(arg & mask) == value`
    MaskedEq(u64),
}

/// One condition of a rule: argument `index` compared with `value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    pub index: u32,
    pub op: Op,
    pub value: u64,
}

impl Cond {
    /// Whether an argument value satisfies this condition (the kernel
    /// compares all 64 bits; libseccomp splits them, with the same result).
    pub fn matches(&self, arg: u64) -> bool {
        match self.op {
            Op::Ne => arg != self.value,
            Op::Lt => arg < self.value,
            Op::Le => arg <= self.value,
            Op::Eq => arg == self.value,
            Op::Ge => arg >= self.value,
            Op::Gt => arg > self.value,
            Op::MaskedEq(mask) => arg & mask == self.value,
        }
    }
}

/// One rule for one syscall name: its action when every condition holds
/// (no conditions: always).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Index of the entry in `syscalls` it came from, for error messages.
    pub entry: usize,
    pub name: String,
    pub action: Action,
    pub conds: Vec<Cond>,
}

/// The profile after validation and evaluation against a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub default_action: Action,
    pub rules: Vec<Rule>,
}

/// A kernel version as `minKernel` writes it: "major.minor".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
}

impl KernelVersion {
    /// Parse "5.8", "6.18.44-fc" and the like (the patch level and any
    /// suffix are ignored, as Docker does).
    pub fn parse(s: &str) -> Option<KernelVersion> {
        let mut parts = s.trim().splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor_part = parts.next()?;
        let digits: String = minor_part.chars().take_while(|c| c.is_ascii_digit()).collect();
        if digits.is_empty() || (parts.next().is_none() && digits.len() != minor_part.len()) {
            return None;
        }
        Some(KernelVersion { major, minor: digits.parse().ok()? })
    }
}

/// What `includes` and `excludes` are evaluated against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// The architecture in Docker's (Go's) spelling: `amd64`, `arm64`, ….
    pub arch: &'static str,
    pub kernel: KernelVersion,
    /// Capabilities the job holds: none, since the init stage drops them
    /// all before seccomp is installed.
    pub caps: Vec<String>,
}

impl HostFacts {
    /// The facts of the running host, for a job without capabilities.
    pub fn current() -> Result<HostFacts, SeccompError> {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| SeccompError::Host { reason: format!("cannot read the kernel version: {e}") })?;
        let kernel = KernelVersion::parse(&release)
            .ok_or_else(|| SeccompError::Host { reason: format!("unexpected kernel version '{}'", release.trim()) })?;
        Ok(HostFacts { arch: native_arch(), kernel, caps: Vec::new() })
    }
}

/// This build's architecture as Docker profiles name it in `arches`.
pub fn native_arch() -> &'static str {
    if cfg!(target_arch = "x86_64") {
        "amd64"
    } else if cfg!(target_arch = "aarch64") {
        "arm64"
    } else if cfg!(target_arch = "riscv64") {
        "riscv64"
    } else if cfg!(target_arch = "s390x") {
        "s390x"
    } else if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
        "ppc64le"
    } else if cfg!(target_arch = "loongarch64") {
        "loong64"
    } else {
        "unknown"
    }
}

/// Architecture names `includes.arches`/`excludes.arches` may use (Go's
/// GOARCH values and the libseccomp-derived ones Docker profiles use).
const ARCH_NAMES: &[&str] = &[
    "amd64",
    "x86",
    "386",
    "x32",
    "arm",
    "arm64",
    "mips",
    "mipsle",
    "mipsel",
    "mips64",
    "mips64le",
    "mipsel64",
    "mips64n32",
    "mips64len32",
    "mipsel64n32",
    "ppc",
    "ppc64",
    "ppc64le",
    "s390",
    "s390x",
    "riscv64",
    "loong64",
    "loongarch64",
    "parisc",
    "parisc64",
    "m68k",
    "sh",
];

/// `SCMP_ARCH_*` names for `architectures` and `archMap`.
const SCMP_ARCHES: &[&str] = &[
    "SCMP_ARCH_NATIVE",
    "SCMP_ARCH_X86",
    "SCMP_ARCH_X86_64",
    "SCMP_ARCH_X32",
    "SCMP_ARCH_ARM",
    "SCMP_ARCH_AARCH64",
    "SCMP_ARCH_LOONGARCH64",
    "SCMP_ARCH_M68K",
    "SCMP_ARCH_MIPS",
    "SCMP_ARCH_MIPS64",
    "SCMP_ARCH_MIPS64N32",
    "SCMP_ARCH_MIPSEL",
    "SCMP_ARCH_MIPSEL64",
    "SCMP_ARCH_MIPSEL64N32",
    "SCMP_ARCH_PPC",
    "SCMP_ARCH_PPC64",
    "SCMP_ARCH_PPC64LE",
    "SCMP_ARCH_S390",
    "SCMP_ARCH_S390X",
    "SCMP_ARCH_PARISC",
    "SCMP_ARCH_PARISC64",
    "SCMP_ARCH_RISCV64",
    "SCMP_ARCH_SHEB",
    "SCMP_ARCH_SH",
];

const ACTIONS: &str = "SCMP_ACT_ALLOW, SCMP_ACT_ERRNO, SCMP_ACT_KILL_PROCESS, SCMP_ACT_KILL_THREAD \
(or SCMP_ACT_KILL), SCMP_ACT_TRAP, SCMP_ACT_TRACE, SCMP_ACT_LOG";
const OPS: &str = "SCMP_CMP_NE, SCMP_CMP_LT, SCMP_CMP_LE, SCMP_CMP_EQ, SCMP_CMP_GE, SCMP_CMP_GT, SCMP_CMP_MASKED_EQ";
const EPERM: u16 = 1;
/// The largest errno the kernel reports as an error (MAX_ERRNO).
const MAX_ERRNO: u32 = 4095;
/// Syscalls take at most six arguments.
const MAX_ARGS: u32 = 6;

/// What is wrong with one field of a profile, and what to write instead;
/// [`SeccompError`] names the file and the entry it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("has both 'name' and 'names': keep only 'names'")]
    NameAndNames,
    #[error("names no syscall: give 'names' a list of syscall names")]
    NoNames,
    #[error("'{0}' is not a syscall name")]
    NotASyscallName(String),
    #[error("errnoRet {0} is not an errno (at most {max}): use a value from errno(3)", max = MAX_ERRNO)]
    NotAnErrno(u32),
    #[error(
        "SCMP_ACT_NOTIFY needs a user-space notification agent, which confine does not run: \
         use SCMP_ACT_ERRNO or SCMP_ACT_ALLOW"
    )]
    Notify,
    #[error("unknown action '{0}': use one of {actions}", actions = ACTIONS)]
    UnknownAction(String),
    /// `errnoRet` with an action that returns no errno (named).
    #[error("errnoRet is only meaningful with SCMP_ACT_ERRNO or SCMP_ACT_TRACE, not {0}: remove it")]
    ErrnoRetUnused(String),
    /// One of an entry's `args`, by its position there.
    #[error("args[{position}]: {problem}")]
    Arg { position: usize, problem: Box<FieldError> },
    #[error("index {0} is out of range: syscalls have arguments 0 to 5")]
    ArgIndex(u32),
    #[error("unknown op '{0}': use one of {ops}", ops = OPS)]
    UnknownOp(String),
    #[error(
        "valueTwo {value_two:#x} has bits outside the mask {mask:#x}, so the rule could never match: \
         fix the mask (value) or valueTwo"
    )]
    OutsideMask { value_two: u64, mask: u64 },
    /// `valueTwo` with another op than SCMP_CMP_MASKED_EQ (named).
    #[error("valueTwo is only used by SCMP_CMP_MASKED_EQ, not {0}: remove it")]
    ValueTwoUnused(String),
    #[error("unknown architecture '{0}': use SCMP_ARCH_* names such as SCMP_ARCH_X86_64")]
    UnknownScmpArch(String),
    #[error("unknown capability '{0}': use names such as CAP_SYS_ADMIN")]
    UnknownCapability(String),
    #[error("unknown architecture '{0}': use Docker's names such as amd64, arm64, x86")]
    UnknownArch(String),
    #[error("minKernel '{0}' is not a kernel version: write it as \"major.minor\", e.g. \"5.8\"")]
    MinKernel(String),
}

/// Parse a profile. `file` names it in errors. A field that does not fit
/// the format is reported with the `syscalls` entry it is in.
pub fn parse(file: &str, text: &str) -> Result<Profile, SeccompError> {
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| SeccompError::Format { file: file.into(), reason: format!("not valid JSON: {e}") })?;
    match serde_json::from_value::<Profile>(value.clone()) {
        Ok(profile) => Ok(profile),
        Err(e) => {
            // Find the entry serde stumbled on, to name it.
            if let Some(entries) = value.get("syscalls").and_then(|s| s.as_array()) {
                for (index, entry) in entries.iter().enumerate() {
                    if let Err(entry_err) = serde_json::from_value::<Syscall>(entry.clone()) {
                        return Err(SeccompError::Entry {
                            file: file.into(),
                            index,
                            names: label_value(entry),
                            reason: format!("{entry_err}; see the OCI/Docker seccomp format"),
                        });
                    }
                }
            }
            Err(SeccompError::Format { file: file.into(), reason: e.to_string() })
        }
    }
}

/// Validate `profile` and evaluate it for `host`. Every entry is validated,
/// including those that do not apply here: a typo is an error on every host.
pub fn plan(file: &str, profile: &Profile, host: &HostFacts) -> Result<Plan, SeccompError> {
    let field_err =
        |field: &str, reason: String| SeccompError::Field { file: file.into(), field: field.into(), reason };

    let default_action = parse_action(&profile.default_action, profile.default_errno_ret)
        .map_err(|e| field_err("defaultAction", e.to_string()))?;
    if profile.listener_path.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err(field_err(
            "listenerPath",
            "confine runs no seccomp notification agent: remove listenerPath and SCMP_ACT_NOTIFY".into(),
        ));
    }
    if profile.listener_metadata.as_deref().is_some_and(|p| !p.is_empty()) {
        return Err(field_err("listenerMetadata", "confine runs no seccomp notification agent: remove it".into()));
    }
    for flag in profile.flags.iter().flatten() {
        match flag.as_str() {
            // The job is single-threaded when the filter is installed.
            "SECCOMP_FILTER_FLAG_TSYNC" => {}
            "SECCOMP_FILTER_FLAG_LOG" | "SECCOMP_FILTER_FLAG_SPEC_ALLOW" | "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV" => {
                return Err(field_err(
                    "flags",
                    format!("{flag} is not supported by confine (the filter is installed without flags): remove it"),
                ))
            }
            other => return Err(field_err("flags", format!("unknown flag '{other}'"))),
        }
    }
    // Only the native architecture is ever added to the filter, whatever
    // `architectures` and `archMap` say: a syscall of another ABI (i386 via
    // int 0x80, x32) kills the job. Stricter than Docker, never weaker; the
    // names are still checked so that a typo is reported.
    for arch in profile.architectures.iter().flatten() {
        check_scmp_arch(arch).map_err(|e| field_err("architectures", e.to_string()))?;
    }
    for row in profile.arch_map.iter().flatten() {
        check_scmp_arch(&row.architecture).map_err(|e| field_err("archMap", e.to_string()))?;
        for sub in row.sub_architectures.iter().flatten() {
            check_scmp_arch(sub).map_err(|e| field_err("archMap", e.to_string()))?;
        }
    }

    let mut rules = Vec::new();
    for (index, entry) in profile.syscalls.iter().flatten().enumerate() {
        let entry_err = |reason: String| SeccompError::Entry { file: file.into(), index, names: label(entry), reason };
        let wrong = |e: FieldError| entry_err(e.to_string());
        let names = entry_names(entry).map_err(wrong)?;
        let action = parse_action(&entry.action, entry.errno_ret).map_err(wrong)?;
        let conds = entry
            .args
            .iter()
            .flatten()
            .enumerate()
            .map(|(position, a)| {
                parse_arg(a).map_err(|problem| FieldError::Arg { position, problem: Box::new(problem) })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(wrong)?;
        check_filter(entry.includes.as_ref()).map_err(|r| entry_err(format!("includes: {r}")))?;
        check_filter(entry.excludes.as_ref()).map_err(|r| entry_err(format!("excludes: {r}")))?;
        if !applies(entry, host) {
            continue;
        }
        for alternative in alternatives(&conds) {
            for name in &names {
                rules.push(Rule { entry: index, name: name.clone(), action, conds: alternative.clone() });
            }
        }
    }
    Ok(Plan { default_action, rules })
}

/// The condition sets of an entry, ORed. All conditions form one rule (an
/// AND), except when two of them test the same argument: then each is a
/// rule of its own, as runc does, so Docker profiles mean the same here.
fn alternatives(conds: &[Cond]) -> Vec<Vec<Cond>> {
    let repeated = conds.iter().enumerate().any(|(i, c)| conds[..i].iter().any(|d| d.index == c.index));
    if repeated {
        conds.iter().map(|c| vec![*c]).collect()
    } else {
        vec![conds.to_vec()]
    }
}

fn entry_names(entry: &Syscall) -> Result<Vec<String>, FieldError> {
    let mut names = match (&entry.names, &entry.name) {
        (Some(names), Some(_)) if !names.is_empty() => return Err(FieldError::NameAndNames),
        (Some(names), _) if !names.is_empty() => names.clone(),
        (_, Some(name)) => vec![name.clone()],
        _ => return Err(FieldError::NoNames),
    };
    for name in &names {
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(FieldError::NotASyscallName(name.clone()));
        }
    }
    names.dedup();
    Ok(names)
}

/// Parse an action name with its `errnoRet`. ERRNO and TRACE default to
/// EPERM, as in runc.
pub fn parse_action(name: &str, errno_ret: Option<u32>) -> Result<Action, FieldError> {
    let ret = match errno_ret {
        Some(n) if n > MAX_ERRNO => return Err(FieldError::NotAnErrno(n)),
        Some(n) => Some(n as u16),
        None => None,
    };
    let action = match name {
        "SCMP_ACT_ALLOW" => Action::Allow,
        "SCMP_ACT_LOG" => Action::Log,
        "SCMP_ACT_ERRNO" => Action::Errno(ret.unwrap_or(EPERM)),
        "SCMP_ACT_TRACE" => Action::Trace(ret.unwrap_or(EPERM)),
        "SCMP_ACT_TRAP" => Action::Trap,
        "SCMP_ACT_KILL" | "SCMP_ACT_KILL_THREAD" => Action::KillThread,
        "SCMP_ACT_KILL_PROCESS" => Action::KillProcess,
        "SCMP_ACT_NOTIFY" => return Err(FieldError::Notify),
        other => return Err(FieldError::UnknownAction(other.to_string())),
    };
    if ret.is_some() && !matches!(action, Action::Errno(_) | Action::Trace(_)) {
        return Err(FieldError::ErrnoRetUnused(name.to_string()));
    }
    Ok(action)
}

fn parse_arg(arg: &Arg) -> Result<Cond, FieldError> {
    if arg.index >= MAX_ARGS {
        return Err(FieldError::ArgIndex(arg.index));
    }
    let op = match arg.op.as_str() {
        "SCMP_CMP_NE" => Op::Ne,
        "SCMP_CMP_LT" => Op::Lt,
        "SCMP_CMP_LE" => Op::Le,
        "SCMP_CMP_EQ" => Op::Eq,
        "SCMP_CMP_GE" => Op::Ge,
        "SCMP_CMP_GT" => Op::Gt,
        "SCMP_CMP_MASKED_EQ" => Op::MaskedEq(arg.value),
        other => return Err(FieldError::UnknownOp(other.to_string())),
    };
    match op {
        Op::MaskedEq(mask) => {
            if arg.value_two & !mask != 0 {
                return Err(FieldError::OutsideMask { value_two: arg.value_two, mask });
            }
            Ok(Cond { index: arg.index, op, value: arg.value_two })
        }
        _ if arg.value_two != 0 => Err(FieldError::ValueTwoUnused(arg.op.clone())),
        _ => Ok(Cond { index: arg.index, op, value: arg.value }),
    }
}

fn check_scmp_arch(arch: &str) -> Result<(), FieldError> {
    if SCMP_ARCHES.contains(&arch) {
        Ok(())
    } else {
        Err(FieldError::UnknownScmpArch(arch.to_string()))
    }
}

fn check_filter(filter: Option<&Filter>) -> Result<(), FieldError> {
    let Some(filter) = filter else { return Ok(()) };
    for cap in filter.caps.iter().flatten() {
        if cap.parse::<caps::Capability>().is_err() {
            return Err(FieldError::UnknownCapability(cap.clone()));
        }
    }
    for arch in filter.arches.iter().flatten() {
        if !ARCH_NAMES.contains(&arch.as_str()) {
            return Err(FieldError::UnknownArch(arch.clone()));
        }
    }
    if let Some(v) = &filter.min_kernel {
        if KernelVersion::parse(v).is_none() {
            return Err(FieldError::MinKernel(v.clone()));
        }
    }
    Ok(())
}

/// Docker's rules: an entry is skipped when an excluded arch is ours, an
/// excluded capability is held, or the kernel is at least the excluded
/// minKernel; and unless our arch is among the included ones, every
/// included capability is held, and the kernel is at least minKernel.
fn applies(entry: &Syscall, host: &HostFacts) -> bool {
    let kernel_at_least = |v: &Option<String>| v.as_deref().and_then(KernelVersion::parse).map(|v| host.kernel >= v);
    if let Some(ex) = &entry.excludes {
        if ex.arches.iter().flatten().any(|a| a == host.arch)
            || ex.caps.iter().flatten().any(|c| host.caps.contains(c))
            || kernel_at_least(&ex.min_kernel) == Some(true)
        {
            return false;
        }
    }
    if let Some(inc) = &entry.includes {
        let arches = inc.arches.as_deref().unwrap_or_default();
        if !arches.is_empty() && !arches.iter().any(|a| a == host.arch) {
            return false;
        }
        if !inc.caps.iter().flatten().all(|c| host.caps.contains(c)) {
            return false;
        }
        if kernel_at_least(&inc.min_kernel) == Some(false) {
            return false;
        }
    }
    true
}

/// A short label for an entry: its first names.
pub fn label(entry: &Syscall) -> String {
    let names: Vec<&str> = entry.names.iter().flatten().chain(entry.name.iter()).map(String::as_str).collect();
    label_names(&names)
}

fn label_value(entry: &serde_json::Value) -> String {
    let mut names: Vec<&str> =
        entry.get("names").and_then(|n| n.as_array()).into_iter().flatten().filter_map(|n| n.as_str()).collect();
    names.extend(entry.get("name").and_then(|n| n.as_str()));
    label_names(&names)
}

fn label_names(names: &[&str]) -> String {
    match names.len() {
        0 => "no names".into(),
        1..=3 => names.join(", "),
        n => format!("{}, … {} more", names[..3].join(", "), n - 3),
    }
}

#[cfg(test)]
mod tests;
