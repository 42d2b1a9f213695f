use super::*;
use crate::runtimes::lookup;
use std::os::unix::fs::{symlink, PermissionsExt};

fn exe(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn link(target: &Path, at: &Path) {
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    symlink(target, at).unwrap();
}

/// A host whose PATH is `dirs` under `root`, with `/usr` (for
/// `/usr/bin/env`) and `root/usr/share` as system paths and no repository.
fn host(root: &Path, dirs: &[&str]) -> Host {
    Host {
        path: std::env::join_paths(dirs.iter().map(|d| root.join(d))).unwrap(),
        home: Some(root.join("home")),
        bound: vec![root.join("usr/share"), PathBuf::from("/usr")],
        repos: Vec::new(),
    }
}

fn untrusted(e: RuntimeError) -> &'static str {
    match e {
        RuntimeError::Untrusted { reason, .. } => reason,
        other => panic!("not an Untrusted error: {other}"),
    }
}

#[test]
fn a_rustup_proxy_needs_cargo_and_rustup_homes() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    exe(&r.join("home/.cargo/bin/rustup"), "\x7fELF");
    link(&r.join("home/.cargo/bin/rustup"), &r.join("home/.cargo/bin/rustc"));
    std::fs::create_dir_all(r.join("home/.rustup/toolchains")).unwrap();
    let res = resolve(lookup("rust").unwrap(), None, true, &host(r, &["home/.cargo/bin"])).unwrap();
    assert_eq!(res.executable, r.join("home/.cargo/bin/rustc"), "argv[0] keeps the proxy's name");
    assert_eq!(res.ro_paths, [r.join("home/.cargo"), r.join("home/.rustup")]);
    let env: Vec<&str> = res.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(env, ["CARGO_HOME", "RUSTUP_HOME"]);
    assert_eq!(res.path_dirs, [r.join("home/.cargo/bin")]);
}

#[test]
fn a_jdk_is_found_through_its_symlink() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    for tool in ["java", "javac"] {
        exe(&r.join(format!("opt/lib/jvm/jdk-21/bin/{tool}")), "\x7fELF");
        link(&r.join(format!("opt/lib/jvm/jdk-21/bin/{tool}")), &r.join(format!("bin/{tool}")));
    }
    let res = resolve(lookup("java").unwrap(), None, true, &host(r, &["bin"])).unwrap();
    assert_eq!(res.executable, r.join("bin/javac"));
    assert_eq!(res.helper("java"), Some(r.join("bin/java").as_path()));
    assert_eq!(res.ro_paths, [r.join("opt/lib/jvm/jdk-21")]);
    // Args mode runs java, not javac.
    let res = resolve(lookup("java").unwrap(), None, false, &host(r, &["bin"])).unwrap();
    assert_eq!(res.executable, r.join("bin/java"));
    assert!(res.helpers.is_empty());
}

#[test]
fn a_script_brings_its_interpreter_and_a_node_package_is_bound_whole() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    exe(&r.join("nodejs/bin/node"), "\x7fELF");
    exe(&r.join("lib/node_modules/tsx/dist/cli.mjs"), "#!/usr/bin/env node\nimport './x.js'\n");
    link(&r.join("lib/node_modules/tsx/dist/cli.mjs"), &r.join("bin/tsx"));
    let res = resolve(lookup("typescript").unwrap(), None, true, &host(r, &["bin", "nodejs/bin"])).unwrap();
    assert_eq!(res.executable, r.join("bin/tsx"));
    assert_eq!(res.ro_paths, [r.join("lib/node_modules/tsx"), r.join("nodejs")]);
    assert!(res.path_dirs.contains(&r.join("nodejs/bin")), "node must be on the sandbox's PATH: {:?}", res.path_dirs);
}

