//! `confine exec`s side by side on one store, with no server started by
//! hand: the first takes the store and serves its socket for as long as
//! anything runs; the others relay their requests to it, and their jobs
//! run at once (docs/design.md, "Parallel `confine exec`").

use crate::common;

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RUN_LIMIT: Duration = Duration::from_secs(60);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    repo: PathBuf,
}

fn fixture() -> Option<Fixture> {
    if !common::is_root() {
        common::skip("confine exec needs the sandbox (run as root)");
        return None;
    }
    if !common::sandbox_available() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let repo = common::readable_repo(&root);
    let config = root.join("confine.toml");
    std::fs::write(&config, common::exec_config(&root.join("store"), "t", &repo)).unwrap();
    Some(Fixture { _dir: dir, root, config, repo })
}

/// `confine exec` of `code` in `repo` (`--repo`, or `--repo-id t`), its
/// stdout and stderr piped.
fn spawn_exec(f: &Fixture, repo: Option<&Path>, code: &str) -> Child {
    spawn_exec_with(&f.config, repo, code)
}

/// [`spawn_exec`] with the configuration `config`.
fn spawn_exec_with(config: &Path, repo: Option<&Path>, code: &str) -> Child {
    let mut cmd = Command::new(common::bin());
    cmd.arg("--config").arg(config).arg("exec");
    match repo {
        Some(r) => cmd.arg("--repo").arg(r),
        None => cmd.args(["--repo-id", "t"]),
    };
    cmd.args(["--runtime", "shell", "--timeout", "30s", "--code", code])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `child`'s exit and what is left of its output (a stream taken
/// already reads as empty); past `limit` it is killed (by pid) and the
/// test fails.
fn finish(mut child: Child, limit: Duration) -> std::process::Output {
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|s| Box::new(s) as Box<dyn Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("confine exec did not end within {limit:?}: {}", String::from_utf8_lossy(&err.join().unwrap()));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    std::process::Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// Read `child`'s first line of output, which must be `started`, on a
/// thread: the line, when it comes, is sent to `tx`.
fn watch_started(i: usize, child: &mut Child, tx: std::sync::mpsc::Sender<usize>) -> std::thread::JoinHandle<String> {
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(out);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "started\n" {
            let _ = tx.send(i);
        }
        let mut rest = String::new();
        reader.read_to_string(&mut rest).unwrap();
        line + &rest
    })
}

/// A job that says it started, then waits for `/workspace/go`.
const WAIT_FOR_GO: &str = "echo started; while [ ! -e /workspace/go ]; do sleep 0.02; done; echo done";

/// The case: eight `confine exec`s started at once on one store
/// all succeed, and their jobs run at the same time. Each job waits for a
/// file the test makes only once all eight have started: one that ran
/// them one after another would never see the first one end, and fail
/// here on the deadline.
#[test]
fn eight_execs_on_one_store_run_at_once() {
    let Some(f) = fixture() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut children: Vec<Child> = (0..8).map(|_| spawn_exec(&f, None, WAIT_FOR_GO)).collect();
    let outputs: Vec<_> = children.iter_mut().enumerate().map(|(i, c)| watch_started(i, c, tx.clone())).collect();
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut started = std::collections::BTreeSet::new();
    while started.len() < 8 {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(i) => {
                started.insert(i);
            }
            Err(_) => break,
        }
    }
    // Let them all end, whatever happened, before asserting.
    std::fs::write(f.repo.join("go"), "").unwrap();
    let ended: Vec<_> = children.into_iter().map(|c| finish(c, RUN_LIMIT)).collect();
    assert_eq!(started.len(), 8, "only {started:?} of 8 jobs ran at once within 8 s: a queue?");
    for ((i, out), stdout) in ended.iter().enumerate().zip(outputs) {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "exec {i}: {err}");
        assert_eq!(stdout.join().unwrap(), "started\ndone\n", "exec {i}: {err}");
        assert!(err.contains("confine: success exit=0"), "exec {i}: {err}");
    }
    let verify = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&f.config).args(["audit", "verify"]),
        RUN_LIMIT,
    );
    assert!(common::stdout(&verify).contains("ok: 8 records, hash chain intact"), "{verify:?}");
}

