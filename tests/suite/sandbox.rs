//! The sandbox core, checked from inside a real sandbox: namespaces, the
//! private root, credentials, environment, exit codes and stdio.
//! Every test runs the real `confine` binary, so each sandbox lives in its
//! own process.

use crate::common;
use common::*;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};

fn field<'a>(text: &'a str, key: &str) -> &'a str {
    text.lines().find_map(|l| l.strip_prefix(key)).map(str::trim).unwrap_or_else(|| panic!("no {key} in:\n{text}"))
}

#[test]
fn inside_view_is_isolated() {
    if !sandbox_available() {
        return;
    }
    let script = r#"
echo "self=$$ ppid=$PPID"
echo "init=$(cat /proc/1/comm)"
echo "hostname=$(hostname)"
echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
cat /etc/shadow >/dev/null 2>&1 && echo "readable=/etc/shadow"
for d in /root /home; do ls $d >/dev/null 2>&1 && echo "readable=$d"; done
grep -E '^(NoNewPrivs|CapEff|CapBnd|CapPrm|CapInh|CapAmb):' /proc/self/status
echo "uidmap=$(cat /proc/self/uid_map | tr -s ' ')"
echo "pids=$(ls /proc | grep -E '^[0-9]+$' | tr '\n' ,)"
"#;
    let out = run(&["--hostname", "jail-test", "--", "/bin/sh", "-c", script]);
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Our tiny init is pid 1 of the new pid namespace; the job is its child.
    assert_eq!(field(&text, "init="), "confine-init");
    assert!(text.contains("ppid=1"), "{text}");
    assert_eq!(field(&text, "hostname="), "jail-test");
    assert_eq!(field(&text, "ifaces="), "lo,");
    assert!(!text.contains("readable="), "sensitive host paths are readable:\n{text}");
    assert_eq!(field(&text, "NoNewPrivs:"), "1");
    for cap in ["CapEff:", "CapBnd:", "CapPrm:", "CapInh:", "CapAmb:"] {
        assert_eq!(field(&text, cap), "0000000000000000", "{cap}");
    }
    // "<inside> <outside> <count>": the job's host uid is not root.
    let map: Vec<u32> = field(&text, "uidmap=").split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert_eq!(map.len(), 3, "{text}");
    assert_ne!(map[1], 0, "job maps to host root: {text}");
    assert_eq!(map[2], 1);
    // Host pids are invisible: only the sandbox's few processes are listed.
    let pids: Vec<u32> =
        field(&text, "pids=").split(',').filter(|p| !p.is_empty()).map(|p| p.parse().unwrap()).collect();
    // (each shell pipeline above took a few pids, so numbers reach the teens)
    assert!(pids.len() <= 6 && pids.iter().all(|p| *p < 100), "host pids visible: {pids:?}");
    assert!(!pids.contains(&std::process::id()));
}

#[test]
fn supervisor_environment_does_not_leak() {
    if !sandbox_available() {
        return;
    }
    let out = confine()
        .args(["run", "--env", "PASSED=yes", "--env", "FROM_HOST", "--", "/usr/bin/env"])
        .env("CONFINE_TEST_SECRET", "hunter2")
        .env("FROM_HOST", "host-value")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!text.contains("hunter2") && !text.contains("CONFINE_TEST_SECRET"), "{text}");
    assert!(text.contains("PASSED=yes\n"), "{text}");
    assert!(text.contains("FROM_HOST=host-value\n"), "{text}");
    assert!(text.contains("HOME=/tmp\n") && text.contains("TMPDIR=/tmp\n"), "{text}");
    let keys: Vec<&str> = text.lines().filter_map(|l| l.split_once('=').map(|(k, _)| k)).collect();
    for k in &keys {
        assert!(["PATH", "HOME", "TMPDIR", "LANG", "PASSED", "FROM_HOST", "PWD"].contains(k), "unexpected {k}");
    }
}

