//! The unix-fallback backend, for real: the built binary runs jobs with
//! `--backend unix-fallback --allow-degraded`, and the tests check what it
//! promises — refusal without consent, rlimits, the tree kill on timeout,
//! a `setsid` escapee killed after the job (Linux: subreaper), streams
//! passed through, and an outcome that names the backend, what is lost and
//! the guarantees that held. Also the backend chosen in confine.toml: for
//! `confine run`, `doctor`, and (Linux) the governed `confine exec`.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn confine(args: &[&str]) -> Output {
    confine_with(args, &[])
}

/// `confine run ARGS…` with `env` added to the test's own environment
/// (given to the child: setting it in this process would race the other
/// tests' threads).
fn confine_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_confine"))
        .arg("run")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("start confine")
}

/// `confine run --backend unix-fallback --allow-degraded ARGS…`
fn fallback(args: &[&str]) -> Output {
    fallback_with(args, &[])
}

fn fallback_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec!["--backend", "unix-fallback", "--allow-degraded"];
    all.extend_from_slice(args);
    confine_with(&all, env)
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

/// The stage is a Rust program, which ignores SIGPIPE; the job must not.
#[test]
fn job_does_not_inherit_an_ignored_sigpipe() {
    let out = fallback(&["--", "sh", "-c", "grep '^SigIgn:' /proc/self/status; yes | head -c 1 >/dev/null"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let ignored = text.strip_prefix("SigIgn:").map(str::trim).unwrap_or_default();
    let mask = u64::from_str_radix(ignored, 16).unwrap_or_else(|_| panic!("no SigIgn in {text}"));
    assert_eq!(mask & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored: {text}");
    assert!(!stderr(&out).contains("Broken pipe"), "yes saw EPIPE instead of SIGPIPE: {}", stderr(&out));
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
    // Row by row, what held: the README's table of guarantees.
    let g = &o["guarantees"];
    for row in ["filesystem", "network", "syscalls"] {
        assert_eq!(g[row]["level"], "none", "{row}: {g}");
    }
    assert_eq!(g["envScrub"]["level"], "enforced", "{g}");
    assert_eq!(g["cpu"]["level"], "partial", "{g}");
    let tree_kill = if cfg!(target_os = "linux") { "enforced" } else { "partial" };
    assert_eq!(g["treeKill"]["level"], tree_kill, "{g}");
    assert!(stderr(&out).contains("degraded (none: filesystem, network, syscalls"), "{}", stderr(&out));
}

#[test]
fn the_job_starts_in_a_private_tmp_with_a_scrubbed_environment() {
    let out = fallback_with(&["--", "sh", "-c", "pwd; echo \"$HOME\"; env"], &[("CONFINE_FALLBACK_SECRET", "s3cret")]);
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

/// RLIMIT_NPROC: forks past --pids fail. (It counts every process of the
/// job's user, not only the job's: partial, and said so.) Perl, because a
/// shell retries a failed fork for seconds.
#[test]
fn pids_limit_fails_forks_past_it() {
    let script = "for (1..8) { my $p = fork; defined $p or do { print qq(fork failed\n); exit 3 }; \
                  if (!$p) { sleep 2; exit 0 } } print qq(all forked\n)";
    let out = fallback(&["--pids", "4", "--", "perl", "-e", script]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "fork failed\n", "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(3));
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

/// A scratch directory with a confine.toml, a repository and a data dir.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new(config: &str) -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("repo")).unwrap();
        std::fs::write(dir.path().join("confine.toml"), config).unwrap();
        Scratch { dir }
    }

    fn config(&self) -> String {
        self.dir.path().join("confine.toml").to_str().unwrap().to_string()
    }

    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn repo(&self) -> String {
        self.dir.path().join("repo").to_str().unwrap().to_string()
    }

    /// `confine --config <ours> ARGS…`, with the store in the scratch dir.
    fn confine(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_confine"))
            .arg("--config")
            .arg(self.config())
            .args(args)
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env_remove("CONFINE_CONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("start confine")
    }
}

#[test]
fn the_config_chooses_the_backend_with_consent_and_the_flag_wins() {
    let refused = Scratch::new("[runtime]\nbackend = \"unix-fallback\"\n");
    let out = refused.confine(&["run", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr(&out);
    let key = format!("runtime.backend = \"unix-fallback\" in {}", refused.config());
    for word in [key.as_str(), "allow_degraded = true", "--allow-degraded", "namespaces", "seccomp"] {
        assert!(err.contains(word), "{word} in: {err}");
    }
    // --allow-degraded on the command line is consent too.
    let out = refused.confine(&["run", "--allow-degraded", "--", "sh", "-c", "echo via-config"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "via-config\n", "{}", stderr(&out));
    assert!(stderr(&out).contains("unix-fallback backend, degraded"), "{}", stderr(&out));
    // The flag wins over the config: no fallback, so no refusal for it.
    let status = refused.dir.path().join("auto.json");
    let out = refused.confine(&["run", "--backend", "auto", "--json-status", status.to_str().unwrap(), "--", "true"]);
    assert!(!stderr(&out).contains("runtime.backend"), "{}", stderr(&out));
    if cfg!(target_os = "linux") {
        assert!(!stderr(&out).contains("unix-fallback"), "{}", stderr(&out));
    }
    if out.status.code() == Some(0) {
        // The full sandbox's outcome lists its guarantees too.
        let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
        assert_eq!(o["backend"], "linux");
        assert_eq!(o["guarantees"].as_object().map(|g| g.len()), Some(8), "{o}");
        assert_eq!(o["guarantees"]["envScrub"]["level"], "enforced", "{o}");
    }

    let allowed = Scratch::new("[runtime]\nbackend = \"unix-fallback\"\nallow_degraded = true\n");
    let status = allowed.dir.path().join("outcome.json");
    let out = allowed.confine(&["run", "--json-status", status.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(o["backend"], "unix-fallback");
    assert_eq!(o["guarantees"]["network"]["level"], "none");
}

/// What `confine doctor` says when the config chooses the fallback: the
/// backend by name, its guarantees, and not full isolation.
#[test]
fn doctor_names_the_configured_backend_and_its_guarantees() {
    let s = Scratch::new("[runtime]\nbackend = \"unix-fallback\"\nallow_degraded = true\n");
    let out = s.confine(&["doctor", "--json", "--no-smoke"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["backend"], "unix-fallback", "{v}");
    assert_eq!(v["fullIsolation"], false, "{v}");
    assert_eq!(v["guarantees"]["filesystem"]["level"], "none", "{v}");
    assert_eq!(v["guarantees"]["envScrub"]["level"], "enforced", "{v}");
    let text = String::from_utf8_lossy(&s.confine(&["doctor", "--no-smoke"]).stdout).into_owned();
    assert!(text.contains("backend: unix-fallback"), "{text}");
    for row in ["filesystem", "network", "syscalls", "memory", "cpu", "pids", "treeKill", "envScrub"] {
        assert!(text.lines().any(|l| l.trim_start().starts_with(row)), "{row} in {text}");
    }
}

/// The governed pipeline (`confine exec`, the one MCP uses) on the
/// unix-fallback backend chosen in confine.toml: args mode, code mode
/// (the source in the job's private /tmp), a compiled language (sandbox
/// paths inside the build script), and the timeout's tree kill.
#[cfg(target_os = "linux")]
mod governed {
    use super::*;

    const ENABLED: &str = "[runtime]\nenabled = true\nbackend = \"unix-fallback\"\nallow_degraded = true\n";

    fn exec(s: &Scratch, args: &[&str]) -> Output {
        let repo = s.repo();
        let mut all = vec!["exec", "--repo", repo.as_str()];
        all.extend_from_slice(args);
        s.confine(&all)
    }

    #[test]
    fn refused_at_start_without_allow_degraded() {
        let s = Scratch::new("[runtime]\nenabled = true\nbackend = \"unix-fallback\"\n");
        let out = exec(&s, &["--runtime", "shell", "--", "-c", "true"]);
        assert_eq!(out.status.code(), Some(125));
        let err = stderr(&out);
        for word in ["cannot run jobs", "runtime.backend = \"unix-fallback\"", "allow_degraded = true", "landlock"] {
            assert!(err.contains(word), "{word} in: {err}");
        }
        let out = s.confine(&["serve"]);
        assert_eq!(out.status.code(), Some(125));
        assert!(stderr(&out).contains("runtime.backend = \"unix-fallback\""), "{}", stderr(&out));
    }

    #[test]
    fn args_mode_runs_in_the_repository_and_names_the_backend() {
        let s = Scratch::new(ENABLED);
        let out = exec(&s, &["--runtime", "shell", "--", "-c", "echo governed; pwd"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let repo = std::fs::canonicalize(s.repo()).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("governed\n{}\n", repo.display()));
        assert!(stderr(&out).contains("backend=unix-fallback (none: filesystem"), "{}", stderr(&out));

        let out = exec(&s, &["--json", "--runtime", "shell", "--", "-c", "true"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["status"], "success", "{v}");
        assert_eq!(v["outcome"]["backend"], "unix-fallback", "{v}");
        assert_eq!(v["outcome"]["guarantees"]["treeKill"]["level"], "enforced", "{v}");
        assert_eq!(v["outcome"]["guarantees"]["network"]["level"], "none", "{v}");
    }

    #[test]
    fn code_mode_writes_the_source_into_the_private_tmp() {
        let s = Scratch::new(ENABLED);
        let out = exec(
            &s,
            &["--runtime", "shell", "--code", "echo from-code; case \"$0\" in \"$TMPDIR\"/*) echo in-tmp;; esac"],
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "from-code\nin-tmp\n", "{}", stderr(&out));
        assert_eq!(std::fs::read_dir(s.repo()).unwrap().count(), 0, "nothing is written into the repository");
    }

    #[test]
    fn a_compiled_language_builds_and_runs_in_the_private_tmp() {
        if Command::new("cc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
            eprintln!("SKIPPED: no C compiler (cc) on PATH");
            return;
        }
        let s = Scratch::new(ENABLED);
        let code = "#include <stdio.h>\nint main(void) { puts(\"compiled-fallback\"); return 0; }\n";
        let out = exec(&s, &["--runtime", "c", "--code", code]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "compiled-fallback\n");
    }

    #[test]
    fn the_timeout_kills_the_whole_tree() {
        let s = Scratch::new(ENABLED);
        let tok = token("governed");
        let script = format!("sh -c 'sleep 1000; : {tok}' & setsid sh -c 'sleep 1000; : {tok}' & sleep 1000");
        let started = Instant::now();
        let out = exec(&s, &["--timeout", "1s", "--runtime", "shell", "--", "-c", &script]);
        assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
        assert!(stderr(&out).contains("confine: timeout"), "{}", stderr(&out));
        assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
        assert_eq!(survivors(&tok), Vec::<String>::new());
    }
}
