#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The range compiler against libseccomp's generator, both run by a small
//! classic-BPF interpreter over every syscall number and the argument
//! values where a condition can flip; and the kernel's own verdict on the
//! programs.

use super::super::interp::{self, Data};
use super::super::profile::{self, Plan};
use super::super::DEFAULT_PROFILE;
use super::*;

fn run(prog: &[libc::sock_filter], d: &Data) -> u32 {
    interp::run(prog, d).unwrap()
}

fn from_bytes(bytes: &[u8]) -> Vec<libc::sock_filter> {
    interp::from_bytes(bytes)
}

fn libseccomp_program(plan: &Plan) -> Vec<libc::sock_filter> {
    interp::libseccomp_program(plan).unwrap()
}

fn ours(plan: &Plan) -> Vec<libc::sock_filter> {
    interp::ours(plan).unwrap()
}

fn plan_of(json: &str) -> Plan {
    let host = profile::HostFacts::current().unwrap();
    profile::plan("p", &profile::parse("p", json).unwrap(), &host).unwrap()
}

fn default_plan() -> Plan {
    plan_of(DEFAULT_PROFILE)
}

fn docker_plan() -> Plan {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/docker-default-seccomp.json"))
            .unwrap();
    plan_of(&text)
}

/// Both programs give the same return value for every syscall number up
/// to 1100, the x32 and tracer-skip numbers, a foreign architecture, and,
/// for every number that has conditions, every interesting value in every
/// argument the conditions name (the others 0, and all at once).
fn assert_same(plan: &Plan) {
    let checked =
        interp::compare(plan, &ours(plan), &libseccomp_program(plan), &interp::interesting_args(plan), &[]).unwrap();
    assert!(checked > 2000, "{checked}");
}

#[test]
fn the_default_profile_compiles_as_libseccomp_does() {
    assert_same(&default_plan());
}

#[test]
fn dockers_profile_compiles_as_libseccomp_does() {
    assert_same(&docker_plan());
}

