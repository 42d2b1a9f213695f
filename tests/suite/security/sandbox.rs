//! Classes of the sandbox itself and of `confine run`: paths the
//! supervisor writes (1), host ids (3), planted code and setuid bits (4),
//! default limits (5), kernel counters (6), session and terminal (7),
//! inherited attributes (8), `/proc` and syscalls (9), locked mounts (10),
//! and the posture test.
//!
//! Each test is the attack, run by a real job against a real sandbox, and
//! what the host must see afterwards.

use crate::common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A workspace directory owned by `uid:gid`, mode 0755.
fn workspace(uid: u32, gid: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// `confine run FLAGS… -- python3 -c CODE`.
fn python(flags: &[&str], code: &str) -> std::process::Output {
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "/usr/bin/python3", "-c", code]);
    run(&args)
}

/// `confine run FLAGS… -- /bin/sh -c SCRIPT`.
fn sh(flags: &[&str], script: &str) -> std::process::Output {
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "/bin/sh", "-c", script]);
    run(&args)
}

/// `key=value` lines of a job's output.
fn answers(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.trim().to_string(), v.trim().to_string())).collect()
}

fn root_sandbox() -> bool {
    if !is_root() {
        skip("the security suite's sandbox classes run as root, as the probes did");
        return false;
    }
    sandbox_available()
}

/// Whether `ioprio_get`'s answer is the kernel's default: class none (no
/// priority of its own), at level 0 (Linux 5.18 on) or IOPRIO_NORM, 4,
/// which older kernels report for a process with no I/O context.
fn is_default_ioprio(v: &str) -> bool {
    v == "0" || v == "4"
}

// ---- class 1: the supervisor never writes through what the job planted ----

/// The job replaces its `--json-status` file with a symlink to a host
/// path: confine must replace the link, never write through it.
#[test]
fn class01_json_status_symlink_planted_by_the_job_is_not_followed() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("root-owned-file");
    let script = format!("rm -f status.json; ln -s {} status.json", target.display());
    let ws_path = ws.path().to_str().unwrap();
    let out = sh(&["--workspace", ws_path, "--rw", "--json-status", &format!("{ws_path}/status.json")], &script);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!target.exists(), "confine wrote through the job's symlink to {}", target.display());
    let meta = std::fs::symlink_metadata(ws.path().join("status.json")).unwrap();
    assert!(meta.is_file(), "status.json must be a regular file again");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(ws.path().join("status.json")).unwrap()).unwrap();
    assert_eq!(v["status"], "success");
}

/// The job replaces its status file with a FIFO: confine must not block.
#[test]
fn class01_json_status_fifo_planted_by_the_job_does_not_block() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    let ws_path = ws.path().to_str().unwrap();
    let mut cmd = confine();
    cmd.args(["run", "--workspace", ws_path, "--rw", "--json-status", &format!("{ws_path}/status.json")]);
    cmd.args(["--", "/bin/sh", "-c", "rm -f status.json; mkfifo status.json"]);
    let out = output_within(&mut cmd, Duration::from_secs(20));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::symlink_metadata(ws.path().join("status.json")).unwrap().is_file());
}

