//! The concurrency limit: at most `max_concurrent_jobs` jobs run, at most
//! `max_queued` wait, first come first served (tokio's semaphore is FIFO).
//!
//! This module owns admission only. It never runs or times a job; it tells
//! the caller how long a job waited, because a queued job's timeout
//! includes its wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a job was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Every slot is taken and the queue is full.
    #[error("busy: {running} jobs running, {queued} queued (retry later, or raise runtime.max_queued)")]
    Busy { running: usize, queued: usize },
    /// The job's whole timeout passed while it waited.
    #[error("timed out after {} ms waiting for a free slot ({running} jobs running)", .waited.as_millis())]
    TimedOut { waited: Duration, running: usize },
}

/// A fair queue in front of a fixed number of job slots.
#[derive(Debug, Clone)]
pub struct JobQueue {
    slots: Arc<Semaphore>,
    max_running: usize,
    max_queued: usize,
    waiting: Arc<AtomicUsize>,
}

/// A held slot; the slot is free again when this is dropped.
#[derive(Debug)]
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    /// How long the job waited for the slot.
    pub queued: Duration,
}

impl Slot {
    /// What is left of `timeout` after the wait.
    pub fn remaining(&self, timeout: Duration) -> Duration {
        timeout.saturating_sub(self.queued)
    }
}

/// Decrements the waiting count however the wait ends (admitted, timed
/// out, or the future dropped by a cancelled caller).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl JobQueue {
    /// `max_running` is at least 1.
    pub fn new(max_running: usize, max_queued: usize) -> JobQueue {
        let max_running = max_running.max(1);
        JobQueue {
            slots: Arc::new(Semaphore::new(max_running)),
            max_running,
            max_queued,
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Jobs holding a slot now.
    pub fn running(&self) -> usize {
        self.max_running - self.slots.available_permits()
    }

    /// Jobs waiting for a slot now.
    pub fn queued(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Take a slot, waiting in line at most `timeout`. Refused at once when
    /// no slot is free and `max_queued` jobs already wait.
    pub async fn acquire(&self, timeout: Duration) -> Result<Slot, QueueError> {
        let started = Instant::now();
        // A free slot and nobody waiting: no queueing at all. (Semaphore
        // hands released permits to waiters first, so this can't jump the line.)
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot { _permit: permit, queued: started.elapsed() });
        }
        let max = self.max_queued;
        if self.waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| (w < max).then_some(w + 1)).is_err() {
            return Err(QueueError::Busy { running: self.running(), queued: self.queued() });
        }
        let _waiting = Waiting(&self.waiting);
        match tokio::time::timeout(timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Slot { _permit: permit, queued: started.elapsed() }),
            // The semaphore is never closed; treat it like a full queue if it were.
            Ok(Err(_)) => Err(QueueError::Busy { running: self.running(), queued: self.queued() }),
            Err(_) => Err(QueueError::TimedOut { waited: started.elapsed(), running: self.running() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn a_free_slot_is_taken_without_queueing() {
        let q = JobQueue::new(2, 0);
        let a = q.acquire(LONG).await.unwrap();
        let _b = q.acquire(LONG).await.unwrap();
        assert_eq!(q.running(), 2);
        assert!(a.queued < Duration::from_millis(50));
        drop(a);
        assert_eq!(q.running(), 1);
    }

    #[tokio::test]
    async fn past_the_queue_a_call_is_rejected_busy() {
        let q = JobQueue::new(1, 1);
        let _running = q.acquire(LONG).await.unwrap();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.acquire(LONG).await.map(|s| s.queued) });
        while q.queued() < 1 {
            tokio::task::yield_now().await;
        }
        let err = q.acquire(LONG).await.unwrap_err();
        assert_eq!(err, QueueError::Busy { running: 1, queued: 1 });
        assert_eq!(err.to_string(), "busy: 1 jobs running, 1 queued (retry later, or raise runtime.max_queued)");
        waiter.abort();
    }

    #[tokio::test]
    async fn waiters_are_served_in_order_and_report_their_wait() {
        let q = JobQueue::new(1, 8);
        let first = q.acquire(LONG).await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (q2, order) = (q.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let slot = q2.acquire(LONG).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                slot.queued
            }));
            while q.queued() < i + 1 {
                tokio::task::yield_now().await;
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
        drop(first);
        let mut waits = Vec::new();
        for t in tasks {
            waits.push(t.await.unwrap());
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
        assert!(waits[0] >= Duration::from_millis(30), "{waits:?}");
        assert!(waits[3] > waits[0]);
        assert_eq!(q.queued(), 0);
    }

    #[tokio::test]
    async fn the_wait_counts_against_the_timeout() {
        let q = JobQueue::new(1, 4);
        let _running = q.acquire(LONG).await.unwrap();
        let err = q.acquire(Duration::from_millis(20)).await.unwrap_err();
        assert!(matches!(err, QueueError::TimedOut { running: 1, .. }), "{err}");
        assert_eq!(q.queued(), 0, "a timed-out waiter leaves the queue");
        let slot =
            Slot { _permit: q.slots.clone().try_acquire_many_owned(0).unwrap(), queued: Duration::from_millis(300) };
        assert_eq!(slot.remaining(Duration::from_secs(1)), Duration::from_millis(700));
        assert_eq!(slot.remaining(Duration::from_millis(100)), Duration::ZERO);
    }
}
