//! Secret redaction on a stream, before anything is stored or shown: the
//! values of environment variables the operator lists, the values the
//! caller passes to the job in variables named like secrets
//! ([`secret_name`]), AWS access keys (and secret keys after their usual
//! names), GitHub tokens, and PEM private key blocks become `[REDACTED]`.
//!
//! Output arrives in arbitrary pieces, so a secret may be split across two
//! reads. The stream holds back only what could still become a secret: a
//! tail that is the start of an anchor (`AKIA`, `ghp_`, a listed value …),
//! or a match that is not finished yet (a token whose end is not in sight,
//! a key block without its END line). That carry is bounded: a token run is
//! cut at 1 KiB, a key block at 64 KiB.
//!
//! All anchors are found in one pass (Teddy, SIMD; several GB/s), so
//! redaction costs little next to hashing and compression.

use aho_corasick::packed::{Config as PackedConfig, MatchKind as PackedKind, Searcher};
use aho_corasick::{AhoCorasick, MatchKind};
use std::sync::Arc;

/// What a secret becomes.
pub const REDACTED: &[u8] = b"[REDACTED]";
/// Listed values shorter than this are not redacted: they would blank out
/// ordinary words and numbers.
pub const MIN_SECRET_LEN: usize = 6;
const MAX_TOKEN: usize = 1024;

/// Parts of a variable name that mark its value as a secret, anywhere in
/// the name (`GITHUB_TOKEN`, `DBPASSWORD`, `AWS_SECRET_ACCESS_KEY`).
const SECRET_NAME_PARTS: &[&str] =
    &["TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "KEY", "PRIVATE", "COOKIE"];
/// Short ones that would match inside ordinary words (`AUTHOR`, `PATH`):
/// only as a whole word between `_`, `-` or `.` (`NPM_AUTH`, `GH_PAT`, `DB_PWD`).
const SECRET_NAME_WORDS: &[&str] = &["AUTH", "PAT", "PWD", "PASS"];

/// Whether an environment variable's name says its value is a secret
/// (case-insensitive). Errs on the side of redacting: a false positive
/// only hides a value of at least [`MIN_SECRET_LEN`] bytes from output.
/// `PWD` alone is the working directory, not a password.
pub fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if upper == "PWD" || upper == "OLDPWD" {
        return false;
    }
    SECRET_NAME_PARTS.iter().any(|p| upper.contains(p))
        || upper.split(['_', '-', '.']).any(|w| SECRET_NAME_WORDS.contains(&w))
}
const MAX_PEM: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `AKIA…`: 16 more of `[A-Z0-9]`.
    AwsKeyId,
    /// After `aws_secret_access_key` and the like, a separator, 40 base64 characters.
    AwsSecret,
    /// `ghp_…` and kin: at least 36 of `[A-Za-z0-9]`.
    GithubToken,
    /// `github_pat_…`: at least 22 of `[A-Za-z0-9_]`.
    GithubPat,
    /// `-----BEGIN … PRIVATE KEY-----` to its `-----END … -----`.
    PrivateKey,
    /// A listed value, as is.
    Literal,
}

const ANCHORS: &[(&str, Kind)] = &[
    ("AKIA", Kind::AwsKeyId),
    ("ASIA", Kind::AwsKeyId),
    ("ABIA", Kind::AwsKeyId),
    ("ACCA", Kind::AwsKeyId),
    ("aws_secret_access_key", Kind::AwsSecret),
    ("AWS_SECRET_ACCESS_KEY", Kind::AwsSecret),
    ("SecretAccessKey", Kind::AwsSecret),
    ("ghp_", Kind::GithubToken),
    ("gho_", Kind::GithubToken),
    ("ghu_", Kind::GithubToken),
    ("ghs_", Kind::GithubToken),
    ("ghr_", Kind::GithubToken),
    ("github_pat_", Kind::GithubPat),
    ("-----BEGIN ", Kind::PrivateKey),
];

enum Anchors {
    Packed(Searcher),
    Automaton(AhoCorasick),
}

struct Rules {
    anchors: Anchors,
    patterns: Vec<(Vec<u8>, Kind)>,
}

