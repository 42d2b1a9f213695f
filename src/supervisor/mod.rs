//! The supervisor: admission (gate, policy, concurrency), timeouts, output
//! capture and audit, between a request and a sandbox backend. One per
//! process; it owns the store, the compiled seccomp profile and the queue.

#[cfg(target_os = "linux")]
mod cpu_idle;
pub mod cwd;
#[cfg(target_os = "linux")]
mod direct;
#[cfg(target_os = "linux")]
pub mod exec;
// Off Linux there is no governed execution, so nothing runs GC after a job.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
mod gc;
mod malloc;
#[cfg(target_os = "linux")]
mod one_shot;
#[cfg(target_os = "linux")]
pub(crate) mod plan;
pub mod queue;
mod stores;
#[cfg(target_os = "linux")]
mod warm;

pub use malloc::bound_arenas;
#[cfg(target_os = "linux")]
pub use malloc::trim_when_idle;
pub use malloc::tune_allocator;
pub use stores::Stores;

use crate::config::Config;
use crate::policy::PolicyChain;
use crate::runtimes::toolchain::Host;
use crate::store::Store;
use std::sync::Arc;
use stores::StoreSlot;

/// Why a supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    /// The audit trail could not be opened.
    #[error(transparent)]
    Audit(#[from] crate::store::audit::AuditError),
    /// The artifact store could not be opened.
    #[error(transparent)]
    Artifacts(#[from] crate::store::artifacts::ArtifactError),
    /// A policy failed to load (a malformed .rego names its file and line).
    #[error(transparent)]
    Policy(#[from] crate::policy::PolicyError),
    /// The store is not there for this request (it failed to open).
    #[error("the store is unavailable: {0}")]
    StoreUnavailable(String),
    /// The store failed to open for an earlier request: the same failure.
    #[error("the store is unavailable: {0}")]
    NotOpened(std::sync::Arc<SupervisorError>),
    /// The seccomp profile failed to compile.
    #[error("{0}")]
    Seccomp(String),
    /// The configured backend can't be used (not built in, or weaker
    /// without `allow_degraded`): nothing is served rather than a weaker
    /// sandbox than the operator chose.
    #[error("cannot run jobs: {0}")]
    Backend(#[source] crate::sandbox::SandboxError),
}

/// Everything a governed execution needs, built once.
// Off Linux there is no governed execution yet (no `exec`): the queue,
// audit and host are built but unread.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct Supervisor {
    pub config: Config,
    /// Audit trail, artifacts and the GC clock: see [`Supervisor::stores`].
    stores: StoreSlot,
    pub(crate) policy: Arc<PolicyChain>,
    pub(crate) queue: queue::JobQueue,
    /// Requests in the pipeline, for the idle trim.
    pub(crate) activity: malloc::Activity,
    /// The backend every job runs on: `runtime.backend`, checked at start.
    pub backend: crate::sandbox::BackendKind,
    #[cfg(target_os = "linux")]
    pub(crate) seccomp: Option<crate::sandbox::linux::seccomp::CompiledProfile>,
    pub(crate) host: Host,
    /// The GC run started last, if it is still running.
    pending_gc: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Built for one request ([`Supervisor::open_deferred`]): the policy is
    /// evaluated on the calling thread, as nothing else waits for it.
    one_shot: bool,
    /// The one job's init stage or held sandbox, started before the
    /// request was decided ([`Supervisor::open_one_shot`]).
    #[cfg(target_os = "linux")]
    pub(crate) prestarted: std::sync::Mutex<Option<one_shot::Prestarted>>,
    /// Sandboxes built ahead of requests (`[sandbox] warm`).
    #[cfg(target_os = "linux")]
    pub(crate) warm: Option<warm::WarmPool>,
}

/// Warm sandboxes a server keeps when `[sandbox] warm` is not set.
pub const DEFAULT_WARM: usize = 2;

/// The compiled seccomp profile, on Linux.
#[cfg(target_os = "linux")]
type Seccomp = Option<crate::sandbox::linux::seccomp::CompiledProfile>;
#[cfg(not(target_os = "linux"))]
type Seccomp = ();

/// The standard streams of a one-shot supervisor's job, known before the
/// request is decided: output captured, stdin piped or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prestart {
    pub stdin_piped: bool,
}

impl Prestart {
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn stdio(self) -> crate::sandbox::StdioSpec {
        let mut stdio = crate::sandbox::StdioSpec::piped();
        if self.stdin_piped {
            stdio.stdin = crate::sandbox::StdioTarget::Piped;
        }
        stdio
    }
}

impl Supervisor {
    /// Open the store, load the policies (a malformed one fails here, at
    /// start), choose the backend (`runtime.backend`; a weaker one needs
    /// `runtime.allow_degraded`), compile the seccomp profile once, and
    /// size the queue.
    pub fn open(config: Config) -> Result<Supervisor, SupervisorError> {
        let store = Store::open(&config.store_path())?;
        tracing::debug!("store opened");
        Supervisor::with_store(config, store)
    }

    /// As [`Supervisor::open`], but the store opens on a thread of its own
    /// while this returns, and while the first request is admitted and
    /// its sandbox built: for one-shot supervisors (`confine exec`). Jobs
    /// are held before their execve until the store is open, and killed
    /// unreleased if it fails to open (`supervisor/stores.rs`).
    /// `Supervisor::open_one_shot` also starts the first request's sandbox
    /// early.
    pub fn open_deferred(config: Config) -> Result<Supervisor, SupervisorError> {
        let (backend, seccomp) = Supervisor::backend(&config)?;
        let stores = StoreSlot::open_in_background(
            config.store_path(),
            None,
            config.output.gc_interval_secs,
            config.store.min_free_bytes,
        )?;
        let host = Supervisor::host(&config);
        Supervisor::build_with(config, stores, backend, seccomp, true, host)
    }

    /// As [`Supervisor::open`], on a store the caller already opened.
    pub fn with_store(config: Config, store: Store) -> Result<Supervisor, SupervisorError> {
        let stores = StoreSlot::opened(store, config.output.gc_interval_secs, config.store.min_free_bytes)?;
        Supervisor::build(config, stores)
    }

    fn build(config: Config, stores: StoreSlot) -> Result<Supervisor, SupervisorError> {
        let (backend, seccomp) = Supervisor::backend(&config)?;
        let host = Supervisor::host(&config);
        Supervisor::build_with(config, stores, backend, seccomp, false, host)
    }

    /// The host toolchains are resolved on: this process's PATH and HOME,
    /// and the configured repositories, from which no executable is taken.
    pub(crate) fn host(config: &Config) -> Host {
        Host::from_env().with_repos(config.repos.iter().map(|r| r.root.as_path()))
    }

    /// The backend every job runs on (`runtime.backend`; a weaker one needs
    /// `runtime.allow_degraded`) and, for Linux, the compiled seccomp
    /// profile; the job cgroups' parent (`sandbox.cgroup_parent`) is set.
    fn backend(config: &Config) -> Result<(crate::sandbox::BackendKind, Seccomp), SupervisorError> {
        #[cfg(target_os = "linux")]
        if let Some(parent) = &config.sandbox.cgroup_parent {
            let cgroups = crate::sandbox::linux::cgroup::CgroupConfig { parent: Some(parent.clone()) };
            if let Err(earlier) = crate::sandbox::linux::cgroup::configure(cgroups) {
                if earlier.parent.as_ref() != Some(parent) {
                    tracing::warn!(
                        configured = %parent.display(),
                        "sandbox.cgroup_parent ignored: this process already chose its cgroup parent"
                    );
                }
            }
        }
        let backend = crate::sandbox::select_with_config(
            None,
            config.runtime.backend,
            config.source.as_deref(),
            config.runtime.allow_degraded,
        )
        .map_err(SupervisorError::Backend)?;
        #[cfg(target_os = "linux")]
        let seccomp = match backend {
            crate::sandbox::BackendKind::Linux => Some(
                crate::sandbox::linux::seccomp::compile_default()
                    .map_err(|e| SupervisorError::Seccomp(e.to_string()))?,
            ),
            _ => None,
        };
        #[cfg(not(target_os = "linux"))]
        let seccomp = ();
        tracing::debug!("backend ready");
        Ok((backend, seccomp))
    }

    fn build_with(
        config: Config,
        stores: StoreSlot,
        backend: crate::sandbox::BackendKind,
        #[cfg_attr(not(target_os = "linux"), allow(unused_variables))] seccomp: Seccomp,
        one_shot: bool,
        host: Host,
    ) -> Result<Supervisor, SupervisorError> {
        let policy = Arc::new(PolicyChain::from_config(&config.policy)?);
        tracing::debug!("policy compiled");
        #[cfg(target_os = "linux")]
        let warm = Supervisor::warm_pool(&config, backend, seccomp.as_ref(), one_shot);
        Ok(Supervisor {
            queue: queue::JobQueue::new(config.max_concurrent_jobs(), config.runtime.max_queued),
            activity: malloc::Activity::default(),
            host,
            config,
            stores,
            policy,
            backend,
            #[cfg(target_os = "linux")]
            seccomp,
            pending_gc: std::sync::Mutex::new(None),
            one_shot,
            #[cfg(target_os = "linux")]
            prestarted: std::sync::Mutex::new(None),
            #[cfg(target_os = "linux")]
            warm,
        })
    }

    /// The warm pool a server keeps: Linux's backend, as host root (a
    /// warm sandbox's binds are detached copies of host mounts, which only
    /// host root may make), unless `[sandbox] warm = 0`.
    #[cfg(target_os = "linux")]
    fn warm_pool(
        config: &Config,
        backend: crate::sandbox::BackendKind,
        seccomp: Option<&crate::sandbox::linux::seccomp::CompiledProfile>,
        one_shot: bool,
    ) -> Option<warm::WarmPool> {
        let size = config.sandbox.warm.unwrap_or(if one_shot { 0 } else { DEFAULT_WARM });
        let seccomp = seccomp.filter(|_| backend == crate::sandbox::BackendKind::Linux && size > 0)?;
        if !nix::unistd::geteuid().is_root() {
            tracing::debug!("no warm sandboxes: rootless");
            return None;
        }
        let max_idle = std::time::Duration::from_secs(config.sandbox.warm_max_idle_secs.max(1));
        // Built at a lower priority only where the job can be given the
        // server's back.
        let lower = caps::has_cap(None, caps::CapSet::Effective, caps::Capability::CAP_SYS_NICE).unwrap_or(false);
        let pool = seccomp.fd.try_clone().and_then(|fd| warm::WarmPool::start(size, max_idle, fd, lower));
        match pool {
            Ok(pool) => Some(pool),
            Err(e) => {
                tracing::warn!(error = %e, "no warm sandboxes: the pool could not start");
                None
            }
        }
    }

    /// After a job: start artifact GC and the sealing of old audit records
    /// in the background when they are due (`supervisor/gc.rs` says when).
    /// Returns at once.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn collect_garbage_if_due(&self) {
        let Ok(stores) = self.stores.get() else { return };
        let collect = stores.gc.claim(crate::store::artifacts::now_ms());
        let seal = stores.audit.seal_due().unwrap_or(false);
        if collect || seal {
            let handle = gc::spawn(
                collect.then(|| stores.artifacts.clone()),
                seal.then(|| stores.audit.clone()),
                self.config.output.max_store_bytes,
            );
            if let Ok(mut pending) = self.pending_gc.lock() {
                *pending = handle;
            }
        }
    }

    /// Wait for an automatic GC run started by a job to finish. A one-shot
    /// supervisor (`confine exec`) calls it after answering: a blocking
    /// task that has not started yet when the runtime shuts down is
    /// dropped, and the claimed interval would then pass with no GC.
    pub async fn wait_for_gc(&self) {
        let handle = self.pending_gc.lock().ok().and_then(|mut p| p.take());
        if let Some(handle) = handle {
            let _ = handle.await;
        }
    }

    /// The store and its trees. A supervisor from [`Supervisor::open`]
    /// has them at once; one from [`Supervisor::open_deferred`] may block
    /// here until its store is open, and reports a store that failed.
    pub fn stores(&self) -> Result<&Stores, SupervisorError> {
        self.stores.get()
    }

    /// What this supervisor's plans are made from.
    #[cfg(target_os = "linux")]
    pub(crate) fn planner(&self) -> plan::Planner<'_> {
        plan::Planner { config: &self.config, host: &self.host, backend: self.backend }
    }

    /// The digest of the policy chain in force.
    pub fn policy_digest(&self) -> &str {
        self.policy.digest()
    }
}
