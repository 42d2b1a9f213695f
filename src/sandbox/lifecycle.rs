//! One job's lifecycle, the same on every backend: spawned through the
//! chosen [`BackendKind`] into a [`Job`] whose streams the caller takes,
//! held and released (where the backend holds jobs), then supervised to
//! its end, which returns the [`Outcome`] and a [`Teardown`] still under
//! way. Callers (the supervisor, `confine run`) see only this; what each
//! backend does at each step is its own module's business.

use super::{Backend, BackendKind, SandboxError, StdioSpec};
use crate::job::{JobSpec, Outcome};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Time between the polite stop (SIGTERM, a forwarded signal) and the
/// tree kill, unless the caller says otherwise.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);

/// One end of a job's standard stream, in blocking mode.
#[cfg(unix)]
pub type Pipe = std::os::fd::OwnedFd;
/// One end of a job's standard stream, in blocking mode.
#[cfg(windows)]
pub type Pipe = std::os::windows::io::OwnedHandle;

/// Sends a signal (its number) to a running job ([`Job::signaller`]).
pub type Signaller = std::sync::Arc<dyn Fn(i32) + Send + Sync>;

/// A boxed future, for the trait's methods to stay dyn-compatible.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the caller wants done to a running job it stops. Either way the
/// job ends with status `cancelled`, and its tree is killed a grace period
/// later if it is still there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// End the job at once, the backend's own way: SIGKILL to Linux's init
    /// stage, the fallback stage's tree-kill request (a killed stage could
    /// not kill the job's escapees or report), the Job Object's termination.
    Kill,
    /// Pass this signal on to the job (`confine run` forwarding the stop
    /// request it got); a backend without signals kills the tree.
    Forward(i32),
}

/// The compiled seccomp profile a Linux job is filtered with.
#[cfg(target_os = "linux")]
pub type SeccompProfile = super::linux::seccomp::CompiledProfile;
/// No backend of this platform filters syscalls: there is never a profile.
#[cfg(not(target_os = "linux"))]
pub enum SeccompProfile {}

/// What the caller hands a backend's spawn besides the spec and streams.
/// Each backend uses what it has a use for and ignores the rest.
#[derive(Default)]
pub struct Launch<'a> {
    /// The job id its outcome carries (else one of the backend's own).
    pub job_id: Option<&'a str>,
    /// The seccomp profile (Linux).
    pub seccomp: Option<&'a SeccompProfile>,
    /// What was started for this job before it was decided, with the same
    /// streams (a one-shot supervisor's init stage or held sandbox). Not
    /// used, it is dropped, which kills it.
    pub early: Option<Early>,
    /// The job's private /tmp, made beforehand by a caller that needed its
    /// host path (unix-fallback).
    #[cfg(unix)]
    pub private_tmp: Option<super::unix_fallback::PrivateTmp>,
}

/// Work started for a job before it was decided: dropped, it is killed.
pub enum Early {
    /// A Linux init stage waiting for its spec.
    #[cfg(target_os = "linux")]
    Stage(super::linux::InitStage),
    /// A Linux sandbox built from the spec worked out before the decision,
    /// its job held before its execve.
    #[cfg(target_os = "linux")]
    Held(Box<super::linux::RunningJob>),
    /// A server's warm sandbox, built before the request, of its shape,
    /// and the request's part of the spec for it.
    #[cfg(target_os = "linux")]
    Warm(Box<super::linux::warm::WarmSandbox>, Box<super::linux::protocol::RequestPart>),
}

impl Early {
    /// Start, with the job's streams, what `backend` can start before it
    /// knows its job (Linux's init stage, which so loads while the request
    /// is decided); None where there is no such thing.
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    pub fn start(
        backend: BackendKind,
        stdio: StdioSpec,
        seccomp: Option<&SeccompProfile>,
    ) -> Result<Option<Early>, SandboxError> {
        match backend {
            #[cfg(target_os = "linux")]
            BackendKind::Linux => {
                let stage = super::linux::InitStage::start(stdio, seccomp.map(|p| &p.fd))?;
                Ok(Some(Early::Stage(stage)))
            }
            _ => Ok(None),
        }
    }

    /// Build `spec`'s sandbox, its job held before its execve (`spec.hold`
    /// must be set), in a stage that waits for its spec; what is already
    /// built is returned as it is. On an error nothing is left running.
    #[cfg_attr(not(target_os = "linux"), allow(unused_variables))]
    pub async fn build(self, spec: &JobSpec, seccomp: Option<&SeccompProfile>) -> Result<Early, SandboxError> {
        match self {
            #[cfg(target_os = "linux")]
            Early::Stage(stage) => {
                let job = stage.configure(spec, seccomp.map(|p| p.name.as_str()), |_| {}).await?;
                Ok(Early::Held(Box::new(job)))
            }
            #[cfg(target_os = "linux")]
            held @ Early::Held(_) => Ok(held),
            // Only a server has warm sandboxes, and it builds none early.
            #[cfg(target_os = "linux")]
            warm @ Early::Warm(..) => Ok(warm),
        }
    }
}

