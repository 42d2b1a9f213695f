//! Progress notifications for long calls: a task that samples the job's
//! latest [`Progress`] and sends `notifications/progress` on a fixed beat
//! (1 s; the contract promises at most 2 s between them), for as long as
//! the call runs.
//!
//! It only reads a watch channel: a slow client can never slow the job.

use super::service::Progress;
use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Time between two progress notifications.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Start reporting; reporting stops when the returned guard is dropped.
pub fn spawn_reporter(
    peer: Peer<RoleServer>,
    token: ProgressToken,
    mut latest: watch::Receiver<Progress>,
    interval: Duration,
) -> DropGuard {
    let stop = CancellationToken::new();
    let guard = stop.clone().drop_guard();
    let started = Instant::now();
    tokio::spawn(async move {
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut last = 0.0_f64;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = beat.tick() => {}
            }
            let p = *latest.borrow_and_update();
            let elapsed_ms = p.elapsed_ms.max(started.elapsed().as_millis() as u64);
            // The spec wants `progress` to grow with every notification;
            // elapsed time does, even when the job prints nothing.
            let progress = (elapsed_ms as f64).max(last + 1.0);
            last = progress;
            let message = format!("running for {:.1}s, {} bytes of output so far", elapsed_ms as f64 / 1000.0, p.bytes);
            let note = ProgressNotificationParam::new(token.clone(), progress).with_message(message);
            if let Err(e) = peer.notify_progress(note).await {
                tracing::debug!(error = %e, "progress notification failed; the client is gone");
                break;
            }
        }
    });
    guard
}
