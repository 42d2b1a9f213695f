//! `confine exec`: the governed pipeline end to end, with real sandboxes,
//! a real store and a real audit trail in a temp dir.

use crate::common;
use common::*;
use std::path::PathBuf;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
    repo: PathBuf,
    config: PathBuf,
}

impl Env {
    fn new(extra: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let repo = readable_repo(dir.path());
        std::fs::write(repo.join("data.txt"), "repo data\n").unwrap();
        let config = dir.path().join("confine.toml");
        let text = format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n{extra}",
            dir.path().join("store").display(),
            repo.display()
        );
        std::fs::write(&config, text).unwrap();
        Env { dir, repo, config }
    }

    fn exec(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .arg("--config")
            .arg(&self.config)
            .arg("exec")
            .args(args)
            .env("XDG_DATA_HOME", self.dir.path())
            .output()
            .unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let out = self.exec(&all);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(&out), stderr(&out)))
    }

    fn audit_count(&self) -> usize {
        let out = Command::new(bin())
            .arg("--config")
            .arg(&self.config)
            .args(["audit", "export", "--jsonl"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).lines().filter(|l| !l.trim().is_empty()).count()
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success())
}

#[test]
fn runtimes_present_on_this_host_run_code() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let cases: &[(&str, &str, &str, &str)] = &[
        ("shell", "bash", "echo shell-ok", "shell-ok"),
        ("python", "python3", "print('py-' + 'ok')", "py-ok"),
        ("perl", "perl", "print \"perl-ok\\n\";", "perl-ok"),
        ("c", "cc", "#include <stdio.h>\nint main(void){puts(\"c-ok\");return 0;}", "c-ok"),
        ("cpp", "c++", "#include <iostream>\nint main(){std::cout<<\"cpp-ok\"<<std::endl;}", "cpp-ok"),
        ("rust", "rustc", "fn main(){println!(\"rust-ok\");}", "rust-ok"),
        ("node", "node", "console.log('node-ok')", "node-ok"),
        (
            "java",
            "javac",
            "public class Main{public static void main(String[] a){System.out.println(\"java-ok\");}}",
            "java-ok",
        ),
        ("ruby", "ruby", "puts 'ruby-ok'", "ruby-ok"),
        ("php", "php", "<?php echo \"php-ok\\n\";", "php-ok"),
        ("go", "go", "package main\nimport \"fmt\"\nfunc main(){fmt.Println(\"go-ok\")}", "go-ok"),
    ];
    let required = ["shell", "python", "perl", "c", "cpp", "rust", "node"];
    for (runtime, tool, code, want) in cases {
        if !have(tool) {
            if required.contains(runtime) {
                skip(&format!("{tool} is not installed, so runtime '{runtime}' can't be tested"));
            } else {
                eprintln!("SKIPPED: runtime '{runtime}': {tool} is not installed on this host");
            }
            continue;
        }
        let out = env.exec(&["--repo-id", "demo", "--runtime", runtime, "--timeout", "120s", "--code", code]);
        assert_eq!(stdout(&out).trim(), *want, "{runtime}: {}", stderr(&out));
        assert_eq!(out.status.code(), Some(0), "{runtime}: {}", stderr(&out));
        assert!(stderr(&out).contains("confine: success exit=0"), "{runtime}: {}", stderr(&out));
    }
    // Code mode writes its source into the sandbox's /tmp, never into the repo.
    let mut names: Vec<String> =
        std::fs::read_dir(&env.repo).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    names.sort();
    assert_eq!(names, ["data.txt"]);
}

#[test]
fn args_mode_runs_the_runtime_executable_in_the_repo() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let out = env.exec(&["--repo-id", "demo", "--runtime", "shell", "--", "-c", "cat data.txt; pwd; exit 4"]);
    assert_eq!(stdout(&out), "repo data\n/workspace\n", "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(4));
}

#[test]
fn the_gate_denies_everything_until_enabled() {
    let env = Env::new("");
    std::fs::write(
        &env.config,
        std::fs::read_to_string(&env.config).unwrap().replace("enabled = true", "enabled = false"),
    )
    .unwrap();
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo no"]);
    assert_eq!(v["status"], "denied");
    assert_eq!(v["error"], "runtime execution is disabled (set runtime.enabled = true)");
    assert_eq!(v["policyDecision"]["allowed"], false);
    assert_eq!(env.audit_count(), 1, "a denied call is audited too");
}

