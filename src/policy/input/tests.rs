use super::*;

fn req() -> ExecRequest {
    ExecRequest { runtime: "python".into(), code: Some("print(1)".into()), ..ExecRequest::default() }
}

#[test]
fn code_and_args_are_exclusive_and_one_is_required() {
    let l = LimitsConfig::default();
    let both = ExecRequest { args: vec!["-V".into()], ..req() };
    assert_eq!(both.check(&l), Err(InputError::CodeAndArgs));
    let neither = ExecRequest { code: None, ..req() };
    assert_eq!(neither.check(&l), Err(InputError::NothingToRun));
    assert!(neither.check(&l).unwrap_err().to_string().contains("pass code"));
    assert_eq!(req().check(&l), Ok(()));
}

#[test]
fn code_over_the_limit_is_refused() {
    let l = LimitsConfig { max_code_bytes: 4, ..LimitsConfig::default() };
    let err = req().check(&l).unwrap_err();
    assert_eq!(err, InputError::CodeTooLarge { bytes: 8, max: 4 });
    assert!(err.to_string().contains("limits.max_code_bytes"));
    let big = ExecRequest { code: Some("x".repeat((1 << 20) + 1)), ..req() };
    assert!(matches!(big.check(&LimitsConfig::default()), Err(InputError::CodeTooLarge { .. })));
    let stdin = ExecRequest { stdin_bytes: (512 << 10) + 1, ..req() };
    assert!(matches!(stdin.check(&LimitsConfig::default()), Err(InputError::StdinTooLarge { .. })));
}

#[test]
fn a_nul_byte_in_args_is_refused_and_located() {
    let r = ExecRequest { code: None, args: vec!["ok".into(), "a\0b".into()], ..req() };
    let err = r.check(&LimitsConfig::default()).unwrap_err();
    assert_eq!(err.to_string(), "args[1] contains a NUL byte, which no program can receive");
    let r = ExecRequest { relative_cwd: Some("src\0".into()), ..req() };
    assert!(matches!(r.check(&LimitsConfig::default()), Err(InputError::NulByte { .. })));
}

#[test]
fn zero_limits_and_too_many_args_are_refused() {
    let r = ExecRequest { limits: LimitRequest { timeout_ms: Some(0), ..LimitRequest::default() }, ..req() };
    assert_eq!(r.check(&LimitsConfig::default()), Err(InputError::Zero { what: "timeoutMs" }));
    let r = ExecRequest { code: None, args: vec!["a".into(); 101], ..req() };
    assert!(matches!(r.check(&LimitsConfig::default()), Err(InputError::TooManyArgs { count: 101, .. })));
}

#[test]
fn the_input_document_has_the_documented_fields() {
    let l = LimitsConfig::default();
    let r = ExecRequest { env_keys: vec!["B".into(), "A".into(), "B".into()], repo_id: Some("web".into()), ..req() };
    let input = r.to_input("python3", l.resolve(&r.limits));
    let v = input.to_value();
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "args",
            "code",
            "code_bytes",
            "code_sha256",
            "code_truncated",
            "command",
            "cwd",
            "env_keys",
            "limits",
            "network",
            "operation",
            "repoId",
            "runtime",
            "timeoutMs"
        ]
    );
    assert_eq!(v["operation"], OP_CODE);
    assert_eq!(v["env_keys"], serde_json::json!(["A", "B"]));
    assert_eq!(v["network"], serde_json::json!({"mode": "none", "allow": []}));
    assert_eq!(v["cwd"], ".");
    assert_eq!(v["code_bytes"], 8);
    assert_eq!(v["code_sha256"], sha256_hex(b"print(1)"));
    assert_eq!((v["code"].as_str(), v["code_truncated"].as_bool()), (Some("print(1)"), Some(false)));
    assert_eq!(v["limits"]["timeoutMs"], 30_000);
    let args = ExecRequest { code: None, args: vec!["-c".into(), "curl x".into()], ..req() };
    let v = args.to_input("bash", l.resolve(&args.limits)).to_value();
    assert_eq!((v["code"].clone(), v["args"][1].as_str()), (serde_json::Value::Null, Some("curl x")));
}

#[test]
fn long_code_is_carried_up_to_64_kib_on_a_character_boundary() {
    let l = LimitsConfig::default();
    // 'é' is two bytes: the cut must not split one.
    let code = format!("x{}", "é".repeat(CODE_PREFIX_BYTES));
    let r = ExecRequest { code: Some(code.clone()), ..req() };
    let input = r.to_input("python3", l.resolve(&r.limits));
    let carried = input.code.as_deref().unwrap();
    assert_eq!(carried.len(), CODE_PREFIX_BYTES - 1);
    assert!(code.starts_with(carried));
    assert!(input.code_truncated);
    assert_eq!(input.code_bytes, code.len() as u64);
    assert_eq!(input.code_sha256.as_deref(), Some(sha256_hex(code.as_bytes()).as_str()));
    // Exactly 64 KiB is whole.
    let r = ExecRequest { code: Some("y".repeat(CODE_PREFIX_BYTES)), ..req() };
    let input = r.to_input("python3", l.resolve(&r.limits));
    assert!(!input.code_truncated && input.code.unwrap().len() == CODE_PREFIX_BYTES);
}

#[test]
fn canonical_json_sorts_keys_at_every_level() {
    let v = serde_json::json!({"b": 1, "a": {"d": [1, {"z": 0, "y": "x"}], "c": null}});
    assert_eq!(canonical_json(&v), r#"{"a":{"c":null,"d":[1,{"y":"x","z":0}]},"b":1}"#);
    let input = req().to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()));
    assert_eq!(input.canonical(), input.clone().canonical());
    assert!(input.canonical().starts_with(r#"{"args":[],"code":"print(1)","code_bytes":8,"#));
}

/// One rule for every name a job is given, from `-e`, `--env-file` or an
/// MCP request: `crate::env::invalid_name`.
#[test]
fn an_environment_name_that_is_no_name_is_refused() {
    for bad in ["A-B", "1X", "", "A\0B", "a b"] {
        let r = ExecRequest { env_keys: vec!["OK".into(), bad.into()], ..req() };
        let err = r.check(&LimitsConfig::default()).unwrap_err();
        assert!(matches!(err, InputError::EnvName { .. }), "{bad:?}: {err}");
        assert!(err.to_string().starts_with("environment variable '"), "{err}");
    }
    let r = ExecRequest { env_keys: vec!["_OK1".into()], ..req() };
    assert_eq!(r.check(&LimitsConfig::default()), Ok(()));
}
