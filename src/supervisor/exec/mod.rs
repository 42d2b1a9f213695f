//! The governed execution pipeline, shared by `confine exec` and MCP:
//! gate → policy → executable validation → env scrub → cwd jail →
//! concurrency → sandbox with timeout and tree kill → output capture →
//! audit. Every request, allowed or not, leaves one audit record, flushed
//! before the response is returned. After a job, artifact GC may start
//! beside the response (at most once per `output.gc_interval_secs`).
//!
//! This module decides; it never touches the kernel itself (the sandbox
//! backend does) and never prints (the CLI and MCP adapters do).

use super::plan::{self, Placed};
use super::{Prestart, Supervisor};
use crate::job::{Network, Outcome, Status};
use crate::output::capture::{capture, capture_pipe, Capture, Captured, StreamSink, StreamSummary};
use crate::output::modes::{render, OutputView, RenderOptions};
use crate::output::redact::{RedactStream, Redactor};
use crate::output::OutputConfig;
use crate::policy::input::PolicyInput;
use crate::policy::Decision;
use crate::runtimes;
use crate::sandbox::{Backend, BackendKind, Job, Launch, Stop, Teardown, DEFAULT_KILL_GRACE};
use crate::store::artifacts::{JobInfo, StreamName};
use crate::store::audit::{AuditEntry, AuditError, AuditSink};
use crate::store::StoreError;
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

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

/// What a job that ran left: its outcome, its captured output, the view,
/// and its cgroups' removal, still under way.
type Ran = (Outcome, Captured, Option<OutputView>, Teardown);

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

impl Live {
    fn write(&self, stream: StreamName, bytes: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        match (self, stream) {
            (Live::Own, StreamName::Stdout) => std::io::stdout().lock().write_all(bytes),
            (Live::Own, StreamName::Stderr) => std::io::stderr().lock().write_all(bytes),
            // Never blocked for long by a client whose reader stopped.
            (Live::To { stdout, .. }, StreamName::Stdout) => crate::relay::Unstalled(&**stdout).write_all(bytes),
            (Live::To { stderr, .. }, StreamName::Stderr) => crate::relay::Unstalled(&**stderr).write_all(bytes),
        }
    }
}

/// Output seen so far by a running job, bounded.
pub type Mirror = Arc<std::sync::Mutex<Vec<u8>>>;

/// Bytes a [`Mirror`] keeps; the artifact has the rest.
pub const MIRROR_CAP: usize = 1 << 20;

/// What a job's output passes through before capture: a byte count (for
/// progress), the mirror, and in live mode a copy to our own terminal.
struct Tap {
    count: Arc<AtomicU64>,
    live: Option<(StreamName, Live)>,
    mirror: Option<Mirror>,
    /// The mirror is returned to callers (`runtime_jobs`): it is redacted
    /// like the stored output. (Live output is the operator's own terminal.)
    mirror_redact: Option<RedactStream>,
}

impl Tap {
    fn new(count: &Arc<AtomicU64>, stream: StreamName, ctl: &JobControl, r: Option<&Redactor>) -> Self {
        let live = ctl.live.clone().map(|l| (stream, l));
        Tap { count: count.clone(), live, mirror: ctl.mirror.clone(), mirror_redact: r.map(Redactor::stream) }
    }

    /// What was just read: count it, mirror it, echo it live. `eof`: the
    /// stream ended (the redacting mirror flushes its carry).
    fn observe(&mut self, new: &[u8], eof: bool) {
        self.count.fetch_add(new.len() as u64, Ordering::Relaxed);
        if let Some(m) = &self.mirror {
            mirror_append(m, new, eof, self.mirror_redact.as_mut());
        }
        if let Some((stream, live)) = &self.live {
            // A closed terminal must not stop the capture; a client's
            // output that failed or stalled is given up.
            if live.write(*stream, new).is_err() && matches!(live, Live::To { .. }) {
                self.live = None;
            }
        }
    }
}

