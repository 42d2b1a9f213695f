//! Warm sandboxes (`[sandbox] warm`): a server's request runs in a
//! sandbox built before it arrived. What must hold: the job is confined
//! exactly as in a sandbox built for it, two jobs share nothing, a job
//! can't reach a warm sandbox waiting beside it, and nothing is left
//! behind.

use crate::common;
use common::*;
use confine::config::Config;
use confine::supervisor::exec::{JobControl, JobRequest, JobResponse};
use confine::supervisor::Supervisor;
use std::time::Duration;

fn supervisor(dir: &std::path::Path, extra: &str) -> Supervisor {
    confine::sandbox::linux::set_init_executable(bin().into());
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("hello.txt"), "hello from the workspace\n").unwrap();
    let text = format!(
        "[runtime]\nenabled = true\nmax_concurrent_jobs = 4\n\n[store]\npath = \"{}\"\n\n\
         [sandbox]\n{extra}\n\n[[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
        dir.join("store").display(),
        repo.display()
    );
    let config = Config::parse(&text, &dir.join("confine.toml")).unwrap();
    Supervisor::open(config).unwrap()
}

fn shell(code: &str) -> JobRequest {
    JobRequest {
        repo_id: Some("demo".into()),
        runtime: "shell".into(),
        code: Some(code.into()),
        ..JobRequest::default()
    }
}

fn warm(r: &JobResponse) -> bool {
    r.outcome.as_ref().map(|o| o.layers.warm).unwrap_or(false)
}

fn stdout(r: &JobResponse) -> String {
    r.output.as_ref().and_then(|o| o.stdout.clone()).unwrap_or_default()
}

