#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::profile::{Action, Plan};
use super::*;

fn default_plan() -> Plan {
    let host = profile::HostFacts::current().unwrap();
    profile::plan(DEFAULT_NAME, &profile::parse(DEFAULT_NAME, DEFAULT_PROFILE).unwrap(), &host).unwrap()
}

/// What the plan does with a call, evaluated the way the filter does
/// (rules of one syscall must not overlap with different actions).
fn decide(plan: &Plan, name: &str, args: [u64; 6]) -> Action {
    let hits: Vec<Action> = plan
        .rules
        .iter()
        .filter(|r| r.name == name && r.conds.iter().all(|c| c.matches(args[c.index as usize])))
        .map(|r| r.action)
        .collect();
    if let Some(first) = hits.first() {
        assert!(hits.iter().all(|a| a == first), "{name} {args:x?}: overlapping rules {hits:?}");
        *first
    } else {
        plan.default_action
    }
}

fn a1(x: u64) -> [u64; 6] {
    [3, x, 0, 0, 0, 0]
}

fn a0(x: u64) -> [u64; 6] {
    [x, 0, 0, 0, 0, 0]
}

/// A small deterministic generator (xorshift), for sampling arguments.
fn samples(n: usize) -> impl Iterator<Item = u64> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n).map(move |i| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        match i % 3 {
            0 => s,
            1 => s & 0xffff,
            _ => s & 0xff,
        }
    })
}

#[test]
fn every_default_entry_has_a_comment() {
    let p = profile::parse(DEFAULT_NAME, DEFAULT_PROFILE).unwrap();
    for (i, e) in p.syscalls.iter().flatten().enumerate() {
        assert!(e.comment.as_deref().is_some_and(|c| c.len() > 20), "syscalls[{i}] needs a comment saying why");
    }
}

#[test]
fn default_denies_tiocsti_tioclinux_and_tiocsetd_whatever_the_high_bits() {
    let p = default_plan();
    for cmd in [
        0x5412u64,
        0x541C,
        0x5423,
        0x1_0000_5412,
        0xFFFF_FFFF_0000_541C,
        0x8000_0000_0000_5412,
        0x4_0000_5423,
        0xFFFF_FFFF_0000_5423,
    ] {
        assert_eq!(decide(&p, "ioctl", a1(cmd)), Action::Errno(1), "{cmd:#x}");
    }
    // TCGETS, TIOCGWINSZ, FIONREAD, TIOCGETD (0x5424), TIOCGPTN and
    // TIOCSPTLCK (what openpty asks of ptmx), TIOCGPTPEER, and neighbours
    // one bit away from the three refused.
    for cmd in [
        0x5401u64,
        0x5413,
        0x541B,
        0x5424,
        0x8004_5430,
        0x4004_5431,
        0x5441,
        0x5410,
        0x5414,
        0x541D,
        0x5422,
        0x5427,
        0x5421,
        0x5433,
    ] {
        assert_eq!(decide(&p, "ioctl", a1(cmd)), Action::Allow, "{cmd:#x}");
    }
    for cmd in (0..0x1_0000u64).chain(samples(200_000)) {
        let want = if matches!(cmd & 0xffff_ffff, 0x5412 | 0x541C | 0x5423) { Action::Errno(1) } else { Action::Allow };
        assert_eq!(decide(&p, "ioctl", a1(cmd)), want, "{cmd:#x}");
    }
}

#[test]
fn default_refuses_af_alg_and_af_vsock_sockets() {
    let p = default_plan();
    for domain in [38u64, 40, 0x1_0000_0026, 0xFFFF_FFFF_0000_0028] {
        assert_eq!(decide(&p, "socket", a0(domain)), Action::Errno(97), "{domain:#x}");
    }
    for domain in (0..64u64).filter(|d| *d != 38 && *d != 40).chain(samples(100_000)) {
        let want = if matches!(domain & 0xffff_ffff, 38 | 40) { Action::Errno(97) } else { Action::Allow };
        assert_eq!(decide(&p, "socket", a0(domain)), want, "{domain:#x}");
    }
}

