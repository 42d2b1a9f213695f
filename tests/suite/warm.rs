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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_runs_warm_and_is_confined_as_a_cold_one() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), "");
    let probe = r#"
cat /workspace/hello.txt
echo "pwd=$(pwd)"
echo "init=$(cat /proc/1/comm)"
echo "ppid=$PPID"
grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status
echo "tmp=$(ls -A /tmp | tr '\n' ,)"
touch /workspace/x 2>/dev/null && echo "workspace=writable" || echo "workspace=read-only"
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
    // Every layer the cold job had, the warm one has.
    let (c, h) = (cold.outcome.unwrap().layers, hot.outcome.unwrap().layers);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_warm_jobs_share_no_tmp_shm_pid_or_namespace() {
    if !sandbox_available() || !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sup = supervisor(dir.path(), "");
    let probe = r#"
for f in /tmp/planted /dev/shm/planted; do [ -e $f ] && echo "found=$f"; done
echo planted > /tmp/planted; echo planted > /dev/shm/planted
for ns in pid mnt net ipc uts user cgroup; do echo "$ns=$(readlink /proc/self/ns/$ns)"; done
echo "pids=$(ls /proc | grep -E '^[0-9]+$' | tr '\n' ,)"
"#;
    let first = run_warm(&sup, probe).await;
    let second = run_warm(&sup, probe).await;
    let (a, b) = (stdout(&first), stdout(&second));
    assert!(!a.contains("found=") && !b.contains("found="), "a file outlived its job:\n{a}\n{b}");
    for ns in ["pid", "mnt", "net", "ipc", "uts", "user", "cgroup"] {
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
        let dir = tempfile::tempdir().unwrap();
        let repo = readable_repo(dir.path());
        let config = dir.path().join("confine.toml");
        std::fs::write(
            &config,
            format!(
                "[runtime]\nenabled = true\n\n[store]\npath = \"{}\"\n\n[sandbox]\n{extra}\n\n\
                 [[repos]]\nid = \"demo\"\nroot = \"{}\"\n",
                dir.path().join("store").display(),
                repo.display()
            ),
        )
        .unwrap();
        let rpc = Served::serve(&config);
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
        let args = serde_json::json!({"repoId": "demo", "runtime": "shell", "code": code, "verbose": true});
        let v = self.rpc.request("tools/call", serde_json::json!({"name": "runtime_execute", "arguments": args}));
        v["result"]["structuredContent"].clone()
    }

    /// Until one runs warm. The pool builds at a low priority, which a
    /// busy host (a build beside the tests) may starve for a while.
    fn exec_warm(&mut self, code: &str) -> serde_json::Value {
        for _ in 0..300 {
            let r = self.exec(code);
            if r["layers"]["warm"] == true {
                return r;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("no request ran warm");
    }
}

#[test]
fn a_job_can_neither_see_nor_signal_a_warm_sandbox_beside_it() {
    if !sandbox_available() || !is_root() {
        return;
    }
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
    let mut server = Served::start("warm = 2\nwarm_max_idle_secs = 1");
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
    let mounts = || std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let before = mounts();
    let mut server = Served::start("");
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
    let mut server = Served::start("");
    let pid = server.pid();
    eventually("warm sandboxes before any request", Duration::from_secs(60), || stages_of(pid).len() == 2);
    let r = server.exec("echo first");
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["layers"]["warm"], true, "the first request ran cold: {r}");
}
