//! The job on the backend, once decided, through the lifecycle of
//! `src/sandbox/lifecycle.rs`: its start, never before its start is in
//! the audit trail (a job started while the store opens is held before
//! its execve); its streams (stdin written; stdout and stderr read into
//! the capture, counted, mirrored and copied live); its progress reports;
//! and its end, by itself, by its timeout, or by the caller's cancel,
//! which kills the tree. What it leaves ([`Ended`]) is sealed and answered
//! by [`super::respond`].

use super::{JobControl, JobProgress, JobRequest, Live, Mirror, MIRROR_CAP};
use crate::job::Outcome;
use crate::output::capture::{capture, capture_pipe, Capture, StreamSink, StreamSummary};
use crate::output::redact::{RedactStream, Redactor};
use crate::output::OutputConfig;
use crate::sandbox::{Backend, BackendKind, Job, Launch, Stop, Teardown, DEFAULT_KILL_GRACE};
use crate::store::artifacts::{Artifacts, StreamName};
use crate::store::audit::AuditEntry;
use crate::supervisor::plan::Placed;
use crate::supervisor::{Prestart, Supervisor};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// What a job that ran left, before its output is sealed: its outcome,
/// its capture with both streams' summaries, and its cgroups' removal,
/// still under way.
pub(super) struct Ended<'a> {
    pub outcome: Outcome,
    pub capture: Capture,
    pub stdout: StreamSummary,
    pub stderr: StreamSummary,
    /// Where the output is stored, to render the view from.
    pub artifacts: &'a Artifacts,
    pub teardown: Teardown,
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

impl Supervisor {
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
        let early = early.or_else(|| self.warm_sandbox(&job.spec, prestart));
        let launch =
            Launch { job_id: Some(job_id), seccomp: self.seccomp.as_ref(), early, private_tmp: job.fallback_tmp };
        self.backend
            .spawn(&job.spec, prestart.stdio(), launch)
            .await
            .map_err(|e| NotStarted::Sandbox(crate::sandbox::describe_start_error(&e)))
    }

    /// A warm sandbox for `spec`, if the pool has one of its shape. The
    /// pool then builds the next of this shape.
    fn warm_sandbox(&self, spec: &crate::job::JobSpec, streams: Prestart) -> Option<crate::sandbox::Early> {
        let pool = self.warm.as_ref()?;
        let profile = self.seccomp.as_ref()?;
        let (shape, base, part) = crate::sandbox::linux::warm::shape_of(spec, &profile.name, streams.stdin_piped)?;
        let warm = pool.take(&shape, &base, &spec.limits)?;
        Some(crate::sandbox::Early::Warm(Box::new(warm), Box::new(part)))
    }

    /// Start the sandbox, capture both streams, enforce the limits.
    pub(super) async fn run_job(
        &self,
        started_entry: &AuditEntry,
        repo_id: &str,
        req: &JobRequest,
        output: &OutputConfig,
        mut placed: Placed,
        ctl: &mut JobControl,
    ) -> Result<Ended<'_>, NotStarted> {
        let persist = req.persist_output.unwrap_or(true);
        // Secrets: the listed variables' values, and what the caller passes
        // to the job under a secret-like name (API_TOKEN, DB_PASSWORD, …).
        let redactor = output.job_redactor(&req.env, |k| std::env::var(k).ok());
        let streams = Prestart { stdin_piped: req.stdin.is_some() };
        // On Linux the sandbox is built, its job held before execve, while
        // the job's start goes to the trail and is flushed (or while a
        // store still opens, `Supervisor::open_deferred`): the flush is off
        // the request's path, and the job is let go only once its start is
        // durable. Other backends write the start first. No job runs
        // unaudited.
        let hold = self.backend == BackendKind::Linux;
        placed.spec.hold = hold;
        // No job starts without room for its output and its record, and
        // without its start in the trail.
        let job_id = started_entry.id.as_str();
        // A store that failed to open fails the request here, before a
        // sandbox is built for nothing.
        if !hold || self.stores.is_ready() {
            let stores = self.stores.wait().await?;
            if !hold {
                stores.admit(started_entry)?;
            }
        }
        let mut job = self.start(job_id, placed, streams).await?;
        // The job's start is written and flushed while its sandbox builds
        // (the stages are processes of their own). On an error the held
        // job is dropped unreleased, which kills its tree.
        let stores = self.stores.wait().await?;
        if hold {
            if let Err(e) = stores.admit(started_entry) {
                // Tests: time for a job released by mistake to show it ran.
                crate::crashpoint::linger("held-job-refused").await;
                return Err(e.into());
            }
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
        let (mut outcome, teardown) = job.supervise(DEFAULT_KILL_GRACE, stop).await;
        if outcome.status == crate::job::Status::Cancelled
            && ctl.kill_requested.as_ref().is_some_and(|k| k.load(Ordering::SeqCst))
        {
            outcome.status = crate::job::Status::Killed;
        }
        // The output's seal and the audit append come next: the removal
        // runs beside them, in a one-shot `confine exec` too.
        let teardown = teardown.beside();
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
        Ok(Ended { outcome, capture: cap, stdout, stderr, artifacts: &stores.artifacts, teardown })
    }
}

/// Why a job the pipeline let through did not run.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotStarted {
    /// The store is not there to record it.
    #[error(transparent)]
    Stores(#[from] crate::supervisor::SupervisorError),
    #[error(transparent)]
    Admit(#[from] crate::supervisor::stores::AdmitError),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_counts_both_streams_and_the_mirror_stops_at_its_cap() {
        let mirror = Mirror::default();
        let ctl = JobControl { mirror: Some(mirror.clone()), ..Default::default() };
        let count = Arc::new(AtomicU64::new(0));
        let mut out = Tap::new(&count, StreamName::Stdout, &ctl, None);
        let mut err = Tap::new(&count, StreamName::Stderr, &ctl, None);
        out.observe(&vec![b'o'; MIRROR_CAP - 2], false);
        err.observe(b"errs", false);
        out.observe(b"more", true);
        assert_eq!(count.load(Ordering::Relaxed), MIRROR_CAP as u64 + 6);
        let m = mirror.lock().unwrap();
        assert_eq!(m.len(), MIRROR_CAP);
        assert_eq!(&m[MIRROR_CAP - 3..], b"oer");
    }
}
