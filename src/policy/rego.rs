//! The local evaluator: Rego policies run in-process by regorus.
//!
//! Policies are parsed and prepared once, at start (a malformed file is an
//! error naming the file and line); each evaluation runs on a clone of the
//! prepared engine, so evaluations never share state and may run in
//! parallel. regorus' execution timer caps every evaluation.

use super::input::{canonical_json, sha256_hex, PolicyInput};
use super::{PolicyError, PolicyEvaluator, Verdict, DEFAULT_REGO};
use crate::config::PolicyConfig;
use regorus::utils::limits::ExecutionTimerConfig;
use regorus::{Engine, Value};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The package a policy defines `allow`, `deny_reasons` and `limits` in.
pub const DEFAULT_PACKAGE: &str = "confine";

/// The rules that make up a policy's answer; only `allow` is required.
const ANSWER_RULES: [&str; 3] = ["allow", "deny_reasons", "limits"];

/// Work units between two clock reads of the execution timer.
const TIMER_CHECK_INTERVAL: u32 = 32;

/// The `data` document local policies see: `data.confine_config` holds
/// confine's own settings, `data.confine_data` the operator's `[policy.data]`.
pub fn policy_data(cfg: &PolicyConfig) -> serde_json::Value {
    let user = serde_json::to_value(&cfg.data).unwrap_or_default();
    serde_json::json!({
        "confine_config": {
            "allow_host_network": cfg.allow_host_network,
            "network_allowlisted": cfg.network_allowlisted,
        },
        "confine_data": user,
    })
}

/// Rego policies evaluated in-process.
pub struct RegoEvaluator {
    name: String,
    package: String,
    digest: String,
    timeout: Duration,
    /// Which of [`ANSWER_RULES`] the package declares.
    rules: Vec<&'static str>,
    engine: Engine,
}

impl RegoEvaluator {
    /// The built-in `policies/default.rego`.
    pub fn builtin(data: serde_json::Value, timeout: Duration) -> Result<RegoEvaluator, PolicyError> {
        let sources = vec![("policies/default.rego".to_string(), DEFAULT_REGO.to_string())];
        RegoEvaluator::from_sources("builtin default.rego", sources, DEFAULT_PACKAGE, data, timeout)
    }