/// The handover's race: short `confine exec`s in concurrent loops, so
/// that holders keep ending as others connect. None fails (never "in
/// use"), each gets its own output, and every job is in the trail.
#[test]
fn short_execs_in_concurrent_loops_never_find_the_store_in_use() {
    let Some(f) = fixture() else { return };
    const LOOPS: usize = 4;
    const EACH: usize = 6;
    let f = std::sync::Arc::new(f);
    let loops: Vec<_> = (0..LOOPS)
        .map(|l| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for i in 0..EACH {
                    let out = finish(spawn_exec(&f, None, &format!("echo {l}.{i}")), RUN_LIMIT);
                    let (stdout, stderr) = (common::stdout(&out), common::stderr(&out));
                    if !out.status.success() || stdout != format!("{l}.{i}\n") {
                        failures.push(format!("{l}.{i}: {:?} {stdout:?} {stderr}", out.status.code()));
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = loops.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(failures.is_empty(), "{failures:#?}");
    let verify = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&f.config).args(["audit", "verify"]),
        RUN_LIMIT,
    );
    let expected = format!("ok: {} records, hash chain intact", LOOPS * EACH);
    assert!(common::stdout(&verify).contains(&expected), "{verify:?}");
}

/// The holder's own job ends while one relayed to it runs: its answer
/// and output come then (its pipes end), and its exit status is its own,
/// given when the relayed job is done. The relayed job names another
/// repository (`--repo`), which a `confine exec` holding the store runs
/// as its client would have, under the client's own configuration (one
/// a `confine serve` would refuse). Store commands meanwhile are relayed
/// to the holder too.
#[test]
fn a_holder_answers_at_its_own_jobs_end_and_stays_for_a_relayed_one() {
    let Some(f) = fixture() else { return };
    let other = f.root.join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let other_config = f.root.join("other.toml");
    let text = std::fs::read_to_string(&f.config).unwrap().replace("enabled = true", "enabled = true\nmax_queued = 3");
    std::fs::write(&other_config, text).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut holder = spawn_exec(&f, None, "echo started; while [ ! -e /workspace/own ]; do sleep 0.02; done; exit 7");
    let holder_out = watch_started(0, &mut holder, tx.clone());
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0), "the holder's job never started");
    let mut client = spawn_exec_with(&other_config, Some(&other), WAIT_FOR_GO);
    let client_out = watch_started(1, &mut client, tx);
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(1), "the relayed job never started");
    let holder_pid = holder.id().to_string();
    assert_eq!(std::fs::read_to_string(f.root.join("store/LOCK")).unwrap().trim(), holder_pid);
    // The trail, read through the holder (no job has ended yet).
    let ls = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&f.config).args(["audit", "ls", "--json"]),
        RUN_LIMIT,
    );
    assert!(ls.status.success(), "{}", common::stderr(&ls));
    assert_eq!(common::stdout(&ls), "");

    // The holder's job ends: its output ends with it, its process stays.
    std::fs::write(f.repo.join("own"), "").unwrap();
    let mut holder_err = String::new();
    holder.stderr.take().unwrap().read_to_string(&mut holder_err).unwrap();
    assert_eq!(holder_out.join().unwrap(), "started\n");
    assert!(holder_err.contains("exit=7"), "{holder_err}");
    assert!(holder.try_wait().unwrap().is_none(), "the holder left while a job relayed to it ran");

    std::fs::write(other.join("go"), "").unwrap();
    let out = finish(client, RUN_LIMIT);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(client_out.join().unwrap(), "started\ndone\n");
    let status = finish(holder, Duration::from_secs(20)).status;
    assert_eq!(status.code(), Some(7));
    let ls = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&f.config).args(["audit", "ls", "--json"]),
        RUN_LIMIT,
    );
    assert_eq!(common::stdout(&ls).lines().count(), 2, "{}", common::stdout(&ls));
    assert!(!f.root.join("store/serve.sock").exists(), "the holder left its socket behind");
}

/// The race, made to happen: the holder's job is done and it has stopped
/// accepting, but still listens (a debug build lingers there), when a
/// newcomer connects. Its connection is closed unanswered; it tries again,
/// takes the store itself, and its job runs once.
#[test]
fn a_newcomer_to_a_holder_that_is_leaving_tries_again() {
    let Some(f) = fixture() else { return };
    let mut holder = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["exec", "--repo-id", "t", "--runtime", "shell", "--code", "echo own"])
        .env("CONFINE_TEST_LINGER_AT", "exec-holder-leaving:2000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its output ends when its job is done and it stops accepting (it
    // lets go of its output then, as it would for a relayed job): it is
    // lingering now, still listening.
    let mut own = String::new();
    holder.stdout.take().unwrap().read_to_string(&mut own).unwrap();
    assert_eq!(own, "own\n");
    assert!(f.root.join("store/serve.sock").exists(), "the holder stopped listening before it lingered");
    let started = Instant::now();
    let out = finish(spawn_exec(&f, None, "echo newcomer"), RUN_LIMIT);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert_eq!(common::stdout(&out), "newcomer\n");
    assert!(started.elapsed() >= Duration::from_millis(500), "the newcomer never met the leaving holder");
    let held = finish(holder, RUN_LIMIT);
    assert_eq!(held.status.code(), Some(0));
    assert!(common::stderr(&held).starts_with("confine: success exit=0"), "{}", common::stderr(&held));
    let ls = common::output_within(
        Command::new(common::bin()).arg("--config").arg(&f.config).args(["audit", "ls", "--json"]),
        RUN_LIMIT,
    );
    assert_eq!(common::stdout(&ls).lines().count(), 2, "{}", common::stdout(&ls));
}

