use super::*;
use crate::store::Store;

pub(crate) use crate::fuzz::store_texts;

fn numbered(n: u32, mark: impl Fn(u32) -> Option<&'static str>) -> Vec<u8> {
    (1..=n).flat_map(|i| format!("{i} {}\n", mark(i).unwrap_or("ok")).into_bytes()).collect()
}

fn setup() -> (tempfile::TempDir, Artifacts, String) {
    let dir = tempfile::tempdir().unwrap();
    let a = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let out = numbered(500, |i| match i {
        10 | 14 => Some("ERROR boom"),
        100 | 300 => Some("Warning: careful"),
        _ => None,
    });
    let err = numbered(20, |i| (i == 5).then_some("error in stderr"));
    let h = store_texts(&a, &out, &err).handle;
    (dir, a, h)
}

fn req(h: &str, terms: &[&str]) -> ArtifactQuery {
    ArtifactQuery {
        artifact_handle: h.into(),
        query_terms: terms.iter().map(|t| t.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn windows_merge_when_they_overlap_or_touch() {
    assert_eq!(windows(&[10, 14], 2, 1, 100), vec![(8, 16)]);
    assert_eq!(windows(&[10, 15], 2, 1, 100), vec![(8, 17)]); // touching: 12 and 13
    assert_eq!(windows(&[10, 16], 2, 1, 100), vec![(8, 12), (14, 18)]);
    assert_eq!(windows(&[1, 99], 3, 1, 100), vec![(1, 4), (96, 100)]);
}

#[test]
fn terms_match_case_insensitively_with_context() {
    let (_d, a, h) = setup();
    let r = query_output(&a, &ArtifactQuery { context_lines: Some(2), ..req(&h, &["error"]) }).unwrap();
    assert_eq!(r.searched_streams, vec![StreamName::Stdout, StreamName::Stderr]);
    assert_eq!(r.matched_lines, 3);
    let got: Vec<(StreamName, u64, u64)> = r.excerpts.iter().map(|e| (e.source, e.line_start, e.line_end)).collect();
    assert_eq!(got, vec![(StreamName::Stdout, 8, 16), (StreamName::Stderr, 3, 7)]);
    assert_eq!(r.excerpts[1].content, "3 ok\n4 ok\n5 error in stderr\n6 ok\n7 ok");
    let bytes = |n: u32| -> u64 { (1..=n).map(|i| i.to_string().len() as u64 + 4).sum() };
    let extra = 2 * ("ERROR boom".len() - 2) + 2 * ("Warning: careful".len() - 2) + "error in stderr".len() - 2;
    assert_eq!((r.total_lines, r.total_bytes), (520, bytes(500) + bytes(20) + extra as u64));
    assert!(r.notes.is_empty() && !r.more_excerpts);
}

#[test]
fn out_of_range_knobs_are_clamped_and_said() {
    let (_d, a, h) = setup();
    let r =
        query_output(&a, &ArtifactQuery { context_lines: Some(50), max_excerpts: Some(500), ..req(&h, &["warning"]) })
            .unwrap();
    assert_eq!(
        r.notes,
        vec!["contextLines 50 is outside 0..20; 20 was used", "maxExcerpts 500 is outside 1..100; 100 was used"]
    );
    assert_eq!(r.excerpts[0].line_start, 80);
    assert_eq!(r.excerpts[0].line_end, 120);
    let r = query_output(&a, &ArtifactQuery { max_excerpts: Some(0), ..req(&h, &["ok"]) }).unwrap();
    assert_eq!(r.excerpts.len(), 1);
    assert!(r.more_excerpts);
}

#[test]
fn one_stream_can_be_searched_alone() {
    let (_d, a, h) = setup();
    let r = query_output(&a, &ArtifactQuery { stream: QueryStreams::Stderr, ..req(&h, &["ERROR"]) }).unwrap();
    assert_eq!(r.searched_streams, vec![StreamName::Stderr]);
    assert_eq!(r.excerpts.len(), 1);
    assert_eq!(r.total_lines, 20);
}

#[test]
fn line_ranges_return_what_exists_and_the_total() {
    let (_d, a, h) = setup();
    let mut q = req(&h, &[]);
    q.stream = QueryStreams::Stdout;
    q.set_range("498:600").unwrap();
    let r = query_output(&a, &q).unwrap();
    assert_eq!(r.excerpts.len(), 1);
    assert_eq!((r.excerpts[0].line_start, r.excerpts[0].line_end), (498, 500));
    assert_eq!(r.excerpts[0].content, "498 ok\n499 ok\n500 ok");
    assert_eq!(r.total_lines, 500);
    assert_eq!(r.notes, vec!["stdout has 500 lines; lines 498..600 asked"]);
    q.set_range("900:1000").unwrap();
    let r = query_output(&a, &q).unwrap();
    assert!(r.excerpts.is_empty());
    assert_eq!(r.total_lines, 500);
    // Terms inside a range.
    let mut q = req(&h, &["warning"]);
    q.set_range("200:").unwrap();
    let r = query_output(&a, &q).unwrap();
    assert_eq!(r.matched_lines, 1);
    assert_eq!(r.excerpts[0].line_start, 297);
}

#[test]
fn bad_input_gets_clear_errors() {
    let (_d, a, h) = setup();
    let e = query_output(&a, &req(&h, &[" ", ""])).unwrap_err();
    assert!(e.to_string().starts_with("nothing to query: give search terms"), "{e}");
    let e = query_output(&a, &req("run-x-1-ffff", &["a"])).unwrap_err();
    assert_eq!(e.to_string(), "artifact 'run-x-1-ffff' not found (expired or never stored)");
    let mut q = req(&h, &[]);
    assert!(q.set_range("12").is_err());
    q.set_range("20:10").unwrap();
    assert!(matches!(query_output(&a, &q), Err(OutputError::BadRange(_))));
}

#[test]
fn long_lines_are_capped_in_excerpts() {
    let dir = tempfile::tempdir().unwrap();
    let a = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let long = format!("needle {}\nshort\n", "z".repeat(20_000));
    let h = store_texts(&a, long.as_bytes(), b"").handle;
    let r = query_output(&a, &ArtifactQuery { context_lines: Some(1), ..req(&h, &["needle"]) }).unwrap();
    let lines: Vec<&str> = r.excerpts[0].content.lines().collect();
    assert_eq!(lines[0].chars().count(), 500 + "[truncated]".len());
    assert!(lines[0].ends_with("zz[truncated]"));
    assert_eq!(lines[1], "short");
}

#[test]
fn streams_share_the_excerpt_budget() {
    let per = vec![vec![(1, 1), (5, 5), (9, 9)], vec![(2, 2)]];
    assert_eq!(round_robin(&per, 2), vec![vec![(1, 1)], vec![(2, 2)]]);
    assert_eq!(round_robin(&per, 10), per);
}
