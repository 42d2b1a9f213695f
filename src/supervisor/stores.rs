//! What the supervisor keeps in the sled store (audit trail, artifacts,
//! the GC clock), and when it is there: opened before the supervisor
//! exists ([`StoreSlot::opened`], `confine serve`), or on a thread of its
//! own while the first request is admitted and its sandbox is built
//! ([`StoreSlot::open_in_background`], one-shot `confine exec`).
//!
//! Opening sled costs milliseconds (recovery, a snapshot with two fsyncs,
//! its I/O threads). A one-shot supervisor need not wait for that before
//! it decides on the request and builds the sandbox; it must wait before
//! the job's execve (the job is held until then) and before any record.
//! A store that fails to open fails the request: the held job is killed
//! unreleased, so nothing runs that could not be audited.

// Off Linux there is no governed execution (no `exec`): nothing waits.
#![cfg_attr(not(target_os = "linux"), allow(dead_code))]

use super::gc::GcSchedule;
use super::SupervisorError;
use crate::store::artifacts::Artifacts;
use crate::store::audit::{AuditEntry, AuditError, AuditLog, AuditSink, RECORDED_LATE_NOTE};
use crate::store::{Store, StoreError, StoreLock};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// Why a job may not be let run ([`Stores::admit`]): no record, no job.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    /// The store has no room, or has failed.
    #[error(transparent)]
    Room(#[from] StoreError),
    #[error(transparent)]
    Unrecorded(#[from] Unrecorded),
    #[error("the job's start could not be recorded, so it did not run: {0}")]
    Start(AuditError),
}

/// An earlier job's record, kept by [`Stores::keep_unrecorded`], still
/// can't be written.
#[derive(Debug, thiserror::Error)]
#[error("an earlier job's audit record could not be written yet ({0}): no job runs until it is")]
pub(crate) struct Unrecorded(AuditError);

/// The open store and the trees the supervisor uses.
pub struct Stores {
    pub store: Store,
    pub audit: AuditLog,
    pub artifacts: Artifacts,
    pub(crate) gc: GcSchedule,
    /// Records of jobs that ran and could not be appended (the disk was
    /// full): written before the next job is let run ([`Stores::admit`]).
    unrecorded: Mutex<Vec<AuditEntry>>,
}

impl Stores {
    fn open(store: Store, gc_interval_secs: u64, min_free_bytes: u64) -> Result<Stores, SupervisorError> {
        store.set_min_free(min_free_bytes);
        Ok(Stores {
            audit: AuditLog::open(&store)?,
            artifacts: Artifacts::open(&store)?,
            gc: GcSchedule::open(&store, gc_interval_secs)?,
            store,
            unrecorded: Mutex::new(Vec::new()),
        })
    }

    /// Whether a job may be let run, and its start in the trail if so: the
    /// store has room and has not failed, the records of earlier jobs that
    /// could not be written are written now, and the job's own entry is
    /// pending, flushed. No record, no job.
    pub(crate) fn admit(&self, started: &AuditEntry) -> Result<(), AdmitError> {
        self.store.check_room()?;
        self.write_unrecorded()?;
        self.audit.begin(started).map_err(AdmitError::Start)
    }

    /// Keep `entry`, whose append failed, for [`Stores::admit`] to write.
    pub(crate) fn keep_unrecorded(&self, entry: AuditEntry) {
        self.unrecorded.lock().unwrap_or_else(|p| p.into_inner()).push(entry);
    }

    /// Append the records kept by [`Stores::keep_unrecorded`], each noted
    /// as written late (its job's answer said it was not written).
    pub(crate) fn write_unrecorded(&self) -> Result<(), Unrecorded> {
        let mut left = self.unrecorded.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(entry) = left.first() {
            let mut late = entry.clone();
            late.note = Some(RECORDED_LATE_NOTE.to_string());
            if let Err(e) = self.audit.append(late) {
                // The job is another caller's: its id goes to the log only.
                tracing::warn!(job = %entry.id, error = %e, "a job's audit record still can't be written");
                return Err(Unrecorded(e));
            }
            tracing::info!(job = %entry.id, "a job's audit record, refused before, is written");
            left.remove(0);
        }
        Ok(())
    }
}

/// The stores, now or soon.
pub(crate) struct StoreSlot {
    /// Set once, by whoever opened the store; an error is kept (every
    /// later request reports the same failure).
    ready: Arc<OnceLock<Result<Stores, Arc<SupervisorError>>>>,
    /// The opener thread, until someone joined it.
    opener: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Turns true when `ready` is set: async waiters need no thread.
    done: tokio::sync::watch::Receiver<bool>,
}

impl StoreSlot {
    /// A store the caller already opened.
    pub(crate) fn opened(
        store: Store,
        gc_interval_secs: u64,
        min_free_bytes: u64,
    ) -> Result<StoreSlot, SupervisorError> {
        let stores = Stores::open(store, gc_interval_secs, min_free_bytes)?;
        let (_, done) = tokio::sync::watch::channel(true);
        Ok(StoreSlot { ready: Arc::new(OnceLock::from(Ok(stores))), opener: Mutex::new(None), done })
    }

    /// Start opening the store at `path` on a thread of its own, for a
    /// supervisor of one request: without sled's flusher thread
    /// ([`Store::open_flushed_by_caller`]), since it flushes what it writes.
    /// With `lock`, the store's lock the caller took already.
    pub(crate) fn open_in_background(
        path: PathBuf,
        lock: Option<StoreLock>,
        gc_interval_secs: u64,
        min_free_bytes: u64,
    ) -> Result<StoreSlot, SupervisorError> {
        let ready: Arc<OnceLock<Result<Stores, Arc<SupervisorError>>>> = Arc::new(OnceLock::new());
        let (tx, done) = tokio::sync::watch::channel(false);
        let slot = ready.clone();
        let opener = std::thread::Builder::new()
            .name("confine-store-open".into())
            .spawn(move || {
                // A supervisor for one request flushes every write it makes
                // before it answers (the audit append) or exits (GC).
                let opened = match lock {
                    Some(lock) => Store::open_locked_flushed_by_caller(&path, lock),
                    None => Store::open_flushed_by_caller(&path),
                };
                let opened = opened
                    .map_err(SupervisorError::from)
                    .and_then(|s| Stores::open(s, gc_interval_secs, min_free_bytes))
                    .map_err(Arc::new);
                tracing::debug!(ok = opened.is_ok(), "store opened");
                let _ = slot.set(opened);
                let _ = tx.send(true);
            })
            .map_err(|e| SupervisorError::StoreUnavailable(format!("cannot start the thread that opens it: {e}")))?;
        Ok(StoreSlot { ready, opener: Mutex::new(Some(opener)), done })
    }

    /// The same stores, for another supervisor of this process (a relayed
    /// `confine exec`'s): once this slot's store is open (waited for
    /// here), or the failure it opened with.
    #[cfg(target_os = "linux")]
    pub(crate) async fn share(&self) -> Result<StoreSlot, SupervisorError> {
        self.wait().await?;
        Ok(StoreSlot { ready: self.ready.clone(), opener: Mutex::new(None), done: self.done.clone() })
    }

    /// Whether the store is open (or failed to open) already.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.get().is_some()
    }

    /// The stores, waiting (blocking this thread) for the opener if needed.
    pub(crate) fn get(&self) -> Result<&Stores, SupervisorError> {
        if self.ready.get().is_none() {
            // Joined under the lock: a second caller waits here until the
            // first one's join has returned, and `ready` is set by then.
            if let Ok(mut opener) = self.opener.lock() {
                if let Some(handle) = opener.take() {
                    // A panic there leaves `ready` unset: reported below.
                    let _ = handle.join();
                }
            }
        }
        self.result()
    }

    /// The stores, waiting (without blocking a runtime thread) if needed.
    pub(crate) async fn wait(&self) -> Result<&Stores, SupervisorError> {
        let mut done = self.done.clone();
        // A dropped sender (the opener panicked) ends the wait too.
        let _ = done.wait_for(|d| *d).await;
        if self.ready.get().is_none() {
            return self.get();
        }
        self.result()
    }

    fn result(&self) -> Result<&Stores, SupervisorError> {
        match self.ready.get() {
            Some(Ok(stores)) => Ok(stores),
            Some(Err(e)) => Err(SupervisorError::NotOpened(e.clone())),
            None => Err(SupervisorError::StoreUnavailable("the thread opening it failed".into())),
        }
    }
}
