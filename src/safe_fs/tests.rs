use super::*;

#[test]
fn a_path_through_a_symlink_is_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().canonicalize().unwrap();
    std::fs::create_dir(real.join("a")).unwrap();
    std::os::unix::fs::symlink(real.join("a"), real.join("l")).unwrap();
    assert!(!through_symlink(&real.join("a"), &real.join("a")));
    assert!(!through_symlink(&real.join("./a/../a"), &real.join("a")));
    assert!(through_symlink(&real.join("l"), &real.join("l").canonicalize().unwrap()));
}

#[test]
fn reads_refuse_links_fifos_and_big_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "hello").unwrap();
    assert_eq!(read_regular(&file, 5).unwrap(), b"hello");
    assert!(matches!(read_regular(&file, 4), Err(SafeFsError::TooLarge { .. })));
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&file, &link).unwrap();
    assert!(matches!(read_regular(&link, 100), Err(SafeFsError::NotRegular { .. })));
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Returns at once: a blocking open would wait here for a writer.
    assert!(matches!(read_regular(&fifo, 100), Err(SafeFsError::NotRegular { .. })));
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    assert!(matches!(read_regular(&sub, 100), Err(SafeFsError::NotRegular { .. })));
}

#[test]
fn an_output_file_replaces_what_was_planted_at_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "untouched").unwrap();
    let path = dir.path().join("status.json");
    let out = OutputFile::prepare(&path).unwrap();
    // Planted after prepare: a symlink, then a FIFO.
    std::os::unix::fs::symlink(&target, &path).unwrap();
    out.write(b"one").unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "untouched");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "one");
    std::fs::remove_file(&path).unwrap();
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    out.write(b"two").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "two");
    // A directory at the name is an error, not a write inside it.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert!(out.write(b"three").is_err());
    // A failing fill leaves nothing behind either.
    std::fs::remove_dir(&path).unwrap();
    assert!(matches!(out.write_with(|_| Err::<(), _>("no")), Err(WriteError::Content("no"))));
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn the_directory_is_the_one_opened_before() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("out");
    std::fs::create_dir(&sub).unwrap();
    let out = OutputFile::prepare(&sub.join("s.json")).unwrap();
    // The directory is moved away and a symlink to elsewhere put in its place.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::rename(&sub, dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &sub).unwrap();
    out.write(b"x").unwrap();
    assert!(!elsewhere.join("s.json").exists());
    assert_eq!(std::fs::read_to_string(dir.path().join("moved/s.json")).unwrap(), "x");
}

#[test]
fn links_below_a_writable_root_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join("real/x")).unwrap();
    std::os::unix::fs::symlink("/etc", ws.join("out")).unwrap();
    std::os::unix::fs::symlink(&ws, dir.path().join("ws-link")).unwrap();
    let roots = [ws.canonicalize().unwrap()];
    assert!(open_guarded(&ws.join("real/x"), &roots, true).is_ok());
    let e = open_guarded(&ws.join("out/passwd"), &roots, true).unwrap_err();
    assert!(matches!(e, SafeFsError::Planted { .. }) && e.to_string().contains("out is a symbolic link"), "{e}");
    // The last name is only checked when asked.
    assert!(open_guarded(&ws.join("out"), &roots, false).is_ok());
    assert!(open_guarded(&ws.join("out"), &roots, true).is_err());
    // A link above the root (the user's own path) is followed.
    assert_eq!(resolve_guarded(&dir.path().join("ws-link/real/x"), &roots).unwrap(), roots[0].join("real/x"));
    assert!(resolve_guarded(&dir.path().join("ws-link/out"), &roots).is_err());
    assert!(OutputFile::prepare_guarded(&ws.join("out/s.json"), &roots).is_err());
    assert!(OutputFile::prepare_guarded(&ws.join("real/s.json"), &roots).is_ok());
}

#[test]
fn a_path_without_a_file_name_is_refused() {
    assert!(matches!(OutputFile::prepare(Path::new("/tmp/..")), Err(SafeFsError::NoFileName { .. })));
    assert!(matches!(OutputFile::prepare(Path::new("/")), Err(SafeFsError::NoFileName { .. })));
}
