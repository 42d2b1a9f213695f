//! sled's I/O thread pool starts no thread when a store opens, and a flush
//! still completes when no thread can be started
//! (`vendor/sled/CONFINE-PATCH.md`, change 17).
//!
//! One test, in a file (a process) of its own: sled's pool is global to
//! the process, and other tests' stores would have started its threads.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Threads of this process whose name says sled's I/O pool started them.
fn sled_io_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("sled-io")))
        .count()
}

/// This process's own cgroup in the v1 `pids` hierarchy.
fn own_pids_cgroup() -> Option<PathBuf> {
    let root = Path::new("/sys/fs/cgroup/pids");
    if !root.join("cgroup.procs").exists() {
        return None;
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = own.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers.split(',').any(|c| c == "pids").then(|| path.trim_start_matches('/').to_string())
    })?;
    Some(root.join(rel))
}

/// A pids cgroup this process sits in; dropped, the process goes back
/// where it was and the cgroup is removed.
struct NoNewThreads {
    dir: PathBuf,
    home: PathBuf,
}

impl NoNewThreads {
    fn enter(home: PathBuf) -> NoNewThreads {
        let dir = home.join(format!("confine-test-threads-{}", std::process::id()));
        std::fs::create_dir(&dir).unwrap();
        let guard = NoNewThreads { dir, home };
        std::fs::write(guard.dir.join("cgroup.procs"), std::process::id().to_string()).unwrap();
        guard
    }

    /// No room for one more thread.
    fn full(&self) {
        let current = std::fs::read_to_string(self.dir.join("pids.current")).unwrap();
        std::fs::write(self.dir.join("pids.max"), current.trim()).unwrap();
    }
}

impl Drop for NoNewThreads {
    fn drop(&mut self) {
        let _ = std::fs::write(self.home.join("cgroup.procs"), std::process::id().to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_store_starts_no_io_thread_and_flushes_when_none_can_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    // As `Store::open` configures sled, but without the flusher thread: its
    // rounds would flush, and start a pool thread before the test is ready.
    let open = || sled::Config::new().path(&path).cache_capacity(16 << 20).flush_every_ms(None).open().unwrap();
    let store = open();
    assert_eq!(sled_io_threads(), 0, "opening the store started sled I/O threads");
    let tree = store.open_tree("t").unwrap();
    tree.insert(b"first", b"1").unwrap();
    assert_eq!(sled_io_threads(), 0, "a write that nothing flushed started sled I/O threads");

    if !common::is_root() {
        return common::skip("moving this test into a pids cgroup needs root");
    }
    let Some(home) = own_pids_cgroup() else {
        return common::skip("no v1 pids hierarchy at /sys/fs/cgroup/pids");
    };
    let cage = NoNewThreads::enter(home.clone());
    // Without the fallback the flush below waits forever for a write that
    // no thread will do: fail instead of hanging CI. Started before the
    // cgroup is full (its own thread is counted in).
    let done = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let done = done.clone();
        let dir = cage.dir.clone();
        std::thread::spawn(move || {
            for _ in 0..300 {
                std::thread::sleep(Duration::from_millis(100));
                if done.load(Ordering::SeqCst) {
                    return;
                }
            }
            eprintln!("the flush hung: a task waits in sled's pool, which has no thread");
            // No unwinding past a hung thread: clean up here, then abort.
            let _ = std::fs::write(home.join("cgroup.procs"), std::process::id().to_string());
            let _ = std::fs::remove_dir(&dir);
            std::process::abort();
        })
    };
    cage.full();
    assert!(std::thread::Builder::new().spawn(|| ()).is_err(), "the pids cgroup still lets a thread start");
    tree.insert(b"second", b"2").unwrap();
    store.flush().unwrap();
    done.store(true, Ordering::SeqCst);
    assert_eq!(sled_io_threads(), 0, "a pool thread started in a cgroup that had no room for one");
    drop(cage);
    watchdog.join().unwrap();
    drop((tree, store));
    let store = open();
    let tree = store.open_tree("t").unwrap();
    assert_eq!(tree.get(b"second").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(tree.get(b"first").unwrap().as_deref(), Some(&b"1"[..]));
}
