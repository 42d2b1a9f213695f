//! Signals and crashes, with the built binary: what a user sends confine
//! reaches the job (and does not kill confine), Ctrl-Z stops the job and
//! confine, no stop of confine suspends the job's timeout, `exec`
//! cancelled with Ctrl-C exits 130, and the `--json-status` file is never
//! stale, never partial and never written through a planted link.

use crate::common::{self, *};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn ready() -> bool {
    if !is_root() {
        skip("the sandbox's cgroups need root here");
        return false;
    }
    sandbox_available()
}

fn kill(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child's pid, which we have not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0, "signal {sig}");
}

/// The child's end, within 10 s (else it is killed, and the test fails).
fn wait(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > Duration::from_secs(10) * slow() {
            let _ = child.kill();
            let _ = child.wait();
            panic!("confine did not end");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `/proc/PID/stat`'s state letter (R, S, T, Z…), None once it is gone.
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout * slow(), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Host pids of `sleep MARKER` (the job's, found from outside).
fn sleepers(marker: &str) -> Vec<u32> {
    host_pids_with(marker)
        .into_iter()
        .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep"))
        .collect()
}

fn marker(n: u32) -> String {
    format!("{}.{}", 3000 + n, std::process::id())
}

/// `confine run ARGS…` with stdout piped and read line by line.
fn spawn_run(args: &[&str]) -> (Child, BufReader<std::process::ChildStdout>) {
    let mut child = confine()
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

fn line(out: &mut BufReader<std::process::ChildStdout>) -> String {
    let mut l = String::new();
    out.read_line(&mut l).unwrap();
    l
}

/// USR1 and USR2 sent to confine reach the job, whose traps print; confine
/// keeps running (USR1 used to kill it, rc 138) and exits with the job's code.
/// So do QUIT, ALRM, WINCH and a real-time signal, each but the last trapped.
#[test]
fn user_signals_reach_the_job_and_confine_keeps_running() {
    if !ready() {
        return;
    }
    let script = "for s in USR1 QUIT ALRM WINCH; do trap \"echo got $s\" $s; done; \
                  trap 'echo got USR2; exit 7' USR2; echo ready; while :; do sleep 0.02; done";
    let (mut child, mut out) = spawn_run(&["--", "sh", "-c", script]);
    assert_eq!(line(&mut out), "ready\n");
    for (sig, name) in
        [(libc::SIGUSR1, "USR1"), (libc::SIGQUIT, "QUIT"), (libc::SIGALRM, "ALRM"), (libc::SIGWINCH, "WINCH")]
    {
        kill(&child, sig);
        assert_eq!(line(&mut out), format!("got {name}\n"));
        assert!(child.try_wait().unwrap().is_none(), "confine ended on SIG{name}");
    }
    kill(&child, libc::SIGUSR2);
    assert_eq!(line(&mut out), "got USR2\n");
    let status = wait(&mut child);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(7), "{err}");
}

/// A real-time signal the job does not catch ends it, as it would bare:
/// the job's status is 128+N, and confine's.
#[test]
fn an_uncaught_signal_ends_the_job_not_confine() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let (mut child, mut out) =
        spawn_run(&["--json-status", json.to_str().unwrap(), "--", "sh", "-c", "echo ready; exec sleep 30"]);
    assert_eq!(line(&mut out), "ready\n");
    let rt = libc::SIGRTMIN() + 3;
    kill(&child, rt);
    let status = wait(&mut child);
    assert_eq!(status.code(), Some(128 + rt));
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(o["signal"], rt, "{o}");
    assert_eq!(o["status"], "killed", "{o}");
}

/// SIGSTOP of confine for longer than --timeout: the job (which ignores
/// SIGTERM) is still killed at its deadline and grace, by the init stage,
/// while confine is stopped; confine, continued, says `timeout` (124).
#[test]
fn a_stopped_confine_does_not_suspend_the_timeout() {
    if !ready() {
        return;
    }
    let m = marker(1);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let script = format!("trap '' TERM; echo ready; sleep {m}");
    let (mut child, mut out) = spawn_run(&[
        "--timeout",
        "600ms",
        "--kill-grace",
        "200ms",
        "--json-status",
        json.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(line(&mut out), "ready\n");
    kill(&child, libc::SIGSTOP);
    let stopped = Instant::now();
    wait_until("the job's sleep", Duration::from_secs(2), || !sleepers(&m).is_empty());
    wait_until("the timeout's kill", Duration::from_secs(3), || sleepers(&m).is_empty());
    assert_eq!(state(child.id()), Some('T'), "confine was continued before the job was killed");
    assert!(stopped.elapsed() < Duration::from_millis(2500) * slow(), "{:?}", stopped.elapsed());
    kill(&child, libc::SIGCONT);
    let status = wait(&mut child);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(err.contains("timed out after 600ms"), "{err}");
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(o["status"], "timeout", "{o}");
}

/// Ctrl-Z (SIGTSTP) stops the job's processes and then confine, as a
/// foreground program stops; SIGCONT (`fg`) continues both, and the job
/// ends as it would have.
#[test]
fn ctrl_z_stops_the_job_and_confine_and_fg_continues_them() {
    if !ready() {
        return;
    }
    let m = marker(2);
    let script = format!("echo ready; sleep {m} & wait; echo done");
    let (mut child, mut out) = spawn_run(&["--", "sh", "-c", &script]);
    assert_eq!(line(&mut out), "ready\n");
    wait_until("the job's sleep", Duration::from_secs(2), || !sleepers(&m).is_empty());
    kill(&child, libc::SIGTSTP);
    wait_until("confine to stop", Duration::from_secs(2), || state(child.id()) == Some('T'));
    let sleeper = sleepers(&m)[0];
    wait_until("the job's sleep to stop", Duration::from_secs(2), || state(sleeper) == Some('T'));
    kill(&child, libc::SIGCONT);
    wait_until("the job's sleep to continue", Duration::from_secs(2), || state(sleeper) != Some('T'));
    // The sleep is one that can end: it is told to, as a user would.
    // SAFETY: kill(2) on a pid just seen as the job's sleep.
    unsafe { libc::kill(sleeper as i32, libc::SIGTERM) };
    assert_eq!(line(&mut out), "done\n");
    assert_eq!(wait(&mut child).code(), Some(0));
}

/// A status file an earlier run left is removed when the next starts, so
/// that a confine killed (SIGKILL) leaves none behind that passes for its
/// own; the killed run's job tree dies with it.
#[test]
fn a_stale_status_file_is_removed_at_start() {
    if !ready() {
        return;
    }
    let m = marker(3);
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    std::fs::write(&json, "{\"status\":\"success\"}").unwrap();
    let script = format!("echo ready; sleep {m}");
    let (mut child, mut out) = spawn_run(&["--json-status", json.to_str().unwrap(), "--", "sh", "-c", &script]);
    assert_eq!(line(&mut out), "ready\n");
    assert!(!json.exists(), "the earlier run's status is still there while this one runs");
    child.kill().unwrap();
    wait(&mut child);
    wait_until("the killed run's job to die", Duration::from_secs(2), || sleepers(&m).is_empty());
    assert!(!json.exists());
}

/// A status file name that can't be removed (a directory) is refused
/// before anything runs.
#[test]
fn a_status_file_name_that_is_a_directory_is_refused_up_front() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    std::fs::create_dir(&json).unwrap();
    let out_dir = dir.path().join("out");
    std::fs::create_dir(&out_dir).unwrap();
    let bind = format!("{}:/out", out_dir.display());
    let out = confine()
        .args(["run", "--json-status", json.to_str().unwrap(), "--bind", &bind, "--", "touch", "/out/ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot write --json-status"), "{}", stderr(&out));
    assert!(json.is_dir());
    assert!(!out_dir.join("ran").exists(), "the job ran");
}

/// A symlink planted at the status file's name (in a directory others may
/// write) is replaced, never followed: its target keeps its content.
#[test]
fn a_symlink_at_the_status_files_name_is_not_followed() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let json = dir.path().join("s.json");
    std::os::unix::fs::symlink(&victim, &json).unwrap();
    let out = confine().args(["run", "--json-status", json.to_str().unwrap(), "--", "true"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert!(std::fs::symlink_metadata(&json).unwrap().file_type().is_file());
    let o: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(o["status"], "success");
}

/// The status file appears whole: read as fast as can be while runs
/// write it, it is never there in part.
#[test]
fn the_status_file_is_never_seen_partial() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("s.json");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (json, stop) = (json.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                if let Ok(bytes) = std::fs::read(&json) {
                    let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&bytes);
                    assert!(parsed.is_ok(), "a partial status file: {:?}", String::from_utf8_lossy(&bytes));
                    seen += 1;
                }
            }
            seen
        })
    };
    for _ in 0..3 {
        let out = confine().args(["run", "--json-status", json.to_str().unwrap(), "--", "true"]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(reader.join().unwrap() > 0, "the reader never saw the file");
}

/// `confine exec` (no server) cancelled with Ctrl-C exits 130, as a
/// program Ctrl-C ends does (137 means the memory limit), and prints its
/// summary line `cancelled`.
#[test]
fn exec_cancelled_with_ctrl_c_exits_130() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = common::readable_repo(dir.path());
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, exec_config(&dir.path().join("store"), "t", &repo)).unwrap();
    let mut child = exec_child(&config);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert_eq!(first, "started\n");
    kill(&child, libc::SIGINT);
    let status = wait(&mut child);
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.lines().last().unwrap_or_default().starts_with("confine: cancelled"), "{err}");
}