/// Run `code` until it runs warm (the pool builds after the first
/// request of a shape); the response.
async fn run_warm(sup: &Supervisor, code: &str) -> JobResponse {
    for _ in 0..300 {
        let r = sup.execute(shell(code), JobControl::default()).await;
        if warm(&r) {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no request ran warm");
}

// The guard serializes whole tests against the spinners (a runtime of
// the test's own, nothing else takes it on this runtime).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_runs_warm_and_is_confined_as_a_cold_one() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), "");
    // Root's file, which only an idmap shows as the job's own, and
    // another uid's, which no mapping of the job's gives it.
    {
        use std::os::unix::fs::PermissionsExt;
        let repo = dir.path().join("repo");
        for (name, uid) in [("roots.txt", 0), ("others.txt", 4242)] {
            std::fs::write(repo.join(name), "x\n").unwrap();
            std::fs::set_permissions(repo.join(name), std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(repo.join(name), Some(uid), Some(uid)).unwrap();
        }
    }
    let probe = r#"
cat /workspace/hello.txt
echo "pwd=$(pwd)"
echo "init=$(cat /proc/1/comm)"
echo "ppid=$PPID"
grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status
echo "tmp=$(ls -A /tmp | tr '\n' ,)"
touch /workspace/x 2>/dev/null && echo "workspace=writable" || echo "workspace=read-only"
cat /workspace/roots.txt >/dev/null 2>&1 && echo "roots.txt=readable" || echo "roots.txt=unreadable"
cat /workspace/others.txt >/dev/null 2>&1 && echo "others.txt=readable" || echo "others.txt=unreadable"
echo "dev=$(ls /dev | tr '\n' ,) pts=$(ls /dev/pts | tr '\n' ,)"
python3 -c 'import os; m, s = os.openpty(); print("openpty=" + os.ttyname(s))'
"#;
    let cold = sup.execute(shell(probe), JobControl::default()).await;
    assert!(!warm(&cold), "the first request has no warm sandbox to take");
    let hot = run_warm(&sup, probe).await;
    assert_eq!(serde_json::to_value(hot.status).unwrap(), "success", "{:?}", hot.error);
    // The code's own file is in /tmp: the same in both.
    assert_eq!(stdout(&hot), stdout(&cold), "a warm job sees what a cold one sees");
    let text = stdout(&hot);
    eprintln!("warm job:\n{text}");
    assert!(text.contains("hello from the workspace"), "{text}");
    assert!(text.contains("init=confine-init") && text.contains("ppid=1"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1") && text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("Seccomp:\t2"), "{text}");
    assert!(text.contains("workspace=read-only"), "{text}");
    // The same /dev, with a devpts instance of its own.
    assert!(text.contains("openpty=/dev/pts/0") && text.contains(" pts=ptmx,\n"), "{text}");
    // Root's checkout, idmapped onto the job (the warm sandbox made the
    // mapping's namespace before the request, as the cold one had asked):
    // root's private file is the job's, another uid's is not.
    assert!(text.contains("roots.txt=readable") && text.contains("others.txt=unreadable"), "{text}");
    // Every layer the cold job had, the warm one has.
    let (c, h) = (cold.outcome.unwrap().layers, hot.outcome.unwrap().layers);
    let idmapped = serde_json::to_value(&h).unwrap()["idmapped"].clone();
    assert_eq!(idmapped, serde_json::json!(["/workspace"]), "{h:?}");
    let mut h2 = h.clone();
    h2.warm = false;
    assert_eq!(serde_json::to_value(&h2).unwrap(), serde_json::to_value(&c).unwrap());
}

/// The stages of the sandboxes that `pid` started and that are there now
/// (its children running `confine-init __init`): with no job running,
/// its warm sandboxes.
fn stages_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            if cmdline.starts_with(b"confine-init\0__init") {
                out.push(child);
            }
        }
    }
    out.sort();
    out
}

/// The stages of `pid`'s two warm sandboxes once both have their pid 1.
/// Read again until then: other tests mount on the host meanwhile, and
/// each change of its mount table replaces the waiting sandboxes.
fn built_stages(pid: u32) -> Vec<u32> {
    let mut stages = Vec::new();
    eventually("two warm sandboxes with their pid 1s", Duration::from_secs(90), || {
        stages = stages_of(pid);
        stages.len() == 2 && pid1s_of(&stages).len() == 2
    });
    stages
}

fn alive(pid: u32) -> bool {
    // A zombie is dead: its stage was killed and not reaped yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

fn eventually(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// The guard serializes whole tests against the spinners (a runtime of
// the test's own, nothing else takes it on this runtime).
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_warm_jobs_share_no_tmp_shm_pid_or_namespace() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), "");
    let probe = r#"
for f in /tmp/planted /dev/shm/planted; do [ -e $f ] && echo "found=$f"; done
echo planted > /tmp/planted; echo planted > /dev/shm/planted
for ns in pid mnt net ipc uts user cgroup; do echo "$ns=$(readlink /proc/self/ns/$ns)"; done
echo "root=$(stat -c %d /)"
echo "pids=$(ls /proc | grep -E '^[0-9]+$' | tr '\n' ,)"
"#;
    let first = run_warm(&sup, probe).await;
    let second = run_warm(&sup, probe).await;
    let (a, b) = (stdout(&first), stdout(&second));
    assert!(!a.contains("found=") && !b.contains("found="), "a file outlived its job:\n{a}\n{b}");
    // The job's own mount namespace is made when its request comes, after
    // the first job's is gone, and the kernel may give it the number the
    // first one had: its tree is compared instead, by the root's file
    // system, which each sandbox makes while the other still lives.
    for ns in ["pid", "net", "ipc", "uts", "user", "cgroup", "root"] {
        let line = |t: &str| t.lines().find(|l| l.starts_with(&format!("{ns}="))).unwrap().to_string();
        assert_ne!(line(&a), line(&b), "two jobs shared a {ns} namespace");
    }
    // Each sees only its own few processes, from pid 1 up.
    for t in [&a, &b] {
        let pids = t.lines().find_map(|l| l.strip_prefix("pids=")).unwrap();
        let pids: Vec<u32> = pids.split(',').filter(|p| !p.is_empty()).map(|p| p.parse().unwrap()).collect();
        assert!(pids.len() <= 6 && pids.iter().all(|p| *p < 100), "{pids:?}");
    }
}

/// `confine serve` over stdio, with its own warm pool: its stages are
/// its children, told apart from any other test's.
struct Served {
    rpc: common::rpc::Rpc,
    _dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

impl Served {
    fn start(extra: &str) -> Served {
        Served::start_in(extra, &[])
    }

    /// A server in degraded mode (`runtime.allow_degraded`).
    fn start_degraded(extra: &str) -> Served {
        Served::start_with("allow_degraded = true\n", extra, &[])
    }

    /// A server in a mount namespace of its own (private): other tests'
    /// host mounts don't replace its sandboxes, and the mounts a test
    /// makes in it (`in_ns`) reach no other test.
    fn start_apart(extra: &str) -> Served {
        Served::start_in(extra, &["unshare", "-m", "--propagation", "private"])
    }

