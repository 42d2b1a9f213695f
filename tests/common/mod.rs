//! Helpers shared by the integration tests: run the real binary, and skip
//! loudly (or fail, under CONFINE_REQUIRE_ISOLATION=1) when the kernel
//! can't show what a test needs.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};

/// The binary under test: this build's, or `CONFINE_TEST_BIN` (to show
/// that a regression test fails against an older build).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| std::env::var("CONFINE_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_confine").to_string()))
}

/// Whether the confine under test honours a debug build's test hooks
/// (`CONFINE_TEST_REFUSE`, the crash points): the debug binary cargo built
/// beside these tests does; a release one (the guests run one, named by
/// CONFINE_TEST_BIN) has none compiled in.
#[allow(dead_code)]
pub fn test_hooks() -> bool {
    cfg!(debug_assertions) && std::env::var_os("CONFINE_TEST_BIN").is_none()
}

/// `confine run ARGS…` with captured output.
pub fn run(args: &[&str]) -> Output {
    confine().arg("run").args(args).stdin(Stdio::null()).output().expect("start confine")
}

/// Whether this kernel has landlock. Without it (Linux before 5.13, or
/// the LSM left out) confine refuses every job unless degraded mode is
/// asked for, so the tests ask for it there ([`degraded_env`],
/// [`degraded_runtime`]), and `tests/suite/sandbox.rs` proves both the refusal
/// and what still holds.
#[cfg(target_os = "linux")]
pub fn kernel_has_landlock() -> bool {
    confine::sandbox::linux::landlock::kernel_abi() > 0
}

#[cfg(not(target_os = "linux"))]
pub fn kernel_has_landlock() -> bool {
    false
}

/// The environment that lets a job run on this kernel: nothing where
/// landlock exists; else `CONFINE_CONFIG` naming a configuration with
/// `allow_degraded = true` (a test's own `--config` still wins).
pub fn degraded_env() -> Vec<(&'static str, String)> {
    static CONFIG: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        if kernel_has_landlock() {
            return None;
        }
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join("allow-degraded.toml");
        let tmp = dir.join(format!("allow-degraded.toml.{}", std::process::id()));
        std::fs::write(&tmp, format!("[runtime]\n{}", degraded_runtime())).expect("write the degraded configuration");
        std::fs::rename(&tmp, &path).expect("place the degraded configuration");
        Some(path.display().to_string())
    });
    config.iter().map(|c| ("CONFINE_CONFIG", c.clone())).collect()
}

/// The line a test's own `[runtime]` table needs on this kernel: `""`, or
/// `allow_degraded = true` where there is no landlock.
pub fn degraded_runtime() -> &'static str {
    if kernel_has_landlock() {
        ""
    } else {
        "allow_degraded = true\n"
    }
}

/// How much slower than a real machine this one is, for the few bounds on
/// time that a test asserts: `CONFINE_TEST_SLOW` (an emulated VM guest of
/// `./dev vm-test` sets 10), else 1.
pub fn slow() -> u32 {
    std::env::var("CONFINE_TEST_SLOW").ok().and_then(|v| v.parse().ok()).filter(|n| *n >= 1).unwrap_or(1)
}

/// The running kernel's (major, minor) version.
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Whether this kernel can idmap a mount of the file system holding
/// `path` (Linux 5.12 for ext4 and xfs, 5.15 for btrfs, 6.3 for tmpfs).
/// Without it a workspace is bound as it is, so only one the job's uid
/// can use is usable, and confine says so when it is not.
#[cfg(target_os = "linux")]
pub fn idmap_supported(path: &std::path::Path) -> bool {
    let version = kernel_version();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a path without NUL");
    // SAFETY: statfs writes into the zeroed struct we own; the path is a
    // valid NUL-terminated string.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c_path.as_ptr(), &mut st) != 0 {
            return false;
        }
        st.f_type
    };
    let since = match magic {
        libc::EXT4_SUPER_MAGIC | libc::XFS_SUPER_MAGIC => (5, 12),
        libc::BTRFS_SUPER_MAGIC => (5, 15),
        libc::TMPFS_MAGIC => (6, 3),
        _ => return false,
    };
    version >= since
}

