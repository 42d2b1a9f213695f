//! The supervisor as a library, driven concurrently: the fair queue, busy
//! rejection, queue time in the outcome, and one audit record per request.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::*;
use confine::config::Config;
use confine::supervisor::exec::{ExecControl, ExecuteRequest};
use confine::supervisor::Supervisor;
use std::sync::Arc;

fn supervisor(dir: &std::path::Path, running: usize, queued: usize) -> Supervisor {
    confine::sandbox::linux::set_init_executable(bin().into());
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let text = format!(
        "[runtime]\nenabled = true\nmax_concurrent_jobs = {running}\nmax_queued = {queued}\n\n[store]\npath = \"{}\"\n\n\
         [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
        dir.join("store").display(),
        repo.display()
    );
    let config = Config::parse(&text, &dir.join("confine.toml")).unwrap();
    Supervisor::open(config).unwrap()
}

fn sleep_req(secs: &str) -> ExecuteRequest {
    ExecuteRequest {
        repo_id: Some("demo".into()),
        runtime: "shell".into(),
        code: Some(format!("sleep {secs}")),
        ..ExecuteRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_runs_waits_and_refuses_in_order() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = Arc::new(supervisor(dir.path(), 1, 1));
    let first = tokio::spawn({
        let sup = sup.clone();
        async move { sup.execute(sleep_req("0.6"), ExecControl::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let second = tokio::spawn({
        let sup = sup.clone();
        async move { sup.execute(sleep_req("0.1"), ExecControl::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let third = sup.execute(sleep_req("0.1"), ExecControl::default()).await;
    assert_eq!(serde_json::to_value(third.status).unwrap(), "failure");
    assert!(third.error.as_deref().unwrap().starts_with("busy: 1 jobs running, 1 queued"), "{:?}", third.error);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(serde_json::to_value(first.status).unwrap(), "success", "{:?}", first.error);
    assert_eq!(serde_json::to_value(second.status).unwrap(), "success", "{:?}", second.error);
    assert!(second.queued_ms >= 250, "the second waited for the first: {}", second.queued_ms);
    assert_eq!(second.outcome.as_ref().unwrap().queued_ms, second.queued_ms);
    assert_eq!(first.queued_ms, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_tree_and_is_audited() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), 2, 4);
    let tok = token("cancel");
    let req =
        ExecuteRequest { code: Some(format!("setsid sh -c 'sleep 1000; : {tok}' & sleep 1000")), ..sleep_req("0") };
    let cancel = Box::pin(async { tokio::time::sleep(std::time::Duration::from_millis(500)).await });
    let started = std::time::Instant::now();
    let resp = sup.execute(req, ExecControl { cancel: Some(cancel), ..ExecControl::default() }).await;
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "cancelled", "{resp:?}");
    assert!(started.elapsed().as_secs() < 5);
    assert!(host_pids_with(&tok).is_empty(), "survivors after cancel");
    let audit = confine::store::audit::AuditLog::open(&sup.store).unwrap();
    let records = audit.list(10).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(serde_json::to_value(records[0].entry.status).unwrap(), "cancelled");
}
