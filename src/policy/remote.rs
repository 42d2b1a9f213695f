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
mod tests {
    use super::*;
    use crate::config::{LimitRequest, LimitsConfig};
    use crate::policy::input::ExecRequest;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    fn input() -> PolicyInput {
        let r = ExecRequest { runtime: "python".into(), code: Some("print(1)".into()), ..ExecRequest::default() };
        r.to_input("python3", LimitsConfig::default().resolve(&LimitRequest::default()))
    }

    /// A one-connection fake OPA on 127.0.0.1: answers `status` and `body`,
    /// hands back the request it got.
    fn fake_opa(status: u16, body: &'static str, delay: Duration) -> (String, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let Ok((mut sock, _)) = listener.accept() else { return };
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let n = sock.read(&mut chunk).unwrap_or(0);
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some(head_end) = text.find("\r\n\r\n") {
                    let len = text[..head_end]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if buf.len() >= head_end + 4 + len || n == 0 {
                        break;
                    }
                } else if n == 0 {
                    break;
                }
            }
            let _ = tx.send(String::from_utf8_lossy(&buf).to_string());
            std::thread::sleep(delay);
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(reply.as_bytes());
        });
        (format!("http://{addr}"), rx)
    }

    #[test]
    fn posts_the_input_to_the_data_api_and_reads_the_verdict() {
        let (url, rx) = fake_opa(
            200,
            r#"{"result":{"allow":false,"deny_reasons":["network tools are not allowed"],"limits":{"timeoutMs":5}}}"#,
            Duration::ZERO,
        );
        let e = RemoteEvaluator::new(&url, "mcp.subprocess", Duration::from_secs(5));
        let v = e.evaluate(&input()).unwrap();
        assert!(!v.allow);
        assert_eq!(v.deny_reasons, ["network tools are not allowed"]);
        assert_eq!(v.limits.timeout_ms, Some(5));
        let request = rx.recv().unwrap();
        assert!(request.starts_with("POST /v1/data/mcp/subprocess HTTP/1.1"), "{request}");
        let body = &request[request.find("\r\n\r\n").unwrap() + 4..];
        let sent: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(sent["input"]["runtime"], "python");
        assert_eq!(sent["input"]["command"], "python3");
    }

    #[test]
    fn a_bare_boolean_result_is_the_allow_rule() {
        let (url, _rx) = fake_opa(200, r#"{"result":true}"#, Duration::ZERO);
        let v = RemoteEvaluator::new(&url, "confine/allow", Duration::from_secs(5)).evaluate(&input()).unwrap();
        assert!(v.allow);
    }

    #[test]
    fn undefined_non_200_and_garbage_are_errors() {
        let (url, _rx) = fake_opa(200, r#"{}"#, Duration::ZERO);
        let err = RemoteEvaluator::new(&url, "confine", Duration::from_secs(5)).evaluate(&input()).unwrap_err();
        assert!(err.to_string().contains("undefined"), "{err}");
        let (url, _rx) = fake_opa(500, r#"{"code":"internal_error"}"#, Duration::ZERO);
        let err = RemoteEvaluator::new(&url, "confine", Duration::from_secs(5)).evaluate(&input()).unwrap_err();
        assert!(err.to_string().contains("HTTP 500"), "{err}");
        let (url, _rx) = fake_opa(200, "not json", Duration::ZERO);
        let err = RemoteEvaluator::new(&url, "confine", Duration::from_secs(5)).evaluate(&input()).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
    }

    #[test]
    fn an_unreachable_server_is_an_error() {
        // Bind then drop: the port is closed, connections are refused.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let e = RemoteEvaluator::new(&format!("http://127.0.0.1:{port}"), "confine", Duration::from_secs(2));
        let err = e.evaluate(&input()).unwrap_err();
        assert!(matches!(err, PolicyError::Remote { .. }), "{err}");
        assert!(err.to_string().contains("cannot reach the OPA server"), "{err}");
        assert!(!err.to_string().contains("127.0.0.1"), "no server address in agent-facing text: {err}");
    }

    #[test]
    fn a_slow_server_times_out() {
        let (url, _rx) = fake_opa(200, r#"{"result":true}"#, Duration::from_millis(1500));
        let e = RemoteEvaluator::new(&url, "confine", Duration::from_millis(200));
        let started = std::time::Instant::now();
        let err = e.evaluate(&input()).unwrap_err();
        assert!(matches!(err, PolicyError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_millis(1400));
    }
}
