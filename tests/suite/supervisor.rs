//! The supervisor as a library, driven concurrently: the fair queue, busy
//! rejection, queue time in the outcome, and one audit record per request.

use crate::common;
use common::*;
use confine::config::Config;
use confine::supervisor::exec::{JobControl, JobRequest};
use confine::supervisor::Supervisor;
use std::sync::Arc;

fn supervisor(dir: &std::path::Path, running: usize, queued: usize) -> Supervisor {
    supervisor_with(dir, running, queued, "")
}

/// As [`supervisor`], with more TOML after the repository.
fn supervisor_with(dir: &std::path::Path, running: usize, queued: usize, extra: &str) -> Supervisor {
    confine::sandbox::linux::set_init_executable(bin().into());
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let text = format!(
        "[runtime]\nenabled = true\nmax_concurrent_jobs = {running}\nmax_queued = {queued}\n\n[store]\npath = \"{}\"\n\n\
         [[repos]]\nid = \"demo\"\nroot = \"{}\"\n{extra}",
        dir.join("store").display(),
        repo.display()
    );
    let config = Config::parse(&text, &dir.join("confine.toml")).unwrap();
    Supervisor::open(config).unwrap()
}

fn sleep_req(secs: &str) -> JobRequest {
    JobRequest {
        repo_id: Some("demo".into()),
        runtime: "shell".into(),
        code: Some(format!("sleep {secs}")),
        ..JobRequest::default()
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
        async move { sup.execute(sleep_req("0.6"), JobControl::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;
    let second = tokio::spawn({
        let sup = sup.clone();
        async move { sup.execute(sleep_req("0.1"), JobControl::default()).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let third = sup.execute(sleep_req("0.1"), JobControl::default()).await;
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
    let req = JobRequest { code: Some(format!("setsid sh -c 'sleep 1000; : {tok}' & sleep 1000")), ..sleep_req("0") };
    let cancel = Box::pin(async { tokio::time::sleep(std::time::Duration::from_millis(500)).await });
    let started = std::time::Instant::now();
    let resp = sup.execute(req, JobControl { cancel: Some(cancel), ..JobControl::default() }).await;
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "cancelled", "{resp:?}");
    assert!(started.elapsed().as_secs() < 5);
    assert!(host_pids_with(&tok).is_empty(), "survivors after cancel");
    let audit = confine::store::audit::AuditLog::open(&sup.stores().unwrap().store).unwrap();
    let records = audit.list(10).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(serde_json::to_value(records[0].entry.status).unwrap(), "cancelled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_artifact_is_collected_after_a_job_without_confine_gc() {
    use confine::store::artifacts::{JobInfo, StreamMeta};
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), 2, 4);
    // An artifact whose TTL ran out (1 ms), as yesterday's would have.
    let old = sup.stores().unwrap().artifacts.begin("demo", 1).unwrap();
    let old_handle = old.handle().to_string();
    old.finish(JobInfo::default(), StreamMeta::default(), StreamMeta::default()).unwrap();
    let listed = |h: &str| sup.stores().unwrap().artifacts.list().unwrap().iter().any(|m| m.handle == h);
    assert!(listed(&old_handle));
    let resp = sup.execute(sleep_req("0"), JobControl::default()).await;
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "success", "{:?}", resp.error);
    // GC runs beside the answer, not before it: wait for it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while listed(&old_handle) {
        assert!(std::time::Instant::now() < deadline, "the expired artifact is still there");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    sup.stores().unwrap().artifacts.get(resp.artifact_handle.as_deref().unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_values_named_like_secrets_never_reach_stored_or_returned_output() {
    use confine::output::modes::RenderOptions;
    use confine::output::OutputMode;
    use confine::store::artifacts::StreamName;
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor_with(dir.path(), 2, 4, "\n[sandbox]\nenv_allowlist = [\"API_TOKEN\", \"GREETING\"]\n");
    let secret = format!("tok-{}-zq81", std::process::id());
    let req = JobRequest {
        code: Some("echo \"token=$API_TOKEN greeting=$GREETING\"; echo \"auth $API_TOKEN\" >&2".into()),
        env: vec![("API_TOKEN".into(), secret.clone()), ("GREETING".into(), "hello-plain-value".into())],
        render: RenderOptions { output_mode: OutputMode::Summary, ..RenderOptions::default() },
        ..sleep_req("0")
    };
    let mirror: confine::supervisor::exec::Mirror = Default::default();
    let resp = sup.execute(req, JobControl { mirror: Some(mirror.clone()), ..JobControl::default() }).await;
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "success", "{:?}", resp.error);
    let json = serde_json::to_string(&resp).unwrap();
    assert!(!json.contains(&secret), "the response shows the secret: {json}");
    assert!(json.contains("token=[REDACTED] greeting=hello-plain-value"), "{json}");
    let meta = sup.stores().unwrap().artifacts.get(resp.artifact_handle.as_deref().unwrap()).unwrap();
    for stream in StreamName::BOTH {
        let mut stored = Vec::new();
        sup.stores().unwrap().artifacts.copy_stream(&meta, stream, &mut stored).unwrap();
        let stored = String::from_utf8(stored).unwrap();
        assert!(stored.contains("[REDACTED]") && !stored.contains(&secret), "{stream}: {stored}");
    }
    assert_eq!(meta.stdout.redactions + meta.stderr.redactions, 2);
    // What runtime_jobs returns while and after the job runs.
    let live = String::from_utf8(mirror.lock().unwrap().clone()).unwrap();
    assert!(live.contains("token=[REDACTED]") && !live.contains(&secret), "{live}");
}

/// A job spawned held has its sandbox built but does not execve until the
/// supervisor releases it; dropped unreleased, it never runs at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_job_runs_only_once_released() {
    use confine::sandbox::linux::spawn;
    use confine::sandbox::StdioSpec;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    if !sandbox_available() {
        return;
    }
    confine::sandbox::linux::set_init_executable(bin().into());
    let mut spec = confine::job::JobSpec::new(vec!["echo".into(), "ran".into()]);
    spec.hold = true;
    let mut job = spawn(&spec, StdioSpec::piped(), None).await.unwrap();
    let mut out = job.stdout().unwrap().unwrap();
    let mut buf = Vec::new();
    let early = tokio::time::timeout(Duration::from_millis(400), out.read_to_end(&mut buf)).await;
    assert!(early.is_err() && buf.is_empty(), "a held job ran: {:?}", String::from_utf8_lossy(&buf));
    job.release().await.unwrap();
    out.read_to_end(&mut buf).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&buf), "ran\n");
    let outcome = job.supervise(Duration::from_secs(1), std::future::pending()).await;
    assert_eq!(outcome.exit_code, Some(0), "{:?}", outcome.error);

    // Never released: the command never starts, and dropping the job
    // takes its init stages with it.
    let tok = token("held");
    let mut spec = confine::job::JobSpec::new(vec!["sh".into(), "-c".into(), format!("sleep 1000; : {tok}")]);
    spec.hold = true;
    let job = spawn(&spec, StdioSpec::piped(), None).await.unwrap();
    let pid = job.pid().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(host_pids_with(&tok).is_empty(), "the held job ran");
    drop(job);
    let gone = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
            .unwrap_or(true)
    };
    for _ in 0..100 {
        if gone(pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone(pid), "the init stage of a dropped held job is still alive");
    assert!(host_pids_with(&tok).is_empty());
}

/// `confine exec`'s supervisor opens its store while the sandbox is built.
/// A store that fails to open fails the request, and its job never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_fails_to_open_stops_the_job_before_it_runs() {
    if !sandbox_available() {
        return;
    }
    let (dir, repo) = scratch_repo();
    // A store path below a regular file can't be created.
    std::fs::write(dir.path().join("file"), "").unwrap();
    let text = exec_config(&dir.path().join("file/store"), "demo", &repo);
    let config = Config::parse(&text, &dir.path().join("confine.toml")).unwrap();
    let sup = Supervisor::open_deferred(config.clone()).unwrap();
    let tok = token("nostore");
    let req = JobRequest { code: Some(format!("sleep 1000; : {tok}")), ..sleep_req("0") };
    let resp = sup.execute(req, JobControl::default()).await;
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "failure");
    let error = resp.error.unwrap_or_default();
    assert!(error.contains("the store is unavailable"), "{error}");
    assert!(resp.outcome.is_none() && resp.exit_code.is_none(), "the job ran");
    assert!(host_pids_with(&tok).is_empty());
    // Opened eagerly, the same supervisor refuses to start.
    assert!(Supervisor::open(config).is_err());
}
