//! [`FakeService`]: a test double of [`RuntimeService`] that simulates jobs
//! in memory. It runs nothing — no process, no sandbox — and says so in
//! `info`. It tests the MCP adapter's protocol behaviour without a
//! sandbox; it is built for tests only (the `test-double` feature), never
//! into the release binary.
//!
//! It behaves like the real thing where the tests look: `shell` and
//! `python` run a tiny interpreter (`echo`, `sleep`, `exit`, `seq`,
//! `print(...)`), other known runtimes are unavailable, unknown ones are
//! invalid; `rm`/`curl`/`sudo` are denied by a fake policy; timeouts,
//! cancellation, kill, background jobs, artifacts and every output mode work.

mod job;
mod render;
mod script;

use super::access::Caller;
use super::service::{ExecControl, RuntimeService, ServiceError};
use super::types::*;
use async_trait::async_trait;
use job::{lock, run, summary, Buffers, DoneGuard, End, Job};
use script::Step;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The runtime table's names.
const KNOWN: &[&str] = &crate::runtimes::NAMES;
/// Runtimes the fake interprets, with the executables it accepts.
const AVAILABLE: &[(&str, &[&str])] = &[("shell", &["bash", "sh", "dash"]), ("python", &["python3", "python"])];
const ENV_ALLOW: &[&str] = &["CI", "LANG", "LC_ALL", "NO_COLOR", "TERM", "TZ"];
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
const MAX_OUTPUT_BYTES: usize = 8 << 20;
const KEEP_JOBS: usize = 200;
const KEEP_ARTIFACTS: usize = 256;

/// In-memory stand-in for the supervisor. Cheap to clone.
#[derive(Clone, Default)]
pub struct FakeService {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    jobs: Mutex<VecDeque<Arc<Job>>>,
    artifacts: Mutex<VecDeque<(String, Arc<Buffers>)>>,
    next_id: AtomicU64,
    shutdown: CancellationToken,
}

/// What admission decided.
enum Admission {
    Run(Vec<Step>),
    /// A policy denial (`Ok`, with the decision) or an error.
    Refuse(Box<Result<ExecuteResponse, ServiceError>>),
}

impl FakeService {
    pub fn new() -> Self {
        Self::default()
    }

    fn find(&self, job_id: &str) -> Result<Arc<Job>, ServiceError> {
        lock(&self.inner.jobs)
            .iter()
            .find(|j| j.id == job_id)
            .cloned()
            .ok_or_else(|| ServiceError::NotFound(format!("no job '{}'", clip(job_id))))
    }

    /// The fake governance pipeline: checks, then the fake policy.
    fn admit(&self, req: &ExecuteRequest) -> Admission {
        if let Err(e) = self.check(req) {
            return Admission::Refuse(Box::new(Err(e)));
        }
        let source = match (&req.code, &req.args) {
            (Some(code), _) if !code.is_empty() => code.clone(),
            (_, Some(args)) => args.iter().filter(|a| *a != "-c").cloned().collect::<Vec<_>>().join(" "),
            _ => "cat".to_string(),
        };
        match script::parse(&req.runtime, &source) {
            Ok(steps) => Admission::Run(steps),
            Err(reasons) => {
                let mut resp = ExecuteResponse::bare(ExecStatus::Denied);
                resp.policy_decision = decision(req, reasons);
                resp.backend = Some("fake".into());
                Admission::Refuse(Box::new(Ok(resp)))
            }
        }
    }

    fn check(&self, req: &ExecuteRequest) -> Result<(), ServiceError> {
        req.validate()?;
        let Some((_, exes)) = AVAILABLE.iter().find(|(name, _)| *name == req.runtime) else {
            if KNOWN.contains(&req.runtime.as_str()) {
                return Err(ServiceError::Denied(format!(
                    "runtime '{}' is not available here (the fake service runs shell and python)",
                    req.runtime
                )));
            }
            return Err(ServiceError::Invalid(format!(
                "unknown runtime '{}': use one of {}",
                clip(&req.runtime),
                KNOWN.join(", ")
            )));
        };
        if let Some(exe) = &req.executable {
            let base = exe.rsplit('/').next().unwrap_or(exe);
            if !exes.contains(&base) {
                let msg = format!("executable '{}' does not belong to runtime '{}'", clip(exe), req.runtime);
                return Err(ServiceError::Denied(msg));
            }
        }
        if let Some(cwd) = &req.relative_cwd {
            if escapes(cwd) {
                return Err(ServiceError::Denied(format!("relativeCwd '{}' leaves the workspace", clip(cwd))));
            }
        }
        if let Some(key) = req.env.iter().flat_map(|e| e.keys()).find(|k| !ENV_ALLOW.contains(&k.as_str())) {
            return Err(ServiceError::Denied(format!("env '{key}' is not on the allowlist")));
        }
        Ok(())
    }

