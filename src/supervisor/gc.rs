//! When artifact GC runs by itself: after a job, at most once every
//! `output.gc_interval_secs`, on a blocking thread, after the response's
//! audit record and artifact were flushed and without the caller waiting.
//! (How GC works is [`crate::store::artifacts`]'s business.) The audit
//! trail's sealing of old records ([`crate::store::audit`]) runs the same
//! way, whenever enough records are live, whatever the interval.
//!
//! The time of the last run is kept in the store, so one-shot supervisors
//! (`confine exec` in a CI loop) share the interval instead of collecting
//! on every call. GC is only needed after jobs: they are what grows the
//! store, and an expired artifact is never served even before it is
//! removed. `confine gc` still runs it by hand.

use crate::store::artifacts::Artifacts;
use crate::store::audit::AuditLog;
use crate::store::{Store, StoreError, Table};
use std::sync::atomic::{AtomicU64, Ordering};

const LAST_RUN_KEY: &[u8] = b"artifactGc.lastRunMs";

/// The automatic GC's clock.
pub(crate) struct GcSchedule {
    /// 0: never by itself.
    interval_ms: u64,
    last_ms: AtomicU64,
    store: Store,
}

impl GcSchedule {
    pub(crate) fn open(store: &Store, interval_secs: u64) -> Result<GcSchedule, StoreError> {
        let last = store
            .get(Table::Supervisor, LAST_RUN_KEY)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_be_bytes);
        Ok(GcSchedule {
            interval_ms: interval_secs.saturating_mul(1000),
            last_ms: AtomicU64::new(last),
            store: store.clone(),
        })
    }

    /// Whether a run is due at `now`; true for one caller only per
    /// interval. A clock that jumped back by more than the interval makes
    /// a run due too, so a wrong clock can't stop GC for long.
    pub(crate) fn claim(&self, now: u64) -> bool {
        if self.interval_ms == 0 {
            return false;
        }
        let last = self.last_ms.load(Ordering::Acquire);
        if now.abs_diff(last) < self.interval_ms {
            return false;
        }
        if self.last_ms.compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        if let Err(e) = self.store.put(Table::Supervisor, LAST_RUN_KEY, &now.to_be_bytes()) {
            tracing::warn!(error = %e, "could not record the artifact GC time; the next supervisor may collect early");
        }
        true
    }
}

/// Collect the artifacts (when given) and seal old audit records (when
/// given) on a blocking thread of the current tokio runtime, or here when
/// there is none. Never fails the caller: a failure is logged, and the
/// next run tries again.
pub(crate) fn spawn(
    artifacts: Option<Artifacts>,
    audit: Option<AuditLog>,
    max_total_bytes: u64,
) -> Option<tokio::task::JoinHandle<()>> {
    let collect = move || {
        if let Some(audit) = audit {
            match audit.seal() {
                Ok(n) => tracing::info!(sealed = n, "audit records sealed"),
                Err(e) => tracing::warn!(error = %e, "sealing audit records failed (the next job tries again)"),
            }
        }
        if let Some(artifacts) = artifacts {
            collect_artifacts(&artifacts, max_total_bytes);
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => Some(rt.spawn_blocking(move || crate::store::releasing(collect))),
        Err(_) => {
            collect();
            None
        }
    }
}

fn collect_artifacts(artifacts: &Artifacts, max_total_bytes: u64) {
    match artifacts.gc(max_total_bytes) {
        Ok(r) => tracing::info!(
            expired = r.expired,
            incomplete = r.incomplete,
            orphans = r.orphans,
            evicted = r.evicted,
            freed_bytes = r.freed_bytes,
            kept = r.kept,
            "artifact gc"
        ),
        Err(e) => tracing::warn!(error = %e, "artifact gc failed (`confine gc` runs it by hand)"),
    }
}

/// For tests: when the last automatic run was claimed (ms since the epoch).
#[cfg(test)]
impl GcSchedule {
    fn last(&self) -> u64 {
        self.last_ms.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_store(dir: &std::path::Path) -> Store {
        // sled lets go of its directory lock shortly after the last handle drops.
        for _ in 0..100 {
            if let Ok(s) = Store::open(dir) {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Store::open(dir).unwrap()
    }

    fn entry(id: &str) -> crate::store::audit::AuditEntry {
        crate::store::audit::AuditEntry {
            runtime: "shell".into(),
            operation: "execute".into(),
            executable: "bash".into(),
            cwd: ".".into(),
            status: crate::job::Status::Success,
            duration_ms: 1,
            exit_code: Some(0),
            ..crate::store::audit::AuditEntry::bare(id)
        }
    }

    /// What the supervisor starts after a job when sealing is due: the
    /// audit log's old records are sealed, with or without an artifact GC
    /// beside it, and the chain still verifies.
    #[test]
    fn a_due_seal_runs_in_the_background_collection() {
        use crate::store::audit::AuditSink;
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path());
        let log = AuditLog::open(&store).unwrap().with_block_len(3);
        for i in 0..5 {
            log.append(entry(&format!("job-{i}"))).unwrap();
        }
        assert!(!log.seal_due().unwrap(), "5 live records, blocks of 3: not due");
        log.append(entry("job-5")).unwrap();
        assert!(log.seal_due().unwrap());
        // No tokio runtime here: the collection runs on this thread.
        assert!(spawn(None, Some(log.clone()), 0).is_none());
        assert!(!log.seal_due().unwrap());
        assert_eq!(store.tree(crate::store::audit::BLOCKS_TREE).unwrap().len(), 1);
        assert_eq!(log.verify().unwrap().records, 6);
        assert!(log.verify().unwrap().ok());
    }

    #[test]
    fn one_run_per_interval_and_none_when_off() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path());
        let g = GcSchedule::open(&store, 60).unwrap();
        assert!(g.claim(1_000_000), "the first job after start collects");
        assert!(!g.claim(1_000_000 + 59_999));
        assert!(g.claim(1_000_000 + 60_000));
        assert!(g.claim(1_000), "a clock that jumped back does not stop GC");
        let off = GcSchedule::open(&store, 0).unwrap();
        assert!(!off.claim(u64::MAX));
    }

    #[test]
    fn the_last_run_is_remembered_across_supervisors() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = open_store(dir.path());
            assert!(GcSchedule::open(&store, 600).unwrap().claim(5_000_000));
            store.flush().unwrap();
        }
        let store = open_store(dir.path());
        let g = GcSchedule::open(&store, 600).unwrap();
        assert_eq!(g.last(), 5_000_000);
        assert!(!g.claim(5_000_000 + 1000), "the next one-shot supervisor waits for the interval");
    }
}
