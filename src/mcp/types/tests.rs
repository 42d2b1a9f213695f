use super::*;
use serde_json::{json, Value};

fn exec(v: Value) -> Result<ExecuteRequest, String> {
    serde_json::from_value(v).map_err(|e| e.to_string())
}

#[test]
fn minimal_request_parses_with_defaults() {
    let r = exec(json!({"repoId": "r", "runtime": "shell", "code": "echo hi"})).unwrap();
    assert_eq!(r.output_mode, OutputMode::Minimal);
    assert_eq!(r.timeout_ms, None);
    r.validate().unwrap();
}

#[test]
fn unknown_fields_are_rejected() {
    let e = exec(json!({"repoId": "r", "runtime": "shell", "code": "x", "timeout": 5})).unwrap_err();
    assert!(e.contains("unknown field `timeout`"), "{e}");
}

#[test]
fn code_and_args_are_exclusive() {
    let r = exec(json!({"repoId": "r", "runtime": "shell", "code": "x", "args": ["-c", "y"]})).unwrap();
    assert_eq!(r.validate().unwrap_err().status(), "invalid");
    let r = exec(json!({"repoId": "r", "runtime": "shell"})).unwrap();
    assert!(r.validate().unwrap_err().message().contains("give code"));
}

#[test]
fn ranges_are_checked() {
    for (field, value) in [
        ("timeoutMs", json!(99)),
        ("timeoutMs", json!(300_001)),
        ("maxResponseLines", json!(9)),
        ("maxResponseLines", json!(1001)),
        ("queryTerms", json!(["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k"])),
        ("queryTerms", json!([""])),
        ("env", json!({"1BAD": "x"})),
    ] {
        let mut v = json!({"repoId": "r", "runtime": "shell", "code": "x"});
        v[field] = value;
        let err = exec(v).unwrap().validate().unwrap_err();
        assert_eq!(err.status(), "invalid", "{field}");
        assert!(!err.one_line().contains('\n'));
    }
    let ok = exec(json!({"repoId": "r", "runtime": "shell", "code": "x", "timeoutMs": 100})).unwrap();
    ok.validate().unwrap();
}

#[test]
fn one_line_folds_newlines_and_caps_length() {
    let e = ServiceError::Invalid(format!("a\nb{}", "x".repeat(1000)));
    let line = e.one_line();
    assert!(line.starts_with("invalid: a b"));
    assert!(!line.contains('\n'));
    assert!(line.chars().count() < 320);
}

#[test]
fn query_needs_terms_or_range() {
    let q = QueryOutputRequest { artifact_handle: "h".into(), ..Default::default() };
    assert_eq!(q.validate().unwrap_err().status(), "invalid");
    let q = QueryOutputRequest { artifact_handle: "h".into(), line_range: Some([3, 2]), ..Default::default() };
    assert!(q.validate().is_err());
    let q = QueryOutputRequest { artifact_handle: "h".into(), line_range: Some([1, 2]), ..Default::default() };
    q.validate().unwrap();
}

#[test]
fn responses_serialise_in_camel_case() {
    let mut r = ExecuteResponse::bare(ExecStatus::Success);
    r.exit_code = Some(0);
    r.artifact_handle = Some("run-1".into());
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["status"], "success");
    assert_eq!(v["exitCode"], 0);
    assert_eq!(v["artifactHandle"], "run-1");
    assert_eq!(v["signal"], Value::Null);
    assert_eq!(v["policyDecision"]["deniedReasons"], json!([]));
    assert!(v.get("stdoutSummary").is_none());
}

#[test]
fn job_status_maps_onto_exec_status() {
    assert_eq!(ExecStatus::from(crate::job::Status::Oom), ExecStatus::Oom);
    assert_eq!(serde_json::to_value(ExecStatus::Running).unwrap(), "running");
}

#[test]
fn a_full_tmp_survives_the_lean_answer_and_is_a_line_of_its_text() {
    let full = crate::job::TmpFull::new(1 << 20, None);
    let mut r = ExecuteResponse::bare(ExecStatus::Failure);
    r.tmp_full = serde_json::to_value(&full).ok();
    let r = r.lean(false);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["tmpFull"]["outOf"], "space");
    assert_eq!(v["tmpFull"]["sizeBytes"], 1 << 20);
    let text = r.text();
    let note = text.lines().find(|l| l.starts_with("note: ")).unwrap_or_else(|| panic!("{text}"));
    assert!(note.contains("1.0 MiB cap") && note.contains("--tmp-size") && note.contains("tmp_size_bytes"), "{note}");
    assert!(ExecuteResponse::bare(ExecStatus::Success).text().lines().all(|l| !l.starts_with("note: ")));
}
