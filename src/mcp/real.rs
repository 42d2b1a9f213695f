//! The real [`RuntimeService`]: MCP's calls mapped onto the supervisor's
//! governed pipeline, plus the table of jobs and the usage history in the
//! store. No sandbox or policy logic lives here: this file translates
//! types, keeps track of jobs and whose they are, and shows a caller only
//! its own jobs and the artifacts of its repositories.

use super::access::{Caller, JobOwner};
use super::service::{ExecControl, Progress, RuntimeService, ServiceError};
use super::types::{
    Excerpt, ExecStatus, ExecuteRequest, ExecuteResponse, Finding, Info, InfoLimits, JobOutput, JobSummary,
    JobsRequest, JobsResponse, PolicyDecision, QueryOutputRequest, QueryOutputResponse, RepoInfo, RuntimeInfo, Stream,
    StreamSelect, Truncation,
};
use super::usage::{summarise, UsageSnapshot, UsageStatsRequest};
use crate::output::modes::RenderOptions;
use crate::sandbox::{Backend, BackendKind};
use crate::store::artifacts::{now_ms, ArtifactError, StreamName};
use crate::supervisor::exec::{self as sup, Mirror, Rejection};
use crate::supervisor::Supervisor;
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How many finished background jobs `runtime_jobs` remembers.
const KEEP_FINISHED: usize = 100;

struct BackgroundJob {
    summary: JobSummary,
    /// Whose it is: only they list, follow or kill it.
    owner: JobOwner,
    cancel: CancellationToken,
    mirror: Mirror,
    /// The final response, once the job ended.
    done: watch::Receiver<Option<ExecuteResponse>>,
    /// Ended by `runtime_kill`: listed as killed, as the kill answered.
    killed: bool,
}

/// The supervisor behind MCP.
pub struct SupervisorService {
    sup: Arc<Supervisor>,
    jobs: Mutex<BTreeMap<String, BackgroundJob>>,
    started_ms: u64,
}

impl SupervisorService {
    pub fn new(sup: Arc<Supervisor>) -> SupervisorService {
        SupervisorService { sup, jobs: Mutex::new(BTreeMap::new()), started_ms: now_ms() }
    }

    /// Put a job in the table `runtime_jobs` lists, forgetting the oldest
    /// finished ones past [`KEEP_FINISHED`].
    fn register(&self, job: BackgroundJob) -> Result<(), ServiceError> {
        let mut jobs = self.jobs.lock().map_err(internal)?;
        let finished: Vec<String> =
            jobs.iter().filter(|(_, j)| j.done.borrow().is_some()).map(|(k, _)| k.clone()).collect();
        for k in finished.iter().take(finished.len().saturating_sub(KEEP_FINISHED)) {
            jobs.remove(k);
        }
        jobs.insert(job.summary.job_id.clone(), job);
        Ok(())
    }

    fn store(&self) -> Result<&crate::store::Store, ServiceError> {
        Ok(&self.sup.stores().map_err(internal)?.store)
    }
}

/// The summary of a job just started.
fn running(job_id: &str, req: &ExecuteRequest, background: bool) -> JobSummary {
    JobSummary {
        job_id: job_id.to_string(),
        repo_id: req.repo_id.clone(),
        runtime: req.runtime.clone(),
        status: ExecStatus::Running,
        background,
        started_at_ms: now_ms(),
        duration_ms: 0,
        exit_code: None,
        artifact_handle: None,
        output_bytes: 0,
    }
}

fn internal(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(e.to_string())
}

fn to_request(req: &ExecuteRequest) -> sup::JobRequest {
    sup::JobRequest {
        repo_id: Some(req.repo_id.clone()),
        runtime: req.runtime.clone(),
        executable: req.executable.clone(),
        args: req.args.clone().unwrap_or_default(),
        code: req.code.clone().filter(|c| !c.is_empty()),
        stdin: req.stdin.clone(),
        relative_cwd: req.relative_cwd.clone(),
        timeout_ms: req.timeout_ms,
        env: req.env.clone().unwrap_or_default().into_iter().collect(),
        network: match &req.network {
            Some(n) => crate::job::Network::Allow(n.allow.clone()),
            None => crate::job::Network::None,
        },
        persist_output: req.persist_output,
        render: RenderOptions {
            output_mode: req.output_mode,
            max_response_lines: req.max_response_lines,
            query_terms: req.query_terms.clone().unwrap_or_default(),
            inline_bytes: req.inline_bytes,
        },
        ..sup::JobRequest::default()
    }
}