#[test]
fn policy_denial_names_the_command_and_reason() {
    let env = Env::new("");
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--executable", "curl", "--", "http://example.org"]);
    assert_eq!(v["status"], "denied", "{v}");
    let err = v["error"].as_str().unwrap();
    assert_eq!(err, "denied by policy: 'curl' is a network tool, and network tools are not allowed", "{v}");
    assert!(!v["policyDecision"]["auditHash"].as_str().unwrap().is_empty());
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--net", "host", "--code", "true"]);
    assert_eq!(v["status"], "denied", "host network needs the policy's consent: {v}");
}

#[test]
fn bad_input_is_refused_clearly_and_audited() {
    let env = Env::new("");
    let big = env.dir.path().join("big.py");
    std::fs::write(&big, "x".repeat((1 << 20) + 1)).unwrap();
    let nul = env.dir.path().join("nul.sh");
    std::fs::write(&nul, "echo a\0b").unwrap();
    let (big, nul) = (big.to_str().unwrap(), nul.to_str().unwrap());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--repo-id", "demo", "--runtime", "cobol", "--code", "x"], "cobol"),
        (vec!["--repo-id", "demo", "--runtime", "shell"], "nothing to run"),
        (vec!["--repo-id", "demo", "--runtime", "python", "--code-file", big], "above the limit"),
        (vec!["--repo-id", "demo", "--runtime", "shell", "--code-file", nul], "NUL"),
        (vec!["--repo-id", "demo", "--runtime", "shell", "--cwd", "../..", "--code", "pwd"], ".."),
        (vec!["--repo-id", "nope", "--runtime", "shell", "--code", "pwd"], "nope"),
        (vec!["--repo-id", "demo", "--runtime", "python", "--executable", "ruby", "--code", "1"], "ruby"),
    ];
    let mut audited = 0;
    for (args, needle) in &cases {
        let out = env.exec(args);
        audited += 1;
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
    }
    assert_eq!(env.audit_count(), audited, "no record lost");
    // both code and args is a usage error (exit 2) before any request exists
    let out = env.exec(&["--repo-id", "demo", "--runtime", "shell", "--code", "x", "--", "y"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_symlink_out_of_the_repo_is_refused() {
    let env = Env::new("");
    std::os::unix::fs::symlink("/etc", env.repo.join("out")).unwrap();
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--cwd", "out", "--code", "pwd"]);
    assert_eq!(v["status"], "denied", "{v}");
    assert!(!v["error"].as_str().unwrap().contains("/etc"), "no host path leaks: {v}");
}

#[test]
fn timeout_kills_and_is_reported() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let started = std::time::Instant::now();
    let out = env.exec(&["--repo-id", "demo", "--runtime", "shell", "--timeout", "1s", "--code", "sleep 100"]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(stderr(&out).contains("confine: timeout"), "{}", stderr(&out));
    assert!(started.elapsed().as_secs() < 10);
}

#[test]
fn limits_above_the_maximum_are_clamped_and_said() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[limits]\nmax_timeout_ms = 5000\ntimeout_ms = 5000\n");
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--timeout", "60s", "--code", "true"]);
    assert_eq!(v["status"], "success", "{v}");
    assert!(v["clamped"].as_array().unwrap().iter().any(|c| c.as_str().unwrap().contains("timeout")), "{v}");
    assert!(v["outcome"]["limits"]["timeoutMs"].as_u64().unwrap() <= 5000, "{v}");
}

#[test]
fn output_modes_replace_live_output() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let code = "for i in $(seq 1 500); do echo line $i; done; echo 'error[E0308]: mismatched types' >&2; \
                echo 'error[E0308]: mismatched types' >&2";
    let out = env.exec(&["--repo-id", "demo", "--runtime", "shell", "--output-mode", "digest", "--code", code]);
    let text = stdout(&out);
    assert!(!text.contains("line 250"), "digest must not pass the output through: {text}");
    assert!(text.contains("E0308"), "{text}");
    let v = env.json(&["--repo-id", "demo", "--runtime", "shell", "--output-mode", "minimal", "--code", code]);
    let handle = v["artifactHandle"].as_str().unwrap().to_string();
    assert!(handle.starts_with("run-demo-"), "{handle}");
    assert_eq!(v["output"]["outputLines"].as_u64().unwrap(), 502, "{v}");
    let shown = Command::new(bin())
        .arg("--config")
        .arg(&env.config)
        .args(["artifacts", "show", &handle, "--stream", "stdout"])
        .output()
        .unwrap();
    assert!(stdout(&shown).starts_with("line 1\nline 2\n"), "{}", stderr(&shown));
}

