//! Output shaping for the fake service: head/tail summaries, keyword
//! excerpts, a digest. A simplified stand-in for `crate::output`, enough
//! for the MCP tests to see every response mode filled in.

use crate::mcp::types::{Excerpt, Stream};
use serde_json::{json, Value};
use std::collections::BTreeMap;

const MAX_LINE_CHARS: usize = 500;

/// A line as shown to a client: at most 500 characters, then `[truncated]`.
pub fn cap(line: &str) -> String {
    if line.chars().count() <= MAX_LINE_CHARS {
        return line.to_string();
    }
    let mut s: String = line.chars().take(MAX_LINE_CHARS).collect();
    s.push_str("[truncated]");
    s
}

fn lines(text: &str) -> Vec<&str> {
    text.lines().collect()
}

/// Head and tail of `text` within `max` lines; true when lines were left out.
pub fn head_tail(text: &str, max: usize) -> (String, bool) {
    let all = lines(text);
    if all.len() <= max {
        return (all.iter().map(|l| cap(l)).collect::<Vec<_>>().join("\n"), false);
    }
    let head = max / 2;
    let tail = max - head;
    let mut out: Vec<String> = all[..head].iter().map(|l| cap(l)).collect();
    out.push(format!("… {} lines omitted …", all.len() - max));
    out.extend(all[all.len() - tail..].iter().map(|l| cap(l)));
    (out.join("\n"), true)
}

/// The last `max` lines; true when lines were left out.
pub fn tail(text: &str, max: usize) -> (String, bool) {
    let all = lines(text);
    let from = all.len().saturating_sub(max);
    (all[from..].iter().map(|l| cap(l)).collect::<Vec<_>>().join("\n"), from > 0)
}

/// Windows of `context` lines around lines containing any term
/// (case-insensitive), merged when they touch; true when more than `max`.
pub fn excerpts(source: Stream, text: &str, terms: &[String], context: usize, max: usize) -> (Vec<Excerpt>, bool) {
    let all = lines(text);
    let terms: Vec<String> = terms.iter().map(|t| t.to_lowercase()).collect();
    let mut windows: Vec<(usize, usize)> = Vec::new();
    for (i, line) in all.iter().enumerate() {
        let lower = line.to_lowercase();
        if !terms.iter().any(|t| lower.contains(t.as_str())) {
            continue;
        }
        let (start, end) = (i.saturating_sub(context), (i + context).min(all.len() - 1));
        match windows.last_mut() {
            Some(last) if start <= last.1 + 1 => last.1 = end,
            _ => windows.push((start, end)),
        }
    }
    let more = windows.len() > max;
    windows.truncate(max);
    (windows.into_iter().map(|(s, e)| window(source, &all, s, e)).collect(), more)
}

/// Lines `start..=end` (1-based) as one excerpt, if any exist.
pub fn range(source: Stream, text: &str, start: u64, end: u64) -> Option<Excerpt> {
    let all = lines(text);
    let s = usize::try_from(start).ok()?.checked_sub(1)?;
    if s >= all.len() {
        return None;
    }
    let e = usize::try_from(end).unwrap_or(usize::MAX).saturating_sub(1).min(all.len() - 1);
    Some(window(source, &all, s, e))
}

fn window(source: Stream, all: &[&str], s: usize, e: usize) -> Excerpt {
    Excerpt {
        line_start: s as u64 + 1,
        line_end: e as u64 + 1,
        content: all[s..=e].iter().map(|l| cap(l)).collect::<Vec<_>>().join("\n"),
        source,
    }
}

/// Error and warning lines, deduplicated with counts, most frequent first.
pub fn digest(stdout: &str, stderr: &str) -> Value {
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    let mut warnings: BTreeMap<String, u64> = BTreeMap::new();
    for line in stdout.lines().chain(stderr.lines()) {
        let lower = line.to_lowercase();
        if lower.contains("error") || lower.contains("fail") || lower.contains("not found") {
            *errors.entry(cap(line.trim())).or_default() += 1;
        } else if lower.contains("warn") {
            *warnings.entry(cap(line.trim())).or_default() += 1;
        }
    }
    let top = |m: BTreeMap<String, u64>| {
        let mut v: Vec<(String, u64)> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.into_iter().take(20).map(|(line, count)| json!({"line": line, "count": count})).collect::<Vec<_>>()
    };
    json!({
        "stdoutLines": stdout.lines().count(),
        "stderrLines": stderr.lines().count(),
        "errors": top(errors),
        "warnings": top(warnings),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpts_merge_and_cap() {
        let text = (1..=20).map(|i| if i % 5 == 0 { format!("ERROR {i}") } else { format!("ok {i}") });
        let text = text.collect::<Vec<_>>().join("\n");
        let (ex, more) = excerpts(Stream::Stdout, &text, &["error".into()], 1, 10);
        assert!(!more);
        assert_eq!(ex.len(), 4);
        assert_eq!((ex[0].line_start, ex[0].line_end), (4, 6));
        assert_eq!(ex[0].content, "ok 4\nERROR 5\nok 6");
        // Windows that touch are merged.
        let (ex, _) = excerpts(Stream::Stdout, &text, &["error".into()], 2, 10);
        assert_eq!((ex.len(), ex[0].line_start, ex[0].line_end), (1, 3, 20));
        let (ex, more) = excerpts(Stream::Stdout, &text, &["error".into()], 0, 2);
        assert!(more);
        assert_eq!(ex.len(), 2);
        assert_eq!(range(Stream::Stdout, &text, 19, 99).unwrap().content, "ok 19\nERROR 20");
        assert!(range(Stream::Stdout, &text, 21, 22).is_none());
    }

    #[test]
    fn summaries() {
        let text = (1..=100).map(|i| i.to_string()).collect::<Vec<_>>().join("\n");
        let (s, cut) = head_tail(&text, 10);
        assert!(cut);
        assert!(s.starts_with("1\n2\n3\n4\n5\n… 90 lines omitted …\n96"));
        assert_eq!(tail(&text, 2), ("99\n100".to_string(), true));
        assert_eq!(cap(&"x".repeat(600)).len(), 500 + "[truncated]".len());
    }
}
