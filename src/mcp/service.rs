//! The seam between the MCP adapter and the governed execution pipeline:
//! the [`RuntimeService`] trait, the per-call [`ExecControl`], and the
//! [`ServiceError`] every operation can end with.
//!
//! The MCP server only translates protocol to these calls; everything that
//! decides (config gate, policy, runtime validation, env scrubbing, cwd jail,
//! queueing, sandbox, artifacts, audit) lives behind this trait. Nothing
//! here may spawn a process or touch the store.

use super::access::Caller;
use super::types::{
    ExecuteRequest, ExecuteResponse, Info, JobsRequest, JobsResponse, QueryOutputRequest, QueryOutputResponse,
};
use super::usage::{UsageSnapshot, UsageStatsRequest};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The operations the MCP tools need. Implemented by the real supervisor
/// (`real.rs`) and, in tests, by `fake::FakeService` (a test double).
///
/// Every method is cancel-safe in the sense that the server may drop its
/// future when the transport dies; `execute` must then still kill its job
/// (hold a kill-on-drop guard, or watch `ctl.cancel`, which fires too).
#[async_trait]
pub trait RuntimeService: Send + Sync + 'static {
    /// Run one job through the governance pipeline and wait for it, or, with
    /// `background: true`, start it and return at once with `status:
    /// running` and a `jobId`. The job belongs to `ctl.caller`, who must
    /// be allowed the request's repository.
    ///
    /// A denial by policy should be `Ok` with `status: denied` and the
    /// policy decision (it carries the audit hash); `Err` is for calls that
    /// never reached policy (bad arguments, unknown runtime, gate closed).
    async fn execute(&self, req: ExecuteRequest, ctl: ExecControl) -> Result<ExecuteResponse, ServiceError>;

    /// Search or slice a stored output artifact. Only an artifact of a
    /// repository `caller` may use; any other is `not_found`, as if it did
    /// not exist (a handle is not a capability).
    async fn query_output(&self, req: QueryOutputRequest, caller: &Caller)
        -> Result<QueryOutputResponse, ServiceError>;

    /// List `caller`'s recent jobs, or one of them with its output from an
    /// offset; another caller's job is `not_found`.
    async fn jobs(&self, req: JobsRequest, caller: &Caller) -> Result<JobsResponse, ServiceError>;

    /// Kill a running job of `caller` (its whole tree) and return how it
    /// ended; another caller's job is `not_found`. Killing a job that
    /// already ended returns its final outcome unchanged.
    async fn kill(&self, job_id: &str, caller: &Caller) -> Result<ExecuteResponse, ServiceError>;

    /// What this host and configuration offer: runtimes, isolation layers,
    /// limits, policy digest. `repo_id` narrows it to one workspace.
    async fn info(&self, repo_id: Option<&str>) -> Result<Info, ServiceError>;

    /// The one repository configured, when there is exactly one: a call
    /// may then leave `repoId` out. The default knows none.
    fn sole_repo(&self) -> Option<String> {
        None
    }

    /// Hook for `usage_stats` with scope `history`/`both`: the usage that
    /// earlier sessions recorded. `Ok(None)` means "no history store".
    async fn usage_history(&self, _req: &UsageStatsRequest) -> Result<Option<UsageSnapshot>, ServiceError> {
        Ok(None)
    }

    /// Hook to persist this session's usage (`usage_stats` with
    /// `persist: true`, and at shutdown). The default keeps nothing.
    async fn record_usage(&self, _session: &UsageSnapshot) -> Result<(), ServiceError> {
        Ok(())
    }

    /// The server is stopping: kill every running job, background ones
    /// included, and flush what must survive. Called once, after the
    /// transports stopped accepting calls.
    async fn shutdown(&self) {}
}

/// Per-call control handed to [`RuntimeService::execute`].
#[derive(Debug, Clone)]
pub struct ExecControl {
    /// Fires when the client cancels the call (`notifications/cancelled`),
    /// disconnects, or the server shuts down. It also fires once the call
    /// has been answered, so a background job must stop watching it when
    /// `execute` returns.
    pub cancel: CancellationToken,
    /// Where the job reports how far it got; the server turns the latest
    /// value into `notifications/progress` when the client asked for them.
    pub progress: Option<ProgressSink>,
    /// Who asked: the job is theirs (`runtime_jobs`, `runtime_kill`).
    pub caller: Caller,
}

impl ExecControl {
    /// A control with a fresh token, no progress sink, and the local
    /// caller (CLI, tests).
    pub fn detached() -> Self {
        ExecControl { cancel: CancellationToken::new(), progress: None, caller: Caller::local() }
    }

    /// Report progress if anyone listens; never blocks.
    pub fn report(&self, progress: Progress) {
        if let Some(sink) = &self.progress {
            sink.update(progress);
        }
    }
}

/// How far a running job got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Time since the call was admitted (queue wait included).
    pub elapsed_ms: u64,
    /// stdout + stderr bytes produced so far.
    pub bytes: u64,
}

/// The sending half of a progress channel: only the latest value is kept,
/// so a fast job never waits for a slow client.
#[derive(Debug, Clone)]
pub struct ProgressSink(std::sync::Arc<watch::Sender<Progress>>);

impl ProgressSink {
    /// A sink and the receiver that reads its latest value.
    pub fn channel() -> (ProgressSink, watch::Receiver<Progress>) {
        let (tx, rx) = watch::channel(Progress::default());
        (ProgressSink(std::sync::Arc::new(tx)), rx)
    }

    /// Replace the latest value.
    pub fn update(&self, progress: Progress) {
        self.0.send_replace(progress);
    }
}

/// Why an operation did not produce a result. The `status` strings are
/// stable: agents and tests match on them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The arguments are malformed, out of range, or contradict each other.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The config gate, policy or a validation rule refused the call.
    #[error("denied: {0}")]
    Denied(String),
    /// No such job or artifact (or it expired).
    #[error("not_found: {0}")]
    NotFound(String),
    /// The concurrency limit is reached and the queue is full.
    #[error("busy: {0}")]
    Busy(String),
    /// The call was cancelled before it produced a result.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// confine itself failed (store, sandbox setup); never the job's fault.
    #[error("error: {0}")]
    Internal(String),
}

impl ServiceError {
    /// The stable status string: `invalid`, `denied`, `not_found`, `busy`,
    /// `cancelled` or `error`.
    pub fn status(&self) -> &'static str {
        match self {
            ServiceError::Invalid(_) => "invalid",
            ServiceError::Denied(_) => "denied",
            ServiceError::NotFound(_) => "not_found",
            ServiceError::Busy(_) => "busy",
            ServiceError::Cancelled(_) => "cancelled",
            ServiceError::Internal(_) => "error",
        }
    }

    /// The message without the status prefix.
    pub fn message(&self) -> &str {
        match self {
            ServiceError::Invalid(m)
            | ServiceError::Denied(m)
            | ServiceError::NotFound(m)
            | ServiceError::Busy(m)
            | ServiceError::Cancelled(m)
            | ServiceError::Internal(m) => m,
        }
    }

    /// `status: message` on one line, at most 300 characters: what a tool
    /// error shows. Newlines (a serde error quoting input, a multi-line
    /// source error) are folded so a client renders one line.
    pub fn one_line(&self) -> String {
        let mut text = String::with_capacity(self.message().len() + 12);
        text.push_str(self.status());
        text.push_str(": ");
        for (i, c) in self.message().chars().enumerate() {
            if i >= 300 {
                text.push('…');
                break;
            }
            text.push(if c.is_control() { ' ' } else { c });
        }
        text
    }
}
