//! `confine doctor` on this host: it must find what the kernel really has.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use std::process::Command;

#[test]
fn doctor_reports_this_hosts_layers() {
    let out = Command::new(bin()).args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    let checks = v["checks"].as_array().unwrap();
    let find = |name: &str| checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name}: {v}"));
    assert!(find("kernel")["detail"].as_str().unwrap().starts_with("Linux "));
    for name in ["user namespaces", "landlock", "seccomp", "cgroup layout", "sandbox smoke test"] {
        if find(name)["ok"] != true {
            return skip(&format!("this host lacks {name}: {}", find(name)));
        }
    }
    // Everything required is present here, so doctor must say so and exit 0.
    assert_eq!(v["fullIsolation"], true, "{v}");
    assert_eq!(out.status.code(), Some(0));
    let landlock = find("landlock")["detail"].as_str().unwrap().to_string();
    let abi = std::fs::read_to_string("/sys/kernel/security/lsm").unwrap_or_default();
    assert!(landlock.starts_with("ABI "), "{landlock} (lsm: {abi})");
    assert!(find("seccomp")["detail"].as_str().unwrap().contains("libseccomp 2."));
}

#[test]
fn doctor_table_marks_each_check() {
    let out = Command::new(bin()).args(["doctor", "--no-smoke"]).output().unwrap();
    let text = stdout(&out);
    assert!(text.contains("✓ kernel"), "{text}");
    assert!(
        text.lines().filter(|l| l.starts_with('✓') || l.starts_with('✗') || l.starts_with('-')).count() >= 6,
        "{text}"
    );
    assert!(text.contains("full isolation"), "{text}");
}
