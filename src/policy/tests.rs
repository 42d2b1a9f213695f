use super::*;
use crate::config::{LimitRequest, LimitsConfig};
use crate::job::Network;
use crate::policy::input::ExecRequest;

fn request(runtime: &str) -> ExecRequest {
    ExecRequest {
        repo_id: Some("web".into()),
        runtime: runtime.into(),
        args: vec!["-V".into()],
        ..ExecRequest::default()
    }
}

fn input_for(r: &ExecRequest, command: &str) -> PolicyInput {
    r.to_input(command, LimitsConfig::default().resolve(&r.limits))
}

fn default_chain() -> PolicyChain {
    PolicyChain::from_config(&PolicyConfig::default()).unwrap()
}

/// An evaluator with a fixed answer.
struct Fixed(&'static str, Result<Verdict, &'static str>);

impl PolicyEvaluator for Fixed {
    fn name(&self) -> &str {
        self.0
    }
    fn digest(&self) -> &str {
        self.0
    }
    fn evaluate(&self, _: &PolicyInput) -> Result<Verdict, PolicyError> {
        self.1.clone().map_err(|m| PolicyError::Eval { evaluator: self.0.into(), message: m.into() })
    }
}

fn allow() -> Result<Verdict, &'static str> {
    Ok(Verdict { allow: true, ..Verdict::default() })
}