#[test]
fn stdin_file_is_fed_to_the_job() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let input = env.dir.path().join("in.txt");
    std::fs::write(&input, "from stdin\n").unwrap();
    let out = env.exec(&[
        "--repo-id",
        "demo",
        "--runtime",
        "python",
        "--stdin-file",
        input.to_str().unwrap(),
        "--code",
        "import sys; print(sys.stdin.read().upper(), end='')",
    ]);
    assert_eq!(stdout(&out), "FROM STDIN\n", "{}", stderr(&out));
}

#[test]
fn malformed_config_fails_naming_the_file() {
    let env = Env::new("\n[runtime_typo]\nx = 1\n");
    let out = env.exec(&["--repo-id", "demo", "--runtime", "shell", "--code", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("confine.toml") && stderr(&out).contains("runtime_typo"), "{}", stderr(&out));
}

#[test]
fn a_secret_passed_with_env_is_redacted_from_the_response_and_the_artifact() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[sandbox]\nenv_allowlist = [\"DEPLOY_PASSWORD\"]\n");
    let secret = format!("pw-{}-x9q", std::process::id());
    let code = "echo \"deploying with $DEPLOY_PASSWORD\"";
    let out = Command::new(bin())
        .arg("--config")
        .arg(&env.config)
        .args(["exec", "--json", "--output-mode", "summary", "--repo-id", "demo", "--runtime", "shell"])
        .args(["--env", "DEPLOY_PASSWORD", "--code", code])
        .env("XDG_DATA_HOME", env.dir.path())
        .env("DEPLOY_PASSWORD", &secret)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{text} / {}", stderr(&out));
    assert!(!text.contains(&secret) && text.contains("deploying with [REDACTED]"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let handle = v["artifactHandle"].as_str().unwrap();
    let shown = Command::new(bin())
        .arg("--config")
        .arg(&env.config)
        .args(["artifacts", "show", handle, "--stream", "stdout"])
        .output()
        .unwrap();
    assert_eq!(stdout(&shown), "deploying with [REDACTED]\n", "{}", stderr(&shown));
}

#[test]
fn an_expired_artifact_is_gone_after_a_later_exec_without_confine_gc() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[output]\nttl_secs = 1\ngc_interval_secs = 1\n");
    let handle = |v: serde_json::Value| v["artifactHandle"].as_str().unwrap().to_string();
    let old = handle(env.json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo first"]));
    std::thread::sleep(std::time::Duration::from_millis(1300));
    let new = handle(env.json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo second"]));
    let ls = Command::new(bin()).arg("--config").arg(&env.config).args(["artifacts", "ls"]).output().unwrap();
    let listed = stdout(&ls);
    assert!(!listed.contains(&old), "the expired artifact is still stored: {listed}");
    assert!(listed.contains(&new), "{listed}");
}

impl Env {
    /// `confine exec ARGS…` with `stdin` as its stdin (and `input` written
    /// to it, then closed, when it is a pipe) and `vars` set, failing
    /// instead of hanging.
    fn exec_with(
        &self,
        args: &[&str],
        stdin: std::process::Stdio,
        input: Option<&[u8]>,
        vars: &[(&str, &str)],
    ) -> Output {
        use std::io::{Read, Write};
        let mut child = Command::new(bin())
            .arg("--config")
            .arg(&self.config)
            .arg("exec")
            .args(args)
            .env("XDG_DATA_HOME", self.dir.path())
            .envs(vars.iter().copied())
            .stdin(stdin)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if let (Some(bytes), Some(mut pipe)) = (input.map(<[u8]>::to_vec), child.stdin.take()) {
            // Fed from a thread: confine reads it whole while we wait.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&bytes);
            });
        }
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let out = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = out.read_to_end(&mut b);
            b
        });
        let err = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = err.read_to_end(&mut b);
            b
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20) * slow();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("confine exec {args:?} hung: {}", String::from_utf8_lossy(&err.join().unwrap()));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
    }
}

const SHELL: [&str; 6] = ["--repo-id", "demo", "--runtime", "shell", "--timeout", "20s"];

fn shell_args<'a>(extra: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut all: Vec<&str> = SHELL.to_vec();
    all.extend_from_slice(extra);
    all.extend_from_slice(&["--", "-c", script]);
    all
}

