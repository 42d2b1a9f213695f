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
