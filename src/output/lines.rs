//! A stream seen as numbered lines (1-based), whether it is stored as a
//! chunked artifact ([`super::chunked::ArtifactLines`]) or only held inline
//! as a head and a tail ([`InlineLines`]). Rendering and queries work on
//! this view and never on raw storage.
//!
//! Also here: the search terms (matched case-insensitively, ASCII, as
//! substrings) and the collector that turns matching lines into a bounded
//! number of excerpt windows.

use super::{OutputError, StreamSummary};
use crate::store::artifacts::{StreamMeta, StreamName};
use aho_corasick::packed::{Config as PackedConfig, MatchKind as PackedKind, Searcher};
use aho_corasick::{AhoCorasick, MatchKind};
use memchr::memmem::Finder;

/// A line longer than this is seen through its first bytes (and shown with
/// `[truncated]`); queries still search all of it.
pub const LINE_VIEW_BYTES: usize = 16 << 10;
/// Search terms accepted, as in SDL-MCP's `queryTerms`.
pub const MAX_TERMS: usize = 10;
const MAX_TERM_BYTES: usize = 256;

/// One line: its number, its bytes (without the newline), and whether only
/// a prefix of it is here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub no: u64,
    pub text: Vec<u8>,
    pub cut: bool,
}

/// Search terms, lowercased.
pub struct Terms {
    lower: Vec<Vec<u8>>,
    finders: Vec<Finder<'static>>,
    any: Option<Searcher>,
    automaton: Option<AhoCorasick>,
    /// What was dropped or cut, for the response.
    pub notes: Vec<String>,
}

impl Terms {
    pub fn new<S: AsRef<str>>(raw: &[S]) -> Terms {
        let mut notes = Vec::new();
        let mut lower: Vec<Vec<u8>> = Vec::new();
        for t in raw {
            let mut t = t.as_ref().trim().to_ascii_lowercase().into_bytes();
            if t.len() > MAX_TERM_BYTES {
                notes.push(format!("a term was cut to its first {MAX_TERM_BYTES} bytes"));
                t.truncate(MAX_TERM_BYTES);
            }
            if !t.is_empty() && !lower.contains(&t) {
                lower.push(t);
            }
        }
        if lower.len() > MAX_TERMS {
            notes.push(format!("{} terms given; the first {MAX_TERMS} were used", lower.len()));
            lower.truncate(MAX_TERMS);
        }
        let finders = lower.iter().map(|t| Finder::new(t).into_owned()).collect();
        let (mut any, mut automaton) = (None, None);
        if !lower.is_empty() {
            any = PackedConfig::new().match_kind(PackedKind::LeftmostFirst).builder().extend(&lower).build();
            if any.is_none() {
                automaton = AhoCorasick::builder().match_kind(MatchKind::LeftmostFirst).build(&lower).ok();
            }
        }
        Terms { lower, finders, any, automaton, notes }
    }

    pub fn is_empty(&self) -> bool {
        self.lower.is_empty()
    }

    pub fn len(&self) -> usize {
        self.lower.len()
    }

    pub fn max_len(&self) -> usize {
        self.lower.iter().map(Vec::len).max().unwrap_or(0)
    }

    pub fn as_strings(&self) -> Vec<String> {
        self.lower.iter().map(|t| String::from_utf8_lossy(t).into_owned()).collect()
    }

    /// Start of the first hit of any term in `hay[from..]` (`hay` lowercased).
    pub fn find_any(&self, hay: &[u8], from: usize) -> Option<usize> {
        if let Some(s) = &self.any {
            return s.find_in(hay, aho_corasick::Span { start: from, end: hay.len() }).map(|m| m.start());
        }
        if let Some(a) = &self.automaton {
            return a.find(aho_corasick::Input::new(hay).range(from..)).map(|m| m.start());
        }
        self.finders.iter().filter_map(|f| f.find(&hay[from..])).min().map(|i| from + i)
    }

    /// Occurrences of each term in a lowercased line, added to `counts`.
    pub fn count(&self, lowered: &[u8], counts: &mut [u32]) {
        for (f, c) in self.finders.iter().zip(counts.iter_mut()) {
            *c += f.find_iter(lowered).count() as u32;
        }
    }
}

/// Matching lines, enough of them for `max_windows` excerpt windows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Matches {
    /// Matching line numbers, ascending.
    pub lines: Vec<u64>,
    /// All matching lines, including those past the kept windows.
    pub total: u64,
    /// There are more windows than were kept.
    pub more: bool,
}

/// Keeps the matching lines of the first `max_windows` windows (of `ctx`
/// lines around each match; windows that overlap or touch are one).
pub struct MatchCollector {
    gap: u64,
    max_windows: usize,
    windows: usize,
    m: Matches,
}

impl MatchCollector {
    pub fn new(ctx: u64, max_windows: usize) -> Self {
        MatchCollector { gap: 2 * ctx + 1, max_windows, windows: 0, m: Matches::default() }
    }

