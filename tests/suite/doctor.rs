//! `confine doctor` on this host: it must find what the kernel really has.

use crate::common;
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
    // The sandbox smoke test ran a job, which needs the nested namespace
    // unless degraded: the probe must agree with it.
    assert_eq!(find("nested user namespaces")["ok"], true, "{v}");
}

/// `confine doctor --json | head -n 1`: a reader that goes away early ends
/// the report quietly; it is not a panic with a backtrace.
#[test]
fn doctor_into_a_closed_pipe_does_not_panic() {
    use std::process::Stdio;
    for args in [&["doctor", "--json", "--no-smoke"][..], &["doctor", "--no-smoke"][..]] {
        let mut child = Command::new(bin()).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(matches!(out.status.code(), Some(0 | 1)), "{args:?}: {:?} {err}", out.status);
    }
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

#[test]
fn doctor_names_the_backend_and_what_it_guarantees_here() {
    let out = Command::new(bin()).args(["--config", "/dev/null", "doctor", "--json", "--no-smoke"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(&out)));
    assert_eq!(v["backend"], "linux", "{v}");
    let g = v["guarantees"].as_object().unwrap_or_else(|| panic!("no guarantees: {v}"));
    let rows = ["filesystem", "network", "syscalls", "memory", "cpu", "pids", "treeKill", "envScrub"];
    assert_eq!(g.len(), rows.len(), "{v}");
    // Each row follows the check behind it.
    let ok = |name: &str| v["checks"].as_array().unwrap().iter().any(|c| c["name"] == name && c["ok"] == true);
    let level = |row: &str| g[row]["level"].as_str().unwrap().to_string();
    assert_eq!(level("syscalls"), if ok("seccomp") { "enforced" } else { "none" });
    let cgroups = ok("cgroup layout") && ok("cgroup limits");
    assert_eq!(level("memory"), if cgroups { "enforced" } else { "partial" });
    assert_eq!(level("envScrub"), "enforced");

    let out = Command::new(bin()).args(["--config", "/dev/null", "doctor", "--no-smoke"]).output().unwrap();
    let text = stdout(&out);
    assert!(text.contains("backend: linux"), "{text}");
    for row in rows {
        assert!(text.lines().any(|l| l.trim_start().starts_with(row)), "{row} in {text}");
    }
}

/// Doctor says whether a workspace here would be idmapped, from a real
/// run: one on ext4 or tmpfs is, one on ramfs (no idmapped mounts) is
/// bound as it is, and doctor says why. ramfs is mounted in a mount
/// namespace of the test's own, which dies with it.
#[test]
fn doctor_says_whether_workspaces_here_are_idmapped() {
    if !is_root() {
        return skip("idmapped mounts need a root supervisor");
    }
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = r#"cd "$D" && "$C" doctor --json > "$D/ext.json"; mkdir "$D/r" && mount -t ramfs none "$D/r" && cd "$D/r" && "$C" doctor --json > "$D/ramfs.json""#;
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c", script])
        .env("C", bin())
        .env("D", dir.path())
        .output()
        .expect("unshare (util-linux)");
    assert!(out.status.success(), "{}", stderr(&out));
    let idmap = |file: &str| {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.path().join(file)).unwrap()).unwrap();
        let c = v["checks"].as_array().unwrap().iter().find(|c| c["name"] == "idmapped workspaces").cloned();
        c.unwrap_or_else(|| panic!("no idmap check: {v}"))
    };
    let here = idmap("ext.json");
    assert_eq!(here["ok"], true, "{here}");
    assert_eq!(here["required"], false, "{here}");
    let ramfs = idmap("ramfs.json");
    assert_eq!(ramfs["ok"], false, "{ramfs}");
    assert!(ramfs["detail"].as_str().unwrap().contains("does not support idmapped mounts"), "{ramfs}");
    assert!(ramfs["fix"].as_str().unwrap().contains("ext4"), "{ramfs}");
}

/// As root, doctor says whether a user owns a cgroup above root's
/// supervisor (that user could freeze or kill it before the sweep of a
/// read-write workspace) and whether root's git refuses bare repositories
/// it was not pointed at: both warnings, never required.
#[test]
fn doctor_as_root_checks_the_supervisor_s_cgroup_and_root_s_git() {
    if !is_root() {
        return skip("these checks are root's");
    }
    let out = Command::new(bin()).args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let find = |name: &str| checks.iter().find(|c| c["name"] == name).cloned();
    let cg = find("supervisor cgroup").unwrap_or_else(|| panic!("no supervisor cgroup check: {v}"));
    assert_eq!(cg["required"], false, "{cg}");
    if cg["ok"] == false {
        assert!(cg["fix"].as_str().unwrap().contains("root-owned unit"), "{cg}");
    }
    if std::path::Path::new("/usr/bin/git").exists() {
        let git = find("git bare repositories").unwrap_or_else(|| panic!("no git check: {v}"));
        assert_eq!(git["required"], false, "{git}");
        let explicit = Command::new("git")
            .args(["config", "--system", "--get", "safe.bareRepository"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "explicit");
        assert_eq!(git["ok"], explicit, "{git}");
        if !explicit {
            assert!(git["fix"].as_str().unwrap().contains("safe.bareRepository explicit"), "{git}");
        }
    }
}
