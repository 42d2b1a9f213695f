//! Classes that cross the governed pipeline and the MCP server: executables
//! and `#!` lines (2), sessions and repositories kept apart (10), HTTP
//! tokens (11), and what the policy sees (12).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A scratch deployment: a repository, a store and a confine.toml with
/// execution enabled, all in one temp dir (0755, so a job's uid can enter).
struct Gov {
    dir: tempfile::TempDir,
    repo: PathBuf,
    config: PathBuf,
}

impl Gov {
    fn new(extra: &str) -> Gov {
        Gov::in_dir(tempfile::tempdir().unwrap(), extra)
    }

    /// Outside /tmp: the sandbox mounts a private /tmp over the host's, so
    /// a host directory under /tmp bound into a job would be hidden, and
    /// an exposure would go unseen.
    fn outside_tmp(extra: &str) -> Gov {
        Gov::in_dir(tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap(), extra)
    }

    fn in_dir(dir: tempfile::TempDir, extra: &str) -> Gov {
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for p in [dir.path(), repo.as_path()] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let config = dir.path().join("confine.toml");
        std::fs::write(&config, exec_config(&dir.path().join("store"), "demo", &repo) + extra).unwrap();
        Gov { dir, repo, config }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `confine --config <ours> exec --json ARGS…`, within a minute.
    fn exec_json(&self, args: &[&str]) -> (serde_json::Value, Output) {
        let mut cmd = Command::new(bin());
        cmd.arg("--config").arg(&self.config).args(["exec", "--json"]).args(args);
        let out = output_within(&mut cmd, Duration::from_secs(60));
        let v = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: stdout {} stderr {}", stdout(&out), stderr(&out)));
        (v, out)
    }
}

fn manifest(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

// ---------------------------------------------------------------------------
// Class 12: the policy sees only the executable's name.
// ---------------------------------------------------------------------------

/// With the example policy that reads code and arguments, `sh -c curl`,
/// code that calls curl or wget, and code too long to be read whole are
/// denied by name; ordinary code still runs.
#[test]
fn class12_the_policy_sees_the_code_and_the_arguments() {
    if !is_root() && !sandbox_available() {
        return;
    }
    let policy = manifest("policies/examples/no-network-tools.rego");
    let g = Gov::new(&format!("\n[[policy.evaluators]]\npath = \"{}\"\n", policy.display()));
    let denied = [
        vec!["--runtime", "shell", "--", "-c", "curl -s http://example.org"],
        vec!["--runtime", "shell", "--code", "wget -q -O- http://example.org"],
        vec!["--runtime", "python", "--code", "import subprocess\nsubprocess.run(['curl', 'http://x'])\n"],
        vec!["--runtime", "shell", "--code", "X=/usr/bin/curl; $X http://x"],
    ];
    for args in &denied {
        let mut all = vec!["--repo-id", "demo"];
        all.extend_from_slice(args);
        let (v, out) = g.exec_json(&all);
        assert_eq!(v["status"], "denied", "{args:?}: {v}\n{}", stderr(&out));
        let error = v["error"].as_str().unwrap_or_default();
        assert!(error.contains("network tool"), "{args:?}: the denial names the rule: {error}");
    }
    // Code longer than the policy can read whole is refused by this policy.
    let long = format!("# {}\necho hi\n", "x".repeat(70 * 1024));
    let (v, _) = g.exec_json(&["--repo-id", "demo", "--runtime", "shell", "--code", &long]);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(v["error"].as_str().unwrap_or_default().contains("64 KiB"), "{v}");
    // Names that merely contain the word pass.
    let (v, out) = g.exec_json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo curling-stone"]);
    assert_eq!(v["status"], "success", "{v}\n{}", stderr(&out));
}

// ---------------------------------------------------------------------------
// Class 2: an executable and its `#!` line chosen by a repository.
// ---------------------------------------------------------------------------

/// A secret directory outside every repository, holding an executable
/// file (what the old `#!` parser needed to bind its directory) and a
/// token; and a repository file named like the runtime whose `#!` line
/// names the secret through `env -S -u`.
fn plant_shebang_attack(g: &Gov) -> (PathBuf, PathBuf, String) {
    use std::os::unix::fs::PermissionsExt;
    let secret = g.path("secret");
    std::fs::create_dir(&secret).unwrap();
    let token = token("class02");
    std::fs::write(secret.join("token.txt"), &token).unwrap();
    std::fs::write(secret.join("file"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(secret.join("file"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = g.repo.join("python3");
    let s = secret.display();
    std::fs::write(&script, format!("#!/usr/bin/env -S -u {s}/file sh -c 'ls {s}; cat {s}/token.txt'\n")).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (secret, script, token)
}

/// `confine exec --executable <repo>/python3`: refused before anything
/// runs, naming why; the secret directory is never bound, so its token
/// appears nowhere in the answer.
#[test]
fn class02_an_executable_inside_a_repository_is_refused() {
    if !is_root() {
        return skip("class 2's attack needs a root supervisor (it binds host directories)");
    }
    if !sandbox_available() {
        return;
    }
    let g = Gov::outside_tmp("");
    let (_secret, script, token) = plant_shebang_attack(&g);
    let script = script.to_str().unwrap();
    let (v, out) = g.exec_json(&[
        "--repo-id",
        "demo",
        "--runtime",
        "python",
        "--output-mode",
        "summary",
        "--executable",
        script,
        "--",
        "x",
    ]);
    let all = format!("{v}{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(&token) && !all.contains("token.txt"), "the secret leaked: {all}");
    assert_ne!(v["status"], "success", "{v}");
    assert!(v["outcome"].is_null(), "nothing may run: {v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("is not trusted") && error.contains("repository"), "the refusal says why: {error}");
}

/// A `python3` in a directory outside every repository, but not on the
/// supervisor's PATH, is refused too: an absolute executable must be in
/// a directory of PATH or a system directory.
#[test]
fn class02_an_executable_outside_the_trusted_locations_is_refused() {
    if !is_root() && !sandbox_available() {
        return;
    }
    let g = Gov::outside_tmp("");
    let (secret, _script, token) = plant_shebang_attack(&g);
    let elsewhere = secret.join("python3");
    std::fs::copy(g.repo.join("python3"), &elsewhere).unwrap();
    let (v, out) = g.exec_json(&[
        "--repo-id",
        "demo",
        "--runtime",
        "python",
        "--output-mode",
        "summary",
        "--executable",
        elsewhere.to_str().unwrap(),
        "--",
        "x",
    ]);
    let all = format!("{v}{}{}", stdout(&out), stderr(&out));
    assert!(!all.contains(&token), "the secret leaked: {all}");
    assert!(v["outcome"].is_null(), "nothing may run: {v}");
    let error = v["error"].as_str().unwrap_or_default();
    assert!(error.contains("is not trusted") && error.contains("PATH"), "the refusal says why: {error}");
    // The same name looked up on PATH is the system's python3, which runs.
    if Command::new("python3").arg("-V").output().is_ok_and(|o| o.status.success()) {
        let (v, out) = g.exec_json(&[
            "--repo-id",
            "demo",
            "--runtime",
            "python",
            "--output-mode",
            "summary",
            "--executable",
            "python3",
            "--",
            "-c",
            "import os; print(os.path.exists(os.environ.get('S', '/nonexistent')))",
        ]);
        assert_eq!(v["status"], "success", "{v}\n{}", stderr(&out));
    }
}
