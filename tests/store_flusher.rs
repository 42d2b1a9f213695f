//! A store opened for one request (`confine exec`'s) starts no sled
//! flusher thread, and what it wrote and flushed is there when the store
//! is opened again; a store opened the usual way (`confine serve`'s) still
//! has its flusher, which writes what nobody flushed.
//!
//! In a file (a process) of its own: threads are counted process-wide, and
//! other tests' stores would have started flushers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use confine::store::Store;
use std::time::{Duration, Instant};

/// Threads of this process named as sled names its flusher.
fn flusher_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "log flusher"))
        .count()
}

#[test]
fn a_store_for_one_request_has_no_flusher_and_keeps_what_it_flushed() {
    let one = tempfile::tempdir().unwrap();
    {
        let store = Store::open_flushed_by_caller(one.path()).unwrap();
        let tree = store.tree("t").unwrap();
        tree.insert("k", "flushed").unwrap();
        store.flush().unwrap();
        // A thread names itself once it runs: give a flusher time to.
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(flusher_threads(), 0, "a store for one request started sled's flusher thread");
    }
    assert_eq!(common::open_store(one.path()).tree("t").unwrap().get("k").unwrap().as_deref(), Some(&b"flushed"[..]));

    // The usual store keeps its flusher: it writes what was not flushed.
    let usual = tempfile::tempdir().unwrap();
    let store = Store::open(usual.path()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while flusher_threads() == 0 {
        assert!(Instant::now() < deadline, "the usual store has no sled flusher thread");
        std::thread::sleep(Duration::from_millis(5));
    }
    store.tree("t").unwrap().insert("k", "not flushed").unwrap();
    let syncs = store.file_syncs();
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.file_syncs() == syncs {
        assert!(Instant::now() < deadline, "the flusher never synced the unflushed write");
        std::thread::sleep(Duration::from_millis(20));
    }
}
