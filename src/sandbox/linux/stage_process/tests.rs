use super::*;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;

fn sh(script: &str, stdio: StdioSpec, fds: &[(RawFd, RawFd)]) -> StageProcess {
    let script = CString::new(script).unwrap();
    spawn(Path::new("/bin/sh"), &[c"sh", c"-c", &script], &[c"PATH=/usr/bin:/bin"], stdio, fds).unwrap()
}

fn read_all(fd: OwnedFd) -> String {
    let mut s = String::new();
    std::fs::File::from(fd).read_to_string(&mut s).unwrap();
    s
}

/// Each source lands at its target even when sources sit at each
/// other's targets, and neither the copies spawn makes of them nor our
/// ends of the pipes reach the child. (Checked by what each fd is, not
/// by number: other tests of this process may hold fds without
/// close-on-exec for a moment, and any spawn then passes those on.)
#[tokio::test]
async fn fds_land_at_their_targets_and_no_copy_leaks() {
    let memfd = |name: &str| {
        let name = CString::new(format!("confine-spawn-test-{name}-{}", std::process::id())).unwrap();
        nix::sys::memfd::memfd_create(name.as_c_str(), nix::sys::memfd::MFdFlags::MFD_CLOEXEC).unwrap()
    };
    let (a, b) = (memfd("a"), memfd("b"));
    std::fs::File::from(a.try_clone().unwrap()).write_all_at(b"A", 0).unwrap();
    std::fs::File::from(b.try_clone().unwrap()).write_all_at(b"B", 0).unwrap();
    // Crossed: a goes where b's number is, b where a's is.
    let (na, nb) = (a.as_raw_fd(), b.as_raw_fd());
    let stdio = StdioSpec { stdin: StdioTarget::Piped, stdout: StdioTarget::Piped, stderr: StdioTarget::Null };
    let script = format!("read go; printf %s \"$(cat /proc/self/fd/{nb})$(cat /proc/self/fd/{na})\"");
    let mut child = sh(&script, stdio, &[(na, nb), (nb, na)]);
    // The child's fds and what each is, seen from here while it waits
    // for its line (posix_spawn returns once the child has made its execve).
    let dir = format!("/proc/{}/fd", child.id().unwrap());
    let fds: Vec<(i32, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let target = std::fs::read_link(e.path()).ok()?;
            Some((e.file_name().to_str().unwrap().parse().unwrap(), target.to_string_lossy().into_owned()))
        })
        .collect();
    std::fs::File::from(child.stdin.take().unwrap()).write_all(b"go\n").unwrap();
    let data = read_all(child.stdout.take().unwrap());
    assert_eq!(data, "AB", "fd {nb} must be a's copy and fd {na} b's");
    let at = |n: i32| fds.iter().find(|(fd, _)| *fd == n).map(|(_, t)| t.clone()).unwrap_or_default();
    let holding = |what: &str| fds.iter().filter(|(_, t)| t.as_str() == what).map(|(fd, _)| *fd).collect::<Vec<_>>();
    for (want_at, name) in [(nb, "a"), (na, "b")] {
        let link = format!("/memfd:confine-spawn-test-{name}-{} (deleted)", std::process::id());
        assert_eq!(holding(&link), vec![want_at], "memfd {name} in the child: {fds:?}");
    }
    // Each pipe's inode is held by the child's end only: our end and
    // the placed copies stayed here.
    for stream in [0, 1] {
        let pipe = at(stream);
        assert!(pipe.starts_with("pipe:"), "fd {stream} is not a pipe: {fds:?}");
        assert_eq!(holding(&pipe), vec![stream], "pipe of fd {stream} in the child: {fds:?}");
    }
    assert!(child.wait().await.unwrap().success());
    assert_eq!(child.id(), None, "a reaped child has no pid to signal");
}

/// A piped stdin is the child's fd 0, and SIGPIPE is at its default
/// in the child though this process ignores it (as Rust programs do).
#[tokio::test]
async fn stdin_is_piped_and_sigpipe_kills() {
    let stdio = StdioSpec { stdin: StdioTarget::Piped, stdout: StdioTarget::Piped, stderr: StdioTarget::Null };
    let mut child = sh("read line; echo \"got $line\"; grep SigIgn /proc/self/status", stdio, &[]);
    std::fs::File::from(child.stdin.take().unwrap()).write_all(b"hello\n").unwrap();
    let out = read_all(child.stdout.take().unwrap());
    assert!(out.starts_with("got hello\n"), "{out}");
    let ignored = u64::from_str_radix(out.rsplit('\t').next().unwrap().trim(), 16).unwrap();
    assert_eq!(ignored & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE ignored in the child: {out}");
    assert!(child.wait().await.unwrap().success());
}

/// Dropped while it runs, the child is killed and reaped (no zombie).
#[tokio::test]
async fn a_dropped_child_is_killed_and_reaped() {
    let child = sh("exec sleep 1000", StdioSpec::null(), &[]);
    let pid = child.id().unwrap();
    drop(child);
    for _ in 0..250 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    panic!("pid {pid} still there 5 s after its drop: {stat}");
}

/// kill() kills and reaps: the status says SIGKILL.
#[tokio::test]
async fn kill_reports_the_signal() {
    let mut child = sh("exec sleep 1000", StdioSpec::null(), &[]);
    child.kill().await.unwrap();
    assert_eq!(child.wait().await.unwrap().signal(), Some(libc::SIGKILL));
}

/// A missing program is an error from spawn, not a child that fails.
#[test]
fn a_missing_program_is_an_error() {
    let e = spawn(Path::new("/nonexistent/confine"), &[c"x"], &[], StdioSpec::null(), &[]).err();
    assert_eq!(e.map(|e| e.kind()), Some(io::ErrorKind::NotFound));
}