/// A holder killed after it took a relayed request: the client says so at
/// once, and does not send the request again (its job may have run).
#[test]
fn a_holder_killed_after_it_took_a_request_is_reported_not_retried() {
    let Some(f) = fixture() else { return };
    let mut holder = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["exec", "--repo-id", "t", "--runtime", "shell", "--code", "echo started; exec sleep 30"])
        .env("CONFINE_TEST_CRASH_AT", "relayed-exec-taken:1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _own = watch_started(0, &mut holder, tx);
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0), "the holder's job never started");
    let started = Instant::now();
    let out = finish(spawn_exec(&f, None, "echo relayed"), RUN_LIMIT);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = common::stderr(&out);
    assert!(err.contains(&format!("(pid {}) closed the connection while it ran the command", holder.id())), "{err}");
    assert_eq!(common::stdout(&out), "");
    assert!(started.elapsed() < Duration::from_secs(5), "reported only after {:?}", started.elapsed());
    let status = finish(holder, RUN_LIMIT).status;
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
}

/// A `confine run` beside a `confine exec` holding the store runs in its
/// own process: the holder, whose job ends first, does not stay for it.
#[test]
fn a_run_beside_an_exec_holder_is_not_relayed_to_it() {
    let Some(f) = fixture() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut holder = spawn_exec(&f, None, WAIT_FOR_GO);
    let _own = watch_started(0, &mut holder, tx.clone());
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0), "the holder's job never started");
    let mut run = Command::new(common::bin())
        .arg("--config")
        .arg(&f.config)
        .args(["run", "--", "/bin/sh", "-c", "echo started; exec sleep 5"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run_out = watch_started(1, &mut run, tx);
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(1), "the run's job never started");
    std::fs::write(f.repo.join("go"), "").unwrap();
    let held = finish(holder, Duration::from_secs(4));
    assert!(held.status.success(), "{}", common::stderr(&held));
    assert!(run.try_wait().unwrap().is_none(), "the run ended before the holder: was it relayed?");
    assert!(finish(run, RUN_LIMIT).status.success());
    assert_eq!(run_out.join().unwrap(), "started\n");
}

/// `--workspace-at` travels with a relayed exec: the holder mounts the
/// newcomer's repository where the newcomer asked, as its own process
/// would have.
#[test]
fn a_relayed_exec_mounts_its_repository_where_it_asked() {
    let Some(f) = fixture() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut holder = spawn_exec(&f, None, "echo started; while [ ! -e /workspace/own ]; do sleep 0.02; done");
    let holder_out = watch_started(0, &mut holder, tx);
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0), "the holder's job never started");
    let out = common::output_within(
        Command::new(common::bin())
            .arg("--config")
            .arg(&f.config)
            .args(["exec", "--repo-id", "t", "--workspace-at", "/src/app", "--runtime", "shell", "--code", "pwd"])
            .stdin(Stdio::null()),
        RUN_LIMIT,
    );
    std::fs::write(f.repo.join("own"), "").unwrap();
    assert_eq!(common::stdout(&out), "/src/app\n", "{}", common::stderr(&out));
    assert!(finish(holder, RUN_LIMIT).status.success());
    assert_eq!(holder_out.join().unwrap(), "started\n");
}

/// The attack: a process of the holder's uid given fewer privileges (a
/// unit's no_new_privs, a smaller capability bounding set) relays its exec
/// to have the holder build a sandbox it could not build itself. Refused,
/// and nothing ran.
#[test]
fn a_client_with_fewer_privileges_than_the_holder_is_refused() {
    let Some(f) = fixture() else { return };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut holder = spawn_exec(&f, None, "echo started; while [ ! -e /workspace/own ]; do sleep 0.02; done");
    let holder_out = watch_started(0, &mut holder, tx);
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(0), "the holder's job never started");
    for drop in [&["--no-new-privs"][..], &["--bounding-set", "-sys_admin"][..]] {
        let out = common::output_within(
            Command::new("setpriv")
                .args(drop)
                .arg(common::bin())
                .arg("--config")
                .arg(&f.config)
                .args(["exec", "--repo-id", "t", "--runtime", "shell", "--code", "touch /workspace/ran"])
                .stdin(Stdio::null()),
            RUN_LIMIT,
        );
        assert_ne!(out.status.code(), Some(0), "{drop:?}");
        assert!(
            common::stderr(&out).contains("fewer privileges than the holder"),
            "{drop:?}: {}",
            common::stderr(&out)
        );
        assert!(!f.repo.join("ran").exists(), "{drop:?}: the job ran");
    }
    std::fs::write(f.repo.join("own"), "").unwrap();
    assert!(finish(holder, RUN_LIMIT).status.success());
    assert_eq!(holder_out.join().unwrap(), "started\n");
}
