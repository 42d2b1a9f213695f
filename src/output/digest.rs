//! Digest mode: one line of counts, then the lines that look like errors or
//! warnings, deduplicated with counts (`error[E0308]: mismatched types ×12`).
//!
//! Lines are grouped by a key that ignores indentation and numbers (line
//! numbers, durations, counts), but keeps numbers glued to a letter, so
//! `error[E0308]` and `error[E0599]` stay apart.

use super::lines::LineSource;
use super::{cap_line, OutputError};
use crate::store::artifacts::StreamName;
use aho_corasick::packed::{Config as PackedConfig, MatchKind as PackedKind, Searcher};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

const MAX_DISTINCT: usize = 5000;
const MAX_KEY_BYTES: usize = 300;
const ERROR_WORDS: &[&str] =
    &["error", "fail", "panic", "fatal", "exception", "traceback", "segmentation fault", "aborted", "denied"];
const WARNING_WORDS: &[&str] = &["warn"];

/// What digest mode returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Digest {
    /// e.g. `stdout 1204 lines 56.2 KiB; stderr 31 lines 2.1 KiB; 14 error lines (3 distinct), 5 warning lines (2 distinct)`
    pub counts: String,
    /// `source:line: text ×count`, errors first, each group in order of first appearance.
    pub lines: Vec<String>,
    pub error_lines: u64,
    pub warning_lines: u64,
    /// The word each distinct error and warning line was found by
    /// (`AssertionError`, `FAILED`, `error[E0308]`), errors first, at most
    /// 10: `runtime_query_output`'s queryTerms for their lines in context.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub terms: Vec<String>,
}

/// The most terms a digest offers (`runtime_query_output` takes 10).
const MAX_TERMS: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Severity {
    Error,
    Warning,
}

struct Group {
    severity: Severity,
    /// The word around the hit that classified the line.
    term: String,
    source: StreamName,
    first: u64,
    text: String,
    count: u64,
}

/// The word list as one searcher; `None` leaves the fallback (memmem).
fn searcher() -> Option<Searcher> {
    PackedConfig::new()
        .match_kind(PackedKind::LeftmostFirst)
        .builder()
        .extend(ERROR_WORDS.iter().chain(WARNING_WORDS))
        .build()
}

/// The severity of a lowercased line, and where its hits of that severity
/// start. A hit right after `0 ` or `no ` is a count of nothing (`0
/// failed`, `no errors`) and doesn't count.
fn classify(lower: &[u8], words: &Option<Searcher>) -> Option<(Severity, Vec<usize>)> {
    let mut best: Option<(Severity, Vec<usize>)> = None;
    let mut hits: Vec<(usize, usize)> = Vec::new();
    match words {
        Some(s) => hits.extend(s.find_iter(lower).map(|m| (m.start(), m.pattern().as_usize()))),
        None => {
            for (i, w) in ERROR_WORDS.iter().chain(WARNING_WORDS).enumerate() {
                hits.extend(memchr::memmem::find_iter(lower, w.as_bytes()).map(|at| (at, i)));
            }
        }
    }
    for (at, pattern) in hits {
        let before = &lower[..at];
        if before.ends_with(b"0 ") || before.ends_with(b"no ") {
            continue;
        }
        let sev = if pattern < ERROR_WORDS.len() { Severity::Error } else { Severity::Warning };
        match &mut best {
            Some((b, ats)) if *b == sev => ats.push(at),
            Some((b, _)) if *b < sev => {}
            _ => best = Some((sev, vec![at])),
        }
    }
    best
}

/// The word that tells the line's kind, among the words around its hits:
/// one in capitals (`FAIL`, `ERROR`) first, then one that ends with its
/// hit (`AssertionError`, `DeprecationWarning`), then the first; a name
/// that merely starts with one (`Failing`, `test_error_paths`) last.
fn term_of(text: &[u8], hits: &[usize]) -> String {
    let rank = |w: &str| {
        let letters = || w.chars().filter(char::is_ascii_alphabetic);
        if letters().count() > 1 && letters().all(|c| c.is_ascii_uppercase()) {
            0
        } else if ERROR_WORDS.iter().chain(WARNING_WORDS).any(|k| w.to_ascii_lowercase().ends_with(k)) {
            1
        } else {
            2
        }
    };
    let words: Vec<String> = hits.iter().map(|&at| word_at(text, at)).collect();
    words.iter().enumerate().min_by_key(|(i, w)| (rank(w), *i)).map(|(_, w)| w.clone()).unwrap_or_default()
}

/// The word of `text` around byte `at`: letters, digits, `_` and the
/// brackets of a code such as `error[E0308]`.
fn word_at(text: &[u8], at: usize) -> String {
    let inside = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'[' | b']');
    let at = at.min(text.len());
    let start = text[..at].iter().rposition(|&b| !inside(b)).map_or(0, |i| i + 1);
    let end = text[at..].iter().position(|&b| !inside(b)).map_or(text.len(), |i| at + i);
    String::from_utf8_lossy(&text[start..end]).into_owned()
}

