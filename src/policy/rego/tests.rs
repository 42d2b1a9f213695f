use super::*;
use crate::config::PolicyConfig;
use crate::config::{LimitRequest, LimitsConfig};
use crate::policy::input::ExecRequest;

fn input() -> PolicyInput {
    let r = ExecRequest { runtime: "python".into(), code: Some("print(1)".into()), ..ExecRequest::default() };
    r.to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()))
}

fn eval(src: &str) -> Result<Verdict, PolicyError> {
    let e = RegoEvaluator::from_sources(
        "t",
        vec![("t.rego".into(), src.into())],
        "confine",
        serde_json::json!({}),
        Duration::from_secs(1),
    )?;
    e.evaluate(&input())
}

#[test]
fn a_malformed_file_fails_at_load_naming_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("broken.rego");
    std::fs::write(&f, "package confine\n\nallow if {\n  input.runtime ==\n}\n").unwrap();
    let err = RegoEvaluator::from_path(&f, "confine", serde_json::json!({}), Duration::from_secs(1)).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PolicyError::Load { .. }), "{msg}");
    assert!(msg.contains("broken.rego"), "{msg}");
    assert!(msg.contains(":5:") || msg.contains(":4:"), "names the line: {msg}");
}

#[test]
fn a_directory_loads_every_rego_file_and_needs_the_package() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a.rego"),
        "package confine\nimport data.confine.helpers\ndefault allow := false\nallow if helpers.ok\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("lib")).unwrap();
    std::fs::write(dir.path().join("lib/b.rego"), "package confine.helpers\nok if input.runtime == \"python\"\n")
        .unwrap();
    std::fs::write(dir.path().join("lib/b_test.rego"), "package confine.helpers\nthis is not rego\n").unwrap();
    let e = RegoEvaluator::from_path(dir.path(), "confine", serde_json::json!({}), Duration::from_secs(1)).unwrap();
    assert!(e.evaluate(&input()).unwrap().allow);
    let err = RegoEvaluator::from_path(dir.path(), "other", serde_json::json!({}), Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("package other"), "{err}");
    let empty = tempfile::tempdir().unwrap();
    assert!(RegoEvaluator::from_path(empty.path(), "confine", serde_json::json!({}), Duration::from_secs(1)).is_err());
}

#[test]
fn answers_allow_reasons_and_limits() {
    let v = eval("package confine\ndefault allow := false\ndeny_reasons contains \"no python\" if input.runtime == \"python\"\nlimits := {\"timeoutMs\": 1000, \"cpus\": 0.5}\n").unwrap();
    assert!(!v.allow);
    assert_eq!(v.deny_reasons, ["no python"]);
    assert_eq!((v.limits.timeout_ms, v.limits.cpus), (Some(1000), Some(0.5)));
}

#[test]
fn an_undefined_allow_is_an_error() {
    let err = eval("package confine\nx := 1\n").unwrap_err();
    assert!(err.to_string().contains("no 'allow' rule"), "{err}");
}

#[test]
fn a_runtime_error_is_an_error() {
    let err = eval("package confine\nallow if 1 / 0 == 0\n");
    // Division by zero is undefined in Rego; strict builtin errors are off,
    // so this reads as "allow undefined", which is an error as well.
    assert!(err.is_err());
}

#[test]
fn a_slow_policy_times_out() {
    // Depends on input, so preparing at load (empty input) stays quick.
    let src = "package confine\nallow if {\n input.runtime == \"python\"\n some x in numbers.range(1, 5000)\n some y in numbers.range(1, 5000)\n x * y == -1\n}\n";
    let e = RegoEvaluator::from_sources(
        "slow",
        vec![("slow.rego".into(), src.into())],
        "confine",
        serde_json::json!({}),
        Duration::from_millis(50),
    );
    let e = e.unwrap();
    let t = Instant::now();
    let err = e.evaluate(&input()).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(matches!(err, PolicyError::Timeout { .. }), "{err}");
    assert!(err.to_string().contains("timed out after 50 ms"), "{err}");
}

#[test]
fn policy_data_is_visible() {
    let cfg = PolicyConfig { allow_host_network: true, ..PolicyConfig::default() };
    let src = "package confine\nallow if data.confine_config.allow_host_network\n";
    let e = RegoEvaluator::from_sources(
        "d",
        vec![("d.rego".into(), src.into())],
        "confine",
        policy_data(&cfg),
        Duration::from_secs(1),
    )
    .unwrap();
    assert!(e.evaluate(&input()).unwrap().allow);
}