/// Append what was read to the mirror while it has room.
fn mirror_append(mirror: &Mirror, new: &[u8], eof: bool, redact: Option<&mut RedactStream>) {
    let Ok(mut m) = mirror.lock() else { return };
    let room = MIRROR_CAP.saturating_sub(m.len());
    match redact {
        _ if room == 0 => {}
        None => m.extend_from_slice(&new[..new.len().min(room)]),
        Some(r) => {
            let mut out = Vec::with_capacity(new.len() + 16);
            if eof {
                r.finish(&mut out);
            } else {
                r.push(new, &mut out);
            }
            m.extend_from_slice(&out[..out.len().min(room)]);
        }
    }
}

/// The size asked for each of a job's output pipes.
const JOB_PIPE_BYTES: i32 = 1 << 20;

/// Capture one of the job's pipes, handed back by tokio as a blocking fd,
/// with blocking reads on a thread of its own ([`capture_pipe`]).
async fn capture_job_pipe(
    pipe: std::io::Result<std::os::fd::OwnedFd>,
    mut tap: Tap,
    sink: StreamSink,
) -> StreamSummary {
    match pipe {
        Ok(fd) => {
            // A 1 MiB pipe instead of 64 KiB: a flood of small writes drains
            // in fewer, larger reads (docs/benchmarks.md, "Figures once in
            // the code"). Best effort: past the user's pipe
            // quota (fs.pipe-user-pages-soft) the kernel refuses, and 64 KiB
            // still works.
            let _ = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETPIPE_SZ(JOB_PIPE_BYTES));
            capture_pipe(fd, move |new, eof| tap.observe(new, eof), sink).await
        }
        // tokio could not deregister the pipe (it never fails in practice);
        // the job's writes now fail with EPIPE, and the outcome says why.
        Err(e) => {
            let mut summary = capture(tokio::io::empty(), sink).await;
            summary.error = Some(format!("reading {}: cannot take the pipe from the runtime: {e}", summary.stream));
            summary
        }
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

impl Supervisor {
    /// Run one request through every governance step.
    pub async fn execute(&self, req: JobRequest, mut ctl: JobControl) -> JobResponse {
        let job_id = req.job_id.clone().unwrap_or_else(crate::ids::job_id);
        let policy_req = plan::policy_request(&req, &self.config.network);
        let mut limits = self.config.resolve_limits(&policy_req.limits);
        let command = req.executable.clone().unwrap_or_else(|| {
            runtimes::lookup(&req.runtime)
                .map(|rt| runtimes::plan::requested_command(rt, None, req.code.is_some()).to_string())
                .unwrap_or_else(|_| req.runtime.clone())
        });
        let input = policy_req.to_input(&command, limits.clone());
        let digest = self.policy.digest().to_string();

        // 1. the config gate: nothing else runs while execution is off.
        if !self.config.runtime.enabled {
            let decision = Decision::disabled(&input, &digest);
            return self.deny(job_id, &input, &decision, Status::Denied, crate::policy::DISABLED_REASON.into());
        }
        // Bad input, an unknown runtime or repo: refused before the policy
        // sees the request, and still audited.
        let planner = self.planner();
        let admitted = match planner.admit(&req, &policy_req) {
            Ok(a) => a,
            Err(e) => {
                let e = e.to_string();
                let decision = Decision::rejected(&input, e.clone(), &digest);
                return self.reject(Rejection::Invalid, job_id, &input, &decision, Status::Failure, e);
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
            return self.deny(job_id, &input, &decision, Status::Denied, msg);
        }
        limits.clamp_to(&decision.limits);

        // 3–5. executable validation and toolchain, environment, cwd jail.
        let prepared = match planner.prepare(&req, &admitted) {
            Ok(p) => p,
            Err(r) => return self.deny(job_id, &input, &decision, r.status, r.message),
        };
        tracing::debug!("toolchain resolved");

        // 6. concurrency: the queue wait counts against the timeout.
        let timeout = Duration::from_millis(limits.timeout_ms);
        let slot = match self.queue.acquire(timeout).await {
            Ok(slot) => slot,
            Err(e) => return self.reject(Rejection::Busy, job_id, &input, &decision, Status::Failure, e.to_string()),
        };

        // 7. the sandbox, with the timeout that is left after the wait.
        let placed = match planner.place(&req, &prepared, &limits, slot.remaining(timeout)) {
            Ok(placed) => placed,
            Err(r) => return self.deny(job_id, &input, &decision, r.status, r.message),
        };
        let queued_ms = slot.queued.as_millis() as u64;
        // 8. output: the stored caps, lowered by the policy's outputBytes.
        let output = self.config.output.with_stored_cap(limits.output_bytes);
        let started = AuditEntry::decided(&job_id, &input, &decision);
        let response = self.run_job(&started, &admitted.repo.id, &req, &output, placed, &mut ctl).await;
        tracing::debug!("job ended and output stored");
        drop(slot);
        let (outcome, captured, output, teardown) = match response {
            Ok(parts) => parts,
            Err(e) => return self.deny(job_id, &input, &decision, Status::Failure, e.to_string()),
        };
        let mut outcome = outcome;
        outcome.queued_ms = queued_ms;
        outcome.job_id = job_id.clone();

        // 9. audit, flushed before we answer.
        let entry = started.finished(&outcome, captured.stdout.meta.total_bytes, captured.stderr.meta.total_bytes);
        let audit_error = self.audit_finished(entry);
        tracing::debug!("audit record flushed");
        // The job's cgroups were removed meanwhile, on another thread.
        teardown.finish().await;
        // The artifact and the audit record are flushed: GC may run beside the answer.
        self.collect_garbage_if_due();
        JobResponse {
            job_id,
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            duration_ms: outcome.duration_ms,
            queued_ms,
            artifact_handle: captured.handle().map(str::to_string),
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
            clamped: limits.clamped.clone(),
            unrecorded: audit_error.is_some(),
            status: if audit_error.is_some() { Status::Failure } else { outcome.status },
            outcome: Some(outcome),
            output,
        }
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

    /// Start the job on the supervisor's backend.
    async fn start(&self, job_id: &str, job: Placed, prestart: Prestart) -> Result<Box<dyn Job>, NotStarted> {
        // Refused when the supervisor was opened; an error here, never a panic.
        if !matches!(self.backend, BackendKind::Linux | BackendKind::UnixFallback) {
            return Err(NotStarted::Backend(self.backend.name()));
        }
        // What a one-shot supervisor started early: the sandbox of this
        // very job (built before the decision, from the spec the pipeline
        // has now worked out again), or a stage with this job's streams.
        // Anything else is dropped here, which kills it unreleased.
        let early = self.prestarted.lock().ok().and_then(|mut p| p.take()).and_then(|p| p.matching(prestart));
        let launch =
            Launch { job_id: Some(job_id), seccomp: self.seccomp.as_ref(), early, private_tmp: job.fallback_tmp };
        self.backend
            .spawn(&job.spec, prestart.stdio(), launch)
            .await
            .map_err(|e| NotStarted::Sandbox(crate::sandbox::describe_start_error(&e)))
    }

    /// Start the sandbox, capture both streams, enforce the limits.
    async fn run_job(
        &self,
        started_entry: &AuditEntry,
        repo_id: &str,
        req: &JobRequest,
        output: &OutputConfig,
        mut placed: Placed,
        ctl: &mut JobControl,
    ) -> Result<Ran, NotStarted> {
        let persist = req.persist_output.unwrap_or(true);
        // Secrets: the listed variables' values, and what the caller passes
        // to the job under a secret-like name (API_TOKEN, DB_PASSWORD, …).
        let redactor = output.job_redactor(&req.env, |k| std::env::var(k).ok());
        let streams = Prestart { stdin_piped: req.stdin.is_some() };
        // A store still opening (`Supervisor::open_deferred`): the Linux
        // sandbox is built meanwhile and its job held before execve; other
        // backends wait for the store first. No job runs unaudited.
        let hold = self.backend == BackendKind::Linux && !self.stores.is_ready();
        placed.spec.hold = hold;
        // No job starts without room for its output and its record, and
        // without its start in the trail.
        let job_id = started_entry.id.as_str();
        if !hold {
            let stores = self.stores.wait().await?;
            stores.admit(started_entry)?;
        }
        let mut job = self.start(job_id, placed, streams).await?;
        // Ready at once unless the job is held (for the store, or built
        // before the decision). On error the held job is dropped
        // unreleased, which kills its tree.
        let stores = self.stores.wait().await?;
        if hold {
            stores.admit(started_entry)?;
        }
        if job.held() {
            job.release().await.map_err(NotStarted::Release)?;
        }
        let cap = Capture::start(Some(&stores.artifacts), repo_id, output, redactor.clone(), persist);
        let started = Instant::now();
        let count = Arc::new(AtomicU64::new(0));
        let r = redactor.as_ref();
        let out = job.stdout_pipe().map(|p| (p, Tap::new(&count, StreamName::Stdout, ctl, r)));
        let err = job.stderr_pipe().map(|p| (p, Tap::new(&count, StreamName::Stderr, ctl, r)));
        if let (Some(text), Some(mut stdin)) = (req.stdin.clone(), job.take_stdin()) {
            tokio::spawn(async move {
                // A job that does not read its stdin must not block us.
                let _ = stdin.write_all(text.as_bytes()).await;
            });
        }
        let (out_sink, err_sink) = (cap.sink(StreamName::Stdout), cap.sink(StreamName::Stderr));
        let out_task = tokio::spawn(async move {
            match out {
                Some((pipe, tap)) => Some(capture_job_pipe(pipe, tap, out_sink).await),
                None => None,
            }
        });
        let err_task = tokio::spawn(async move {
            match err {
                Some((pipe, tap)) => Some(capture_job_pipe(pipe, tap, err_sink).await),
                None => None,
            }
        });
        let progress = ctl.progress.take().map(|tx| {
            let every = ctl.progress_every.unwrap_or(Duration::from_secs(2));
            let count = count.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let p = JobProgress {
                        elapsed_ms: started.elapsed().as_millis() as u64,
                        bytes: count.load(Ordering::Relaxed),
                    };
                    if tx.send(p).is_err() {
                        break;
                    }
                }
            })
        });
        let cancel = ctl.cancel.take();
        // Cancelling kills the whole tree at once, with the default grace
        // for a stage that does not die.
        let stop = Box::pin(async move {
            match cancel {
                Some(c) => c.await,
                None => std::future::pending::<()>().await,
            }
            Stop::Kill
        });
        let (outcome, teardown) = job.supervise(DEFAULT_KILL_GRACE, stop).await;
        if let Some(p) = progress {
            p.abort();
        }
        let empty = |s| cap.sink(s);
        let stdout = match out_task.await {
            Ok(Some(s)) => s,
            _ => capture(tokio::io::empty(), empty(StreamName::Stdout)).await,
        };
        let stderr = match err_task.await {
            Ok(Some(s)) => s,
            _ => capture(tokio::io::empty(), empty(StreamName::Stderr)).await,
        };
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
        let view = render(&captured, Some(&stores.artifacts), &info, &req.render).ok();
        Ok((outcome, captured, view, teardown))
    }

    /// Record a request that did not run, and answer it.
    fn deny(
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
            let e = e.to_string();
            let error = resp.error.unwrap_or_default();
            // A job stopped because the store failed already says why.
            resp.error = Some(if error.contains(&e) {
                format!("{error} (no audit record was written)")
            } else {
                format!("{error} (and the audit record was not written: {e})")
            });
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

    /// Jobs running and waiting right now.
    pub fn load(&self) -> (usize, usize) {
        (self.queue.running(), self.queue.queued())
    }
}

/// Why a job the pipeline let through did not run.
#[derive(Debug, thiserror::Error)]
enum NotStarted {
    /// The store is not there to record it.
    #[error(transparent)]
    Stores(#[from] super::SupervisorError),
    #[error(transparent)]
    Admit(#[from] super::stores::AdmitError),
    /// The sandbox failed to start, described with what to do when it
    /// ran out of file descriptors ([`crate::sandbox::describe_start_error`]).
    #[error("{0}")]
    Sandbox(String),
    #[error("the {0} backend is not available here")]
    Backend(&'static str),
    /// The held job could not be let go.
    #[error("cannot start the job: {0}")]
    Release(crate::sandbox::SandboxError),
}

/// Why a request's audit record was not written.
#[derive(Debug, thiserror::Error)]
enum NotAudited {
    #[error(transparent)]
    Stores(#[from] super::SupervisorError),
    #[error("no room for it on the store's disk ({free} bytes free; see store.min_free_bytes)")]
    Full { free: u64 },
    #[error(transparent)]
    Audit(AuditError),
}
