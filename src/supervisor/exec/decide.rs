//! Steps 1 to 7 of the pipeline, up to a job ready to start: the config
//! gate, the checks before the policy, the policy's decision, the plan
//! ([`super::super::plan`]), a slot in the queue and the job's spec; and
//! every refusal on the way, each recorded in the audit trail and
//! answered here ([`Supervisor::deny`] also answers a job that was let
//! through and could not start).

use super::{JobRequest, JobResponse, PolicyDecisionView, Rejection};
use crate::config::EffectiveLimits;
use crate::job::Status;
use crate::policy::input::PolicyInput;
use crate::policy::Decision;
use crate::runtimes;
use crate::store::audit::{AuditEntry, AuditError, AuditSink};
use crate::store::StoreError;
use crate::supervisor::plan::{self, Placed};
use crate::supervisor::queue::Slot;
use crate::supervisor::Supervisor;
use std::time::Duration;

/// A request let through: what the policy saw and decided, the limits in
/// force, and the job placed, holding its slot in the queue.
pub(super) struct Decided {
    pub input: PolicyInput,
    pub decision: Decision,
    pub limits: EffectiveLimits,
    pub repo_id: String,
    pub placed: Placed,
    /// Held until the job has ended and its output is stored.
    pub slot: Slot,
}

impl Supervisor {
    /// Steps 1 to 7. A refused request is recorded and its answer
    /// returned as the error.
    pub(super) async fn decide(&self, job_id: &str, req: &JobRequest) -> Result<Decided, Box<JobResponse>> {
        let policy_req = plan::policy_request(req, &self.config.network);
        let mut limits = self.config.resolve_limits(&policy_req.limits);
        let command = req.executable.clone().unwrap_or_else(|| {
            runtimes::lookup(&req.runtime)
                .map(|rt| runtimes::plan::requested_command(rt, None, req.code.is_some()).to_string())
                .unwrap_or_else(|_| req.runtime.clone())
        });
        let input = policy_req.to_input(&command, limits.clone());
        let digest = self.policy.digest().to_string();
        let deny =
            |decision: &Decision, status, error| Box::new(self.deny(job_id.into(), &input, decision, status, error));
        let reject = |why, decision: &Decision, error| {
            Box::new(self.reject(why, job_id.into(), &input, decision, Status::Failure, error))
        };

        // 1. the config gate: nothing else runs while execution is off.
        if !self.config.runtime.enabled {
            let decision = Decision::disabled(&input, &digest);
            return Err(deny(&decision, Status::Denied, crate::policy::DISABLED_REASON.into()));
        }
        // Bad input, an unknown runtime or repo: refused before the policy
        // sees the request, and still audited.
        let planner = self.planner();
        let admitted = match planner.admit(req, &policy_req) {
            Ok(a) => a,
            Err(e) => {
                let e = e.to_string();
                let decision = Decision::rejected(&input, e.clone(), &digest);
                return Err(reject(Rejection::Invalid, &decision, e));
            }
        };

        // 2. policy (fail-closed).
        // A server evaluates on a blocking thread (a slow policy or a remote
        // OPA must not hold a runtime worker); a one-shot CLI has nothing
        // else to run and saves the thread's start.
        let decision =
            if self.one_shot { self.policy.decide(&input) } else { self.policy.decide_async(input.clone()).await };
        tracing::debug!(allowed = decision.allowed, "policy decided");
        if let Some(msg) = decision.denial_message(&command) {
            return Err(deny(&decision, Status::Denied, msg));
        }
        limits.clamp_to(&decision.limits);

        // 3–5. executable validation and toolchain, environment, cwd jail.
        let prepared = match planner.prepare(req, &admitted) {
            Ok(p) => p,
            Err(r) => return Err(deny(&decision, r.status, r.message)),
        };
        tracing::debug!("toolchain resolved");

        // 6. concurrency: the queue wait counts against the timeout.
        let timeout = Duration::from_millis(limits.timeout_ms);
        let slot = match self.queue.acquire(timeout).await {
            Ok(slot) => slot,
            Err(e) => return Err(reject(Rejection::Busy, &decision, e.to_string())),
        };

        // 7. the sandbox, with the timeout that is left after the wait.
        let placed = match planner.place(req, &prepared, &limits, slot.remaining(timeout)) {
            Ok(placed) => placed,
            Err(r) => return Err(deny(&decision, r.status, r.message)),
        };
        Ok(Decided { input, decision, limits, repo_id: admitted.repo.id, placed, slot })
    }

    /// Record a request that did not run, and answer it.
    pub(super) fn deny(
        &self,
        job_id: String,
        input: &PolicyInput,
        decision: &Decision,
        status: Status,
        error: String,
    ) -> JobResponse {
        let mut entry = AuditEntry::decided(&job_id, input, decision);
        entry.status = status;
        let mut resp = not_run(job_id, status, decision, error);
        if let Err(e) = self.audit(entry) {
            resp.error = Some(unaudited(resp.error.unwrap_or_default(), &e.to_string()));
        }
        resp
    }

