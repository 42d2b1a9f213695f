use super::*;

#[test]
fn reopen_keeps_flushed_data() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        s.tree("t").unwrap().insert("k", "v").unwrap();
        s.flush().unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.tree("t").unwrap().get("k").unwrap().unwrap().as_ref(), b"v");
}

#[test]
fn a_new_store_is_marked_with_its_format_and_a_flush_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_flushed_by_caller(dir.path()).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("FORMAT")).unwrap(),
        format!("confine store {FORMAT_VERSION}\n")
    );
    assert!(dir.path().join("sled/db").is_file() && dir.path().join("blobs").is_dir());
    s.tree("t").unwrap().insert("k", "v").unwrap();
    let before = s.file_syncs();
    s.flush().unwrap();
    assert_eq!(s.file_syncs(), before + 1);
}

/// A store written before the layout had a version (sled's files at the
/// top) is refused with what to do, and left as it was.
#[test]
fn a_store_of_an_older_layout_is_refused_not_misread() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("db"), b"old sled log").unwrap();
    std::fs::write(dir.path().join("conf"), b"segment_size: 524288").unwrap();
    let err = Store::open(dir.path()).err().expect("an old store must be refused").to_string();
    assert!(err.contains("made by an older confine") && err.contains("move it aside"), "{err}");
    assert!(!dir.path().join("FORMAT").exists() && !dir.path().join("sled").exists());
    assert_eq!(std::fs::read(dir.path().join("db")).unwrap(), b"old sled log");
}

#[test]
fn a_store_of_a_newer_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("FORMAT"), format!("confine store {}\n", FORMAT_VERSION + 1)).unwrap();
    let err = Store::open(dir.path()).err().expect("refused").to_string();
    assert!(err.contains("made by a newer confine"), "{err}");
}

/// A second opener is told who has the store; once the holder is gone
/// (its lock goes with it), the store is taken over.
#[cfg(unix)]
#[test]
fn a_second_opener_is_told_the_holders_pid_and_takes_over_when_it_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let first = Store::open(dir.path()).unwrap();
    let err = Store::open(dir.path()).err().expect("the store is held").to_string();
    assert!(err.contains(&format!("in use by pid {}", std::process::id())), "{err}");
    drop(first);
    Store::open(dir.path()).expect("taken over once the holder let go");
}

/// A holder killed while it was starting a child (posix_spawn) leaves its
/// lock to that child until the child's execve: the next opener waits for
/// it rather than refusing. Played here by util-linux `flock` holding the
/// lock a moment, the lock naming a pid that is gone.
#[cfg(target_os = "linux")]
#[test]
fn a_lock_held_for_a_dead_holder_is_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    drop(Store::open(dir.path()).unwrap());
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    let lock = dir.path().join(LOCK_FILE);
    std::fs::write(&lock, format!("{gone_pid}\n")).unwrap();
    let mut holder = std::process::Command::new("flock").arg(&lock).args(["sleep", "0.3"]).spawn().unwrap();
    // Until flock has it.
    let free = || {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(&lock).unwrap();
        // SAFETY: flock on a descriptor we own; it is closed (unlocked) below.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    };
    let start = std::time::Instant::now();
    while free() && start.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!free(), "flock did not take the lock");
    Store::open(dir.path()).expect("the lock of a dead holder is waited for");
    holder.wait().unwrap();
}

/// A write that failed leaves sled failed until the store is opened
/// again: every job and every later write is refused with what to do, and
/// a room refusal (nothing was written) is not such a failure.
#[test]
fn a_failed_write_is_sticky_and_a_full_disk_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open_flushed_by_caller(dir.path()).unwrap();
    s.note_failure(&StoreError::Full { path: dir.path().into(), free: 0, reserve: 1 });
    s.note_failure(&StoreError::Io {
        path: dir.path().into(),
        source: std::io::Error::from_raw_os_error(libc::EMFILE),
    });
    s.check_room().unwrap();
    s.note_failure(&StoreError::Sync { what: "the database", source: std::io::Error::other("ENOSPC") });
    let err = s.check_room().unwrap_err().to_string();
    assert!(err.contains("restarted") && err.contains("syncing the database"), "{err}");
    assert!(s.put(Table::Supervisor, b"k", b"v").is_err());
    assert!(s.check_room_for_records().is_err());
}

/// An open that fails on a full disk (or is killed) while sled writes its
/// snapshot leaves `snap.<lsn>.generating`, which sled 0.34 would take for
/// the newest snapshot and call corrupt at every later open: the store
/// opens anyway, with its data.
#[test]
fn an_unfinished_snapshot_does_not_make_the_store_unopenable() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open_flushed_by_caller(dir.path()).unwrap();
        s.tree("t").unwrap().insert("k", "v").unwrap();
        s.flush().unwrap();
    }
    // What a failed snapshot write leaves: an empty file, named past any
    // whole snapshot.
    std::fs::write(dir.path().join(SLED_DIR).join("snap.FFFFFFFFFFFFFFF0.generating"), b"").unwrap();
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.tree("t").unwrap().get("k").unwrap().unwrap().as_ref(), b"v");
    assert!(!dir.path().join(SLED_DIR).join("snap.FFFFFFFFFFFFFFF0.generating").exists());
}

#[test]
fn the_idle_collection_frees_every_bag_handed_over_in_one_call() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // A collector of the test's own: no other test pins in it.
    let collector = crossbeam_epoch::Collector::new();
    let (worker, idle) = (collector.register(), collector.register());
    let freed = Arc::new(AtomicUsize::new(0));
    // A thread pinned meanwhile holds the epoch back: the bags pile up,
    // as they do while jobs run.
    let busy = collector.register();
    let held = busy.pin();
    const BAGS: usize = 40;
    for _ in 0..BAGS {
        let guard = worker.pin();
        let freed = freed.clone();
        guard.defer(move || freed.fetch_add(1, Ordering::SeqCst));
        guard.flush();
    }
    assert_eq!(freed.load(Ordering::SeqCst), 0, "nothing can be freed while a thread is pinned");
    drop(held);
    // Idle now: one round frees a few bags; the collection frees them all.
    idle.pin().flush();
    let after_one_round = freed.load(Ordering::SeqCst);
    assert!(after_one_round < BAGS, "one round freed all {BAGS}: the test no longer shows a backlog");
    assert!(collect_with(|| idle.pin()), "the marker was not freed");
    assert_eq!(freed.load(Ordering::SeqCst), BAGS, "bags handed over before the marker were left");
}

#[test]
fn what_a_finished_thread_retired_is_freed_by_the_idle_collection() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // A thread retires something (as sled retires a sealed log buffer),
    // hands its bag over and ends; nothing else pins in an idle server.
    let freed = Arc::new(AtomicBool::new(false));
    let flag = freed.clone();
    std::thread::spawn(move || {
        let guard = crossbeam_epoch::pin();
        guard.defer(move || flag.store(true, Ordering::SeqCst));
        drop(guard);
        release_garbage();
    })
    .join()
    .unwrap();
    // Other tests in this process pin too, and one pinned in an older
    // epoch holds the collector back until it unpins: a few tries.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !freed.load(Ordering::SeqCst) && std::time::Instant::now() < deadline {
        collect_garbage();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(freed.load(Ordering::SeqCst), "the collection did not free what the thread handed over");
}