    /// A .rego file, or every .rego file under a directory (sorted, recursive).
    pub fn from_path(
        path: &Path,
        package: &str,
        data: serde_json::Value,
        timeout: Duration,
    ) -> Result<RegoEvaluator, PolicyError> {
        let load_err = |p: &Path, message: String| PolicyError::Load { path: p.display().to_string(), message };
        let files = rego_files(path).map_err(|e| load_err(path, e.to_string()))?;
        if files.is_empty() {
            return Err(load_err(path, "no .rego file found".into()));
        }
        let mut sources = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|e| load_err(&f, e.to_string()))?;
            sources.push((f.display().to_string(), text));
        }
        let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        RegoEvaluator::from_sources(&format!("rego {file_name}"), sources, package, data, timeout)
    }

    /// Policies given as (file name, text) pairs.
    pub fn from_sources(
        name: &str,
        sources: Vec<(String, String)>,
        package: &str,
        data: serde_json::Value,
        timeout: Duration,
    ) -> Result<RegoEvaluator, PolicyError> {
        let mut engine = Engine::new();
        let mut hashed = format!("rego package={package}\n");
        for (file, text) in &sources {
            engine
                .add_policy(file.clone(), text.clone())
                .map_err(|e| PolicyError::Load { path: file.clone(), message: e.to_string().trim().to_string() })?;
            hashed.push_str(&format!("{file}\n{}\n", sha256_hex(text.as_bytes())));
        }
        let first = sources.first().map(|(f, _)| f.clone()).unwrap_or_default();
        let packages =
            engine.get_packages().map_err(|e| PolicyError::Load { path: first.clone(), message: e.to_string() })?;
        let wanted = format!("data.{package}");
        if !packages.contains(&wanted) {
            return Err(PolicyError::Load {
                path: first,
                message: format!("no file declares `package {package}` (found: {})", packages.join(", ")),
            });
        }
        let data_json = canonical_json(&data);
        hashed.push_str(&data_json);
        let data = Value::from_json_str(&data_json)
            .map_err(|e| PolicyError::Load { path: first.clone(), message: format!("policy data: {e}") })?;
        engine
            .add_data(data)
            .map_err(|e| PolicyError::Load { path: first.clone(), message: format!("policy data: {e}") })?;
        engine.set_execution_timer_config(ExecutionTimerConfig {
            limit: timeout,
            check_interval: NonZeroU32::new(TIMER_CHECK_INTERVAL).unwrap_or(NonZeroU32::MIN),
        });
        // Prepare once (type and reference checks happen here), so a policy
        // that can't be evaluated fails at start rather than on each request,
        // and learn which of the answer's rules the package declares.
        engine.set_input(Value::new_object());
        let mut rules = Vec::new();
        for rule in ANSWER_RULES {
            match engine.eval_rule(format!("data.{package}.{rule}")) {
                Ok(_) => rules.push(rule),
                Err(e) if e.to_string().contains("not a valid rule path") => {}
                Err(e) => return Err(PolicyError::Load { path: first, message: e.to_string() }),
            }
        }
        if !rules.contains(&"allow") {
            return Err(PolicyError::Load {
                path: first,
                message: format!("package {package} defines no 'allow' rule (add `default allow := false`)"),
            });
        }
        let evaluator = RegoEvaluator {
            name: name.to_string(),
            package: package.to_string(),
            digest: sha256_hex(hashed.as_bytes()),
            timeout,
            rules,
            engine,
        };
        Ok(evaluator)
    }

    /// Evaluate one rule of the package within what is left of the budget.
    fn rule(
        &self,
        engine: &mut Engine,
        rule: &str,
        started: Instant,
    ) -> Result<Option<serde_json::Value>, PolicyError> {
        let timeout = || PolicyError::Timeout { evaluator: self.name.clone(), after: self.timeout };
        let left = self.timeout.checked_sub(started.elapsed()).ok_or_else(timeout)?;
        engine.set_execution_timer_config(ExecutionTimerConfig {
            limit: left,
            check_interval: NonZeroU32::new(TIMER_CHECK_INTERVAL).unwrap_or(NonZeroU32::MIN),
        });
        let value = engine.eval_rule(format!("data.{}.{rule}", self.package)).map_err(|e| {
            if started.elapsed() >= self.timeout {
                timeout()
            } else {
                PolicyError::Eval { evaluator: self.name.clone(), message: first_line(&e.to_string()) }
            }
        })?;
        if value == Value::Undefined {
            return Ok(None);
        }
        serde_json::to_value(&value)
            .map(Some)
            .map_err(|e| PolicyError::Eval { evaluator: self.name.clone(), message: e.to_string() })
    }
}

impl std::fmt::Debug for RegoEvaluator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegoEvaluator")
            .field("name", &self.name)
            .field("package", &self.package)
            .finish_non_exhaustive()
    }
}

impl PolicyEvaluator for RegoEvaluator {
    fn name(&self) -> &str {
        &self.name
    }

    fn digest(&self) -> &str {
        &self.digest
    }

    fn evaluate(&self, input: &PolicyInput) -> Result<Verdict, PolicyError> {
        let mut engine = self.engine.clone();
        let value = Value::from_json_str(&input.canonical())
            .map_err(|e| PolicyError::Eval { evaluator: self.name.clone(), message: format!("input: {e}") })?;
        engine.set_input(value);
        let started = Instant::now();
        let mut answer = serde_json::Map::new();
        for rule in &self.rules {
            if let Some(v) = self.rule(&mut engine, rule, started)? {
                answer.insert(rule.to_string(), v);
            }
        }
        Verdict::from_json(&self.name, &serde_json::Value::Object(answer))
    }
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or(s).to_string()
}

/// `path` itself when it is a file, else the .rego files under it, sorted.
fn rego_files(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        std::fs::metadata(path)?;
        return Ok(vec![path.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let p = entry?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rego") && !p.to_string_lossy().ends_with("_test.rego") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests;