#[test]
fn every_comparison_and_mask_shape_compiles_as_libseccomp_does() {
    // Each operator on low and high halves, masks that need `and`, single
    // and multi-bit masks, a mask with a high half, and a rule that can
    // never hold; rules of one syscall with different actions.
    let plan = plan_of(
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
        {"names": ["read", "write", "openat"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["mount"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
        {"names": ["lseek"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 2, "op": "SCMP_CMP_LT", "value": 3},
            {"index": 1, "op": "SCMP_CMP_GE", "value": 4294967296}]},
        {"names": ["mmap"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 2, "op": "SCMP_CMP_LE", "value": 7},
            {"index": 3, "op": "SCMP_CMP_GT", "value": 21474836482}]},
        {"names": ["fcntl"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 1, "op": "SCMP_CMP_NE", "value": 1031}]},
        {"names": ["kill"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "op": "SCMP_CMP_EQ", "value": 18446744073709551615}]},
        {"names": ["prctl"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "op": "SCMP_CMP_MASKED_EQ", "value": 1099511627775, "valueTwo": 1095216660480}]},
        {"names": ["prctl"], "action": "SCMP_ACT_TRAP", "args": [
            {"index": 0, "op": "SCMP_CMP_MASKED_EQ", "value": 12, "valueTwo": 4}]},
        {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": [
            {"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 255, "valueTwo": 17}]},
        {"names": ["ioctl"], "action": "SCMP_ACT_LOG", "args": [
            {"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 16, "valueTwo": 0}]},
        {"names": ["getpid"], "action": "SCMP_ACT_KILL_THREAD"},
        {"names": ["getppid"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
        ]}"#,
    );
    assert_same(&plan);
}

/// Docker's profile, whose argument checks are few, compiles to under a
/// third of libseccomp's program. Ours tests the mode of eleven calls for
/// setuid bits as well (three shared blocks, and two more points of the
/// number tree for each call): under 36% (262 against 741 when written,
/// 223 against 710 before those checks).
#[test]
fn the_default_profile_is_a_third_of_libseccomps_size() {
    let plan = default_plan();
    let (a, b) = (ours(&plan).len(), libseccomp_program(&plan).len());
    eprintln!("default profile: {a} instructions here, {b} from libseccomp");
    assert!(a * 100 < b * 36, "{a} vs {b}");
    let plan = docker_plan();
    let (a, b) = (ours(&plan).len(), libseccomp_program(&plan).len());
    eprintln!("Docker's profile: {a} instructions here, {b} from libseccomp");
    assert!(a * 3 < b, "{a} vs {b}");
}

/// Syscalls whose argument checks are the same share one block of code,
/// and neighbours among them one interval of the number tree.
#[test]
fn identical_argument_checks_share_one_block() {
    let profile = |names: &str| {
        format!(
            r#"{{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
            {{"names": [{names}], "action": "SCMP_ACT_ALLOW", "args": [
                {{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 3072, "valueTwo": 0}}]}},
            {{"names": [{names}], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": [
                {{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 2048, "valueTwo": 2048}},
                {{"index": 1, "op": "SCMP_CMP_MASKED_EQ", "value": 1024, "valueTwo": 1024}}]}}
            ]}}"#
        )
    };
    if !cfg!(target_arch = "x86_64") {
        // The names and numbers below are x86_64's (aarch64 has no chmod).
        return;
    }
    let one = plan_of(&profile(r#""chmod""#));
    // chmod (90) and fchmod (91) are neighbours.
    let neighbours = plan_of(&profile(r#""chmod", "fchmod""#));
    let apart = plan_of(&profile(r#""chmod", "mkdir", "creat""#));
    for plan in [&one, &neighbours, &apart] {
        assert_same(plan);
    }
    let (a, b, c) = (ours(&one).len(), ours(&neighbours).len(), ours(&apart).len());
    assert_eq!(a, b, "neighbours with the same checks are one interval");
    // Each call apart adds at most two tree nodes, never a second block.
    assert!(c <= a + 4, "{a} instructions for one call, {c} for three");
}

#[test]
fn wide_trees_jump_over_long_subtrees() {
    // Every other syscall allowed: hundreds of intervals, too many for the
    // compact tree's jumps to its shared `ret`s, so the inline tree is
    // used, and its upper levels need `ja` to reach their right halves.
    let names: Vec<String> = (0..330)
        .step_by(2)
        .filter_map(|n| libseccomp::ScmpSyscall::from(n).get_name().ok())
        .map(|n| format!("\"{n}\""))
        .collect();
    let plan = plan_of(&format!(
        r#"{{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{{"names": [{}], "action": "SCMP_ACT_ALLOW"}}]}}"#,
        names.join(",")
    ));
    let prog = ours(&plan);
    assert!(prog.iter().any(|i| i.code == JA), "expected a long jump in {} instructions", prog.len());
    assert_same(&plan);
}

#[test]
fn the_kernel_applies_the_program_as_the_interpreter_does() {
    // In a forked child: load the default program, then make calls whose
    // verdicts differ, and report the errno of each.
    let compiled = super::super::compile_default().unwrap();
    let bytes = compiled.bpf().unwrap();
    let prog = from_bytes(&bytes);
    let (arch, _) = native_arch().unwrap();
    // SAFETY: the child only makes raw syscalls and exits with _exit.
    match unsafe { libc::fork() } {
        0 => {
            let code = (|| {
                // SAFETY: plain syscalls on no memory of ours but locals.
                unsafe {
                    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                        return 10;
                    }
                }
                if super::super::install(&bytes).is_err() {
                    return 11;
                }
                let errno = |ret: libc::c_long| {
                    if ret < 0 {
                        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                    } else {
                        0
                    }
                };
                // SAFETY: syscalls with invalid or harmless arguments.
                let checks = unsafe {
                    [
                        (errno(libc::syscall(libc::SYS_getpid)), 0),
                        (errno(libc::syscall(libc::SYS_unshare, 0)), libc::EPERM),
                        (errno(libc::syscall(libc::SYS_socket, 38, 5, 0)), libc::EAFNOSUPPORT),
                        (errno(libc::syscall(libc::SYS_ioctl, -1, 0x5412)), libc::EPERM),
                        (errno(libc::syscall(libc::SYS_ioctl, -1, 0x5401)), libc::EBADF),
                        (errno(libc::syscall(1000)), libc::ENOSYS),
                    ]
                };
                for (i, (got, want)) in checks.iter().enumerate() {
                    if got != want {
                        return 20 + i as i32;
                    }
                }
                0
            })();
            // SAFETY: ends the forked child without running the parent's atexit state.
            unsafe { libc::_exit(code) }
        }
        pid => {
            let mut status = 0;
            // SAFETY: waits for our own child.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            assert!(libc::WIFEXITED(status), "child died: {status:#x}");
            assert_eq!(libc::WEXITSTATUS(status), 0, "check failed (10: prctl, 11: load, 20+i: check i)");
        }
    }
    // And the interpreter agrees with those verdicts.
    let errno_of = |nr: libc::c_long, args: [u64; 6]| run(&prog, &Data { nr: nr as u32, arch, args });
    assert_eq!(errno_of(libc::SYS_unshare, [0; 6]), 0x0005_0000 | libc::EPERM as u32);
    assert_eq!(errno_of(libc::SYS_ioctl, [u64::MAX, 0x5412, 0, 0, 0, 0]), 0x0005_0000 | libc::EPERM as u32);
    assert_eq!(errno_of(libc::SYS_ioctl, [u64::MAX, 0x5401, 0, 0, 0, 0]), 0x7fff_0000);
    assert_eq!(errno_of(1000, [0; 6]), 0x0005_0000 | libc::ENOSYS as u32);
}

#[test]
fn compiled_profiles_come_from_the_range_compiler() {
    let compiled = super::super::compile_default().unwrap();
    let plan = default_plan();
    assert_eq!(compiled.bpf().unwrap(), super::super::to_bytes(&ours(&plan)));
}

/// Found by the fuzzer (fuzz/regressions/seccomp): one syscall with an
/// allow rule on one argument and an errno rule on another. When both hold
/// (arg 3 = 0x400, arg 4 = 0), libseccomp's program allowed and ours
/// refused: which wins is each generator's order. Such a profile is
/// refused, naming both entries.
#[test]
fn rules_of_one_call_with_other_actions_on_other_arguments_are_refused() {
    let text = r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
        {"names": ["openat"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 4, "value": 3072, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["openat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "args": [
            {"index": 3, "value": 2048, "valueTwo": 2048, "op": "SCMP_CMP_MASKED_EQ"},
            {"index": 3, "value": 1024, "valueTwo": 1024, "op": "SCMP_CMP_MASKED_EQ"}]}
        ]}"#;
    let host = profile::HostFacts::current().unwrap();
    let plan = profile::plan("p", &profile::parse("p", text).unwrap(), &host).unwrap();
    let e = interp::ours(&plan).unwrap_err().to_string();
    assert!(e.contains("syscalls[0]") && e.contains("tests other arguments"), "{e}");
    assert!(interp::libseccomp_program(&plan).is_err(), "libseccomp's path refuses it too");
    // The same rules on one argument are fine, and compile alike.
    assert_same(&plan_of(&text.replace(r#""index": 4"#, r#""index": 3"#)));
}
