//! The memory store and the file system: staleness of linked files, `.md`
//! files edited or added by hand, and bad input that must leave sled and
//! the `.confine-memory` directory exactly as they were.

use super::tests::{fixture, query, req, Fixture};
use super::*;
use std::time::{Duration, SystemTime};

fn mkfifo(path: &std::path::Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

/// `f` on another thread, which must end within 10 s: a blocking open of
/// a FIFO would hang it forever.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{what} hung (a FIFO opened blocking?)"))
}

fn linked(f: &Fixture, title: &str, files: &[&str]) -> String {
    let mut r = req(title, "content of a linked memory");
    r.file_rel_paths = files.iter().map(|s| s.to_string()).collect();
    f.db.store(&f.repo, &r).unwrap().memory_id
}

fn stale_only(f: &Fixture) -> Vec<Memory> {
    let q = MemoryQuery { repo_id: "demo".into(), stale_only: Some(true), ..Default::default() };
    f.db.query(&f.repo, &q).unwrap().memories
}

fn touch(path: &std::path::Path, offset_secs: i64) {
    // A file time in the future counts as the sync's now: let that be a
    // few milliseconds after the store's last write.
    if offset_secs > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = if offset_secs >= 0 {
        SystemTime::now() + Duration::from_secs(offset_secs as u64)
    } else {
        SystemTime::now() - Duration::from_secs(offset_secs.unsigned_abs())
    };
    std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
}

#[test]
fn editing_a_linked_file_flags_the_memory_stale() {
    let f = fixture();
    let a = linked(&f, "auth note", &["src/auth.rs"]);
    let b = linked(&f, "db note", &["src/db.rs"]);
    assert!(stale_only(&f).is_empty());
    std::fs::write(f.root().join("src/auth.rs"), "fn authenticate() { changed }\n").unwrap();
    let report = f.db.check(&f.repo).unwrap();
    assert_eq!((report.checked, report.stale, report.newly_stale.clone()), (2, 1, vec![a.clone()]));
    let stale = stale_only(&f);
    assert_eq!(stale.len(), 1);
    assert_eq!(
        (stale[0].memory_id.as_str(), stale[0].stale_files.as_slice()),
        (a.as_str(), &["src/auth.rs".to_string()][..])
    );
    // A second check finds nothing new.
    assert!(f.db.check(&f.repo).unwrap().newly_stale.is_empty());
    // Restoring the file clears the flag; re-storing re-baselines.
    std::fs::write(f.root().join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
    assert_eq!(f.db.check(&f.repo).unwrap().no_longer_stale, vec![a.clone()]);
    let log = f.db.log("demo", Some(&a), 10).unwrap();
    assert_eq!(log.iter().map(|e| e.op.as_str()).collect::<Vec<_>>(), ["fresh", "stale", "store"]);
    assert!(!query(&f, None).memories.iter().any(|m| m.stale));
    let _ = b;
}

#[test]
fn deleting_a_linked_file_flags_the_memory_stale() {
    let f = fixture();
    let a = linked(&f, "db note", &["src/db.rs", "src/auth.rs"]);
    std::fs::remove_file(f.root().join("src/db.rs")).unwrap();
    // Surface re-checks by itself.
    let s = SurfaceRequest { repo_id: "demo".into(), file_rel_paths: vec!["src/auth.rs".into()], ..Default::default() };
    let got = f.db.surface(&f.repo, &s).unwrap().memories;
    assert_eq!(got[0].memory.memory_id, a);
    assert!(got[0].memory.stale);
    assert_eq!(got[0].memory.stale_files, ["src/db.rs"]);
    // A symlink swapped in that leads out counts as vanished, never read.
    let outside = f.root().parent().unwrap().join("secret");
    std::fs::write(&outside, "x").unwrap();
    std::os::unix::fs::symlink(&outside, f.root().join("src/db.rs")).unwrap();
    assert_eq!(f.db.check(&f.repo).unwrap().stale, 1);
}

#[test]
fn a_hand_edit_of_the_markdown_is_picked_up_by_sync() {
    let f = fixture();
    let a = linked(&f, "Retry policy", &["src/auth.rs"]);
    let path = f.md(&a);
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace("content of a linked memory", "Three retries with jitter, decided in review.");
    let edited = edited.replace("confidence: 0.5", "confidence: 0.95");
    std::fs::write(&path, &edited).unwrap();
    touch(&path, 2);
    let report = f.db.sync(&f.repo).unwrap();
    assert_eq!((report.updated.clone(), report.unchanged, report.problems.clone()), (vec![a.clone()], 0, vec![]));
    let m = query(&f, Some("jitter")).memories.remove(0);
    assert_eq!((m.memory_id.as_str(), m.confidence), (a.as_str(), 0.95));
    assert_eq!(query(&f, Some("linked")).total, 0, "the old text left the index");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), edited, "the hand-written file is kept as written");
    // Nothing changed since: unchanged.
    assert_eq!(f.db.sync(&f.repo).unwrap().unchanged, 1);
    let log = f.db.log("demo", Some(&a), 1).unwrap();
    assert_eq!(log[0].op, "update_from_file");
}