#[test]
fn default_refuses_namespace_flags_on_clone() {
    let p = default_plan();
    const CLONE_THREAD_FLAGS: u64 = 0x3D0F00; // glibc's pthread_create
    const SIGCHLD: u64 = 17; // fork
    assert_eq!(decide(&p, "clone", a0(CLONE_THREAD_FLAGS)), Action::Allow);
    assert_eq!(decide(&p, "clone", a0(SIGCHLD | 0x0100_0000 | 0x0020_0000)), Action::Allow);
    for ns in [0x0002_0000u64, 0x0200_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000] {
        assert_eq!(decide(&p, "clone", a0(SIGCHLD | ns)), Action::Errno(1), "{ns:#x}");
    }
    for flags in samples(100_000) {
        let want = if flags & 0x7E02_0000 == 0 { Action::Allow } else { Action::Errno(1) };
        assert_eq!(decide(&p, "clone", a0(flags)), want, "{flags:#x}");
    }
    assert_eq!(decide(&p, "clone3", a0(0)), Action::Errno(38));
    assert_eq!(decide(&p, "unshare", a0(0x1000_0000)), Action::Errno(1));
}

#[test]
fn default_allows_only_dockers_personalities() {
    let p = default_plan();
    for v in [0u64, 8, 0x20000, 0x20008, 0xffff_ffff] {
        assert_eq!(decide(&p, "personality", a0(v)), Action::Allow, "{v:#x}");
    }
    for v in [0x0040000u64 /* ADDR_NO_RANDOMIZE */, 0x0400000 /* READ_IMPLIES_EXEC */, 1] {
        assert_eq!(decide(&p, "personality", a0(v)), p.default_action, "{v:#x}");
    }
}

#[test]
fn default_denies_the_issue_list_with_eperm() {
    let p = default_plan();
    let eperm = [
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsmount",
        "fsconfig",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "iopl",
        "ioperm",
        "swapon",
        "swapoff",
        "reboot",
        "acct",
        "open_by_handle_at",
        "name_to_handle_at",
        "unshare",
        "setns",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    ];
    for name in eperm {
        assert_eq!(decide(&p, name, [0; 6]), Action::Errno(1), "{name}");
    }
    assert_eq!(p.default_action, Action::Errno(38), "unknown syscalls look absent (ENOSYS)");
    for name in ["read", "execve", "futex", "getrandom", "statx", "rseq", "faccessat2", "close_range"] {
        assert_eq!(decide(&p, name, [0; 6]), Action::Allow, "{name}");
    }
}

#[test]
fn default_compiles_to_a_sealed_memfd() {
    let compiled = compile_default().unwrap();
    assert_eq!(compiled.name, "default.json");
    let bpf = compiled.bpf().unwrap();
    assert_eq!(bpf.len() % INSN, 0);
    assert_eq!(compiled.instructions().unwrap(), bpf.len() / INSN);
    assert!(compiled.instructions().unwrap() < MAX_INSNS);
    let seals = fcntl(&compiled.fd, FcntlArg::F_GET_SEALS).unwrap();
    let want = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
    assert_eq!(seals & want.bits(), want.bits());
    // Written once, readable many times from offset 0.
    assert_eq!(compiled.bpf().unwrap(), bpf);
    let file = File::from(compiled.fd.try_clone().unwrap());
    assert!(file.write_at(b"x", 0).is_err(), "sealed against writes");
}

#[test]
fn reads_ignore_the_shared_file_offset() {
    use std::io::Read;
    let compiled = compile_default().unwrap();
    let whole = compiled.bpf().unwrap();
    // Another job reading through the same open file description moves
    // the shared offset to the end, as a plain read() in the init stage did.
    let mut other = File::from(compiled.fd.try_clone().unwrap());
    let mut sink = Vec::new();
    other.read_to_end(&mut sink).unwrap();
    assert_eq!(read_all_at(&other).unwrap(), whole);
    // And many readers at once all see the whole program.
    std::thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                let f = File::from(compiled.fd.try_clone().unwrap());
                for _ in 0..50 {
                    assert_eq!(read_all_at(&f).unwrap(), whole);
                }
            });
        }
    });
}

#[test]
fn docker_fixture_compiles_unchanged() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/docker-default-seccomp.json"));
    let compiled = compile_file(path).unwrap();
    assert_eq!(compiled.name, "docker-default-seccomp.json");
    assert!(compiled.instructions().unwrap() > 100);
}

#[test]
fn missing_files_and_bad_profiles_are_errors_naming_them() {
    let e = compile_file(Path::new("/nonexistent/p.json")).unwrap_err().to_string();
    assert!(e.contains("cannot read seccomp profile /nonexistent/p.json"), "{e}");
    let host = profile::HostFacts::current().unwrap();
    let e = compile_str(
        "p.json",
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read", "wirte"], "action": "SCMP_ACT_ALLOW"}]}"#,
        &host,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("p.json: syscalls[0]: 'wirte': unknown syscall name"), "{e}");
}
