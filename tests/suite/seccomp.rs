//! The seccomp layer, checked from inside real sandboxes: each forbidden
//! call is made by a small C probe (tests/probes/) and must fail with the
//! exact errno the profile names; ordinary toolchains must keep working.
//!
//! Where the kernel alone would give the same answer, the probe is also run
//! under an allow-everything profile (the control), and the answers must
//! differ: that is what shows the filter, not the kernel, said no.

use crate::common;
use common::*;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A profile with no rules: the control run.
const ALLOW_ALL: &str = r#"{"comment": "control: no syscall is filtered", "defaultAction": "SCMP_ACT_ALLOW"}"#;

fn docker_fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/docker-default-seccomp.json")
}

/// Probes compiled into a world-readable temp dir, bound at /probes.
struct Probes {
    dir: tempfile::TempDir,
}

impl Probes {
    /// Compile `names` (tests/probes/NAME.c). `None` when there is no cc.
    fn build(names: &[&str]) -> Option<Probes> {
        let dir = tempfile::Builder::new().prefix("confine-probes").tempdir().unwrap();
        // The job runs as an unprivileged uid: it must be able to enter and exec.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/probes");
        for name in names {
            let out = match Command::new("cc")
                .args(["-O1", "-Wall", "-o"])
                .arg(dir.path().join(name))
                .arg(src.join(format!("{name}.c")))
                .output()
            {
                Ok(out) => out,
                Err(e) => {
                    skip(&format!("cannot run cc to build the probes: {e}"));
                    return None;
                }
            };
            assert!(out.status.success(), "cc {name}.c: {}", stderr(&out));
        }
        std::fs::write(dir.path().join("allow-all.json"), ALLOW_ALL).unwrap();
        Some(Probes { dir })
    }

    fn allow_all(&self) -> PathBuf {
        self.dir.path().join("allow-all.json")
    }

    /// Run probe `name` in a sandbox under `profile` (None: the default).
    fn run(&self, name: &str, profile: Option<&Path>, stdin: Stdio) -> Output {
        self.run_with(&[], name, profile, stdin)
    }

    fn run_with(&self, flags: &[&str], name: &str, profile: Option<&Path>, stdin: Stdio) -> Output {
        let mut cmd = Command::new(bin());
        cmd.arg("run").args(flags);
        if let Some(p) = profile {
            cmd.arg("--seccomp").arg(p);
        }
        let bind = format!("{}:/probes", self.dir.path().display());
        cmd.args(["--ro-bind", &bind, "--", &format!("/probes/{name}")]);
        let out = cmd.stdin(stdin).output().expect("start confine");
        assert!(out.status.success(), "probe {name} failed: {}{}", stdout(&out), stderr(&out));
        out
    }

    /// The probe's answers: attempt name → `ok`, `errno=N`, `signal=N`, `exit=N`.
    fn results(&self, name: &str, profile: Option<&Path>) -> BTreeMap<String, String> {
        parse(&self.run(name, profile, Stdio::null()))
    }
}