fn stream(s: StreamName) -> Stream {
    match s {
        StreamName::Stdout => Stream::Stdout,
        StreamName::Stderr => Stream::Stderr,
    }
}

fn to_response(r: &sup::JobResponse) -> Result<ExecuteResponse, ServiceError> {
    match (r.rejection, &r.error) {
        (Some(Rejection::Invalid), Some(e)) => return Err(ServiceError::Invalid(e.clone())),
        (Some(Rejection::Busy), Some(e)) => return Err(ServiceError::Busy(e.clone())),
        _ => {}
    }
    let mut out = ExecuteResponse::bare(r.status.into());
    out.job_id = Some(r.job_id.clone());
    out.exit_code = r.exit_code;
    out.signal = r.signal;
    out.duration_ms = r.duration_ms;
    out.queued_ms = r.queued_ms;
    out.artifact_handle = r.artifact_handle.clone();
    out.policy_decision = PolicyDecision {
        allowed: r.policy_decision.allowed,
        audit_hash: Some(r.policy_decision.audit_hash.clone()),
        denied_reasons: r.policy_decision.denied_reasons.clone(),
    };
    out.error = r.error.clone();
    if let Some(o) = &r.outcome {
        out.isolation = Some(o.guarantees.weaker().map_or_else(|| "full".to_string(), |w| format!("degraded: {w}")));
        out.backend = Some(o.backend.clone());
        out.usage = serde_json::to_value(&o.usage).ok();
        out.layers = serde_json::to_value(&o.layers).ok();
        out.guarantees = serde_json::to_value(&o.guarantees).ok();
        out.limits = serde_json::to_value(&o.limits).ok();
        out.network = o.network.as_ref().and_then(|n| serde_json::to_value(n).ok());
        out.tmp_full = o.tmp_full.as_ref().and_then(|t| serde_json::to_value(t).ok());
    }
    if let Some(v) = &r.output {
        out.output_lines = Some(v.output_lines);
        out.output_bytes = Some(v.output_bytes);
        out.stdout = v.stdout.clone();
        out.stderr = v.stderr.clone();
        out.stdout_summary = v.stdout_summary.clone();
        out.stderr_summary = v.stderr_summary.clone();
        out.excerpts = v.excerpts.as_ref().map(|xs| {
            xs.iter()
                .map(|x| Excerpt {
                    line_start: x.line_start,
                    line_end: x.line_end,
                    content: x.content.clone(),
                    source: stream(x.source),
                })
                .collect()
        });
        out.truncation = v.truncation.as_ref().map(|t| Truncation {
            stdout_truncated: t.stdout_truncated,
            stderr_truncated: t.stderr_truncated,
            total_stdout_bytes: t.total_stdout_bytes,
            total_stderr_bytes: t.total_stderr_bytes,
        });
        out.digest = v.digest.as_ref().and_then(|d| serde_json::to_value(d).ok());
        out.suggested_terms = v.suggested_terms.clone();
        out.notes = v.notes.clone();
        if let Some(sections) = &v.sections {
            // Intent mode's ranked sections travel in `digest`'s place.
            out.digest.get_or_insert(serde_json::json!({ "sections": sections }));
        }
    }
    Ok(out)
}

/// Add `b`'s counters into `a`.
fn merge(a: &mut UsageSnapshot, b: &UsageSnapshot) {
    for (name, t) in &b.tools {
        let e = a.tools.entry(name.clone()).or_default();
        e.calls += t.calls;
        e.errors += t.errors;
        e.raw_output_bytes += t.raw_output_bytes;
        e.returned_bytes += t.returned_bytes;
    }
    for (k, v) in &b.statuses {
        *a.statuses.entry(k.clone()).or_default() += v;
    }
    a.since_ms = a.since_ms.min(b.since_ms);
}

