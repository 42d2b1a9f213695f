//! The remote evaluator: an OPA server queried over its REST data API,
//! `POST <url>/v1/data/<policy_path>` with `{"input": …}`.
//!
//! This is how a fleet shares one central policy. It owns nothing but the
//! HTTP exchange: a bounded request with a hard timeout, a bounded answer.
//! Unreachable, slow, non-200 or undefined all become errors, and so denials.

use super::input::sha256_hex;
use super::{PolicyError, PolicyEvaluator, Verdict};
use crate::policy::input::PolicyInput;
use std::time::Duration;

/// The OPA path queried when `policy_path` is not set.
pub const DEFAULT_POLICY_PATH: &str = "confine";

/// Largest answer read from the server.
const MAX_RESPONSE_BYTES: u64 = 1 << 20;

/// A policy decided by an OPA server.
pub struct RemoteEvaluator {
    name: String,
    endpoint: String,
    digest: String,
    timeout: Duration,
    agent: ureq::Agent,
}

impl RemoteEvaluator {
    /// `url` is the server's base URL (`http://opa:8181`); `policy_path` is
    /// `confine` or `mcp/subprocess` (dots are accepted for slashes).
    pub fn new(url: &str, policy_path: &str, timeout: Duration) -> RemoteEvaluator {
        let path = policy_path.trim_matches('/').replace('.', "/");
        let endpoint = format!("{}/v1/data/{path}", url.trim_end_matches('/'));
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .tls_config(tls_config())
            .build()
            .into();
        RemoteEvaluator {
            name: format!("opa {path}"),
            digest: sha256_hex(format!("opa {endpoint}").as_bytes()),
            endpoint,
            timeout,
            agent,
        }
    }

    /// The URL that is POSTed to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn err(&self, message: impl Into<String>) -> PolicyError {
        PolicyError::Remote { evaluator: self.name.clone(), message: message.into() }
    }
}

/// rustls where it builds (Linux and other unixes); the system TLS on macOS
/// and Windows (see Cargo.toml: ring's C code needs a cross compiler there).
fn tls_config() -> ureq::tls::TlsConfig {
    #[cfg(any(target_os = "macos", windows))]
    let provider = ureq::tls::TlsProvider::NativeTls;
    #[cfg(not(any(target_os = "macos", windows)))]
    let provider = ureq::tls::TlsProvider::Rustls;
    ureq::tls::TlsConfig::builder().provider(provider).build()
}

impl PolicyEvaluator for RemoteEvaluator {
    fn name(&self) -> &str {
        &self.name
    }

    fn digest(&self) -> &str {
        &self.digest
    }

    fn evaluate(&self, input: &PolicyInput) -> Result<Verdict, PolicyError> {
        let body = format!("{{\"input\":{}}}", input.canonical());
        let response = self
            .agent
            .post(&self.endpoint)
            .header("content-type", "application/json")
            .send(body.as_str())
            .map_err(|e| match e {
            ureq::Error::Timeout(_) => PolicyError::Timeout { evaluator: self.name.clone(), after: self.timeout },
            other => {
                tracing::warn!(endpoint = %self.endpoint, error = %other, "remote policy unreachable");
                self.err(format!("cannot reach the OPA server: {other}"))
            }
        })?;
        let status = response.status().as_u16();
        let text =
            response.into_body().with_config().limit(MAX_RESPONSE_BYTES).read_to_string().map_err(|e| match e {
                ureq::Error::Timeout(_) => PolicyError::Timeout { evaluator: self.name.clone(), after: self.timeout },
                other => self.err(format!("reading the answer: {other}")),
            })?;
        read_answer(&self.name, status, &text)
    }
}

/// The verdict in an OPA server's answer (HTTP `status`, body `text`) to
/// `evaluator`'s query. Whatever the server sent, garbage included, is a
/// verdict or an error that says what was wrong, never a panic.
pub fn read_answer(evaluator: &str, status: u16, text: &str) -> Result<Verdict, PolicyError> {
    let err = |message: String| PolicyError::Remote { evaluator: evaluator.to_string(), message };
    if status != 200 {
        let snippet: String = text.chars().take(200).collect();
        return Err(err(format!("the OPA server answered HTTP {status}: {snippet}")));
    }
    let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| err(format!("the answer is not JSON: {e}")))?;
    match doc.get("result") {
        Some(result) => Verdict::from_json(evaluator, result),
        None => Err(err("the policy path is undefined on the server (check policy_path)".into())),
    }
}

#[cfg(test)]
mod tests;
