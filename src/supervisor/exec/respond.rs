//! Step 9 of the pipeline and the answer: a job that ran is turned into
//! its response. Its output is sealed into the artifact (unflushed) and
//! rendered in the response mode asked for, truncated as the mode and the
//! caps say; its audit record is appended, which flushes the artifact with
//! it, before the caller is answered; GC may start beside the answer; the
//! outcome and the audit's fate give the response's status and error.

use super::run::Ended;
use super::{JobRequest, JobResponse, PolicyDecisionView};
use crate::job::{Outcome, Status};
use crate::output::capture::{Capture, Captured, StreamSummary};
use crate::output::modes::{render, OutputView};
use crate::policy::Decision;
use crate::sandbox::Teardown;
use crate::store::artifacts::{Artifacts, JobInfo};
use crate::store::audit::{AuditEntry, AuditError, AuditSink};
use crate::store::StoreError;
use crate::supervisor::Supervisor;

/// What a job that ran left, its output sealed: its outcome, its captured
/// output, the view, and its cgroups' removal, still under way.
pub(super) struct Ran {
    outcome: Outcome,
    captured: Captured,
    view: Option<OutputView>,
    teardown: Teardown,
}

impl Ended<'_> {
    /// Seal the job's output and render its view.
    pub(super) fn store_output(self, req: &JobRequest) -> Ran {
        let Ended { outcome, capture, stdout, stderr, artifacts, teardown } = self;
        let (captured, view) = seal(capture, stdout, stderr, &outcome, req, Some(artifacts));
        Ran { outcome, captured, view, teardown }
    }
}

/// The artifact sealed, and the view of the output in `req`'s mode.
fn seal(
    cap: Capture,
    stdout: StreamSummary,
    stderr: StreamSummary,
    outcome: &Outcome,
    req: &JobRequest,
    artifacts: Option<&Artifacts>,
) -> (Captured, Option<OutputView>) {
    let info = JobInfo {
        runtime: Some(req.runtime.clone()),
        status: Some(outcome.status),
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        duration_ms: outcome.duration_ms,
    };
    // Not flushed here: the audit append that follows flushes the store
    // (artifact and record, one fsync) before the caller is answered.
    let captured = cap.finish_unflushed(info.clone(), stdout, stderr);
    let view = render(&captured, artifacts, &info, &req.render).ok();
    (captured, view)
}

impl Supervisor {
    /// Record the job that ran, let its cgroups go, start GC if due, and
    /// answer.
    pub(super) async fn respond(
        &self,
        job_id: String,
        queued_ms: u64,
        started: AuditEntry,
        decision: &Decision,
        clamped: Vec<String>,
        ran: Ran,
    ) -> JobResponse {
        let Ran { mut outcome, captured, view, teardown } = ran;
        outcome.queued_ms = queued_ms;
        outcome.job_id = job_id.clone();
        let entry = started.finished(&outcome, captured.stdout.meta.total_bytes, captured.stderr.meta.total_bytes);
        let audit_error = self.audit_finished(entry);
        tracing::debug!("audit record flushed");
        // The job's cgroups were removed meanwhile, on another thread.
        teardown.finish().await;
        // The artifact and the audit record are flushed: GC may run beside the answer.
        self.collect_garbage_if_due();
        let handle = captured.handle().map(str::to_string);
        answer(job_id, decision, clamped, outcome, handle, view, audit_error)
    }

    /// Append the record of a job that ran; on failure, keep it to be
    /// written before the next job ([`Stores::write_unrecorded`]) and say
    /// what happened, for the answer.
    fn audit_finished(&self, entry: AuditEntry) -> Option<String> {
        let stores = match self.stores() {
            Ok(s) => s,
            Err(e) => return Some(format!("the job ran and its audit record was not written: {e}")),
        };
        let e = match stores.audit.append(entry.clone()) {
            Ok(_) => return None,
            Err(e) => e,
        };
        // The whole entry goes to the log too: until space comes back, it
        // is kept nowhere else (the trail has the job's start).
        let json = serde_json::to_string(&entry).unwrap_or_default();
        tracing::error!(job = %entry.id, error = %e, entry = %json, "a job's audit record was not written");
        stores.keep_unrecorded(entry);
        // The append's flush is what makes the artifact durable too; not
        // tried when the disk is full or the store failed (a write then
        // would fail the store for good).
        let flushed = match &e {
            AuditError::Store(StoreError::Full { .. } | StoreError::Failed(_)) => Ok(()),
            _ => stores.store.flush(),
        };
        let mut msg = format!(
            "the job ran and its audit record was not written: {e}; its start is recorded, and no other job runs \
             until its record is written"
        );
        if let Err(f) = flushed {
            msg.push_str(&format!("; output not flushed: {f}"));
        }
        Some(msg)
    }
}