impl Rules {
    fn find(&self, hay: &[u8], from: usize) -> Option<(Kind, usize, usize)> {
        let (pid, start, end) = match &self.anchors {
            Anchors::Packed(s) => {
                let m = s.find_in(hay, aho_corasick::Span { start: from, end: hay.len() })?;
                (m.pattern().as_usize(), m.start(), m.end())
            }
            Anchors::Automaton(a) => {
                let m = a.find(aho_corasick::Input::new(hay).range(from..))?;
                (m.pattern().as_usize(), m.start(), m.end())
            }
        };
        Some((self.patterns[pid].1, start, end))
    }

    /// Length of the longest tail of `buf` that is a proper start of an anchor.
    fn pending_prefix(&self, buf: &[u8]) -> usize {
        let longest = self.patterns.iter().map(|(p, _)| p.len()).max().unwrap_or(1);
        (1..longest.min(buf.len() + 1))
            .rev()
            .find(|&k| self.patterns.iter().any(|(p, _)| p.len() > k && p.starts_with(&buf[buf.len() - k..])))
            .unwrap_or(0)
    }
}

/// The redaction rules, shared by the streams of all jobs.
#[derive(Clone)]
pub struct Redactor {
    rules: Arc<Rules>,
}

impl Redactor {
    /// Rules for the built-in token shapes plus these secret values.
    pub fn new<S: AsRef<str>>(secret_values: impl IntoIterator<Item = S>) -> Redactor {
        let mut literals: Vec<Vec<u8>> = secret_values
            .into_iter()
            .map(|v| v.as_ref().as_bytes().to_vec())
            .filter(|v| v.len() >= MIN_SECRET_LEN)
            .collect();
        // Longest first, so a value that contains another one wins.
        literals.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        literals.dedup();
        let mut patterns: Vec<(Vec<u8>, Kind)> = ANCHORS.iter().map(|(a, k)| (a.as_bytes().to_vec(), *k)).collect();
        patterns.extend(literals.into_iter().map(|l| (l, Kind::Literal)));
        let packed = PackedConfig::new()
            .match_kind(PackedKind::LeftmostFirst)
            .builder()
            .extend(patterns.iter().map(|(p, _)| p))
            .build();
        let anchors = match packed {
            Some(s) => Anchors::Packed(s),
            // No SIMD, or many values: the general automaton, slower but exact.
            None => {
                match AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(patterns.iter().map(|(p, _)| p))
                {
                    Ok(a) => Anchors::Automaton(a),
                    // Unreachable for a few thousand short patterns; keep the
                    // built-in shapes rather than none at all.
                    Err(_) => return Redactor::new(std::iter::empty::<&str>()),
                }
            }
        };
        Redactor { rules: Arc::new(Rules { anchors, patterns }) }
    }

    /// A fresh stream state (one per captured stream).
    pub fn stream(&self) -> RedactStream {
        RedactStream { rules: self.rules.clone(), carry: Vec::new(), scratch: Vec::new(), prev: None, redactions: 0 }
    }

    /// Redact a whole buffer; returns the text and the number of secrets.
    pub fn redact_all(&self, input: &[u8]) -> (Vec<u8>, u64) {
        let mut s = self.stream();
        let mut out = Vec::with_capacity(input.len());
        s.push(input, &mut out);
        s.finish(&mut out);
        (out, s.redactions)
    }
}

/// Redaction state of one stream.
pub struct RedactStream {
    rules: Arc<Rules>,
    carry: Vec<u8>,
    scratch: Vec<u8>,
    /// The last byte emitted, for the word boundary in front of a token.
    prev: Option<u8>,
    /// Secrets replaced so far.
    pub redactions: u64,
}

enum Verdict {
    No,
    Redact(usize, usize),
    NeedMore,
}