#[test]
fn an_edit_older_than_the_store_is_overwritten_from_the_store() {
    let f = fixture();
    let a = linked(&f, "Store wins", &[]);
    let path = f.md(&a);
    let original = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, original.replace("content of a linked memory", "stale edit")).unwrap();
    touch(&path, -3600);
    let report = f.db.sync(&f.repo).unwrap();
    assert_eq!(report.rewritten, vec![a.clone()]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), original);
    assert_eq!(f.db.sync(&f.repo).unwrap().unchanged, 1);
}

#[test]
fn files_added_by_hand_are_imported_and_bad_ones_reported() {
    let f = fixture();
    let dir = f.root().join(MEMORY_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    let hand = "---\ntype: decision\ntitle: Keep sled\ntags: [storage]\nfileRelPaths: [src/db.rs]\n\
                fileHashes: {src/db.rs: deadbeef}\n---\nOne store per host, flushed before replies.\n";
    std::fs::write(dir.join("team-decision-1.md"), hand).unwrap();
    std::fs::write(dir.join("broken.md"), "---\ntype: opinion\ntitle: x\n---\nbody\n").unwrap();
    std::fs::write(dir.join("bad name!.md"), "x").unwrap();
    std::fs::write(dir.join("README.txt"), "not a memory").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("passwd.md")).unwrap();
    let report = f.db.sync(&f.repo).unwrap();
    assert_eq!(report.imported, ["team-decision-1"]);
    let problems: Vec<&str> = report.problems.iter().map(|p| p.file.as_str()).collect();
    assert_eq!(problems, [".confine-memory/bad name!.md", ".confine-memory/broken.md", ".confine-memory/passwd.md"]);
    assert!(
        report.problems[1].message.starts_with("line 2 of the file: type: unknown variant `opinion`"),
        "{:?}",
        report.problems[1]
    );
    assert!(report.problems[2].message.contains("symlinks are not followed"), "{:?}", report.problems[2]);
    let m = query(&f, Some("flushed")).memories.remove(0);
    assert_eq!(
        (m.memory_id.as_str(), m.memory_type, m.repo_id.as_str()),
        ("team-decision-1", MemoryType::Decision, "demo")
    );
    // The recorded hash is the baseline: the file differs from it, so stale.
    assert!(m.stale, "{m:?}");
    // A duplicate of an imported memory under another name is refused.
    std::fs::write(dir.join("copy.md"), hand).unwrap();
    let report = f.db.sync(&f.repo).unwrap();
    assert!(report.problems.iter().any(|p| p.file.ends_with("copy.md") && p.message.contains("team-decision-1")));
    assert_eq!(report.unchanged, 1);
    // Storing the same memory through the tools deduplicates onto the file's id.
    let mut same = req("Keep sled", "One store per host, flushed before replies.");
    same.memory_type = MemoryType::Decision;
    assert_eq!(f.db.store(&f.repo, &same).unwrap().memory_id, "team-decision-1");
}

#[test]
fn a_memory_file_removed_by_hand_is_reported_missing() {
    let f = fixture();
    let a = linked(&f, "gone", &[]);
    std::fs::remove_file(f.md(&a)).unwrap();
    let report = f.db.sync(&f.repo).unwrap();
    assert_eq!(report.missing, vec![a.clone()]);
    assert_eq!(query(&f, None).total, 1, "left as it is");
}

