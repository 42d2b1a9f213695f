//! Policy: the config gate, a chain of evaluators (local Rego, remote OPA)
//! combined in mode `all` or `any`, and the [`Decision`] with its audit hash.
//!
//! Evaluators sit behind [`PolicyEvaluator`] so a central OPA can replace
//! local Rego without touching the supervisor. This module fails closed and
//! must never turn an error into an allow: an empty chain, an evaluator
//! error and a timeout all deny, in either mode.

pub mod input;
pub mod rego;
pub mod remote;

use crate::config::{LimitCaps, PolicyConfig, PolicyMode};
use input::{canonical_json, sha256_hex, PolicyInput};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The built-in policy, `policies/default.rego`.
pub const DEFAULT_REGO: &str = include_str!("../../policies/default.rego");

/// The reason every request gets while `runtime.enabled` is false.
pub const DISABLED_REASON: &str = "runtime execution is disabled (set runtime.enabled = true)";

/// Errors of loading or running an evaluator.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A policy file could not be read or parsed; the message names file and line.
    #[error("policy {path}: {message}")]
    Load { path: String, message: String },
    /// The policy failed while evaluating (or its answer has the wrong shape).
    #[error("{evaluator}: {message}")]
    Eval { evaluator: String, message: String },
    /// The evaluation took longer than `policy.timeout_ms`.
    #[error("{evaluator}: evaluation timed out after {} ms (policy.timeout_ms)", .after.as_millis())]
    Timeout { evaluator: String, after: Duration },
    /// A remote evaluator could not be reached or answered badly.
    #[error("{evaluator}: {message}")]
    Remote { evaluator: String, message: String },
}

/// One evaluator's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub allow: bool,
    pub deny_reasons: Vec<String>,
    pub limits: LimitCaps,
}

impl Verdict {
    /// Read a policy package's answer: `{allow, deny_reasons, limits}`, or a
    /// bare boolean (an OPA path that points at the `allow` rule itself).
    pub fn from_json(evaluator: &str, v: &serde_json::Value) -> Result<Verdict, PolicyError> {
        let bad = |message: String| PolicyError::Eval { evaluator: evaluator.to_string(), message };
        if let Some(allow) = v.as_bool() {
            return Ok(Verdict { allow, ..Verdict::default() });
        }
        let obj = v.as_object().ok_or_else(|| bad(format!("expected an object with 'allow', got {v}")))?;
        let allow = match obj.get("allow") {
            Some(serde_json::Value::Bool(b)) => *b,
            Some(other) => return Err(bad(format!("'allow' must be a boolean, got {other}"))),
            None => return Err(bad("the policy defines no 'allow' rule".into())),
        };
        let mut deny_reasons = Vec::new();
        match obj.get("deny_reasons") {
            None | Some(serde_json::Value::Null) => {}
            Some(serde_json::Value::Array(items)) => {
                for item in items {
                    match item.as_str() {
                        Some(s) => deny_reasons.push(s.to_string()),
                        None => return Err(bad(format!("'deny_reasons' must hold strings, got {item}"))),
                    }
                }
            }
            Some(other) => return Err(bad(format!("'deny_reasons' must be a set of strings, got {other}"))),
        }
        let limits = match obj.get("limits") {
            None | Some(serde_json::Value::Null) => LimitCaps::default(),
            Some(l) => serde_json::from_value::<StrictCaps>(l.clone())
                .map_err(|e| bad(format!("'limits' is malformed: {e}")))?
                .into(),
        };
        Ok(Verdict { allow, deny_reasons, limits })
    }
}

/// `limits` of a policy answer, strict: a misspelled cap is an evaluator
/// error (and so a denial), never a silently missing cap.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct StrictCaps {
    timeout_ms: Option<u64>,
    memory_bytes: Option<u64>,
    cpus: Option<f64>,
    pids: Option<u64>,
    output_bytes: Option<u64>,
}