/// A started job, on whichever backend.
pub trait Job: Send {
    /// Whether the job waits for [`Job::release`] before its execve (only
    /// the Linux backend holds jobs).
    fn held(&self) -> bool {
        false
    }

    /// Let a job spawned held execve. Dropping a held job unreleased kills it.
    fn release(&mut self) -> BoxFuture<'_, Result<(), SandboxError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The job's stdin, when it was piped, for async writes.
    fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin>;

    /// The write end of the job's stdin pipe, when it was piped.
    fn stdin_pipe(&mut self) -> Option<std::io::Result<Pipe>>;

    /// The read end of the job's stdout pipe, when it was piped.
    fn stdout_pipe(&mut self) -> Option<std::io::Result<Pipe>>;

    /// The read end of the job's stderr pipe, when it was piped.
    fn stderr_pipe(&mut self) -> Option<std::io::Result<Pipe>>;

    /// Kill the whole tree now, without waiting for it (a caller that
    /// gives up on a job it will not supervise).
    fn kill_tree(&mut self);

    /// What passes a signal on to the job, while it runs and after
    /// (then it does nothing): `confine run` forwards the signals it gets
    /// that are not stop requests through it. None: this backend forwards
    /// none (only [`Stop`]s reach its jobs).
    fn signaller(&self) -> Option<Signaller> {
        None
    }

    /// Wait for the job to end, enforcing its timeout and limits. When
    /// `stop` resolves, the job is stopped as it says (status
    /// `cancelled`); the tree is killed `kill_grace` later if it is still
    /// there. Returns once the tree is dead and counted; what is left to
    /// remove is the [`Teardown`]'s.
    fn supervise(
        self: Box<Self>,
        kill_grace: Duration,
        stop: BoxFuture<'static, Stop>,
    ) -> BoxFuture<'static, (Outcome, Teardown)>;
}

impl BackendKind {
    /// Start `spec` on this backend. Must be called from a tokio worker
    /// thread that outlives the job.
    pub async fn spawn(
        self,
        spec: &JobSpec,
        stdio: StdioSpec,
        launch: Launch<'_>,
    ) -> Result<Box<dyn Job>, SandboxError> {
        match self {
            #[cfg(target_os = "linux")]
            BackendKind::Linux => super::linux::spawn_job(spec, stdio, launch).await,
            #[cfg(unix)]
            BackendKind::UnixFallback => super::unix_fallback::spawn_job(spec, stdio, launch),
            #[cfg(windows)]
            BackendKind::Windows => super::windows::spawn_job(spec, stdio, launch),
            #[allow(unreachable_patterns)]
            other => Err(SandboxError::BackendUnavailable {
                backend: other.name(),
                reason: "not built for this platform".into(),
            }),
        }
    }

    /// What this backend needs set up once per process before its jobs:
    /// Linux places its jobs' cgroups under `cgroup_parent` (when this
    /// process has not chosen already) and compiles the seccomp profile
    /// (`seccomp_file`, else the default) once. Other backends have
    /// neither and return no profile.
    pub fn prepare(
        self,
        seccomp_file: Option<&std::path::Path>,
        cgroup_parent: Option<&std::path::PathBuf>,
    ) -> Result<Option<SeccompProfile>, SandboxError> {
        match self {
            #[cfg(target_os = "linux")]
            BackendKind::Linux => {
                use super::linux::{cgroup, seccomp};
                if let Some(parent) = cgroup_parent {
                    let _ = cgroup::configure(cgroup::CgroupConfig { parent: Some(parent.clone()) });
                }
                // A profile that does not compile exactly as written stops
                // the run rather than weakening the filter.
                let profile = match seccomp_file {
                    Some(path) => seccomp::compile_file(path),
                    None => seccomp::compile_default(),
                }?;
                Ok(Some(profile))
            }
            _ => {
                let _ = (seccomp_file, cgroup_parent);
                Ok(None)
            }
        }
    }
}

/// What is left of a job whose tree is dead: its cgroups being removed.
/// Dropped unfinished, the removal still runs to its end: on its thread,
/// or, where it was left to `finish`, in the drop. (A removal the runtime
/// drops unrun at its shutdown drops the job's cgroup, which removes
/// itself.)
#[must_use = "finish() waits for the job's cgroups to be removed"]
pub struct Teardown(Removal);

