//! One simulated job: its state, the interpreter loop that honours the
//! timeout, cancellation and kill, and the response it ends with.

use super::render;
use super::script::Step;
use super::{decision, DEFAULT_TIMEOUT_MS, MAX_OUTPUT_BYTES};
use crate::mcp::service::{ExecControl, Progress};
use crate::mcp::types::*;
use serde_json::json;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub(super) struct Job {
    pub(super) id: String,
    pub(super) req: ExecuteRequest,
    pub(super) started_at_ms: u64,
    pub(super) started: Instant,
    pub(super) out: Mutex<Buffers>,
    /// Fires on runtime_kill and at shutdown.
    pub(super) kill: CancellationToken,
    /// The final response, once the job ended.
    pub(super) done: watch::Sender<Option<ExecuteResponse>>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct Buffers {
    pub(super) stdout: String,
    pub(super) stderr: String,
    pub(super) truncated: bool,
}

/// How a simulated job ended.
pub(super) enum End {
    Exit(i32),
    Timeout,
    Cancelled,
    Killed,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The outcome of a finished job, shaped by its output mode; storing the
/// output as an artifact is the service's business.
pub(super) fn respond(job: &Job, end: End) -> (ExecuteResponse, Buffers) {
    let req = &job.req;
    let (status, exit_code, signal) = match end {
        End::Exit(0) => (ExecStatus::Success, Some(0), None),
        End::Exit(n) => (ExecStatus::Failure, Some(n), None),
        End::Timeout => (ExecStatus::Timeout, None, Some(9)),
        End::Cancelled => (ExecStatus::Cancelled, None, Some(9)),
        End::Killed => (ExecStatus::Killed, None, Some(9)),
    };
    let out = lock(&job.out).clone();
    let mut r = ExecuteResponse::bare(status);
    r.job_id = Some(job.id.clone());
    r.exit_code = exit_code;
    r.signal = signal;
    r.duration_ms = job.started.elapsed().as_millis() as u64;
    r.policy_decision = decision(req, Vec::new());
    r.backend = Some("fake".into());
    r.layers = Some(json!({"note": "fake service: nothing was isolated"}));
    r.output_lines = Some((out.stdout.lines().count() + out.stderr.lines().count()) as u64);
    r.output_bytes = Some((out.stdout.len() + out.stderr.len()) as u64);
    // As the real service: a small output is in the answer itself.
    let cap = req.inline_bytes.unwrap_or(crate::output::modes::DEFAULT_INLINE_BYTES) as usize;
    if !out.truncated && out.stdout.len() + out.stderr.len() <= cap {
        let trimmed = |s: &str| (!s.is_empty()).then(|| s.strip_suffix('\n').unwrap_or(s).to_string());
        r.stdout = trimmed(&out.stdout);
        r.stderr = trimmed(&out.stderr);
    }
    let truncation = Truncation {
        stdout_truncated: out.truncated,
        stderr_truncated: out.truncated,
        total_stdout_bytes: out.stdout.len() as u64,
        total_stderr_bytes: out.stderr.len() as u64,
    };
    let terms = req.query_terms.clone().unwrap_or_default();
    let max_lines = req.max_response_lines.unwrap_or(100) as usize;
    let excerpts = || {
        let (mut ex, _) = render::excerpts(Stream::Stdout, &out.stdout, &terms, 3, 10);
        ex.extend(render::excerpts(Stream::Stderr, &out.stderr, &terms, 3, 10).0);
        ex
    };
    match req.output_mode {
        OutputMode::Minimal => {}
        OutputMode::Summary => {
            let (stdout, cut_out) = render::head_tail(&out.stdout, max_lines);
            let (stderr, cut_err) = render::tail(&out.stderr, max_lines);
            r.stdout_summary = Some(stdout);
            r.stderr_summary = Some(stderr);
            r.excerpts = Some(excerpts());
            r.truncation = Some(Truncation {
                stdout_truncated: out.truncated || cut_out,
                stderr_truncated: out.truncated || cut_err,
                ..truncation
            });
        }
        OutputMode::Intent => {
            r.excerpts = Some(excerpts());
            r.truncation = Some(truncation);
        }
        OutputMode::Digest => r.digest = Some(render::digest(&out.stdout, &out.stderr)),
    }
    (r, out)
}

/// Marks a foreground job cancelled if its call is dropped mid-run (the
/// transport died), so it never shows as running forever.
pub(super) struct DoneGuard<'a>(pub(super) &'a Job);

impl Drop for DoneGuard<'_> {
    fn drop(&mut self) {
        self.0.done.send_if_modified(|d| {
            if d.is_some() {
                return false;
            }
            let mut r = ExecuteResponse::bare(ExecStatus::Cancelled);
            r.job_id = Some(self.0.id.clone());
            *d = Some(r);
            true
        });
    }
}

