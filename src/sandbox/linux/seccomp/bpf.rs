//! From a [`Plan`] straight to a classic BPF program, for the architectures
//! whose syscall ABI this module knows (x86_64, aarch64, riscv64).
//!
//! Why not libseccomp's own generator: it tests each syscall number on its
//! own, so Docker's ~370 allowed calls become ~710 instructions, and the
//! kernel converts and JIT-compiles every one of them in every job.
//! Allowed numbers come in long runs, so this module
//! tests *ranges*: a balanced tree of `jge` over the points where the
//! verdict changes, with each conditional syscall's argument checks as a
//! leaf. The same profile becomes about a third of the size. libseccomp
//! still resolves names (see [`super::compile`]), still compiles for the
//! other architectures, and its output is this module's oracle in tests.
//!
//! Semantics, which the tests hold equal to libseccomp's on the profiles
//! we ship and on Docker's:
//! - a foreign architecture, or an x32 call on x86_64, gets
//!   [`super::compile::BAD_ARCH`];
//! - a syscall with an unconditional rule gets its action;
//! - a syscall with conditional rules gets the action of the first rule
//!   whose conditions all hold, the strictest actions tried first (so rules
//!   that overlap resolve to the stricter one, as stacked kernel filters
//!   do), else the default action;
//! - every comparison is on all 64 bits of the argument.

use super::compile::{group, PerSyscall};
use super::profile::{Action, Cond, Op, Plan, Rule};
use super::SeccompError;

/// The classic BPF opcodes this module emits (`linux/filter.h`).
const fn op(parts: u32) -> u16 {
    parts as u16
}
pub(crate) const LD_W_ABS: u16 = op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS);
pub(crate) const ALU_AND_K: u16 = op(libc::BPF_ALU | libc::BPF_AND | libc::BPF_K);
pub(crate) const JA: u16 = op(libc::BPF_JMP | libc::BPF_JA);
pub(crate) const JEQ_K: u16 = op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K);
pub(crate) const JGT_K: u16 = op(libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K);
pub(crate) const JGE_K: u16 = op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K);
pub(crate) const JSET_K: u16 = op(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K);
pub(crate) const RET_K: u16 = op(libc::BPF_RET | libc::BPF_K);

/// Offsets into `struct seccomp_data`: nr, arch, then ip and the arguments.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARGS: u32 = 16;

/// x86_64's x32 ABI shares AUDIT_ARCH_X86_64 and sets this bit in the number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The native architecture's audit token, and whether x32 calls must be
/// fenced off by number. `None`: this module does not know the ABI, and
/// libseccomp compiles instead.
pub fn native_arch() -> Option<(u32, bool)> {
    if cfg!(target_endian = "big") {
        return None;
    }
    if cfg!(target_arch = "x86_64") {
        Some((0xC000_003E, true))
    } else if cfg!(target_arch = "aarch64") {
        Some((0xC000_00B7, false))
    } else if cfg!(target_arch = "riscv64") {
        Some((0xC000_00F3, false))
    } else {
        None
    }
}

/// The `SECCOMP_RET_*` value of an action.
pub fn ret_value(a: Action) -> u32 {
    match a {
        Action::KillProcess => 0x8000_0000,
        Action::KillThread => 0,
        Action::Trap => 0x0003_0000,
        Action::Errno(n) => 0x0005_0000 | u32::from(n),
        Action::Trace(n) => 0x7ff0_0000 | u32::from(n),
        Action::Log => 0x7ffc_0000,
        Action::Allow => 0x7fff_0000,
    }
}

/// How strict an action is; higher wins where rules overlap.
fn strictness(a: Action) -> u8 {
    match a {
        Action::KillProcess => 7,
        Action::KillThread => 6,
        Action::Trap => 5,
        Action::Errno(_) => 4,
        Action::Trace(_) => 3,
        Action::Log => 2,
        Action::Allow => 1,
    }
}

/// The program for `plan` on the native architecture, `arch` as
/// [`native_arch`] gives it.
pub fn program(file: &str, plan: &Plan, arch: (u32, bool)) -> Result<Vec<libc::sock_filter>, SeccompError> {
    check_actions(file, plan)?;
    let by_nr = group(file, plan)?;
    let bad_arch = ret_value(super::compile::BAD_ARCH);
    let mut out = vec![
        insn(LD_W_ABS, 0, 0, ARCH),
        insn(JEQ_K, 1, 0, arch.0),
        insn(RET_K, 0, 0, bad_arch),
        insn(LD_W_ABS, 0, 0, NR),
    ];
    if arch.1 {
        // nr -1 is what a tracer sets to skip a call: it goes on to the
        // default action, as in libseccomp's programs.
        out.extend([insn(JGE_K, 0, 2, X32_SYSCALL_BIT), insn(JEQ_K, 1, 0, u32::MAX), insn(RET_K, 0, 0, bad_arch)]);
    }
    let leaves = intervals(plan, &by_nr);
    match compact_tree(&leaves, plan.default_action) {
        Some(code) => out.extend(code),
        None => out.extend(tree(file, &leaves, plan.default_action)?),
    }
    Ok(out)
}

