//! Job ids and the wall clock in milliseconds: one of each for every part
//! of confine (the supervisor, the MCP server, every backend).

use std::sync::atomic::{AtomicU64, Ordering};

/// Milliseconds since the Unix epoch (0 for a clock set before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A new job id, `job-<ms>-<8 hex digits>`: the time it was made and 32
/// random bits (the OS's generator). It names the job's cgroups, its
/// private `/tmp` and its audit record, so it is made of letters, digits
/// and `-` only, and is not guessable ahead of time by a job that would
/// plant a file or a cgroup where the next one goes.
pub fn job_id() -> String {
    let mut rnd = [0u8; 4];
    if getrandom::fill(&mut rnd).is_err() {
        // No generator (a sandbox of our own host's, say): still unique in
        // this process, by a counter mixed with the pid.
        static N: AtomicU64 = AtomicU64::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed) ^ (u64::from(std::process::id()) << 16);
        rnd = (n as u32).to_le_bytes();
    }
    format!("job-{}-{}", now_ms(), hex::encode(rnd))
}

#[cfg(test)]
mod tests {
    #[test]
    fn job_ids_are_unique_and_name_safe() {
        let ids: std::collections::BTreeSet<String> = (0..1000).map(|_| super::job_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let rest = id.strip_prefix("job-").unwrap_or_default();
            let (ms, rnd) = rest.split_once('-').unwrap_or_default();
            assert!(ms.parse::<u64>().is_ok() && rnd.len() == 8, "{id}");
            assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'), "{id}");
        }
    }
}