/// The response of a job that ran. A record that could not be written
/// fails it, whatever the job did, and its `error` says so.
fn answer(
    job_id: String,
    decision: &Decision,
    clamped: Vec<String>,
    outcome: Outcome,
    artifact_handle: Option<String>,
    output: Option<OutputView>,
    audit_error: Option<String>,
) -> JobResponse {
    JobResponse {
        job_id,
        exit_code: outcome.exit_code,
        signal: outcome.signal,
        duration_ms: outcome.duration_ms,
        queued_ms: outcome.queued_ms,
        artifact_handle,
        policy_decision: PolicyDecisionView {
            allowed: true,
            audit_hash: decision.audit_hash.clone(),
            denied_reasons: Vec::new(),
        },
        error: match (&audit_error, &outcome.error) {
            (Some(a), Some(e)) => Some(format!("{e}; {a}")),
            (a, e) => e.clone().or(a.clone()),
        },
        rejection: None,
        clamped,
        unrecorded: audit_error.is_some(),
        status: if audit_error.is_some() { Status::Failure } else { outcome.status },
        outcome: Some(outcome),
        output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::capture::capture;
    use crate::output::OutputConfig;
    use crate::store::artifacts::StreamName;
    use crate::store::Store;

    fn outcome(status: Status, exit_code: Option<i32>, error: Option<&str>) -> Outcome {
        let mut o = Outcome::setup_failed("none", String::new(), "linux", Default::default());
        (o.status, o.exit_code, o.error, o.setup_step, o.queued_ms) =
            (status, exit_code, error.map(str::to_string), None, 7);
        o
    }

    fn allowed() -> Decision {
        Decision {
            allowed: true,
            deny_reasons: Vec::new(),
            limits: Default::default(),
            policy_digest: "d".into(),
            audit_hash: "h".into(),
            gate: false,
        }
    }

    fn respond(outcome: Outcome, audit_error: Option<&str>) -> JobResponse {
        let clamped = vec!["memory".to_string()];
        answer("j".into(), &allowed(), clamped, outcome, Some("a".into()), None, audit_error.map(str::to_string))
    }

    #[test]
    fn a_job_that_ran_is_answered_with_its_outcome() {
        let resp = respond(outcome(Status::Success, Some(0), None), None);
        assert_eq!((resp.status, resp.exit_code, resp.queued_ms), (Status::Success, Some(0), 7));
        assert_eq!((resp.error, resp.rejection, resp.unrecorded), (None, None, false));
        assert_eq!(
            (resp.artifact_handle.as_deref(), resp.clamped.as_slice()),
            (Some("a"), &["memory".to_string()][..])
        );
        assert!(resp.policy_decision.allowed && resp.policy_decision.denied_reasons.is_empty());
        assert_eq!(resp.policy_decision.audit_hash, "h");
        let resp = respond(outcome(Status::Timeout, None, Some("timed out")), None);
        assert_eq!((resp.status, resp.error.as_deref()), (Status::Timeout, Some("timed out")));
    }

    #[test]
    fn a_record_not_written_fails_the_job_and_says_why() {
        let resp = respond(outcome(Status::Success, Some(0), None), Some("not recorded"));
        assert_eq!(
            (resp.status, resp.error.as_deref(), resp.unrecorded),
            (Status::Failure, Some("not recorded"), true)
        );
        assert_eq!(resp.outcome.map(|o| o.status), Some(Status::Success), "the outcome keeps what the job did");
        let resp = respond(outcome(Status::Oom, None, Some("out of memory")), Some("not recorded"));
        assert_eq!((resp.status, resp.error.as_deref()), (Status::Failure, Some("out of memory; not recorded")));
        let json = serde_json::to_value(respond(outcome(Status::Success, Some(0), None), Some("x"))).unwrap();
        assert_eq!(json["unrecorded"], true);
    }

    #[tokio::test]
    async fn output_past_the_stored_cap_is_sealed_truncated_and_the_view_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let artifacts = Artifacts::open(&Store::open(dir.path()).unwrap()).unwrap();
        let output = OutputConfig::default().with_stored_cap(4);
        let cap = Capture::start(Some(&artifacts), "r", &output, None, true);
        let stdout = capture(&b"hello world\n"[..], cap.sink(StreamName::Stdout)).await;
        let stderr = capture(&b""[..], cap.sink(StreamName::Stderr)).await;
        let req = JobRequest { runtime: "shell".into(), ..Default::default() };
        let ran = outcome(Status::Failure, Some(3), None);
        let (captured, view) = seal(cap, stdout, stderr, &ran, &req, Some(&artifacts));
        let meta = captured.artifact.clone().unwrap();
        assert_eq!((meta.job.status, meta.job.exit_code), (Some(Status::Failure), Some(3)));
        let view = view.unwrap();
        assert_eq!((view.status, view.exit_code), (Some(Status::Failure), Some(3)));
        assert_eq!(view.artifact_handle.as_deref(), captured.handle());
        let t = view.truncation.unwrap();
        assert!(t.stdout_truncated && !t.stderr_truncated, "{t:?}");
        assert_eq!((t.total_stdout_bytes, view.output_bytes), (12, 12));
    }
}
