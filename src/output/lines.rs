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
///
/// The line index is built on first use (a `minimal` response never needs
/// it) and holds two `u32` offsets a line into `summary`'s own buffers: a
/// head and a tail of `y\n` are half a million lines each, and a `Vec` a
/// line made a `confine exec` of `yes` peak at 57 MiB.
pub struct InlineLines<'a> {
    summary: &'a StreamSummary,
    index: std::sync::OnceLock<LineIndex>,
}

/// Where the lines of a head and a tail are.
struct LineIndex {
    /// Head and tail joined, when nothing is missing and a line straddles
    /// them (rare; inline output is at most a MiB); `head` indexes it.
    joined: Option<Vec<u8>>,
    /// Lines of the head: `(start, end)` in `summary.head`, numbered from 1.
    head: Vec<(u32, u32)>,
    /// Whether the head's last line is cut short (it goes on in the gap).
    head_cut: bool,
    /// Lines of the tail: `(start, end)` in `summary.tail`, numbered from
    /// `tail_first` (lines the head already holds are left out).
    tail: Vec<(u32, u32)>,
    tail_first: u64,
}

/// The `(start, end)` of each line of `bytes` (ends exclude the newline),
/// from `from` on; a last line without a newline counts.
fn spans(bytes: &[u8], from: usize) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    let mut start = from;
    for nl in memchr::memchr_iter(b'\n', &bytes[from..]) {
        v.push((start as u32, (from + nl) as u32));
        start = from + nl + 1;
    }
    if start < bytes.len() {
        v.push((start as u32, bytes.len() as u32));
    }
    v
}

impl<'a> InlineLines<'a> {
    pub fn new(summary: &'a StreamSummary) -> Self {
        InlineLines { summary, index: std::sync::OnceLock::new() }
    }

    fn index(&self) -> &LineIndex {
        self.index.get_or_init(|| {
            let (head, tail) = (&self.summary.head[..], &self.summary.tail[..]);
            let straddles = head.last().is_some_and(|&b| b != b'\n') && !tail.is_empty();
            if self.summary.gap_bytes == 0 {
                // Nothing is missing: head and tail are the whole output.
                if straddles {
                    let all = [head, tail].concat();
                    let spans = spans(&all, 0);
                    return LineIndex {
                        joined: Some(all),
                        head: spans,
                        head_cut: false,
                        tail: Vec::new(),
                        tail_first: 1,
                    };
                }
                let head = spans(head, 0);
                let tail_first = head.len() as u64 + 1;
                return LineIndex { joined: None, head, head_cut: false, tail: spans(tail, 0), tail_first };
            }
            let head_spans = spans(head, 0);
            let head_cut = head.last().is_some_and(|&b| b != b'\n');
            // The tail starts anywhere in a line: drop up to its first
            // newline, and number the rest back from the last line.
            let skip = memchr::memchr(b'\n', tail).map_or(tail.len(), |i| i + 1);
            let mut tail_spans = spans(tail, skip);
            let first = (self.summary.meta.total_lines + 1).saturating_sub(tail_spans.len() as u64);
            // Lines the head already holds are left out.
            let head_last = head_spans.len() as u64;
            let overlap = (head_last + 1).saturating_sub(first).min(tail_spans.len() as u64);
            tail_spans.drain(..overlap as usize);
            LineIndex { joined: None, head: head_spans, head_cut, tail: tail_spans, tail_first: first + overlap }
        })
    }

    /// Lines held.
    fn count(&self) -> usize {
        let x = self.index();
        x.head.len() + x.tail.len()
    }

    /// Line `i` of those held (0-based): its number, bytes, and whether it is cut.
    fn raw(&self, i: usize) -> (u64, &[u8], bool) {
        let x = self.index();
        if i < x.head.len() {
            let (a, b) = x.head[i];
            let bytes = x.joined.as_deref().unwrap_or(&self.summary.head);
            let cut = x.head_cut && i + 1 == x.head.len();
            return (self.number(i), &bytes[a as usize..b as usize], cut);
        }
        let (a, b) = x.tail[i - x.head.len()];
        (self.number(i), &self.summary.tail[a as usize..b as usize], false)
    }

    /// The number of line `i` (0-based) of those held.
    fn number(&self, i: usize) -> u64 {
        let x = self.index();
        if i < x.head.len() {
            i as u64 + 1
        } else {
            x.tail_first + (i - x.head.len()) as u64
        }
    }

    fn line(&self, i: usize) -> Line {
        let (no, text, cut) = self.raw(i);
        let n = text.len().min(LINE_VIEW_BYTES);
        Line { no, text: text[..n].to_vec(), cut: cut || n < text.len() }
    }

    /// The first index whose line number passes `pred` no more (numbers
    /// increase with the index).
    fn partition_point(&self, pred: impl Fn(u64) -> bool) -> usize {
        let (mut lo, mut hi) = (0, self.count());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if pred(self.number(mid)) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
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
        let from = self.partition_point(|no| no < first);
        let to = self.partition_point(|no| no <= last);
        Ok((from..to.max(from)).map(|i| self.line(i)).collect())
    }
    fn scan(&self, f: &mut dyn FnMut(&Line) -> bool) -> Result<(), OutputError> {
        for i in 0..self.count() {
            if !f(&self.line(i)) {
                break;
            }
        }
        Ok(())
    }
    fn find(&self, terms: &Terms, first: u64, last: u64, ctx: u64, max_windows: usize) -> Result<Matches, OutputError> {
        let mut c = MatchCollector::new(ctx, max_windows);
        let mut lowered = Vec::new();
        let from = self.partition_point(|no| no < first);
        let to = self.partition_point(|no| no <= last);
        for i in from..to.max(from) {
            let (no, text, _) = self.raw(i);
            lowered.clear();
            lowered.extend(text.iter().map(u8::to_ascii_lowercase));
            if terms.find_any(&lowered, 0).is_some() {
                c.push(no);
            }
        }
        Ok(c.finish())
    }
}