    /// Run `cmd` in the server's mount namespace.
    fn in_ns(&self, cmd: &str) {
        sh(&format!("nsenter -t {} -m sh -c '{cmd}'", self.pid()));
    }

    fn start_in(extra: &str, wrapper: &[&str]) -> Served {
        Served::start_with("", extra, wrapper)
    }

    fn start_with(runtime: &str, extra: &str, wrapper: &[&str]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let repo = readable_repo(dir.path());
        let config = dir.path().join("confine.toml");
        std::fs::write(
            &config,
            format!(
                "[runtime]\nenabled = true\n{runtime}\n[store]\npath = \"{}\"\n\n[sandbox]\n{extra}\n\n\
                 [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
                dir.path().join("store").display(),
                repo.display()
            ),
        )
        .unwrap();
        let rpc = if wrapper.is_empty() { Served::serve(&config) } else { serve_wrapped(&config, wrapper) };
        Served { rpc, _dir: dir, config }
    }

    fn serve(config: &std::path::Path) -> common::rpc::Rpc {
        let mut cmd = std::process::Command::new(bin());
        cmd.arg("--config").arg(config).arg("serve").env("CONFINE_LOG", "warn");
        common::rpc::Rpc::start(cmd, "warm")
    }

    fn pid(&self) -> u32 {
        self.rpc.child.id()
    }

    /// `runtime_execute` of shell `code`: its structured answer.
    fn exec(&mut self, code: &str) -> serde_json::Value {
        call(&mut self.rpc, code)
    }

    fn exec_warm(&mut self, code: &str) -> serde_json::Value {
        until_warm(|| self.exec(code))
    }
}

/// `runtime_execute` of shell `code` in repository `demo`, verbose: its
/// structured answer.
fn call(rpc: &mut common::rpc::Rpc, code: &str) -> serde_json::Value {
    let args = serde_json::json!({"repoId": "demo", "runtime": "shell", "code": code, "verbose": true});
    let v = rpc.request("tools/call", serde_json::json!({"name": "runtime_execute", "arguments": args}));
    v["result"]["structuredContent"].clone()
}

/// `exec` until its answer ran warm; that answer. The pool builds at a
/// low priority, which a busy host (a build beside the tests) may starve
/// for a while.
fn until_warm(mut exec: impl FnMut() -> serde_json::Value) -> serde_json::Value {
    for _ in 0..300 {
        let r = exec();
        if r["layers"]["warm"] == true {
            return r;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("no request ran warm");
}

#[test]
fn a_job_can_neither_see_nor_signal_a_warm_sandbox_beside_it() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let mut server = Served::start("warm = 2");
    server.exec_warm("true");
    let pid = server.pid();
    eventually("two warm sandboxes", Duration::from_secs(60), || stages_of(pid).len() == 2);
    let waiting = stages_of(pid);
    // Kill everything it may signal, and look for anything else.
    let attack = "kill -9 -1 2>/dev/null; echo \"procs=$(ls /proc | grep -E '^[0-9]+$' | wc -l)\"";
    let r = server.exec(attack);
    assert_eq!(r["layers"]["warm"], true, "the attack ran cold: {r}");
    // The one it ran in is gone with it; the other waits on, unharmed.
    let still: Vec<u32> = waiting.iter().copied().filter(|p| alive(*p)).collect();
    assert_eq!(still.len(), 1, "the waiting sandbox was harmed: {waiting:?} -> {still:?}");
    let next = server.exec("echo fine");
    assert_eq!(next["layers"]["warm"], true, "the sandbox left waiting no longer serves: {next}");
    assert_eq!(next["status"], "success", "{next}");
}

#[test]
fn a_warm_sandbox_that_waited_too_long_is_replaced() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    // Well over the 2 s a build may wait on busy CPUs (the suite's), so
    // that two can be alive at once.
    let mut server = Served::start("warm = 2\nwarm_max_idle_secs = 5");
    server.exec_warm("true");
    let pid = server.pid();
    eventually("two warm sandboxes", Duration::from_secs(60), || stages_of(pid).len() == 2);
    let old = stages_of(pid);
    eventually("the stale ones replaced", Duration::from_secs(60), || {
        let now = stages_of(pid);
        now.len() == 2 && now.iter().all(|p| !old.contains(p))
    });
    assert!(old.iter().all(|p| !alive(*p)), "a stale sandbox was left running: {old:?}");
    let r = server.exec("echo fresh");
    assert_eq!(r["layers"]["warm"], true, "{r}");
}

#[test]
fn a_killed_server_leaves_no_warm_sandbox_mount_or_cgroup() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    // Other tests' temporary mounts left out; the server's own directory
    // has none before it starts.
    let before = host_mounts(std::path::Path::new("/nonexistent/none"));
    let mut server = Served::start("");
    let mine = server._dir.path().to_path_buf();
    let mounts = || host_mounts(&mine);
    let pid = server.pid();
    server.exec_warm("true");
    eventually("the server's warm sandboxes", Duration::from_secs(60), || stages_of(pid).len() == 2);
    let stages = stages_of(pid);
    assert!(!common::rpc::job_cgroups(pid).is_empty(), "warm sandboxes have their cgroups made");
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let _ = server.rpc.child.wait();
    eventually("the warm sandboxes die with their server", Duration::from_secs(10), || {
        stages.iter().all(|p| !alive(*p))
    });
    assert_eq!(mounts(), before, "the host's mount table changed");
    let mut next = Served::serve(&server.config);
    let info = next.request("tools/call", serde_json::json!({"name": "info", "arguments": {}}));
    assert!(info["result"]["structuredContent"].is_object(), "{info}");
    eventually("the dead server's warm cgroups are swept", Duration::from_secs(10), || {
        common::rpc::job_cgroups(pid).is_empty()
    });
}