impl From<StrictCaps> for LimitCaps {
    fn from(s: StrictCaps) -> Self {
        LimitCaps {
            timeout_ms: s.timeout_ms,
            memory_bytes: s.memory_bytes,
            cpus: s.cpus,
            pids: s.pids,
            output_bytes: s.output_bytes,
        }
    }
}

/// Something that answers "may this run?". Implementations must be cheap to
/// share between threads and enforce their own time budget.
pub trait PolicyEvaluator: Send + Sync {
    /// A short name for denial texts and logs (no host paths).
    fn name(&self) -> &str;
    /// SHA-256 of what this evaluator decides with (sources, data, address).
    fn digest(&self) -> &str;
    /// Evaluate one input document.
    fn evaluate(&self, input: &PolicyInput) -> Result<Verdict, PolicyError>;
}

/// The outcome of the gate and the policy for one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub allowed: bool,
    #[serde(rename = "deniedReasons")]
    pub deny_reasons: Vec<String>,
    /// Caps the policy put on the request (already the tightest of all).
    #[serde(default, skip_serializing_if = "LimitCaps::is_empty")]
    pub limits: LimitCaps,
    pub policy_digest: String,
    /// SHA-256 over the canonical input, the decision and the policy digest.
    pub audit_hash: String,
    /// Denied by the `runtime.enabled` gate, before any policy ran.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub gate: bool,
}

impl Decision {
    fn new(input: &PolicyInput, allowed: bool, deny_reasons: Vec<String>, limits: LimitCaps, digest: &str) -> Self {
        let decided = serde_json::json!({
            "allowed": allowed,
            "deniedReasons": deny_reasons,
            "limits": serde_json::to_value(&limits).unwrap_or_default(),
        });
        let hashed = format!("{}\n{}\n{}", input.canonical(), canonical_json(&decided), digest);
        Decision {
            allowed,
            deny_reasons,
            limits,
            policy_digest: digest.to_string(),
            audit_hash: sha256_hex(hashed.as_bytes()),
            gate: false,
        }
    }

    /// The denial for a disabled runtime: no policy runs.
    pub fn disabled(input: &PolicyInput, policy_digest: &str) -> Decision {
        Decision {
            gate: true,
            ..Decision::new(input, false, vec![DISABLED_REASON.into()], LimitCaps::default(), policy_digest)
        }
    }

    /// The denial of a request that never reached the policy (bad input,
    /// unknown runtime or repo), so that it is audited like any other.
    pub fn rejected(input: &PolicyInput, reason: String, policy_digest: &str) -> Decision {
        Decision::new(input, false, vec![reason], LimitCaps::default(), policy_digest)
    }

    /// The text a caller sees, `None` when allowed:
    /// `denied by policy: 'curl' is a network tool, and network tools are
    /// not allowed`. The reasons say what was denied (the command, the
    /// cwd, the inline code, the network), so the message is theirs alone:
    /// prefixing "'bash' is not allowed" would blame the command for a
    /// reason about the cwd. Only a denial without reasons names the
    /// command.
    pub fn denial_message(&self, command: &str) -> Option<String> {
        if self.allowed {
            return None;
        }
        if self.gate {
            return Some(DISABLED_REASON.to_string());
        }
        Some(if self.deny_reasons.is_empty() {
            format!("denied by policy: '{command}' is not allowed")
        } else {
            format!("denied by policy: {}", self.deny_reasons.join("; "))
        })
    }
}

/// The configured evaluators and how they combine.
pub struct PolicyChain {
    mode: PolicyMode,
    evaluators: Vec<Box<dyn PolicyEvaluator>>,
    digest: String,
}

impl PolicyChain {
    pub fn new(mode: PolicyMode, evaluators: Vec<Box<dyn PolicyEvaluator>>) -> PolicyChain {
        let mode_name = match mode {
            PolicyMode::All => "all",
            PolicyMode::Any => "any",
        };
        let mut joined = format!("mode={mode_name}");
        for e in &evaluators {
            joined.push('\n');
            joined.push_str(e.digest());
        }
        PolicyChain { mode, evaluators, digest: sha256_hex(joined.as_bytes()) }
    }