#[test]
fn paths_the_sandbox_binds_anyway_are_dropped() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    exe(&r.join("usr/share/go/bin/go"), "\x7fELF");
    link(&r.join("usr/share/go/bin/go"), &r.join("bin/go"));
    let res = resolve(lookup("go").unwrap(), None, false, &host(r, &["bin"])).unwrap();
    assert!(res.ro_paths.is_empty(), "{:?}", res.ro_paths);
}

#[test]
fn a_missing_toolchain_is_not_installed_never_enoent() {
    let t = tempfile::tempdir().unwrap();
    let h = host(t.path(), &["bin"]);
    let err = resolve(lookup("kotlin").unwrap(), None, true, &h).unwrap_err();
    assert_eq!(err.to_string(), "runtime 'kotlin' is not installed (kotlinc not found)");
    let err = resolve(lookup("typescript").unwrap(), None, true, &h).unwrap_err();
    assert_eq!(err.to_string(), "runtime 'typescript' is not installed (tsx, ts-node or node not found)");
    // kotlinc without java: the helper is named.
    exe(&t.path().join("bin/kotlinc"), "#!/bin/sh\n");
    let err = resolve(lookup("kotlin").unwrap(), None, true, &h).unwrap_err();
    assert_eq!(err.to_string(), "runtime 'kotlin' is not installed (java not found)");
    let err = resolve(lookup("python").unwrap(), Some("pypy3"), false, &h).unwrap_err();
    assert_eq!(err.to_string(), "runtime 'python' is not installed (pypy3 not found)");
}

#[test]
fn overrides_are_checked_before_lookup_and_code_mode_needs_a_compiler() {
    let t = tempfile::tempdir().unwrap();
    exe(&t.path().join("bin/cargo"), "\x7fELF");
    let h = host(t.path(), &["bin"]);
    let err = resolve(lookup("shell").unwrap(), Some("curl"), false, &h).unwrap_err();
    assert!(matches!(err, RuntimeError::Incompatible { .. }), "{err}");
    assert!(resolve(lookup("rust").unwrap(), Some("cargo"), false, &h).is_ok());
    let err = resolve(lookup("rust").unwrap(), Some("cargo"), true, &h).unwrap_err().to_string();
    assert_eq!(err, "executable 'cargo' is not compatible with runtime 'rust (code mode)' (expected one of: rustc)");
}

#[test]
fn toolchain_roots_follow_the_layout() {
    let t = tempfile::tempdir().unwrap();
    let trust = Trust::new(std::ffi::OsStr::new(""), &[], &[]);
    let roots = |p: &str| toolchain_roots(Path::new(p), &trust);
    assert_eq!(roots("/opt/go/bin/go"), [PathBuf::from("/opt/go")]);
    assert_eq!(
        roots("/usr/lib/jvm/jdk/jre/bin/java"),
        [PathBuf::from("/usr/lib/jvm/jdk"), "/usr/lib/jvm/jdk/jre".into()]
    );
    assert_eq!(roots("/x/node_modules/@scope/pkg/bin/cli.js")[0], PathBuf::from("/x/node_modules/@scope/pkg"));
    // The directory of a file outside any layout is not a toolchain root
    // (it was, and bound whatever directory a file was found in).
    assert!(roots("/usr/lib/dotnet/dotnet").is_empty());
    assert!(roots("/srv/secret/file").is_empty());
    // ...unless it is a trusted PATH directory.
    let bin = t.path().join("tools");
    std::fs::create_dir_all(&bin).unwrap();
    let trust = Trust::new(bin.as_os_str(), &[], &[]);
    assert_eq!(toolchain_roots(&bin.join("tool"), &trust), [bin]);
    assert_eq!(
        home_dot_dir(Path::new("/home/ann/.pyenv/shims/python3"), None),
        Some((PathBuf::from("/home/ann/.pyenv"), ".pyenv".into()))
    );
    assert_eq!(home_dot_dir(Path::new("/home/ann/.local/bin/x"), None), None);
    assert_eq!(home_dot_dir(Path::new("/home/ann/.ssh/bin/x"), None), None, "only known toolchain managers");
    assert_eq!(
        minimal_roots(vec!["/a/b".into(), "/a".into(), "/usr/x".into()], &["/usr".into()]),
        [PathBuf::from("/a")]
    );
}