#[test]
fn a_server_builds_for_its_first_request_before_it_arrives() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let mut server = Served::start("");
    let pid = server.pid();
    eventually("warm sandboxes before any request", Duration::from_secs(60), || stages_of(pid).len() == 2);
    let r = server.exec("echo first");
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["layers"]["warm"], true, "the first request ran cold: {r}");
}

/// A warm sandbox's job is cloned while the base builds, at the build's
/// nice value; at the request pid 1 drops it if it is gone or was not
/// reniced (a debug build's stand-in: `CONFINE_TEST_REFUSE=early-job`),
/// and clones one for the request: it runs warm, locked, at nice 0, with
/// its namespace's counters capped.
#[test]
fn a_warm_job_missed_by_the_renice_is_cloned_again_for_its_request() {
    if !sandbox_available() || !is_root() {
        return;
    }
    if !test_hooks() {
        // Not a layer this host lacks: a release binary has no stand-in.
        eprintln!("a release confine ({}): no missed renice to stand in for", bin());
        return;
    }
    let _busy = not_busy();
    let mut server = Served::start_in("warm = 2", &["env", "CONFINE_TEST_REFUSE=early-job"]);
    let r = server.exec_warm(
        "echo nice=$(awk '{print $19}' /proc/self/stat); echo inotify=$(cat /proc/sys/user/max_inotify_instances)",
    );
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["layers"]["mountsLocked"], true, "{r}");
    let out = r["stdout"].as_str().unwrap_or_default();
    assert!(out.contains("nice=0") && out.contains("inotify=16"), "{out}");
}

/// Degraded mode (`runtime.allow_degraded`, which a kernel without
/// landlock needs) builds no sandbox before its request: each request
/// runs cold, and runs. (Which layers a degraded job really got is known
/// only once its sandbox is built: a warm one would be built blind.)
#[test]
fn a_degraded_server_builds_no_warm_sandbox_and_runs_its_jobs_cold() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let mut server = Served::start_degraded("warm = 2");
    let pid = server.pid();
    for _ in 0..3 {
        let r = server.exec("echo ran");
        assert_eq!(r["status"], "success", "{r}");
        assert_eq!(r["stdout"], "ran", "{r}");
        assert_eq!(r["layers"]["warm"], false, "{r}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(stages_of(pid), Vec::<u32>::new(), "a degraded server built a sandbox before its request");
}

/// Busy loops on every CPU the tests may run on (the affinity mask, as
/// the pool counts them), and one more; killed by pid when dropped, and
/// by the kernel if the test process dies first.
struct Spinners(Vec<std::process::Child>);

impl Spinners {
    fn start() -> Spinners {
        use std::os::unix::process::CommandExt;
        let mask = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let cpus = (0..nix::sched::CpuSet::count()).filter(|&i| mask.is_set(i).unwrap_or(false)).count();
        let spin = || {
            let mut cmd = std::process::Command::new("sh");
            cmd.arg("-c").arg("while :; do :; done");
            // SAFETY: prctl between fork and exec, with integers only.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            cmd.spawn().unwrap()
        };
        Spinners((0..=cpus).map(|_| spin()).collect())
    }
}

impl Drop for Spinners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Written by the tests that keep the CPUs busy, read by the other warm
/// tests: no warm test waits for a build beside the spinners.
static BUSY: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The other warm tests' share of [`BUSY`].
fn not_busy() -> std::sync::RwLockReadGuard<'static, ()> {
    BUSY.read().unwrap_or_else(|e| e.into_inner())
}

