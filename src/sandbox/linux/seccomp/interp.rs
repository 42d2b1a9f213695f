//! A classic-BPF interpreter for seccomp programs, and the comparison of
//! our range compiler with libseccomp's generator that it makes possible.
//! Built for the unit tests and the fuzz targets only (`cfg(fuzzing)`):
//! the sandbox itself never interprets a program, the kernel does.

use super::bpf::{native_arch, program, ALU_AND_K, JA, JEQ_K, JGE_K, JGT_K, JSET_K, LD_W_ABS, RET_K};
use super::compile;
use super::profile::{self, Plan};
use super::SeccompError;
use std::io::{Read, Seek};

/// Why a program could not be built or run, or where two differ.
#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("load outside seccomp_data: {0}")]
    Load(u32),
    #[error("ran off the program at {0}")]
    RanOff(usize),
    #[error("unexpected BPF opcode {code:#x} at {pc}")]
    Opcode { code: u16, pc: usize },
    #[error("no native seccomp architecture")]
    NoArch,
    #[error("{0}")]
    Compile(#[from] SeccompError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Memfd(nix::errno::Errno),
    /// The two programs' answers to one input (`input` describes it).
    #[error("{input}: {ours:#x} here, {theirs:#x} from libseccomp")]
    Differ { input: String, ours: u32, theirs: u32 },
}

/// `struct seccomp_data`, as the filter sees it.
#[derive(Debug, Clone, Copy)]
pub struct Data {
    pub nr: u32,
    pub arch: u32,
    pub args: [u64; 6],
}

impl Data {
    fn word(&self, off: u32) -> Result<u32, InterpError> {
        Ok(match off {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0,
            16..=63 if off.is_multiple_of(4) => {
                let arg = self.args[((off - 16) / 8) as usize];
                if off.is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => return Err(InterpError::Load(off)),
        })
    }
}

/// Run a classic BPF program the way the kernel does. An instruction
/// seccomp would refuse, or a jump out of the program, is an error.
pub fn run(prog: &[libc::sock_filter], d: &Data) -> Result<u32, InterpError> {
    let (mut pc, mut a) = (0usize, 0u32);
    loop {
        let i = *prog.get(pc).ok_or(InterpError::RanOff(pc))?;
        let k = i.k;
        let jump = |cond: bool| pc + 1 + usize::from(if cond { i.jt } else { i.jf });
        pc = match i.code {
            LD_W_ABS => {
                a = d.word(k)?;
                pc + 1
            }
            ALU_AND_K => {
                a &= k;
                pc + 1
            }
            JA => pc + 1 + k as usize,
            JEQ_K => jump(a == k),
            JGT_K => jump(a > k),
            JGE_K => jump(a >= k),
            JSET_K => jump(a & k != 0),
            RET_K => return Ok(k),
            code => return Err(InterpError::Opcode { code, pc }),
        };
    }
}

/// Instructions from the bytes the kernel reads.
pub fn from_bytes(bytes: &[u8]) -> Vec<libc::sock_filter> {
    bytes
        .chunks_exact(8)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect()
}

/// libseccomp's program for `plan`.
pub fn libseccomp_program(plan: &Plan) -> Result<Vec<libc::sock_filter>, InterpError> {
    let ctx = compile::filter("p", plan)?;
    let mut file = tempfile_in_memory()?;
    compile::export("p", &ctx, &file)?;
    file.rewind()?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(from_bytes(&bytes))
}

fn tempfile_in_memory() -> Result<std::fs::File, InterpError> {
    nix::sys::memfd::memfd_create(c"confine-bpf-interp", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map(std::fs::File::from)
        .map_err(InterpError::Memfd)
}

/// Our program for `plan`.
pub fn ours(plan: &Plan) -> Result<Vec<libc::sock_filter>, InterpError> {
    let arch = native_arch().ok_or(InterpError::NoArch)?;
    Ok(program("p", plan, arch)?)
}

/// Argument values around every constant of `plan`'s conditions: the
/// value, its neighbours, its high and low halves alone, with every
/// masked bit flipped, and some fixed and random others.
pub fn interesting_args(plan: &Plan) -> Vec<u64> {
    let mut v = vec![0, 1, u64::MAX, 0xffff_ffff, 0x1_0000_0000, 0x8000_0000_0000_0000];
    for c in plan.rules.iter().flat_map(|r| &r.conds) {
        let x = c.value;
        v.extend([x, x.wrapping_add(1), x.wrapping_sub(1), x & 0xffff_ffff, x | 0xdead_0000_0000, x ^ (1 << 32)]);
        v.extend([x | 0xffff_ffff_0000_0000, x ^ 0x8000_0000]);
        if let profile::Op::MaskedEq(m) = c.op {
            for bit in 0..64 {
                if m & (1 << bit) != 0 {
                    v.push(x ^ (1 << bit));
                }
            }
            v.extend([m, !m, x | !m]);
        }
    }
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..512 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.push(if i % 2 == 0 { s } else { s & 0xffff_ffff });
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The first input on which programs `a` and `b` differ (or either
/// fails): every syscall number up to 1100, the x32 and tracer-skip
/// numbers, a foreign architecture, `extra`, and, for every number with
/// conditions in `plan`, `values` in each argument the conditions name
/// (the others 0, and all at once). Returns how many inputs were checked.
pub fn compare(
    plan: &Plan,
    a: &[libc::sock_filter],
    b: &[libc::sock_filter],
    values: &[u64],
    extra: &[Data],
) -> Result<u64, InterpError> {
    let (arch, _) = native_arch().ok_or(InterpError::NoArch)?;
    let same = |d: &Data, what: &dyn Fn() -> String| -> Result<(), InterpError> {
        let (x, y) = (run(a, d)?, run(b, d)?);
        if x == y {
            Ok(())
        } else {
            Err(InterpError::Differ { input: what(), ours: x, theirs: y })
        }
    };
    let mut checked = 0u64;
    for d in extra {
        same(d, &|| format!("{d:x?}"))?;
        checked += 1;
    }
    let numbers = (0..1100).chain([0x4000_0000, 0x4000_0001, 0x4000_0000 + 59, u32::MAX, 0x7fff_ffff]);
    for nr in numbers {
        for arch in [arch, 0x4000_0003 /* i386 */] {
            same(&Data { nr, arch, args: [0; 6] }, &|| format!("nr {nr} arch {arch:#x}"))?;
            checked += 1;
        }
        let rule = plan.rules.iter().find(|r| {
            matches!(compile::resolve(&r.name), Some(compile::SyscallNumber::Native(n)) if n as u32 == nr)
                && !r.conds.is_empty()
        });
        let Some(rule) = rule else { continue };
        let indexes: Vec<usize> = plan
            .rules
            .iter()
            .filter(|r| r.name == rule.name)
            .flat_map(|r| r.conds.iter().map(|c| c.index as usize))
            .collect();
        for &x in values {
            for &i in &indexes {
                let mut args = [0u64; 6];
                args[i % 6] = x;
                same(&Data { nr, arch, args }, &|| format!("{} nr {nr} args {args:x?}", rule.name))?;
                same(&Data { nr, arch, args: [x; 6] }, &|| format!("{} nr {nr} all args {x:#x}", rule.name))?;
                checked += 2;
            }
        }
    }
    Ok(checked)
}
