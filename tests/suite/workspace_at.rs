//! The workspace where it is (`--workspace-at`, issue 54): what holds the
//! checkout's absolute path (a virtualenv's console scripts, an editable
//! install's `.pth`) works inside with the workspace at its host path,
//! and fails, as before, at /workspace. A path that would replace the
//! sandbox's own layout is refused.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const PYTHON: &str = "/usr/bin/python3";

/// A real virtualenv (no pip: fast) in a temporary workspace, with a
/// console script whose `#!` names the venv's interpreter by its absolute
/// path, and an editable install (a `.pth` naming the checkout's `src`).
fn venv_workspace() -> Option<(tempfile::TempDir, PathBuf)> {
    if !Path::new(PYTHON).exists() {
        skip("no /usr/bin/python3 on this host to make a virtualenv with");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    let made = Command::new(PYTHON).args(["-m", "venv", "--without-pip", ".venv"]).current_dir(&ws).output().unwrap();
    assert!(made.status.success(), "{}", stderr(&made));
    std::fs::create_dir_all(ws.join("src/hello")).unwrap();
    std::fs::write(ws.join("src/hello/__init__.py"), "def main():\n    print('hello from', __file__)\n").unwrap();
    let site = std::fs::read_dir(ws.join(".venv/lib")).unwrap().next().unwrap().unwrap().path().join("site-packages");
    std::fs::write(site.join("_hello.pth"), format!("{}\n", ws.join("src").display())).unwrap();
    let script = ws.join(".venv/bin/hello");
    let python = ws.join(".venv/bin/python");
    std::fs::write(&script, format!("#!{}\nfrom hello import main\nmain()\n", python.display())).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    Some((dir, ws))
}

#[test]
fn a_virtualenv_runs_with_the_workspace_at_its_host_path() {
    if !sandbox_available() {
        return;
    }
    let Some((_dir, ws)) = venv_workspace() else { return };
    let w = ws.to_str().unwrap();
    let source = ws.join("src/hello/__init__.py");
    let out = run(&["--workspace", w, "--workspace-at", "host", "--", "/bin/sh", "-c", "pwd; .venv/bin/hello"]);
    assert_eq!(stdout(&out), format!("{w}\nhello from {}\n", source.display()), "{}", stderr(&out));
    let out = run(&["--workspace", w, "--workspace-at", "host", "--", ".venv/bin/python", "-c", "import hello"]);
    assert!(out.status.success(), "the editable install: {}", stderr(&out));

    // At /workspace, as before: the script's interpreter is not there,
    // and the editable install's path leads nowhere.
    let out = run(&["--workspace", w, "--", ".venv/bin/hello"]);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    let out = run(&["--workspace", w, "--", ".venv/bin/python", "-c", "import hello"]);
    assert!(stderr(&out).contains("ModuleNotFoundError"), "{}", stderr(&out));
}

/// Read-write at its host path: what the job writes lands in the
/// workspace, its `.git` stays read-only, and the outcome names the
/// protected path where the job saw it.
#[test]
fn a_read_write_workspace_at_its_host_path_keeps_git_read_only() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(ws.join(".git")).unwrap();
    let status = ws.join("status.json");
    let w = ws.to_str().unwrap();
    let out = run(&[
        "--workspace",
        w,
        "--rw",
        "--workspace-at",
        "host",
        "--json-status",
        status.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        "echo x > made; touch .git/hook 2>/dev/null || echo git-ro; mkdir -p sub/.git",
    ]);
    assert_eq!(stdout(&out), "git-ro\n", "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(ws.join("made")).unwrap(), "x\n");
    if is_root() {
        // Idmapped (root's directory, a job of another uid) and swept at
        // its path: the repository the job made is handed to its ids.
        use std::os::unix::fs::MetadataExt;
        let made = std::fs::metadata(ws.join("sub/.git")).unwrap();
        assert_eq!((made.uid(), made.gid()), (65534, 65534), "the job's repository is disowned");
    }
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["layers"]["protected"], serde_json::json!([format!("{w}/.git")]), "{v}");
}

/// A path of the sandbox's own layout is refused, with what to do.
#[test]
fn the_sandbox_layout_is_never_the_workspace() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().to_str().unwrap();
    for (at, code, says) in [
        ("/proc/x", 2, "/proc is made for each job"),
        ("/tmp", 2, "would hide that whole directory"),
        ("/", 2, "whole root"),
        ("rel", 2, "give `host`, `/workspace`, or an absolute path"),
    ] {
        let out = run(&["--workspace", w, "--workspace-at", at, "--", "/bin/true"]);
        assert_eq!(out.status.code(), Some(code), "{at}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{at}: {}", stderr(&out));
    }
    let out = run(&["--workspace", "/", "--workspace-at", "host", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("--workspace-at host: /: the workspace would replace"), "{}", stderr(&out));
    // A bind inside the workspace, or around it, wherever it is.
    let out = run(&["--workspace", w, "--workspace-at", "/src/app", "--ro-bind", "/etc:/src", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("around the workspace (/src/app)"), "{}", stderr(&out));
}

/// `confine exec`: where `[[repos]]` says, and `--workspace-at` for one call.
#[test]
fn exec_mounts_a_repository_where_asked() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = std::fs::canonicalize(readable_repo(dir.path())).unwrap();
    let config = dir.path().join("confine.toml");
    let exec = |extra: &str, args: &[&str]| {
        let text = exec_config(&dir.path().join("store"), "demo", &repo) + extra;
        std::fs::write(&config, text).unwrap();
        Command::new(bin())
            .arg("--config")
            .arg(&config)
            .args(["exec", "--repo-id", "demo", "--runtime", "shell"])
            .args(args)
            .args(["--", "-c", "pwd"])
            .env("XDG_DATA_HOME", dir.path())
            .output()
            .unwrap()
    };
    let out = exec("workspace_at = \"host\"\n", &[]);
    assert_eq!(stdout(&out), format!("{}\n", repo.display()), "{}", stderr(&out));
    let out = exec("workspace_at = \"host\"\n", &["--workspace-at", "/src/app"]);
    assert_eq!(stdout(&out), "/src/app\n", "{}", stderr(&out));
    let out = exec("", &[]);
    assert_eq!(stdout(&out), "/workspace\n", "{}", stderr(&out));
    let out = exec("workspace_at = \"/dev/x\"\n", &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("/dev is made for each job"), "{}", stderr(&out));
}
