//! Ptys inside a job: every job has a devpts instance of its own, so that
//! `openpty` and `pty.fork` work as they do bare (pexpect-style suites, in
//! CI without a terminal too), with `--tty` as without; the host's ptys
//! stay out of reach, a job holds a bounded number of them, and changing a
//! terminal's line discipline (which may load a kernel module) is refused.

use crate::common;
use common::*;
use std::collections::BTreeMap;
use std::process::{Command, Output, Stdio};

/// What a job's Python reports about its ptys, one `key value` a line.
const PROBE: &str = r#"
import os, pty, sys, fcntl, struct, errno
m, s = os.openpty()
print("openpty", os.ttyname(s))
sys.stdout.flush()
pid, fd = pty.fork()
if pid == 0:
    print("forked", os.ttyname(0), os.isatty(1))
    sys.stdout.flush()
    os._exit(0)
got = b""
while True:
    try:
        d = os.read(fd, 1024)
    except OSError:
        break
    if not d:
        break
    got += d
os.waitpid(pid, 0)
print("child", got.decode().strip().replace(" ", "_"))
try:
    fcntl.ioctl(s, 0x5423, struct.pack("i", 0))  # TIOCSETD, to N_TTY
    print("tiocsetd ok")
except OSError as e:
    print("tiocsetd", errno.errorcode[e.errno])
print("pts", ",".join(sorted(os.listdir("/dev/pts"))))
print("ptmx", os.readlink("/dev/ptmx"))
print("pts_dev", os.stat("/dev/pts").st_dev)
try:
    open("/dev/tty", "rb")
    print("dev_tty ok")
except OSError as e:
    print("dev_tty", errno.errorcode[e.errno])
os.close(fd)
held = []
while True:
    try:
        held.append(os.openpty())
    except OSError as e:
        print("more_ptys", len(held), errno.errorcode[e.errno])
        break
"#;

fn python3() -> bool {
    if Command::new("python3").args(["-c", "0"]).status().is_ok_and(|s| s.success()) {
        return true;
    }
    skip("python3 is not installed");
    false
}

fn answers(out: &Output) -> BTreeMap<String, String> {
    assert!(out.status.success(), "{}{}", stdout(out), stderr(out));
    stdout(out)
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn probe(flags: &[&str], stdin: Stdio) -> BTreeMap<String, String> {
    let out = confine()
        .arg("run")
        .args(flags)
        .args(["--", "python3", "-c", PROBE])
        .stdin(stdin)
        .output()
        .expect("start confine");
    answers(&out)
}

fn want(r: &BTreeMap<String, String>, key: &str, value: &str) {
    assert_eq!(r.get(key).map(String::as_str), Some(value), "{key}; all answers: {r:?}");
}

/// The st_dev of the host's /dev/pts, with a pty of the host's open there
/// for as long as the returned fds live.
fn host_pty() -> (u64, nix::pty::OpenptyResult) {
    use std::os::unix::fs::MetadataExt;
    let pty = nix::pty::openpty(None, None).expect("openpty on the host");
    (std::fs::metadata("/dev/pts").expect("the host's /dev/pts").dev(), pty)
}

#[test]
fn openpty_and_pty_fork_work_in_a_private_devpts_with_and_without_tty() {
    if !sandbox_available() || !python3() {
        return;
    }
    let (host_dev, _host_pty) = host_pty();
    for flags in [&[][..], &["--tty"][..]] {
        let r = probe(flags, Stdio::null());
        want(&r, "openpty", "/dev/pts/0");
        want(&r, "child", "forked_/dev/pts/1_True");
        want(&r, "ptmx", "pts/ptmx");
        // Only the job's own: the host's pty (open now) is not there.
        want(&r, "pts", "0,1,ptmx");
        assert_ne!(r.get("pts_dev").map(String::as_str), Some(host_dev.to_string().as_str()), "{flags:?}: {r:?}");
        // Refused by the filter (the kernel allows it on one's own pty:
        // `tiocsetd_is_the_filters_refusal`).
        want(&r, "tiocsetd", "EPERM");
        // Without --tty the job's session has no terminal; with it, the
        // relayed pty is its controlling terminal.
        want(&r, "dev_tty", if flags.is_empty() { "ENXIO" } else { "ok" });
    }
}

#[test]
fn a_job_holds_a_bounded_number_of_ptys() {
    if !sandbox_available() || !python3() {
        return;
    }
    let r = probe(&[], Stdio::null());
    // Of the 16, the openpty pair holds one; pty.fork's, closed just
    // before, may not be free yet (the kernel frees a pty from a work
    // queue).
    let (n, why) = r.get("more_ptys").and_then(|v| v.split_once(' ')).expect("more_ptys");
    assert_eq!(why, "ENOSPC", "{r:?}");
    let n: u32 = n.parse().unwrap();
    assert!((14..=15).contains(&n), "{n} more ptys than the one or two held: {r:?}");
}

#[test]
fn tiocsetd_is_the_filters_refusal() {
    if !sandbox_available() || !python3() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let allow_all = dir.path().join("allow-all.json");
    std::fs::write(&allow_all, r#"{"defaultAction": "SCMP_ACT_ALLOW"}"#).unwrap();
    // N_TTY, the discipline the pty already has: no module is loaded.
    let r = probe(&["--seccomp", allow_all.to_str().unwrap()], Stdio::null());
    want(&r, "tiocsetd", "ok");
}