/// On a host whose CPUs are busy and whose mounts keep changing, the pool
/// does not rebuild at each change (each rebuilt sandbox would be dropped
/// at the next): it starts at most one build every 2 s. A sandbox a
/// request takes is still replaced at once.
#[test]
fn a_pool_on_busy_cpus_starts_at_most_one_build_every_two_seconds() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = BUSY.write().unwrap_or_else(|e| e.into_inner());
    let mut server = Served::start_apart("warm = 2");
    let pid = server.pid();
    let before = built_stages(pid);
    let dir = tempfile::tempdir().unwrap();
    let point = dir.path().join("churn");
    std::fs::create_dir(&point).unwrap();
    let spinners = Spinners::start();
    // The pool reads the host's idle time over spans of up to a second.
    std::thread::sleep(Duration::from_millis(1200));
    let mut seen = std::collections::BTreeSet::new();
    let start = std::time::Instant::now();
    let mut next_change = start;
    while start.elapsed() < Duration::from_secs(6) {
        if std::time::Instant::now() >= next_change {
            server.in_ns(&format!("mount -t tmpfs churn {p} && umount {p}", p = point.display()));
            next_change += Duration::from_millis(300);
        }
        seen.extend(stages_of(pid).into_iter().filter(|p| !before.contains(p)));
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = start.elapsed();
    drop(spinners);
    // One every 2 s, one begun at the start, one at the end.
    let most = (took.as_secs_f64() / 2.0).floor() as usize + 2;
    assert!(
        seen.len() <= most,
        "{} builds in {took:?} on busy CPUs with the host's mounts changing; at most {most} may",
        seen.len()
    );
    // Idle again: the pool fills, and a request runs warm.
    built_stages(pid);
    let r = server.exec_warm("true");
    assert_eq!(r["status"], "success", "{r}");
}

/// A sandbox a request took is replaced at once, busy CPUs or not: its
/// build is the one the request did not make.
#[test]
fn a_taken_sandbox_is_replaced_at_once_on_busy_cpus() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = BUSY.write().unwrap_or_else(|e| e.into_inner());
    let mut server = Served::start_apart("warm = 2");
    let pid = server.pid();
    built_stages(pid);
    let spinners = Spinners::start();
    std::thread::sleep(Duration::from_millis(1200));
    let (mut asked, mut warm) = (0u32, 0u32);
    for _ in 0..10 {
        let r = server.exec("true");
        assert_eq!(r["status"], "success", "{r}");
        asked += 1;
        warm += u32::from(r["layers"]["warm"] == true);
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(spinners);
    // A build the spinners slow may miss a request or two; a pool that
    // waited for idle CPU would have had one every 2 s (4 of 10).
    assert!(warm + 2 >= asked, "{warm} of {asked} requests ran warm on busy CPUs");
}

/// The pid 1 of each waiting warm stage (the stage's only child).
fn pid1s_of(stages: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    for s in stages {
        let children = std::fs::read_to_string(format!("/proc/{s}/task/{s}/children")).unwrap_or_default();
        out.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
    }
    out
}

fn sh(cmd: &str) {
    let st = std::process::Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(st.success(), "{cmd}");
}

/// Serve with `wrapper` (e.g. setpriv …) in front of confine.
fn serve_wrapped(config: &std::path::Path, wrapper: &[&str]) -> common::rpc::Rpc {
    let mut cmd = std::process::Command::new(wrapper[0]);
    cmd.args(&wrapper[1..]).arg(bin()).arg("--config").arg(config).arg("serve").env("CONFINE_LOG", "warn");
    common::rpc::Rpc::start(cmd, "warm-redteam")
}

