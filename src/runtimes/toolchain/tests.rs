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

fn host(root: &Path, dirs: &[&str]) -> Host {
    Host {
        path: std::env::join_paths(dirs.iter().map(|d| root.join(d))).unwrap(),
        home: Some(root.join("home")),
        bound: vec![root.join("usr/share")],
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
fn prefixes_follow_the_layout() {
    assert_eq!(prefix_of(Path::new("/opt/go/bin/go")), Some(PathBuf::from("/opt/go")));
    assert_eq!(prefix_of(Path::new("/usr/lib/jvm/jdk/jre/bin/java")), Some(PathBuf::from("/usr/lib/jvm/jdk")));
    assert_eq!(prefix_of(Path::new("/usr/lib/dotnet/dotnet")), Some(PathBuf::from("/usr/lib/dotnet")));
    assert_eq!(
        prefix_of(Path::new("/x/node_modules/@scope/pkg/bin/cli.js")),
        Some(PathBuf::from("/x/node_modules/@scope/pkg"))
    );
    assert_eq!(prefix_of(Path::new("/bin/sh")), None);
    assert_eq!(
        home_dot_dir(Path::new("/home/ann/.pyenv/shims/python3"), None),
        Some((PathBuf::from("/home/ann/.pyenv"), ".pyenv".into()))
    );
    assert_eq!(home_dot_dir(Path::new("/home/ann/.local/bin/x"), None), None);
    assert_eq!(
        minimal_roots(vec!["/a/b".into(), "/a".into(), "/usr/x".into()], &["/usr".into()]),
        [PathBuf::from("/a")]
    );
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
