use super::*;
use axum::http::HeaderValue;

fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(k.clone(), HeaderValue::from_str(v).unwrap());
    }
    h
}

fn status(g: &Guard, pairs: &[(header::HeaderName, &str)]) -> u16 {
    match g.check(&headers(pairs), None) {
        Ok(_) => 200,
        Err(r) => r.status.as_u16(),
    }
}

fn loopback() -> Guard {
    Guard::new("127.0.0.1:8765".parse().unwrap(), &[], Auth::Open).unwrap()
}

fn tokens(list: &[&str]) -> Auth {
    Auth::Tokens(list.iter().map(|t| Credential::operator(t)).collect())
}

#[test]
fn loopback_hosts_pass_and_others_are_refused() {
    let g = loopback();
    for host in ["127.0.0.1:8765", "localhost:8765", "LOCALHOST", "[::1]:8765", "127.0.0.2"] {
        assert_eq!(status(&g, &[(header::HOST, host)]), 200, "{host}");
    }
    for host in ["evil.example", "evil.example:8765", "10.0.0.1:8765", "localhost.evil.example"] {
        assert_eq!(status(&g, &[(header::HOST, host)]), 403, "{host}");
    }
    assert_eq!(status(&g, &[]), 403);
}

#[test]
fn origins_are_checked() {
    let g = Guard::new("127.0.0.1:8765".parse().unwrap(), &["https://app.example.com/".into()], Auth::Open).unwrap();
    let ok = [None, Some("http://localhost:6274"), Some("http://127.0.0.1"), Some("https://APP.example.com")];
    for origin in ok {
        let mut h = vec![(header::HOST, "127.0.0.1:8765")];
        h.extend(origin.map(|o| (header::ORIGIN, o)));
        assert_eq!(status(&g, &h), 200, "{origin:?}");
    }
    for origin in ["http://evil.example", "null", "https://app.example.com:8443", "file://", "http://localhost.evil"] {
        assert_eq!(status(&g, &[(header::HOST, "127.0.0.1:8765"), (header::ORIGIN, origin)]), 403, "{origin}");
    }
    // Its host is accepted as a Host name too (a reverse proxy in front).
    assert_eq!(status(&g, &[(header::HOST, "app.example.com")]), 200);
    assert!(Guard::new("127.0.0.1:1".parse().unwrap(), &["app.example.com/x".into()], Auth::Open).is_err());
}

#[test]
fn token_is_required_when_configured() {
    let g = Guard::new("0.0.0.0:8765".parse().unwrap(), &[], tokens(&["s3cret"])).unwrap();
    assert!(g.requires_token());
    let host = (header::HOST, "192.0.2.7:8765");
    assert_eq!(status(&g, std::slice::from_ref(&host)), 401);
    assert_eq!(status(&g, &[host.clone(), (header::AUTHORIZATION, "Bearer wrong")]), 401);
    assert_eq!(status(&g, &[host.clone(), (header::AUTHORIZATION, "Basic s3cret")]), 401);
    assert_eq!(status(&g, &[host.clone(), (header::AUTHORIZATION, "bearer s3cret")]), 200);
    // Any IP literal is a fine Host on a wildcard bind; names still are not.
    assert_eq!(status(&g, &[(header::HOST, "evil.example"), (header::AUTHORIZATION, "Bearer s3cret")]), 403);
    // On a wildcard bind an IP-literal Origin is not trusted.
    let h = [host, (header::ORIGIN, "http://192.0.2.7:8765"), (header::AUTHORIZATION, "Bearer s3cret")];
    assert_eq!(status(&g, &h), 403);
}

#[test]
fn large_bodies_are_refused_early() {
    let g = loopback();
    let big = (MAX_BODY_BYTES + 1).to_string();
    assert_eq!(status(&g, &[(header::HOST, "localhost"), (header::CONTENT_LENGTH, &big)]), 413);
}

#[test]
fn ports_and_brackets() {
    assert_eq!(strip_port("[::1]:80"), "[::1]");
    assert_eq!(strip_port("::1"), "::1");
    assert_eq!(strip_port("a.b:1"), "a.b");
    assert_eq!(split_origin("http://a.b:99"), Some(("http", "a.b", Some("99"))));
    assert_eq!(split_origin("http://a.b:x"), None);
}

/// RFC 6750 §2.1: `credentials = "Bearer" 1*SP b64token`, the scheme in
/// any case (RFC 7235 §2.1).
#[test]
fn the_bearer_header_is_read_as_rfc_6750_writes_it() {
    for ok in ["Bearer tok", "bearer tok", "BEARER tok", "bearer  tok", "  Bearer tok  "] {
        assert_eq!(bearer(ok), Some("tok"), "{ok:?}");
    }
    assert_eq!(bearer("Bearer a+b/c=="), Some("a+b/c=="));
    for refused in ["Bearer", "Bearer ", "Bearertok", "Bearer\ttok", "Bearer tok extra", "Basic tok", "Bearer t\"k"] {
        assert_eq!(bearer(refused), None, "{refused:?}");
    }
}

#[test]
fn the_token_that_matched_names_the_caller() {
    let scoped =
        Credential { principal: "token:ci".into(), digest: digest("ci"), repos: RepoScope::from_list(&["web".into()]) };
    let auth = Auth::Tokens(vec![Credential::operator("op"), scoped]);
    let g = Guard::new("127.0.0.1:8765".parse().unwrap(), &[], auth).unwrap();
    let caller = |t: &str| g.check(&headers(&[(header::HOST, "localhost"), (header::AUTHORIZATION, t)]), None);
    assert_eq!(caller("Bearer op").unwrap().principal, "default");
    let ci = caller("bearer  ci").unwrap();
    assert_eq!((ci.principal.as_str(), ci.may_use("web"), ci.may_use("api")), ("token:ci", true, false));
    assert_eq!(caller("Bearer nope").unwrap_err().status, StatusCode::UNAUTHORIZED);
    // Without a token only on loopback; and a token list is never empty.
    let e = Guard::new("0.0.0.0:1".parse().unwrap(), &[], Auth::Open).unwrap_err();
    assert!(matches!(e, GuardError::PublicWithoutToken(_)) && e.to_string().contains("requires a bearer token"), "{e}");
    assert!(Guard::new("127.0.0.1:1".parse().unwrap(), &[], Auth::Tokens(vec![])).is_err());
    assert_eq!(loopback().check(&headers(&[(header::HOST, "localhost")]), None).unwrap().principal, "anonymous");
}
