//! A supervisor for one request (`confine exec`): what it starts before
//! the request is decided, so that its costs overlap instead of adding up.
//!
//! In this order, on the calling thread: the `__init` stage is started
//! first, to load while the rest is done; the job's spec is worked out from
//! the request (the checks before the policy, steps 3 to 5, the limits as
//! configured), its cgroups are made, and the stage builds the sandbox
//! from it, the job held before its execve; the store starts opening on
//! a thread of its own; only then is the policy compiled and asked. The
//! sandbox's build so overlaps the CPU the policy and the store take,
//! which it waited for before (docs/benchmarks.md).
//!
//! What must never happen: the job's execve before the policy allowed the
//! request and the store is open. The held job is released only by the
//! pipeline, after both ([`super::exec`]), and only if the spec the
//! pipeline works out after the decision is the one it was built from
//! (the policy may lower limits); otherwise, and for a denied request, it
//! is killed unreleased and the job, if any, gets a fresh stage. Nothing
//! of the request runs in between: the sandbox is namespaces, mounts and
//! the source file in its private /tmp.

use super::exec::JobRequest;
use super::plan::{self, Planner};
use super::stores::StoreSlot;
use super::{Prestart, Supervisor, SupervisorError};
use crate::config::Config;
use crate::runtimes::toolchain::Host;
use crate::sandbox::{Early, SeccompProfile};
use crate::store::StoreLock;
use std::time::Duration;

/// What a one-shot supervisor started before its request was decided:
/// the init stage waiting for a spec, or the job of the first request, its
/// sandbox built from the spec worked out before the decision, held before
/// its execve; either with the job's streams.
pub(crate) struct Prestarted {
    early: Early,
    streams: Prestart,
}

impl Prestarted {
    /// What was started, for a job with `streams`; None drops it (killed).
    pub(crate) fn matching(self, streams: Prestart) -> Option<Early> {
        (self.streams == streams).then_some(self.early)
    }
}

impl Supervisor {
    /// A supervisor for one request: its store opens on a thread of its
    /// own, and its jobs are held before their execve until it is open
    /// (`supervisor/stores.rs`). With `first`, the request it will be
    /// asked, the Linux backend's init stage is started first of all, and
    /// that request's sandbox is built while the policy is compiled and
    /// decides (this module's doc). `execute` may still be given another
    /// request: then nothing started here is used, and it is killed.
    pub async fn open_one_shot(config: Config, first: Option<&JobRequest>) -> Result<Supervisor, SupervisorError> {
        Supervisor::open_one_shot_locked(config, first, None).await
    }

    /// As [`Supervisor::open_one_shot`], with `lock`, the store's lock the
    /// caller took already (`confine exec`, which must know whether it
    /// holds the store before it starts anything).
    pub async fn open_one_shot_locked(
        config: Config,
        first: Option<&JobRequest>,
        lock: Option<StoreLock>,
    ) -> Result<Supervisor, SupervisorError> {
        // The store opens first of all: upstream sled's start (its I/O
        // pool's threads, its recovery) is the longest part of a cold
        // request, longer than the sandbox's build, so it is started before
        // it (docs/benchmarks.md).
        let stores = StoreSlot::open_in_background(
            config.store_path(),
            lock,
            config.output.gc_interval_secs,
            config.store.min_free_bytes,
        )?;
        let (backend, seccomp) = Supervisor::backend(&config)?;
        let stage = match (first, backend, &seccomp) {
            (Some(req), backend, Some(profile)) if config.runtime.enabled => {
                let streams = Prestart { stdin_piped: req.stdin.is_some() };
                match Early::start(backend, streams.stdio(), Some(profile)) {
                    Ok(stage) => stage.map(|stage| (stage, streams)),
                    // Not fatal: the job then starts its own stage, as usual.
                    Err(e) => {
                        tracing::debug!(error = %e, "init stage not prestarted");
                        None
                    }
                }
            }
            _ => None,
        };
        let host = Supervisor::host(&config);
        let prestarted = match (stage, first) {
            (Some((stage, streams)), Some(req)) => {
                let planner = Planner { config: &config, host: &host, backend };
                speculate(&planner, req, stage, streams, seccomp.as_ref()).await
            }
            _ => None,
        };
        // A policy that fails to compile fails the supervisor: a held job
        // is dropped with it, which kills its tree.
        let sup = Supervisor::build_with(config, stores, backend, seccomp, true, host)?;
        if let Ok(mut slot) = sup.prestarted.lock() {
            *slot = prestarted;
        }
        Ok(sup)
    }

    /// A supervisor for one relayed request (a `confine exec` whose store
    /// this process holds): the request's own configuration and host
    /// (PATH, HOME), as its command would have had in its own process, on
    /// this supervisor's store, once it is open. Its own policy, backend
    /// and queue, as a one-shot supervisor has; no warm sandboxes. The
    /// policy runs on a blocking thread: other jobs of this process wait
    /// on the same runtime.
    pub(crate) async fn for_relayed(&self, mut config: Config, host: Host) -> Result<Supervisor, SupervisorError> {
        let stores = self.stores.share().await?;
        config.sandbox.warm = Some(0);
        let (backend, seccomp) = Supervisor::backend(&config)?;
        Supervisor::build_with(config, stores, backend, seccomp, false, host)
    }

    /// Kill whatever was started early for a request and left unused.
    pub fn discard_prestarted(&self) {
        if let Ok(mut p) = self.prestarted.lock() {
            // Dropped: the stage is killed and reaped; a held job's
            // cgroups are killed and removed.
            p.take();
        }
    }
}

/// Build `req`'s sandbox in `stage`, held, from the spec worked out before
/// the decision: the stage back if the request would be refused before it
/// runs (the pipeline then says why, in its order), nothing if the sandbox
/// failed (the stage is gone; the job gets a fresh one).
async fn speculate(
    planner: &Planner<'_>,
    req: &JobRequest,
    stage: Early,
    streams: Prestart,
    seccomp: Option<&SeccompProfile>,
) -> Option<Prestarted> {
    let policy_req = plan::policy_request(req, &planner.config.network);
    let limits = planner.config.resolve_limits(&policy_req.limits);
    let timeout = Duration::from_millis(limits.timeout_ms);
    let placed = planner
        .admit(req, &policy_req)
        .ok()
        .and_then(|admitted| planner.prepare(req, &admitted).ok())
        .and_then(|prepared| planner.place(req, &prepared, &limits, timeout).ok());
    let Some(mut placed) = placed else {
        return Some(Prestarted { early: stage, streams });
    };
    placed.spec.hold = true;
    match stage.build(&placed.spec, seccomp).await {
        Ok(held) => {
            tracing::debug!("sandbox of the first request started, held");
            Some(Prestarted { early: held, streams })
        }
        Err(e) => {
            tracing::debug!(error = %e, "sandbox not started before the decision");
            None
        }
    }
}