/// Refuse a plan whose actions this kernel lacks (LOG before 4.14, say):
/// the kernel would treat such a return value as kill, not as written.
/// libseccomp's own generator makes the same check. One query per distinct
/// action: rootless supervisors compile on every start.
fn check_actions(file: &str, plan: &Plan) -> Result<(), SeccompError> {
    const GET_ACTION_AVAIL: libc::c_uint = 2;
    let mut actions: Vec<Action> = Vec::new();
    for a in plan.rules.iter().map(|r| r.action).chain([plan.default_action, super::compile::BAD_ARCH]) {
        if !actions.contains(&a) {
            actions.push(a);
        }
    }
    for action in actions {
        let value = ret_value(action) & 0xffff_0000;
        // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 through the pointer,
        // which points at a live local.
        let ret = unsafe { libc::syscall(libc::SYS_seccomp, GET_ACTION_AVAIL, 0u32, &value as *const u32) };
        match nix::errno::Errno::result(ret) {
            Ok(_) => {}
            // Kernels before 4.14 can't be asked; they have every action but LOG and KILL_PROCESS.
            Err(nix::errno::Errno::EINVAL) if !matches!(action, Action::Log | Action::KillProcess) => {}
            Err(_) => {
                return Err(SeccompError::Field {
                    file: file.into(),
                    field: format!("action {action:?}"),
                    reason: "this kernel does not support it: use another action".into(),
                })
            }
        }
    }
    Ok(())
}

/// The tree with no code in its leaves: each node is one `jge` whose
/// targets are other nodes, one shared `ret` per action after the tree, or
/// the argument blocks after those (one per distinct set of checks). About a quarter smaller than
/// [`tree`], but only while every target is within a jump's 255
/// instructions; `None` when one is not.
fn compact_tree(leaves: &[(u32, Verdict<'_>)], default: Action) -> Option<Vec<libc::sock_filter>> {
    let mut asm = Asm::new(Acc::Word(NR));
    let mut rets: Vec<(Action, Label)> = Vec::new();
    let mut blocks: Vec<(Label, &[&Rule])> = Vec::new();
    fn node<'r>(
        asm: &mut Asm,
        leaves: &'r [(u32, Verdict<'_>)],
        rets: &mut Vec<(Action, Label)>,
        blocks: &mut Vec<(Label, &'r [&'r Rule])>,
    ) {
        let mut target = |asm: &mut Asm, v: &'r Verdict<'_>| -> Tgt {
            if let Verdict::Ret(a) = v {
                if let Some((_, existing)) = rets.iter().find(|(r, _)| r == a) {
                    return Tgt::To(*existing);
                }
            }
            // Syscalls with the same argument checks share one block.
            if let Verdict::Args(rules) = v {
                if let Some((existing, _)) = blocks.iter().find(|(_, b)| same_rules(b, rules)) {
                    return Tgt::To(*existing);
                }
            }
            let l = asm.label();
            match v {
                Verdict::Ret(a) => rets.push((*a, l)),
                Verdict::Args(rules) => blocks.push((l, rules)),
            }
            Tgt::To(l)
        };
        match leaves {
            [] => {}
            [(_, v)] => {
                let t = target(asm, v);
                asm.goto(t);
            }
            _ => {
                let mid = leaves.len() / 2;
                let (left, right) = leaves.split_at(mid);
                let jf = if let [(_, v)] = left { target(asm, v) } else { Tgt::Next };
                let right_label = asm.label();
                let jt = if let [(_, v)] = right { target(asm, v) } else { Tgt::To(right_label) };
                asm.jump(JGE_K, right[0].0, jt, jf);
                if left.len() > 1 {
                    node(asm, left, rets, blocks);
                }
                if right.len() > 1 {
                    asm.bind(right_label);
                    node(asm, right, rets, blocks);
                }
            }
        }
    }
    node(&mut asm, leaves, &mut rets, &mut blocks);
    for (action, label) in rets {
        asm.bind(label);
        asm.ret(action);
    }
    for (label, rules) in blocks {
        asm.bind(label);
        rules_code(&mut asm, rules, default, true);
    }
    asm.finish()
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// What the program does for a range of syscall numbers.
#[derive(Debug, Clone, PartialEq)]
enum Verdict<'a> {
    Ret(Action),
    /// One syscall's conditional rules, strictest first.
    Args(Vec<&'a Rule>),
}