#[async_trait]
impl RuntimeService for SupervisorService {
    async fn execute(&self, req: ExecuteRequest, ctl: ExecControl) -> Result<ExecuteResponse, ServiceError> {
        req.validate()?;
        ctl.caller.check_repo(&req.repo_id)?;
        let background = req.background == Some(true);
        let mut sreq = to_request(&req);
        if background {
            let max = self.sup.config.runtime.background_max_ms;
            sreq.timeout_ms = Some(sreq.timeout_ms.unwrap_or(max).min(max));
        }
        let job_id = crate::ids::job_id();
        sreq.job_id = Some(job_id.clone());
        // Background jobs answer to runtime_kill only; a call's own
        // cancellation (or its client leaving) ends a foreground one.
        let cancel = if background { CancellationToken::new() } else { ctl.cancel.clone() };
        let mirror: Mirror = Arc::default();
        let (tx, rx) = watch::channel(None);
        self.register(BackgroundJob {
            summary: running(&job_id, &req, background),
            owner: ctl.caller.owner(),
            cancel: cancel.clone(),
            mirror: mirror.clone(),
            done: rx,
            killed: false,
        })?;

        let (ptx, mut prx) = tokio::sync::mpsc::unbounded_channel::<sup::JobProgress>();
        let forward = ctl.progress.clone().filter(|_| !background).map(|sink| {
            tokio::spawn(async move {
                while let Some(p) = prx.recv().await {
                    sink.update(Progress { elapsed_ms: p.elapsed_ms, bytes: p.bytes });
                }
            })
        });
        let token = cancel.clone();
        let sctl = sup::JobControl {
            cancel: Some(Box::pin(async move { token.cancelled().await })),
            progress: forward.as_ref().map(|_| ptx),
            progress_every: Some(std::time::Duration::from_secs(1)),
            mirror: Some(mirror),
            ..sup::JobControl::default()
        };
        let sup = self.sup.clone();
        let run = async move {
            let resp = sup.execute(sreq, sctl).await;
            if let Some(f) = forward {
                f.abort();
            }
            let mapped = to_response(&resp);
            let _ = tx.send(Some(match &mapped {
                Ok(r) => r.clone(),
                Err(e) => {
                    let mut r = ExecuteResponse::bare(ExecStatus::Failure);
                    r.error = Some(e.one_line());
                    r
                }
            }));
            mapped
        };
        if background {
            tokio::spawn(run);
            let mut resp = ExecuteResponse::bare(ExecStatus::Running);
            resp.job_id = Some(job_id);
            resp.policy_decision.allowed = true;
            return Ok(resp);
        }
        run.await
    }

    async fn query_output(
        &self,
        req: QueryOutputRequest,
        caller: &Caller,
    ) -> Result<QueryOutputResponse, ServiceError> {
        req.validate()?;
        let q = crate::output::query::ArtifactQuery {
            artifact_handle: req.artifact_handle.clone(),
            query_terms: req.query_terms.clone(),
            context_lines: req.context_lines,
            max_excerpts: req.max_excerpts,
            stream: match req.stream.unwrap_or_default() {
                StreamSelect::Stdout => crate::output::query::QueryStreams::Stdout,
                StreamSelect::Stderr => crate::output::query::QueryStreams::Stderr,
                StreamSelect::Both => crate::output::query::QueryStreams::Both,
            },
            line_start: req.line_range.map(|r| r[0]),
            line_end: req.line_range.map(|r| r[1]),
        };
        let artifacts = &self.sup.stores().map_err(internal)?.artifacts;
        // The artifact's repository decides, not the handle: another
        // repository's artifact is not found, exactly as a missing one.
        let not_found = || ServiceError::NotFound(ArtifactError::NotFound(req.artifact_handle.clone()).to_string());
        match artifacts.get(&req.artifact_handle) {
            Ok(meta) if caller.may_use(&meta.repo_id) => {}
            Ok(_) | Err(ArtifactError::NotFound(_)) => return Err(not_found()),
            Err(e) => return Err(internal(e)),
        }
        let r = crate::output::query::query_output(artifacts, &q).map_err(|e| match e {
            crate::output::OutputError::Artifact(ArtifactError::NotFound(_)) => ServiceError::NotFound(e.to_string()),
            e => ServiceError::Invalid(e.to_string()),
        })?;
        Ok(QueryOutputResponse {
            artifact_handle: r.artifact_handle,
            excerpts: r
                .excerpts
                .into_iter()
                .map(|x| Excerpt {
                    line_start: x.line_start,
                    line_end: x.line_end,
                    content: x.content,
                    source: stream(x.source),
                })
                .collect(),
            total_lines: r.total_lines,
            total_bytes: r.total_bytes,
            searched_streams: r.searched_streams.into_iter().map(stream).collect(),
            more: r.more_excerpts,
        })
    }

