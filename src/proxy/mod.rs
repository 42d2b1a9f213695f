//! The network allowlist (`--net allow:HOSTS`): a job whose network
//! namespace holds only `lo` reaches the hosts of its allowlist through a
//! proxy that runs in the supervisor.
//!
//! - [`allowlist`] parses and matches the entries;
//! - [`addr`] resolves names (the proxy does, never the job) and refuses
//!   the host's own and private addresses unless the list names them;
//! - [`tls`] reads a ClientHello's server name;
//! - [`serve`] is the proxy itself, on listening sockets the job's pid 1
//!   makes in the job's namespace and hands to the supervisor.

pub mod addr;
pub mod allowlist;
#[cfg(target_os = "linux")]
pub mod serve;
pub mod tls;

/// The variables a job with an allowlist gets, pointing at its proxy
/// (`port` on its own loopback). Every spelling tools read is set, and
/// `NO_PROXY` is empty: nothing goes around the proxy, and nothing could.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_lowercase(), url.clone()));
    }
    env.push(("NO_PROXY".into(), String::new()));
    env.push(("no_proxy".into(), String::new()));
    env
}

/// Whether `name` is one of the variables [`proxy_env`] sets (any case).
pub fn is_proxy_var(name: &str) -> bool {
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"].iter().any(|v| v.eq_ignore_ascii_case(name))
}

/// `s` cut to at most `max` bytes at a character's boundary, marked with
/// `…` when cut: for names a job chose, shown in messages.
pub fn clip_text(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