enum Removal {
    Nothing,
    /// On a blocking thread, under way.
    Running(tokio::task::JoinHandle<()>),
    /// To run on the caller's thread, at `finish` or in the drop.
    InPlace(Box<dyn FnOnce() + Send>),
}

impl Teardown {
    /// Nothing to tear down (a backend without cgroups).
    pub fn none() -> Teardown {
        Teardown(Removal::Nothing)
    }

    /// Start `remove` as this runtime allows. A server's workers must not
    /// block on it: it runs on a blocking thread beside what the caller
    /// does next. A one-shot command's runtime has a single thread, which
    /// would start a thread only to wait for it before exiting: there it
    /// runs in place, when the caller finishes (or drops) the teardown,
    /// unless the caller has work to overlap it with ([`Teardown::beside`]).
    pub fn start(remove: impl FnOnce() + Send + 'static) -> Teardown {
        let one_thread = tokio::runtime::Handle::try_current()
            .map_or(true, |h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if one_thread {
            Teardown(Removal::InPlace(Box::new(remove)))
        } else {
            Teardown(Removal::Running(tokio::task::spawn_blocking(remove)))
        }
    }

    /// A removal left to run in place goes to a blocking thread now, to
    /// run beside what the caller does next: a governed job's output seal
    /// and audit append, which take longer than the thread costs to start.
    pub fn beside(mut self) -> Teardown {
        self.0 = match self.take() {
            Removal::InPlace(remove) if tokio::runtime::Handle::try_current().is_ok() => {
                Removal::Running(tokio::task::spawn_blocking(remove))
            }
            Removal::InPlace(remove) => {
                remove();
                Removal::Nothing
            }
            other => other,
        };
        self
    }

    /// Wait until the job's cgroups are gone (or reported left behind).
    pub async fn finish(mut self) {
        match self.take() {
            Removal::InPlace(remove) => remove(),
            Removal::Running(task) => {
                let _ = task.await;
            }
            Removal::Nothing => {}
        }
    }

    fn take(&mut self) -> Removal {
        std::mem::replace(&mut self.0, Removal::Nothing)
    }
}

impl Drop for Teardown {
    fn drop(&mut self) {
        // A running removal goes on without us; one left in place runs now.
        if let Removal::InPlace(remove) = self.take() {
            remove();
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn counted() -> (Arc<AtomicUsize>, impl FnOnce() + Send + 'static) {
        let runs = Arc::new(AtomicUsize::new(0));
        let r = runs.clone();
        (runs, move || {
            r.fetch_add(1, Ordering::SeqCst);
        })
    }

    /// A removal that first waits (5 s at most) for the caller to have its
    /// teardown back and send `go`, then notes the thread it ran on: run in
    /// place, it waits in vain.
    struct Probe {
        runs: Arc<AtomicUsize>,
        go: std::sync::mpsc::Sender<()>,
        ran: Arc<std::sync::Mutex<Option<(std::thread::ThreadId, bool)>>>,
        caller: std::thread::ThreadId,
    }

    impl Probe {
        fn new() -> (Probe, impl FnOnce() + Send + 'static) {
            let (runs, remove) = counted();
            let (go, wait) = std::sync::mpsc::channel::<()>();
            let ran = Arc::new(std::sync::Mutex::new(None));
            let on = ran.clone();
            let removal = move || {
                let waited = wait.recv_timeout(std::time::Duration::from_secs(5)).is_ok();
                *on.lock().unwrap() = Some((std::thread::current().id(), waited));
                remove();
            };
            (Probe { runs, go, ran, caller: std::thread::current().id() }, removal)
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }

        /// The removal ran once, after `go`, on a thread not the caller's.
        fn ran_beside(&self) {
            assert_eq!(self.runs(), 1);
            let (thread, waited) = self.ran.lock().unwrap().expect("ran");
            assert!(waited && thread != self.caller, "the removal ran in place on the caller's thread");
        }
    }

    /// A one-shot command's removal runs once, when it is finished, on the
    /// caller's thread; one dropped unfinished runs in the drop.
    #[tokio::test(flavor = "current_thread")]
    async fn on_one_thread_the_removal_runs_in_place_at_finish_or_drop() {
        let (runs, remove) = counted();
        let caller = std::thread::current().id();
        let ran_on = Arc::new(std::sync::Mutex::new(None));
        let on = ran_on.clone();
        let teardown = Teardown::start(move || {
            *on.lock().unwrap() = Some(std::thread::current().id());
            remove();
        });
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs before finish");
        teardown.finish().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(*ran_on.lock().unwrap(), Some(caller));

        let (runs, remove) = counted();
        drop(Teardown::start(remove));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "a dropped teardown still removes");
    }

    /// A one-shot command with work to overlap sends the removal beside it.
    #[tokio::test(flavor = "current_thread")]
    async fn beside_sends_a_removal_left_in_place_to_a_thread() {
        let (probe, removal) = Probe::new();
        let teardown = Teardown::start(removal).beside();
        probe.go.send(()).unwrap();
        teardown.finish().await;
        probe.ran_beside();
    }

    /// A server's removal runs beside its caller, which need not finish it,
    /// and never on the caller's thread.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_server_the_removal_runs_on_a_thread_of_its_own() {
        let (probe, removal) = Probe::new();
        let teardown = Teardown::start(removal);
        probe.go.send(()).unwrap();
        for _ in 0..500 {
            if probe.runs() == 1 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        probe.ran_beside();
        teardown.finish().await;
        assert_eq!(probe.runs(), 1, "and only once");
    }

    /// `beside` leaves a server's running removal as it is: `finish` still
    /// waits for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn beside_keeps_a_running_removal_to_wait_for() {
        let (runs, remove) = counted();
        let teardown = Teardown::start(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            remove();
        });
        teardown.beside().finish().await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "finish returned before the removal ended");
    }

    /// Outside any runtime there is no thread to hand it to: the removal
    /// runs in place, in the drop, or at once when sent beside.
    #[test]
    fn without_a_runtime_the_removal_runs_in_place() {
        let (runs, remove) = counted();
        drop(Teardown::start(remove));
        assert_eq!(runs.load(Ordering::SeqCst), 1);

        let (runs, remove) = counted();
        let teardown = Teardown::start(remove).beside();
        assert_eq!(runs.load(Ordering::SeqCst), 1, "beside ran it at once");
        drop(teardown);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "and only once");
    }

    #[tokio::test]
    async fn a_backend_not_built_in_is_refused_at_spawn() {
        let spec = JobSpec::new(vec!["true".into()]);
        let err = BackendKind::Windows.spawn(&spec, StdioSpec::null(), Launch::default()).await.err();
        assert!(matches!(err, Some(SandboxError::BackendUnavailable { backend: "windows", .. })), "{err:?}");
    }

    /// Before any process is started: the refusal is the spawn's first step.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_linux_job_without_a_seccomp_profile_is_refused() {
        let spec = JobSpec::new(vec!["true".into()]);
        let err = BackendKind::Linux.spawn(&spec, StdioSpec::null(), Launch::default()).await.err();
        assert!(
            matches!(&err, Some(SandboxError::Unavailable(m)) if m.contains("without a seccomp profile")),
            "{:?}",
            err.map(|e| e.to_string())
        );
    }

    #[test]
    fn only_linux_prepares_a_profile() {
        assert!(matches!(BackendKind::UnixFallback.prepare(None, None), Ok(None)));
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn the_fallback_runs_through_the_trait() {
        // This test binary has no `__fallback-init`: the stage is a script
        // that reads its spec to the end, as the real one does, so that the
        // spec's write never meets a stage that is already gone. Another
        // process writes it: no fd of ours ever holds it open for writing,
        // which a fork beside us could carry into an exec (ETXTBSY).
        let dir = tempfile::tempdir().unwrap();
        let stage = dir.path().join("stage");
        let wrote = std::process::Command::new("/bin/sh")
            .args(["-c", "printf '#!/bin/sh\\n/bin/cat <&3 >/dev/null\\nexit 3\\n' > \"$1\" && chmod 755 \"$1\"", "sh"])
            .arg(&stage)
            .status()
            .unwrap();
        assert!(wrote.success());
        crate::sandbox::unix_fallback::set_stage_executable(stage);
        let spec = JobSpec::new(vec!["/bin/sh".into(), "-c".into(), "exit 3".into()]);
        let job = BackendKind::UnixFallback.spawn(&spec, StdioSpec::piped(), Launch::default()).await;
        // The spawn itself is what is checked here, and that the job is the
        // fallback's (never held) with both pipes.
        let mut job = match job {
            Ok(job) => job,
            Err(e) => panic!("spawn: {e}"),
        };
        assert!(!job.held());
        assert!(job.stdout_pipe().is_some_and(|p| p.is_ok()));
        assert!(job.stderr_pipe().is_some_and(|p| p.is_ok()));
        assert!(job.take_stdin().is_none(), "stdin was /dev/null");
        let (outcome, teardown) = job.supervise(Duration::from_millis(100), Box::pin(std::future::pending())).await;
        teardown.finish().await;
        assert_eq!(outcome.backend, "unix-fallback");
    }
}