/// `git ARGS…` in `dir`, trusting `dir` whoever owns it, and succeeded.
/// Git before 2.36 (Debian 11 has 2.30) takes `safe.directory` only from
/// the global and system files, not from `-c`: a throwaway HOME holds it.
pub fn git_in(dir: &std::path::Path, args: &[&str]) -> bool {
    let home = tempfile::tempdir().expect("a HOME for git");
    let config =
        format!("[safe]\n\tdirectory = *\n\tdirectory = {}\n[user]\n\temail = t@t\n\tname = t\n", dir.display());
    std::fs::write(home.path().join(".gitconfig"), config).expect("write .gitconfig");
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("HOME", home.path())
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `confine`, to be given its arguments, able to run a job on this
/// kernel ([`degraded_env`]).
pub fn confine() -> Command {
    let mut cmd = Command::new(bin());
    cmd.envs(degraded_env());
    cmd
}

/// `cmd`'s output, as `Command::output` gives it, but a failure instead of
/// a hang: past `limit` the child (ours, by pid) is killed and the test
/// fails with what it had written. For tests whose regression would be a
/// deadlock in the store.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Output {
    use std::io::Read;
    // A hang detector, not a time bound: an emulated guest stretches it.
    let limit = limit * slow();
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let err = err.join().unwrap_or_default();
            panic!("{cmd:?} did not end within {limit:?} (a deadlock?): {}", String::from_utf8_lossy(&err));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Skip a test with a printed reason; a failure when isolation is required.
pub fn skip(reason: &str) {
    if std::env::var("CONFINE_REQUIRE_ISOLATION").as_deref() == Ok("1") {
        panic!("required isolation is unavailable: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and can't fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether this kernel lets us create the sandbox at all (probe once).
pub fn sandbox_available() -> bool {
    let out = run(&["--", "/bin/true"]);
    if out.status.success() {
        return true;
    }
    skip(&format!("confine can't create a sandbox here: {}", stderr(&out).trim()));
    false
}

/// Pids on the host whose command line contains `token`.
pub fn host_pids_with(token: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        if let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) {
            if String::from_utf8_lossy(&cmd).contains(token) {
                found.push(pid);
            }
        }
    }
    found
}

/// `dir/repo`, made, with `dir` and it 0755: a repository the job (another
/// uid when the supervisor is root) can read.
#[cfg(unix)]
pub fn readable_repo(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap();
    for p in [dir, repo.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    repo
}

/// A confine.toml with execution enabled, the store at `store`, and one
/// repository `id` at `root`.
pub fn exec_config(store: &std::path::Path, id: &str, root: &std::path::Path) -> String {
    format!(
        "[runtime]\nenabled = true\n{}\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"{id}\"\nroot = \"{}\"\n",
        degraded_runtime(),
        store.display(),
        root.display()
    )
}

/// A unique token for this test process.
pub fn token(name: &str) -> String {
    format!("confinetest-{name}-{}", std::process::id())
}
pub mod mcp;
pub mod rpc;

/// Open the store at `path`, waiting up to 4 s for a handle just dropped
/// in this process: sled lets go of its file lock a moment after the last
/// handle of a store is dropped (its flusher thread holds the file until
/// it notices).
#[allow(dead_code)]
pub fn open_store(path: &std::path::Path) -> confine::store::Store {
    open_store_with(path, confine::store::Store::open)
}

/// [`open_store`] with another of the store's openers
/// (`Store::open_flushed_by_caller`).
#[allow(dead_code)]
pub fn open_store_with(
    path: &std::path::Path,
    open: impl Fn(&std::path::Path) -> Result<confine::store::Store, confine::store::StoreError>,
) -> confine::store::Store {
    for _ in 0..200 {
        if let Ok(s) = open(path) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    match open(path) {
        Ok(s) => s,
        Err(e) => panic!("the store at {} did not open: {e}", path.display()),
    }
}

/// Every cgroup directory on the host whose name satisfies `f`.
pub fn cgroup_dirs(f: &dyn Fn(&str) -> bool) -> Vec<std::path::PathBuf> {
    fn walk(dir: &std::path::Path, depth: usize, f: &dyn Fn(&str) -> bool, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            if !ft.is_dir() {
                continue;
            }
            if f(&e.file_name().to_string_lossy()) {
                out.push(e.path());
            }
            if depth < 12 {
                walk(&e.path(), depth + 1, f, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(std::path::Path::new("/sys/fs/cgroup"), 0, f, &mut out);
    out
}

/// A temp dir with a repository (`repo`) in it, for library tests that
/// run jobs: the init stage is pointed at the binary under test.
#[cfg(target_os = "linux")]
pub fn scratch_repo() -> (tempfile::TempDir, std::path::PathBuf) {
    confine::sandbox::linux::set_init_executable(bin().into());
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    (dir, repo)
}
