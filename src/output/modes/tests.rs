use super::*;
use crate::output::{capture, Capture, OutputConfig};
use crate::store::Store;

async fn run(artifacts: Option<&Artifacts>, cfg: &OutputConfig, out: &[u8], err: &[u8]) -> Captured {
    let cap = Capture::start(artifacts, "repo", cfg, cfg.redactor(|_| None), true);
    let o = capture(out, cap.sink(StreamName::Stdout)).await;
    let e = capture(err, cap.sink(StreamName::Stderr)).await;
    cap.finish(job(), o, e)
}

fn job() -> JobInfo {
    JobInfo {
        runtime: Some("shell".into()),
        status: Some(Status::Failure),
        exit_code: Some(1),
        signal: None,
        duration_ms: 12,
    }
}

fn opts(mode: OutputMode, terms: &[&str]) -> RenderOptions {
    RenderOptions {
        output_mode: mode,
        max_response_lines: None,
        query_terms: terms.iter().map(|t| t.to_string()).collect(),
        inline_bytes: Some(0),
    }
}

fn numbered(n: usize) -> Vec<u8> {
    (1..=n).flat_map(|i| format!("out {i}{}\n", if i == 700 { " FAILED here" } else { "" }).into_bytes()).collect()
}

#[tokio::test]
async fn minimal_is_small_and_says_truncation_only_when_there_is_some() {
    let dir = tempfile::tempdir().unwrap();
    let a = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let c = run(Some(&a), &OutputConfig::default(), b"a\nb\n", b"warn\n").await;
    let v = render(&c, Some(&a), &job(), &opts(OutputMode::Minimal, &[])).unwrap();
    let json = serde_json::to_string(&v).unwrap();
    assert!(
        json.starts_with(
            r#"{"status":"failure","exitCode":1,"signal":null,"durationMs":12,"artifactHandle":"run-repo-"#
        ),
        "{json}"
    );
    // A failure whose output is not here suggests what to query for.
    assert!(json.ends_with(r#","outputLines":3,"outputBytes":9,"suggestedTerms":["warn"]}"#), "{json}");
    assert!(json.len() < 200, "about 50 tokens: {json}");

    let cfg = OutputConfig { stdout_stored_bytes: 2, ..OutputConfig::default() };
    let c = run(Some(&a), &cfg, b"a\nb\n", b"").await;
    let v = render(&c, Some(&a), &job(), &opts(OutputMode::Minimal, &[])).unwrap();
    assert_eq!(
        v.truncation,
        Some(OutputTruncation {
            stdout_truncated: true,
            stderr_truncated: false,
            total_stdout_bytes: 4,
            total_stderr_bytes: 0
        })
    );
}

#[tokio::test]
async fn summary_has_head_tail_stderr_tail_and_excerpts() {
    let dir = tempfile::tempdir().unwrap();
    let a = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let long = format!("{}\n", "é".repeat(600));
    let err = [numbered(30), long.into_bytes()].concat();
    let c = run(Some(&a), &OutputConfig::default(), &numbered(1000), &err).await;
    let mut o = opts(OutputMode::Summary, &["failed"]);
    o.max_response_lines = Some(10);
    let v = render(&c, Some(&a), &job(), &o).unwrap();
    let s = v.stdout_summary.unwrap();
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(
        lines,
        vec![
            "out 1",
            "out 2",
            "out 3",
            "out 4",
            "out 5",
            "… 990 lines omitted …",
            "out 996",
            "out 997",
            "out 998",
            "out 999",
            "out 1000"
        ]
    );
    let e = v.stderr_summary.unwrap();
    let elines: Vec<&str> = e.lines().collect();
    assert_eq!(elines.len(), 5);
    assert!(elines[4].ends_with("éé[truncated]") && elines[4].chars().count() == 511);
    let x = v.excerpts.unwrap();
    assert_eq!((x[0].line_start, x[0].line_end, x[0].source), (698, 702, StreamName::Stdout));
    assert!(v.truncation.is_some());
    assert!(v.sections.is_none() && v.digest.is_none());

    o.max_response_lines = Some(5000);
    let v = render(&c, Some(&a), &job(), &o).unwrap();
    assert_eq!(v.notes, vec!["maxResponseLines 5000 is outside 10..1000; 1000 was used"]);
    assert_eq!(v.stdout_summary.unwrap().lines().count(), 1000);
}

#[tokio::test]
async fn intent_returns_excerpts_and_ranked_sections_only() {
    let dir = tempfile::tempdir().unwrap();
    let a = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
    let c = run(Some(&a), &OutputConfig::default(), &numbered(1000), b"").await;
    let v = render(&c, Some(&a), &job(), &opts(OutputMode::Intent, &["FAILED"])).unwrap();
    assert!(v.stdout_summary.is_none() && v.stderr_summary.is_none());
    assert_eq!(v.excerpts.as_ref().unwrap().len(), 1);
    let sections = v.sections.unwrap();
    assert_eq!(sections[0].title, "out 651");
    assert_eq!((sections[0].line_start, sections[0].line_end), (651, 700));
    assert_eq!(sections[0].preview, vec!["out 700 FAILED here"]);
    // Without terms it looks for failures, and says so.
    let v = render(&c, Some(&a), &job(), &opts(OutputMode::Intent, &[])).unwrap();
    assert!(v.notes[0].starts_with("no queryTerms: looked for error, fail"));
    assert_eq!(v.excerpts.unwrap()[0].line_start, 698);
}

#[tokio::test]
async fn digest_and_unpersisted_output_work_from_inline_buffers() {
    let cfg = OutputConfig { stdout_inline_bytes: 4096, ..OutputConfig::default() };
    let c = run(None, &cfg, &numbered(1000), b"error: boom\nerror: boom\n").await;
    assert!(c.artifact.is_none());
    let v = render(&c, None, &job(), &opts(OutputMode::Digest, &[])).unwrap();
    assert!(v.artifact_handle.is_none());
    let d = v.digest.unwrap();
    assert_eq!(d.lines, vec!["stderr:1: error: boom ×2"]);
    assert!(v.notes.iter().any(|n| n.contains("not stored")));
    let v = render(&c, None, &job(), &opts(OutputMode::Summary, &[])).unwrap();
    let s = v.stdout_summary.unwrap();
    assert!(s.starts_with("out 1\nout 2\n") && s.ends_with("out 999\nout 1000"), "{s}");
}