    /// Append `entry` to the audit trail (flushed before it returns).
    fn audit(&self, entry: AuditEntry) -> Result<(), NotAudited> {
        let stores = self.stores()?;
        stores.audit.append(entry).map(drop).map_err(|e| match e {
            AuditError::Store(StoreError::Full { free, .. }) => NotAudited::Full { free },
            e => NotAudited::Audit(e),
        })
    }

    fn reject(
        &self,
        why: Rejection,
        job_id: String,
        input: &PolicyInput,
        decision: &Decision,
        status: Status,
        error: String,
    ) -> JobResponse {
        JobResponse { rejection: Some(why), ..self.deny(job_id, input, decision, status, error) }
    }
}

/// A response for a request that never ran.
fn not_run(job_id: String, status: Status, decision: &Decision, error: String) -> JobResponse {
    JobResponse {
        job_id,
        status,
        exit_code: None,
        signal: None,
        duration_ms: 0,
        queued_ms: 0,
        artifact_handle: None,
        policy_decision: PolicyDecisionView {
            allowed: decision.allowed,
            audit_hash: decision.audit_hash.clone(),
            denied_reasons: decision.deny_reasons.clone(),
        },
        error: Some(error),
        rejection: None,
        clamped: Vec::new(),
        outcome: None,
        output: None,
        unrecorded: false,
    }
}

/// A refusal's `error` when its audit record could not be written either.
fn unaudited(error: String, audit_error: &str) -> String {
    // A job stopped because the store failed already says why.
    if error.contains(audit_error) {
        format!("{error} (no audit record was written)")
    } else {
        format!("{error} (and the audit record was not written: {audit_error})")
    }
}

/// Why a request's audit record was not written.
#[derive(Debug, thiserror::Error)]
enum NotAudited {
    #[error(transparent)]
    Stores(#[from] crate::supervisor::SupervisorError),
    #[error("no room for it on the store's disk ({free} bytes free; see store.min_free_bytes)")]
    Full { free: u64 },
    #[error(transparent)]
    Audit(AuditError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::sandbox::BackendChoice;
    use crate::store::Store;
    use crate::supervisor::exec::JobControl;

    /// A supervisor on a store in `dir`; its backend is the fallback, so
    /// that opening it needs neither root nor a seccomp profile.
    fn supervisor(dir: &std::path::Path, enabled: bool) -> Supervisor {
        let mut config = Config::default();
        config.runtime.enabled = enabled;
        config.runtime.backend = BackendChoice::UnixFallback;
        config.runtime.allow_degraded = true;
        Supervisor::with_store(config, Store::open(dir).unwrap()).unwrap()
    }

    fn request(runtime: &str) -> JobRequest {
        JobRequest {
            repo_id: Some("r".into()),
            runtime: runtime.into(),
            code: Some("true".into()),
            ..Default::default()
        }
    }

    /// The one record of the trail.
    fn recorded(sup: &Supervisor) -> AuditEntry {
        let records = sup.stores().unwrap().audit.list(10).unwrap();
        assert_eq!(records.len(), 1, "{records:?}");
        records[0].entry.clone()
    }

    #[tokio::test]
    async fn a_disabled_runtime_is_denied_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let sup = supervisor(dir.path(), false);
        let resp = sup.execute(request("shell"), JobControl::default()).await;
        assert_eq!(resp.status, Status::Denied);
        assert_eq!(resp.error.as_deref(), Some(crate::policy::DISABLED_REASON));
        assert_eq!(resp.rejection, None);
        assert!(!resp.policy_decision.allowed);
        assert_eq!(resp.policy_decision.denied_reasons, [crate::policy::DISABLED_REASON]);
        assert!(resp.outcome.is_none() && resp.output.is_none() && resp.artifact_handle.is_none());
        let entry = recorded(&sup);
        assert_eq!((entry.id.as_str(), entry.status, entry.allowed), (resp.job_id.as_str(), Status::Denied, false));
        assert_eq!(entry.audit_hash, resp.policy_decision.audit_hash);
    }

    #[tokio::test]
    async fn an_unknown_runtime_is_rejected_as_invalid_and_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let sup = supervisor(dir.path(), true);
        let resp = sup.execute(request("cobol"), JobControl::default()).await;
        assert_eq!(resp.status, Status::Failure);
        assert_eq!(resp.rejection, Some(Rejection::Invalid));
        let error = resp.error.clone().unwrap();
        assert!(error.starts_with("unknown runtime 'cobol'"), "{error}");
        assert_eq!(resp.policy_decision.denied_reasons, [error]);
        let json = serde_json::to_value(&resp).unwrap();
        assert_eq!(json["rejection"], "invalid");
        assert!(json.get("outcome").is_none() && json.get("unrecorded").is_none(), "{json}");
        assert_eq!(recorded(&sup).status, Status::Failure);
    }

    #[test]
    fn a_refusal_whose_record_failed_says_so_once() {
        let full = "no room for it on the store's disk (0 bytes free; see store.min_free_bytes)";
        assert_eq!(
            unaudited("denied by policy: no".into(), full),
            format!("denied by policy: no (and the audit record was not written: {full})")
        );
        // The error already names the store's failure: not repeated.
        assert_eq!(
            unaudited(format!("cannot start the job: {full}"), full),
            format!("cannot start the job: {full} (no audit record was written)")
        );
    }
}