    async fn jobs(&self, req: JobsRequest, caller: &Caller) -> Result<JobsResponse, ServiceError> {
        let mut jobs = self.jobs.lock().map_err(internal)?;
        for job in jobs.values_mut().filter(|j| caller.owns(&j.owner)) {
            if let Some(done) = job.done.borrow().clone() {
                job.summary.status = match done.status {
                    ExecStatus::Cancelled if job.killed => ExecStatus::Killed,
                    other => other,
                };
                job.summary.exit_code = done.exit_code;
                job.summary.duration_ms = done.duration_ms;
                job.summary.artifact_handle = done.artifact_handle.clone();
            } else {
                job.summary.duration_ms = now_ms().saturating_sub(job.summary.started_at_ms);
            }
            job.summary.output_bytes = job.mirror.lock().map(|m| m.len() as u64).unwrap_or(0);
        }
        let mut output = None;
        if let Some(id) = &req.job_id {
            let job = jobs
                .get(id)
                .filter(|j| caller.owns(&j.owner))
                .ok_or_else(|| ServiceError::NotFound(format!("job '{id}' not found (list jobs without a jobId)")))?;
            let buf = job.mirror.lock().map_err(internal)?;
            let offset = req.offset.unwrap_or(0).min(buf.len() as u64);
            let slice = &buf[offset as usize..];
            let text = String::from_utf8_lossy(slice).into_owned();
            output = Some(JobOutput {
                offset,
                next_offset: buf.len() as u64,
                text,
                complete: job.summary.status != ExecStatus::Running,
            });
        }
        // With a jobId, that job only.
        let mut list: Vec<JobSummary> = jobs
            .iter()
            .filter(|(id, j)| caller.owns(&j.owner) && req.job_id.as_ref().is_none_or(|want| want == *id))
            .map(|(_, j)| j.summary.clone())
            .collect();
        list.sort_by_key(|j| std::cmp::Reverse(j.started_at_ms));
        Ok(JobsResponse { jobs: list, output })
    }

    async fn kill(&self, job_id: &str, caller: &Caller) -> Result<ExecuteResponse, ServiceError> {
        let mut done = {
            let mut jobs = self.jobs.lock().map_err(internal)?;
            let job = jobs.get_mut(job_id).filter(|j| caller.owns(&j.owner)).ok_or_else(|| {
                ServiceError::NotFound(format!("job '{job_id}' not found (list jobs with runtime_jobs)"))
            })?;
            // A job that had already ended keeps its own status.
            job.killed = job.done.borrow().is_none();
            job.cancel.cancel();
            job.done.clone()
        };
        let ended = done.wait_for(|d| d.is_some()).await.map_err(internal)?;
        let mut resp = ended.clone().ok_or_else(|| internal("the job ended without a response"))?;
        // Ended by this call: say so ("cancelled" is for a caller's own cancellation).
        if resp.status == ExecStatus::Cancelled {
            resp.status = ExecStatus::Killed;
        }
        Ok(resp)
    }

    fn sole_repo(&self) -> Option<String> {
        match self.sup.config.repos.as_slice() {
            [only] => Some(only.id.clone()),
            _ => None,
        }
    }

    async fn info(&self, repo_id: Option<&str>) -> Result<Info, ServiceError> {
        let host = &self.sup.host;
        let runtimes = crate::runtimes::NAMES
            .iter()
            .map(|name| {
                match crate::runtimes::lookup(name)
                    .and_then(|rt| crate::runtimes::toolchain::resolve(rt, None, true, host))
                {
                    Ok(r) => RuntimeInfo {
                        name: name.to_string(),
                        available: true,
                        executable: Some(r.executable.display().to_string()),
                        note: None,
                    },
                    Err(e) => RuntimeInfo {
                        name: name.to_string(),
                        available: false,
                        executable: None,
                        note: Some(e.to_string()),
                    },
                }
            })
            .collect();
        let report = tokio::task::spawn_blocking(|| crate::doctor::diagnose(None)).await.map_err(internal)?;
        let findings = report
            .checks
            .iter()
            .map(|c| Finding {
                level: if c.ok {
                    "ok".into()
                } else if c.required {
                    "error".into()
                } else {
                    "warning".into()
                },
                message: format!("{}: {}", c.name, c.detail),
            })
            .collect();
        let cfg = &self.sup.config;
        let repo = repo_id.map(|id| {
            let found = cfg.repo(id).ok();
            RepoInfo {
                repo_id: id.to_string(),
                known: found.is_some(),
                writable: found.is_some() && cfg.sandbox.workspace_rw,
            }
        });
        let backend = self.sup.backend;
        let layers = match backend {
            BackendKind::Linux => serde_json::json!({
                "fullIsolation": report.full_isolation,
                "namespaces": ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"],
                "landlockAbi": crate::sandbox::linux::landlock::kernel_abi(),
                "seccomp": self.sup.seccomp.as_ref().map(|p| p.name.clone()),
                "capsDropped": true,
                "noNewPrivs": true,
            }),
            // The host's findings above still say what the Linux sandbox could do.
            other => serde_json::json!({
                "fullIsolation": false,
                "namespaces": [],
                "landlockAbi": 0,
                "seccomp": null,
                "missing": other.lost(),
            }),
        };
        let guarantees = match backend {
            BackendKind::Linux => report.guarantees.clone(),
            other => crate::sandbox::Guarantees::of(other, &crate::job::Layers::default()),
        };
        Ok(Info {
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: backend.name().into(),
            runtime_enabled: cfg.runtime.enabled,
            runtimes,
            layers,
            guarantees: serde_json::to_value(&guarantees).map_err(internal)?,
            findings,
            limits: InfoLimits {
                min_timeout_ms: 100,
                max_timeout_ms: cfg.limits.max_timeout_ms,
                default_timeout_ms: cfg.limits.timeout_ms,
                max_concurrent_jobs: cfg.max_concurrent_jobs() as u32,
                max_output_bytes: cfg.output.max_stored_bytes(),
                max_response_lines: 1000,
                max_query_terms: 10,
                max_code_bytes: cfg.limits.max_code_bytes,
                max_stdin_bytes: cfg.limits.max_stdin_bytes,
                env_allowlist: cfg.sandbox.env_allowlist.clone(),
            },
            policy_digest: Some(self.sup.policy_digest().to_string()),
            repo,
        })
    }