impl RedactStream {
    /// Redact `input` and append what is final to `out`.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.carry.is_empty() {
            let keep = self.process(input, false, out);
            self.carry.extend_from_slice(&input[keep..]);
        } else {
            let mut buf = std::mem::take(&mut self.scratch);
            buf.clear();
            buf.extend_from_slice(&self.carry);
            buf.extend_from_slice(input);
            let keep = self.process(&buf, false, out);
            self.carry.clear();
            self.carry.extend_from_slice(&buf[keep..]);
            self.scratch = buf;
        }
    }

    /// End of stream: flush the carry.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let carry = std::mem::take(&mut self.carry);
        self.process(&carry, true, out);
    }

    /// Emit what is final in `buf`; returns where the carry starts.
    fn process(&mut self, buf: &[u8], last: bool, out: &mut Vec<u8>) -> usize {
        let rules = self.rules.clone();
        let mut pos = 0;
        let mut from = 0;
        while let Some((kind, start, end)) = rules.find(buf, from) {
            let before = if start == 0 { self.prev } else { Some(buf[start - 1]) };
            match check(kind, buf, start, end, before, last) {
                Verdict::No => from = start + 1,
                Verdict::Redact(a, b) => {
                    out.extend_from_slice(&buf[pos..a]);
                    out.extend_from_slice(REDACTED);
                    self.prev = Some(b']');
                    self.redactions += 1;
                    pos = b;
                    from = b;
                }
                Verdict::NeedMore => return self.emit(buf, pos, start, out),
            }
        }
        let keep = if last { buf.len() } else { buf.len() - rules.pending_prefix(&buf[pos..]) };
        self.emit(buf, pos, keep, out)
    }

    fn emit(&mut self, buf: &[u8], from: usize, to: usize, out: &mut Vec<u8>) -> usize {
        if to > from {
            out.extend_from_slice(&buf[from..to]);
            self.prev = Some(buf[to - 1]);
        }
        to
    }
}

fn run(buf: &[u8], from: usize, ok: impl Fn(u8) -> bool) -> usize {
    buf[from..].iter().position(|&b| !ok(b)).map_or(buf.len(), |n| from + n)
}

/// Is there a secret of this kind at `start` (its anchor ends at `end`)?
fn check(kind: Kind, buf: &[u8], start: usize, end: usize, before: Option<u8>, last: bool) -> Verdict {
    let word = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_');
    // A run that reaches the end of what we have may go on in the next read.
    let open = |r: usize| r == buf.len() && !last;
    match kind {
        Kind::Literal => Verdict::Redact(start, end),
        Kind::AwsKeyId | Kind::GithubToken | Kind::GithubPat if word(before) => Verdict::No,
        Kind::AwsKeyId => {
            let r = run(buf, end, |b| b.is_ascii_uppercase() || b.is_ascii_digit());
            match r - end {
                _ if open(r) && r - end <= 16 => Verdict::NeedMore,
                16 if !word(buf.get(r).copied()) => Verdict::Redact(start, r),
                _ => Verdict::No,
            }
        }
        Kind::GithubToken | Kind::GithubPat => {
            let (min, underscore) = if kind == Kind::GithubPat { (22, true) } else { (36, false) };
            let r = run(buf, end, |b| b.is_ascii_alphanumeric() || (underscore && b == b'_'));
            if open(r) && r - start < MAX_TOKEN {
                Verdict::NeedMore
            } else if r - end >= min {
                Verdict::Redact(start, r.min(start + MAX_TOKEN))
            } else {
                Verdict::No
            }
        }
        Kind::AwsSecret => {
            let sep = run(buf, end, |b| matches!(b, b' ' | b'\t' | b'"' | b'\'' | b':' | b'='));
            let key = |b: u8| b.is_ascii_alphanumeric() || b == b'/' || b == b'+';
            let r = run(buf, sep, key);
            if open(r) && r - end < 8 + 41 {
                Verdict::NeedMore
            } else if sep - end <= 8 && buf[end..sep].iter().any(|&b| b == b'=' || b == b':') && r - sep == 40 {
                Verdict::Redact(sep, r)
            } else {
                Verdict::No
            }
        }
        Kind::PrivateKey => private_key(buf, start, end, last),
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

fn private_key(buf: &[u8], start: usize, end: usize, last: bool) -> Verdict {
    let label = run(buf, end, |b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b' ');
    if label - end > 48 {
        return Verdict::No;
    }
    if label + 5 > buf.len() {
        return if last { Verdict::No } else { Verdict::NeedMore };
    }
    let name = &buf[end..label];
    if !(name.ends_with(b"PRIVATE KEY") || name.ends_with(b"PRIVATE KEY BLOCK")) || &buf[label..label + 5] != b"-----" {
        return Verdict::No;
    }
    let body = label + 5;
    let limit = buf.len().min(start + MAX_PEM);
    if let Some(e) = find(&buf[body..limit], b"-----END ") {
        let tail = body + e + 9;
        if let Some(d) = find(&buf[tail..limit.min(tail + 64)], b"-----") {
            return Verdict::Redact(start, tail + d + 5);
        }
    }
    if !last && buf.len() < start + MAX_PEM {
        return Verdict::NeedMore;
    }
    // No END line within 64 KiB (or before the end): hide what we have.
    Verdict::Redact(start, limit)
}

#[cfg(test)]
mod tests;
