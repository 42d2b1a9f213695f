use super::*;
use crate::store::artifacts::{JobInfo, DEFAULT_TTL_MS};
use crate::store::Store;

/// Store `text` cut at `cuts` (anywhere, even inside lines) as stdout.
fn stored(dir: &std::path::Path, text: &[u8], cuts: &[usize]) -> (Artifacts, ArtifactMeta) {
    let a = Artifacts::open(&Store::open(dir).unwrap()).unwrap();
    let w = a.begin("t", DEFAULT_TTL_MS).unwrap();
    let mut sink = w.chunk_sink(StreamName::Stdout);
    let mut at = 0;
    for &c in cuts.iter().chain([&text.len()]) {
        if c > at {
            sink.write_chunk(&text[at..c]).unwrap();
            at = c;
        }
    }
    let crate::store::artifacts::StoredStream { chunks, compressed_bytes, blob } = sink.finish().unwrap();
    let lines = memchr::memchr_iter(b'\n', text).count() as u64 + u64::from(text.last().is_some_and(|&b| b != b'\n'));
    let meta = StreamMeta {
        stored_lines: lines,
        stored_bytes: text.len() as u64,
        compressed_bytes,
        chunks,
        blob,
        ..Default::default()
    };
    let m = w.finish(JobInfo::default(), meta, StreamMeta::default()).unwrap();
    (a, m)
}

fn naive(text: &[u8]) -> Vec<Line> {
    let mut v: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    if text.last() == Some(&b'\n') {
        v.pop();
    }
    v.iter()
        .enumerate()
        .map(|(i, l)| Line {
            no: i as u64 + 1,
            text: l[..l.len().min(LINE_VIEW_BYTES)].to_vec(),
            cut: l.len() > LINE_VIEW_BYTES,
        })
        .collect()
}

fn sample() -> (Vec<u8>, Vec<usize>) {
    let mut text = Vec::new();
    for i in 0..300 {
        text.extend_from_slice(format!("line {i} {}\n", if i % 7 == 0 { "ERROR here" } else { "fine" }).as_bytes());
        if i == 100 {
            // A line much longer than a chunk, with a term near its end.
            text.extend(std::iter::repeat_n(b'x', 50_000));
            text.extend_from_slice(b" needle\n");
        }
    }
    text.extend_from_slice(b"last line without newline");
    // Cuts inside lines, inside the long line, and inside "needle" itself.
    let needle = memchr::memmem::find(&text, b"needle").unwrap();
    let cuts = vec![5, 1000, 1001, 2400, 2500, needle - 20_000, needle - 10_000, needle + 3, needle + 30, 9000];
    (text, cuts)
}

#[test]
fn lines_match_a_plain_split_wherever_the_chunks_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let (text, mut cuts) = sample();
    cuts.sort();
    let (a, m) = stored(dir.path(), &text, &cuts);
    let src = ArtifactLines::new(&a, &m, StreamName::Stdout);
    let want = naive(&text);
    assert_eq!(src.total_lines(), want.len() as u64);
    for first in [1, 2, 30, 101, 102, 103, 250, 301, 302] {
        for len in [0, 1, 5, 400] {
            let got = src.lines(first, first + len).unwrap();
            let end = (first + len).min(want.len() as u64) as usize;
            assert_eq!(got, want[first as usize - 1..end], "lines {first}..={}", first + len);
        }
    }
    let mut all = Vec::new();
    src.scan(&mut |l| {
        all.push(l.clone());
        true
    })
    .unwrap();
    assert_eq!(all, want);
    assert!(all[101].cut);
    assert!(src.lines(303, 400).unwrap().is_empty());
}