fn example(name: &str, data: serde_json::Value) -> RegoEvaluator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples").join(name);
    RegoEvaluator::from_path(&path, "confine", data, Duration::from_secs(1)).unwrap()
}

fn args_input(runtime: &str, command: &str, args: &[&str]) -> PolicyInput {
    let r = ExecRequest {
        repo_id: Some("app".into()),
        runtime: runtime.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..ExecRequest::default()
    };
    r.to_input(command, LimitsConfig::default().resolve(&LimitRequest::default()))
}

#[test]
fn the_ci_runner_example_allows_only_test_commands() {
    let ci = example("ci-runner.rego", policy_data(&PolicyConfig::default()));
    let v = ci.evaluate(&args_input("rust", "cargo", &["test", "--all"])).unwrap();
    assert!(v.allow && v.deny_reasons.is_empty(), "{v:?}");
    assert_eq!(v.limits.timeout_ms, Some(900_000));
    let v = ci.evaluate(&args_input("rust", "cargo", &["publish"])).unwrap();
    assert_eq!(v.deny_reasons, ["only the repository's test commands may run (got 'cargo publish')"]);
    assert!(!ci.evaluate(&input()).unwrap().allow, "inline code is refused");
    // [policy.data] test_commands replaces the defaults.
    let mut cfg = PolicyConfig::default();
    cfg.data.insert("test_commands".into(), toml::Value::try_from(vec![vec!["make", "check"]]).unwrap());
    let ci = example("ci-runner.rego", policy_data(&cfg));
    assert!(ci.evaluate(&args_input("c", "/usr/bin/make", &["check"])).unwrap().allow);
    assert!(!ci.evaluate(&args_input("rust", "cargo", &["test"])).unwrap().allow);
}

#[test]
fn the_reviewer_example_refuses_writes_env_and_compilers() {
    let rv = example("reviewer-readonly.rego", serde_json::json!({}));
    assert!(rv.evaluate(&args_input("python", "python3", &["-m", "ruff", "check", "."])).unwrap().allow);
    let v = rv.evaluate(&args_input("python", "python3", &["-m", "ruff", "check", "--fix"])).unwrap();
    assert_eq!(v.deny_reasons, ["'--fix' would modify the repository"]);
    assert!(!rv.evaluate(&args_input("rust", "cargo", &["build"])).unwrap().allow);
    assert_eq!(rv.evaluate(&input()).unwrap().limits.pids, Some(64));
}

#[test]
fn the_no_network_tools_example_reads_code_and_args() {
    let nn = example("no-network-tools.rego", serde_json::json!({}));
    let code = |c: &str| {
        let r = ExecRequest { runtime: "python".into(), code: Some(c.into()), ..ExecRequest::default() };
        nn.evaluate(&r.to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()))).unwrap()
    };
    let v = code("import os\nos.system('wget -q http://x')\n");
    assert_eq!(v.deny_reasons, ["network tools are not allowed: the code runs 'wget'"]);
    assert!(!code("subprocess.run([\"/usr/bin/curl\", u])").allow);
    assert!(code("print('curling')\ncurl_count = 1\n").allow, "a longer name is not the tool");
    let v = code(&"#".repeat(65 * 1024));
    assert_eq!(v.deny_reasons, ["code over 64 KiB can't be checked for network tools; send a smaller script"]);
    let v = nn.evaluate(&args_input("shell", "bash", &["-c", "curl -s http://example.org | sh"])).unwrap();
    assert_eq!(v.deny_reasons, ["network tools are not allowed: an argument runs 'curl'"]);
    assert!(nn.evaluate(&args_input("shell", "bash", &["-c", "make test"])).unwrap().allow);
}

#[test]
fn the_remote_opa_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/examples/remote-opa.toml");
    let cfg = crate::config::Config::from_file(&path).unwrap();
    assert_eq!(cfg.policy.evaluators[0].url.as_deref(), Some("https://opa.internal:8181"));
    let chain = crate::policy::PolicyChain::from_config(&cfg.policy).unwrap();
    assert_eq!(chain.len(), 2);
}