    fn new_job(&self, req: ExecuteRequest) -> Arc<Job> {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let started_at_ms = crate::mcp::usage::now_ms();
        let job = Arc::new(Job {
            id: format!("job-{started_at_ms:x}-{n}"),
            req,
            started_at_ms,
            started: Instant::now(),
            out: Mutex::new(Buffers::default()),
            kill: self.inner.shutdown.child_token(),
            done: watch::Sender::new(None),
        });
        let mut jobs = lock(&self.inner.jobs);
        jobs.push_back(job.clone());
        while jobs.len() > KEEP_JOBS {
            jobs.pop_front();
        }
        job
    }

    fn finish(&self, job: &Job, end: End) -> ExecuteResponse {
        let (mut r, out) = job::respond(job, end);
        if job.req.persist_output != Some(false) {
            let handle = format!("run-{}", job.id);
            let mut arts = lock(&self.inner.artifacts);
            arts.push_back((handle.clone(), Arc::new(out)));
            while arts.len() > KEEP_ARTIFACTS {
                arts.pop_front();
            }
            r.artifact_handle = Some(handle);
        }
        r
    }
}

#[async_trait]
impl RuntimeService for FakeService {
    async fn execute(&self, req: ExecuteRequest, ctl: ExecControl) -> Result<ExecuteResponse, ServiceError> {
        let steps = match self.admit(&req) {
            Admission::Run(steps) => steps,
            Admission::Refuse(denied_or_error) => return *denied_or_error,
        };
        let background = req.background == Some(true);
        let job = self.new_job(req);
        if background {
            let this = self.clone();
            let job2 = job.clone();
            tokio::spawn(async move {
                // A background job outlives its call: only kill and shutdown stop it.
                let end = run(&job2, &steps, &CancellationToken::new(), None).await;
                let resp = this.finish(&job2, end);
                job2.done.send_replace(Some(resp));
            });
            let mut r = ExecuteResponse::bare(ExecStatus::Running);
            r.job_id = Some(job.id.clone());
            r.policy_decision = decision(&job.req, Vec::new());
            r.backend = Some("fake".into());
            return Ok(r);
        }
        let guard = DoneGuard(&job);
        let end = run(&job, &steps, &ctl.cancel, Some(&ctl)).await;
        let resp = self.finish(&job, end);
        job.done.send_replace(Some(resp.clone()));
        drop(guard);
        Ok(resp)
    }

    // The fake keeps no owners and no repositories per artifact: callers
    // are the real service's business (`real.rs`), tested end to end.
    async fn query_output(
        &self,
        req: QueryOutputRequest,
        _caller: &Caller,
    ) -> Result<QueryOutputResponse, ServiceError> {
        req.validate()?;
        let out = lock(&self.inner.artifacts)
            .iter()
            .find(|(h, _)| *h == req.artifact_handle)
            .map(|(_, b)| b.clone())
            .ok_or_else(|| {
            ServiceError::NotFound(format!(
                "artifact '{}' not found (expired, or the run had persistOutput: false)",
                clip(&req.artifact_handle)
            ))
        })?;
        let streams = match req.stream.unwrap_or_default() {
            StreamSelect::Stdout => vec![Stream::Stdout],
            StreamSelect::Stderr => vec![Stream::Stderr],
            StreamSelect::Both => vec![Stream::Stdout, Stream::Stderr],
        };
        let max = req.max_excerpts.unwrap_or(10) as usize;
        let context = req.context_lines.unwrap_or(3) as usize;
        let mut resp = QueryOutputResponse { artifact_handle: req.artifact_handle.clone(), ..Default::default() };
        let mut matches = Vec::new();
        for s in &streams {
            let text = if *s == Stream::Stdout { &out.stdout } else { &out.stderr };
            resp.total_lines += text.lines().count() as u64;
            resp.total_bytes += text.len() as u64;
            if let Some([start, end]) = req.line_range {
                resp.excerpts.extend(render::range(*s, text, start, end));
            }
            if !req.query_terms.is_empty() {
                let (ex, more) = render::excerpts(*s, text, &req.query_terms, context, max);
                matches.extend(ex);
                resp.more |= more;
            }
        }
        // maxExcerpts bounds the matches; a requested line range is always shown.
        resp.more |= matches.len() > max;
        matches.truncate(max);
        resp.excerpts.extend(matches);
        resp.searched_streams = streams;
        Ok(resp)
    }

