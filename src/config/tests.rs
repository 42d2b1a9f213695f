use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/confine/test.toml"))
}

#[test]
fn embedded_defaults_match_the_rust_defaults() {
    let mut embedded = parse(DEFAULT_TOML).unwrap();
    embedded.source = None;
    assert_eq!(embedded, Config::default());
    assert!(!embedded.runtime.enabled, "execution must be off by default");
    assert_eq!(embedded.limits.max_code_bytes, 1 << 20);
    assert_eq!(embedded.limits.max_stdin_bytes, 512 << 10);
}

#[test]
fn a_typo_is_an_error_naming_the_file_and_the_key() {
    let err = parse("[runtime]\nenabeld = true\n").unwrap_err().to_string();
    assert!(err.contains("/etc/confine/test.toml"), "{err}");
    assert!(err.contains("enabeld"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let err = parse("[limtis]\n").unwrap_err().to_string();
    assert!(err.contains("limtis"), "{err}");
}

#[test]
fn a_malformed_file_is_an_error() {
    let err = parse("[runtime\nenabled = true").unwrap_err();
    assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    let err = parse("[runtime]\nenabled = \"yes\"\n").unwrap_err().to_string();
    assert!(err.contains("enabled") || err.contains("boolean"), "{err}");
}

#[test]
fn a_partial_file_keeps_the_other_defaults() {
    let c = parse("[runtime]\nenabled = true\n[limits]\nmax_timeout_ms = 60000\n").unwrap();
    assert!(c.runtime.enabled);
    assert_eq!(c.limits.max_timeout_ms, 60_000);
    assert_eq!(c.limits.timeout_ms, 30_000);
    assert_eq!(c.runtime.max_queued, 64);
    assert_eq!(c.source.as_deref(), Some(Path::new("/etc/confine/test.toml")));
}

#[test]
fn inconsistent_values_are_rejected_with_the_key() {
    let err = parse("[limits]\ntimeout_ms = 5000\nmax_timeout_ms = 1000\n").unwrap_err().to_string();
    assert!(err.contains("limits.timeout_ms") && err.contains("above its maximum"), "{err}");
    let err = parse("[runtime]\nmax_concurrent_jobs = 0\n").unwrap_err().to_string();
    assert!(err.contains("runtime.max_concurrent_jobs"), "{err}");
    let err = parse("[[policy.evaluators]]\npath = \"/a\"\nurl = \"http://x\"\n").unwrap_err().to_string();
    assert!(err.contains("policy.evaluators[0]") && err.contains("exactly one"), "{err}");
    let err = parse("[[policy.evaluators]]\nurl = \"ftp://x\"\n").unwrap_err().to_string();
    assert!(err.contains("http://"), "{err}");
    let err = parse("[[repos]]\nid = \"a\"\nroot = \"rel\"\n").unwrap_err().to_string();
    assert!(err.contains("absolute"), "{err}");
    let err = parse("[[repos]]\nid = \"a\"\nroot = \"/a\"\n[[repos]]\nid = \"a\"\nroot = \"/b\"\n").unwrap_err();
    assert!(err.to_string().contains("repeated"), "{err}");
}

#[test]
fn lookup_order_is_flag_then_env_then_xdg() {
    let dir = tempfile::tempdir().unwrap();
    let xdg = dir.path().join("xdg");
    std::fs::create_dir_all(xdg.join("confine")).unwrap();
    std::fs::write(xdg.join("confine/config.toml"), "").unwrap();
    let env =
        |vars: Vec<(&'static str, OsString)>| move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
    let both = || vec![("CONFINE_CONFIG", OsString::from("/env.toml")), ("XDG_CONFIG_HOME", xdg.clone().into())];
    let flag = Path::new("/flag.toml");
    assert_eq!(Config::locate(Some(flag), env(both())), Some(flag.to_path_buf()));
    assert_eq!(Config::locate(None, env(both())), Some(PathBuf::from("/env.toml")));
    let only_xdg = vec![("XDG_CONFIG_HOME", xdg.clone().into())];
    assert_eq!(Config::locate(None, env(only_xdg)), Some(xdg.join("confine/config.toml")));
    assert_eq!(Config::locate(None, env(vec![("HOME", "/nonexistent-home".into())])), None);
}

#[test]
fn a_missing_explicit_file_is_an_error() {
    let err = Config::load(Some(Path::new("/nonexistent/confine.toml"))).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/confine.toml") && err.contains("--config"), "{err}");
}

#[test]
fn repos_resolve_and_unknown_ids_are_named() {
    let mut c = parse("[[repos]]\nid = \"web\"\nroot = \"/srv/web\"\n").unwrap();
    assert_eq!(c.repo("web").unwrap().root, PathBuf::from("/srv/web"));
    let err = c.repo("api").unwrap_err().to_string();
    assert!(err.contains("unknown repoId 'api'") && err.contains("web"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    assert_eq!(c.add_adhoc_repo("cli", &root), "cli");
    assert_eq!(c.repo("cli").unwrap().root, root);
}

#[test]
fn store_path_comes_from_the_config() {
    let c = parse("[store]\npath = \"/var/lib/confine\"\n").unwrap();
    assert_eq!(c.store_path(), PathBuf::from("/var/lib/confine"));
    assert!(Config::default().max_concurrent_jobs() >= 1);
}

#[test]
fn requests_above_a_maximum_are_clamped_and_named() {
    let l = LimitsConfig::default();
    let e = l.resolve(&LimitRequest::default());
    assert_eq!(e.timeout_ms, 30_000);
    assert!(e.clamped.is_empty());
    let e = l.resolve(&LimitRequest {
        timeout_ms: Some(10_000_000),
        memory_bytes: Some(1 << 20),
        cpus: Some(64.0),
        ..LimitRequest::default()
    });
    assert_eq!(e.timeout_ms, l.max_timeout_ms);
    assert_eq!(e.memory_bytes, 1 << 20);
    assert_eq!(e.cpus, l.max_cpus);
    assert_eq!(e.clamped, ["timeoutMs", "cpus"]);
    let mut e2 = e.clone();
    e2.clamp_to(&LimitCaps { timeout_ms: Some(1000), pids: Some(10), ..LimitCaps::default() });
    assert_eq!((e2.timeout_ms, e2.pids), (1000, 10));
    assert_eq!(e2.clamped, ["timeoutMs", "cpus", "pids"]);
    let j = e2.to_job_limits(123);
    assert_eq!(j.timeout_ms, Some(1000));
    assert_eq!(j.clamped, e2.clamped);
}

#[test]
fn caps_min_takes_the_tighter_bound() {
    let a = LimitCaps { timeout_ms: Some(5), cpus: Some(2.0), ..LimitCaps::default() };
    let b = LimitCaps { timeout_ms: Some(9), pids: Some(3), ..LimitCaps::default() };
    let m = a.min(&b);
    assert_eq!((m.timeout_ms, m.cpus, m.pids), (Some(5), Some(2.0), Some(3)));
    assert!(LimitCaps::default().is_empty());
}

#[test]
fn the_backend_is_a_runtime_key() {
    use crate::sandbox::BackendChoice;
    let c = parse("[runtime]\nbackend = \"unix-fallback\"\nallow_degraded = true\n").unwrap();
    assert_eq!(c.runtime.backend, BackendChoice::UnixFallback);
    assert_eq!(Config::default().runtime.backend, BackendChoice::Auto);
    let err = parse("[runtime]\nbackend = \"docker\"\n").unwrap_err().to_string();
    assert!(err.contains("backend") && err.contains("unix-fallback"), "{err}");
}

#[test]
fn removed_output_keys_name_their_replacement() {
    let err = parse("[store]\nartifact_ttl_secs = 60\n").unwrap_err().to_string();
    assert!(
        err.contains("/etc/confine/test.toml: store.artifact_ttl_secs") && err.contains("output.ttl_secs"),
        "{err}"
    );
    for key in ["output_bytes", "max_output_bytes"] {
        let err = parse(&format!("[limits]\n{key} = 1024\n")).unwrap_err().to_string();
        assert!(err.contains(&format!("limits.{key}")) && err.contains("output.stdout_stored_bytes"), "{err}");
    }
    let err = parse("[output]\nttl_secs = 0\n").unwrap_err().to_string();
    assert!(err.contains("output.ttl_secs"), "{err}");
}

#[test]
fn output_bytes_is_the_stored_cap_and_a_request_cannot_raise_it() {
    let c = parse("[output]\nstdout_stored_bytes = 1048576\nstderr_stored_bytes = 4096\n").unwrap();
    assert_eq!(c.resolve_limits(&LimitRequest::default()).output_bytes, 1 << 20);
    let asked = LimitRequest { output_bytes: Some(1 << 30), ..LimitRequest::default() };
    let e = c.resolve_limits(&asked);
    assert_eq!(e.output_bytes, 1 << 20);
    assert_eq!(e.clamped, ["outputBytes"]);
    assert_eq!(LimitsConfig::default().resolve(&LimitRequest::default()).output_bytes, 64 << 20);
}

#[test]
fn mcp_tokens_are_checked() {
    let repos = "[[repos]]\nid = \"web\"\nroot = \"/srv/web\"\n";
    let ok = format!(
        "{repos}[[mcp.tokens]]\nid = \"ci\"\nsha256 = \"{}\"\nrepos = [\"web\"]\n\n\
         [[mcp.tokens]]\nid = \"ops\"\nfile = \"/etc/confine/ops.token\"\nrepos = [\"*\"]\n",
        "ab".repeat(32)
    );
    let c = parse(&ok).unwrap();
    assert_eq!(c.mcp.tokens.len(), 2);
    assert_eq!(c.mcp.tokens[0].repos, ["web"]);
    let bad = [
        ("id = \"ci\"\nrepos = [\"web\"]", "exactly one of file"),
        ("id = \"ci\"\nsha256 = \"xyz\"\nrepos = [\"web\"]", "64 hex digits"),
        ("id = \"ci\"\nfile = \"rel/path\"\nrepos = [\"web\"]", "absolute"),
        ("id = \"ci\"\nfile = \"/t\"\nrepos = []", "repos is empty"),
        ("id = \"ci\"\nfile = \"/t\"\nrepos = [\"api\"]", "'api', which is not a [[repos]] id"),
        ("id = \"a b\"\nfile = \"/t\"\nrepos = [\"web\"]", "id 'a b'"),
        ("id = \"ci\"\nfile = \"/t\"\nrepos = [\"web\"]\ntoken = \"x\"", "unknown field `token`"),
    ];
    for (entry, want) in bad {
        let err = parse(&format!("{repos}[[mcp.tokens]]\n{entry}\n")).unwrap_err().to_string();
        assert!(err.contains(want), "{entry}: {err}");
    }
}