/// Trimmed; digit runs not glued to a letter become `#`.
fn key(line: &[u8]) -> Vec<u8> {
    let t = line.trim_ascii();
    let mut k = Vec::with_capacity(t.len().min(MAX_KEY_BYTES));
    let mut glued = false;
    for &b in t {
        if k.len() >= MAX_KEY_BYTES {
            break;
        }
        if !b.is_ascii_digit() {
            glued = b.is_ascii_alphabetic();
            k.push(b);
        } else if glued {
            k.push(b);
        } else if k.last() != Some(&b'#') {
            k.push(b'#');
        }
    }
    k
}

/// Digest `sources`, keeping at most `max_lines` groups.
pub fn digest(sources: &[&dyn LineSource], max_lines: usize) -> Result<Digest, OutputError> {
    let words = searcher();
    let mut groups: Vec<Group> = Vec::new();
    let mut index: HashMap<Vec<u8>, usize> = HashMap::new();
    let (mut errors, mut warnings) = (0u64, 0u64);
    let mut lower = Vec::new();
    for src in sources {
        src.scan(&mut |l| {
            lower.clear();
            lower.extend(l.text.iter().map(u8::to_ascii_lowercase));
            let Some((severity, hits)) = classify(&lower, &words) else { return true };
            match severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
            let k = key(&l.text);
            if let Some(&g) = index.get(&k) {
                groups[g].count += 1;
            } else if groups.len() < MAX_DISTINCT {
                index.insert(k, groups.len());
                let text = cap_line(l.text.trim_ascii(), l.cut);
                let term = term_of(&l.text, &hits);
                groups.push(Group { severity, term, source: src.stream(), first: l.no, text, count: 1 });
            }
            true
        })?;
    }
    let distinct = |s: Severity| groups.iter().filter(|g| g.severity == s).count();
    let mut counts: Vec<String> = sources
        .iter()
        .map(|s| format!("{} {} lines {}", s.stream(), s.meta().total_lines, super::human_size(s.meta().total_bytes)))
        .collect();
    counts.push(format!(
        "{errors} error lines ({} distinct), {warnings} warning lines ({} distinct)",
        distinct(Severity::Error),
        distinct(Severity::Warning)
    ));
    groups.sort_by_key(|g| g.severity);
    let mut terms: Vec<String> = Vec::new();
    for g in &groups {
        if terms.len() < MAX_TERMS && !g.term.is_empty() && !terms.iter().any(|t| t.eq_ignore_ascii_case(&g.term)) {
            terms.push(g.term.clone());
        }
    }
    let lines = groups
        .iter()
        .take(max_lines)
        .map(|g| {
            let times = if g.count > 1 { format!(" ×{}", g.count) } else { String::new() };
            format!("{}:{}: {}{times}", g.source, g.first, g.text)
        })
        .collect();
    Ok(Digest { counts: counts.join("; "), lines, error_lines: errors, warning_lines: warnings, terms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::lines::InlineLines;
    use crate::output::StreamSummary;
    use crate::store::artifacts::StreamMeta;

    fn inline(stream: StreamName, text: &str) -> StreamSummary {
        StreamSummary {
            stream,
            meta: StreamMeta {
                total_lines: text.lines().count() as u64,
                total_bytes: text.len() as u64,
                ..Default::default()
            },
            head: text.as_bytes().to_vec(),
            tail: Vec::new(),
            gap_bytes: 0,
            error: None,
        }
    }

    #[test]
    fn errors_and_warnings_are_deduplicated_with_counts() {
        let mut err = String::new();
        for i in 0..12 {
            err.push_str(&format!("error[E0308]: mismatched types\n  --> src/lib.rs:{i}:5\n"));
        }
        err.push_str("error[E0599]: no method named `foo`\n");
        for i in 0..3 {
            err.push_str(&format!("warning: unused variable at line {}\n", 10 + i));
        }
        let out = "running 4 tests\ntest result: ok. 4 passed; 0 failed\nno errors found\nFAILED tests::b\n";
        let (o, e) = (inline(StreamName::Stdout, out), inline(StreamName::Stderr, &err));
        let (o, e) = (InlineLines::new(&o), InlineLines::new(&e));
        let d = digest(&[&o, &e], 100).unwrap();
        assert_eq!(
            d.lines,
            vec![
                "stdout:4: FAILED tests::b",
                "stderr:1: error[E0308]: mismatched types ×12",
                "stderr:25: error[E0599]: no method named `foo`",
                "stderr:26: warning: unused variable at line 10 ×3",
            ]
        );
        assert_eq!((d.error_lines, d.warning_lines), (14, 3));
        assert!(d.counts.starts_with("stdout 4 lines 84 B; stderr 28 lines 770 B; "), "{}", d.counts);
        assert!(d.counts.ends_with("14 error lines (3 distinct), 3 warning lines (1 distinct)"), "{}", d.counts);
        let d = digest(&[&o, &e], 2).unwrap();
        assert_eq!(d.lines.len(), 2);
    }

    #[test]
    fn keys_ignore_numbers_not_codes() {
        assert_eq!(key(b"  took 12ms at line 40"), b"took #ms at line #");
        assert_eq!(key(b"error[E0308]: x"), b"error[E0308]: x");
        assert_ne!(key(b"error[E0308]"), key(b"error[E0599]"));
    }
}