#[test]
fn find_matches_a_plain_search_across_chunk_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let (text, mut cuts) = sample();
    cuts.sort();
    let (a, m) = stored(dir.path(), &text, &cuts);
    let src = ArtifactLines::new(&a, &m, StreamName::Stdout);
    let full: Vec<&[u8]> = text.split(|&b| b == b'\n').collect();
    let terms = Terms::new(&["error", "NEEDLE", "without"]);
    let want: Vec<u64> = full
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.to_ascii_lowercase();
            ["error", "needle", "without"].iter().any(|t| memchr::memmem::find(&l, t.as_bytes()).is_some())
        })
        .map(|(i, _)| i as u64 + 1)
        .collect();
    let got = src.find(&terms, 1, u64::MAX, 0, 1000).unwrap();
    assert_eq!(got.lines, want);
    assert_eq!(got.total, want.len() as u64);
    assert!(!got.more);
    // A line range limits the search.
    let got = src.find(&terms, 100, 110, 0, 1000).unwrap();
    assert_eq!(got.lines, vec![102, 107]);
    // The window cap keeps the first windows and counts the rest.
    let got = src.find(&terms, 1, u64::MAX, 1, 3).unwrap();
    assert_eq!(got.lines, want[..3]);
    assert!(got.more);
    assert_eq!(got.total, want.len() as u64);
}

#[test]
fn inline_lines_number_the_tail_from_the_end() {
    use crate::output::StreamSummary;
    let text: Vec<u8> = (1..=100).flat_map(|i| format!("row {i}\n").into_bytes()).collect();
    let s = StreamSummary {
        stream: StreamName::Stdout,
        meta: StreamMeta { total_lines: 100, ..Default::default() },
        head: text[..40].to_vec(),
        tail: text[text.len() - 40..].to_vec(),
        gap_bytes: text.len() as u64 - 80,
        error: None,
    };
    let src = crate::output::lines::InlineLines::new(&s);
    let got = src.lines(1, 1000).unwrap();
    let nos: Vec<u64> = got.iter().map(|l| l.no).collect();
    assert_eq!(nos, vec![1, 2, 3, 4, 5, 6, 7, 96, 97, 98, 99, 100]);
    assert_eq!(got[7].text, b"row 96");
    assert!(!src.complete());
    let m = src.find(&Terms::new(&["ROW 9"]), 1, 1000, 0, 10).unwrap();
    assert_eq!(m.lines, vec![96, 97, 98, 99]);
}

#[test]
fn inline_lines_without_a_gap_are_the_whole_output() {
    use crate::output::StreamSummary;
    let summary = |head: &[u8], tail: &[u8], lines: u64| StreamSummary {
        stream: StreamName::Stdout,
        meta: StreamMeta { total_lines: lines, ..Default::default() },
        head: head.to_vec(),
        tail: tail.to_vec(),
        gap_bytes: 0,
        error: None,
    };
    let texts = |s: &StreamSummary| -> Vec<(u64, String, bool)> {
        let src = crate::output::lines::InlineLines::new(s);
        src.lines(1, 100).unwrap().into_iter().map(|l| (l.no, String::from_utf8(l.text).unwrap(), l.cut)).collect()
    };
    // A line straddles head and tail: it is one line.
    let s = summary(b"one\ntw", b"o\nthree", 3);
    let want = vec![(1, "one".into(), false), (2, "two".into(), false), (3, "three".into(), false)];
    assert_eq!(texts(&s), want);
    // The head ends on a newline: the tail's lines follow it.
    let s = summary(b"one\ntwo\n", b"three\n", 3);
    assert_eq!(texts(&s), want);
    let src = crate::output::lines::InlineLines::new(&s);
    assert_eq!(src.find(&Terms::new(&["T"]), 1, 3, 0, 10).unwrap().lines, vec![2, 3]);
    assert_eq!(src.lines(2, 2).unwrap()[0].text, b"two");
    // Nothing at all.
    assert!(texts(&summary(b"", b"", 0)).is_empty());
}

#[test]
fn inline_lines_mark_a_head_line_that_goes_on_in_the_gap() {
    use crate::output::StreamSummary;
    let s = StreamSummary {
        stream: StreamName::Stdout,
        meta: StreamMeta { total_lines: 50, ..Default::default() },
        head: b"first\nsecond is lo".to_vec(),
        tail: b"ng\nforty-nine\nfifty\n".to_vec(),
        gap_bytes: 1000,
        error: None,
    };
    let src = crate::output::lines::InlineLines::new(&s);
    let got = src.lines(1, 100).unwrap();
    let view: Vec<(u64, &[u8], bool)> = got.iter().map(|l| (l.no, &l.text[..], l.cut)).collect();
    assert_eq!(
        view,
        vec![
            (1, &b"first"[..], false),
            (2, &b"second is lo"[..], true),
            (49, &b"forty-nine"[..], false),
            (50, &b"fifty"[..], false)
        ]
    );
}
