#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

fn host(caps: &[&str]) -> HostFacts {
    HostFacts {
        arch: "amd64",
        kernel: KernelVersion { major: 6, minor: 1 },
        caps: caps.iter().map(|c| c.to_string()).collect(),
    }
}

fn plan_of(json: &str) -> Result<Plan, SeccompError> {
    plan("t.json", &parse("t.json", json)?, &host(&[]))
}

fn names_of(p: &Plan) -> Vec<&str> {
    p.rules.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn kernel_versions_parse_like_docker() {
    assert_eq!(KernelVersion::parse("4.8"), Some(KernelVersion { major: 4, minor: 8 }));
    assert_eq!(KernelVersion::parse("6.18.44-fc-v669\n"), Some(KernelVersion { major: 6, minor: 18 }));
    assert_eq!(KernelVersion::parse("6.1-rc2"), None);
    assert_eq!(KernelVersion::parse("six"), None);
    assert_eq!(KernelVersion::parse("6"), None);
    assert!(KernelVersion { major: 4, minor: 10 } > KernelVersion { major: 4, minor: 8 });
}

#[test]
fn includes_and_excludes_follow_docker() {
    let p = plan_of(
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["a"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
          {"names": ["b"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}},
          {"names": ["c"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["arm64", "amd64"]}},
          {"names": ["d"], "action": "SCMP_ACT_ALLOW", "includes": {"arches": ["s390x"]}},
          {"names": ["e"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd64"]}},
          {"names": ["f"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "4.8"}},
          {"names": ["g"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "6.2"}},
          {"names": ["h"], "action": "SCMP_ACT_ALLOW", "excludes": {"minKernel": "5.0"}},
          {"name": "i", "action": "SCMP_ACT_ALLOW"}
        ]}"#,
    )
    .unwrap();
    assert_eq!(names_of(&p), ["b", "c", "f", "i"]);
    // With the capability, the include applies and the exclude does not.
    let profile = parse(
        "t",
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["a"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
          {"names": ["b"], "action": "SCMP_ACT_ALLOW", "excludes": {"caps": ["CAP_SYS_ADMIN"]}}]}"#,
    )
    .unwrap();
    assert_eq!(names_of(&plan("t", &profile, &host(&["CAP_SYS_ADMIN"])).unwrap()), ["a"]);
}

#[test]
fn actions_and_errno_defaults() {
    let p = plan_of(
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38, "syscalls": [
          {"names": ["a"], "action": "SCMP_ACT_ERRNO"},
          {"names": ["b"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13},
          {"names": ["c"], "action": "SCMP_ACT_KILL"},
          {"names": ["d"], "action": "SCMP_ACT_KILL_PROCESS"},
          {"names": ["e"], "action": "SCMP_ACT_LOG"}
        ]}"#,
    )
    .unwrap();
    assert_eq!(p.default_action, Action::Errno(38));
    let actions: Vec<Action> = p.rules.iter().map(|r| r.action).collect();
    assert_eq!(actions, [Action::Errno(1), Action::Errno(13), Action::KillThread, Action::KillProcess, Action::Log]);
}

#[test]
fn args_on_one_index_are_alternatives_others_are_anded() {
    let p = plan_of(
        r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]},
          {"names": ["x"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
            {"index": 1, "value": 255, "valueTwo": 7, "op": "SCMP_CMP_MASKED_EQ"}]}
        ]}"#,
    )
    .unwrap();
    assert_eq!(p.rules.len(), 3);
    assert_eq!(p.rules[0].conds, [Cond { index: 0, op: Op::Eq, value: 0 }]);
    assert_eq!(p.rules[1].conds, [Cond { index: 0, op: Op::Eq, value: 8 }]);
    assert_eq!(
        p.rules[2].conds,
        [Cond { index: 0, op: Op::Eq, value: 1 }, Cond { index: 1, op: Op::MaskedEq(255), value: 7 }]
    );
    assert!(p.rules[2].conds[1].matches(0x1_0000_0107));
    assert!(!p.rules[2].conds[1].matches(0x106));
}

fn err(json: &str) -> String {
    plan_of(json).unwrap_err().to_string()
}