#[test]
fn homes_top_level_directories_and_repositories_are_never_bound() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    let h = Host { repos: vec![r.join("repo")], ..host(r, &[]) };
    let trust = Trust::new(std::ffi::OsStr::new(""), &[], &h.repos);
    for refused in ["/", "/opt", "/home", "/root", "/tmp"] {
        assert!(!bindable(Path::new(refused), &h, &trust), "{refused}");
    }
    for refused in ["home", "home/.local", "home/.config", "repo", "repo/node_modules/x", ""] {
        assert!(!bindable(&r.join(refused), &h, &trust), "{refused}");
    }
    for ok in ["home/.cargo", "home/tools", "opt/go"] {
        assert!(bindable(&r.join(ok), &h, &trust), "{ok}");
    }
    // An executable in `~/bin` or `~/.local/bin` binds that directory, never the home.
    exe(&r.join("home/bin/bash"), "\x7fELF");
    exe(&r.join("home/.local/bin/python3"), "\x7fELF");
    let h = host(r, &["home/bin", "home/.local/bin"]);
    let res = resolve(lookup("python").unwrap(), None, false, &h).unwrap();
    assert_eq!(res.ro_paths, [r.join("home/.local/bin")]);
    let res = resolve(lookup("shell").unwrap(), Some(r.join("home/bin/bash").to_str().unwrap()), false, &h).unwrap();
    assert_eq!(res.ro_paths, [r.join("home/bin")]);
}

/// The attack of issue 27, class 2: a repository's `python3` whose `#!`
/// line names a secret directory through `env -S -u`.
#[test]
fn an_executable_is_taken_only_from_trusted_locations() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    let secret = r.join("secret");
    exe(&secret.join("file"), "#!/bin/sh\n");
    let attack = format!("#!/usr/bin/env -S -u {}/file sh -c 'ls'\n", secret.display());
    exe(&r.join("repo/python3"), &attack);
    exe(&r.join("elsewhere/python3"), &attack);
    exe(&r.join("bin/python3"), "\x7fELF");
    let repos = vec![r.join("repo").canonicalize().unwrap()];
    let h = Host { repos: repos.clone(), ..host(r, &["repo", "bin"]) };
    let py = lookup("python").unwrap();
    let abs = |p: &str| r.join(p).to_str().unwrap().to_string();
    assert!(untrusted(resolve(py, Some(&abs("repo/python3")), false, &h).unwrap_err()).contains("inside a repository"));
    assert!(untrusted(resolve(py, Some(&abs("elsewhere/python3")), false, &h).unwrap_err()).contains("PATH"));
    // The repository on PATH (first, even) is passed over.
    let res = resolve(py, None, false, &h).unwrap();
    assert_eq!(res.executable, r.join("bin/python3"));
    assert_eq!(resolve(py, Some(&abs("bin/python3")), false, &h).unwrap().executable, r.join("bin/python3"));
    // A PATH directory reached through a symlink into a repository, a
    // relative entry, and a group-writable one are not trusted either.
    link(&r.join("repo"), &r.join("linked"));
    std::fs::create_dir_all(r.join("shared")).unwrap();
    std::fs::copy(r.join("repo/python3"), r.join("shared/python3")).unwrap();
    std::fs::set_permissions(r.join("shared"), std::fs::Permissions::from_mode(0o775)).unwrap();
    let h2 =
        Host { path: std::env::join_paths([r.join("linked"), "repo".into(), r.join("shared")]).unwrap(), ..h.clone() };
    assert!(matches!(resolve(py, None, false, &h2), Err(RuntimeError::NotInstalled { .. })));
    // A symlink in a trusted directory that leads into a repository is refused.
    std::fs::remove_file(r.join("bin/python3")).unwrap();
    link(&r.join("repo/python3"), &r.join("bin/python3"));
    let h3 = Host { path: r.join("bin").into_os_string(), ..h.clone() };
    assert!(untrusted(resolve(py, None, false, &h3).unwrap_err()).contains("inside a repository"));
    // A trusted script whose `#!` says `env -S -u <secret> sh`: `sh` is
    // looked up (not on this PATH), the secret is never bound.
    std::fs::remove_file(r.join("bin/python3")).unwrap();
    exe(&r.join("bin/python3"), &attack);
    let res = resolve(py, None, false, &h3).unwrap();
    assert!(res.ro_paths.iter().all(|p| !p.starts_with(&secret)), "{:?}", res.ro_paths);
    // A `#!` naming an interpreter outside the trusted locations is not followed.
    exe(&r.join("bin/python3"), &format!("#!{}/file\n", secret.display()));
    let res = resolve(py, None, false, &h3).unwrap();
    assert!(res.ro_paths.iter().all(|p| !p.starts_with(&secret)), "{:?}", res.ro_paths);
    // An interpreter in a trusted place is followed.
    exe(&r.join("opt/py/bin/python3.12"), "\x7fELF");
    let h4 = Host { path: std::env::join_paths([r.join("bin"), r.join("opt/py/bin")]).unwrap(), ..h.clone() };
    exe(&r.join("bin/python3"), "#!/usr/bin/env -S -u X python3.12 -I\n");
    let res = resolve(py, None, false, &h4).unwrap();
    assert!(res.ro_paths.contains(&r.join("opt/py")), "{:?}", res.ro_paths);
}

