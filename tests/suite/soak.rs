//! A soak of `confine serve`: CONFINE_SOAK_JOBS jobs (default 200; the
//! long soak is 12,000) through the official MCP Python SDK over streamable
//! HTTP, four sessions at once, of every kind (tests/mcp_client/soak.py):
//! success, failure, timeout, OOM, output floods, background jobs killed,
//! calls cancelled mid-run, requests denied. Then what must hold: no fd
//! leaked by the server, no zombie or orphan, no job cgroup left, the
//! host's mount table as it was, the server's RSS within 10% of its size
//! after warm-up, the store within its cap after `confine gc`, and an
//! audit trail that verifies with one record per request.
//!
//! The full soak, on the binary users run (docs/reliability.md):
//! `CONFINE_SOAK_JOBS=2000 CONFINE_SOAK_BIN=target/<host>/release/confine
//! cargo test --test all suite::soak::`; the long one is 12,000 jobs.
//! `CONFINE_SOAK_SMAPS=<dir>` also keeps the idle server's
//! `/proc/<pid>/smaps` at each mark (`smaps-<jobs done>`), to see which
//! mappings grew.

use crate::common;
use common::mcp::{setup_venv, skip as mcp_skip};
use common::rpc::job_cgroups;
use common::{readable_repo, sandbox_available};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The binary soaked: this build's, or CONFINE_SOAK_BIN (the full soak
/// runs the release binary users run; a debug build's allocations differ).
fn exe() -> String {
    std::env::var("CONFINE_SOAK_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_confine").to_string())
}

fn fds(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some(format!("{} -> {}", e.file_name().to_string_lossy(), target.display()))
        })
        .collect()
}

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0)
}

/// The idle server, measured twice: 2 s after the client stopped (the
/// teardowns of the jobs just ended finish off the request path), and again
/// once the runtime's blocking threads started for those jobs have retired
/// (tokio lets an idle one go after 10 s). Each thread holds what it last
/// used: its stack's touched pages, its allocator cache, and what sled
/// retired on it (`store::release_garbage`); how many are alive when the
/// client stops depends on how many jobs overlapped just before. The RSS
/// compared across the soak is the settled one.
struct Idle {
    fds: BTreeSet<String>,
    rss_busy: u64,
    threads_busy: usize,
    rss: u64,
    /// The settled RSS's anonymous and file-backed parts (KiB).
    anon_file: (u64, u64),
    threads: usize,
}

fn measure_idle(pid: u32, jobs_done: usize) -> Idle {
    std::thread::sleep(Duration::from_secs(2));
    let (rss_busy, threads_busy) = (rss_kib(pid), threads(pid));
    std::thread::sleep(Duration::from_secs(11));
    let anon_file = (status_kib(pid, "RssAnon:"), status_kib(pid, "RssFile:"));
    if let Ok(dir) = std::env::var("CONFINE_SOAK_SMAPS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(format!("/proc/{pid}/smaps"), Path::new(&dir).join(format!("smaps-{jobs_done:05}"))).unwrap();
    }
    Idle { fds: fds(pid), rss_busy, threads_busy, rss: rss_kib(pid), anon_file, threads: threads(pid) }
}

fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A field of `/proc/<pid>/status`, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap()
}

/// The host's mounts: mount point and file system type, as this process
/// (in the host's mount namespace) sees them. Other suites run beside this
/// one in the same binary and mount file systems of their own in their
/// temporary directories: those are not the server's, and are left out
/// (the soak's own directory, `mine`, is not).
fn mounts(mine: &Path) -> BTreeSet<String> {
    let others = std::env::temp_dir().join(".tmp");
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-").unwrap_or(f.len() - 1);
            let point = f[4];
            let theirs = point.starts_with(others.to_str()?) && !Path::new(point).starts_with(mine);
            (!theirs).then(|| format!("{point} {}", f.get(sep + 1).unwrap_or(&"")))
        })
        .collect()
}

/// Processes that are the server's zombie children, or that carry the
/// soak's marker in their command line (a job that outlived its end).
fn leftovers(server: u32, marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Ok(pid) = name.parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (state, ppid) = (f[0], f[1].parse::<u32>().unwrap_or(0));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if (ppid == server && state == "Z") || String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(format!("{pid} {state} ppid {ppid}: {}", String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// Kills the server when a failed assertion unwinds past it: a failed
/// soak must not leave a server running.
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                total += meta.len();
            }
        }
    }
    total
}