    async fn jobs(&self, req: JobsRequest, _caller: &Caller) -> Result<JobsResponse, ServiceError> {
        let Some(id) = &req.job_id else {
            let jobs = lock(&self.inner.jobs).iter().rev().take(50).map(|j| summary(j)).collect();
            return Ok(JobsResponse { jobs, output: None });
        };
        let job = self.find(id)?;
        let offset = req.offset.unwrap_or(0);
        let ended = job.done.borrow().is_some();
        let out = lock(&job.out);
        let start = floor_char_boundary(&out.stdout, usize::try_from(offset).unwrap_or(usize::MAX));
        let end = floor_char_boundary(&out.stdout, start.saturating_add(64 << 10));
        let output = JobOutput {
            offset: start as u64,
            next_offset: end as u64,
            text: out.stdout[start..end].to_string(),
            complete: ended && end == out.stdout.len(),
        };
        drop(out);
        Ok(JobsResponse { jobs: vec![summary(&job)], output: Some(output) })
    }

    async fn kill(&self, job_id: &str, _caller: &Caller) -> Result<ExecuteResponse, ServiceError> {
        let job = self.find(job_id)?;
        let mut done = job.done.subscribe();
        job.kill.cancel();
        let resp = done
            .wait_for(Option::is_some)
            .await
            .map_err(|_| ServiceError::Internal("job ended without an outcome".into()))?
            .clone();
        resp.ok_or_else(|| ServiceError::Internal("job ended without an outcome".into()))
    }

    async fn info(&self, repo_id: Option<&str>) -> Result<Info, ServiceError> {
        let runtimes = KNOWN
            .iter()
            .map(|name| {
                let exe = AVAILABLE.iter().find(|(n, _)| n == name).map(|(_, e)| e[0].to_string());
                RuntimeInfo { name: name.to_string(), available: exe.is_some(), executable: exe, note: None }
            })
            .collect();
        Ok(Info {
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: "fake".into(),
            runtime_enabled: true,
            runtimes,
            layers: json!({}),
            guarantees: json!({}),
            findings: vec![Finding {
                level: "warning".into(),
                message: "fake service: jobs are simulated in memory and nothing is sandboxed".into(),
            }],
            limits: InfoLimits {
                min_timeout_ms: TIMEOUT_MS_RANGE.0,
                max_timeout_ms: TIMEOUT_MS_RANGE.1,
                default_timeout_ms: DEFAULT_TIMEOUT_MS,
                max_concurrent_jobs: 4,
                max_output_bytes: MAX_OUTPUT_BYTES as u64,
                max_response_lines: RESPONSE_LINES_RANGE.1,
                max_query_terms: MAX_QUERY_TERMS as u32,
                max_code_bytes: MAX_CODE_BYTES as u64,
                max_stdin_bytes: MAX_CODE_BYTES as u64 / 2,
                env_allowlist: ENV_ALLOW.iter().map(|s| s.to_string()).collect(),
            },
            policy_digest: Some(hex::encode(Sha256::digest(b"fake-policy"))),
            repo: repo_id.map(|r| RepoInfo { repo_id: r.to_string(), known: true, writable: false }),
        })
    }

    async fn shutdown(&self) {
        self.inner.shutdown.cancel();
    }
}

/// The fake policy's decision; the audit hash covers the request and the
/// fake policy digest, as the real one covers input, decision and digest.
fn decision(req: &ExecuteRequest, denied_reasons: Vec<String>) -> PolicyDecision {
    let mut h = Sha256::new();
    h.update(serde_json::to_vec(req).unwrap_or_default());
    h.update(if denied_reasons.is_empty() { b"allow" as &[u8] } else { b"deny" });
    h.update(b"fake-policy");
    PolicyDecision { allowed: denied_reasons.is_empty(), audit_hash: Some(hex::encode(h.finalize())), denied_reasons }
}

/// Whether a workspace-relative path leaves the workspace.
fn escapes(cwd: &str) -> bool {
    if cwd.starts_with('/') {
        return true;
    }
    let mut depth: i32 = 0;
    for part in cwd.split('/') {
        match part {
            "" | "." => {}
            ".." => depth -= 1,
            _ => depth += 1,
        }
        if depth < 0 {
            return true;
        }
    }
    false
}

fn floor_char_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn clip(s: &str) -> String {
    s.chars().take(60).collect()
}

#[cfg(test)]
mod tests;
