//! The supervisor: admission (gate, policy, concurrency), timeouts, output
//! capture and audit, between a request and a sandbox backend. One per
//! process; it owns the store, the compiled seccomp profile and the queue.

pub mod cwd;
#[cfg(target_os = "linux")]
pub mod exec;
pub mod queue;

use crate::config::Config;
use crate::policy::PolicyChain;
use crate::runtimes::toolchain::Host;
use crate::store::artifacts::Artifacts;
use crate::store::audit::AuditLog;
use crate::store::Store;
use std::sync::Arc;

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
    /// The seccomp profile failed to compile.
    #[error("{0}")]
    Seccomp(String),
}

/// Everything a governed execution needs, built once.
// Off Linux there is no governed execution yet (no `exec`): the queue,
// audit and host are built but unread.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct Supervisor {
    pub config: Config,
    pub store: Store,
    pub(crate) policy: Arc<PolicyChain>,
    pub(crate) queue: queue::JobQueue,
    pub(crate) audit: AuditLog,
    pub artifacts: Artifacts,
    #[cfg(target_os = "linux")]
    pub(crate) seccomp: Option<crate::sandbox::linux::seccomp::CompiledProfile>,
    pub(crate) host: Host,
}

impl Supervisor {
    /// Open the store, load the policies (a malformed one fails here, at
    /// start), compile the seccomp profile once, and size the queue.
    pub fn open(config: Config) -> Result<Supervisor, SupervisorError> {
        let store = Store::open(&config.store_path())?;
        Supervisor::with_store(config, store)
    }

    /// As [`Supervisor::open`], on a store the caller already opened.
    pub fn with_store(config: Config, store: Store) -> Result<Supervisor, SupervisorError> {
        let policy = Arc::new(PolicyChain::from_config(&config.policy)?);
        let audit = AuditLog::open(&store)?;
        let artifacts = Artifacts::open(&store)?;
        #[cfg(target_os = "linux")]
        let seccomp = Some(
            crate::sandbox::linux::seccomp::compile_default().map_err(|e| SupervisorError::Seccomp(e.to_string()))?,
        );
        Ok(Supervisor {
            queue: queue::JobQueue::new(config.max_concurrent_jobs(), config.runtime.max_queued),
            host: Host::from_env(),
            config,
            store,
            policy,
            audit,
            artifacts,
            #[cfg(target_os = "linux")]
            seccomp,
        })
    }

    /// The digest of the policy chain in force.
    pub fn policy_digest(&self) -> &str {
        self.policy.digest()
    }
}