#[test]
fn a_soak_through_a_real_client_leaks_nothing_and_loses_nothing() {
    if !sandbox_available() {
        return;
    }
    let python = match setup_venv() {
        Ok(p) => p,
        Err(e) => return mcp_skip(&format!("the MCP Python SDK: {e}")),
    };
    let jobs: usize = std::env::var("CONFINE_SOAK_JOBS").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
    let dir = tempfile::tempdir().unwrap();
    let repo = readable_repo(dir.path());
    let store = dir.path().join("store");
    // A cap below what the jobs store, so that the server's own GC and
    // `confine gc` have work: a flood is 4 MB of output before compression.
    let cap: u64 = 2 << 20;
    let config = dir.path().join("confine.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nenabled = true\nmax_concurrent_jobs = 4\n\n[limits]\nmemory_bytes = 67108864\n\n[store]\npath = \"{}\"\n\n[output]\nmax_store_bytes = {cap}\n\n\
             [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
            store.display(),
            repo.display()
        ),
    )
    .unwrap();
    let token = "soak-token-0123456789abcdef0123456789";
    let exe = exe();
    eprintln!("soak: {jobs} jobs on {exe}");
    let mut server = Command::new(&exe)
        .arg("--config")
        .arg(&config)
        .args(["serve", "--http", "127.0.0.1:0"])
        .env("CONFINE_TOKEN", token)
        .env("CONFINE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = server.id();
    let _kill_on_failure = KillOnDrop(pid);
    let (tx, rx) = mpsc::channel();
    let stderr = BufReader::new(server.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("streamable HTTP at http://").nth(1) {
                let _ = tx.send(rest.split("/mcp").next().unwrap_or_default().to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).expect("the server did not print its address");
    let mounts_before = mounts(dir.path());
    let marker = format!("soakmark{}", std::process::id());
    // Warm-up: the first half of the jobs, or CONFINE_SOAK_WARMUP; then
    // two marks between it and the end, where the idle server is measured
    // again. Until then the allocator's arenas grow to the server's
    // working set; sled's cache (4 MiB of pages) fills with audit records
    // for longer on a fresh store: growth, but bounded.
    // What the check must catch is growth that goes on in a steady state
    // (docs/reliability.md).
    let warm = std::env::var("CONFINE_SOAK_WARMUP").ok().and_then(|n| n.parse().ok()).unwrap_or(jobs / 2).min(jobs - 3);
    let marks = [warm, warm + (jobs - warm) / 3, warm + 2 * (jobs - warm) / 3];
    let checkpoints = dir.path().join("checkpoints");
    std::fs::create_dir(&checkpoints).unwrap();
    let mut client = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client/soak.py"))
        .arg(format!("http://{addr}/mcp"))
        .args(["--token", token, "--jobs", &jobs.to_string(), "--workers", "4", "--marker", &marker])
        .arg("--checkpoint-dir")
        .arg(&checkpoints)
        .args(["--marks", &marks.iter().map(|m| m.to_string()).collect::<Vec<_>>().join(",")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let limit = Duration::from_secs(120 + jobs as u64);
    // At each mark the client stops: the idle server's fds and RSS.
    let mut idle: Vec<Idle> = Vec::new();
    let status = loop {
        let k = idle.len() + 1;
        if checkpoints.join(format!("checkpoint-{k}")).exists() {
            idle.push(measure_idle(pid, marks.get(k - 1).copied().unwrap_or(jobs)));
            std::fs::write(checkpoints.join(format!("ack-{k}")), "").unwrap();
        }
        if let Some(s) = client.try_wait().unwrap() {
            break s;
        }
        assert!(started.elapsed() < limit, "the soak did not end within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut report = String::new();
    std::io::Read::read_to_string(client.stdout.as_mut().unwrap(), &mut report).unwrap();
    let mut errors = String::new();
    std::io::Read::read_to_string(client.stderr.as_mut().unwrap(), &mut errors).unwrap();
    assert!(status.success(), "the soak failed:\n{report}\n{errors}");
    let summary: serde_json::Value = serde_json::from_str(report.lines().last().unwrap()).unwrap();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("soak: {summary} in {seconds:.1} s");
    assert_eq!(summary["jobs"], jobs as u64, "{summary}");

    // Cancelled and killed jobs end within their grace: give them it.
    // The server's warm sandboxes (`warm-…`) wait on, each in cgroups of
    // its own: no more of them than the pool holds.
    let jobs_left = || {
        let (warm, done): (Vec<_>, Vec<_>) = job_cgroups(pid)
            .into_iter()
            .partition(|d| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("warm-")));
        let waiting: BTreeSet<String> =
            warm.iter().filter_map(|d| Some(d.file_name()?.to_string_lossy().split('.').next()?.to_string())).collect();
        (done, waiting)
    };
    let settle = Instant::now();
    let mut left = (leftovers(pid, &marker), jobs_left());
    while (!left.0.is_empty() || !left.1 .0.is_empty()) && settle.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        left = (leftovers(pid, &marker), jobs_left());
    }
    assert!(left.0.is_empty(), "processes left behind: {:#?}", left.0);
    assert!(left.1 .0.is_empty(), "job cgroups left behind: {:#?}", left.1 .0);
    assert!(
        left.1 .1.len() <= confine::supervisor::DEFAULT_WARM,
        "more warm sandboxes than the pool holds: {:#?}",
        left.1 .1
    );
    idle.push(measure_idle(pid, jobs));
    let rss: Vec<u64> = idle.iter().map(|i| i.rss).collect();
    let busy: Vec<(u64, usize)> = idle.iter().map(|i| (i.rss_busy, i.threads_busy)).collect();
    let nthreads: Vec<usize> = idle.iter().map(|i| i.threads).collect();
    let nfds: Vec<usize> = idle.iter().map(|i| i.fds.len()).collect();
    let parts: Vec<(u64, u64)> = idle.iter().map(|i| i.anon_file).collect();
    eprintln!(
        "soak: the idle server after {marks:?} and {jobs} jobs: RSS {rss:?} KiB (anonymous, file: {parts:?}), \
         threads {nthreads:?}, fds {nfds:?}; 2 s after the client stopped: (RSS KiB, threads) {busy:?}"
    );
    assert_eq!(idle.len(), 4, "{} checkpoints", idle.len());
    // From the end of the warm-up: no fd more and at most 10% more memory.
    let (fds_warm, rss_warm) = (&idle[0].fds, &idle[0].rss);
    let (fds_end, rss_end) = (&idle[3].fds, &idle[3].rss);
    let grown: Vec<&String> = fds_end.difference(fds_warm).collect();
    assert!(fds_end.len() <= fds_warm.len(), "fds grew from {} to {}: {grown:#?}", fds_warm.len(), fds_end.len());
    assert!(rss_end * 10 <= rss_warm * 11, "the server's RSS grew from {rss_warm} KiB to {rss_end} KiB: {rss:?}");
    assert_eq!(mounts(dir.path()), mounts_before, "the host's mount table changed");

    // SIGTERM: the server ends cleanly and lets go of the store.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let ended = common::mcp::wait_for(&mut server, Duration::from_secs(30));
    assert!(ended.is_some_and(|s| s.success()), "the server did not end cleanly: {ended:?}");

    // The store after gc: the artifacts within the cap, and the directory
    // not much past it (sled's records and log besides).
    let gc = Command::new(&exe).arg("--config").arg(&config).args(["gc", "--json"]).output().unwrap();
    assert!(gc.status.success(), "gc: {}", String::from_utf8_lossy(&gc.stderr));
    let gc: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    let kept = gc["keptBytes"].as_u64().or_else(|| gc["kept_bytes"].as_u64()).unwrap();
    eprintln!("soak: gc {gc}; the store is {} bytes", dir_bytes(&store));
    assert!(kept <= cap, "{kept} bytes of artifacts kept past the cap of {cap}: {gc}");
    let verify = Command::new(&exe).arg("--config").arg(&config).args(["audit", "verify"]).output().unwrap();
    let said = String::from_utf8_lossy(&verify.stdout).to_string();
    assert!(verify.status.success(), "audit verify: {said}");
    let records: u64 = said.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap();
    assert_eq!(records, summary["executeCalls"].as_u64().unwrap(), "one audit record per request: {said}");
}