#[test]
fn malformed_entries_are_errors_that_name_the_entry() {
    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
          {"names": ["ptrace"], "action": "SCMP_ACT_ALOW"}]}"#);
    assert!(e.contains("t.json") && e.contains("syscalls[1] (ptrace)"), "{e}");
    assert!(e.contains("unknown action 'SCMP_ACT_ALOW'") && e.contains("SCMP_ACT_ERRNO"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 1, "value": 1, "op": "SCMP_CMP_MASK"}]}]}"#);
    assert!(e.contains("syscalls[0] (ioctl): args[0]: unknown op 'SCMP_CMP_MASK'"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]}"#);
    assert!(e.contains("index 6 is out of range"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "valueTwo": 2, "op": "SCMP_CMP_MASKED_EQ"}]}]}"#);
    assert!(e.contains("could never match"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["read"], "action": "SCMP_ACT_ALLOW", "errnoRet": 1}]}"#);
    assert!(e.contains("syscalls[0] (read): errnoRet is only meaningful"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": 70000}]}"#);
    assert!(e.contains("errnoRet 70000"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": [], "action": "SCMP_ACT_ALLOW"}]}"#);
    assert!(e.contains("syscalls[0] (no names): names no syscall"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMN"]}}]}"#);
    assert!(e.contains("syscalls[0] (bpf): includes: unknown capability 'CAP_SYS_ADMN'"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "excludes": {"arches": ["amd65"]}}]}"#);
    assert!(e.contains("excludes: unknown architecture 'amd65'"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "latest"}}]}"#);
    assert!(e.contains("minKernel 'latest'"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["read"], "action": "SCMP_ACT_NOTIFY"}]}"#);
    assert!(e.contains("SCMP_ACT_NOTIFY needs"), "{e}");

    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["read"], "action": "SCMP_ACT_ALLOW"}, {"names": ["write"], "action": "SCMP_ACT_ALLOW", "coment": "typo"}]}"#);
    assert!(e.contains("syscalls[1] (write)") && e.contains("unknown field `coment`"), "{e}");

    // Even an entry that does not apply on this host is checked.
    let e = err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
          {"names": ["x"], "action": "SCMP_ACT_ALOW", "includes": {"arches": ["s390x"]}}]}"#);
    assert!(e.contains("unknown action"), "{e}");
}

#[test]
fn malformed_top_level_fields_are_errors() {
    assert!(err("{").contains("not valid JSON"));
    assert!(err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscals": []}"#).contains("unknown field `syscals`"));
    assert!(err(r#"{"defaultAction": "SCMP_ACT_DENY"}"#).contains("defaultAction: unknown action"));
    assert!(err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "flags": ["SECCOMP_FILTER_FLAG_SPEC_ALLOW"]}"#)
        .contains("flags: SECCOMP_FILTER_FLAG_SPEC_ALLOW is not supported"));
    assert!(err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "listenerPath": "/run/agent.sock"}"#).contains("listenerPath"));
    assert!(err(r#"{"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_46"]}"#)
        .contains("unknown architecture 'SCMP_ARCH_X86_46'"));
    assert!(plan_of(r#"{"defaultAction": "SCMP_ACT_ERRNO", "flags": ["SECCOMP_FILTER_FLAG_TSYNC"]}"#).is_ok());
}

#[test]
fn docker_fixture_evaluates_for_a_job_without_capabilities() {
    let text = include_str!("../../../../../tests/fixtures/docker-default-seccomp.json");
    let p = plan("docker.json", &parse("docker.json", text).unwrap(), &host(&[])).unwrap();
    assert_eq!(p.default_action, Action::Errno(1));
    let has = |n: &str| p.rules.iter().any(|r| r.name == n);
    assert!(has("read") && has("arch_prctl") && has("ptrace") && has("personality"));
    assert!(!has("mount") && !has("bpf") && !has("unshare") && !has("s390_runtime_instr"));
    let clone3: Vec<_> = p.rules.iter().filter(|r| r.name == "clone3").collect();
    assert_eq!(clone3.len(), 1);
    assert_eq!(clone3[0].action, Action::Errno(38));
    let clone: Vec<_> = p.rules.iter().filter(|r| r.name == "clone").collect();
    assert_eq!(clone.len(), 1, "only the non-s390 clone rule applies");
    assert_eq!(clone[0].conds, [Cond { index: 0, op: Op::MaskedEq(0x7E02_0000), value: 0 }]);
}
