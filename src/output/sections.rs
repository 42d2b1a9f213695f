//! Intent mode's sections: output is split into sections at blank lines,
//! separator rules, headings and test-runner markers (`FAIL`, `error[`,
//! `Traceback` …), at most 50 lines each; sections are ranked with BM25
//! against the query terms, and the best come back as titles and previews.
//!
//! One pass keeps only numbers (where a section is, its length, its term
//! counts); titles and previews of the winners are read afterwards, so
//! memory doesn't grow with the output.

use super::lines::{LineSource, Terms};
use super::{cap_line, OutputError};
use crate::store::artifacts::StreamName;
use serde::{Deserialize, Serialize};

const MAX_SECTION_LINES: u64 = 50;
const MAX_CANDIDATES: usize = 100_000;
const PREVIEW_LINES: usize = 3;
const K1: f64 = 1.2;
const B: f64 = 0.75;

/// Lines that open a new section.
const MARKERS: &[&str] = &[
    "FAIL",
    "PASS ",
    "ERROR",
    "error[",
    "error:",
    "Error:",
    "warning:",
    "Traceback",
    "Exception",
    "thread '",
    "panic:",
    "---- ",
    "--- FAIL",
    "=== RUN",
    "running ",
    "test result:",
    "# ",
    "## ",
    "### ",
    "==> ",
];

/// A ranked section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Section {
    /// Its first line.
    pub title: String,
    pub line_start: u64,
    pub line_end: u64,
    pub source: StreamName,
    /// BM25 score against the terms, rounded to 3 decimals.
    pub score: f64,
    /// Term occurrences in the section.
    pub hits: u32,
    /// Its first lines that hold a term (at most 3, title excluded).
    pub preview: Vec<String>,
}

struct Candidate {
    source: usize,
    start: u64,
    end: u64,
    len: u32,
    tf: Vec<u32>,
    hit_lines: Vec<u64>,
}

fn is_separator(t: &[u8]) -> bool {
    t.len() >= 3 && t.iter().all(|b| b"-=*_~#".contains(b))
}

fn is_marker(t: &[u8]) -> bool {
    MARKERS.iter().any(|m| t.starts_with(m.as_bytes()))
}

struct Splitter<'t> {
    terms: &'t Terms,
    cur: Option<Candidate>,
    candidates: Vec<Candidate>,
    sections: u64,
    total_len: u64,
    df: Vec<u64>,
    dropped: bool,
    lowered: Vec<u8>,
    counts: Vec<u32>,
}

impl Splitter<'_> {
    fn close(&mut self) {
        let Some(c) = self.cur.take() else { return };
        self.sections += 1;
        self.total_len += u64::from(c.len);
        for (df, &tf) in self.df.iter_mut().zip(&c.tf) {
            *df += u64::from(tf > 0);
        }
        if c.tf.iter().any(|&t| t > 0) {
            if self.candidates.len() < MAX_CANDIDATES {
                self.candidates.push(c);
            } else {
                self.dropped = true;
            }
        }
    }

    fn line(&mut self, source: usize, no: u64, text: &[u8]) {
        let t = text.trim_ascii();
        if t.is_empty() || is_separator(t) {
            return self.close();
        }
        if let Some(c) = &self.cur {
            if is_marker(t) || no != c.end + 1 || no - c.start >= MAX_SECTION_LINES {
                self.close();
            }
        }
        let n = self.terms.len();
        let c = self.cur.get_or_insert_with(|| Candidate {
            source,
            start: no,
            end: no,
            len: 0,
            tf: vec![0; n],
            hit_lines: Vec::new(),
        });
        c.end = no;
        c.len += t.split(u8::is_ascii_whitespace).filter(|w| !w.is_empty()).count() as u32;
        self.lowered.clear();
        self.lowered.extend(t.iter().map(u8::to_ascii_lowercase));
        self.counts.iter_mut().for_each(|x| *x = 0);
        self.terms.count(&self.lowered, &mut self.counts);
        if self.counts.iter().any(|&x| x > 0) {
            for (tf, x) in c.tf.iter_mut().zip(&self.counts) {
                *tf += x;
            }
            if c.hit_lines.len() < PREVIEW_LINES + 1 {
                c.hit_lines.push(no);
            }
        }
    }
}