/// RT-1. A warm sandbox waits before its pivot, in a private copy of the
/// host's whole mount table made when it was built: a host mount
/// removed since stays alive in it (its device busy), and a mask the
/// host put over a path under /etc since is not in the job's /etc. A
/// cold job's namespace is copied at its start.
#[test]
fn a_warm_job_sees_the_hosts_mounts_as_they_are_now() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let tag = format!("confine-redteam-{}", std::process::id());
    let pinned = std::path::PathBuf::from(format!("/mnt/{tag}"));
    let secret_dir = std::path::PathBuf::from(format!("/etc/{tag}"));
    std::fs::create_dir_all(&pinned).unwrap();
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("secret"), "SECRET\n").unwrap();
    std::fs::set_permissions(&secret_dir, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(secret_dir.join("secret"), std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    sh(&format!("mount -t tmpfs redteam-pinned {}", pinned.display()));

    let mut server = Served::start("warm = 2");
    server.exec_warm("true");
    let pid = server.pid();
    let stages = built_stages(pid);
    std::thread::sleep(Duration::from_millis(500));
    // The host removes one mount and masks a directory of /etc.
    sh(&format!("umount {}", pinned.display()));
    sh(&format!("mount -t tmpfs -o ro,size=4k redteam-mask {}", secret_dir.display()));
    // Replaced, soon: the pool watches the host's mount table.
    eventually("the waiting sandboxes replaced", Duration::from_secs(60), || {
        let now = stages_of(pid);
        now.len() == 2 && now.iter().all(|p| !stages.contains(p))
    });

    let pinned_in: Vec<u32> = pid1s_of(&stages)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap_or_default().contains(&tag))
        .collect();
    // Other tests mount and unmount on the host beside this one, and each
    // change replaces the waiting sandboxes again: ask until one runs
    // warm, and keep every answer's output (a cold one must not read the
    // secret either).
    let mut out = String::new();
    let mut warm = false;
    let mut r = serde_json::Value::Null;
    for _ in 0..300 {
        r = server.exec(&format!("cat /etc/{tag}/secret 2>/dev/null || echo masked"));
        out.push_str(r["stdout"].as_str().unwrap_or_default());
        if r["layers"]["warm"] == true {
            warm = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // Clean up before asserting.
    drop(server);
    let _ = std::process::Command::new("umount").arg(&secret_dir).status();
    let _ = std::fs::remove_dir_all(&secret_dir);
    // Unmounted by the test already, unless it failed before that.
    let _ = std::process::Command::new("umount").arg(&pinned).stderr(std::process::Stdio::null()).status();
    let _ = std::fs::remove_dir(&pinned);

    assert!(warm, "the probe ran cold: {r}");
    let mut wrong = Vec::new();
    if !pinned_in.is_empty() {
        wrong.push(format!(
            "waiting warm sandboxes (pid 1s {pinned_in:?}) still hold {}, which the host unmounted",
            pinned.display()
        ));
    }
    if out.contains("SECRET") {
        wrong.push(format!("a warm job read /etc/{tag}/secret, which the host had masked before the request"));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// RT-2. `alive()` looks at the outer stage only: a warm sandbox whose
/// pid 1 died while waiting (its base failed to build, the OOM killer,
/// a signal from the job's host uid) is handed to the next request,
/// which fails instead of starting cold.
#[test]
fn a_warm_sandbox_whose_pid1_died_is_not_taken() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let mut server = Served::start("warm = 2");
    server.exec_warm("true");
    let pid = server.pid();
    let stages = built_stages(pid);
    for p in pid1s_of(&stages) {
        // SAFETY: kill(2) of a pid we just read.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(300));
    let r = server.exec("echo ok");
    assert_eq!(r["status"], "success", "a request was given a dead warm sandbox: {r}");
}

/// RT-3. A root server without CAP_SYS_NICE (a hardened unit's
/// CapabilityBoundingSet, a container): the pool builds at nice 10,
/// which needs no privilege, but the outer stage can't lower pid 1 back
/// (its RLIMIT_NICE is 0), and every warm job fails where a cold one runs.
#[test]
fn warm_jobs_run_on_a_server_without_cap_sys_nice() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let repo = readable_repo(dir.path());
    let config = dir.path().join("confine.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[sandbox]\nwarm = 2\n\n\
             [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
            dir.path().join("store").display(),
            repo.display()
        ),
    )
    .unwrap();
    let mut rpc = serve_wrapped(&config, &["setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice"]);
    let cold = call(&mut rpc, "echo cold");
    assert_eq!(cold["status"], "success", "{cold}");
    let r = until_warm(|| call(&mut rpc, "echo hi"));
    assert_eq!(r["status"], "success", "a warm job failed where a cold one runs: {r}");
}

/// The host's mount table but for the mounts other tests make under
/// their own temporary directories meanwhile (those under `mine` stay).
fn host_mounts(mine: &std::path::Path) -> Vec<String> {
    let others = std::env::temp_dir().join(".tmp");
    let others = others.to_string_lossy();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| {
            let point = l.split(' ').nth(4).unwrap_or_default();
            !point.starts_with(&*others) || std::path::Path::new(point).starts_with(mine)
        })
        .map(str::to_string)
        .collect()
}

/// Unmounts what a test mounted on the host, however the test ends.
struct Unmount(Vec<std::path::PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::process::Command::new("umount").arg("-l").arg(p).stderr(std::process::Stdio::null()).status();
        }
    }
}