/// `-e KEY=VAL` sets KEY (it was dropped), `-e KEY` takes ours, and every
/// name, set here or not, valued or not, is held to the allowlist (an
/// unset one went unchecked).
#[test]
fn every_env_name_is_held_to_the_allowlist_and_values_pass() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[sandbox]\nenv_allowlist = [\"FOO\", \"MODE\", \"MAYBE\"]\n");
    let null = std::process::Stdio::null;
    let script = "echo \"foo=$FOO mode=$MODE maybe=${MAYBE-unset}\"";
    let args = shell_args(&["-e", "FOO=bar", "--env", "MODE", "-e", "MAYBE"], script);
    let out = env.exec_with(&args, null(), None, &[("MODE", "fast")]);
    assert_eq!(stdout(&out), "foo=bar mode=fast maybe=unset\n", "{}", stderr(&out));
    assert!(out.status.success());

    let audited = env.audit_count();
    let token = format!("ghp_{}", std::process::id());
    for (extra, vars, named) in [
        (["-e", "GITHUB_TOKEN"], vec![], "GITHUB_TOKEN"),
        (["-e", "GITHUB_TOKEN"], vec![("GITHUB_TOKEN", token.as_str())], "GITHUB_TOKEN"),
        (["-e", "OTHER=x"], vec![], "OTHER"),
    ] {
        let out = env.exec_with(&shell_args(&extra, "echo ran; env"), null(), None, &vars);
        assert_eq!(out.status.code(), Some(125), "{extra:?}");
        let err = stderr(&out);
        assert!(err.contains(&format!("{named} not allowed")) && err.contains("sandbox.env_allowlist"), "{err}");
        assert!(!stdout(&out).contains("ran") && !stdout(&out).contains(&token));
    }
    assert_eq!(env.audit_count(), audited + 3, "each refusal is audited");

    // Not a name: a usage error, as a bad --env-file line is one.
    let out = env.exec_with(&shell_args(&["-e", "A-B=1"], "true"), null(), None, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("'A-B' is not a variable name"), "{}", stderr(&out));
}

/// The attack: a `.env` planted in the repository (jobs may write there)
/// names the caller's token bare. Read by `exec --env-file`, the name
/// meets the allowlist, and the token never reaches a job.
#[test]
fn a_planted_env_file_cannot_pull_a_variable_the_allowlist_forbids() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[sandbox]\nenv_allowlist = [\"MODE\", \"EDITOR\"]\n");
    let planted = env.repo.join(".env");
    std::fs::write(&planted, "MODE=test\nEDITOR\nGITHUB_TOKEN\n").unwrap();
    let token = format!("ghp_planted{}", std::process::id());
    let vars = [("GITHUB_TOKEN", token.as_str()), ("EDITOR", "vi")];
    let file = planted.to_str().unwrap();
    let args = shell_args(&["--env-file", file], "env");
    let out = env.exec_with(&args, std::process::Stdio::null(), None, &vars);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("GITHUB_TOKEN not allowed"), "{}", stderr(&out));
    assert!(!stdout(&out).contains(&token));
    // The allowed ones pass, a bare name with the caller's value.
    std::fs::write(&planted, "MODE=test\nEDITOR\n").unwrap();
    let out = env.exec_with(&args, std::process::Stdio::null(), None, &vars);
    let text = stdout(&out);
    assert!(text.contains("MODE=test\n") && text.contains("EDITOR=vi\n"), "{text} / {}", stderr(&out));
    assert!(!text.contains(&token));
}

/// `echo hi | confine exec -i …`: a pipe on stdin reaches the job (it read
/// an empty stdin), as does `--stdin-file -`; a file on stdin too.
#[test]
fn piped_stdin_reaches_the_job() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let piped = std::process::Stdio::piped;
    let out = env.exec_with(&shell_args(&["-i"], "tr a-z A-Z"), piped(), Some(b"hi there\n"), &[]);
    assert_eq!(stdout(&out), "HI THERE\n", "{}", stderr(&out));
    let out = env.exec_with(&shell_args(&["--stdin-file", "-"], "wc -c"), piped(), Some(b"12345"), &[]);
    assert_eq!(stdout(&out).trim(), "5", "{}", stderr(&out));
    // A file on stdin (`< file`) too.
    let input = env.dir.path().join("in.txt");
    std::fs::write(&input, "from a file\n").unwrap();
    let file = std::fs::File::open(&input).unwrap();
    let out = env.exec_with(&shell_args(&["--interactive"], "cat"), file.into(), None, &[]);
    assert_eq!(stdout(&out), "from a file\n", "{}", stderr(&out));
}

