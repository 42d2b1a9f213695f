//! The governance CLI end to end: `confine policy check` and `confine audit`,
//! each run as the real binary with its own config and data directory.

use crate::common;

use confine::config::{LimitRequest, LimitsConfig, PolicyConfig};
use confine::policy::input::ExecRequest;
use confine::policy::PolicyChain;
use confine::store::audit::{AuditEntry, AuditLog, AuditSink, RECORDS_TREE};
use confine::store::Store;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A scratch home: a config file, a data dir, a repository.
struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new(config: &str) -> Env {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("repo/src")).unwrap();
        let env = Env { dir };
        env.write("confine.toml", config);
        env
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn store_path(&self) -> PathBuf {
        self.path("data/confine")
    }

    fn confine(&self, args: &[&str]) -> Output {
        std::process::Command::new(env!("CARGO_BIN_EXE_confine"))
            .args(args)
            .env("XDG_DATA_HOME", self.path("data"))
            .env("XDG_CONFIG_HOME", self.path("xdg-config"))
            .env_remove("CONFINE_CONFIG")
            .current_dir(self.dir.path())
            .output()
            .unwrap()
    }

    /// `confine --config <ours> ARGS…`
    fn run(&self, args: &[&str]) -> Output {
        let cfg = self.path("confine.toml");
        let mut all = vec!["--config", cfg.to_str().unwrap()];
        all.extend_from_slice(args);
        self.confine(&all)
    }

    fn check(&self, args: &[&str]) -> Output {
        let mut all = vec!["policy", "check", "--repo", "repo"];
        all.extend_from_slice(args);
        self.run(&all)
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", stdout(o), stderr(o)))
}

