use super::*;
use std::os::unix::fs::symlink;
use std::path::PathBuf;

fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
}

fn tree() -> (tempfile::TempDir, PathBuf, Dir) {
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("repo");
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("src/a.rs"), "fn a() {}\n").unwrap();
    std::fs::write(t.path().join("secret"), "outside").unwrap();
    let dir = Dir::open(&root).unwrap();
    (t, root, dir)
}

#[test]
fn files_below_are_read_and_symlinks_on_the_way_are_refused() {
    let (t, root, dir) = tree();
    let got = dir.read_regular(Path::new("src/a.rs"), 1024).unwrap().unwrap();
    assert_eq!(got.bytes, b"fn a() {}\n");
    assert!(got.stat.is_file);
    assert!(dir.read_regular(Path::new("src/none.rs"), 1024).unwrap().is_none());
    symlink(t.path().join("secret"), root.join("src/out.rs")).unwrap();
    symlink("a.rs", root.join("src/in.rs")).unwrap();
    symlink(root.join("src"), root.join("srclink")).unwrap();
    for rel in ["src/out.rs", "src/in.rs", "srclink/a.rs"] {
        let e = dir.read_regular(Path::new(rel), 1024).unwrap_err();
        assert!(is_symlink_error(&e), "{rel}: {e}");
    }
    for rel in ["../secret", "/etc/passwd", "src/../../secret", ""] {
        assert!(dir.read_regular(Path::new(rel), 1024).is_err(), "{rel}");
    }
    let e = dir.read_regular(Path::new("src/a.rs"), 3).unwrap_err();
    assert_eq!(e.to_string(), "larger than 3 bytes");
    let e = dir.read_regular(Path::new("src/deep"), 1024).unwrap_err();
    assert!(is_not_regular(&e), "{e}");
}

/// Without a writer, a blocking open of a FIFO would never return.
#[test]
fn a_fifo_is_refused_without_blocking() {
    let (_t, root, dir) = tree();
    fifo(&root.join("src/pipe"));
    let e = dir.read_regular(Path::new("src/pipe"), 1024).unwrap_err();
    assert!(is_not_regular(&e), "{e}");
    let e = dir.walk_for_test(Path::new("src/pipe"), libc::O_RDONLY | libc::O_NONBLOCK).map(drop);
    assert!(e.is_ok(), "the walk opens it without blocking; fstat then refuses it");
}

/// The fallback for kernels without openat2 refuses the same things.
#[test]
fn the_component_walk_refuses_symlinks_at_every_level() {
    let (t, root, dir) = tree();
    symlink(t.path(), root.join("up")).unwrap();
    symlink(t.path().join("secret"), root.join("src/out.rs")).unwrap();
    for rel in ["up/secret", "src/out.rs"] {
        let e = dir.walk_for_test(Path::new(rel), libc::O_RDONLY).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{rel}: {e}");
    }
    assert!(dir.walk_for_test(Path::new("src/a.rs"), libc::O_RDONLY).is_ok());
}

#[test]
fn new_files_are_created_renamed_and_removed_inside_the_directory_only() {
    let (t, root, dir) = tree();
    assert!(dir.mkdir(OsStr("mem"), 0o755).unwrap());
    assert!(!dir.mkdir(OsStr("mem"), 0o755).unwrap());
    let mem = dir.dir(Path::new("mem")).unwrap();
    use std::io::Write;
    mem.create_new(OsStr("x.tmp"), 0o644).unwrap().write_all(b"hello").unwrap();
    assert!(mem.create_new(OsStr("x.tmp"), 0o644).is_err(), "O_EXCL");
    mem.rename(OsStr("x.tmp"), OsStr("x.md")).unwrap();
    assert_eq!(std::fs::read(root.join("mem/x.md")).unwrap(), b"hello");
    let mut names = mem.names().unwrap();
    names.sort();
    assert_eq!(names, [std::ffi::OsString::from("x.md")]);
    // A symlink planted at the temp name is never written through.
    symlink(t.path().join("secret"), root.join("mem/y.tmp")).unwrap();
    assert!(mem.create_new(OsStr("y.tmp"), 0o644).is_err());
    assert_eq!(std::fs::read(t.path().join("secret")).unwrap(), b"outside");
    // Renaming over a symlink replaces the link, not its target.
    symlink(t.path().join("secret"), root.join("mem/z.md")).unwrap();
    mem.rename(OsStr("x.md"), OsStr("z.md")).unwrap();
    assert_eq!(std::fs::read(t.path().join("secret")).unwrap(), b"outside");
    assert!(!mem.lstat(OsStr("z.md")).unwrap().unwrap().is_symlink);
    assert!(mem.lstat(OsStr("y.tmp")).unwrap().unwrap().is_symlink);
    mem.unlink(OsStr("y.tmp")).unwrap();
    assert!(mem.lstat(OsStr("y.tmp")).unwrap().is_none());
    for bad in ["", ".", "..", "a/b"] {
        assert!(mem.create_new(OsStr(bad), 0o644).is_err(), "{bad:?}");
    }
    // The directory fd stays on the directory it opened, whatever is
    // swapped in at its path afterwards.
    std::fs::rename(root.join("mem"), root.join("mem.old")).unwrap();
    symlink(t.path(), root.join("mem")).unwrap();
    mem.create_new(OsStr("after.md"), 0o644).unwrap();
    assert!(root.join("mem.old/after.md").exists());
    assert!(!t.path().join("after.md").exists());
}

#[test]
fn a_directory_below_may_follow_symlinks_that_stay_inside() {
    let (t, root, dir) = tree();
    symlink("src/deep", root.join("deep")).unwrap();
    symlink(t.path(), root.join("out")).unwrap();
    let d = dir.dir_beneath(Path::new("deep")).unwrap();
    assert_eq!(d.current_path().unwrap(), root.canonicalize().unwrap().join("src/deep"));
    assert!(dir.dir_beneath(Path::new("out")).is_err());
    assert!(dir.dir_beneath(Path::new("src/a.rs")).is_err(), "not a directory");
}

#[allow(non_snake_case)]
fn OsStr(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}
