//! The supervisor's allocator settings, applied once when a long-lived
//! supervisor starts (`confine serve`, `confine exec`), before its threads.
//!
//! Why: output capture passes buffers of ~130 KiB between threads. glibc
//! raises its mmap threshold dynamically each time such a buffer is freed,
//! after which they come from the per-thread arenas instead, and freed
//! memory stays there: measured (benches/output.rs, 8 floods of 1 GiB in
//! one process), peak RSS grew to 98 MiB, and to 230 MiB with incompressible
//! output after them. A fixed 128 KiB threshold (which also turns the
//! dynamic adjustment off) keeps large buffers in their own mappings,
//! returned to the kernel when freed: 22–51 MiB for the same floods.
//! `M_ARENA_MAX = 2` was measured too and did not help reliably.
//!
//! This only tunes the allocator; it must never change what the program
//! computes. Off glibc (musl, macOS, Windows) it does nothing: those
//! allocators have no such threshold to set.

/// Allocations at or above this size get their own mapping (glibc's
/// default before its dynamic adjustment kicks in).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: libc::c_int = 128 * 1024;

/// Apply the settings; an operator's own `MALLOC_MMAP_THRESHOLD_` or
/// `GLIBC_TUNABLES` choice wins. Returns whether anything was changed.
pub fn tune_allocator() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some() || tunables.contains("mmap_threshold") {
            return false;
        }
        // SAFETY: mallopt only sets an allocator parameter (it takes the
        // arena locks itself); any value is validated by glibc.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused; RSS may grow over large outputs");
        }
        ok == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_threshold() {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            assert!(super::tune_allocator());
        }
    }
}