/// Each bad input: a clear error, and sled and the directory unchanged.
#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let f = fixture();
    let outside = f.root().parent().unwrap().join("secret.txt");
    std::fs::write(&outside, "secret").unwrap();
    std::os::unix::fs::symlink(&outside, f.root().join("src/link.rs")).unwrap();
    std::os::unix::fs::symlink("auth.rs", f.root().join("src/inside.rs")).unwrap();
    mkfifo(&f.root().join("src/pipe"));
    let with = |edit: &dyn Fn(&mut StoreRequest)| {
        let mut r = req("A title", "Some content");
        edit(&mut r);
        r
    };
    let cases: Vec<(StoreRequest, &str)> = vec![
        (with(&|r| r.title = "t".repeat(121)), "title is 121 characters; at most 120"),
        (with(&|r| r.title = String::new()), "title must not be empty"),
        (with(&|r| r.content = "c".repeat(50_001)), "content is 50001 characters; at most 50000"),
        (with(&|r| r.tags = (0..21).map(|i| format!("t{i}")).collect()), "at most 20 tags (got 21)"),
        (with(&|r| r.confidence = Some(1.5)), "confidence must be between 0 and 1 (got 1.5)"),
        (with(&|r| r.confidence = Some(-0.1)), "confidence must be between 0 and 1"),
        (with(&|r| r.symbol_ids = vec!["s".into(); 101]), "at most 100 symbolIds"),
        (
            with(&|r| r.file_rel_paths = vec!["../../etc/passwd".into()]),
            "fileRelPath '../../etc/passwd' contains '..'; give a path inside the repository",
        ),
        (with(&|r| r.file_rel_paths = vec!["/etc/passwd".into()]), "fileRelPath '/etc/passwd' is absolute"),
        // Any symlink is refused now, not only one leading out (issue 27,
        // class 1: one checked before use can be swapped after the check).
        (with(&|r| r.file_rel_paths = vec!["src/link.rs".into()]), "fileRelPath 'src/link.rs' leads through a symlink"),
        (
            with(&|r| r.file_rel_paths = vec!["src/inside.rs".into()]),
            "fileRelPath 'src/inside.rs' leads through a symlink",
        ),
        (with(&|r| r.file_rel_paths = vec!["src/pipe".into()]), "fileRelPath 'src/pipe' is not a regular file"),
        (with(&|r| r.file_rel_paths = vec!["src/nope.rs".into()]), "fileRelPath 'src/nope.rs' does not exist"),
        (with(&|r| r.file_rel_paths = vec!["src".into()]), "fileRelPath 'src' is not a regular file"),
        (with(&|r| r.memory_id = Some("mem_unknown".into())), "unknown memoryId 'mem_unknown' in repository 'demo'"),
        (with(&|r| r.memory_id = Some("../x".into())), "memoryId '../x' is not a memory id"),
    ];
    // Once with no .confine-memory directory yet, once with one.
    for round in 0..2 {
        let before = f.snapshot();
        for (r, want) in &cases {
            let e = f.db.store(&f.repo, r).unwrap_err().to_string();
            assert!(e.contains(want), "round {round}: wanted '{want}', got '{e}'");
            assert!(!e.contains(f.root().to_str().unwrap()), "no host path: {e}");
        }
        let rm = RemoveRequest { repo_id: "demo".into(), memory_id: "mem_unknown".into(), delete_file: Some(true) };
        assert!(f.db.remove(&f.repo, &rm).unwrap_err().to_string().starts_with("unknown memoryId 'mem_unknown'"));
        assert_eq!(f.snapshot(), before, "round {round}: nothing written");
        if round == 0 {
            assert!(before.1.is_none(), "no directory was created");
            f.db.store(&f.repo, &req("a real one", "so the directory exists")).unwrap();
        }
    }
}

#[test]
fn a_symlinked_memory_directory_is_refused() {
    let f = fixture();
    let elsewhere = f.root().parent().unwrap().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, f.root().join(MEMORY_DIR)).unwrap();
    let e = f.db.store(&f.repo, &req("t", "c")).unwrap_err();
    assert!(e.to_string().contains(".confine-memory is a symlink"), "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    assert!(f.db.sync(&f.repo).is_err());
    assert_eq!(query(&f, None).total, 0);
}