#[test]
fn policy_check_prints_the_decision_and_the_input_document() {
    let env = Env::new("");
    let o = env.check(&["--runtime", "python", "--code", "print(1)", "--env", "LANG"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["allowed"], true);
    assert_eq!(v["decision"]["auditHash"].as_str().unwrap().len(), 64);
    assert_eq!(v["gate"], "runtime execution is disabled (set runtime.enabled = true)");
    let input = &v["input"];
    for key in [
        "operation",
        "runtime",
        "command",
        "args",
        "cwd",
        "env_keys",
        "timeoutMs",
        "limits",
        "network",
        "repoId",
        "code_sha256",
        "code_bytes",
    ] {
        assert!(input.get(key).is_some(), "input lacks {key}: {input}");
    }
    assert_eq!(input["command"], "python3");
    assert_eq!(input["env_keys"], serde_json::json!(["LANG"]));
}

#[test]
fn a_denial_names_the_command_and_the_reason() {
    let env = Env::new("");
    let o = env.check(&["--runtime", "shell", "--executable", "curl", "--", "https://example.com"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("denied by policy: 'curl' is a network tool, and network tools are not allowed"),
        "{}",
        stderr(&o)
    );
    assert_eq!(json(&o)["decision"]["deniedReasons"][0], "'curl' is a network tool, and network tools are not allowed");
}

#[test]
fn host_network_needs_the_config() {
    let env = Env::new("");
    let o = env.check(&["--runtime", "python", "--net", "host", "--code", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("host networking is not allowed"), "{}", stderr(&o));
    let env = Env::new("[policy]\nallow_host_network = true\n");
    let o = env.check(&["--runtime", "python", "--net", "host", "--code", "1"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

#[test]
fn requests_above_a_maximum_are_clamped_and_say_so() {
    let env = Env::new("[limits]\ntimeout_ms = 1000\nmax_timeout_ms = 5000\n");
    let o = env.check(&["--runtime", "python", "--code", "1", "--timeout-ms", "600000"]);
    let v = json(&o);
    assert_eq!(v["input"]["timeoutMs"], 5000);
    assert_eq!(v["input"]["limits"]["clamped"], serde_json::json!(["timeoutMs"]));
}

#[test]
fn bad_requests_get_a_clear_error() {
    let env = Env::new("[limits]\nmax_code_bytes = 16\n\n[[repos]]\nid = \"web\"\nroot = \"/nonexistent\"\n");
    let cases: &[(&[&str], &str)] = &[
        (&["--runtime", "cobol", "--code", "1"], "unknown runtime 'cobol'"),
        (&["--runtime", "python", "--code", "1", "--", "-V"], "code and args are exclusive"),
        (&["--runtime", "python"], "nothing to run"),
        (&["--runtime", "python", "--code", "print('0123456789')"], "above the limit of 16 bytes"),
        (&["--runtime", "python", "--cwd", "../..", "--code", "1"], "contains '..'"),
        (&["--runtime", "python", "--cwd", "/etc", "--code", "1"], "is absolute"),
        (&["--runtime", "python", "--cwd", "nope", "--code", "1"], "does not exist"),
    ];
    for (args, expected) in cases {
        let o = env.check(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expected), "{args:?}: {}", stderr(&o));
    }
    let o = env.run(&["policy", "check", "--repo-id", "api", "--runtime", "python", "--code", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown repoId 'api' (configured: web;"), "{}", stderr(&o));
}

#[test]
fn a_symlink_out_of_the_repo_is_refused() {
    let env = Env::new("");
    std::os::unix::fs::symlink(env.dir.path(), env.path("repo/up")).unwrap();
    let o = env.check(&["--runtime", "python", "--cwd", "up", "--code", "1"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("leads outside the repository"), "{}", stderr(&o));
}

#[test]
fn a_malformed_config_names_the_file_and_the_key() {
    let env = Env::new("[runtime]\nenabeld = true\n");
    let o = env.run(&["audit", "verify"]);
    assert_eq!(o.status.code(), Some(125));
    let err = stderr(&o);
    assert!(err.contains("confine.toml") && err.contains("enabeld") && err.contains("line 2"), "{err}");
}

#[test]
fn a_malformed_rego_file_fails_at_start_naming_file_and_line() {
    let env = Env::new("");
    let rego = env.write("bad.rego", "package confine\n\ndefault allow := false\nallow if {\n  input.runtime ==\n}\n");
    env.write("confine.toml", &format!("[[policy.evaluators]]\npath = \"{}\"\n", rego.display()));
    let o = env.check(&["--runtime", "python", "--code", "1"]);
    assert_eq!(o.status.code(), Some(125));
    let err = stderr(&o);
    assert!(err.contains("bad.rego:6:") || err.contains("bad.rego:5:"), "{err}");
}

#[test]
fn an_unreachable_remote_opa_denies() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let env =
        Env::new(&format!("[policy]\ntimeout_ms = 2000\n[[policy.evaluators]]\nurl = \"http://127.0.0.1:{port}\"\n"));
    let o = env.check(&["--runtime", "python", "--code", "1"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("policy error: opa confine: cannot reach the OPA server"), "{}", stderr(&o));
}

#[test]
fn an_empty_chain_denies_everything() {
    let env = Env::new("[policy]\nbuiltin = false\n");
    let o = env.check(&["--runtime", "python", "--code", "1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no policy evaluator is configured"), "{}", stderr(&o));
}

#[test]
fn the_config_is_found_through_confine_config_and_is_global() {
    let env = Env::new("[policy]\nbuiltin = false\n");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_confine"))
        .args(["policy", "check", "--runtime", "python", "--code", "1"])
        .env("CONFINE_CONFIG", env.path("confine.toml"))
        .env("XDG_DATA_HOME", env.path("data"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "CONFINE_CONFIG was read: {}", stderr(&o));
    // --config after the subcommand works too.
    let cfg = env.path("confine.toml");
    let o = env.confine(&["policy", "check", "--config", cfg.to_str().unwrap(), "--runtime", "python", "--code", "1"]);
    assert_eq!(o.status.code(), Some(1));
}

fn append_records(store_path: &Path, n: usize) {
    let store = Store::open(store_path).unwrap();
    let log = AuditLog::open(&store).unwrap();
    let chain = PolicyChain::from_config(&PolicyConfig::default()).unwrap();
    for i in 1..=n {
        let req = ExecRequest {
            repo_id: Some("web".into()),
            runtime: "python".into(),
            code: Some(format!("print({i})")),
            ..ExecRequest::default()
        };
        let input = req.to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()));
        log.append(AuditEntry::decided(&format!("job-{i}"), &input, &chain.decide(&input))).unwrap();
    }
}

#[test]
fn audit_ls_show_verify_and_export() {
    let env = Env::new("");
    let o = env.run(&["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("ok: 0 records"));
    append_records(&env.store_path(), 3);

    let o = env.run(&["audit", "ls", "--limit", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("job-3") && out.contains("job-2") && !out.contains("job-1"), "{out}");

    let o = env.run(&["audit", "show", "job-2"]);
    assert_eq!(json(&o)["seq"], 2);
    let o = env.run(&["audit", "show", "job-9"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("no audit record with id 'job-9'"));

    let o = env.run(&["audit", "verify"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("ok: 3 records, hash chain intact"), "{}", stdout(&o));

    let o = env.run(&["audit", "export", "--jsonl"]);
    assert_eq!(o.status.code(), Some(0));
    let lines: Vec<serde_json::Value> = stdout(&o).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["prevHash"], lines[0]["recordHash"]);
}

#[test]
fn audit_verify_finds_an_edited_record() {
    let env = Env::new("");
    append_records(&env.store_path(), 3);
    {
        let store = common::open_store(&env.store_path());
        let tree = store.tree(RECORDS_TREE).unwrap();
        let key = 2u64.to_be_bytes();
        let mut v: serde_json::Value = serde_json::from_slice(&tree.get(key).unwrap().unwrap()).unwrap();
        v["runtime"] = "shell".into();
        tree.insert(key, serde_json::to_vec(&v).unwrap()).unwrap();
        store.flush().unwrap();
    }
    let o = env.run(&["audit", "verify"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("broken: record 2 (id job-2)"), "{}", stdout(&o));
}