/// Checked sound: a warm job's read-write workspace and its protected
/// paths are private (nothing propagates to the host's mount table or
/// from it), with the flags a cold job's have.
#[test]
fn a_warm_workspace_is_private_with_the_cold_flags() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let repo = readable_repo(dir.path());
    sh(&format!("cd {} && git init -q . && mkdir -p .git/hooks", repo.display()));
    // An ordinary user's checkout: the job runs as its owner, nothing is
    // idmapped or swept, so the request can run warm.
    sh(&format!("chown -R 1000:65534 {}", repo.display()));
    let config = dir.path().join("confine.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[sandbox]\nwarm = WARM\nworkspace_rw = true\n\n\
             [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
            dir.path().join("store").display(),
            repo.display()
        ),
    )
    .unwrap();
    let mut server = ColdThenWarm::start(&config);
    let mut exec = |code: &str| server.exec(code);
    let host_before = host_mounts(dir.path());
    let probe = "awk '$5 ~ /^\\/workspace/ {print $5, $6, $7}' /proc/self/mountinfo | sort; \
                 touch /workspace/.git/hooks/x 2>/dev/null && echo hooks=writable || echo hooks=read-only; \
                 touch /workspace/y && echo ws=writable";
    let cold = exec(probe);
    assert_eq!(cold["layers"]["warm"], false);
    let hot = until_warm(|| exec(probe));
    let host_after = host_mounts(dir.path());
    eprintln!("cold:\n{}\nwarm:\n{}", cold["stdout"], hot["stdout"]);
    assert_eq!(host_before, host_after, "a warm job's mounts reached the host's mount table");
    // Mount ids differ; flags and propagation must not.
    let strip = |v: &serde_json::Value| {
        v["stdout"].as_str().unwrap_or_default().lines().map(|l| l.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(strip(&hot), strip(&cold));
    assert!(!hot["stdout"].as_str().unwrap_or_default().contains("shared:"), "{hot}");
    assert_eq!(hot["layers"]["protected"], cold["layers"]["protected"]);
}

/// Checked sound: a warm job's nice value and I/O priority are a cold
/// one's; a read-only workspace is read-only in a host mount below it
/// too; a host mount made under the workspace while the job runs does
/// not reach it.
#[test]
fn a_warm_job_has_the_cold_priority_and_a_sealed_workspace() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let repo = readable_repo(dir.path());
    std::fs::create_dir_all(repo.join("sub")).unwrap();
    std::fs::create_dir_all(repo.join("late")).unwrap();
    let _unmount = Unmount(vec![repo.join("late"), repo.join("sub")]);
    sh(&format!("mount -t tmpfs -o mode=1777 rt-sub {}", repo.join("sub").display()));
    let config = dir.path().join("confine.toml");
    std::fs::write(
        &config,
        format!(
            "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[sandbox]\nwarm = WARM\n\n\
             [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
            dir.path().join("store").display(),
            repo.display()
        ),
    )
    .unwrap();
    let mut server = ColdThenWarm::start(&config);
    let mut exec = |code: &str| server.exec(code);
    // The probe sleeps for a time no other process asks for, by which the
    // host sees that it runs: the host's mount comes after its sandbox
    // was built (however slow the machine), and before it looks.
    let nap = format!("1.{}", std::process::id());
    let probe = format!(
        "echo nice=$(awk '{{print $19}}' /proc/self/stat); \
         touch /workspace/sub/x 2>/dev/null && echo sub=writable || echo sub=read-only; \
         sleep {nap}; ls /workspace/late"
    );
    let probe = probe.as_str();
    let late = repo.join("late");
    let mount_late = move || {
        eventually("the probe to sleep", Duration::from_secs(60), || sleeping_for(&nap));
        sh(&format!("mount -t tmpfs rt-late {} && touch {}/appeared", late.display(), late.display()));
    };
    let t = std::thread::spawn(mount_late.clone());
    let cold = exec(probe);
    t.join().unwrap();
    sh(&format!("umount {}", repo.join("late").display()));
    assert_eq!(cold["layers"]["warm"], false);
    // Until the pool has learnt this shape.
    until_warm(|| exec("true"));
    // Until the probe itself runs warm: other tests' host mounts replace
    // the waiting sandboxes, and the suite's busy CPUs put their builds
    // off.
    let hot = until_warm(|| {
        let t = std::thread::spawn(mount_late.clone());
        let r = exec(probe);
        t.join().unwrap();
        sh(&format!("umount {}", repo.join("late").display()));
        // That umount replaced the waiting sandboxes, and on busy CPUs
        // their rebuild may wait 2 s: the next probe comes after it.
        if r["layers"]["warm"] != true {
            std::thread::sleep(Duration::from_millis(2500));
        }
        r
    });
    let _ = std::process::Command::new("umount").arg(repo.join("sub")).status();
    eprintln!("cold: {}\nwarm: {}", cold["stdout"], hot["stdout"]);
    assert_eq!(hot["layers"]["warm"], true, "{hot}");
    assert_eq!(hot["stdout"], cold["stdout"]);
    let out = hot["stdout"].as_str().unwrap_or_default();
    assert!(out.contains("nice=0") && out.contains("sub=read-only") && !out.contains("appeared"), "{out}");
}