    async fn usage_history(&self, req: &UsageStatsRequest) -> Result<Option<UsageSnapshot>, ServiceError> {
        let mut total = summarise(now_ms(), BTreeMap::new(), BTreeMap::new());
        for v in self.store()?.values(crate::store::Table::Usage).map_err(internal)? {
            let snap: UsageSnapshot = serde_json::from_slice(&v).map_err(internal)?;
            if req.since_ms.is_some_and(|s| snap.since_ms < s) {
                continue;
            }
            merge(&mut total, &snap);
        }
        Ok(Some(summarise(total.since_ms, total.tools, total.statuses)))
    }

    async fn record_usage(&self, session: &UsageSnapshot) -> Result<(), ServiceError> {
        let value = serde_json::to_vec(session).map_err(internal)?;
        let store = self.store()?;
        store.put(crate::store::Table::Usage, &self.started_ms.to_be_bytes(), &value).map_err(internal)?;
        store.flush().map_err(internal)
    }

    async fn shutdown(&self) {
        let pending: Vec<watch::Receiver<Option<ExecuteResponse>>> = match self.jobs.lock() {
            Ok(jobs) => jobs
                .values()
                .map(|j| {
                    j.cancel.cancel();
                    j.done.clone()
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        for mut done in pending {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(10), done.wait_for(|d| d.is_some())).await;
        }
        if let Ok(stores) = self.sup.stores() {
            // A record refused for want of room, written if there is room now.
            if let Err(e) = stores.write_unrecorded() {
                tracing::error!(error = %e, "at shutdown; the job's start is in the trail, marked unfinished at the next open");
            }
            let _ = stores.store.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::sandbox::BackendChoice;

    fn service(dir: &std::path::Path, backend: BackendChoice) -> SupervisorService {
        let mut config = Config::default();
        config.store.path = Some(dir.join("store"));
        config.runtime.backend = backend;
        config.runtime.allow_degraded = true;
        SupervisorService::new(Arc::new(Supervisor::open(config).unwrap()))
    }

    #[tokio::test]
    async fn info_names_the_backend_and_what_it_guarantees() {
        let dir = tempfile::tempdir().unwrap();
        let info = service(dir.path(), BackendChoice::UnixFallback).info(None).await.unwrap();
        assert_eq!(info.backend, "unix-fallback");
        assert_eq!(info.layers["fullIsolation"], false);
        assert_eq!(info.layers["seccomp"], serde_json::Value::Null);
        for row in ["filesystem", "network", "syscalls"] {
            assert_eq!(info.guarantees[row]["level"], "none", "{row}: {}", info.guarantees);
        }
        assert_eq!(info.guarantees["treeKill"]["level"], "enforced");

        let dir = tempfile::tempdir().unwrap();
        let info = service(dir.path(), BackendChoice::Auto).info(None).await.unwrap();
        assert_eq!(info.backend, "linux");
        let rows = info.guarantees.as_object().unwrap();
        assert_eq!(rows.len(), 8, "{}", info.guarantees);
        for (name, row) in rows {
            assert!(["enforced", "partial", "none"].contains(&row["level"].as_str().unwrap()), "{name}: {row}");
        }
        assert_eq!(info.guarantees["envScrub"]["level"], "enforced");
    }
}