fn exec_child(config: &Path) -> Child {
    Command::new(bin())
        .arg("--config")
        .arg(config)
        .args(["exec", "--repo-id", "t", "--runtime", "shell", "--timeout", "50s", "--code"])
        .arg("echo started; exec sleep 100")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `confine run --tty` started in a background process group of a
/// terminal (a job-control shell's `&`) never stops on SIGTTOU: it leaves
/// the terminal's mode alone (it is not its to change) and runs its job to
/// the end.
#[test]
fn a_tty_run_in_a_background_group_does_not_stop_on_sigttou() {
    use std::os::unix::process::CommandExt;
    if !ready() {
        return;
    }
    let pty = nix::pty::openpty(None, None).unwrap();
    let before = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    let script = format!("set -m; {} run --tty -- echo inside & wait $!; echo rc=$?", bin());
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    cmd.stdin(pty.slave.try_clone().unwrap()).stdout(pty.slave.try_clone().unwrap());
    cmd.stderr(pty.slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl(TIOCSCTTY) are async-signal-safe, and take
    // no pointers: the shell leads a session whose terminal is the pty.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    // Its copies of the terminal: the master reads EIO once the last goes.
    drop(cmd);
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // EIO once no process holds the terminal any more.
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = wait(&mut child);
    let after = nix::sys::termios::tcgetattr(&pty.slave).unwrap();
    drop(pty.slave);
    let out = reader.join().unwrap();
    assert!(status.success(), "{out}");
    assert!(out.contains("inside"), "{out}");
    assert!(out.contains("rc=0"), "{out}");
    assert_eq!(before.local_flags, after.local_flags, "the terminal's mode was changed");
}