/// The syscall number space cut where the verdict changes: each entry
/// holds from its start up to the next entry's.
fn intervals<'a>(plan: &Plan, by_nr: &std::collections::BTreeMap<i32, PerSyscall<'a>>) -> Vec<(u32, Verdict<'a>)> {
    let default = Verdict::Ret(plan.default_action);
    let mut points: Vec<(u32, Verdict<'a>)> = vec![(0, default.clone())];
    for (&nr, rules) in by_nr {
        let Ok(nr) = u32::try_from(nr) else { continue };
        let verdict = match rules.unconditional {
            Some(rule) => Verdict::Ret(rule.action),
            None => {
                let mut live: Vec<&Rule> = rules
                    .conditional
                    .iter()
                    .copied()
                    // A rule with the default action changes nothing (libseccomp refuses to add one).
                    .filter(|r| r.action != plan.default_action && !r.conds.iter().any(never_holds))
                    .collect();
                // Stable: profile order among rules of equal strictness.
                live.sort_by_key(|r| std::cmp::Reverse(strictness(r.action)));
                if live.is_empty() {
                    default.clone()
                } else {
                    Verdict::Args(live)
                }
            }
        };
        // Numbers are unique and ascending: the last point can only be the
        // "back to default" one pushed after the number before.
        match points.last_mut() {
            Some(last) if last.0 == nr => last.1 = verdict,
            _ => points.push((nr, verdict)),
        }
        if let Some(next) = nr.checked_add(1) {
            points.push((next, default.clone()));
        }
    }
    // Neighbours with the same verdict are one interval: the same action,
    // or the same argument checks (chmod and fchmod test their mode alike).
    let mut out: Vec<(u32, Verdict<'a>)> = Vec::with_capacity(points.len());
    for (start, v) in points {
        match out.last() {
            Some((_, last)) if same_verdict(last, &v) => {}
            _ => out.push((start, v)),
        }
    }
    out
}

/// Whether two verdicts compile to the same code.
fn same_verdict(a: &Verdict<'_>, b: &Verdict<'_>) -> bool {
    match (a, b) {
        (Verdict::Ret(x), Verdict::Ret(y)) => x == y,
        (Verdict::Args(x), Verdict::Args(y)) => same_rules(x, y),
        _ => false,
    }
}

/// Whether two syscalls' argument checks are the same, rule for rule
/// (their names aside).
fn same_rules(a: &[&Rule], b: &[&Rule]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.action == y.action && x.conds == y.conds)
}

/// A masked comparison that no value can satisfy (the value has bits the
/// mask clears).
fn never_holds(c: &Cond) -> bool {
    matches!(c.op, Op::MaskedEq(mask) if c.value & !mask != 0)
}

/// A balanced tree of `jge` over the interval starts, leaves inline.
/// Every leaf ends in `ret`, so the code of a subtree needs no target
/// outside itself.
fn tree(file: &str, leaves: &[(u32, Verdict<'_>)], default: Action) -> Result<Vec<libc::sock_filter>, SeccompError> {
    match leaves {
        [] => Ok(vec![insn(RET_K, 0, 0, ret_value(default))]),
        [(_, Verdict::Ret(a))] => Ok(vec![insn(RET_K, 0, 0, ret_value(*a))]),
        [(_, Verdict::Args(rules))] => args_block(file, rules, default),
        _ => {
            let mid = leaves.len() / 2;
            let left = tree(file, &leaves[..mid], default)?;
            let right = tree(file, &leaves[mid..], default)?;
            let k = leaves[mid].0;
            let mut out = Vec::with_capacity(left.len() + right.len() + 2);
            match u8::try_from(left.len()) {
                Ok(skip) => out.push(insn(JGE_K, skip, 0, k)),
                Err(_) => {
                    let far = u32::try_from(left.len())
                        .map_err(|_| SeccompError::TooLarge { file: file.into(), insns: left.len() })?;
                    out.push(insn(JGE_K, 0, 1, k));
                    out.push(insn(JA, 0, 0, far));
                }
            }
            out.extend(left);
            out.extend(right);
            Ok(out)
        }
    }
}

/// The argument checks of one syscall: each rule in turn, the first whose
/// conditions all hold decides. Shared `ret`s at the end keep a rule as
/// short as one instruction; if that makes a jump too long for BPF's 8-bit
/// offsets, each rule gets its own `ret` instead.
fn args_block(file: &str, rules: &[&Rule], default: Action) -> Result<Vec<libc::sock_filter>, SeccompError> {
    if let Some(code) = assemble_rules(rules, default, true) {
        return Ok(code);
    }
    // Unreachable with at most six conditions a rule, each a few
    // instructions; an error rather than a wrong jump if that ever changes.
    assemble_rules(rules, default, false).ok_or_else(|| SeccompError::Rule {
        file: file.into(),
        index: rules.first().map_or(0, |r| r.entry),
        name: rules.first().map_or_else(String::new, |r| r.name.clone()),
        reason: "its argument checks are too long for BPF's 8-bit jumps: split the rule".into(),
    })
}

fn assemble_rules(rules: &[&Rule], default: Action, shared_rets: bool) -> Option<Vec<libc::sock_filter>> {
    let mut asm = Asm::new(Acc::Word(NR));
    rules_code(&mut asm, rules, default, shared_rets);
    asm.finish()
}

/// The code of [`assemble_rules`], emitted into `asm`.
fn rules_code(asm: &mut Asm, rules: &[&Rule], default: Action, shared_rets: bool) {
    let mut actions: Vec<(Action, Label)> = Vec::new();
    for rule in rules {
        let fail = asm.label();
        let success = if shared_rets {
            match actions.iter().find(|(a, _)| *a == rule.action) {
                Some((_, l)) => Tgt::To(*l),
                None => {
                    let l = asm.label();
                    actions.push((rule.action, l));
                    Tgt::To(l)
                }
            }
        } else {
            Tgt::Next
        };
        let last = rule.conds.len().saturating_sub(1);
        for (i, c) in rule.conds.iter().enumerate() {
            let pass = if i == last { success } else { Tgt::Next };
            cond(asm, c, Tgt::To(fail), pass);
        }
        if !shared_rets {
            asm.ret(rule.action);
        }
        asm.bind(fail);
    }
    asm.ret(default);
    for (action, label) in actions {
        asm.bind(label);
        asm.ret(action);
    }
}

/// Code that goes to `pass` when `c` holds and to `fail` when it does not.
/// Either may be [`Tgt::Next`] (the instruction after this code).
fn cond(asm: &mut Asm, c: &Cond, fail: Tgt, pass: Tgt) {
    let lo_word = ARGS + 8 * c.index;
    let hi_word = lo_word + 4;
    let (vh, vl) = ((c.value >> 32) as u32, c.value as u32);
    // A label for "after this code", for checks that must jump past it.
    let after = asm.label();
    let next_or = |t: Tgt| if t == Tgt::Next { Tgt::To(after) } else { t };
    match c.op {
        Op::MaskedEq(mask) => {
            let (mh, ml) = ((mask >> 32) as u32, mask as u32);
            let parts: Vec<(u32, u32, u32)> =
                [(hi_word, mh, vh), (lo_word, ml, vl)].into_iter().filter(|(_, m, _)| *m != 0).collect();
            if parts.is_empty() {
                // (x & 0) == 0 always holds (a non-zero value was dropped as never holding).
                asm.goto(pass);
            }
            let n = parts.len();
            for (i, (word, m, v)) in parts.into_iter().enumerate() {
                let ok = if i + 1 == n { pass } else { Tgt::Next };
                asm.load(word);
                if m == u32::MAX {
                    asm.jump(JEQ_K, v, ok, fail);
                } else if v == 0 {
                    asm.jump(JSET_K, m, fail, ok);
                } else if v == m && m.is_power_of_two() {
                    asm.jump(JSET_K, m, ok, fail);
                } else {
                    asm.and(m);
                    asm.jump(JEQ_K, v, ok, fail);
                }
            }
        }
        Op::Eq => {
            asm.load(hi_word);
            asm.jump(JEQ_K, vh, Tgt::Next, fail);
            asm.load(lo_word);
            asm.jump(JEQ_K, vl, pass, fail);
        }
        Op::Ne => {
            asm.load(hi_word);
            asm.jump(JEQ_K, vh, Tgt::Next, next_or(pass));
            asm.load(lo_word);
            asm.jump(JEQ_K, vl, fail, pass);
        }
        Op::Gt | Op::Ge | Op::Lt | Op::Le => {
            // The high words decide unless equal; then the low words do.
            let greater = matches!(c.op, Op::Gt | Op::Ge);
            let (above, below) = if greater { (pass, fail) } else { (fail, pass) };
            asm.load(hi_word);
            asm.jump(JGT_K, vh, next_or(above), Tgt::Next);
            asm.jump(JEQ_K, vh, Tgt::Next, next_or(below));
            asm.load(lo_word);
            let code = if matches!(c.op, Op::Gt | Op::Le) { JGT_K } else { JGE_K };
            asm.jump(code, vl, above, below);
        }
    }
    asm.bind(after);
}

/// A jump target: the next instruction, or a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tgt {
    Next,
    To(Label),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

/// What the accumulator is known to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acc {
    Unknown,
    Word(u32),
}

/// A forward-only assembler with labels that tracks which word the
/// accumulator holds, so that consecutive checks of one argument load it
/// once.
struct Asm {
    code: Vec<(u16, Tgt, Tgt, u32)>,
    /// Where each label was bound.
    at: Vec<Option<usize>>,
    /// The accumulator on the jumps to each label seen so far.
    incoming: Vec<Option<Acc>>,
    acc: Acc,
    /// Whether the next instruction can be reached by falling through.
    reachable: bool,
}

impl Asm {
    fn new(acc: Acc) -> Asm {
        Asm { code: Vec::new(), at: Vec::new(), incoming: Vec::new(), acc, reachable: true }
    }

    fn label(&mut self) -> Label {
        self.at.push(None);
        self.incoming.push(None);
        Label(self.at.len() - 1)
    }

    fn bind(&mut self, l: Label) {
        self.at[l.0] = Some(self.code.len());
        let fall = self.reachable.then_some(self.acc);
        let merged = match (fall, self.incoming[l.0]) {
            (Some(a), Some(b)) if a == b => Some(a),
            (Some(a), None) | (None, Some(a)) => Some(a),
            (Some(_), Some(_)) => Some(Acc::Unknown),
            // Nothing arrives here: what follows is reached, if at all, by a later label.
            (None, None) => None,
        };
        if let Some(acc) = merged {
            self.acc = acc;
            self.reachable = true;
        }
    }

    fn arrive(&mut self, t: Tgt) {
        if let Tgt::To(l) = t {
            self.incoming[l.0] = match self.incoming[l.0] {
                None => Some(self.acc),
                Some(a) if a == self.acc => Some(a),
                Some(_) => Some(Acc::Unknown),
            };
        }
    }

    fn load(&mut self, word: u32) {
        if self.acc != Acc::Word(word) {
            self.code.push((LD_W_ABS, Tgt::Next, Tgt::Next, word));
            self.acc = Acc::Word(word);
            self.reachable = true;
        }
    }

    fn and(&mut self, mask: u32) {
        self.code.push((ALU_AND_K, Tgt::Next, Tgt::Next, mask));
        self.acc = Acc::Unknown;
    }

    fn jump(&mut self, code: u16, k: u32, jt: Tgt, jf: Tgt) {
        self.arrive(jt);
        self.arrive(jf);
        self.code.push((code, jt, jf, k));
        self.reachable = jt == Tgt::Next || jf == Tgt::Next;
    }

    fn goto(&mut self, t: Tgt) {
        if let Tgt::To(_) = t {
            self.arrive(t);
            self.code.push((JA, t, Tgt::Next, 0));
            self.reachable = false;
        }
    }

    fn ret(&mut self, a: Action) {
        self.code.push((RET_K, Tgt::Next, Tgt::Next, ret_value(a)));
        self.reachable = false;
    }

    /// Resolve labels; `None` when a conditional jump is out of reach.
    fn finish(self) -> Option<Vec<libc::sock_filter>> {
        let offset = |i: usize, t: Tgt| -> Option<usize> {
            match t {
                Tgt::Next => Some(0),
                Tgt::To(l) => self.at[l.0]?.checked_sub(i + 1),
            }
        };
        let mut out = Vec::with_capacity(self.code.len());
        for (i, &(code, jt, jf, k)) in self.code.iter().enumerate() {
            out.push(if code == JA {
                insn(JA, 0, 0, u32::try_from(offset(i, jt)?).ok()?)
            } else if u32::from(code) & 0x07 == libc::BPF_JMP {
                insn(code, u8::try_from(offset(i, jt)?).ok()?, u8::try_from(offset(i, jf)?).ok()?, k)
            } else {
                insn(code, 0, 0, k)
            });
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests;
