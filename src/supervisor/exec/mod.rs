//! The governed execution pipeline, shared by `confine exec` and MCP:
//! gate → policy → executable validation → env scrub → cwd jail →
//! concurrency → sandbox with timeout and tree kill → output capture →
//! audit. Every request, allowed or not, leaves one audit record, flushed
//! before the response is returned. After a job, artifact GC may start
//! beside the response (at most once per `output.gc_interval_secs`).
//!
//! This module owns the pipeline's entry point and the types its callers
//! see, and runs the three parts in order: [`decide`] (steps 1 to 7: the
//! gate, the checks before the policy, the policy, the plan, the queue,
//! and every refusal), [`run`] (the job on the backend: its streams, its
//! progress, cancel and tree kill), [`respond`] (the job's output sealed
//! and rendered, its audit record, the answer).
//!
//! The pipeline decides; it never touches the kernel itself (the sandbox
//! backend does) and never prints (the CLI and MCP adapters do).

mod decide;
mod respond;
mod run;

use super::Supervisor;
use crate::job::{Network, Outcome, Status};
use crate::output::modes::{OutputView, RenderOptions};
use crate::store::audit::AuditEntry;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One request to run code or a command, as the CLI and MCP give it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobRequest {
    pub repo_id: Option<String>,
    pub runtime: String,
    pub executable: Option<String>,
    pub args: Vec<String>,
    pub code: Option<String>,
    pub stdin: Option<String>,
    pub relative_cwd: Option<String>,
    pub timeout_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub network: Network,
    /// Variables to set in the job; each key must be in `sandbox.env_allowlist`.
    pub env: Vec<(String, String)>,
    /// Names the caller asked to pass from an environment that does not
    /// set them: nothing is set, and each must be in the allowlist all the
    /// same, so that a refusal does not depend on what happens to be set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env_unset: Vec<String>,
    /// `false`: keep nothing of the output.
    pub persist_output: Option<bool>,
    /// Use this job id (background jobs are named before they start).
    #[serde(skip)]
    pub job_id: Option<String>,
    #[serde(flatten)]
    pub render: RenderOptions,
}

/// Why a request was refused before it ran, for adapters that map it
/// (MCP turns `Invalid` into a tool error, `Busy` into a retryable one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rejection {
    /// The request itself is wrong (bad input, unknown runtime or repo).
    Invalid,
    /// The queue is full.
    Busy,
}

/// The policy part of a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyDecisionView {
    pub allowed: bool,
    pub audit_hash: String,
    pub denied_reasons: Vec<String>,
}

/// How a request ended: one shape for `confine exec --json` and MCP.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobResponse {
    pub job_id: String,
    pub status: Status,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration_ms: u64,
    pub queued_ms: u64,
    pub artifact_handle: Option<String>,
    pub policy_decision: PolicyDecisionView,
    /// One line: why the request was denied or could not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Set when the request was refused before it ran, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Rejection>,
    /// Limits that were lowered to a configured or policy maximum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped: Vec<String>,
    /// The sandbox's outcome (layers, usage, limits), when a job ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The response mode's view of the output, when a job ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<OutputView>,
    /// The job ran and its audit record could not be written (`error`
    /// says why): its start is in the trail, its end is written before
    /// any other job runs, or marked unfinished when the store is next
    /// opened. `status` is then `failure`; `confine exec` exits 125.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unrecorded: bool,
}

/// Live progress of a running job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JobProgress {
    pub elapsed_ms: u64,
    pub bytes: u64,
}

/// What the caller of [`Supervisor::execute`] controls.
#[derive(Default)]
pub struct JobControl {
    /// Also copy the job's output as it comes: to our own stdout/stderr,
    /// or to a relayed client's.
    pub live: Option<Live>,
    /// Resolves when the caller cancels: the tree is killed at once.
    pub cancel: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Receives the byte count and elapsed time every `progress_every`.
    pub progress: Option<tokio::sync::mpsc::UnboundedSender<JobProgress>>,
    pub progress_every: Option<Duration>,
    /// Receives a copy of the output as it comes (stdout and stderr
    /// interleaved), up to [`MIRROR_CAP`] bytes: `runtime_jobs` reads it.
    pub mirror: Option<Mirror>,
}

/// Where live output goes.
#[derive(Clone)]
pub enum Live {
    /// This process's standard output and error.
    Own,
    /// Descriptors a client of the store's socket passed
    /// ([`crate::relay`]): its standard output and error.
    To { stdout: Arc<std::fs::File>, stderr: Arc<std::fs::File> },
}

/// Output seen so far by a running job, bounded.
pub type Mirror = Arc<std::sync::Mutex<Vec<u8>>>;

/// Bytes a [`Mirror`] keeps; the artifact has the rest.
pub const MIRROR_CAP: usize = 1 << 20;

impl Supervisor {
    /// Run one request through every governance step.
    pub async fn execute(&self, req: JobRequest, mut ctl: JobControl) -> JobResponse {
        // In the pipeline until answered: the idle trim waits for it.
        let _active = self.activity.enter();
        let job_id = req.job_id.clone().unwrap_or_else(crate::ids::job_id);
        // 1–7: refused requests are recorded and answered there.
        let decided = match self.decide(&job_id, &req).await {
            Ok(decided) => decided,
            Err(refused) => return *refused,
        };
        let decide::Decided { input, decision, limits, repo_id, placed, slot } = decided;
        let queued_ms = slot.queued.as_millis() as u64;
        // 8. output: the stored caps, lowered by the policy's outputBytes.
        let output = self.config.output.with_stored_cap(limits.output_bytes);
        let started = AuditEntry::decided(&job_id, &input, &decision);
        let ended = self.run_job(&started, &repo_id, &req, &output, placed, &mut ctl).await;
        // The output is sealed and rendered while the job still holds its slot.
        let ran = ended.map(|ended| ended.store_output(&req));
        tracing::debug!("job ended and output stored");
        drop(slot);
        let ran = match ran {
            Ok(ran) => ran,
            Err(e) => return self.deny(job_id, &input, &decision, Status::Failure, e.to_string()),
        };
        // 9. audit, flushed before we answer.
        self.respond(job_id, queued_ms, started, &decision, limits.clamped, ran).await
    }

    /// Jobs running and waiting right now.
    pub fn load(&self) -> (usize, usize) {
        (self.queue.running(), self.queue.queued())
    }
}
