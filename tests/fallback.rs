//! The unix-fallback backend, for real: the built binary runs jobs with
//! `--backend unix-fallback --allow-degraded`, and the tests check what it
//! promises — refusal without consent, rlimits, the tree kill on timeout,
//! a `setsid` escapee killed after the job (Linux: subreaper), streams
//! passed through, and an outcome that names the backend and what is lost.
#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn confine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_confine"))
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("start confine")
}

/// `confine run --backend unix-fallback --allow-degraded ARGS…`
fn fallback(args: &[&str]) -> Output {
    let mut all = vec!["--backend", "unix-fallback", "--allow-degraded"];
    all.extend_from_slice(args);
    confine(&all)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A token unique to this test process and `name`, to find its processes.
fn token(name: &str) -> String {
    format!("confinefb{}{name}", std::process::id())
}

/// Command lines of every process on the host.
fn command_lines() -> Vec<String> {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|s| s.chars().all(|c| c.is_ascii_digit())))
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    {
        let out = Command::new("ps").args(["-axww", "-o", "command="]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }
}

/// Processes whose command line holds `token` (a dying one gets a moment).
fn survivors(token: &str) -> Vec<String> {
    let mut found = Vec::new();
    for _ in 0..20 {
        found = command_lines().into_iter().filter(|c| c.contains(token)).collect();
        if found.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    found
}

fn outcome_of(args: &[&str], name: &str) -> (Output, serde_json::Value) {
    let path = std::env::temp_dir().join(format!("{}.json", token(name)));
    let path_s = path.to_str().unwrap().to_string();
    let mut all = vec!["--json-status", path_s.as_str()];
    all.extend_from_slice(args);
    let out = fallback(&all);
    let json = serde_json::from_slice(&std::fs::read(&path).expect("outcome written")).unwrap();
    let _ = std::fs::remove_file(&path);
    (out, json)
}

#[test]
fn refused_without_allow_degraded_naming_what_is_lost() {
    let out = confine(&["--backend", "unix-fallback", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    for word in ["unix-fallback", "--allow-degraded", "namespaces", "landlock", "seccomp", "cgroup"] {
        assert!(err.contains(word), "{word} in: {err}");
    }
}

#[test]
fn stdout_passes_through_and_exit_codes_are_the_jobs() {
    let out = fallback(&["--", "sh", "-c", "echo hello-fallback; echo to-stderr >&2; exit 3"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello-fallback\n");
    assert!(stderr(&out).contains("to-stderr"));
    assert_eq!(out.status.code(), Some(3));
    let missing = fallback(&["--", "no-such-command-confine"]);
    assert_eq!(missing.status.code(), Some(127), "{}", stderr(&missing));
}

#[test]
fn outcome_names_the_backend_and_the_missing_layers() {
    let (out, o) = outcome_of(&["--", "true"], "outcome");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(o["backend"], "unix-fallback");
    assert_eq!(o["status"], "success");
    assert_eq!(o["layers"]["userns"], false);
    assert_eq!(o["layers"]["seccomp"], serde_json::Value::Null);
    let missing: Vec<&str> = o["layers"]["missing"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
    for layer in ["userns", "mountns", "pidns", "netns", "landlock", "seccomp", "cgroup"] {
        assert!(missing.contains(&layer), "{layer} in {missing:?}");
    }
}

#[test]
fn the_job_starts_in_a_private_tmp_with_a_scrubbed_environment() {
    std::env::set_var("CONFINE_FALLBACK_SECRET", "s3cret");
    let out = fallback(&["--", "sh", "-c", "pwd; echo \"$HOME\"; env"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    let (cwd, home) = (lines.next().unwrap(), lines.next().unwrap());
    assert!(cwd.contains("confine-job-"), "{text}");
    // The same directory (macOS shows /private/var for /var in `pwd`).
    assert_eq!(std::path::Path::new(cwd).file_name(), std::path::Path::new(home).file_name());
    assert!(!text.contains("s3cret"), "{text}");
    assert!(!std::path::Path::new(cwd).exists(), "the private /tmp is removed after the job");
}

#[cfg(target_os = "linux")]
#[test]
fn memory_limit_fails_a_large_allocation() {
    if Command::new("python3").arg("-c").arg("0").status().map(|s| !s.success()).unwrap_or(true) {
        eprintln!("SKIPPED: python3 is not installed");
        return;
    }
    let out = fallback(&["--memory", "64M", "--", "python3", "-c", "b = bytearray(1 << 30); print('allocated')"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("allocated"));
    assert!(stderr(&out).contains("MemoryError"), "{}", stderr(&out));
}

#[test]
fn cpu_time_limit_ends_a_busy_loop() {
    let started = Instant::now();
    let (out, o) = outcome_of(&["--cpu-time", "1s", "--", "sh", "-c", "while :; do :; done"], "cpu");
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert_eq!(o["status"], "timeout");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(stderr(&out).contains("CPU time limit"), "{}", stderr(&out));
}

#[test]
fn timeout_kills_the_whole_tree() {
    let tok = token("tree");
    let script = format!("sh -c 'sleep 1000; : {tok}' & sh -c 'sleep 1000; : {tok}' & sleep 1000");
    let started = Instant::now();
    let (out, o) = outcome_of(&["--timeout", "1s", "--kill-grace", "500ms", "--", "sh", "-c", &script], "tree");
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert_eq!(o["status"], "timeout");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    assert_eq!(survivors(&tok), Vec::<String>::new());
}

/// A grandchild that leaves the job's session (`setsid`) is reparented to
/// the stage, a subreaper, and killed when the job ends.
#[cfg(target_os = "linux")]
#[test]
fn setsid_escapee_is_dead_after_the_job_exits() {
    let tok = token("escape");
    let script = format!("setsid sh -c 'sleep 1000; : {tok}' & sleep 0.3; echo started");
    let out = fallback(&["--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "started\n");
    assert_eq!(survivors(&tok), Vec::<String>::new());
}

/// The stage's control socket (fd 3) is not the job's to write on.
#[test]
fn the_job_does_not_inherit_the_control_socket() {
    let out = fallback(&["--", "sh", "-c", "if (: >&3) 2>/dev/null; then echo open; else echo closed; fi"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "closed\n", "{}", stderr(&out));
}