    /// Build the chain from `[policy]`: the built-in policy (unless
    /// `builtin = false`), then each configured evaluator. Local policies are
    /// parsed here, so a malformed file stops confine at start.
    pub fn from_config(cfg: &PolicyConfig) -> Result<PolicyChain, PolicyError> {
        let timeout = Duration::from_millis(cfg.timeout_ms);
        let data = rego::policy_data(cfg);
        let mut evaluators: Vec<Box<dyn PolicyEvaluator>> = Vec::new();
        if cfg.builtin {
            evaluators.push(Box::new(rego::RegoEvaluator::builtin(data.clone(), timeout)?));
        }
        for e in &cfg.evaluators {
            if let Some(path) = &e.path {
                let package = e.package.as_deref().unwrap_or(rego::DEFAULT_PACKAGE);
                evaluators.push(Box::new(rego::RegoEvaluator::from_path(path, package, data.clone(), timeout)?));
            } else if let Some(url) = &e.url {
                let policy_path = e.policy_path.as_deref().unwrap_or(remote::DEFAULT_POLICY_PATH);
                evaluators.push(Box::new(remote::RemoteEvaluator::new(url, policy_path, timeout)));
            }
        }
        Ok(PolicyChain::new(cfg.mode, evaluators))
    }

    /// SHA-256 over the mode and every evaluator's digest.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    pub fn len(&self) -> usize {
        self.evaluators.len()
    }

    pub fn is_empty(&self) -> bool {
        self.evaluators.is_empty()
    }

    /// [`PolicyChain::decide`] on tokio's blocking pool (a remote evaluator
    /// blocks on HTTP for up to `policy.timeout_ms`). A panic in an
    /// evaluator denies, like any other evaluator failure.
    pub async fn decide_async(self: &std::sync::Arc<Self>, input: PolicyInput) -> Decision {
        let chain = std::sync::Arc::clone(self);
        let fallback = input.clone();
        match tokio::task::spawn_blocking(move || chain.decide(&input)).await {
            Ok(d) => d,
            Err(e) => {
                let reason = format!("policy error: evaluation failed: {e}");
                Decision::new(&fallback, false, vec![reason], LimitCaps::default(), &self.digest)
            }
        }
    }

    /// Ask every evaluator and combine their answers. Never fails: every
    /// error becomes a denial that says what went wrong.
    pub fn decide(&self, input: &PolicyInput) -> Decision {
        if self.evaluators.is_empty() {
            let reason = "no policy evaluator is configured (enable policy.builtin or add [[policy.evaluators]])";
            return Decision::new(input, false, vec![reason.into()], LimitCaps::default(), &self.digest);
        }
        let mut errors = Vec::new();
        let mut allows = 0;
        let mut reasons: Vec<String> = Vec::new();
        let mut caps = LimitCaps::default();
        for e in &self.evaluators {
            match e.evaluate(input) {
                Ok(v) if v.allow && v.deny_reasons.is_empty() => {
                    allows += 1;
                    caps = caps.min(&v.limits);
                }
                Ok(v) => {
                    caps = caps.min(&v.limits);
                    if v.deny_reasons.is_empty() {
                        reasons.push(format!("no rule of policy {} allows this request", e.name()));
                    }
                    reasons.extend(v.deny_reasons);
                }
                Err(err) => errors.push(format!("policy error: {err}")),
            }
        }
        let allowed = errors.is_empty()
            && match self.mode {
                PolicyMode::All => allows == self.evaluators.len(),
                PolicyMode::Any => allows > 0,
            };
        if allowed {
            return Decision::new(input, true, Vec::new(), caps, &self.digest);
        }
        errors.extend(reasons);
        let mut seen = std::collections::HashSet::new();
        errors.retain(|r| seen.insert(r.clone()));
        Decision::new(input, false, errors, caps, &self.digest)
    }
}

#[cfg(test)]
mod tests;
