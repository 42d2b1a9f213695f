use super::*;

/// A repository's config may name any path in `include.path`: a FIFO
/// there must not hang the supervisor (red-team finding L1), and a
/// device must not be opened.
#[cfg(target_os = "linux")]
#[test]
fn an_include_naming_a_fifo_is_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    std::fs::write(ws.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let config = format!("[include]\n\tpath = {}\n[include]\n\tpath = /dev/zero\n", fifo.display());
    std::fs::write(ws.join(".git/config"), config).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let ws2 = ws.clone();
    std::thread::spawn(move || {
        let _ = tx.send(defaults(&ws2));
    });
    let got = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("protect hung on a FIFO");
    assert!(got.is_ok(), "{got:?}");
}

fn config_hooks(text: &str) -> Option<String> {
    entries(text)
        .into_iter()
        .filter(|(s, k, _)| s.eq_ignore_ascii_case("core") && k.eq_ignore_ascii_case("hookspath"))
        .map(|(_, _, v)| v)
        .next_back()
}

#[test]
fn config_entries_are_read_as_git_writes_them() {
    assert_eq!(config_hooks("[core]\n\thooksPath = .husky/_\n"), Some(".husky/_".into()));
    assert_eq!(config_hooks("[CORE]\n\tHOOKSPATH = \"my hooks\" ; comment\n"), Some("my hooks".into()));
    assert_eq!(config_hooks("[core \"x\"]\n\thooksPath = a\n[user]\n\thooksPath = b\n"), Some("a".into()));
    assert_eq!(config_hooks("[core]\nhooksPath = a # c\n[core]\nhooksPath=b\n"), Some("b".into()));
    assert_eq!(config_hooks("# [core]\n; hooksPath = a\n"), None);
    let e = entries("[includeIf \"gitdir:~/w/\"]\n\tpath = ../shared.cfg\n");
    assert_eq!(e, vec![("includeIf".into(), "path".into(), "../shared.cfg".into())]);
}

#[test]
fn only_paths_inside_the_workspace_count() {
    let ws = Path::new("/srv/ws");
    assert_eq!(inside(ws, Path::new(".husky")), Some(PathBuf::from(".husky")));
    assert_eq!(inside(ws, Path::new("/srv/ws/hooks")), Some(PathBuf::from("hooks")));
    assert_eq!(inside(ws, Path::new("/srv/ws/.git/../scripts/x")), Some(PathBuf::from("scripts/x")));
    assert_eq!(inside(ws, Path::new("/etc/hooks")), None);
    assert_eq!(inside(ws, Path::new("../hooks")), None);
}

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join(".git/hooks")).unwrap();
    std::fs::write(dir.path().join(".git/config"), "[core]\n\tbare = false\n").unwrap();
    dir
}

#[test]
fn what_git_reads_from_the_worktree_is_protected_and_must_exist() {
    let dir = repo();
    let ws = dir.path();
    assert_eq!(defaults(ws).unwrap(), vec![PathBuf::from(".git")]);
    std::fs::write(ws.join(".git/config"), "[core]\n\thooksPath = .husky\n[include]\n\tpath = ../shared.cfg\n")
        .unwrap();
    let e = defaults(ws).unwrap_err();
    assert!(matches!(e, ProtectError::Missing { .. }), "{e}");
    let e = e.to_string();
    assert!(e.contains("names shared.cfg") || e.contains("names .husky"), "{e}");
    std::fs::create_dir(ws.join(".husky")).unwrap();
    std::fs::write(ws.join("shared.cfg"), "[core]\n").unwrap();
    assert_eq!(
        defaults(ws).unwrap(),
        vec![PathBuf::from(".git"), PathBuf::from("shared.cfg"), PathBuf::from(".husky")]
    );
}

#[test]
fn symlinked_hooks_gitfiles_commondirs_and_nested_repositories() {
    let dir = repo();
    let ws = dir.path();
    std::fs::create_dir_all(ws.join("scripts")).unwrap();
    std::fs::write(ws.join("scripts/pre-commit.sh"), "#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("../../scripts/pre-commit.sh", ws.join(".git/hooks/pre-commit")).unwrap();
    std::fs::create_dir_all(ws.join("vendor/lib/.git")).unwrap();
    let found = defaults(ws).unwrap();
    assert!(found.contains(&PathBuf::from("scripts/pre-commit.sh")), "{found:?}");
    assert!(found.contains(&PathBuf::from("vendor/lib/.git")), "{found:?}");
    // A gitfile whose gitdir is in the workspace (--separate-git-dir).
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    std::fs::create_dir_all(ws.join(".repo/p.git")).unwrap();
    std::fs::write(ws.join(".git"), "gitdir: .repo/p.git\n").unwrap();
    assert_eq!(defaults(ws).unwrap(), vec![PathBuf::from(".git"), PathBuf::from(".repo/p.git")]);
}

#[test]
fn a_config_with_another_name_is_refused() {
    let dir = repo();
    let ws = dir.path();
    std::fs::hard_link(ws.join(".git/config"), ws.join("notes.txt")).unwrap();
    let e = defaults(ws).unwrap_err();
    assert!(matches!(e, ProtectError::HardLinks { names: 2, .. }), "{e}");
    assert!(e.to_string().contains(".git/config has 2 names"), "{e}");
}
