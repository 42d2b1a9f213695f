//! A store whose log has grown past 64 segments (32 MiB) opens without
//! handing work to sled's I/O thread pool, and keeps everything.
//!
//! sled change 8 read the segment headers of a log of at most 64
//! segments inline, and sent a larger log's to the pool: one task each,
//! and the pool's first task starts its first thread. An old store gets
//! there (5,000 `confine exec` runs made 68 segments), and `confine exec`'s
//! store open, which its held job waits for, then cost 0.34 ms more
//! (change 22 raised the limit to 1,024 segments).
//!
//! In a file (a process) of its own: the pool's task count is
//! process-wide, and other tests' stores would add to it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use confine::store::Store;

const SEGMENT: usize = 512 * 1024;

/// `len` bytes that do not compress, different for each `seed`.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn a_log_of_more_than_64_segments_opens_without_the_io_pool() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let db_len = || std::fs::metadata(&db).map_or(0, |m| m.len());
    // Values small enough to stay in the log (a node over a quarter
    // segment would go to a blob file of its own), until it is past 66
    // segments.
    let mut values = 0u64;
    {
        let store = Store::open_flushed_by_caller(dir.path()).unwrap();
        let tree = store.tree("values").unwrap();
        while db_len() <= 66 * SEGMENT as u64 {
            assert!(values < 40_000, "40,000 values of 4 KiB made a log of only {} bytes", db_len());
            tree.insert(values.to_be_bytes(), noise(values, 4096)).unwrap();
            values += 1;
            if values.is_multiple_of(64) {
                store.flush().unwrap();
            }
        }
        store.flush().unwrap();
    }

    let before = sled::io_pool_tasks();
    let store = common::open_store_with(dir.path(), Store::open_flushed_by_caller);
    let handed = sled::io_pool_tasks() - before;
    assert_eq!(
        handed,
        0,
        "opening a log of {} segments handed {handed} tasks to the I/O pool",
        db_len() / SEGMENT as u64
    );

    let tree = store.tree("values").unwrap();
    assert_eq!(tree.len() as u64, values);
    for i in 0..values {
        assert!(tree.get(i.to_be_bytes()).unwrap().unwrap() == noise(i, 4096), "value {i} changed");
    }
}