/// On this host: whatever is installed resolves to paths that exist.
#[test]
fn installed_runtimes_on_this_host_resolve_to_existing_paths() {
    let h = Host::from_env();
    let mut found = Vec::new();
    for rt in &crate::runtimes::TABLE {
        match resolve(rt, None, true, &h) {
            Ok(res) => {
                assert!(res.executable.is_absolute());
                for p in &res.ro_paths {
                    assert!(p.exists(), "{}: {p:?}", rt.name);
                }
                found.push(rt.name);
            }
            Err(e) => assert!(matches!(e, RuntimeError::NotInstalled { .. }), "{e}"),
        }
    }
    eprintln!("runtimes installed on this host: {found:?}");
}

#[test]
fn a_command_not_found_inside_gets_the_binds_that_fix_it() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    exe(&r.join("home/.cargo/bin/rustup"), "\x7fELF");
    link(&r.join("home/.cargo/bin/rustup"), &r.join("home/.cargo/bin/rustc"));
    std::fs::create_dir_all(r.join("home/.rustup/toolchains")).unwrap();
    let h = host(r, &["home/.cargo/bin"]);
    let (cargo, rustup) = (r.join("home/.cargo"), r.join("home/.rustup"));
    let want = format!(
        "--ro-bind {c}:{c} --ro-bind {u}:{u} --env CARGO_HOME={c} --env RUSTUP_HOME={u}",
        c = cargo.display(),
        u = rustup.display()
    );
    // By name: the path to run it by, as the sandbox's PATH lacks its directory.
    let by_name = bind_hint("rustc", &h).unwrap();
    assert_eq!(by_name, format!("{want} -- {}", r.join("home/.cargo/bin/rustc").display()));
    // By its path: the binds alone.
    assert_eq!(bind_hint(&r.join("home/.cargo/bin/rustc").to_string_lossy(), &h).unwrap(), want);
    // Nothing on the host, or in a repository: no hint.
    assert_eq!(bind_hint("nonesuch", &h), None);
    let repo = Host { repos: vec![r.join("home")], ..h };
    assert_eq!(bind_hint("rustc", &repo), None);
}
