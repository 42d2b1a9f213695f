//! Named points where a debug build kills itself with SIGKILL, for the
//! tests that prove a crash at the worst moment loses nothing that was
//! answered (tests/suite/faults.rs). `CONFINE_TEST_CRASH_AT=point:n` kills the
//! process the n-th time it reaches `point` (1: the first time).
//!
//! Release builds compile [`reached`] to nothing: the variable is never
//! read, so no one can make a production supervisor crash on purpose.
//!
//! [`linger`] is the same for a pause: `CONFINE_TEST_LINGER_AT=point:ms`
//! makes a debug build wait that long at `point`, so that a test can
//! give a process that should not run the time it would need to show it
//! ran (a held job the supervisor drops unreleased, say).
//!
//! [`refused`] stands in for a refusal: a debug build acts as if the
//! kernel had refused what is done at that point.

/// The variable for [`refused`].
pub const REFUSE_ENV: &str = "CONFINE_TEST_REFUSE";

/// Whether the tests asked a debug build to act as if the kernel refused
/// what is done at `point` (`CONFINE_TEST_REFUSE=point[,point…]`): how
/// they reach the answer to a refusal this host never gives (an LSM's).
/// Always false in a release build.
pub fn refused(point: &'static str) -> bool {
    #[cfg(all(debug_assertions, unix))]
    {
        std::env::var(REFUSE_ENV).is_ok_and(|v| v.split(',').any(|p| p == point))
    }
    #[cfg(not(all(debug_assertions, unix)))]
    {
        let _ = point;
        false
    }
}

/// The variable the tests set.
pub const ENV: &str = "CONFINE_TEST_CRASH_AT";

/// The variable for [`linger`].
pub const LINGER_ENV: &str = "CONFINE_TEST_LINGER_AT";

/// Wait here as long as the tests said (debug builds); nothing in a
/// release build.
pub async fn linger(point: &'static str) {
    #[cfg(all(debug_assertions, unix))]
    {
        let ms = std::env::var(LINGER_ENV).ok().and_then(|v| {
            let (p, ms) = v.split_once(':')?;
            (p == point).then(|| ms.parse::<u64>().ok()).flatten()
        });
        if let Some(ms) = ms {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
    #[cfg(not(all(debug_assertions, unix)))]
    let _ = point;
}

/// A point on the store's write path was reached: die here if the tests
/// said so. SIGKILL, not `abort`: no handler, no unwinding, no flush;
/// exactly what `kill -9` from outside does.
#[inline]
pub fn reached(point: &'static str) {
    #[cfg(all(debug_assertions, unix))]
    armed::reached(point);
    #[cfg(not(all(debug_assertions, unix)))]
    let _ = point;
}

#[cfg(all(debug_assertions, unix))]
mod armed {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// The point and count asked for, read once.
    fn target() -> Option<&'static (String, u64)> {
        static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
        TARGET
            .get_or_init(|| {
                let v = std::env::var(super::ENV).ok()?;
                let (point, n) = v.split_once(':')?;
                Some((point.to_string(), n.parse().ok()?))
            })
            .as_ref()
    }

    pub(super) fn reached(point: &'static str) {
        static PASSES: AtomicU64 = AtomicU64::new(0);
        let Some((wanted, n)) = target() else { return };
        if wanted == point && PASSES.fetch_add(1, Ordering::SeqCst) + 1 == *n {
            // SAFETY: kill(2) on our own pid; SIGKILL can't be caught.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
    }
}
