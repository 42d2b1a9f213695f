//! A one-shot supervisor (`confine exec`'s) builds its request's sandbox
//! before the policy decides. In a test binary of its own: it counts the
//! job cgroups of this process, which other tests running beside it
//! would add to.

use crate::common;
use common::*;
use confine::config::Config;
use confine::supervisor::exec::{JobControl, JobRequest};
use confine::supervisor::Supervisor;

/// Ticks since boot now, in the unit of `/proc/<pid>/stat`'s start time.
fn ticks_since_boot() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = uptime.split_whitespace().next().unwrap().parse().unwrap();
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (secs * hz) as u64
}

/// A shell request in repo `demo`, its output rendered as a summary.
fn shell_request(code: String) -> JobRequest {
    JobRequest {
        code: Some(code),
        render: confine::output::RenderOptions {
            output_mode: confine::output::OutputMode::Summary,
            ..Default::default()
        },
        repo_id: Some("demo".into()),
        runtime: "shell".into(),
        ..JobRequest::default()
    }
}

/// A one-shot supervisor (`open_one_shot`) builds its first request's
/// sandbox before the policy has decided, the job held before its execve.
/// The job then runs in that sandbox when the request is executed as
/// given; any other request (other code, other streams, limits the policy
/// lowered) gets a fresh sandbox, and a denied one leaves nothing behind.
///
/// Which sandbox ran is told by the job itself: it prints when its pid 1
/// started. The test waits 300 ms between opening the supervisor and
/// executing the request, so a sandbox built early started before that
/// wait, and a fresh one after it.
#[tokio::test(flavor = "current_thread")]
async fn a_one_shot_supervisor_runs_its_first_request_in_the_sandbox_built_early() {
    if !sandbox_available() {
        return;
    }
    let (dir, repo) = scratch_repo();
    // Lowers the memory limit of every request: the sandbox built before
    // the decision has the configured one.
    let clamp = dir.path().join("clamp.rego");
    std::fs::write(&clamp, "package confine\n\ndefault allow := true\n\nlimits := {\"memoryBytes\": 268435456}\n")
        .unwrap();
    // A store each: sled lets go of its lock a moment after a drop.
    let config = |n: usize, extra: &str| {
        let text = exec_config(&dir.path().join(format!("store-{n}")), "demo", &repo) + extra;
        Config::parse(&text, &dir.path().join("confine.toml")).unwrap()
    };
    let clamping = format!("\n[[policy.evaluators]]\npath = \"{}\"\n", clamp.display());
    let req = |code: &str, stdin: Option<&str>| JobRequest {
        stdin: stdin.map(str::to_string),
        // The start of the sandbox's pid 1, in ticks since boot, last.
        ..shell_request(format!("{code}; set -- $(cat /proc/1/stat); echo ${{22}}"))
    };
    let cases = [
        // (what the supervisor was opened for, what it executes, its policy, expected stdout, built early)
        (req("echo same", None), req("echo same", None), "", "same", true),
        (req("cat", Some("fed\n")), req("cat", Some("fed\n")), "", "fed", true),
        (req("echo first", None), req("echo other", None), "", "other", false),
        (req("cat; echo no input", None), req("cat; echo no input", Some("fed\n")), "", "fed\nno input", false),
        (req("echo clamped", None), req("echo clamped", None), clamping.as_str(), "clamped", false),
    ];
    for (n, (first, executed, extra, want, early)) in cases.into_iter().enumerate() {
        let sup = Supervisor::open_one_shot(config(n, extra), Some(&first)).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let before = ticks_since_boot();
        let resp = sup.execute(executed, JobControl::default()).await;
        sup.discard_prestarted();
        assert_eq!(serde_json::to_value(resp.status).unwrap(), "success", "case {n}: {:?}", resp.error);
        let stdout = resp
            .output
            .as_ref()
            .and_then(|v| v.stdout.clone().or_else(|| v.stdout_summary.clone()))
            .unwrap_or_default();
        let (shown, started) = stdout.rsplit_once('\n').unwrap();
        assert_eq!(shown, want, "case {n}");
        let started: u64 = started.trim().parse().unwrap();
        assert_eq!(started < before, early, "case {n}: pid 1 started at {started}, the request came at {before}");
        if !extra.is_empty() {
            let limits = &resp.outcome.as_ref().unwrap().limits;
            assert_eq!(limits.memory_bytes, Some(268435456), "case {n}: the policy's limit");
        }
    }
    // Denied: the sandbox built early is killed unreleased, and the
    // request is audited as any other.
    let pid = std::process::id().to_string();
    let first = JobRequest { network: confine::job::Network::Host, ..req("echo out", None) };
    let sup = Supervisor::open_one_shot(config(10, ""), Some(&first)).await.unwrap();
    let ours = |name: &str| name.split('.').nth(1) == Some(pid.as_str());
    assert!(!cgroup_dirs(&ours).is_empty(), "no sandbox was built before the decision");
    let denied = sup.execute(first, JobControl::default()).await;
    assert_eq!(serde_json::to_value(denied.status).unwrap(), "denied", "{:?}", denied.error);
    assert_eq!(sup.stores().unwrap().audit.len(), 1);
    sup.discard_prestarted();
    let left = cgroup_dirs(&ours);
    assert!(left.is_empty(), "the denied request's sandbox left cgroups behind: {left:?}");
}

/// The limits of a sandbox built before the decision are written while
/// the stage builds it, after its spec: they must be in place before the
/// job is released. A job over its memory limit in such a sandbox ends
/// `oom`.
#[tokio::test(flavor = "current_thread")]
async fn a_sandbox_built_early_holds_its_job_to_its_limits() {
    if !sandbox_available() {
        return;
    }
    let (dir, repo) = scratch_repo();
    let text = exec_config(&dir.path().join("store"), "demo", &repo);
    let config = Config::parse(&text, &dir.path().join("confine.toml")).unwrap();
    let req = JobRequest {
        memory_bytes: Some(64 << 20),
        // The start of the sandbox's pid 1 first, then the job becomes a
        // process that touches 256 MiB.
        ..shell_request(
            "set -- $(cat /proc/1/stat); echo ${22}; exec python3 -c 'b = bytearray(256 << 20); print(\"survived\")'"
                .into(),
        )
    };
    let sup = Supervisor::open_one_shot(config, Some(&req)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let before = ticks_since_boot();
    let resp = sup.execute(req, JobControl::default()).await;
    let stdout =
        resp.output.as_ref().and_then(|v| v.stdout.clone().or_else(|| v.stdout_summary.clone())).unwrap_or_default();
    let limits = resp.outcome.as_ref().map(|o| o.limits.clone());
    assert_eq!(serde_json::to_value(resp.status).unwrap(), "oom", "{stdout} {:?} {limits:?}", resp.error);
    assert!(!stdout.contains("survived"), "{stdout}");
    let started: u64 = stdout.lines().next().unwrap_or_default().trim().parse().unwrap();
    assert!(started < before, "the sandbox was not the one built before the decision");
}
