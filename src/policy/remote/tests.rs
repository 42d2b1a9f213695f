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
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
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