/// The `top` sections of `sources` for `terms`, best first, and notes.
pub fn rank(
    sources: &[&dyn LineSource],
    terms: &Terms,
    top: usize,
) -> Result<(Vec<Section>, Vec<String>), OutputError> {
    let mut s = Splitter {
        terms,
        cur: None,
        candidates: Vec::new(),
        sections: 0,
        total_len: 0,
        df: vec![0; terms.len()],
        dropped: false,
        lowered: Vec::new(),
        counts: vec![0; terms.len()],
    };
    for (i, src) in sources.iter().enumerate() {
        src.scan(&mut |l| {
            s.line(i, l.no, &l.text);
            true
        })?;
        s.close();
    }
    let mut notes = Vec::new();
    if s.dropped {
        notes.push(format!("more than {MAX_CANDIDATES} sections matched; only the first were ranked"));
    }
    let n = s.sections as f64;
    let avg = (s.total_len as f64 / n.max(1.0)).max(1.0);
    let idf: Vec<f64> = s.df.iter().map(|&df| (1.0 + (n - df as f64 + 0.5) / (df as f64 + 0.5)).ln()).collect();
    let score = |c: &Candidate| -> f64 {
        let norm = K1 * (1.0 - B + B * f64::from(c.len) / avg);
        c.tf.iter().zip(&idf).map(|(&tf, idf)| idf * f64::from(tf) * (K1 + 1.0) / (f64::from(tf) + norm)).sum()
    };
    let mut ranked: Vec<(f64, Candidate)> = s.candidates.into_iter().map(|c| (score(&c), c)).collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1.source, a.1.start).cmp(&(b.1.source, b.1.start))));
    ranked.truncate(top);
    let mut out = Vec::new();
    for (score, c) in ranked {
        let src = sources[c.source];
        let title = src.lines(c.start, c.start)?.first().map_or_else(String::new, |l| cap_line(&l.text, l.cut));
        let mut preview = Vec::new();
        for &no in c.hit_lines.iter().filter(|&&no| no != c.start).take(PREVIEW_LINES) {
            preview.extend(src.lines(no, no)?.iter().map(|l| cap_line(&l.text, l.cut)));
        }
        out.push(Section {
            title,
            line_start: c.start,
            line_end: c.end,
            source: src.stream(),
            score: (score * 1000.0).round() / 1000.0,
            hits: c.tf.iter().sum(),
            preview,
        });
    }
    Ok((out, notes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::lines::InlineLines;
    use crate::output::StreamSummary;
    use crate::store::artifacts::StreamMeta;

    fn inline(text: &str) -> StreamSummary {
        StreamSummary {
            stream: StreamName::Stdout,
            meta: StreamMeta { total_lines: text.lines().count() as u64, ..Default::default() },
            head: text.as_bytes().to_vec(),
            tail: Vec::new(),
            gap_bytes: 0,
            error: None,
        }
    }

    #[test]
    fn bm25_ranks_dense_short_sections_first() {
        let filler = "some unrelated build chatter here\n".repeat(20);
        let text = format!(
            "timeout waiting for db\nretrying\ntimeout again\n\n{filler}one timeout in a long block\n\n\
             connection refused\ndb down\n\nnothing to see\n"
        );
        let s = inline(&text);
        let src = InlineLines::new(&s);
        let (sections, notes) = rank(&[&src], &Terms::new(&["timeout", "DB"]), 10).unwrap();
        assert!(notes.is_empty());
        let order: Vec<(&str, u64, u64)> =
            sections.iter().map(|s| (s.title.as_str(), s.line_start, s.line_end)).collect();
        assert_eq!(
            order,
            vec![
                ("timeout waiting for db", 1, 3),
                ("connection refused", 27, 28),
                ("some unrelated build chatter here", 5, 25),
            ]
        );
        assert!(sections[0].score > sections[1].score && sections[1].score > sections[2].score);
        assert_eq!(sections[0].hits, 3);
        assert_eq!(sections[0].preview, vec!["timeout again"]);
        assert_eq!(sections[1].preview, vec!["db down"]);
    }

    #[test]
    fn markers_and_length_split_sections() {
        let body = "x\n".repeat(120);
        let text =
            format!("running 3 tests\ntest a ... ok\nFAIL: test b\nassert failed\nerror[E0308]: mismatched\n{body}");
        let s = inline(&text);
        let src = InlineLines::new(&s);
        let (sections, _) = rank(&[&src], &Terms::new(&["fail", "x"]), 10).unwrap();
        let mut spans: Vec<(u64, u64)> = sections.iter().map(|s| (s.line_start, s.line_end)).collect();
        spans.sort();
        assert_eq!(spans, vec![(3, 4), (5, 54), (55, 104), (105, 125)]);
    }
}