    /// Add a matching line (ascending; a repeat of the last one is ignored).
    pub fn push(&mut self, line: u64) {
        let last = self.m.lines.last().copied();
        if last == Some(line) {
            return;
        }
        self.m.total += 1;
        if self.m.more {
            return;
        }
        if last.is_none_or(|l| line > l + self.gap) {
            if self.windows == self.max_windows {
                self.m.more = true;
                return;
            }
            self.windows += 1;
        }
        self.m.lines.push(line);
    }

    /// Known from elsewhere: there are more windows than `max_windows`.
    pub fn mark_more(&mut self) {
        self.m.more = true;
    }

    pub fn finish(self) -> Matches {
        self.m
    }
}

/// A stream seen as lines.
pub trait LineSource: Sync {
    fn stream(&self) -> StreamName;
    fn meta(&self) -> &StreamMeta;
    /// The number of the last line.
    fn total_lines(&self) -> u64;
    /// False when some lines are not available (inline output with a gap).
    fn complete(&self) -> bool;
    /// Lines `first..=last` that are available, in order.
    fn lines(&self, first: u64, last: u64) -> Result<Vec<Line>, OutputError>;
    /// Every available line in order until `f` returns false.
    fn scan(&self, f: &mut dyn FnMut(&Line) -> bool) -> Result<(), OutputError>;
    /// Lines in `first..=last` matching any term.
    fn find(&self, terms: &Terms, first: u64, last: u64, ctx: u64, max_windows: usize) -> Result<Matches, OutputError>;
}

/// The inline head and tail of a stream that was not stored.
pub struct InlineLines<'a> {
    summary: &'a StreamSummary,
    lines: Vec<(u64, Vec<u8>, bool)>,
}

fn split(bytes: &[u8]) -> Vec<&[u8]> {
    let mut v: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    if bytes.last() == Some(&b'\n') || bytes.is_empty() {
        v.pop();
    }
    v
}

impl<'a> InlineLines<'a> {
    pub fn new(summary: &'a StreamSummary) -> Self {
        let own = |(i, l): (usize, &[u8])| (i as u64 + 1, l.to_vec(), false);
        if summary.gap_bytes == 0 {
            // Nothing is missing: head and tail are the whole output.
            let all = [&summary.head[..], &summary.tail[..]].concat();
            return InlineLines { summary, lines: split(&all).into_iter().enumerate().map(own).collect() };
        }
        let head = &summary.head[..];
        let mut lines: Vec<(u64, Vec<u8>, bool)> = split(head).into_iter().enumerate().map(own).collect();
        if head.last().is_some_and(|&b| b != b'\n') {
            if let Some(l) = lines.last_mut() {
                l.2 = true;
            }
        }
        // The tail starts anywhere in a line: drop up to its first newline,
        // and number the rest back from the last line.
        let tail = &summary.tail[..];
        let tail = memchr::memchr(b'\n', tail).map_or(&tail[tail.len()..], |i| &tail[i + 1..]);
        let tail_lines = split(tail);
        let first = (summary.meta.total_lines + 1).saturating_sub(tail_lines.len() as u64);
        let head_last = lines.last().map_or(0, |l| l.0);
        for (i, l) in tail_lines.into_iter().enumerate() {
            if first + i as u64 > head_last {
                lines.push((first + i as u64, l.to_vec(), false));
            }
        }
        InlineLines { summary, lines }
    }

    fn line(&self, i: usize) -> Line {
        let (no, text, cut) = &self.lines[i];
        let n = text.len().min(LINE_VIEW_BYTES);
        Line { no: *no, text: text[..n].to_vec(), cut: *cut || n < text.len() }
    }
}

impl LineSource for InlineLines<'_> {
    fn stream(&self) -> StreamName {
        self.summary.stream
    }
    fn meta(&self) -> &StreamMeta {
        &self.summary.meta
    }
    fn total_lines(&self) -> u64 {
        self.summary.meta.total_lines
    }
    fn complete(&self) -> bool {
        self.summary.gap_bytes == 0
    }
    fn lines(&self, first: u64, last: u64) -> Result<Vec<Line>, OutputError> {
        let from = self.lines.partition_point(|l| l.0 < first);
        let to = self.lines.partition_point(|l| l.0 <= last);
        Ok((from..to.max(from)).map(|i| self.line(i)).collect())
    }
    fn scan(&self, f: &mut dyn FnMut(&Line) -> bool) -> Result<(), OutputError> {
        for i in 0..self.lines.len() {
            if !f(&self.line(i)) {
                break;
            }
        }
        Ok(())
    }
    fn find(&self, terms: &Terms, first: u64, last: u64, ctx: u64, max_windows: usize) -> Result<Matches, OutputError> {
        let mut c = MatchCollector::new(ctx, max_windows);
        let mut lowered = Vec::new();
        for (no, text, _) in self.lines.iter().filter(|l| l.0 >= first && l.0 <= last) {
            lowered.clear();
            lowered.extend(text.iter().map(u8::to_ascii_lowercase));
            if terms.find_any(&lowered, 0).is_some() {
                c.push(*no);
            }
        }
        Ok(c.finish())
    }
}