fn deny(reason: &'static str) -> Result<Verdict, &'static str> {
    Ok(Verdict { allow: false, deny_reasons: vec![reason.into()], ..Verdict::default() })
}

fn chain(mode: PolicyMode, evs: Vec<Fixed>) -> PolicyChain {
    PolicyChain::new(mode, evs.into_iter().map(|e| Box::new(e) as Box<dyn PolicyEvaluator>).collect())
}

#[test]
fn the_default_policy_allows_every_runtime_in_a_repo_without_network() {
    let c = default_chain();
    for rt in crate::runtimes::NAMES {
        let d = c.decide(&input_for(&request(rt), "x"));
        assert!(d.allowed, "{rt}: {:?}", d.deny_reasons);
        assert_eq!(d.denial_message("x"), None);
    }
}

#[test]
fn the_default_policy_denies_network_tools_with_the_documented_text() {
    let d = default_chain().decide(&input_for(&request("shell"), "/usr/bin/curl"));
    assert!(!d.allowed);
    assert_eq!(
        d.denial_message("curl").unwrap(),
        "denied by policy: 'curl' is a network tool, and network tools are not allowed"
    );
}

#[test]
fn the_default_policy_denies_host_network_unless_configured() {
    let r = ExecRequest { network: Network::Host, ..request("python") };
    let d = default_chain().decide(&input_for(&r, "python3"));
    assert!(!d.allowed);
    assert!(d.deny_reasons[0].contains("policy.allow_host_network"), "{:?}", d.deny_reasons);
    let cfg = PolicyConfig { allow_host_network: true, ..PolicyConfig::default() };
    assert!(PolicyChain::from_config(&cfg).unwrap().decide(&input_for(&r, "python3")).allowed);
}

#[test]
fn the_default_policy_allows_only_the_operators_allowlist_entries() {
    let r = ExecRequest {
        network: Network::Allow(vec!["pypi.org".into(), "files.pythonhosted.org".into()]),
        ..request("python")
    };
    let d = default_chain().decide(&input_for(&r, "python3"));
    assert!(!d.allowed);
    assert_eq!(
        d.deny_reasons,
        [
            "network allowlist entry 'files.pythonhosted.org' is not in confine.toml's [network.allow] lists",
            "network allowlist entry 'pypi.org' is not in confine.toml's [network.allow] lists",
        ]
    );
    let listed = vec!["files.pythonhosted.org".to_string(), "pypi.org".to_string()];
    let cfg = PolicyConfig { network_allowlisted: listed.clone(), ..PolicyConfig::default() };
    assert!(PolicyChain::from_config(&cfg).unwrap().decide(&input_for(&r, "python3")).allowed);
    // One entry beyond the operator's lists is enough to refuse.
    let wider =
        ExecRequest { network: Network::Allow(vec!["pypi.org".into(), "evil.example".into()]), ..request("python") };
    let d = PolicyChain::from_config(&cfg).unwrap().decide(&input_for(&wider, "python3"));
    assert_eq!(
        d.deny_reasons,
        ["network allowlist entry 'evil.example' is not in confine.toml's [network.allow] lists"]
    );
    // Host networking is not implied by an allowlist, nor the reverse.
    let host = PolicyConfig { network_allowlisted: listed, ..PolicyConfig::default() };
    let h = ExecRequest { network: Network::Host, ..request("python") };
    assert!(!PolicyChain::from_config(&host).unwrap().decide(&input_for(&h, "python3")).allowed);
}

#[test]
fn the_default_policy_denies_unknown_runtimes_escaping_cwds_and_no_repo() {
    let c = default_chain();
    let d = c.decide(&input_for(&request("cobol"), "cobc"));
    assert_eq!(d.deny_reasons, ["runtime 'cobol' is not supported"]);
    let r = ExecRequest { relative_cwd: Some("src/../../etc".into()), ..request("python") };
    let d = c.decide(&input_for(&r, "python3"));
    assert_eq!(d.deny_reasons, ["relativeCwd must not contain '..' (got 'src/../../etc')"]);
    // The cwd is what was denied, not the interpreter.
    assert_eq!(
        d.denial_message("python3").unwrap(),
        "denied by policy: relativeCwd must not contain '..' (got 'src/../../etc')"
    );
    let r = ExecRequest { relative_cwd: Some("/etc".into()), ..request("python") };
    assert_eq!(
        c.decide(&input_for(&r, "python3")).deny_reasons,
        ["relativeCwd must be relative to the repository root (got '/etc')"]
    );
    let r = ExecRequest { repo_id: None, ..request("python") };
    assert_eq!(c.decide(&input_for(&r, "python3")).deny_reasons, ["a repository is required (name a repoId)"]);
}

#[test]
fn an_empty_chain_denies() {
    let cfg = PolicyConfig { builtin: false, ..PolicyConfig::default() };
    let c = PolicyChain::from_config(&cfg).unwrap();
    assert!(c.is_empty());
    let d = c.decide(&input_for(&request("python"), "python3"));
    assert!(!d.allowed);
    assert!(d.deny_reasons[0].contains("no policy evaluator"), "{:?}", d.deny_reasons);
}

#[test]
fn mode_all_needs_every_evaluator_and_collects_reasons() {
    let i = input_for(&request("python"), "python3");
    assert!(chain(PolicyMode::All, vec![Fixed("a", allow()), Fixed("b", allow())]).decide(&i).allowed);
    let d =
        chain(PolicyMode::All, vec![Fixed("a", allow()), Fixed("b", deny("nope")), Fixed("c", deny("no"))]).decide(&i);
    assert!(!d.allowed);
    assert_eq!(d.deny_reasons, ["nope", "no"]);
}

#[test]
fn mode_any_needs_one_evaluator() {
    let i = input_for(&request("python"), "python3");
    assert!(chain(PolicyMode::Any, vec![Fixed("a", deny("nope")), Fixed("b", allow())]).decide(&i).allowed);
    let d = chain(PolicyMode::Any, vec![Fixed("a", deny("nope")), Fixed("b", deny("no"))]).decide(&i);
    assert_eq!(d.deny_reasons, ["nope", "no"]);
}

#[test]
fn an_evaluator_error_denies_in_either_mode() {
    let i = input_for(&request("python"), "python3");
    for mode in [PolicyMode::All, PolicyMode::Any] {
        let d = chain(mode, vec![Fixed("a", allow()), Fixed("b", Err("boom"))]).decide(&i);
        assert!(!d.allowed, "{mode:?}");
        assert_eq!(d.deny_reasons, ["policy error: b: boom"]);
    }
}

#[test]
fn allow_without_reasons_is_still_named() {
    let i = input_for(&request("python"), "python3");
    let d = chain(PolicyMode::All, vec![Fixed("a", Ok(Verdict::default()))]).decide(&i);
    assert_eq!(d.deny_reasons, ["no rule of policy a allows this request"]);
    assert_eq!(d.denial_message("python3").unwrap(), "denied by policy: no rule of policy a allows this request");
    let silent = Decision::new(&i, false, vec![], LimitCaps::default(), "d");
    assert_eq!(silent.denial_message("python3").unwrap(), "denied by policy: 'python3' is not allowed");
}

#[test]
fn policy_limits_are_the_tightest_of_all_answers() {
    let i = input_for(&request("python"), "python3");
    let capped = |t| {
        Ok(Verdict {
            allow: true,
            limits: LimitCaps { timeout_ms: Some(t), ..LimitCaps::default() },
            ..Verdict::default()
        })
    };
    let d = chain(PolicyMode::All, vec![Fixed("a", capped(500)), Fixed("b", capped(200))]).decide(&i);
    assert!(d.allowed);
    assert_eq!(d.limits.timeout_ms, Some(200));
    let mut eff = LimitsConfig::default().resolve(&LimitRequest::default());
    eff.clamp_to(&d.limits);
    assert_eq!((eff.timeout_ms, eff.clamped.as_slice()), (200, ["timeoutMs".to_string()].as_slice()));
}

#[test]
fn the_audit_hash_covers_input_decision_and_policy() {
    let c = default_chain();
    let i = input_for(&request("python"), "python3");
    let a = c.decide(&i);
    assert_eq!(a.audit_hash, c.decide(&i).audit_hash, "deterministic");
    assert_eq!(a.audit_hash.len(), 64);
    assert_eq!(a.policy_digest, c.digest());
    let other = input_for(&ExecRequest { args: vec!["-c".into()], ..request("python") }, "python3");
    assert_ne!(a.audit_hash, c.decide(&other).audit_hash);
    let host = PolicyChain::from_config(&PolicyConfig { allow_host_network: true, ..PolicyConfig::default() }).unwrap();
    assert_ne!(host.digest(), c.digest(), "policy data is part of the digest");
    assert_ne!(a.audit_hash, host.decide(&i).audit_hash);
}

#[test]
fn the_gate_denies_with_its_own_text() {
    let c = default_chain();
    let d = Decision::disabled(&input_for(&request("python"), "python3"), c.digest());
    assert!(!d.allowed && d.gate);
    assert_eq!(d.denial_message("python3").unwrap(), DISABLED_REASON);
    assert_eq!(DISABLED_REASON, "runtime execution is disabled (set runtime.enabled = true)");
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["deniedReasons"][0], DISABLED_REASON);
    assert!(json["auditHash"].is_string());
}