/// SIGTERM ends the CLI, and the job with it, even when the job ignores
/// SIGTERM and the CLI's own output is stuck (a reader that never reads).
#[test]
fn class01_sigterm_always_ends_the_cli_and_the_job() {
    if !root_sandbox() {
        return;
    }
    let token = token("class01-term");
    // stdout: a socket nobody reads, so confine relays it and its relay
    // blocks once the socket's buffer is full.
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let script = format!(
        "trap '' TERM; exec -a {token} /bin/sh -c 'trap \"\" TERM; while :; do echo {token}{token}{token}; done'"
    );
    let mut child = confine()
        .args(["run", "--kill-grace", "300ms", "--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Until the job runs (its pid is on the host, in its pid namespace).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while host_pids_with(&token).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("confine did not end within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(ours);
    assert!(!status.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !host_pids_with(&token).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(host_pids_with(&token), Vec::<u32>::new(), "the job outlived confine");
}

/// `confine exec --code-file` reads a file in a repository that jobs write
/// to: a symlink planted there (to a host secret that root can read) or a
/// FIFO must be refused, never followed into the next job or blocked on.
#[test]
fn class01_code_and_stdin_files_planted_by_a_job_are_refused() {
    if !root_sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, exec_config(&dir.path().join("store"), "r", &repo)).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", repo.join("main.py")).unwrap();
    nix::unistd::mkfifo(&repo.join("input"), nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let exec = |extra: &[&str]| {
        let mut cmd = confine();
        cmd.arg("--config").arg(&config).args(["exec", "--repo-id", "r", "--runtime", "python"]).args(extra);
        output_within(&mut cmd, Duration::from_secs(30))
    };
    let out = exec(&["--code-file", repo.join("main.py").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125), "{}", stdout(&out));
    assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
    assert!(!stdout(&out).contains("root:"), "the host's /etc/shadow reached the job");
    let out = exec(&["--code", "print(1)", "--stdin-file", repo.join("input").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("not a regular file"), "{}", stderr(&out));
}

/// An earlier job left a symlink in the workspace; a later run that binds a
/// path through it, or writes its status through it, is refused: the link
/// would choose the host path (the job's home directory, a root-only one).
#[test]
fn class01_paths_through_a_symlink_a_job_planted_are_refused() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    let secret = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let wsp = ws.path().to_str().unwrap();
    let plant = format!("ln -s {} cache && ln -s {} out", secret.path().display(), secret.path().display());
    let out = sh(&["--workspace", wsp, "--rw"], &plant);
    assert!(out.status.success(), "{}", stderr(&out));
    let bind = format!("{wsp}/cache:/cache");
    let out = sh(&["--workspace", wsp, "--bind", &bind], "touch /cache/x");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("symbolic link inside a directory that jobs write to"), "{}", stderr(&out));
    let status = format!("{wsp}/out/status.json");
    let out = run(&["--workspace", wsp, "--rw", "--json-status", &status, "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert_eq!(std::fs::read_dir(secret.path()).unwrap().count(), 0, "something was written through the link");
}

/// A job sharing the workspace swaps a directory and a symlink to a secret
/// directory back and forth (`renameat2(RENAME_EXCHANGE)`) while other
/// runs bind that directory, or write their status into it: no run may
/// ever bind the secret, nor write into it. (The check and the open were
/// once two steps, and the swap won within 20 tries.)
#[test]
fn class01_a_concurrent_swap_never_redirects_a_bind_or_the_status() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("id_rsa"), "owner secret\n").unwrap();
    std::fs::create_dir(ws.path().join("logs")).unwrap();
    std::os::unix::fs::symlink(secret.path(), ws.path().join("logs2")).unwrap();
    let swap = format!(
        r#"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + 60
while time.time() < end:
    libc.renameat2(-100, b"{ws}/logs", -100, b"{ws}/logs2", 2)
"#,
        ws = ws.path().display()
    );
    let mut swapper = Command::new("/usr/bin/python3").args(["-c", &swap]).spawn().unwrap();
    let wsp = ws.path().to_str().unwrap();
    let bind = format!("{wsp}/logs:/data");
    let status = format!("{wsp}/logs/status.json");
    let mut leaked = Vec::new();
    for i in 0..60 {
        let out = sh(&["--workspace", wsp, "--bind", &bind], "cat /data/id_rsa 2>/dev/null");
        if stdout(&out).contains("owner secret") {
            leaked.push(format!("bind, try {i}"));
        }
        let _ = run(&["--workspace", wsp, "--json-status", &status, "--", "/bin/true"]);
        if secret.path().join("status.json").exists() {
            leaked.push(format!("status, try {i}"));
            let _ = std::fs::remove_file(secret.path().join("status.json"));
        }
    }
    let _ = swapper.kill();
    let _ = swapper.wait();
    assert!(leaked.is_empty(), "the swap redirected: {leaked:?}");
}

// ---- class 3: the job's host ids are unprivileged ----

/// A workspace in group `shadow`: the job must not join that group, so
/// `/etc/shadow` (root:shadow 0640) stays unreadable.
#[test]
fn class03_the_workspace_group_is_never_the_jobs() {
    if !root_sandbox() {
        return;
    }
    let Some(shadow) = nix::unistd::Group::from_name("shadow").unwrap() else {
        return skip("this host has no shadow group");
    };
    let meta = std::fs::metadata("/etc/shadow").unwrap();
    assert_eq!(
        (meta.gid(), meta.mode() & 0o077),
        (shadow.gid.as_raw(), 0o040),
        "the attack needs /etc/shadow root:shadow 0640"
    );
    for owner in [1000, 0] {
        let ws = workspace(owner, shadow.gid.as_raw());
        let out = sh(&["--workspace",
            ws.path().to_str().unwrap()], "echo gid=$(id -g); echo groups=$(id -G); head -c1 /etc/shadow >/dev/null 2>&1 && echo shadow=readable || echo shadow=denied");
        let a = answers(&stdout(&out));
        assert_eq!(a.get("shadow").map(String::as_str), Some("denied"), "owner {owner}: {a:?} {}", stderr(&out));
        assert_eq!(a.get("gid").map(String::as_str), Some("65534"), "owner {owner}: {a:?}");
        assert_eq!(a.get("groups").map(String::as_str), Some("65534"), "owner {owner}: {a:?}");
    }
}

/// A workspace owned by a system account (uid < 1000: `postgres`, `www-data`)
/// does not make the job that account: it could read what the account owns
/// in the bound system paths.
#[test]
fn class03_a_system_accounts_workspace_runs_the_job_as_nobody() {
    if !root_sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    for (owner, want) in [(33, 65534), (0, 65534), (1000, 1000)] {
        let ws = workspace(owner, owner);
        let out = sh(&["--workspace", ws.path().to_str().unwrap(), "--json-status", status.to_str().unwrap()], "id -u");
        assert_eq!(stdout(&out).trim(), want.to_string(), "owner {owner}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
        assert_eq!(v["layers"]["hostUid"], want, "{v}");
        assert_eq!(v["layers"]["hostGid"], 65534, "{v}");
    }
}

// ---- class 4: no planted code for the host, no setuid files ----

/// A git repository as the workspace, owned by uid 1000, with a commit.
fn git_workspace() -> tempfile::TempDir {
    let ws = workspace(1000, 1000);
    let git = |args: &[&str]| assert!(git_in(ws.path(), args), "git {args:?}");
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "init"]);
    let ok = Command::new("chown").args(["-R", "1000:1000"]).arg(ws.path()).status().unwrap().success();
    assert!(ok, "chown");
    ws
}

/// Every way into what the host's `git` runs next, tried by the job:
/// hooks, config (fsmonitor), `commondir` (which redirects config and
/// hooks), the index (a submodule entry whose fsmonitor runs), modules,
/// and renaming `.git` away for a fresh one.
const PLANT: &str = r##"
try() { name=$1; shift; if ( "$@" ) >/dev/null 2>&1; then echo "$name=planted"; else echo "$name=refused"; fi; }
try hook sh -c 'echo "#!/bin/sh" > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit'
try config sh -c 'printf "[core]\n\tfsmonitor = touch /tmp/pwned\n" >> .git/config'
try commondir sh -c 'mkdir -p .evil/hooks && echo ../.evil > .git/commondir'
try index git update-index --add --cacheinfo 160000,$(git rev-parse HEAD),sub
try modules mkdir -p .git/modules/sub/hooks
try rename mv .git .git-away
try chmod chmod 000 .git
echo data > file.txt && echo write=ok
"##;

#[test]
fn class04_git_stays_read_only_in_a_rw_workspace() {
    if !root_sandbox() {
        return;
    }
    let ws = git_workspace();
    let config_before = std::fs::read(ws.path().join(".git/config")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let wsp = ws.path().to_str().unwrap();
    let out = sh(&["--workspace", wsp, "--rw", "--json-status", status.to_str().unwrap()], PLANT);
    let a = answers(&stdout(&out));
    for k in ["hook", "config", "commondir", "index", "modules", "rename", "chmod"] {
        assert_eq!(a.get(k).map(String::as_str), Some("refused"), "{k}: {a:?} {}", stderr(&out));
    }
    assert_eq!(a.get("write").map(String::as_str), Some("ok"), "{a:?}");
    assert!(!ws.path().join(".git/hooks/pre-commit").exists());
    assert!(!ws.path().join(".git/commondir").exists());
    assert_eq!(std::fs::read(ws.path().join(".git/config")).unwrap(), config_before);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["layers"]["protected"], serde_json::json!(["/workspace/.git"]), "{v}");
    // The host's git still works on it.
    assert!(git_in(ws.path(), &["status", "--short"]));

    // --no-protect lifts it (the user's choice), --protect adds a path.
    std::fs::write(ws.path().join(".env"), "SECRET=1\n").unwrap();
    let out = sh(&["--workspace", wsp, "--rw", "--no-protect", "--protect", ".env"], "echo x >> .env 2>/dev/null && echo env=written || echo env=refused; echo x > .git/hooks/pre-push && echo hook=written");
    let a = answers(&stdout(&out));
    assert_eq!(a.get("env").map(String::as_str), Some("refused"), "{a:?} {}", stderr(&out));
    assert_eq!(a.get("hook").map(String::as_str), Some("written"), "{a:?}");
    let out = run(&["--workspace", wsp, "--rw", "--protect", "no/such/path", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("--protect no/such/path"), "{}", stderr(&out));
}

/// A job that made `.git` unreadable to its own uid (`chmod 000`, in an
/// earlier run or a concurrent one) can't make the next run skip the
/// protection: it is walked as root, and holds.
#[test]
fn class04_a_job_cannot_hide_git_from_the_protection() {
    if !root_sandbox() {
        return;
    }
    let ws = git_workspace();
    std::fs::set_permissions(ws.path().join(".git"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = sh(&["--workspace", ws.path().to_str().unwrap(), "--rw"], "chmod 755 .git 2>/dev/null && echo chmod=done || echo chmod=refused; echo x > .git/hooks/pre-commit 2>/dev/null && echo hook=planted || echo hook=refused");
    let a = answers(&stdout(&out));
    assert_eq!(a.get("chmod").map(String::as_str), Some("refused"), "{a:?} {}", stderr(&out));
    assert_eq!(a.get("hook").map(String::as_str), Some("refused"), "{a:?}");
    assert!(!ws.path().join(".git/hooks/pre-commit").exists());
}

/// `core.hooksPath` into the workspace (husky's `.husky`): kept read-only;
/// named but missing, the run is refused (a job could create it).
#[test]
fn class04_a_hooks_path_in_the_workspace_is_protected() {
    if !root_sandbox() {
        return;
    }
    let ws = git_workspace();
    let mut config = std::fs::read_to_string(ws.path().join(".git/config")).unwrap();
    config.push_str("[core]\n\thooksPath = .husky\n");
    std::fs::write(ws.path().join(".git/config"), config).unwrap();
    let wsp = ws.path().to_str().unwrap();
    let out = run(&["--workspace", wsp, "--rw", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("core.hooksPath")
            && stderr(&out).contains(".husky, inside the workspace, which does not exist"),
        "{}",
        stderr(&out)
    );
    std::fs::create_dir(ws.path().join(".husky")).unwrap();
    std::os::unix::fs::chown(ws.path().join(".husky"), Some(1000), Some(1000)).unwrap();
    let out = sh(
        &["--workspace", wsp, "--rw"],
        "echo evil > .husky/pre-commit 2>/dev/null && echo hook=planted || echo hook=refused",
    );
    assert_eq!(answers(&stdout(&out)).get("hook").map(String::as_str), Some("refused"), "{}", stderr(&out));
}

/// A `.git` gitfile (a worktree's) is protected itself: repointed, it would
/// hand the host's git a gitdir of the job's making. A symlinked `.git`
/// can be repointed by the job: refused (fail closed), the way out named.
#[test]
fn class04_a_gitfile_and_a_symlinked_git_are_handled() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    std::fs::write(ws.path().join(".git"), "gitdir: /srv/real/.git/worktrees/w\n").unwrap();
    std::os::unix::fs::chown(ws.path().join(".git"), Some(1000), Some(1000)).unwrap();
    let wsp = ws.path().to_str().unwrap();
    let out = sh(
        &["--workspace", wsp, "--rw"],
        "echo 'gitdir: /tmp/evil' > .git && echo gitfile=written || echo gitfile=refused",
    );
    assert_eq!(answers(&stdout(&out)).get("gitfile").map(String::as_str), Some("refused"), "{}", stderr(&out));
    let ws = workspace(1000, 1000);
    let real = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(real.path(), ws.path().join(".git")).unwrap();
    let out = run(&["--workspace", ws.path().to_str().unwrap(), "--rw", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains(".git is a symbolic link") && stderr(&out).contains("--no-protect"),
        "{}",
        stderr(&out)
    );
}

/// Common layouts where git reads or runs files of the worktree itself:
/// a nested repository, a gitfile whose gitdir is in the workspace, an
/// `include.path` of a worktree file, a hook that is a symlink to a
/// worktree script. The job can write none of them.
#[test]
fn class04_what_git_reads_from_the_worktree_stays_read_only() {
    if !root_sandbox() {
        return;
    }
    let ws = git_workspace();
    let w = ws.path();
    let git = |dir: &std::path::Path, args: &[&str]| assert!(git_in(dir, args), "git {args:?}");
    std::fs::create_dir_all(w.join("vendor/lib")).unwrap();
    git(&w.join("vendor/lib"), &["init", "-q"]);
    std::fs::create_dir_all(w.join("scripts")).unwrap();
    std::fs::write(w.join("scripts/pre-commit.sh"), "#!/bin/sh\necho hook\n").unwrap();
    std::os::unix::fs::symlink("../../scripts/pre-commit.sh", w.join(".git/hooks/pre-commit")).unwrap();
    std::fs::write(w.join(".gitconfig.shared"), "[core]\n").unwrap();
    let mut config = std::fs::read_to_string(w.join(".git/config")).unwrap();
    config.push_str("[include]\n\tpath = ../.gitconfig.shared\n");
    std::fs::write(w.join(".git/config"), config).unwrap();
    assert!(Command::new("chown").args(["-R", "1000:1000"]).arg(w).status().unwrap().success());
    let script = r#"
for f in .gitconfig.shared vendor/lib/.git/config scripts/pre-commit.sh; do
  (echo "[core] fsmonitor = echo PWNED" >> $f) 2>/dev/null && echo "$f=planted" || echo "$f=refused"
done
"#;
    let out = sh(&["--workspace", w.to_str().unwrap(), "--rw"], script);
    let a = answers(&stdout(&out));
    for f in [".gitconfig.shared", "vendor/lib/.git/config", "scripts/pre-commit.sh"] {
        assert_eq!(a.get(f).map(String::as_str), Some("refused"), "{f}: {a:?} {}", stderr(&out));
    }
    // A gitfile whose gitdir lies in the workspace (--separate-git-dir).
    let ws2 = workspace(1000, 1000);
    std::fs::create_dir(ws2.path().join(".repo")).unwrap();
    git(ws2.path(), &["init", "-q", "--separate-git-dir", ".repo/p.git"]);
    assert!(Command::new("chown").args(["-R", "1000:1000"]).arg(ws2.path()).status().unwrap().success());
    let out = sh(
        &["--workspace", ws2.path().to_str().unwrap(), "--rw"],
        "echo x >> .repo/p.git/config 2>/dev/null && echo config=planted || echo config=refused",
    );
    assert_eq!(answers(&stdout(&out)).get("config").map(String::as_str), Some("refused"), "{}", stderr(&out));
}

/// A hard link an earlier run without the protection left to `.git/config`
/// (or to a `--protect`ed file) would let this run write it through the
/// other name: such a run is refused, and the way out is not --no-protect.
#[test]
fn class04_a_second_name_of_a_protected_file_is_refused() {
    if !root_sandbox() {
        return;
    }
    let ws = git_workspace();
    let wsp = ws.path().to_str().unwrap();
    let out = sh(&["--workspace", wsp, "--rw", "--no-protect"], "ln .git/config notes.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = sh(&["--workspace", wsp, "--rw"], "echo '[core] fsmonitor = x' >> notes.txt");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("has 2 names"), "{}", stderr(&out));
    std::fs::remove_file(ws.path().join("notes.txt")).unwrap();
    std::fs::write(ws.path().join("deploy.sh"), "echo deploy\n").unwrap();
    std::fs::hard_link(ws.path().join("deploy.sh"), ws.path().join("readme.txt")).unwrap();
    let out = run(&["--workspace", wsp, "--rw", "--protect", "deploy.sh", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("has 2 names") && stderr(&out).contains("remove it"), "{}", stderr(&out));
}

/// A read-only bind inside the workspace would be hidden by it (or decide
/// by mount order): refused, pointing at --protect.
#[test]
fn class04_binds_nested_in_the_workspace_are_refused() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    std::fs::write(ws.path().join(".env"), "SECRET=keep\n").unwrap();
    let wsp = ws.path().to_str().unwrap();
    let bind = format!("{wsp}/.env:/workspace/.env");
    let out = sh(&["--workspace", wsp, "--rw", "--ro-bind", &bind], "echo changed > /workspace/.env");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("--protect"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(ws.path().join(".env")).unwrap(), "SECRET=keep\n");
}

/// Setuid and setgid bits can't be set by any call, and file capabilities
/// can't be written: such a file left in the workspace would run with its
/// owner's ids on the host. On a user's workspace, and on root's, where
/// the job owns every file through an idmapped mount (a setuid file there
/// would be setuid root on the host).
#[test]
fn class04_setuid_setgid_and_file_capabilities_are_refused() {
    if !root_sandbox() {
        return;
    }
    let idmap = idmap_supported(&std::env::temp_dir());
    for (uid, gid) in [(1000, 1000), (0, 0), (1000, 0), (500, 500)] {
        setuid_attempts(&workspace(uid, gid), uid, idmap);
    }
}

/// The attempts in a `--rw` workspace owned by `uid`. Without idmapped
/// mounts (`idmap` false) the workspace is bound as it is: a user's is
/// still the job's (it runs as its owner), and one the job can't write
/// (root's, a system account's) is refused before it runs, saying why.
fn setuid_attempts(ws: &tempfile::TempDir, uid: u32, idmap: bool) {
    let code = r#"
import ctypes, errno, os, stat
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f(); print(f"{name}=ok")
    except OSError as e:
        print(f"{name}={errno.errorcode[e.errno]}")
def sys(name, nr, *args):
    def call():
        if libc.syscall(nr, *args) < 0:
            raise OSError(ctypes.get_errno(), name)
    attempt(name, call)
open("f", "w").close()
attempt("chmod_suid", lambda: os.chmod("f", 0o4755))
attempt("chmod_sgid", lambda: os.chmod("f", 0o2755))
attempt("chmod_plain", lambda: os.chmod("f", 0o755))
fd = os.open("f", os.O_RDONLY)
attempt("fchmod_suid", lambda: os.fchmod(fd, 0o4755))
attempt("open_creat_suid", lambda: os.close(os.open("g", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mkdir_sgid", lambda: os.mkdir("d", 0o2755))
attempt("mknod_suid", lambda: os.mknod("n", stat.S_IFREG | 0o4755))
# High bits set to dodge a 64-bit comparison: the kernel reads 16 of them.
sys("chmod_suid_high", 90, b"f", ctypes.c_ulong(0x100000000 | 0o4755))
sys("fchmodat2_suid", 452, -100, b"f", ctypes.c_ulong(0o4755), 0)
sys("openat2", 437, -100, b"f", ctypes.c_void_p(0), 24)
attempt("setcap", lambda: os.setxattr("f", "security.capability", b"\x01\x00\x00\x02" + b"\x00" * 16))
print("mode=%o" % stat.S_IMODE(os.stat("f").st_mode))
"#;
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("status.json");
    let out =
        python(&["--workspace", ws.path().to_str().unwrap(), "--rw", "--json-status", st.to_str().unwrap()], code);
    let v: serde_json::Value =
        std::fs::read(&st).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    if idmap {
        assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "uid {uid}: {v}");
    } else if uid >= 1000 {
        assert_eq!(v["layers"]["idmapped"], serde_json::Value::Null, "uid {uid}: {v}");
        assert_eq!(v["layers"]["hostUid"], uid, "uid {uid}: the job runs as the owner: {v}");
        let why = v["layers"]["notIdmapped"][0].as_str().unwrap_or_default();
        assert!(why.starts_with("/workspace: this kernel has no idmapped mounts"), "uid {uid}: {v}");
    } else {
        assert_eq!(out.status.code(), Some(125), "uid {uid}: ran on a workspace it can't write: {v}");
        let err = stderr(&out);
        assert!(err.contains("can't write") && err.contains("idmapped"), "uid {uid}: {err}");
        assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 0, "uid {uid}: nothing ran");
        return;
    }
    let a = answers(&stdout(&out));
    for (k, v) in [
        ("chmod_suid", "EPERM"),
        ("chmod_sgid", "EPERM"),
        ("chmod_plain", "ok"),
        ("fchmod_suid", "EPERM"),
        ("open_creat_suid", "EPERM"),
        ("mkdir_sgid", "EPERM"),
        ("mknod_suid", "EPERM"),
        ("chmod_suid_high", "EPERM"),
        ("fchmodat2_suid", "EPERM"),
        ("openat2", "ENOSYS"),
        ("setcap", "EPERM"),
        ("mode", "755"),
    ] {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "uid {uid}, {k}: {a:?} {}", stderr(&out));
    }
    let mut seen = 0;
    for entry in std::fs::read_dir(ws.path()).unwrap() {
        let path = entry.unwrap().path();
        let m = std::fs::symlink_metadata(&path).unwrap();
        assert_eq!(m.mode() & 0o6000, 0, "uid {uid}: a setuid or setgid file reached the host: {}", path.display());
        assert_eq!(m.uid(), uid, "uid {uid}: {} is not the workspace owner's", path.display());
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path and name, and a zero-length buffer.
        let n = unsafe { libc::lgetxattr(c.as_ptr(), c"security.capability".as_ptr(), std::ptr::null_mut(), 0) };
        assert!(n < 0, "uid {uid}: {} carries file capabilities", path.display());
        seen += 1;
    }
    assert_eq!(seen, 1, "uid {uid}: only the plain file is there");
}

// ---- class 5: limits by default ----

#[test]
fn class05_confine_run_has_default_limits_and_unlimited_lifts_them() {
    if !root_sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let s = status.to_str().unwrap();
    // A fork bomb, bounded: it must stop at the pids limit, not at the host's.
    let bomb = "n=0; while [ $n -lt 400 ]; do sleep 30 & n=$((n+1)); done 2>/dev/null; echo started=$(jobs -p | wc -l); kill $(jobs -p) 2>/dev/null; exit 0";
    let out = run(&["--json-status", s, "--", "/bin/bash", "-c", bomb]);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["limits"]["memoryBytes"], 512u64 << 20, "{v}");
    assert_eq!(v["limits"]["pids"], 256, "{v}");
    assert_eq!(v["limits"]["cpus"], 1.0, "{v}");
    let started: u32 = answers(&stdout(&out)).get("started").and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(started < 256, "the default pids limit did not hold: {started} started; {}", stderr(&out));
    let out = run(&[
        "--json-status",
        s,
        "--pids",
        "unlimited",
        "--memory",
        "unlimited",
        "--cpus",
        "unlimited",
        "--",
        "/bin/true",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    for k in ["memoryBytes", "pids", "cpus"] {
        assert!(v["limits"][k].is_null(), "{k}: {v}");
    }
}

/// /tmp and /dev/shm cap their inodes as well as their bytes.
#[test]
fn class05_tmp_and_shm_cap_their_inodes() {
    if !root_sandbox() {
        return;
    }
    let code = r#"
import os
for d in ("/tmp", "/dev/shm"):
    n = 0
    try:
        while n < 200000:
            open(f"{d}/f{n}", "w").close(); n += 1
    except OSError as e:
        pass
    print(f"{d}={n}")
"#;
    let out = python(&["--tmp-size", "4M"], code);
    let a = answers(&stdout(&out));
    for d in ["/tmp", "/dev/shm"] {
        let n: u64 = a.get(d).and_then(|n| n.parse().ok()).unwrap_or(u64::MAX);
        // 4 MiB: 1,024 inodes (one per 4 KiB page, at least 1,024).
        assert!((1000..=1024).contains(&n), "{d}: {n} files; {a:?} {}", stderr(&out));
    }
}

// ---- class 6: kernel counters charged to the host's root ----

/// The job takes every inotify instance it can and holds them; root on
/// the host must still get one.
#[test]
fn class06_a_job_cannot_exhaust_roots_inotify_instances() {
    if !root_sandbox() {
        return;
    }
    let token = token("class06");
    let code = format!(
        r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 1000:
    fd = libc.inotify_init1(0)
    if fd < 0: break
    fds.append(fd)
print(f"instances={{len(fds)}}", flush=True)
print("limits=" + ",".join(open(f"/proc/sys/user/{{n}}").read().strip() for n in ("max_inotify_instances", "max_user_namespaces", "max_inotify_watches")), flush=True)
time.sleep(30)  # {token}
"#
    );
    let mut child = confine()
        .args(["run", "--", "/usr/bin/python3", "-c", &code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let instances = lines.next().unwrap().unwrap();
    let limits = lines.next().unwrap().unwrap();
    // While the job holds them: root's own inotify_init1.
    // SAFETY: inotify_init1 takes flags and returns a new fd or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    let err = std::io::Error::last_os_error();
    let _ = child.kill();
    let _ = child.wait();
    assert!(fd >= 0, "root's inotify_init1 failed while the job ran: {err} (job: {instances})");
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    assert_eq!(instances, "instances=16");
    assert_eq!(limits, "limits=16,0,16384");
}

/// Many jobs at once still can't take root's inotify instances, nor can
/// one job's queued signals starve another's: each job's user namespace
/// belongs to a uid of its own, whose counters they are charged to.
#[test]
fn class06_concurrent_jobs_charge_nothing_to_root_or_each_other() {
    if !root_sandbox() {
        return;
    }
    let hold = r#"
import ctypes, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = [libc.inotify_init1(0) for _ in range(64)]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
class sigval(ctypes.Union): _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
n = 0
while n < 100000 and libc.sigqueue(ctypes.c_int(__import__("os").getpid()), signal.SIGRTMIN, sigval(0)) == 0:
    n += 1
print(f"inotify={sum(1 for f in fds if f >= 0)} queued={n}", flush=True)
time.sleep(3600)
"#;
    let mut jobs = Vec::new();
    for _ in 0..9 {
        let mut child = confine()
            .args(["run", "--", "/usr/bin/python3", "-c", hold])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        jobs.push((child, line));
    }
    // Every holder holds its queue full until it is killed below: one that
    // ended early (a fixed sleep outlasted by a slow, emulated start of the
    // nine) would give its count back and let the last job queue.
    for (_, line) in &jobs {
        let queued = line.split("queued=").nth(1).and_then(|n| n.trim().parse::<u32>().ok());
        assert!(queued.is_some_and(|n| n < 100_000), "a holder did not fill its signal queue: {line:?}");
    }
    // SAFETY: inotify_init1 takes flags and returns a new fd or -1.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    let err = std::io::Error::last_os_error();
    // One more job's signal queue while the others hold theirs full.
    let out = python(&[], "import ctypes, os, signal\nlibc = ctypes.CDLL(None)\nsignal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\nprint('sigqueue=' + str(libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0))))");
    for (mut child, _) in jobs {
        let _ = child.kill();
        let _ = child.wait();
    }
    assert!(fd >= 0, "root's inotify_init1 failed while 9 jobs held theirs: {err}");
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    // Before Linux 5.14 queued signals count per user, not per user
    // namespace: jobs running as the same host uid share one count, which
    // no namespace of confine's can split (docs/design.md).
    let shared = kernel_version() < (5, 14);
    let want = if shared { "-1" } else { "0" };
    assert_eq!(answers(&stdout(&out)).get("sigqueue").map(String::as_str), Some(want), "{}", stderr(&out));
}

// ---- class 7: session, terminal and the caller's files ----

/// The job has a session of its own and no controlling terminal, even
/// when confine runs on one: it can't take the terminal's foreground
/// (TIOCSPGRP) nor type into it.
#[test]
fn class07_the_job_has_its_own_session_and_no_terminal() {
    if !root_sandbox() {
        return;
    }
    let code = r#"
import fcntl, os, struct, termios
print(f"sid_is_self={os.getsid(0) == os.getpid()}")
print(f"tty_nr={open('/proc/self/stat').read().rsplit(')', 1)[1].split()[4]}")
for fd in (0, 1, 2):
    print(f"fd{fd}={os.readlink(f'/proc/self/fd/{fd}').split(':')[0]}")
    try:
        fcntl.ioctl(fd, termios.TIOCSPGRP, struct.pack("i", os.getpgrp())); print(f"tiocspgrp{fd}=ok")
    except OSError as e:
        print(f"tiocspgrp{fd}=refused")
try:
    os.open("/dev/tty", os.O_RDWR); print("devtty=open")
except OSError as e:
    print(f"devtty={os.strerror(e.errno)}")
"#;
    // confine on a real terminal: `script` gives it one, as its stdio and
    // controlling tty, in the foreground.
    let cmd = format!("{} run -- /usr/bin/python3 -c '{}'", bin(), code.replace('\'', "'\\''"));
    let out =
        Command::new("script").envs(degraded_env()).args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output();
    let Ok(out) = out else { return skip("script (util-linux) is not available") };
    let text = stdout(&out).replace('\r', "");
    let a = answers(&text);
    assert_eq!(a.get("sid_is_self").map(String::as_str), Some("True"), "{text}");
    assert_eq!(a.get("tty_nr").map(String::as_str), Some("0"), "{text}");
    for fd in 0..3 {
        assert_eq!(a.get(&format!("tiocspgrp{fd}")).map(String::as_str), Some("refused"), "{text}");
        assert_ne!(a.get(&format!("fd{fd}")).map(String::as_str), Some("/dev/pts/0"), "{text}");
    }
    // /dev/tty is there (a pty the job opens may become its terminal),
    // and names no terminal of the job's session.
    assert_eq!(a.get("devtty").map(String::as_str), Some("No such device or address"), "{text}");
}

/// What the user types on the terminal reaches the job only with `-i`:
/// without it the job reads end of file, and type-ahead stays for the shell.
#[test]
fn class07_terminal_input_reaches_the_job_only_when_asked() {
    if !root_sandbox() {
        return;
    }
    for (flag, want) in [("", "got=[]"), ("-i", "got=[hello]")] {
        let cmd = format!("{} run {flag} -- /bin/sh -c 'read x; echo \"got=[$x]\"'", bin());
        let child = Command::new("script")
            .envs(degraded_env())
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let Ok(mut child) = child else { return skip("script (util-linux) is not available") };
        std::thread::sleep(Duration::from_millis(500));
        // (Without -i the job may be gone already: the write may fail.)
        let _ = std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"hello\n");
        let out = child.wait_with_output().unwrap();
        let text = stdout(&out).replace('\r', "");
        assert!(text.lines().any(|l| l.ends_with(want)), "{flag}: {text}");
    }
}

/// A regular file on stdout is relayed: the job gets a pipe, and can't
/// truncate or rewrite the caller's log behind it.
#[test]
fn class07_a_regular_file_on_stdout_is_relayed_not_passed() {
    if !root_sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    std::fs::write(&log, "precious\n").unwrap();
    let file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let code = "import os\ntry:\n    os.ftruncate(1, 0); print('truncate=ok')\nexcept OSError:\n    print('truncate=refused')\nprint('kind=' + os.readlink('/proc/self/fd/1').split(':')[0], flush=True)";
    let out = confine()
        .args(["run", "--", "/usr/bin/python3", "-c", code])
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text, "precious\ntruncate=refused\nkind=pipe\n");
}

/// A pipe passes through opened afresh: the job's file status flags
/// (`O_NONBLOCK`) stay its own, and the caller's writers are unaffected.
#[test]
fn class07_a_jobs_pipe_flags_do_not_reach_the_caller() {
    if !root_sandbox() {
        return;
    }
    let (read, write) = nix::unistd::pipe().unwrap();
    let ours = write.try_clone().unwrap();
    let out = confine()
        .args([
            "run",
            "--",
            "/usr/bin/python3",
            "-c",
            "import fcntl, os\nfcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let flags = nix::fcntl::fcntl(&ours, nix::fcntl::FcntlArg::F_GETFL).unwrap();
    assert_eq!(flags & libc::O_NONBLOCK, 0, "the job set O_NONBLOCK on the caller's pipe");
    drop(read);
}

/// `--tty`: a pty of the job's own, its controlling terminal, relayed, at
/// `/dev/console`; `/dev/pts` is the job's own instance, where neither
/// that pty nor `script`'s (both the host's) is.
#[test]
fn class07_tty_gives_the_job_a_terminal_of_its_own() {
    if !root_sandbox() {
        return;
    }
    let cmd = format!(
        "stty cols 123 rows 45; {} run --tty -- /bin/sh -c 'tty; stty size; ls /dev/pts; stty size </dev/tty'",
        bin()
    );
    let out =
        Command::new("script").envs(degraded_env()).args(["-qec", &cmd, "/dev/null"]).stdin(Stdio::null()).output();
    let Ok(out) = out else { return skip("script (util-linux) is not available") };
    // (`script` may echo a control character of its own first.)
    let text = stdout(&out).replace('\r', "");
    let lines: Vec<&str> = text.lines().skip_while(|l| !l.ends_with("/dev/console")).collect();
    assert!(lines.len() >= 4, "{text} {}", stderr(&out));
    assert_eq!(lines[1], "45 123", "{text}");
    assert_eq!(lines[2], "ptmx", "{text}");
    assert_eq!(lines[3], "45 123", "{text}");
}

// ---- class 8: attributes inherited from the supervisor ----

#[test]
fn class08_inherited_favours_are_reset() {
    if !root_sandbox() {
        return;
    }
    // The supervisor runs with every favour an operator could give it.
    let wrapper = format!(
        r#"
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
def favour(f):
    # Some need CAP_SYS_RESOURCE, which a container's root may lack.
    try:
        f()
    except (OSError, ValueError):
        pass
os.nice(-10)
assert libc.syscall(251, 1, 0, (1 << 13) | 0) == 0  # ioprio_set: real-time class, level 0
favour(lambda: open("/proc/self/oom_score_adj", "w").write("-500"))
favour(lambda: resource.setrlimit(resource.RLIMIT_RTPRIO, (50, 50)))
favour(lambda: resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)))
libc.prctl(29, 1, 0, 0, 0)                       # PR_SET_TIMERSLACK: 1 ns
libc.personality(0x0040000)                      # ADDR_NO_RANDOMIZE
os.umask(0)
os.execv("{bin}", ["confine", "run", "--", "/usr/bin/python3", "-c", CODE])
"#,
        bin = bin()
    );
    let code = r#"
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
print(f"nice={os.nice(0)}")
print(f"ioprio={libc.syscall(252, 1, 0)}")
print(f"oom={open('/proc/self/oom_score_adj').read().strip()}")
print(f"rtprio={resource.getrlimit(resource.RLIMIT_RTPRIO)[1]}")
print(f"nicelimit={resource.getrlimit(resource.RLIMIT_NICE)[1]}")
print(f"core={resource.getrlimit(resource.RLIMIT_CORE)[1]}")
print(f"slack={open('/proc/self/timerslack_ns').read().strip()}")
print(f"personality={libc.personality(ctypes.c_ulong(0xffffffff))}")
print(f"umask={os.umask(0o22):o}")
print(f"raise_nice={'ok' if libc.setpriority(0, 0, -5) == 0 else 'refused'}")
"#;
    let script = format!("CODE = {code:?}\n{wrapper}");
    let out = Command::new("/usr/bin/python3")
        .envs(degraded_env())
        .args(["-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let a = answers(&stdout(&out));
    let ioprio = a.get("ioprio").cloned().unwrap_or_default();
    assert!(is_default_ioprio(&ioprio), "ioprio {ioprio}: {a:?} {}", stderr(&out));
    for (k, v) in [
        ("nice", "0"),
        ("oom", "1000"),
        ("rtprio", "0"),
        ("nicelimit", "0"),
        ("core", "0"),
        ("slack", "50000"),
        ("personality", "0"),
        ("umask", "22"),
        ("raise_nice", "refused"),
    ] {
        assert_eq!(a.get(k).map(String::as_str), Some(v), "{k}: {a:?} {}", stderr(&out));
    }
    // What an operator uses to make jobs *less* favoured is kept.
    let out = Command::new("nice")
        .envs(degraded_env())
        .args(["-n", "7", bin(), "run", "--", "/bin/sh", "-c", "echo nice=$(cut -d' ' -f19 /proc/self/stat)"])
        .output()
        .unwrap();
    assert_eq!(answers(&stdout(&out)).get("nice").map(String::as_str), Some("7"), "{}", stderr(&out));
}

// ---- class 9: /proc and syscalls ----

#[test]
fn class09_host_details_in_proc_are_masked() {
    if !root_sandbox() {
        return;
    }
    assert!(!std::fs::read_to_string("/proc/cmdline").unwrap().is_empty());
    let files = [
        "cmdline",
        "interrupts",
        "softirqs",
        "kallsyms",
        "modules",
        "keys",
        "kcore",
        "sched_debug",
        "timer_list",
        "zoneinfo",
        "buddyinfo",
        "key-users",
    ];
    let script: String = files
        .iter()
        .map(|f| format!("[ -e /proc/{f} ] && echo {f}=$(wc -c < /proc/{f} 2>/dev/null || echo 0) || echo {f}=0;"))
        .collect();
    let out = sh(&[], &script);
    let a = answers(&stdout(&out));
    for f in files {
        assert_eq!(a.get(f).map(String::as_str), Some("0"), "/proc/{f} is readable: {a:?} {}", stderr(&out));
    }
    // Still there and readable: what programs need.
    let out = sh(&[], "head -c1 /proc/meminfo /proc/stat /proc/cpuinfo /proc/version >/dev/null && echo ok");
    assert_eq!(stdout(&out).trim(), "ok", "{}", stderr(&out));
}

#[test]
fn class09_memfd_secret_and_cachestat_are_refused() {
    if !root_sandbox() {
        return;
    }
    let code = r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open("/etc/hostname", os.O_RDONLY)
for name, nr, args in (("memfd_secret", 447, (0,)), ("cachestat", 451, (fd, 0, 0, 0))):
    r = libc.syscall(nr, *args)
    print(f"{name}=" + ("ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]))
"#;
    let out = python(&[], code);
    let a = answers(&stdout(&out));
    assert_eq!(a.get("memfd_secret").map(String::as_str), Some("ENOSYS"), "{a:?} {}", stderr(&out));
    assert_eq!(a.get("cachestat").map(String::as_str), Some("ENOSYS"), "{a:?}");
}

// ---- class 10: the sandbox's mounts are locked ----

/// Whatever holds CAP_SYS_ADMIN in a job's user namespace (here: the host
/// root entering it with nsenter, standing in for a job that regained its
/// capabilities and got past seccomp) can't undo the sandbox's mounts: not
/// unmount a host mount below the workspace (an idmapped, detached copy)
/// to see what it covers, nor make it writable, nor lift the read-only /proc/sys or
/// pid 1's own /tmp. The kernel locks a namespace's mounts only when they
/// are copied into a less privileged user namespace: the job runs in one
/// nested in the sandbox's.
#[test]
fn class10_a_jobs_user_namespace_cannot_undo_the_sandboxs_mounts() {
    if !root_sandbox() {
        return;
    }
    // Root's, so that it is an idmapped, detached copy where the kernel
    // has idmapped mounts (5.12 on); a plain bind of the job's own
    // elsewhere (Debian 11's 5.10), where pid 1's bind is as unlocked.
    let mut ws = workspace(0, 0);
    if !idmap_supported(ws.path()) {
        ws = workspace(1000, 1000);
    }
    let sub = ws.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("beneath"), "hidden by the mount").unwrap();
    let mounted =
        Command::new("mount").args(["-t", "tmpfs", "-o", "ro,size=1m", "class10"]).arg(&sub).status().unwrap();
    assert!(mounted.success());
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(sub.clone());
    let nap = format!("600.{}", std::process::id());
    let mut job = confine()
        .args(["run", "--workspace", ws.path().to_str().unwrap(), "--", "/bin/sleep", &nap])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cmdline = format!("/bin/sleep\0{nap}\0");
    let start = std::time::Instant::now();
    let pid = loop {
        let found: Vec<u32> = host_pids_with(&nap)
            .into_iter()
            .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == cmdline.as_bytes()))
            .collect();
        if let [pid] = found[..] {
            break pid;
        }
        if let Ok(Some(status)) = job.try_wait() {
            panic!("the job ended ({status}) before it was seen running");
        }
        assert!(start.elapsed() < Duration::from_secs(60 * slow() as u64), "the job never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    let tried = undo_mounts_as_the_namespaces_root(pid);
    // SAFETY: kill takes a pid and a signal; `pid` is the job's sleep.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = job.wait();
    eprintln!("{tried:?}");
    let errno = |what: &str| tried.iter().find(|(w, _)| *w == what).map(|(_, e)| *e);
    assert_eq!(errno("remount /workspace/sub read-write"), Some(libc::EPERM), "{tried:?}");
    for what in ["unmount /workspace/sub", "unmount the read-only /proc/sys", "detach /tmp"] {
        assert_eq!(errno(what), Some(libc::EINVAL), "{what}: {tried:?}");
    }
}

/// Enter the user and mount namespaces of `pid` (as the host's root, so
/// with every capability in that user namespace), try to undo its mounts,
/// and say what each attempt got: 0, or its errno. Done in the forked
/// child before its exec: an exec would drop the capabilities of a uid
/// that is not root there.
fn undo_mounts_as_the_namespaces_root(pid: u32) -> Vec<(&'static str, i32)> {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let userns = std::fs::File::open(format!("/proc/{pid}/ns/user")).unwrap();
    let mntns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap();
    let (mut rd, wr) = std::io::pipe().unwrap();
    let (user_fd, mnt_fd, out_fd) = (userns.as_raw_fd(), mntns.as_raw_fd(), wr.as_raw_fd());
    let attempts: [&'static str; 4] = [
        "remount /workspace/sub read-write",
        "unmount /workspace/sub",
        "unmount the read-only /proc/sys",
        "detach /tmp",
    ];
    let mut cmd = Command::new("/bin/true");
    // SAFETY: between fork and exec the closure makes only system calls
    // (setns, mount, umount2, write) on fds and C strings made before the
    // fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let mut results = [0i32; 4];
            if libc::setns(user_fd, libc::CLONE_NEWUSER) != 0 || libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Each call's errno, read before the next call.
            let errno = |ret: i32| if ret == 0 { 0 } else { *libc::__errno_location() };
            results[0] = errno(libc::mount(
                std::ptr::null(),
                c"/workspace/sub".as_ptr(),
                std::ptr::null(),
                libc::MS_REMOUNT | libc::MS_BIND,
                std::ptr::null(),
            ));
            results[1] = errno(libc::umount2(c"/workspace/sub".as_ptr(), 0));
            results[2] = errno(libc::umount2(c"/proc/sys".as_ptr(), 0));
            results[3] = errno(libc::umount2(c"/tmp".as_ptr(), libc::MNT_DETACH));
            libc::write(out_fd, results.as_ptr().cast(), std::mem::size_of_val(&results));
            Ok(())
        });
    }
    let status = cmd.status().unwrap();
    drop(wr);
    assert!(status.success(), "{status}");
    let mut buf = Vec::new();
    rd.read_to_end(&mut buf).unwrap();
    assert_eq!(buf.len(), 16, "the probe wrote no results");
    attempts.iter().zip(buf.chunks(4)).map(|(a, c)| (*a, i32::from_ne_bytes(c.try_into().unwrap()))).collect()
}

// ---- the posture test ----

/// The whole posture of a job, asserted in one place (gVisor's sandbox
/// posture test): a change to any default fails here.
#[test]
fn posture_of_a_job_is_exactly_as_expected() {
    if !root_sandbox() {
        return;
    }
    let ws = workspace(1000, 1000);
    let code = r#"
import ctypes, json, os, resource
libc = ctypes.CDLL(None, use_errno=True)
st = {}
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "Gid", "Groups", "Umask"):
    st[k] = status.get(k, "").strip()
st["ns"] = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")}
mounts = []
for l in open("/proc/self/mountinfo"):
    f = l.split()
    sep = f.index("-")
    opts = set(f[5].split(","))
    mounts.append([f[4], f[sep + 1], sorted(o for o in opts if o in ("ro", "rw", "nosuid", "nodev", "noexec"))])
    if f[sep + 1] == "devpts":
        st["devpts"] = sorted(f[sep + 3].split(","))
st["mounts"] = mounts
st["rlimits"] = {n: list(resource.getrlimit(getattr(resource, "RLIMIT_" + n))) for n in ("CORE", "RTPRIO", "RTTIME", "NICE", "SIGPENDING", "MSGQUEUE")}
st["fds"] = sorted(int(f) for f in os.listdir("/proc/self/fd"))
st["cgroup"] = open("/proc/self/cgroup").read().strip()
stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
st["sid_is_self"] = int(stat[3]) == os.getpid()
st["tty_nr"] = int(stat[4])
st["nice"] = int(stat[16])
st["ioprio"] = libc.syscall(252, 1, 0)
st["oom_score_adj"] = int(open("/proc/self/oom_score_adj").read())
st["sched_policy"] = os.sched_getscheduler(0)
st["ucounts"] = {n: int(open(f"/proc/sys/user/{n}").read()) for n in sorted(os.listdir("/proc/sys/user"))}
st["hostname"] = os.uname().nodename
st["cwd"] = os.getcwd()
st["env"] = sorted(os.environ)
print(json.dumps(st))
"#;
    let out = python(&["--workspace", ws.path().to_str().unwrap(), "--rw", "--hostname", "posture"], code);
    assert!(out.status.success(), "{}", stderr(&out));
    // os.listdir holds an fd of its own while it lists: that one is 3.
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let zero = "0000000000000000";
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(v[cap], zero, "{cap}: {v}");
    }
    assert_eq!(v["NoNewPrivs"], "1");
    assert_eq!(v["Seccomp"], "2", "seccomp filter mode");
    assert_eq!(v["Uid"], "1000\t1000\t1000\t1000");
    assert_eq!(v["Gid"], "65534\t65534\t65534\t65534");
    assert_eq!(v["Groups"], "", "no supplementary groups");
    assert_eq!(v["Umask"], "0022");
    // Every namespace differs from the host's (this test process's).
    for (name, inside) in v["ns"].as_object().unwrap() {
        let host = std::fs::read_link(format!("/proc/self/ns/{name}")).unwrap();
        assert_ne!(inside.as_str().unwrap(), host.to_str().unwrap(), "{name} namespace is the host's");
    }
    // The mount table: every mount point, its type and flags.
    let mounts: Vec<(String, String, Vec<String>)> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let f: Vec<String> = m[2].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
            (m[0].as_str().unwrap().to_string(), m[1].as_str().unwrap().to_string(), f)
        })
        .collect();
    let find =
        |point: &str| mounts.iter().find(|(p, _, _)| p == point).unwrap_or_else(|| panic!("no {point}: {mounts:?}"));
    let flags = |point: &str| find(point).2.join(",");
    assert_eq!(find("/").1, "tmpfs");
    assert_eq!(flags("/"), "nodev,nosuid,ro");
    for ro in ["/usr", "/etc"] {
        assert_eq!(flags(ro), "nodev,nosuid,ro", "{ro}");
    }
    assert_eq!(flags("/workspace"), "nodev,nosuid,rw");
    for p in ["/workspace/.git/hooks", "/workspace/.git/config"] {
        assert!(mounts.iter().all(|(m, _, _)| m != p), "no .git here, nothing to protect: {mounts:?}");
    }
    assert_eq!((find("/tmp").1.as_str(), flags("/tmp").as_str()), ("tmpfs", "nodev,nosuid,rw"));
    assert_eq!((find("/dev/shm").1.as_str(), flags("/dev/shm").as_str()), ("tmpfs", "nodev,nosuid,rw"));
    assert_eq!((find("/proc").1.as_str(), flags("/proc").as_str()), ("proc", "nodev,noexec,nosuid,rw"));
    assert_eq!(flags("/proc/sys"), "nodev,noexec,nosuid,ro");
    assert_eq!(flags("/proc/cmdline"), "noexec,nosuid,ro", "masked by a read-only /dev/null");
    for dev in ["null", "zero", "full", "random", "urandom", "tty"] {
        assert_eq!(flags(&format!("/dev/{dev}")), "noexec,nosuid,rw", "/dev/{dev}");
    }
    // The job's own devpts instance, its pty count bounded.
    assert_eq!((find("/dev/pts").1.as_str(), flags("/dev/pts").as_str()), ("devpts", "noexec,nosuid,rw"));
    let devpts: Vec<&str> = v["devpts"].as_array().unwrap().iter().filter_map(|o| o.as_str()).collect();
    for opt in ["max=16", "ptmxmode=666", "mode=620"] {
        assert!(devpts.contains(&opt), "devpts without {opt}: {devpts:?}");
    }
    let allowed: Vec<&str> = vec![
        "/",
        "/usr",
        "/etc",
        "/workspace",
        "/tmp",
        "/dev",
        "/dev/null",
        "/dev/zero",
        "/dev/full",
        "/dev/random",
        "/dev/urandom",
        "/dev/tty",
        "/dev/pts",
        "/dev/shm",
        "/proc",
    ];
    for (point, _, _) in &mounts {
        let masked = point.starts_with("/proc/")
            || ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"].contains(&point.as_str());
        assert!(allowed.contains(&point.as_str()) || masked, "unexpected mount {point}: {mounts:?}");
    }
    // rlimits: [soft, hard].
    let rl = &v["rlimits"];
    for (k, want) in [("CORE", 0), ("RTPRIO", 0), ("RTTIME", 0), ("NICE", 0)] {
        assert_eq!(rl[k], serde_json::json!([want, want]), "RLIMIT_{k}: {rl}");
    }
    assert!(rl["SIGPENDING"][1].as_u64().unwrap() <= 4096, "{rl}");
    assert!(rl["MSGQUEUE"][1].as_u64().unwrap() <= 65536, "{rl}");
    assert_eq!(v["fds"], serde_json::json!([0, 1, 2, 3]), "only stdio (and listdir's own)");
    // Its own cgroup namespace, rooted at its cgroup in every hierarchy
    // (v2, and the v1 ones of a hybrid host).
    let cgroups = v["cgroup"].as_str().unwrap();
    // A pure v1 host (no unified hierarchy) has no `0::` line to root.
    let unified = std::fs::read_to_string("/proc/self/cgroup").unwrap().lines().any(|l| l.starts_with("0::"));
    assert_eq!(cgroups.lines().any(|l| l == "0::/"), unified, "{cgroups}");
    assert!(cgroups.lines().all(|l| l.ends_with(":/")), "{cgroups}");
    assert_eq!(v["sid_is_self"], true);
    assert_eq!(v["tty_nr"], 0);
    assert_eq!(v["nice"], 0);
    assert!(is_default_ioprio(&v["ioprio"].to_string()), "ioprio {}", v["ioprio"]);
    assert_eq!(v["oom_score_adj"], 1000);
    assert_eq!(v["sched_policy"], 0, "SCHED_OTHER");
    let uc = &v["ucounts"];
    for (k, want) in [("max_user_namespaces", 0), ("max_inotify_instances", 16), ("max_inotify_watches", 16384)] {
        assert_eq!(uc[k], want, "{k}: {uc}");
    }
    assert_eq!(v["hostname"], "posture");
    assert_eq!(v["cwd"], "/workspace");
    // Only the scrubbed environment (python adds LC_CTYPE on a C locale).
    let env: Vec<&str> = v["env"].as_array().unwrap().iter().filter_map(|e| e.as_str()).collect();
    for k in ["HOME", "PATH", "TMPDIR"] {
        assert!(env.contains(&k), "{k} missing: {env:?}");
    }
    assert!(env.iter().all(|k| ["HOME", "PATH", "TMPDIR", "LANG", "LC_CTYPE"].contains(k)), "{env:?}");
}