/// Interpret the steps until they end, time out, or a token fires.
pub(super) async fn run(job: &Job, steps: &[Step], cancel: &CancellationToken, ctl: Option<&ExecControl>) -> End {
    let timeout = Duration::from_millis(job.req.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS));
    let deadline = job.started + timeout;
    let mut status = 0;
    for step in steps {
        if let Some(end) = interrupted(job, cancel, deadline) {
            return end;
        }
        match step {
            Step::Out(s) => {
                write(job, Stream::Stdout, s);
                status = 0;
            }
            Step::Err(s) => {
                write(job, Stream::Stderr, s);
                status = 0;
            }
            Step::Cat => write(job, Stream::Stdout, job.req.stdin.as_deref().unwrap_or("")),
            Step::Seq(from, to) => {
                for i in *from..=*to {
                    write(job, Stream::Stdout, &i.to_string());
                    if i % 10_000 == 0 {
                        tokio::task::yield_now().await;
                        if let Some(end) = interrupted(job, cancel, deadline) {
                            return end;
                        }
                    }
                }
            }
            Step::Sleep(d) => {
                if let Err(end) = sleep(job, *d, deadline, cancel, ctl).await {
                    return end;
                }
            }
            Step::Status(n) => status = *n,
            Step::Exit(n) => return End::Exit(*n),
        }
    }
    End::Exit(status)
}

fn interrupted(job: &Job, cancel: &CancellationToken, deadline: Instant) -> Option<End> {
    if cancel.is_cancelled() {
        Some(End::Cancelled)
    } else if job.kill.is_cancelled() {
        Some(End::Killed)
    } else if Instant::now() >= deadline {
        Some(End::Timeout)
    } else {
        None
    }
}

async fn sleep(
    job: &Job,
    d: Duration,
    deadline: Instant,
    cancel: &CancellationToken,
    ctl: Option<&ExecControl>,
) -> Result<(), End> {
    let until = Instant::now() + d;
    loop {
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        if now >= deadline {
            return Err(End::Timeout);
        }
        let next = until.min(deadline).min(now + Duration::from_millis(200));
        tokio::select! {
            _ = cancel.cancelled() => return Err(End::Cancelled),
            _ = job.kill.cancelled() => return Err(End::Killed),
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        if let Some(ctl) = ctl {
            let out = lock(&job.out);
            let bytes = (out.stdout.len() + out.stderr.len()) as u64;
            drop(out);
            ctl.report(Progress { elapsed_ms: job.started.elapsed().as_millis() as u64, bytes });
        }
    }
}

fn write(job: &Job, stream: Stream, line: &str) {
    let mut out = lock(&job.out);
    if out.stdout.len() + out.stderr.len() + line.len() >= MAX_OUTPUT_BYTES {
        out.truncated = true;
        return;
    }
    let buf = if stream == Stream::Stdout { &mut out.stdout } else { &mut out.stderr };
    buf.push_str(line);
    buf.push('\n');
}

pub(super) fn summary(job: &Job) -> JobSummary {
    let done = job.done.borrow().clone();
    let out = lock(&job.out);
    JobSummary {
        job_id: job.id.clone(),
        repo_id: job.req.repo_id.clone(),
        runtime: job.req.runtime.clone(),
        status: done.as_ref().map_or(ExecStatus::Running, |d| d.status),
        background: job.req.background == Some(true),
        started_at_ms: job.started_at_ms,
        duration_ms: done.as_ref().map_or_else(|| job.started.elapsed().as_millis() as u64, |d| d.duration_ms),
        exit_code: done.as_ref().and_then(|d| d.exit_code),
        artifact_handle: done.and_then(|d| d.artifact_handle),
        output_bytes: (out.stdout.len() + out.stderr.len()) as u64,
    }
}
