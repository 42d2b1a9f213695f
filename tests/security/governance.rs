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
        let dir = tempfile::tempdir().unwrap();
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
