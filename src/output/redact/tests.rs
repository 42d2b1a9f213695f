use super::*;

const GHP: &str = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
const PAT: &str = "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456";
const AWS_ID: &str = "AKIAIOSFODNN7EXAMPLE";
const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
const PEM: &str = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAxx\nyyyy==\n-----END RSA PRIVATE KEY-----";

fn redact(r: &Redactor, s: &str) -> String {
    String::from_utf8(r.redact_all(s.as_bytes()).0).unwrap()
}

fn sample() -> String {
    format!(
        "start {AWS_ID} a\ntoken={GHP}\n{PAT} x\naws_secret_access_key = {AWS_SECRET}\n{PEM}\n\
         db password hunter2-xyz here\n{{\"SecretAccessKey\": \"{AWS_SECRET}\"}}\nend\n"
    )
}

fn expected() -> &'static str {
    "start [REDACTED] a\ntoken=[REDACTED]\n[REDACTED] x\naws_secret_access_key = [REDACTED]\n[REDACTED]\n\
     db password [REDACTED] here\n{\"SecretAccessKey\": \"[REDACTED]\"}\nend\n"
}

#[test]
fn token_shapes_and_listed_values_are_redacted() {
    let r = Redactor::new(["hunter2-xyz"]);
    let (out, n) = r.redact_all(sample().as_bytes());
    assert_eq!(String::from_utf8(out).unwrap(), expected());
    assert_eq!(n, 7);
}

#[test]
fn look_alikes_are_left_alone() {
    let r = Redactor::new(["abc", "hunter2-xyz"]);
    for s in [
        "AKIAIOSFODNN7EXAMPLEX",               // too long for an access key id
        "xAKIAIOSFODNN7EXAMPLE",               // not at a word start
        "AKIAshort",                           // too short
        "ghp_tooShort",                        // too short for a token
        "-----BEGIN CERTIFICATE-----",         // not a private key
        "aws_secret_access_key is documented", // no value
        "abc abc",                             // listed, but below MIN_SECRET_LEN
        "hunter2-xy",                          // a prefix of a listed value
    ] {
        assert_eq!(redact(&r, s), s);
    }
}

#[test]
fn secrets_split_across_reads_are_caught() {
    let r = Redactor::new(["hunter2-xyz"]);
    let input = sample();
    let input = input.as_bytes();
    for cut in 0..=input.len() {
        let mut s = r.stream();
        let mut out = Vec::new();
        s.push(&input[..cut], &mut out);
        s.push(&input[cut..], &mut out);
        s.finish(&mut out);
        assert_eq!(String::from_utf8_lossy(&out), expected(), "split at {cut}");
    }
    // One byte per read, the worst case.
    let mut s = r.stream();
    let mut out = Vec::new();
    for b in input {
        s.push(std::slice::from_ref(b), &mut out);
    }
    s.finish(&mut out);
    assert_eq!(String::from_utf8_lossy(&out), expected());
}

#[test]
fn clean_output_passes_through_and_is_not_held_back() {
    let r = Redactor::new(std::iter::empty::<&str>());
    let mut s = r.stream();
    let mut out = Vec::new();
    s.push(b"line one\nline two\n", &mut out);
    assert_eq!(out, b"line one\nline two\n");
    // A tail that could start an anchor waits for the next read, no more.
    s.push(b"then gh", &mut out);
    assert_eq!(out, b"line one\nline two\nthen ");
    s.push(b"ost\n", &mut out);
    s.finish(&mut out);
    assert_eq!(out, b"line one\nline two\nthen ghost\n");
}

#[test]
fn the_carry_stays_bounded() {
    let r = Redactor::new(std::iter::empty::<&str>());
    let mut s = r.stream();
    let mut out = Vec::new();
    s.push(b"ghp_", &mut out);
    for _ in 0..1000 {
        s.push(&[b'a'; 1000], &mut out);
        assert!(s.carry.len() <= MAX_TOKEN + 1000);
    }
    s.finish(&mut out);
    assert!(out.starts_with(REDACTED));
    assert_eq!(out.len(), REDACTED.len() + 4 + 1_000_000 - MAX_TOKEN);

    // A key block that never ends is hidden up to 64 KiB, then output resumes.
    let mut s = r.stream();
    let mut out = Vec::new();
    s.push(b"-----BEGIN PRIVATE KEY-----\n", &mut out);
    for _ in 0..200 {
        s.push(&[b'k'; 1000], &mut out);
        assert!(s.carry.len() <= MAX_PEM + 1000);
    }
    s.finish(&mut out);
    assert!(out.starts_with(REDACTED));
    assert_eq!(out.len(), REDACTED.len() + 28 + 200_000 - MAX_PEM);
}

#[test]
fn unterminated_key_at_the_end_is_hidden() {
    let r = Redactor::new(std::iter::empty::<&str>());
    assert_eq!(redact(&r, "a\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE"), "a\n[REDACTED]");
    assert_eq!(
        redact(&r, "-----BEGIN PGP PRIVATE KEY BLOCK-----\nx\n-----END PGP PRIVATE KEY BLOCK-----\nok"),
        "[REDACTED]\nok"
    );
}

#[test]
fn many_listed_values_still_work() {
    let values: Vec<String> = (0..300).map(|i| format!("secret-value-{i:04}")).collect();
    let r = Redactor::new(&values);
    assert_eq!(redact(&r, "x secret-value-0299 y secret-value-0007"), "x [REDACTED] y [REDACTED]");
}

#[test]
fn secret_names_are_recognised_case_insensitively() {
    for name in [
        "GITHUB_TOKEN",
        "api_key",
        "DbPassword",
        "AWS_SECRET_ACCESS_KEY",
        "npm_auth",
        "GH_PAT",
        "DB_PWD",
        "MY_CREDENTIALS",
        "SESSION_COOKIE",
        "SMTP_PASS",
    ] {
        assert!(secret_name(name), "{name}");
    }
    for name in ["PATH", "HOME", "GIT_AUTHOR_NAME", "LANG", "PWD", "RUST_LOG", "PASSES", "COMPILER"] {
        assert!(!secret_name(name), "{name}");
    }
}
