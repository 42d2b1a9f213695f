use super::*;
use std::time::Duration;

fn req(runtime: &str, code: &str) -> ExecuteRequest {
    ExecuteRequest { repo_id: "demo".into(), runtime: runtime.into(), code: Some(code.into()), ..Default::default() }
}

#[tokio::test]
async fn echo_succeeds_and_persists_output() {
    let svc = FakeService::new();
    let r = svc.execute(req("shell", "echo hi"), ExecControl::detached()).await.unwrap();
    assert_eq!(r.status, ExecStatus::Success);
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.output_bytes, Some(3));
    assert!(r.policy_decision.allowed);
    assert_eq!(r.policy_decision.audit_hash.as_ref().map(String::len), Some(64));
    let q = QueryOutputRequest {
        artifact_handle: r.artifact_handle.unwrap(),
        query_terms: vec!["HI".into()],
        ..Default::default()
    };
    let q = svc.query_output(q, &Caller::local()).await.unwrap();
    assert_eq!(q.excerpts.len(), 1);
    assert_eq!(q.excerpts[0].content, "hi");
}

#[tokio::test]
async fn runtime_and_policy_errors() {
    let svc = FakeService::new();
    let e = svc.execute(req("cobol", "x"), ExecControl::detached()).await.unwrap_err();
    assert_eq!(e.status(), "invalid");
    let e = svc.execute(req("go", "x"), ExecControl::detached()).await.unwrap_err();
    assert_eq!(e.status(), "denied");
    let r = svc.execute(req("shell", "rm -rf /"), ExecControl::detached()).await.unwrap();
    assert_eq!(r.status, ExecStatus::Denied);
    assert!(!r.policy_decision.allowed);
    assert!(r.policy_decision.denied_reasons[0].contains("'rm': destructive command"));
    let mut bad_cwd = req("shell", "echo x");
    bad_cwd.relative_cwd = Some("a/../../etc".into());
    assert_eq!(svc.execute(bad_cwd, ExecControl::detached()).await.unwrap_err().status(), "denied");
}

#[tokio::test]
async fn exit_code_timeout_and_cancel() {
    let svc = FakeService::new();
    let r = svc.execute(req("shell", "echo a; exit 3"), ExecControl::detached()).await.unwrap();
    assert_eq!((r.status, r.exit_code), (ExecStatus::Failure, Some(3)));

    let mut slow = req("shell", "sleep 5");
    slow.timeout_ms = Some(300);
    let r = svc.execute(slow, ExecControl::detached()).await.unwrap();
    assert_eq!(r.status, ExecStatus::Timeout);

    let ctl = ExecControl::detached();
    let cancel = ctl.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        cancel.cancel();
    });
    let t = Instant::now();
    let r = svc.execute(req("shell", "sleep 10"), ctl).await.unwrap();
    assert_eq!(r.status, ExecStatus::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn background_job_can_be_followed_and_killed() {
    let svc = FakeService::new();
    let mut bg = req("shell", "echo started; sleep 30");
    bg.background = Some(true);
    let r = svc.execute(bg, ExecControl::detached()).await.unwrap();
    assert_eq!(r.status, ExecStatus::Running);
    let id = r.job_id.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let jobs = svc.jobs(JobsRequest { job_id: Some(id.clone()), offset: None }, &Caller::local()).await.unwrap();
    assert_eq!(jobs.jobs[0].status, ExecStatus::Running);
    assert_eq!(jobs.output.as_ref().unwrap().text, "started\n");
    let next = jobs.output.unwrap().next_offset;
    let killed = svc.kill(&id, &Caller::local()).await.unwrap();
    assert_eq!(killed.status, ExecStatus::Killed);
    let again = svc.kill(&id, &Caller::local()).await.unwrap();
    assert_eq!(again.status, ExecStatus::Killed);
    let jobs = svc.jobs(JobsRequest { job_id: Some(id), offset: Some(next) }, &Caller::local()).await.unwrap();
    assert!(jobs.output.unwrap().complete);
    assert_eq!(svc.kill("job-nope", &Caller::local()).await.unwrap_err().status(), "not_found");
}

#[tokio::test]
async fn modes_fill_their_fields() {
    let svc = FakeService::new();
    let mut r = req("shell", "seq 500; echo 'error: bad thing' >&2");
    r.output_mode = OutputMode::Summary;
    r.query_terms = Some(vec!["250".into()]);
    r.max_response_lines = Some(10);
    let out = svc.execute(r.clone(), ExecControl::detached()).await.unwrap();
    assert!(out.stdout_summary.unwrap().contains("lines omitted"));
    assert_eq!(out.stderr_summary.as_deref(), Some("error: bad thing"));
    assert_eq!(out.excerpts.unwrap()[0].line_start, 247);
    assert!(out.truncation.unwrap().stdout_truncated);
    r.output_mode = OutputMode::Digest;
    let out = svc.execute(r, ExecControl::detached()).await.unwrap();
    assert_eq!(out.digest.unwrap()["errors"][0]["line"], "error: bad thing");
}

#[tokio::test]
async fn shutdown_kills_background_jobs() {
    let svc = FakeService::new();
    let mut bg = req("python", "time.sleep(30)");
    bg.background = Some(true);
    let id = svc.execute(bg, ExecControl::detached()).await.unwrap().job_id.unwrap();
    svc.shutdown().await;
    assert_eq!(svc.kill(&id, &Caller::local()).await.unwrap().status, ExecStatus::Killed);
}

#[tokio::test]
async fn info_lists_runtimes_and_limits() {
    let info = FakeService::new().info(Some("demo")).await.unwrap();
    assert_eq!(info.runtimes.len(), 16);
    assert!(info.runtimes.iter().any(|r| r.name == "shell" && r.available));
    assert_eq!(info.limits.max_timeout_ms, 300_000);
    assert_eq!(info.repo.unwrap().repo_id, "demo");
}