/// A FIFO as a linked file or as a memory file: stale or reported, at
/// once, never opened in a way that waits for a writer.
#[test]
fn fifos_never_hang_a_memory_operation() {
    let f = std::sync::Arc::new(fixture());
    let a = linked(&f, "fifo note", &["src/db.rs"]);
    std::fs::remove_file(f.root().join("src/db.rs")).unwrap();
    mkfifo(&f.root().join("src/db.rs"));
    let g = f.clone();
    let report = within("check", move || g.db.check(&g.repo).unwrap());
    assert_eq!((report.stale, report.newly_stale.clone()), (1, vec![a]));
    mkfifo(&f.root().join(MEMORY_DIR).join("planted.md"));
    let g = f.clone();
    let report = within("sync", move || g.db.sync(&g.repo).unwrap());
    let p: Vec<(&str, &str)> = report.problems.iter().map(|p| (p.file.as_str(), p.message.as_str())).collect();
    assert_eq!(p, [(".confine-memory/planted.md", "not a regular file")]);
    let g = f.clone();
    let e = within("store", move || {
        g.db.store(&g.repo, &{
            let mut r = req("t", "c");
            r.file_rel_paths = vec!["src/db.rs".into()];
            r
        })
    });
    assert!(e.unwrap_err().to_string().contains("is not a regular file"));
}

/// A job with a read-write workspace swaps `.confine-memory` for a
/// symlink to a directory outside, and back, as fast as it can, while
/// memories are stored and removed: nothing is ever written out there.
#[test]
fn a_memory_directory_swapped_for_a_symlink_never_redirects_a_write() {
    let f = fixture();
    let dir = f.root().join(MEMORY_DIR);
    let outside = f.root().parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    f.db.store(&f.repo, &req("first", "makes the directory")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (d, o, s) = (dir.clone(), outside.clone(), stop.clone());
    let swapper = std::thread::spawn(move || {
        let aside = d.with_extension("aside");
        let mut swaps = 0u32;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            if std::fs::rename(&d, &aside).is_ok() {
                let _ = std::os::unix::fs::symlink(&o, &d);
                std::thread::yield_now();
                let _ = std::fs::remove_file(&d);
                let _ = std::fs::rename(&aside, &d);
                swaps += 1;
            }
        }
        swaps
    });
    for i in 0..300 {
        if let Ok(r) = f.db.store(&f.repo, &req(&format!("note {i}"), "raced")) {
            let rm = RemoveRequest { repo_id: "demo".into(), memory_id: r.memory_id, delete_file: Some(i % 2 == 0) };
            let _ = f.db.remove(&f.repo, &rm);
        }
        let _ = f.db.sync(&f.repo);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0, "the race never ran");
    let leaked: Vec<_> = std::fs::read_dir(&outside).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(leaked.is_empty(), "written outside the repository: {leaked:?} ({swaps} swaps)");
}

/// A file dated in the future (its `updatedAt`, or its mtime: both are
/// the repository's to set) is read as written now: it can't pin the
/// memory first by recency, nor make every later hand edit lose to it.
#[test]
fn a_file_dated_in_the_future_is_read_as_now() {
    let f = fixture();
    let a = linked(&f, "Future", &[]);
    let path = f.md(&a);
    let text = std::fs::read_to_string(&path).unwrap();
    let at = text.lines().find(|l| l.starts_with("updatedAt:")).unwrap().to_string();
    let planted =
        text.replace(&at, "updatedAt: 2999-01-01T00:00:00.000Z").replace("content of a linked memory", "planted");
    std::fs::write(&path, &planted).unwrap();
    touch(&path, 10 * 365 * 86_400);
    assert_eq!(f.db.sync(&f.repo).unwrap().updated, vec![a.clone()]);
    let m = query(&f, Some("planted")).memories.remove(0);
    let now = crate::ids::now_ms() as i64;
    let updated = super::time::parse_rfc3339_ms(&m.updated_at).unwrap();
    assert!(updated <= now, "updatedAt {} is in the future", m.updated_at);
    // A hand edit made after it wins, as any later edit does.
    std::fs::write(&path, planted.replace("planted", "edited by hand")).unwrap();
    touch(&path, 2);
    assert_eq!(f.db.sync(&f.repo).unwrap().updated, vec![a.clone()]);
    assert_eq!(query(&f, Some("edited")).total, 1);
}