/// Whether a process `sleep SECONDS` runs on the host (in any sandbox).
fn sleeping_for(seconds: &str) -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else { return false };
    dir.flatten()
        .any(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == format!("sleep\0{seconds}\0").as_bytes()))
}

/// A server on `config` (its `[sandbox] warm = WARM` filled in): first
/// without warm sandboxes, for one cold call (a server builds for its
/// first repository from its start), then, from the second call on, a
/// server on the same store with them.
struct ColdThenWarm {
    config: std::path::PathBuf,
    text: String,
    rpc: Option<common::rpc::Rpc>,
    cold_done: bool,
}

impl ColdThenWarm {
    fn start(config: &std::path::Path) -> ColdThenWarm {
        let text = std::fs::read_to_string(config).unwrap();
        std::fs::write(config, text.replace("warm = WARM", "warm = 0")).unwrap();
        let rpc = Some(Served::serve(config));
        ColdThenWarm { config: config.to_path_buf(), text, rpc, cold_done: false }
    }

    fn exec(&mut self, code: &str) -> serde_json::Value {
        let v = call(self.rpc.as_mut().unwrap(), code);
        if !self.cold_done {
            self.cold_done = true;
            // One server on a store at a time: the first is gone first.
            drop(self.rpc.take());
            std::fs::write(&self.config, self.text.replace("warm = WARM", "warm = 2")).unwrap();
            self.rpc = Some(Served::serve(&self.config));
        }
        v
    }
}

/// A repository mounted at its host path (`workspace_at = "host"`), in a
/// temporary directory: a warm sandbox lands it in its private /tmp and
/// idmaps it there, as a cold one does.
#[allow(clippy::await_holding_lock)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_at_its_host_path_runs_warm_where_it_is() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let _busy = not_busy();
    let dir = tempfile::tempdir().unwrap();
    let dir_path = std::fs::canonicalize(dir.path()).unwrap();
    confine::sandbox::linux::set_init_executable(bin().into());
    let repo = dir_path.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    std::fs::write(repo.join("hello.txt"), "hello from the workspace\n").unwrap();
    let text = format!(
        "[runtime]\nenabled = true\nmax_concurrent_jobs = 4\n\n[store]\npath = \"{}\"\n\n[[repos]]\nid = \"demo\"\n\
         root = \"{}\"\nworkspace_at = \"host\"\n",
        dir_path.join("store").display(),
        repo.display()
    );
    let config = Config::parse(&text, &dir_path.join("confine.toml")).unwrap();
    let sup = Supervisor::open(config).unwrap();
    let probe = "pwd; cat hello.txt";
    let cold = sup.execute(shell(probe), JobControl::default()).await;
    let hot = run_warm(&sup, probe).await;
    let expected = format!("{}\nhello from the workspace", repo.display());
    assert_eq!(stdout(&cold), expected, "{:?}", cold.error);
    assert_eq!(stdout(&hot), expected, "{:?}", hot.error);
    let idmapped = serde_json::to_value(&hot.outcome.unwrap().layers).unwrap()["idmapped"].clone();
    assert_eq!(idmapped, serde_json::json!([repo.display().to_string()]));
}
