//! The gate in front of the streamable HTTP endpoint: body size (413),
//! Host and Origin against an allowlist (403, against DNS rebinding), and
//! the bearer token (401). Pure checks over headers, so they are tested
//! without a socket.
//!
//! Rules (why in brackets):
//! - Host: an IP literal passes when it is loopback or the bind address, or
//!   any IP when bound to 0.0.0.0/:: [a rebinding attack needs a DNS name
//!   it controls; an IP literal can't be rebound]; a name passes when it is
//!   `localhost` or the host of an `--allow-origin` value.
//! - Origin (only browsers send it): absent passes; otherwise it must be an
//!   `--allow-origin` value, or http(s) on a loopback host or the bind
//!   address, any port [local tools such as the MCP Inspector]. `null` is
//!   refused unless allowed explicitly.
//! - Token: `Authorization: Bearer <token>` is required on every request
//!   (unless the server was started `--no-token` on loopback), compared in
//!   constant time with every accepted token's digest; the token that
//!   matched names the [`Caller`] the request is served as. The header is
//!   read as RFC 6750 §2.1 writes it: the scheme `Bearer` in any case
//!   (RFC 7235 §2.1), one or more spaces, a `b64token`, nothing after it
//!   (blanks around the whole value are the header's, RFC 7230 §3.2.4). So
//!   `bearer  tok` is accepted; `Bearer\ttok`, `Bearer tok x`, `Bearertok`
//!   and `Basic tok` are not.

use super::access::{Caller, RepoScope, ANONYMOUS};
use super::token::{digest, is_b64token, Credential};
use axum::http::{header, HeaderMap, StatusCode};
use std::net::{IpAddr, SocketAddr};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// A refused request: status and one line of explanation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRefusal {
    pub status: StatusCode,
    pub reason: String,
}

/// Who may use a listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// These tokens (at least one).
    Tokens(Vec<Credential>),
    /// Anyone who can connect (`--no-token`, loopback only).
    Open,
}

/// Why a listener's options can't work: each says what to pass instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    #[error("no bearer token to check requests against")]
    NoToken,
    #[error(
        "binding to {0} (not loopback) requires a bearer token: drop --no-token (one is then \
         generated), or pass --token-file FILE"
    )]
    PublicWithoutToken(SocketAddr),
    #[error("--allow-origin '{0}' is not an origin: use scheme://host[:port], e.g. https://app.example.com")]
    NotAnOrigin(String),
}

/// The allowlists and tokens of one HTTP listener.
#[derive(Debug, Clone)]
pub struct Guard {
    bind: IpAddr,
    /// Normalised `--allow-origin` values (`scheme://host[:port]` or `null`).
    origins: Vec<String>,
    /// Host names allowed besides `localhost` (from the allowed origins).
    names: Vec<String>,
    auth: Auth,
}

impl Guard {
    /// Check the allowlist values (an origin must be `scheme://host[:port]`,
    /// no path, or `null`) and the tokens: a listener without any is only
    /// allowed on loopback.
    pub fn new(bind: SocketAddr, allow_origins: &[String], auth: Auth) -> Result<Guard, GuardError> {
        match &auth {
            Auth::Tokens(t) if t.is_empty() => return Err(GuardError::NoToken),
            Auth::Open if !bind.ip().is_loopback() => return Err(GuardError::PublicWithoutToken(bind)),
            _ => {}
        }
        let mut origins = Vec::new();
        let mut names = Vec::new();
        for o in allow_origins {
            let norm = o.trim().trim_end_matches('/').to_ascii_lowercase();
            if norm == "null" {
                origins.push(norm);
                continue;
            }
            let Some((_, host, _)) = split_origin(&norm) else {
                return Err(GuardError::NotAnOrigin(o.clone()));
            };
            names.push(host.to_string());
            origins.push(norm);
        }
        Ok(Guard { bind: bind.ip(), origins, names, auth })
    }

    /// Whether a token is required.
    pub fn requires_token(&self) -> bool {
        matches!(self.auth, Auth::Tokens(_))
    }

    /// Check one request's headers (and its authority, for HTTP/2); the
    /// caller it is served as.
    pub fn check(&self, headers: &HeaderMap, authority: Option<&str>) -> Result<Caller, GateRefusal> {
        let refuse = |status, reason: String| Err(GateRefusal { status, reason });
        if let Some(len) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok()) {
            if len > MAX_BODY_BYTES as u64 {
                return refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("request body over {MAX_BODY_BYTES} bytes"));
            }
        }
        let host = authority.or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()));
        match host {
            Some(h) if self.host_allowed(h) => {}
            Some(h) => return refuse(StatusCode::FORBIDDEN, format!("Host '{}' is not allowed", clip(h))),
            None => return refuse(StatusCode::FORBIDDEN, "missing Host header".into()),
        }
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("");
            if !self.origin_allowed(origin) {
                let reason = format!("Origin '{}' is not allowed (allow it with --allow-origin)", clip(origin));
                return refuse(StatusCode::FORBIDDEN, reason);
            }
        }
        let tokens = match &self.auth {
            Auth::Open => return Ok(Caller { principal: ANONYMOUS.into(), session: None, repos: RepoScope::All }),
            Auth::Tokens(tokens) => tokens,
        };
        let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).map(digest);
        let Some(given) = given else {
            return refuse(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into());
        };
        // Every digest is compared, so the time taken says nothing of
        // which one (if any) matched.
        let mut matched = None;
        for t in tokens {
            if ct_eq(&given, &t.digest) {
                matched = Some(t);
            }
        }
        match matched {
            Some(t) => Ok(Caller { principal: t.principal.clone(), session: None, repos: t.repos.clone() }),
            None => refuse(StatusCode::UNAUTHORIZED, "missing or wrong bearer token".into()),
        }
    }

    fn host_allowed(&self, authority: &str) -> bool {
        let host = strip_port(authority).to_ascii_lowercase();
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || ip == self.bind || self.bind.is_unspecified(),
            Err(_) => host == "localhost" || self.names.contains(&host),
        }
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        let norm = origin.trim().trim_end_matches('/').to_ascii_lowercase();
        if self.origins.contains(&norm) {
            return true;
        }
        let Some((scheme, host, _)) = split_origin(&norm) else { return false };
        if scheme != "http" && scheme != "https" {
            return false;
        }
        match host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            Ok(ip) => ip.is_loopback() || (ip == self.bind && !self.bind.is_unspecified()),
            Err(_) => host == "localhost",
        }
    }
}

/// `scheme://host[:port]` into its parts; `None` for anything with a path,
/// query, user info, or no host.
fn split_origin(origin: &str) -> Option<(&str, &str, Option<&str>)> {
    let (scheme, rest) = origin.split_once("://")?;
    if scheme.is_empty() || rest.is_empty() || rest.contains(['/', '?', '#', '@']) {
        return None;
    }
    let host = strip_port(rest);
    let port = rest[host.len()..].strip_prefix(':');
    if host.is_empty() || port.is_some_and(|p| p.parse::<u16>().is_err()) {
        return None;
    }
    Some((scheme, host, port))
}

/// The host part of `host[:port]`, keeping IPv6 brackets.
fn strip_port(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => &authority[..=end],
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address.
        Some((h, _)) if !h.contains(':') => h,
        _ => authority,
    }
}

/// The token of an `Authorization` value, as RFC 6750 §2.1 writes it
/// (this module's doc says what is accepted).
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_matches([' ', '\t']).split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(' ');
    is_b64token(token).then_some(token)
}

/// Equality that takes the same time wherever the first difference is.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

#[cfg(test)]
mod tests;