/// The attack on a caller's script: without -i an exec reads nothing, so
/// one inside `while read …; done < list` leaves the rest of the list to
/// the loop (read eagerly, it took it all: a harness of ours lost two test
/// suites so).
#[test]
fn without_i_an_exec_leaves_its_callers_stdin_alone() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let list = env.dir.path().join("list");
    std::fs::write(&list, "one\ntwo\nthree\n").unwrap();
    let script = format!(
        "while read x; do \"$0\" --config \"$1\" exec {} -- -c 'wc -c' >/dev/null 2>&1; echo \"$x\"; done < \"$2\"",
        SHELL.join(" ")
    );
    let out = Command::new("/bin/sh")
        .args(["-c", &script])
        .arg(bin())
        .arg(&env.config)
        .arg(&list)
        .env("XDG_DATA_HOME", env.dir.path())
        .output()
        .unwrap();
    assert_eq!(stdout(&out), "one\ntwo\nthree\n", "{}", stderr(&out));
    let file = std::fs::File::open(&list).unwrap();
    let out = env.exec_with(&shell_args(&[], "wc -c"), file.into(), None, &[]);
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
}

/// Past `limits.max_stdin_bytes` a clear error and no job, never a
/// truncated stdin: just past it, refused (and audited) by the pipeline;
/// far past it, by the reader before a request is made.
#[test]
fn stdin_beyond_the_limit_is_an_error_not_a_truncation() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[limits]\nmax_stdin_bytes = 1000\n");
    let piped = std::process::Stdio::piped;
    let args = shell_args(&["-i"], "echo ran; wc -c");
    let out = env.exec_with(&args, piped(), Some(&[b'a'; 1000]), &[]);
    assert_eq!(stdout(&out), "ran\n1000\n", "{}", stderr(&out));
    // Just past it a request, refused and audited; far past it none.
    for (bytes, says, audited) in [(1001, "stdin is 1001 bytes", 1), (3 << 20, "stdin is more than", 0)] {
        let before = env.audit_count();
        let out = env.exec_with(&args, piped(), Some(&vec![b'a'; bytes]), &[]);
        assert_eq!(out.status.code(), Some(125), "{bytes}");
        let err = stderr(&out);
        assert!(err.contains(says) && err.contains("limits.max_stdin_bytes"), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(!stdout(&out).contains("ran"), "no job runs on a part of its stdin");
        assert_eq!(env.audit_count(), before + audited, "{bytes}");
    }
    let out = env.exec_with(&args, piped(), Some(b"\xff\xfe"), &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("not UTF-8"), "{}", stderr(&out));
    let out = env.exec_with(&shell_args(&["-i", "--env-file", "no-such.env"], "true"), piped(), Some(b""), &[]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).starts_with("confine: --env-file no-such.env"), "{}", stderr(&out));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

/// What nobody meant as input is not waited on: a terminal, /dev/null,
/// and a socket an agent's harness leaves open (Node's default stdin)
/// give the job an empty stdin at once.
#[test]
fn a_terminal_or_an_open_socket_on_stdin_is_not_waited_on() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("");
    let args = shell_args(&[], "wc -c");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let out = env.exec_with(&args, std::os::fd::OwnedFd::from(theirs).into(), None, &[]);
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
    drop(ours);
    let pty = nix::pty::openpty(None, None).unwrap();
    let out = env.exec_with(&args, std::process::Stdio::from(pty.slave), None, &[]);
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
    drop(pty.master);
    let out = env.exec_with(&args, std::process::Stdio::null(), None, &[]);
    assert_eq!(stdout(&out).trim(), "0", "{}", stderr(&out));
}

/// `confine exec` names a full /tmp as `run` does: in `--json`'s outcome
/// and on stderr, with the configuration's cap.
#[test]
fn a_full_tmp_is_named_in_execs_outcome() {
    if !sandbox_available() {
        return;
    }
    let env = Env::new("\n[sandbox]\ntmp_size_bytes = 1048576\n");
    let fill = ["--repo-id", "demo", "--runtime", "shell", "--code", "head -c 2000000 /dev/zero > /tmp/big; true"];
    let json = env.json(&fill);
    assert_eq!(json["outcome"]["tmpFull"]["outOf"], "space", "{json}");
    assert_eq!(json["outcome"]["tmpFull"]["sizeBytes"], 1 << 20, "{json}");
    let out = env.exec(&fill);
    assert!(stderr(&out).contains("confine: note: /tmp (also the job's HOME) was full"), "{}", stderr(&out));
    let json = env.json(&["--repo-id", "demo", "--runtime", "shell", "--code", "echo room > /tmp/small"]);
    assert!(json["outcome"].get("tmpFull").is_none(), "{json}");
}
