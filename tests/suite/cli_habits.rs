//! `confine run` as docker and podman users type it (issue 28): `-w`
//! relative to the workspace, `-e`, `--env-file`, `--network`, `TERM` on a
//! terminal, a status file for every outcome, a hint for `./cmd` without a
//! workspace, and binds that land where they say.

use crate::common;

use common::*;
use std::process::{Command, Stdio};

fn sandbox() -> bool {
    sandbox_available()
}

#[test]
fn a_relative_cwd_is_taken_from_the_workspace() {
    if !sandbox() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("sub/dir")).unwrap();
    let wsp = ws.path().to_str().unwrap();
    let out = run(&["--workspace", wsp, "-w", "sub/dir", "--", "/bin/pwd"]);
    assert_eq!(stdout(&out), "/workspace/sub/dir\n", "{}", stderr(&out));
    let out = run(&["--workspace", wsp, "--cwd", "/tmp", "--", "/bin/pwd"]);
    assert_eq!(stdout(&out), "/tmp\n", "{}", stderr(&out));
}

#[test]
fn env_flags_and_env_files_as_docker_reads_them() {
    if !sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ci.env");
    std::fs::write(&file, "# the CI's variables\nA=from-file\nB=x=y\n\nC=overridden\n").unwrap();
    let f = file.to_str().unwrap();
    let out = run(&["--network", "none", "--env-file", f, "-e", "C=from-flag", "--", "/bin/sh", "-c", "echo $A $B $C"]);
    assert_eq!(stdout(&out), "from-file x=y from-flag\n", "{}", stderr(&out));

    std::fs::write(&file, "A=1\nexport B=2\n").unwrap();
    let out = run(&["--env-file", f, "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("--env-file {f}, line 2:")) && err.contains("'export B' is not a variable name"),
        "{err}"
    );
}

/// The attack: a job leaves a `.env` in its `--rw` workspace naming the
/// caller's token bare; the next `confine run --env-file .env` must not
/// hand it over. A bare name passes with the operator's consent
/// (`sandbox.env_allowlist`) or the command line's (`-e KEY`), as docker's
/// bare KEY does: with the caller's value.
#[test]
fn a_planted_env_file_cannot_pull_a_token_into_the_next_run() {
    if !sandbox() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let wsp = ws.path().to_str().unwrap();
    let token = format!("ghp_planted{}", std::process::id());
    let plant = "printf 'MODE=x\\nGITHUB_TOKEN\\n' > /workspace/.env";
    let out = run(&["--workspace", wsp, "--rw", "--", "/bin/sh", "-c", plant]);
    assert!(out.status.success(), "{}", stderr(&out));
    let env_file = ws.path().join(".env");
    let next = |pre: &[&str], extra: &[&str]| {
        confine()
            .args(pre)
            .args(["run", "--workspace", wsp, "--env-file", env_file.to_str().unwrap()])
            .args(extra)
            .args(["--", "/bin/sh", "-c", "echo \"mode=$MODE token=${GITHUB_TOKEN-unset}\""])
            .env("GITHUB_TOKEN", &token)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = next(&[], &[]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    assert!(err.contains(&format!("--env-file {}, line 2: 'GITHUB_TOKEN'", env_file.display())), "{err}");
    assert!(err.contains("sandbox.env_allowlist") && !err.contains(&token) && stdout(&out).is_empty(), "{err}");
    // Consent, by the command line or by the operator.
    let out = next(&[], &["-e", "GITHUB_TOKEN"]);
    assert_eq!(stdout(&out), format!("mode=x token={token}\n"), "{}", stderr(&out));
    let config = ws.path().join("confine.toml");
    std::fs::write(&config, "[sandbox]\nenv_allowlist = [\"GITHUB_TOKEN\"]\n").unwrap();
    let out = next(&["--config", config.to_str().unwrap()], &[]);
    assert_eq!(stdout(&out), format!("mode=x token={token}\n"), "{}", stderr(&out));
    // A name that is no name: refused by -e as by the file.
    let out = run(&["-e", "A-B=1", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'A-B' is not a variable name"), "{}", stderr(&out));
}

/// `TERM` reaches the job when its output goes to a terminal (`script`
/// gives confine one), and not through a pipe.
#[test]
fn term_passes_through_on_a_terminal_only() {
    if !sandbox() {
        return;
    }
    let inner = format!("{} run -- /bin/sh -c 'echo term=${{TERM:-unset}}'", bin());
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("TERM", "xterm-confinetest")
        .stdin(Stdio::null())
        .output()
        .expect("script (util-linux)");
    assert!(stdout(&out).contains("term=xterm-confinetest"), "{}{}", stdout(&out), stderr(&out));
    let out = Command::new(bin())
        .args(["run", "--", "/bin/sh", "-c", "echo term=${TERM:-unset}"])
        .env("TERM", "xterm-confinetest")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "term=unset\n");
}

/// A run that fails before its job starts still writes its status: the
/// step and the error, with exit status 125.
#[test]
fn the_status_file_is_written_for_setup_failures_too() {
    if !sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("status.json");
    let s = st.to_str().unwrap();
    for (args, step, says) in [
        (vec!["--seccomp", "/no/such/profile.json"], "seccomp", "/no/such/profile.json"),
        (vec!["--ro-bind", "/etc:/proc/etc"], "layers", "/proc and /dev are made for each job"),
    ] {
        let _ = std::fs::remove_file(&st);
        let mut all = vec!["--json-status", s];
        all.extend(args);
        all.extend(["--", "/bin/true"]);
        let out = run(&all);
        assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
        assert_eq!(v["exitCode"], 125, "{v}");
        assert_eq!(v["status"], "failure", "{v}");
        assert_eq!(v["setupStep"], step, "{v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{v}");
    }
}

#[test]
fn a_relative_command_without_a_workspace_gets_a_hint() {
    if !sandbox() {
        return;
    }
    let out = run(&["--", "./untrusted.sh"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("the command is not in the sandbox") && stderr(&out).contains("--workspace ."),
        "{}",
        stderr(&out)
    );
}

/// A tool the caller runs from a toolchain home (`~/.cargo/bin/…`), which
/// the sandbox does not bind: "not found" prints the flags that fix it,
/// and they do.
#[test]
fn a_command_not_found_inside_prints_the_bind_that_fixes_it() {
    if !sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let home = readable_repo(dir.path());
    let tool = home.join(".cargo/bin/hello-tool");
    std::fs::create_dir_all(tool.parent().unwrap()).unwrap();
    std::fs::write(&tool, "#!/bin/sh\necho hello from the toolchain\n").unwrap();
    for d in [home.join(".cargo"), home.join(".cargo/bin")] {
        std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&tool, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:/usr/bin:/bin", tool.parent().unwrap().display());
    let out = confine().args(["run", "--", "hello-tool"]).env("HOME", &home).env("PATH", &path).output().unwrap();
    assert_eq!(out.status.code(), Some(127));
    let err = stderr(&out);
    let fix = err.split("run it with ").nth(1).unwrap_or_else(|| panic!("no hint: {err}")).trim();
    let cargo = home.join(".cargo");
    assert!(fix.starts_with(&format!("--ro-bind {0}:{0} ", cargo.display())), "{fix}");
    let fixed = confine().arg("run").args(fix.split(' ')).env("HOME", &home).env("PATH", &path).output().unwrap();
    assert_eq!(stdout(&fixed), "hello from the toolchain\n", "{}", stderr(&fixed));
}

/// A bind under /tmp is there inside, on top of the private /tmp, which
/// still works around it.
#[test]
fn a_bind_under_tmp_lands_where_it_says() {
    if !sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("marker"), "venv\n").unwrap();
    let src = dir.path().to_str().unwrap();
    let spec = format!("{src}:/tmp/ci/venv");
    let out = run(&[
        "--ro-bind",
        &spec,
        "--",
        "/bin/sh",
        "-c",
        "cat /tmp/ci/venv/marker && echo x > /tmp/own && echo tmp=ok",
    ]);
    assert_eq!(stdout(&out), "venv\ntmp=ok\n", "{}", stderr(&out));
}