#[test]
fn exit_codes_follow_docker_conventions() {
    if !sandbox_available() {
        return;
    }
    let cases: &[(&[&str], i32)] = &[
        (&["--", "/bin/true"], 0),
        (&["--", "/bin/sh", "-c", "exit 7"], 7),
        (&["--", "no-such-command-anywhere"], 127),
        (&["--", "/root/.cargo/bin/rustc"], 127), // a host path outside the sandbox's root
        (&["--", "/etc/passwd"], 126),            // exists, not executable
        (&["--", "/bin/sh", "-c", "kill -9 $$"], 128 + 9),
    ];
    for (args, want) in cases {
        let out = run(args);
        assert_eq!(out.status.code(), Some(*want), "{args:?}: {}", stderr(&out));
    }
    let out = run(&["--", "no-such-command-anywhere"]);
    assert!(stderr(&out).contains("not found"), "{}", stderr(&out));
}

#[test]
fn stdin_is_piped_through() {
    if !sandbox_available() {
        return;
    }
    let mut child =
        confine().args(["run", "--", "/bin/cat"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"through the sandbox\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(stdout(&out), "through the sandbox\n");
}

/// A job starts as a shell would start it: no signal ignored or blocked,
/// so `yes | head` ends `yes` by SIGPIPE, silently. (The init stage is a
/// Rust program, and Rust ignores SIGPIPE; `nohup` would add SIGHUP.)
#[test]
fn job_starts_with_default_signal_dispositions() {
    if !sandbox_available() {
        return;
    }
    let out = Command::new("nohup")
        .envs(degraded_env())
        .arg(bin())
        .args(["run", "--", "/bin/sh", "-c", "grep -E '^Sig(Ign|Blk):' /proc/self/status; yes | head -c 1 >/dev/null"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Bits 31 and 32 are signals 32 and 33, which glibc reserves and lets
    // no program change; whatever ignores them upstream (this test harness
    // does) shows through. Every other signal must be at its default.
    let ignored = u64::from_str_radix(field(&text, "SigIgn:"), 16).unwrap();
    assert_eq!(ignored & !(0b11 << 31), 0, "{text}");
    assert_eq!(field(&text, "SigBlk:"), "0000000000000000", "{text}");
    assert!(!stderr(&out).contains("Broken pipe"), "yes saw EPIPE instead of SIGPIPE: {}", stderr(&out));
}

#[test]
fn setsid_grandchild_dies_with_the_job() {
    if !sandbox_available() {
        return;
    }
    let tok = token("setsid");
    // The grandchild double-forks into its own session, then the job exits.
    let script = format!(
        "setsid /bin/sh -c 'sleep 1000; : {tok}' >/dev/null 2>&1 < /dev/null & sleep 0.2; \
         ps_ok=$(ls /proc | grep -c '^[0-9]'); echo procs=$ps_ok"
    );
    let out = run(&["--", "/bin/sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let procs: u32 = field(&stdout(&out), "procs=").parse().unwrap();
    assert!(procs >= 4, "the grandchild never started: {}", stdout(&out));
    let left = host_pids_with(&tok);
    assert!(left.is_empty(), "survivors on the host: {left:?}");
}

/// A supervisor killed with SIGKILL (no chance to clean up) takes the
/// job's tree with it: the init stage's parent-death signal, which the
/// stage sets itself, first thing (it is started with posix_spawn). The
/// job cgroups it leaves are removed by the next supervisor's start.
#[test]
fn a_killed_supervisor_takes_the_job_tree_with_it() {
    if !sandbox_available() {
        return;
    }
    let tok = token("supervisor-killed");
    let mut sup = confine()
        .args(["run", "--memory", "64M", "--", "/bin/sh", "-c", &format!("sleep 1000; : {tok}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = sup.id();
    // The job's processes: the supervisor's own command line has the token too.
    let job = || host_pids_with(&tok).into_iter().filter(|&p| p != pid).collect::<Vec<_>>();
    // Up to a minute: an emulated guest (`./dev vm-test`) starts a job
    // in seconds.
    let wait_for = |want_running: bool| {
        for _ in 0..3000 {
            if job().is_empty() != want_running {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    };
    assert!(wait_for(true), "the job never started");
    // SAFETY: kill(2) of our own unreaped child; no memory involved.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let status = sup.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    let survivors = if wait_for(false) { Vec::new() } else { job() };
    // The next supervisor kills and removes the dead one's job cgroups
    // (and so any survivor: run before asserting, to leave nothing behind).
    // Another test's supervisor, started meanwhile, may have done it first.
    let owned_by_dead = |name: &str| name.rsplit('.').nth(1) == Some(pid.to_string().as_str());
    assert!(run(&["--", "/bin/true"]).status.success());
    assert!(survivors.is_empty(), "survivors 5 s after the supervisor's death: {survivors:?}");
    let left = cgroup_dirs(&owned_by_dead);
    assert!(left.is_empty(), "job cgroups of the dead supervisor left: {left:?}");
}

fn workspace(owner: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("hello.txt"), "hi from the host\n").unwrap();
    std::os::unix::fs::chown(dir.path(), Some(owner), Some(owner)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[test]
fn workspace_is_read_only_unless_rw() {
    if !is_root() {
        return skip("needs root to give the workspace to another uid");
    }
    if !sandbox_available() {
        return;
    }
    let dir = workspace(1000);
    let ws = dir.path().to_str().unwrap();
    let out = run(&["--workspace", ws, "--", "/bin/sh", "-c", "cat hello.txt; pwd; echo x > new.txt"]);
    assert_eq!(stdout(&out), "hi from the host\n/workspace\n");
    assert!(stderr(&out).contains("Read-only file system"), "{}", stderr(&out));
    assert!(!dir.path().join("new.txt").exists());

    let out = run(&["--workspace", ws, "--rw", "--", "/bin/sh", "-c", "echo written > new.txt; id -u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // As root, the job runs as the workspace's owner: its files belong to them.
    assert_eq!(stdout(&out).trim(), "1000");
    let meta = std::fs::metadata(dir.path().join("new.txt")).unwrap();
    assert_eq!(meta.uid(), 1000);
    assert_eq!(std::fs::read_to_string(dir.path().join("new.txt")).unwrap(), "written\n");
}

/// A read-only workspace is read-only all the way down: a file system
/// mounted inside it on the host is too. (Before Linux 5.12 there is no
/// recursive `mount_setattr`, and each mount below is remounted.)
#[test]
fn a_read_only_workspace_is_read_only_below_its_mounts() {
    if !is_root() {
        return skip("needs root to mount inside the workspace");
    }
    if !sandbox_available() {
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let dir = workspace(1000);
    let sub = dir.path().join("mnt");
    std::fs::create_dir(&sub).unwrap();
    assert!(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "mode=1777", "tmpfs"])
        .arg(&sub)
        .status()
        .unwrap()
        .success());
    let _unmount = Unmount(sub.clone());
    let ws = dir.path().to_str().unwrap();
    let out = run(&[
        "--workspace",
        ws,
        "--",
        "/bin/sh",
        "-c",
        "echo x > mnt/f; echo x > g; grep ' /workspace' /proc/self/mounts",
    ]);
    let err = stderr(&out);
    assert_eq!(err.matches("Read-only file system").count(), 2, "{err}");
    assert!(!sub.join("f").exists(), "the job wrote below a read-only workspace");
    let mounts = stdout(&out);
    assert!(mounts.lines().all(|l| l.split(' ').nth(3).is_some_and(|o| o.starts_with("ro,"))), "{mounts}");
    assert_eq!(mounts.lines().count(), 2, "{mounts}");
}

#[test]
fn system_paths_are_read_only_and_tmp_is_private() {
    if !sandbox_available() {
        return;
    }
    let marker = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    let name = marker.path().file_name().unwrap().to_str().unwrap().to_string();
    let script = format!(
        "touch /usr/x 2>/dev/null && echo usr-writable; touch /etc/x 2>/dev/null && echo etc-writable; \
         touch /x 2>/dev/null && echo root-writable; ls /tmp/{name} 2>/dev/null && echo host-tmp-visible; \
         echo data > /tmp/mine && cat /tmp/mine"
    );
    let out = run(&["--", "/bin/sh", "-c", &script]);
    assert_eq!(stdout(&out), "data\n", "{}", stderr(&out));
}

#[test]
fn tmp_has_a_size_cap() {
    if !sandbox_available() {
        return;
    }
    let out = run(&["--", "/bin/sh", "-c", "df -k /tmp | tail -1 | tr -s ' ' | cut -d' ' -f2"]);
    let kib: u64 = stdout(&out).trim().parse().unwrap_or_else(|_| panic!("{}", stdout(&out)));
    assert_eq!(kib, 64 * 1024, "default /tmp cap is 64 MiB");
}

/// A job that ends with its /tmp (also its HOME) full is told so, with the
/// cap and `--tmp-size`, on stderr and in `--json-status`: out of space,
/// or out of inodes; a job that left room, or cleaned up after an ENOSPC,
/// is not. What the job planted in /tmp (a symlink to the host's /tmp, a
/// FIFO) changes nothing: the supervisor measures the mount it opened.
#[test]
fn a_full_tmp_is_named_with_its_cap_and_flag() {
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let planted = "ln -s / /tmp/root; mkfifo /tmp/fifo; ln -s /proc/1/root /tmp/pid1";
    for (script, want) in [
        ("head -c 2000000 /dev/zero > /tmp/big", Some("space")),
        ("cd && seq 2000 | xargs touch 2>/dev/null", Some("files")),
        ("head -c 2000000 /dev/zero > ~/big; rm ~/big", None),
        ("head -c 500000 /dev/zero > /tmp/half", None),
    ] {
        let script = format!("{planted}; {script}; true");
        let out = run(&["--tmp-size", "1M", "--json-status", status.to_str().unwrap(), "--", "/bin/sh", "-c", &script]);
        assert!(out.status.success(), "{script}: {}", stderr(&out));
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
        let note = stderr(&out).lines().find(|l| l.contains("/tmp (also the job's HOME)")).map(str::to_string);
        match want {
            Some(what) => {
                assert_eq!(json["tmpFull"]["outOf"], what, "{script}: {json}");
                assert_eq!(json["tmpFull"]["sizeBytes"], 1 << 20, "{script}: {json}");
                let note = note.unwrap_or_else(|| panic!("{script}: no note in {}", stderr(&out)));
                assert!(note.contains("1.0 MiB cap") && note.contains("--tmp-size"), "{note}");
                assert_eq!(json["tmpFull"]["message"].as_str(), note.strip_prefix("confine: "), "{json}");
            }
            None => {
                assert!(json.get("tmpFull").is_none(), "{script}: {json}");
                assert_eq!(note, None, "{script}");
            }
        }
    }
    // A job killed past its grace period: pid 1 dies without a word, and
    // the supervisor's own measure, on the tmpfs it holds, names it.
    // The timeout leaves the job time to fill /tmp first, in an emulated
    // guest too (CONFINE_TEST_SLOW).
    let script = "trap '' TERM; head -c 2000000 /dev/zero > /tmp/big; sleep 30";
    let (status_s, tmp) = (status.to_str().unwrap(), "1M");
    let timeout = format!("{}ms", 600 * slow());
    let out = run(&[
        "--tmp-size",
        tmp,
        "--timeout",
        &timeout,
        "--kill-grace",
        "100ms",
        "--json-status",
        status_s,
        "--",
        "/bin/sh",
        "-c",
        script,
    ]);
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(json["tmpFull"]["outOf"], "space", "{json}");
}

#[test]
fn proc_is_masked_like_runc() {
    if !sandbox_available() {
        return;
    }
    let script = "for f in kcore keys timer_list timer_stats sched_debug latency_stats; do \
                    [ -e /proc/$f ] && echo \"$f=$(wc -c < /proc/$f)\"; done; \
                  echo 1 > /proc/sysrq-trigger 2>/dev/null && echo sysrq-writable; \
                  echo x > /proc/sys/kernel/hostname 2>/dev/null && echo sys-writable; \
                  echo acpi=$(ls /proc/acpi 2>/dev/null | wc -l)";
    let out = run(&["--", "/bin/sh", "-c", script]);
    let text = stdout(&out);
    let masked: Vec<&str> = text.lines().filter(|l| !l.starts_with("acpi=")).collect();
    // This kernel has at least /proc/keys and /proc/timer_list; each reads as empty.
    assert!(masked.len() >= 2, "{text}");
    for line in &masked {
        assert!(line.ends_with("=0"), "not masked: {line}\n{text}");
    }
    assert!(text.contains("acpi=0\n"), "{text}");
}

#[test]
fn dev_is_minimal() {
    if !sandbox_available() {
        return;
    }
    let out = run(&[
        "--",
        "/bin/sh",
        "-c",
        "ls /dev | tr '\\n' ' '; echo; ls /dev/pts | tr '\\n' ' '; echo; head -c 4 /dev/zero | wc -c; \
         echo x > /dev/null && echo null-ok",
    ]);
    let text = stdout(&out);
    let mut lines = text.lines();
    let dev: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    for want in ["full", "null", "ptmx", "pts", "random", "shm", "tty", "urandom", "zero"] {
        assert!(dev.contains(&want), "/dev/{want} missing: {text}");
    }
    assert!(!text.contains("sda") && !text.contains("vda") && !text.contains("mem "), "{text}");
    // No terminal without --tty: /dev/console is the relayed one's, and
    // /dev/pts the job's own instance, holding no pty yet.
    assert!(!dev.contains(&"console"), "{text}");
    assert_eq!(lines.next().map(str::trim), Some("ptmx"), "{text}");
    assert!(text.contains("4\nnull-ok"), "{text}");
}

#[test]
fn host_network_on_request() {
    if !sandbox_available() {
        return;
    }
    let out = run(&["--net", "host", "--", "/bin/sh", "-c", "tail -n +3 /proc/net/dev | wc -l"]);
    let n: u32 = stdout(&out).trim().parse().unwrap();
    let host = std::fs::read_to_string("/proc/net/dev").unwrap().lines().count() as u32 - 2;
    assert_eq!(n, host);
}

#[test]
fn bad_input_is_a_clear_error() {
    let no_cmd = confine().arg("run").output().unwrap();
    assert_eq!(no_cmd.status.code(), Some(2));
    let bad_flag = confine().args(["run", "--no-such-flag", "--", "true"]).output().unwrap();
    assert_eq!(bad_flag.status.code(), Some(2));

    let out = run(&["--workspace", "/no/such/dir", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("/no/such/dir"), "{}", stderr(&out));
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = run(&["--workspace", file.path().to_str().unwrap(), "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(stderr(&out).contains("not a directory"), "{}", stderr(&out));
}

/// The layers as this kernel can have them: landlock `full` only on a
/// kernel with every right of the ABI confine targets, `partial` on an
/// older ABI (Debian 12's 6.1 has ABI 2), and without landlock (5.10) the
/// run refused unless degraded runs are allowed, then `none`.
#[test]
fn json_status_names_the_layers() {
    use confine::sandbox::linux::landlock::{expected_status, kernel_abi, TARGET_ABI};
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    let kernel = kernel_abi();
    let mut args = vec!["--json-status", status.to_str().unwrap()];
    if kernel == 0 {
        // Not through `run`, which allows degraded runs on this kernel.
        let out = Command::new(bin())
            .env_remove("CONFINE_CONFIG")
            .args(["--config", "/dev/null", "run", "--", "/bin/true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "ran without landlock and without --allow-degraded");
        assert!(stderr(&out).contains("landlock") && stderr(&out).contains("--allow-degraded"), "{}", stderr(&out));
        args.push("--allow-degraded");
    }
    args.extend(["--", "/bin/sh", "-c", "exit 3"]);
    let out = run(&args);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(v["exitCode"], 3);
    assert_eq!(v["status"], "failure");
    assert_eq!(v["backend"], "linux");
    assert!(v["durationMs"].as_u64().is_some());
    for layer in [
        "userns",
        "mountns",
        "pidns",
        "netns",
        "ipcns",
        "utsns",
        "cgroupns",
        "capsDropped",
        "noNewPrivs",
        "mountsLocked",
    ] {
        assert_eq!(v["layers"][layer], true, "{layer}: {v}");
    }
    // `full` on an older ABI that has every right confine asks for (6).
    let expected = expected_status(kernel);
    assert_eq!(expected == "full", kernel >= 6, "kernel landlock ABI {kernel} (target {})", TARGET_ABI as u32);
    assert_eq!(v["layers"]["landlock"]["status"], expected, "kernel landlock ABI {kernel}: {v}");
    // Without landlock the private read-only root is what holds the
    // filesystem: partial, and said so; every other row is unchanged.
    let fs = if kernel == 0 { "partial" } else { "enforced" };
    assert_eq!(v["guarantees"]["filesystem"]["level"], fs, "{v}");
    for row in ["network", "syscalls", "memory", "cpu", "pids", "treeKill", "envScrub"] {
        assert_eq!(v["guarantees"][row]["level"], "enforced", "{row}: {v}");
    }
}

/// A kernel or LSM that refuses the job a user namespace of its own, the
/// one that locks the sandbox's mounts (a debug build's stand-in,
/// `CONFINE_TEST_REFUSE`: at the clone, or at the capabilities inside it,
/// as AppArmor's restriction would): the job fails closed and says how to
/// go on; with `--allow-degraded` it runs, its mounts unlocked and named
/// missing.
#[test]
fn a_refused_nested_user_namespace_fails_closed_unless_degraded() {
    if !sandbox_available() {
        return;
    }
    if !test_hooks() {
        // Not a layer this host lacks: a release binary has no stand-in.
        eprintln!("a release confine ({}): no refusal to stand in for", bin());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let status = dir.path().join("status.json");
    for point in ["nested-userns", "nested-userns-caps"] {
        let out = Command::new(bin())
            .env_remove("CONFINE_CONFIG")
            .env("CONFINE_TEST_REFUSE", point)
            .args(["--config", "/dev/null", "run", "--", "/bin/sh", "-c", "echo ran"])
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(125), "{point}: {err}");
        assert_eq!(stdout(&out), "", "{point}: the job ran");
        assert!(err.contains("lock the sandbox's mounts") && err.contains("--allow-degraded"), "{point}: {err}");
        let out = confine()
            .env("CONFINE_TEST_REFUSE", point)
            .args(["run", "--allow-degraded", "--json-status", status.to_str().unwrap()])
            .args(["--", "/bin/sh", "-c", "exit 3"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{point}: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
        assert_eq!(v["layers"]["mountsLocked"], false, "{point}: {v}");
        let missing = v["layers"]["missing"].as_array().cloned().unwrap_or_default();
        assert!(missing.iter().any(|m| m == "mount lock"), "{point}: {v}");
        assert_eq!(v["guarantees"]["filesystem"]["level"], "partial", "{point}: {v}");
    }
}

#[test]
fn rootless_through_unprivileged_user_namespaces() {
    if !is_root() {
        return skip("needs root to switch to an unprivileged user for the test");
    }
    if !sandbox_available() {
        return;
    }
    // Copy the binary where an unprivileged user can execute it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("confine");
    std::fs::copy(bin(), &copy).unwrap();
    // `degraded`: with the environment that lets a job run on this kernel
    // ([`degraded_env`]), which the first run must not have.
    let rootless = |flags: &[&str], degraded: bool| {
        let env = if degraded { degraded_env() } else { Vec::new() };
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&copy)
            .arg("run")
            .args(flags)
            .args(["--", "/bin/sh", "-c", "id -u; grep NoNewPrivs /proc/self/status; cat /proc/self/uid_map"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(env)
            .output()
            .unwrap()
    };
    // The default limits need a cgroup, and none is delegated to uid
    // 65534 here: that fails closed, and says how to go on.
    let out = rootless(&[], false);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("--allow-degraded") && err.contains("--memory unlimited"), "{err}");
    let out = rootless(&["--memory", "unlimited", "--cpus", "unlimited", "--pids", "unlimited"], true);
    if stderr(&out).contains("clone namespaces") {
        return skip(&format!("unprivileged user namespaces are disabled: {}", stderr(&out)));
    }
    assert!(out.status.success(), "rootless run failed: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("65534\n"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
}

/// A supervisor under a real-time policy does not pass it on: the job runs
/// SCHED_OTHER (a SCHED_FIFO busy loop would starve the host's CPU).
#[test]
fn jobs_do_not_inherit_a_real_time_policy() {
    if !sandbox_available() {
        return;
    }
    if !is_root() {
        skip("setting SCHED_FIFO on the supervisor needs root");
        return;
    }
    let out = Command::new("chrt")
        .envs(degraded_env())
        .args(["-f", "10", bin(), "run", "--", "/bin/sh", "-c", "grep -E '^policy' /proc/self/sched"])
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            skip(&format!("chrt (util-linux) is not available: {e}"));
            return;
        }
    };
    assert!(out.status.success(), "{}", stderr(&out));
    // /proc/<pid>/sched: policy 0 is SCHED_OTHER, 1 SCHED_FIFO.
    let policy = stdout(&out);
    assert_eq!(policy.split(':').nth(1).map(str::trim), Some("0"), "job policy line: {policy}");
}