fn parse(out: &Output) -> BTreeMap<String, String> {
    // A pty's line discipline ends lines with \r\n, and echoes what a
    // successful TIOCSTI injected (the probe's '#') before the next line.
    let text = stdout(out);
    text.lines()
        .filter_map(|l| l.trim_end_matches('\r').trim_start_matches('#').split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Assert every `(attempt, answer)` pair; print all answers on failure.
fn expect(results: &BTreeMap<String, String>, want: &[(&str, &str)]) {
    for (attempt, answer) in want {
        assert_eq!(results.get(*attempt).map(String::as_str), Some(*answer), "{attempt}; all answers: {results:?}");
    }
}

/// Probes, when the sandbox and a C compiler are both here.
fn probes(names: &[&str]) -> Option<Probes> {
    if !sandbox_available() {
        return None;
    }
    Probes::build(names)
}

#[test]
fn filter_is_installed_last_with_no_new_privs() {
    if !sandbox_available() {
        return;
    }
    let out =
        run(&["--", "/bin/sh", "-c", "grep -E '^(Seccomp|Seccomp_filters|NoNewPrivs|CapEff):' /proc/self/status"]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    // Mode 2 is a BPF filter; one filter, ours; installed after caps were
    // dropped and no_new_privs was set (the kernel requires the latter).
    for line in ["Seccomp:\t2", "Seccomp_filters:\t1", "NoNewPrivs:\t1", "CapEff:\t0000000000000000"] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn ptrace_and_process_vm_fail_with_eperm() {
    let Some(p) = probes(&["ptrace"]) else { return };
    let r = p.results("ptrace", None);
    expect(
        &r,
        &[
            ("ptrace_attach", "errno=1"),
            ("ptrace_peek", "errno=1"),
            ("process_vm_readv", "errno=1"),
            ("process_vm_writev", "errno=1"),
            ("ptrace_traceme", "errno=1"),
            ("ptrace_traceme_peek", "errno=1"),
        ],
    );
    // Without the filter, the same uid may trace its own child.
    let control = p.results("ptrace", Some(&p.allow_all()));
    expect(&control, &[("ptrace_attach", "ok"), ("process_vm_readv", "ok"), ("ptrace_traceme_peek", "errno=3")]);
}

#[test]
fn mount_family_fails_with_eperm() {
    let Some(p) = probes(&["mount"]) else { return };
    let r = p.results("mount", None);
    expect(
        &r,
        &[
            ("mount_tmpfs", "errno=1"),
            ("mount_badptr", "errno=1"),
            ("umount2", "errno=1"),
            ("pivot_root", "errno=1"),
            ("fsopen", "errno=1"),
            ("open_tree", "errno=1"),
        ],
    );
    // The kernel itself answers a bad pointer with EFAULT before it looks
    // at privileges: EPERM above came from the filter.
    let control = p.results("mount", Some(&p.allow_all()));
    expect(&control, &[("mount_badptr", "errno=14"), ("umount2", "errno=14")]);
}

#[test]
fn namespaces_cannot_be_created() {
    let Some(p) = probes(&["namespaces"]) else { return };
    let r = p.results("namespaces", None);
    expect(
        &r,
        &[
            ("unshare_user", "errno=1"),
            ("unshare_net", "errno=1"),
            ("clone_newuser", "errno=1"),
            ("clone_newns", "errno=1"),
            ("clone_plain", "ok"),
            // ENOSYS, so libcs fall back to clone, whose flags are checked.
            ("clone3_newuser", "errno=38"),
            ("clone3_plain", "errno=38"),
            ("setns", "errno=1"),
        ],
    );
    // Without the filter, the job's namespace still refuses a new one: its
    // counters are capped at 0 (`/proc/sys/user/max_*_namespaces`), and
    // the kernel says ENOSPC. Each layer holds on its own.
    let control = p.results("namespaces", Some(&p.allow_all()));
    expect(&control, &[("unshare_user", "errno=28"), ("clone_newuser", "errno=28"), ("clone3_newuser", "errno=28")]);
}

#[test]
fn keyrings_bpf_perf_io_uring_userfaultfd_fail_with_eperm() {
    let Some(p) = probes(&["kernel_apis"]) else { return };
    let r = p.results("kernel_apis", None);
    expect(
        &r,
        &[
            ("keyctl", "errno=1"),
            ("add_key", "errno=1"),
            ("bpf", "errno=1"),
            ("perf_event_open", "errno=1"),
            ("io_uring_setup", "errno=1"),
            ("userfaultfd", "errno=1"),
        ],
    );
    // The kernel lets keyctl through and answers the bad bpf and perf
    // attribute pointers with EFAULT.
    let control = p.results("kernel_apis", Some(&p.allow_all()));
    expect(&control, &[("keyctl", "ok"), ("bpf", "errno=14"), ("perf_event_open", "errno=14")]);
}

#[test]
fn tiocsti_and_tioclinux_fail_with_eperm_whatever_the_high_bits() {
    let Some(p) = probes(&["tty"]) else { return };
    // The job's own terminal (`--tty`): without it, a job has none.
    let run = |profile: Option<&Path>| parse(&p.run_with(&["--tty"], "tty", profile, Stdio::null()));
    let r = run(None);
    expect(
        &r,
        &[
            ("tiocsctty", "ok"),
            ("tcgetattr", "ok"),
            ("tiocgwinsz", "ok"),
            ("tiocsti", "errno=1"),
            ("tiocsti_high", "errno=1"),
            ("tioclinux", "errno=1"),
            ("tioclinux_high", "errno=1"),
        ],
    );
    let control = run(Some(&p.allow_all()));
    let legacy = std::fs::read_to_string("/proc/sys/dev/tty/legacy_tiocsti").map(|s| s.trim() == "1");
    if legacy.unwrap_or(false) {
        // Here the kernel would inject the character, high bits or not.
        expect(&control, &[("tiocsti", "ok"), ("tiocsti_high", "ok")]);
    } else {
        eprintln!("note: dev.tty.legacy_tiocsti is off here; the control run can't show TIOCSTI succeeding");
    }
    // A pty is not a virtual console: the kernel says ENOTTY, the filter EPERM.
    expect(&control, &[("tioclinux", "errno=25"), ("tioclinux_high", "errno=25")]);
}

#[test]
fn foreign_architecture_syscalls_kill_the_caller() {
    let Some(p) = probes(&["foreign_arch"]) else { return };
    if !cfg!(target_arch = "x86_64") {
        return skip("the foreign-architecture probe is x86_64 code");
    }
    let r = p.results("foreign_arch", None);
    // x32 (bit 30 on the native number) is caught by the filter even on
    // kernels built without x32, which would answer ENOSYS.
    expect(&r, &[("x32_getpid", "signal=31")]);
    // The control runs on the host itself, unsandboxed: getpid is harmless.
    let host = parse(&Command::new(p.dir.path().join("foreign_arch")).output().unwrap());
    if host.get("int80_getpid").map(String::as_str) == Some("exit=0") {
        expect(&r, &[("int80_getpid", "signal=31")]);
    } else {
        // Without ia32 emulation the CPU faults before seccomp sees the call.
        eprintln!("note: int 0x80 does not work on this host ({host:?}); checking only that it did not run");
        assert_ne!(r.get("int80_getpid").map(String::as_str), Some("exit=0"), "{r:?}");
    }
}

/// `sh -c SCRIPT` in a sandbox with `extra` arguments; asserts success.
fn sh(extra: &[&str], script: &str) -> String {
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["--", "/bin/sh", "-c", script]);
    let out = run(&args);
    let text = stdout(&out);
    assert!(out.status.success(), "{script}\nexit {:?}\nstdout:\n{text}\nstderr:\n{}", out.status, stderr(&out));
    text
}

fn have(tool: &str) -> bool {
    let found = Path::new(tool).exists();
    if !found {
        // A missing toolchain is not missing isolation: noted, never a failure.
        eprintln!("SKIPPED: {tool} is not installed on this host");
    }
    found
}

const PYTHON: &str = r#"
import json, multiprocessing, os, sqlite3, ssl, subprocess, tempfile, threading
out = subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip()
t = threading.Thread(target=lambda: None); t.start(); t.join()
with multiprocessing.Pool(2) as pool:
    squares = pool.map(abs, [-1, -2, -3])
db = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "db")); db.execute("create table t (x)")
print(json.dumps({"sub": out, "pool": squares}))
"#;

const C_PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
static void *work(void *arg) { return arg; }
int main(void) {
    pthread_t t; void *r;
    pthread_create(&t, 0, work, (void *)42); pthread_join(t, &r);
    printf("hello from cc, thread said %ld\n", (long)r);
    return 0;
}
"#;

fn python_and_cc_work(profile: &[&str]) {
    let text = sh(profile, &format!("/usr/bin/python3 -c '{PYTHON}'"));
    assert!(text.contains(r#"{"sub": "child", "pool": [1, 2, 3]}"#), "{text}");
    let script = format!(
        "cat > /tmp/hello.c <<'EOF'\n{C_PROGRAM}\nEOF\ncc -O1 -pthread -o /tmp/hello /tmp/hello.c && /tmp/hello"
    );
    let text = sh(profile, &script);
    assert!(text.contains("hello from cc, thread said 42"), "{text}");
}

#[test]
fn python_and_cc_work_under_the_default_profile() {
    if !sandbox_available() || !have("/usr/bin/python3") || !have("/usr/bin/cc") {
        return;
    }
    python_and_cc_work(&[]);
}

#[test]
fn node_works() {
    if !sandbox_available() || !have("/usr/bin/node") {
        return;
    }
    let js = r#"const fs = require("fs"); const cp = require("child_process");
fs.promises.readFile("/etc/hostname", "utf8").then(h => {
  const echo = cp.execFileSync("/bin/echo", ["child"]).toString().trim();
  new Promise(r => setTimeout(r, 10)).then(() => console.log("node", 1 + 1, echo, h.length >= 0));
});"#;
    let text = sh(&[], &format!("/usr/bin/node -e '{js}'"));
    assert!(text.contains("node 2 child true"), "{text}");
}

#[test]
fn git_and_make_work() {
    if !sandbox_available() || !have("/usr/bin/git") || !have("/usr/bin/make") {
        return;
    }
    let script = r#"set -e
cd /tmp && /usr/bin/git init -q repo && cd repo
echo hi > a && /usr/bin/git add a
/usr/bin/git -c user.email=t@example.com -c user.name=t commit -qm first
/usr/bin/git log --oneline | wc -l
printf 'all: out\nout: a\n\tcp a out && echo made\n' > Makefile
/usr/bin/make"#;
    let text = sh(&[], script);
    assert!(text.contains("1\n") && text.contains("made"), "{text}");
}

#[test]
fn java_works() {
    if !sandbox_available() || !have("/usr/bin/javac") || !have("/usr/bin/java") {
        return;
    }
    let script = r#"set -e
mkdir -p /tmp/j && cd /tmp/j
cat > Hello.java <<'EOF'
public class Hello {
    public static void main(String[] a) throws Exception {
        Thread t = new Thread(() -> System.out.println("java thread"));
        t.start(); t.join();
        System.out.println("java " + Runtime.getRuntime().availableProcessors() + " cpus");
    }
}
EOF
/usr/bin/javac Hello.java && /usr/bin/java -cp . Hello"#;
    let text = sh(&[], script);
    assert!(text.contains("java thread") && text.contains("cpus"), "{text}");
}

#[test]
fn cargo_and_rustc_work() {
    let (rustup, cargo) = (Path::new("/root/.rustup"), Path::new("/root/.cargo"));
    if !sandbox_available() || !have("/root/.cargo/bin/cargo") || !rustup.is_dir() || !cargo.is_dir() {
        return;
    }
    // The toolchain is read from the bound, read-only rustup and cargo
    // trees (pid 1 opens bind sources with host credentials, so /root's
    // 0700 is no obstacle); a crate without dependencies needs no writes there.
    let script = r#"set -e
cd /tmp && cargo new -q --vcs none hello && cd hello
cargo run -q 2>&1
rustc --version"#;
    let text = sh(
        &[
            "--ro-bind",
            "/root/.rustup",
            "--ro-bind",
            "/root/.cargo",
            "-e",
            "RUSTUP_HOME=/root/.rustup",
            "-e",
            "CARGO_HOME=/root/.cargo",
            "-e",
            "PATH=/root/.cargo/bin:/usr/bin:/bin",
        ],
        script,
    );
    assert!(text.contains("Hello, world!") && text.contains("rustc "), "{text}");
}

#[test]
fn go_works() {
    let Some(go) =
        ["/usr/local/go/bin/go", "/usr/bin/go", "/usr/lib/go/bin/go"].into_iter().find(|g| Path::new(g).exists())
    else {
        eprintln!("SKIPPED: go is not installed on this host (looked in /usr/local/go, /usr/bin, /usr/lib/go)");
        return;
    };
    if !sandbox_available() {
        return;
    }
    let root = Path::new(go).parent().and_then(Path::parent).unwrap().display().to_string();
    let script = format!(
        "set -e; mkdir -p /tmp/g && cd /tmp/g && printf 'package main\\nimport \"fmt\"\\nfunc main() {{ fmt.Println(\"go ok\") }}\\n' > m.go && {go} run m.go"
    );
    let text =
        sh(&["--ro-bind", &root, "-e", "HOME=/tmp", "-e", "GOCACHE=/tmp/gocache", "-e", "GOFLAGS=-mod=mod"], &script);
    assert!(text.contains("go ok"), "{text}");
}

#[test]
fn docker_default_profile_loads_unchanged_and_runs_python_and_cc() {
    let fixture = docker_fixture();
    if !sandbox_available() {
        return;
    }
    let path = fixture.to_str().unwrap();
    python_and_cc_work(&["--seccomp", path]);

    // The outcome names the profile by its file name.
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let out = run(&["--seccomp", path, "--json-status", status.to_str().unwrap(), "--", "/bin/true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["layers"]["seccomp"], "docker-default-seccomp.json", "{v}");
}

#[test]
fn docker_default_profile_still_denies_namespaces_and_foreign_arches() {
    let fixture = docker_fixture();
    let Some(p) = probes(&["namespaces", "foreign_arch"]) else { return };
    // Evaluated for a job without capabilities: the CAP_SYS_ADMIN entries
    // (unshare, setns, mount, unrestricted clone) do not apply.
    let r = p.results("namespaces", Some(&fixture));
    expect(
        &r,
        &[
            ("unshare_user", "errno=1"),
            ("clone_newuser", "errno=1"),
            ("clone_plain", "ok"),
            ("clone3_newuser", "errno=38"),
            ("setns", "errno=1"),
        ],
    );
    // Docker would add i386 and x32 through archMap; confine never does.
    if cfg!(target_arch = "x86_64") {
        expect(&p.results("foreign_arch", Some(&fixture)), &[("x32_getpid", "signal=31")]);
    }
}

#[test]
fn the_default_outcome_names_default_json() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let out = run(&["--json-status", status.to_str().unwrap(), "--", "/bin/true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["layers"]["seccomp"], "default.json", "{v}");
}

#[test]
fn a_malformed_profile_stops_the_run_with_exit_125_naming_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["write", "exit_grup"], "action": "SCMP_ACT_ALLOW"}]}"#,
            "syscalls[1]: 'exit_grup': unknown syscall name",
        ),
        (
            r#"{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOWED"}]}"#,
            "syscalls[0] (read): unknown action 'SCMP_ACT_ALLOWED'",
        ),
        (
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
                "args": [{"index": 1, "value": 21522, "op": "SCMP_CMP_EQUAL"}]}]}"#,
            "syscalls[0] (ioctl): args[0]: unknown op 'SCMP_CMP_EQUAL'",
        ),
        (
            r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [
                {"names": ["ioctl"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO",
                 "args": [{"index": 1, "value": 4294967295, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"}]}]}"#,
            "libseccomp would silently keep only the unconditional rule",
        ),
        ("{\"defaultAction\": ", "not valid JSON"),
    ];
    for (i, (profile, message)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{i}.json"));
        std::fs::write(&path, profile).unwrap();
        let out = run(&["--seccomp", path.to_str().unwrap(), "--", "/bin/echo", "must not run"]);
        assert_eq!(out.status.code(), Some(125), "case {i}: {}", stderr(&out));
        assert!(!stdout(&out).contains("must not run"), "case {i}");
        let err = stderr(&out);
        assert!(err.contains(&format!("bad{i}.json")) && err.contains(message), "case {i}: {err}");
    }
    let out = run(&["--seccomp", "/nonexistent/profile.json", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("cannot read seccomp profile /nonexistent/profile.json"), "{}", stderr(&out));
}

/// Numbers for the README and the issue: `cargo test --release --test
/// seccomp -- --ignored --nocapture measure` (MEASURE_EXTRA=FILE also times
/// another profile).
#[test]
#[ignore]
fn measure_profile_compile() {
    use confine::sandbox::linux::seccomp::{compile_default, compile_file};
    use std::time::{Duration, Instant};
    let median_min = |mut v: Vec<Duration>| {
        v.sort();
        (v[v.len() / 2], v[0])
    };
    let (mut default, mut docker) = (Vec::new(), Vec::new());
    let (mut default_insns, mut docker_insns) = (0, 0);
    for _ in 0..50 {
        let t = Instant::now();
        default_insns = compile_default().unwrap().instructions().unwrap();
        default.push(t.elapsed());
        if docker_fixture().exists() {
            let t = Instant::now();
            docker_insns = compile_file(&docker_fixture()).unwrap().instructions().unwrap();
            docker.push(t.elapsed());
        }
    }
    let (med, min) = median_min(default);
    println!("default.json: {default_insns} BPF instructions, compiled in {med:?} (median of 50; min {min:?})");
    if let Ok(p) = std::env::var("MEASURE_EXTRA") {
        let mut v = Vec::new();
        let mut insns = 0;
        for _ in 0..50 {
            let t = Instant::now();
            insns = compile_file(Path::new(&p)).unwrap().instructions().unwrap();
            v.push(t.elapsed());
        }
        let (med, min) = median_min(v);
        println!("{p}: {insns} BPF instructions, compiled in {med:?} (median of 50; min {min:?})");
    }
    if !docker.is_empty() {
        let (med, min) = median_min(docker);
        println!("docker fixture: {docker_insns} BPF instructions, compiled in {med:?} (median of 50; min {min:?})");
    }
}

/// The compiled program is cached (as root) and a damaged cache entry never
/// weakens the filter: the next run compiles again and replaces it.
#[test]
fn the_compiled_profile_is_cached_and_a_damaged_entry_is_replaced() {
    if !is_root() {
        skip("the seccomp cache is used only by a root supervisor");
        return;
    }
    if !sandbox_available() {
        skip("no sandbox on this host");
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let run_cached = || {
        Command::new(bin())
            .env("CONFINE_CACHE_DIR", cache.path())
            .args(["run", "--", "/bin/sh", "-c", "grep -E '^Seccomp(_filters)?:' /proc/self/status"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let want = "Seccomp:\t2\nSeccomp_filters:\t1\n";
    let first = run_cached();
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stdout(&first), want);
    let dir = cache.path().join("seccomp");
    let entries: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "one entry for the default profile: {entries:?}");
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);

    // Served from the cache: same filter.
    let second = run_cached();
    assert_eq!(stdout(&second), want, "{}", stderr(&second));

    // Damage the entry: the job still gets the full filter, and the entry is rewritten.
    let damaged = std::fs::read(&entries[0]).unwrap();
    let mut bytes = damaged.clone();
    let n = bytes.len();
    bytes[n - 3] ^= 0xff;
    std::fs::write(&entries[0], &bytes).unwrap();
    let third = run_cached();
    assert_eq!(stdout(&third), want, "{}", stderr(&third));
    assert_eq!(std::fs::read(&entries[0]).unwrap(), damaged, "the damaged entry is replaced by a fresh compile");
    // Still the real filter: a namespace can't be made.
    let probe = Command::new(bin())
        .env("CONFINE_CACHE_DIR", cache.path())
        .args(["run", "--", "/usr/bin/unshare", "-U", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!probe.status.success(), "unshare -U must fail under the cached filter");
}