#[test]
fn verdicts_of_the_wrong_shape_are_errors() {
    assert!(Verdict::from_json("t", &serde_json::json!({"allow": "yes"})).is_err());
    assert!(Verdict::from_json("t", &serde_json::json!({"deny_reasons": []})).is_err());
    assert!(Verdict::from_json("t", &serde_json::json!({"allow": true, "deny_reasons": [1]})).is_err());
    let err = Verdict::from_json("t", &serde_json::json!({"allow": true, "limits": {"memory": 1}})).unwrap_err();
    assert!(err.to_string().contains("limits"), "{err}");
    assert!(Verdict::from_json("t", &serde_json::json!(true)).unwrap().allow);
}

#[tokio::test]
async fn decide_async_matches_decide() {
    let c = std::sync::Arc::new(default_chain());
    let i = input_for(&request("python"), "python3");
    assert_eq!(c.decide_async(i.clone()).await, c.decide(&i));
}

/// p50 of one default-policy evaluation; run with `--ignored --nocapture`.
#[test]
#[ignore = "benchmark"]
fn bench_default_policy_p50() {
    let c = default_chain();
    let i = input_for(&request("python"), "python3");
    let mut times: Vec<std::time::Duration> = (0..1000)
        .map(|_| {
            let t = std::time::Instant::now();
            assert!(c.decide(&i).allowed);
            t.elapsed()
        })
        .collect();
    times.sort();
    println!("default.rego decide: p50 {:?}, p99 {:?}", times[500], times[990]);
}
