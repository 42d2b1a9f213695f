//! Landlock and the filesystem: attempts from inside the sandbox that must
//! fail, each for the reason a user would check.

use crate::common;
use common::*;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;

#[test]
fn landlock_blocks_writes_the_mounts_would_allow() {
    if !sandbox_available() {
        return;
    }
    // /dev is a writable tmpfs owned by the sandbox; only landlock stops this.
    let out = run(&["--", "/bin/sh", "-c", "touch /dev/x 2>&1; echo ok > /dev/shm/y && cat /dev/shm/y"]);
    let text = stdout(&out);
    assert!(text.contains("Permission denied"), "{text}");
    assert!(text.ends_with("ok\n"), "{text}");
}

#[test]
fn writes_outside_tmp_and_workspace_fail_through_links() {
    if !sandbox_available() {
        return;
    }
    let script = "ln -s /etc/hostname /tmp/link && (echo pwned > /tmp/link) 2>/dev/null && echo symlink-write; \
                  ln /usr/bin/env /tmp/hard 2>/dev/null && echo hardlink-made; \
                  ln -s /usr/lib /tmp/lib && touch /tmp/lib/x 2>/dev/null && echo dir-link-write; \
                  echo fine > /tmp/ok && cat /tmp/ok";
    let out = run(&["--", "/bin/sh", "-c", script]);
    assert_eq!(stdout(&out), "fine\n", "stderr: {}", stderr(&out));
}

#[test]
fn shadow_is_unreadable() {
    if !sandbox_available() {
        return;
    }
    let out = run(&["--", "/bin/cat", "/etc/shadow"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("Permission denied"), "{}", stderr(&out));
}

#[test]
fn tcp_to_the_host_loopback_reaches_nothing() {
    if !sandbox_available() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let py = format!(
        "import socket,errno\ns=socket.socket()\ntry:\n s.connect(('127.0.0.1',{port}))\n print('connected')\n\
         except OSError as e:\n print(errno.errorcode[e.errno])"
    );
    let out = run(&["--", "/usr/bin/python3", "-c", &py]);
    // The job's 127.0.0.1 is its own namespace's: nothing listens there.
    assert_eq!(stdout(&out).trim(), "ECONNREFUSED", "{}", stderr(&out));
    let out = run(&["--", "/bin/bash", "-c", &format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo sent")]);
    assert!(!stdout(&out).contains("sent"), "{}", stdout(&out));
    let mut buf = [0u8; 8];
    match listener.accept() {
        Ok((mut s, _)) => panic!("the sandbox reached the host: {:?}", s.read(&mut buf)),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
}

#[test]
fn host_network_allows_tcp() {
    if !sandbox_available() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let out =
        run(&["--net", "host", "--", "/bin/bash", "-c", &format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo sent")]);
    assert_eq!(stdout(&out), "sent\n", "{}", stderr(&out));
}

#[test]
fn setuid_root_binary_does_not_elevate() {
    if !is_root() {
        return skip("needs root to make a setuid-root binary");
    }
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("euid.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\nint main(){printf(\"%d %d\\n\",getuid(),geteuid());return 0;}\n",
    )
    .unwrap();
    let bin = dir.path().join("euid");
    let cc = std::process::Command::new("cc").arg("-o").arg(&bin).arg(&src).status().unwrap();
    assert!(cc.success());
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap(); // owned by root
    let ws = dir.path().to_str().unwrap();
    let out = run(&["--workspace", ws, "--", "/workspace/euid"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ids: Vec<u32> = stdout(&out).split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(ids.len(), 2);
    assert_ne!(ids[1], 0, "setuid root elevated inside the sandbox");
    assert_eq!(ids[0], ids[1]);
}

#[test]
fn outcome_reports_landlock_abi_and_status() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("s.json");
    let out = run(&["--json-status", status.to_str().unwrap(), "--", "/bin/true"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    let kernel_abi = {
        // SAFETY: LANDLOCK_CREATE_RULESET_VERSION with null attr only queries.
        let r = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, 0usize, 0usize, 1u32) };
        r.max(0) as u64
    };
    if kernel_abi == 0 {
        return skip("this kernel has no landlock");
    }
    assert_eq!(v["layers"]["landlock"]["abi"].as_u64().unwrap(), kernel_abi.min(7));
    assert_eq!(v["layers"]["landlock"]["status"], "full");
}

/// A test suite's local servers: bind, listen and connect on the job's own
/// loopback, IPv4, IPv6 and by the name `localhost`, under `--net none`.
#[test]
fn the_jobs_own_loopback_serves_tcp_v4_v6_and_localhost() {
    if !sandbox_available() {
        return;
    }
    let py = r#"
import socket
for fam, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"), (None, "localhost")):
    if fam is None:
        l = socket.create_server(("localhost", 0))
    else:
        l = socket.socket(fam); l.bind((host, 0)); l.listen(1)
    port = l.getsockname()[1]
    c = socket.create_connection((host, port), timeout=5)
    s, _ = l.accept()
    c.sendall(b"ping")
    print(host, s.recv(4).decode())
"#;
    let out = run(&["--", "/usr/bin/python3", "-c", py]);
    assert_eq!(stdout(&out), "127.0.0.1 ping\n::1 ping\nlocalhost ping\n", "{}", stderr(&out));
    assert_eq!(out.status.code(), Some(0));
}

/// What the job's own loopback does not open: raw and packet sockets, and
/// an abstract unix socket of the host's (its namespace is the host's).
#[test]
fn raw_packet_and_the_hosts_abstract_sockets_stay_refused() {
    use std::os::linux::net::SocketAddrExt;
    if !sandbox_available() {
        return;
    }
    let name = format!("confine-test-abstract-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let py = format!(
        r#"
import socket
for what, make in (("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("raw6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)),
                   ("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))):
    try:
        make(); print(what, "opened")
    except OSError as e:
        print(what, type(e).__name__)
u = socket.socket(socket.AF_UNIX)
try:
    u.connect("\0{name}"); print("abstract connected")
except OSError as e:
    print("abstract", type(e).__name__)
"#
    );
    let out = run(&["--", "/usr/bin/python3", "-c", &py]);
    let text = stdout(&out);
    for what in ["raw ", "raw6 ", "packet ", "abstract "] {
        let line = text.lines().find(|l| l.starts_with(what)).unwrap_or_else(|| panic!("{text} {}", stderr(&out)));
        assert!(
            line.ends_with("PermissionError") || line.ends_with("ConnectionRefusedError"),
            "{line}: must be refused\n{text}"
        );
    }
    match listener.accept() {
        Ok(_) => panic!("the job reached the host's abstract socket"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock),
    }
    // The control: the same socket, from the host, is reachable.
    std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
}
