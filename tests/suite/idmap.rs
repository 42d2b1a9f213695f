//! Workspaces where users run jobs (issue 28): root's own checkout, as a
//! CI runner has it, shown to the job as its own through an idmapped
//! mount; and, where the kernel, the file system or a rootless supervisor
//! can't make one, the documented fallback with a clear refusal.
//!
//! Every test runs real jobs against real mounts; the file systems that
//! this host's `/tmp` is not (tmpfs, and ramfs, which has no idmapped
//! mounts) are mounted in a private mount namespace (`unshare -m`) that
//! dies with the test's shell, so no mount is left behind.

use crate::common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

fn root_sandbox() -> bool {
    if !is_root() {
        skip("idmapped workspaces are made by a root supervisor (the rootless test covers the rest)");
        return false;
    }
    sandbox_available()
}

/// A root-owned 0700 directory (what `mktemp -d` makes) with `a`, 0600.
fn root_checkout() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.path().join("a"), "the repo's file\n").unwrap();
    std::fs::set_permissions(dir.path().join("a"), std::fs::Permissions::from_mode(0o600)).unwrap();
    dir
}

/// Wait up to 5 s for a job to make `path` (it says it started).
fn wait_for_file(path: &Path) {
    for _ in 0..500 {
        if path.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn status(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn owner(path: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid())
}

/// `confine run FLAGS… --json-status S -- /bin/sh -c SCRIPT`, and S.
fn sh_status(flags: &[&str], script: &str) -> (std::process::Output, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("status.json");
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--json-status", st.to_str().unwrap(), "--", "/bin/sh", "-c", script]);
    let out = run(&args);
    let v = std::fs::read(&st).map(|b| serde_json::from_slice(&b).unwrap()).unwrap_or(serde_json::Value::Null);
    (out, v)
}

#[test]
fn a_root_owned_0700_workspace_is_readable_and_writable_and_files_land_as_root() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let wsp = ws.path().to_str().unwrap();

    // Read-only: readable, not writable, and the files show as the job's.
    let (out, v) = sh_status(
        &["--workspace", wsp],
        "cat a; [ \"$(stat -c %u a)\" = \"$(id -u)\" ] && echo owned=yes; echo x > b 2>/dev/null && echo write=ok || echo write=refused",
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("the repo's file") && text.contains("owned=yes"), "{text}");
    assert!(text.contains("write=refused"), "{text}");
    assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
    assert!(!ws.path().join("b").exists());

    // Read-write: what the job creates lands as the workspace's owner.
    let (out, v) = sh_status(
        &["--workspace", wsp, "--rw"],
        "echo new > new && mkdir -p d/e && echo deep > d/e/f && echo more >> a && ln -s a link && echo done",
    );
    assert!(out.status.success() && stdout(&out).contains("done"), "{}{}", stdout(&out), stderr(&out));
    for p in ["new", "d", "d/e", "d/e/f", "a", "link"] {
        assert_eq!(owner(&ws.path().join(p)), (0, 0), "{p} on the host");
    }
    assert_eq!(std::fs::read_to_string(ws.path().join("a")).unwrap(), "the repo's file\nmore\n");
    // The job itself is never host root.
    assert_eq!(v["layers"]["hostUid"], 65534, "{v}");
    assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
    assert_eq!(owner(ws.path()), (0, 0));
    assert_eq!(std::fs::metadata(ws.path()).unwrap().mode() & 0o7777, 0o700, "the workspace's mode changed");
}

/// The job's uid as the host's `/proc` shows it, not as it reports it.
#[test]
fn the_job_on_an_idmapped_workspace_is_not_host_root() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let tok = token("idmap-uid");
    let mut child = Command::new(bin())
        .args(["run", "--workspace", ws.path().to_str().unwrap(), "--rw", "--", "/bin/sh", "-c"])
        .arg("touch ready; sleep 30")
        .arg(&tok)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = ws.path().join("ready");
    wait_for_file(&ready);
    assert!(ready.exists(), "the job never started");
    let cli = child.id();
    let jobs: Vec<u32> = host_pids_with(&tok).into_iter().filter(|&p| p != cli).collect();
    let ids: Vec<String> = jobs
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .flat_map(|s| {
            s.lines().filter(|l| l.starts_with("Uid:") || l.starts_with("Gid:")).map(String::from).collect::<Vec<_>>()
        })
        .collect();
    // SAFETY: kill takes a pid (our own child's) and a signal number.
    unsafe { libc::kill(cli as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(!jobs.is_empty() && !ids.is_empty(), "the job's process was not found");
    for line in &ids {
        let fields: Vec<&str> = line.split_whitespace().skip(1).collect();
        assert!(fields.iter().all(|f| *f == "65534"), "the job's host ids: {line}");
    }
}

/// A workspace owned by a user (uid ≥ 1000) runs as that user, with its
/// group mapped onto the job's (nogroup); one owned by a system uid runs
/// as nobody, its owner mapped. Either way what the job makes lands as
/// the workspace's owner and group.
#[test]
fn files_land_as_the_workspace_owner() {
    if !root_sandbox() {
        return;
    }
    for (uid, job_uid) in [(1000, 1000), (500, 65534)] {
        let ws = root_checkout();
        std::os::unix::fs::chown(ws.path(), Some(uid), Some(uid)).unwrap();
        std::os::unix::fs::chown(ws.path().join("a"), Some(uid), Some(uid)).unwrap();
        let (out, v) = sh_status(
            &["--workspace", ws.path().to_str().unwrap(), "--rw"],
            "cat a >/dev/null && echo made > made && mkdir dir && echo ok",
        );
        assert!(stdout(&out).contains("ok"), "uid {uid}: {}{}", stdout(&out), stderr(&out));
        assert_eq!(owner(&ws.path().join("made")), (uid, uid), "uid {uid}");
        assert_eq!(owner(&ws.path().join("dir")), (uid, uid), "uid {uid}");
        assert_eq!(v["layers"]["hostUid"], job_uid, "uid {uid}: {v}");
        assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "uid {uid}: {v}");
    }
}

/// `--bind` and `--ro-bind` sources are idmapped as the workspace is.
#[test]
fn binds_are_idmapped_too() {
    if !root_sandbox() {
        return;
    }
    let ro = root_checkout();
    let rw = root_checkout();
    let (out, v) = sh_status(
        &["--ro-bind", &format!("{}:/data", ro.path().display()), "--bind", &format!("{}:/out", rw.path().display())],
        "cat /data/a && cp /data/a /out/copy && echo ok",
    );
    assert!(stdout(&out).contains("ok"), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(owner(&rw.path().join("copy")), (0, 0));
    let mut idmapped: Vec<String> =
        v["layers"]["idmapped"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect();
    idmapped.sort();
    assert_eq!(idmapped, ["/data", "/out"], "{v}");
}

/// `confine exec` with `workspace_rw = true` on a root-owned repository.
#[test]
fn exec_writes_a_root_owned_repository() {
    if !root_sandbox() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    std::fs::set_permissions(&repo, std::fs::Permissions::from_mode(0o700)).unwrap();
    let config = dir.path().join("confine.toml");
    let text = exec_config(&dir.path().join("store"), "t", &repo)
        .replace("[store]", "[sandbox]\nworkspace_rw = true\n\n[store]");
    std::fs::write(&config, text).unwrap();
    let out = Command::new(bin())
        .args(["--config", config.to_str().unwrap(), "exec", "--repo-id", "t", "--runtime", "shell", "--json"])
        .args(["--code", "echo built > out.txt && cat out.txt"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"]["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
    assert_eq!(std::fs::read_to_string(repo.join("out.txt")).unwrap(), "built\n");
    assert_eq!(owner(&repo.join("out.txt")), (0, 0));
}

/// `sh -c SCRIPT` in a mount namespace of its own (its mounts die with
/// it), with `$C` the binary under test and `$D` a fresh directory.
fn in_private_mounts(script: &str) -> (std::process::Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c", script])
        .env("C", bin())
        .env("D", dir.path())
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux)");
    (out, dir)
}

/// tmpfs has idmapped mounts (Linux 6.3); ramfs has none: a read-write
/// job on a root-owned ramfs is refused before it starts, with a line that
/// says why and what to do, and a read-only one is bound plainly and says
/// so in its layers.
#[test]
fn tmpfs_is_idmapped_and_a_file_system_without_idmaps_falls_back_with_a_clear_refusal() {
    if !root_sandbox() {
        return;
    }
    let script = r#"
set -u
mkdir "$D/t" "$D/r" "$D/o"
mount -t tmpfs -o mode=0700 none "$D/t" || exit 90
"$C" run --workspace "$D/t" --rw --json-status "$D/tmpfs.json" -- /bin/sh -c 'echo x > made'
echo tmpfs_rc=$?
stat -c 'tmpfs_owner=%u:%g' "$D/t/made"
mount -t ramfs none "$D/r" || exit 91
chmod 0700 "$D/r"
"$C" run --workspace "$D/r" --rw --json-status "$D/ramfs-rw.json" -- /bin/sh -c 'echo x > made' 2>"$D/ramfs-rw.err"
echo ramfs_rw_rc=$?
[ -e "$D/r/made" ] && echo ramfs_made=yes
chmod 0755 "$D/r"
echo hi > "$D/r/f"
chmod 0644 "$D/r/f"
"$C" run --workspace "$D/r" --json-status "$D/ramfs-ro.json" -- /bin/cat f
echo ramfs_ro_rc=$?
"#;
    let (out, dir) = in_private_mounts(script);
    let text = stdout(&out);
    assert!(text.contains("tmpfs_rc=0") && text.contains("tmpfs_owner=0:0"), "{text}{}", stderr(&out));
    assert_eq!(status(&dir.path().join("tmpfs.json"))["layers"]["idmapped"], serde_json::json!(["/workspace"]));

    assert!(text.contains("ramfs_rw_rc=125") && !text.contains("ramfs_made"), "{text}{}", stderr(&out));
    let err = std::fs::read_to_string(dir.path().join("ramfs-rw.err")).unwrap();
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    for want in ["can't write", "root (uid 0)", "uid 65534", "does not support idmapped mounts", "Fix:", "--rw"] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }

    assert!(text.contains("hi\nramfs_ro_rc=0"), "{text}{}", stderr(&out));
    let v = status(&dir.path().join("ramfs-ro.json"));
    assert!(v["layers"]["idmapped"].is_null(), "{v}");
    let why = v["layers"]["notIdmapped"][0].as_str().unwrap_or_default();
    assert!(why.starts_with("/workspace: ") && why.contains("does not support idmapped mounts"), "{v}");
}

/// Rootless, no idmapped mount of a host file system can be made: a
/// workspace of the user's own works as it is, another's is refused with
/// the reason, and the outcome says what applied.
#[test]
fn rootless_workspaces_say_what_applied() {
    if !is_root() {
        return skip("needs root to switch to an unprivileged user for the test");
    }
    if !sandbox_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = dir.path().join("confine");
    std::fs::copy(bin(), &copy).unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
    let roots = dir.path().join("roots");
    std::fs::create_dir(&roots).unwrap();
    std::fs::set_permissions(&roots, std::fs::Permissions::from_mode(0o700)).unwrap();
    let st = dir.path().join("st");
    std::fs::create_dir(&st).unwrap();
    std::os::unix::fs::chown(&st, Some(65534), Some(65534)).unwrap();
    let rootless = |ws: &Path, status: &str| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&copy)
            .args(["run", "--memory", "unlimited", "--cpus", "unlimited", "--pids", "unlimited", "--rw"])
            .arg("--workspace")
            .arg(ws)
            .arg("--json-status")
            .arg(st.join(status))
            .args(["--", "/bin/sh", "-c", "echo x > made && echo ok"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = rootless(&own, "own.json");
    if stderr(&out).contains("clone namespaces") {
        return skip(&format!("unprivileged user namespaces are disabled: {}", stderr(&out)));
    }
    assert!(stdout(&out).contains("ok"), "{}", stderr(&out));
    assert_eq!(owner(&own.join("made")), (65534, 65534));
    let v = status(&st.join("own.json"));
    assert!(v["layers"]["idmapped"].is_null() && v["layers"]["notIdmapped"].is_null(), "{v}");

    let out = rootless(&roots, "roots.json");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    let err = stderr(&out);
    for want in ["can't write", "root (uid 0)", "rootless", "Fix:"] {
        assert!(err.contains(want), "{want:?} not in: {err}");
    }
    assert!(!roots.join("made").exists());
}

/// A workspace's symlinks lead where they lead inside the sandbox, never
/// to the host path they name: the idmap changes owners, not where a
/// path goes.
#[test]
fn symlinks_in_an_idmapped_workspace_still_cannot_lead_out() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "host secret\n").unwrap();
    std::os::unix::fs::symlink(&secret, ws.path().join("abs")).unwrap();
    std::os::unix::fs::symlink("../../../../../../../etc/passwd", ws.path().join("rel")).unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("dir")).unwrap();
    let (out, v) = sh_status(
        &["--workspace", ws.path().to_str().unwrap(), "--rw"],
        "cat abs 2>/dev/null && echo read_abs=yes; echo x > abs 2>/dev/null && echo write_abs=yes; \
         echo x >> rel 2>/dev/null && echo write_rel=yes; echo x > dir/planted 2>/dev/null && echo write_dir=yes; \
         echo done",
    );
    let text = stdout(&out);
    assert!(text.contains("done"), "{text}{}", stderr(&out));
    assert!(!text.contains("=yes"), "{text}");
    assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret\n");
    assert!(!outside.path().join("planted").exists());
}

/// `--user 0`: root of the job's own user namespace only. It has no
/// capability, gains none by an execve, can't chown, and its host uid
/// (from the host's `/proc`) stays nobody; on root's idmapped workspace
/// its files land as root, its mode changes as any owner's.
#[test]
fn user_root_inside_is_not_host_root() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let tok = token("user-root");
    let dir = tempfile::tempdir().unwrap();
    let st = dir.path().join("status.json");
    let script = "id -u; id -g; grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status; \
                  chown 1:1 a 2>/dev/null && echo chown=ok || echo chown=refused; \
                  chmod 4755 a 2>/dev/null && echo suid=ok || echo suid=refused; \
                  mount -t tmpfs none /tmp 2>/dev/null && echo mount=ok || echo mount=refused; \
                  echo made > made; touch ready; sleep 30";
    let child = Command::new(bin())
        .args(["run", "-u", "root", "--workspace", ws.path().to_str().unwrap(), "--rw", "--json-status"])
        .arg(&st)
        .args(["--", "/bin/sh", "-c", script, &tok])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = ws.path().join("ready");
    wait_for_file(&ready);
    let cli = child.id();
    let host_uids: Vec<String> = host_pids_with(&tok)
        .into_iter()
        .filter(|&p| p != cli)
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .filter_map(|s| s.lines().find(|l| l.starts_with("Uid:")).map(String::from))
        .collect();
    // SAFETY: kill takes a pid (our own child's) and a signal number.
    unsafe { libc::kill(cli as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let text = stdout(&out);
    assert!(text.starts_with("0\n0\n"), "{text}{}", stderr(&out));
    for cap in ["CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(text.contains(&format!("{cap}:\t0000000000000000")), "{cap}: {text}");
    }
    for (k, v) in [("chown", "refused"), ("suid", "refused"), ("mount", "refused")] {
        assert!(text.contains(&format!("{k}={v}")), "{k}: {text}");
    }
    assert!(!host_uids.is_empty(), "the job's process was not found");
    for line in &host_uids {
        assert!(line.split_whitespace().skip(1).all(|f| f == "65534"), "the job's host uid: {line}");
    }
    assert_eq!(owner(&ws.path().join("made")), (0, 0));
    assert_eq!(std::fs::metadata(ws.path().join("a")).unwrap().mode() & 0o7777, 0o600);
    let v = status(&st);
    assert_eq!(v["layers"]["hostUid"], 65534, "{v}");
    assert_eq!(v["layers"]["uid"], 0, "{v}");
}

/// `--user NAME` unknown to the sandbox's /etc/passwd: a usage error that
/// says so, nothing run.
#[test]
fn an_unknown_user_name_is_a_clear_error() {
    let out = run(&["--user", "no-such-user-here", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("no user 'no-such-user-here' in the sandbox's /etc/passwd"), "{}", stderr(&out));
}

/// Every file under `dir`, with its owner, group and mode.
fn tree_attrs(dir: &Path) -> Vec<(std::path::PathBuf, u32, u32, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.path().symlink_metadata().unwrap();
            out.push((e.path(), m.uid(), m.gid(), m.mode()));
            if m.is_dir() {
                todo.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// After idmapped jobs, a failed one among them: no mount names the
/// workspace in the host's mount tables, no cgroup of those runs is left,
/// no process of theirs, and no file that was there changed owner or mode.
#[test]
fn idmapped_jobs_leave_nothing_behind() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    std::fs::write(ws.path().join("sub/b"), "b\n").unwrap();
    let extra = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(extra.path(), Some(1000), Some(1000)).unwrap();
    let before = tree_attrs(ws.path());
    let wsp = ws.path().to_str().unwrap();
    let bind = format!("{}:/data", extra.path().display());
    let tok = token("idmap-left");
    let mut clis = Vec::new();
    for args in [
        vec!["--workspace", wsp, "--rw", "--", "/bin/sh", "-c", "echo x > made; chmod 777 a sub; true", &tok],
        vec!["--workspace", wsp, "--bind", &bind, "--", "/bin/sh", "-c", "echo y > /data/y", &tok],
        vec!["--workspace", wsp, "--rw", "--user", "no-such-user", "--", "/bin/true", &tok],
        // A background process named by the token, left running by its job.
        vec!["--workspace", wsp, "--rw", "--", "/bin/bash", "-c", "(exec -a \"$0\" sleep 60) & sleep 0.2", &tok],
    ] {
        let child = Command::new(bin())
            .arg("run")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        clis.push(child.id().to_string());
        let out = child.wait_with_output().unwrap();
        assert_ne!(out.status.code(), Some(125), "{args:?}: {}", stderr(&out));
    }
    // The job's chmod changed the workspace's own files, as it may: put
    // them back before comparing, so only ownership and the rest count.
    std::fs::set_permissions(ws.path().join("a"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(ws.path().join("sub"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let after: Vec<_> = tree_attrs(ws.path()).into_iter().filter(|(p, ..)| !p.ends_with("made")).collect();
    assert_eq!(before, after, "a file that was there changed owner or mode");
    assert_eq!(owner(&ws.path().join("made")), (0, 0));
    assert_eq!(owner(&extra.path().join("y")), (1000, 1000));
    for table in ["/proc/self/mountinfo", "/proc/1/mountinfo"] {
        let t = std::fs::read_to_string(table).unwrap();
        assert!(!t.contains(wsp) && !t.contains(extra.path().to_str().unwrap()), "{table} names a job's mount:\n{t}");
    }
    let left = cgroup_dirs(&|name| clis.iter().any(|pid| name.split('.').nth(1) == Some(pid.as_str())));
    assert!(left.is_empty(), "cgroups left: {left:?}");
    let mut pids = host_pids_with(&tok);
    for _ in 0..100 {
        if pids.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        pids = host_pids_with(&tok);
    }
    assert!(pids.is_empty(), "processes left: {pids:?}");
}

/// A path through a symbolic link is never idmapped: a link a job planted
/// in a workspace of one run (`ws/sub -> /etc`) must not give the job of
/// the next run root's rights over where it leads. (Red-team finding B3.)
#[test]
fn a_workspace_or_bind_reached_through_a_symlink_is_not_idmapped() {
    if !root_sandbox() {
        return;
    }
    let outer = root_checkout();
    let victim = root_checkout();
    std::fs::write(victim.path().join("shadow"), "root:secret\n").unwrap();
    std::fs::set_permissions(victim.path().join("shadow"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = outer.path().join("sub");
    std::os::unix::fs::symlink(victim.path(), &link).unwrap();
    let (out, _) = sh_status(
        &["--workspace", link.to_str().unwrap(), "--rw"],
        "cat /workspace/shadow; echo pwned >> /workspace/shadow",
    );
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert!(!stdout(&out).contains("secret"), "{}", stdout(&out));
    assert_eq!(std::fs::read_to_string(victim.path().join("shadow")).unwrap(), "root:secret\n");

    // The same directory by its real path is idmapped, as the operator
    // meant it.
    let (out, v) = sh_status(&["--workspace", victim.path().to_str().unwrap()], "cat /workspace/shadow");
    assert_eq!(stdout(&out), "root:secret\n", "{}", stderr(&out));
    assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");

    // A bind source through a link: not idmapped, so the job can't read
    // root's 0700 directory, and the run says why before it starts.
    let spec = format!("{}:/data", link.display());
    let (out, _) = sh_status(&["--ro-bind", &spec], "cat /data/shadow");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("its path goes through a symbolic link") && err.contains("uid 0"), "{err}");
    assert!(!stdout(&out).contains("secret"));
}

/// Through the idmap the job owns root's files, and a write through a
/// shared mapping keeps a file's set-id bits and capabilities: a tree
/// that holds such a file, or a second name of a file, is not idmapped
/// read-write, and the run stops before the job does (red-team finding
/// B1). Read-only it is, and protected paths (`.git`) are not looked at.
#[test]
fn a_read_write_tree_with_set_id_capable_or_linked_files_is_not_idmapped() {
    if !root_sandbox() {
        return;
    }
    let outside = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    type Plant<'a> = &'a dyn Fn(&Path);
    let cases: [(&str, Plant); 4] = [
        ("setuid or setgid file, rootfs/usr/bin/tool (mode 4755)", &|ws: &Path| {
            std::fs::create_dir_all(ws.join("rootfs/usr/bin")).unwrap();
            std::fs::write(ws.join("rootfs/usr/bin/tool"), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(ws.join("rootfs/usr/bin/tool"), std::fs::Permissions::from_mode(0o4755)).unwrap();
        }),
        ("setuid or setgid file, sg (mode 2755)", &|ws: &Path| {
            std::fs::write(ws.join("sg"), "x").unwrap();
            std::fs::set_permissions(ws.join("sg"), std::fs::Permissions::from_mode(0o2755)).unwrap();
        }),
        ("file capabilities, bin/capped", &|ws: &Path| {
            std::fs::create_dir(ws.join("bin")).unwrap();
            std::fs::write(ws.join("bin/capped"), "x").unwrap();
            let ok = Command::new("setcap").arg("cap_dac_override=ep").arg(ws.join("bin/capped")).status().unwrap();
            assert!(ok.success(), "setcap");
        }),
        ("2 names, etc/cfg", &|ws: &Path| {
            std::fs::create_dir(ws.join("etc")).unwrap();
            let theirs = outside.path().join(format!("cfg-{}", std::process::id()));
            std::fs::write(&theirs, "host config\n").unwrap();
            std::fs::hard_link(&theirs, ws.join("etc/cfg")).unwrap();
        }),
    ];
    for (says, plant) in cases {
        let ws = root_checkout();
        plant(ws.path());
        let wsp = ws.path().to_str().unwrap();
        let (out, _) = sh_status(&["--workspace", wsp, "--rw"], "echo ran");
        assert_eq!(out.status.code(), Some(125), "{says}: {}{}", stdout(&out), stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(says) && err.contains("root (uid 0)"), "{says}: {err}");
        assert!(!stdout(&out).contains("ran"));
        // Read-only, nothing can be written through the mount: idmapped.
        let (out, v) = sh_status(&["--workspace", wsp], "cat a");
        assert_eq!(stdout(&out), "the repo's file\n", "{says}: {}", stderr(&out));
        assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join(format!("cfg-{}", std::process::id()))).unwrap(),
        "host config\n"
    );

    // A protected .git is mounted read-only over the tree: a hard link
    // inside it (a `git clone --local` shares objects so) is no reason.
    let ws = root_checkout();
    std::fs::create_dir_all(ws.path().join(".git/objects")).unwrap();
    std::fs::write(ws.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let theirs = outside.path().join(format!("obj-{}", std::process::id()));
    std::fs::write(&theirs, "object\n").unwrap();
    std::fs::hard_link(&theirs, ws.path().join(".git/objects/o")).unwrap();
    let (out, v) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], "echo x > made && echo ok");
    assert_eq!(stdout(&out), "ok\n", "{}", stderr(&out));
    assert_eq!(v["layers"]["idmapped"], serde_json::json!(["/workspace"]), "{v}");
}

/// What the job writes lands as root's, and root's git trusts a root-owned
/// repository: one the job makes is handed to the job's host ids after it,
/// where git refuses it as it did before idmaps; and a repository the
/// protection does not reach refuses the idmap (red-team finding B2).
#[test]
fn a_repository_the_job_makes_is_not_root_s_after_it() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let git = |dir: &Path, args: &[&str]| {
        Command::new("git").current_dir(dir).args(args).env("GIT_CONFIG_NOSYSTEM", "1").output().unwrap()
    };
    assert!(git(ws.path(), &["init", "-q", "."]).status.success());
    std::fs::create_dir(ws.path().join("src")).unwrap();
    let marker = ws.path().join("..").join(format!("fsmonitor-ran-{}", std::process::id()));
    let script =
        format!("cd src && git init -q . && git config core.fsmonitor 'id > {}; echo' && echo made", marker.display());
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], &script);
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&ws.path().join("src/.git")), (65534, 65534), "the job's repository is still root's");
    let status = git(&ws.path().join("src"), &["status"]);
    assert!(!status.status.success() && stderr(&status).contains("dubious ownership"), "{}", stderr(&status));
    assert!(!marker.exists(), "root's git ran the job's fsmonitor");
    // The checkout's own repository is untouched, and root's.
    assert_eq!(owner(&ws.path().join(".git")), (0, 0));

    // A repository deeper than the protection looks refuses the idmap.
    let ws = root_checkout();
    assert!(git(ws.path(), &["init", "-q", "."]).status.success());
    std::fs::create_dir_all(ws.path().join("n/b/c/d")).unwrap();
    assert!(git(&ws.path().join("n/b/c/d"), &["init", "-q", "."]).status.success());
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("a repository, n/b/c/d/.git, that is not protected"), "{}", stderr(&out));
    // Named, it is protected, and the run goes on.
    let (out, _) =
        sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw", "--protect", "n/b/c/d/.git"], "echo ran");
    assert_eq!(stdout(&out), "ran\n", "{}", stderr(&out));
}

/// The second hostile review's ways around the first fixes: a `.git` made
/// at the top of a workspace that had none (R1), read-write binds, which
/// have no protection of their own (R2), and `--workspace .` from a
/// directory reached through a link (R6).
#[test]
fn second_review_repositories_in_new_places_and_a_linked_cwd() {
    if !root_sandbox() {
        return;
    }
    let git_status_refused = |dir: &Path| {
        let out = Command::new("git").current_dir(dir).arg("status").env("GIT_CONFIG_NOSYSTEM", "1").output().unwrap();
        !out.status.success() && stderr(&out).contains("dubious ownership")
    };
    let plant = "git init -q . && git config core.fsmonitor 'id > /dev/null; echo' && echo made";
    // R1: no .git at the start; the job makes one at the top.
    let ws = root_checkout();
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], plant);
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&ws.path().join(".git")), (65534, 65534));
    assert!(git_status_refused(ws.path()));

    // R2: a read-write bind holding a repository is refused; one without
    // is swept like the workspace.
    let repo = root_checkout();
    assert!(Command::new("git").current_dir(repo.path()).args(["init", "-q", "."]).status().unwrap().success());
    let spec = format!("{}:/proj", repo.path().display());
    let (out, _) = sh_status(&["--bind", &spec], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("it holds a repository, .git, that is not protected"), "{}", stderr(&out));
    let plain = root_checkout();
    let spec = format!("{}:/proj", plain.path().display());
    let (out, _) = sh_status(&["--bind", &spec], &format!("cd /proj && {plant}"));
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&plain.path().join(".git")), (65534, 65534));

    // R6: `cd ws/sub` where sub is a link, then `--workspace .`.
    let outer = root_checkout();
    let victim = root_checkout();
    let link = outer.path().join("sub");
    std::os::unix::fs::symlink(victim.path(), &link).unwrap();
    let out = Command::new(bin())
        .args(["run", "--workspace", ".", "--rw", "--", "/bin/sh", "-c", "echo x >> a; echo ran"])
        .current_dir(&link)
        .env("PWD", &link)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("symbolic link"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(victim.path().join("a")).unwrap(), "the repo's file\n");
}

/// Bare repositories (R3): git finds one by its contents from below, with
/// no `.git` name. One already in a read-write tree refuses the idmap;
/// one the job makes is handed to its ids after it.
#[test]
fn bare_repositories_are_refused_or_disowned() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    assert!(Command::new("git")
        .args(["init", "-q", "--bare"])
        .arg(ws.path().join("mirror.git"))
        .status()
        .unwrap()
        .success());
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("it holds a bare repository, mirror.git"), "{}", stderr(&out));

    let ws = root_checkout();
    std::fs::create_dir(ws.path().join("src")).unwrap();
    let script = "cd /workspace/src && git init -q --bare . && git config core.fsmonitor 'id; echo' && echo made";
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], script);
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&ws.path().join("src")), (65534, 65534), "the job's bare repository is still root's");
    let status =
        Command::new("git").current_dir(ws.path().join("src")).args(["rev-parse", "--git-dir"]).output().unwrap();
    assert!(!status.status.success() && stderr(&status).contains("dubious ownership"), "{}", stderr(&status));
}

/// R4: a repository nested deeper than any bound a walk might keep (here
/// 300 and 1,500 directories) is handed to the job's ids like any other.
#[test]
fn a_repository_made_deeper_than_any_bound_is_still_disowned() {
    if !root_sandbox() {
        return;
    }
    for depth in [300usize, 1500] {
        let ws = root_checkout();
        // Then a second branch beside the deep one, after it in the walk:
        // going back up past every level must still reach it.
        let script = format!(
            "i=0; while [ $i -lt {depth} ]; do mkdir d && cd d || exit 1; i=$((i+1)); done; mkdir .git; \
             cd /workspace && mkdir -p z/y && mkdir z/y/.git && echo made"
        );
        let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], &script);
        assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
        let deep: std::path::PathBuf = std::iter::repeat_n("d", depth).chain([".git"]).collect();
        assert_eq!(owner(&ws.path().join(&deep)), (65534, 65534), "depth {depth}: the deep .git is still root's");
        assert_eq!(owner(&ws.path().join("z/y/.git")), (65534, 65534), "depth {depth}: the later .git is root's");
    }
}

/// R5: when the supervisor is killed (SIGKILL, no chance to sweep) while
/// its job has made a repository, the next confine to start hands it to
/// the job's ids, from the record written before the job ran.
#[test]
fn a_repository_made_before_the_supervisor_was_killed_is_disowned_by_the_next_start() {
    if !root_sandbox() {
        return;
    }
    let ws = root_checkout();
    let started = ws.path().join("started");
    let mut cli = Command::new(bin())
        .args(["run", "--workspace", ws.path().to_str().unwrap(), "--rw", "--", "/bin/sh", "-c"])
        .arg("mkdir -p sub/.git && touch started && sleep 60")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&started);
    assert!(started.exists(), "the job did not start");
    assert_eq!(owner(&ws.path().join("sub/.git")), (0, 0), "a running job's files land as the owner's");
    cli.kill().unwrap();
    cli.wait().unwrap();
    // Any later start sweeps what the dead supervisor could not, once the
    // job's processes are gone (they die with it, a moment later).
    let mut swept = false;
    for _ in 0..50 {
        let out = run(&["--", "/bin/true"]);
        assert!(out.status.success(), "{}", stderr(&out));
        if owner(&ws.path().join("sub/.git")) == (65534, 65534) {
            swept = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(swept, "the .git made before the crash is still root's");
    let records = std::fs::read_dir("/var/lib/confine/sweeps").unwrap();
    let ours: Vec<_> = records
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| std::fs::read_to_string(e.path()).is_ok_and(|s| s.contains(ws.path().to_str().unwrap())))
        .collect();
    assert!(ours.is_empty(), "the record outlived its sweep: {:?}", ours.iter().map(|e| e.path()).collect::<Vec<_>>());
}

/// The third review's ways to a repository root's git trusts (F1–F3).
#[test]
fn third_review_repositories_git_finds_by_a_head_and_shared_directories() {
    if !root_sandbox() {
        return;
    }
    let fsmonitor = "printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = .\\n\\tfsmonitor = \"id; echo\"\\n' > config";
    // F1: a bare repository whose objects and refs are links (git follows them).
    let ws = root_checkout();
    std::fs::create_dir(ws.path().join("src")).unwrap();
    let script = format!(
        "cd /workspace/src && mkdir .o .r && ln -s .o objects && ln -s .r refs && echo 'ref: refs/heads/main' > HEAD \
         && {fsmonitor} && echo made"
    );
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], &script);
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&ws.path().join("src")), (65534, 65534), "F1: the linked bare repository is still root's");

    // F2a: the workspace's top made a repository.
    let ws = root_checkout();
    let script = format!("mkdir objects refs && echo 'ref: refs/heads/main' > HEAD && {fsmonitor} && echo made");
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], &script);
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(ws.path()), (65534, 65534), "F2a: the workspace made a repository and is still root's");

    // F2b: a bind that is a bare repository is refused a read-write idmap.
    let bare = tempfile::tempdir().unwrap();
    assert!(Command::new("git").args(["init", "-q", "--bare"]).arg(bare.path()).status().unwrap().success());
    let spec = format!("{}:/repo", bare.path().display());
    let (out, _) = sh_status(&["--bind", &spec], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert!(stderr(&out).contains("it is a repository itself"), "{}", stderr(&out));

    // F3: a root-owned directory the job made writable to others (where
    // any local user could finish a repository) is root's alone after it.
    let ws = root_checkout();
    std::fs::create_dir(ws.path().join("src")).unwrap();
    let (out, _) = sh_status(
        &["--workspace", ws.path().to_str().unwrap(), "--rw"],
        "chmod 0777 /workspace/src && mkdir -m 1777 /workspace/tmp && chmod 0777 /workspace/tmp && echo made",
    );
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    for d in ["src", "tmp"] {
        let mode = std::fs::metadata(ws.path().join(d)).unwrap().mode() & 0o7777;
        assert_eq!(mode & 0o022, 0, "F3: {d} is still writable by others ({mode:o})");
        assert_eq!(owner(&ws.path().join(d)), (0, 0));
    }
}

/// The fourth review (E1, E3): a refused read-write idmap sweeps nothing
/// (the tree was never the job's to write: its repositories are root's
/// own), and a directory of another owner's tree that the job opened to
/// others is that owner's alone after it.
#[test]
fn a_refused_idmap_sweeps_nothing_and_any_owner_s_open_directories_are_closed() {
    if !root_sandbox() {
        return;
    }
    let git = |dir: &Path, args: &[&str]| {
        assert!(Command::new("git").current_dir(dir).args(args).status().unwrap().success());
    };
    let ws = root_checkout();
    git(ws.path(), &["init", "-q", "."]);
    std::fs::create_dir_all(ws.path().join("n/b/c/d")).unwrap();
    git(&ws.path().join("n/b/c/d"), &["init", "-q", "."]);
    git(ws.path(), &["init", "-q", "--bare", "n/srv.git"]);
    std::fs::set_permissions(ws.path().join("n"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    let before = tree_attrs(ws.path());
    let (out, _) = sh_status(&["--workspace", ws.path().to_str().unwrap(), "--rw"], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(tree_attrs(ws.path()), before, "a refused run changed the tree");
    let bare = tempfile::tempdir().unwrap();
    git(bare.path(), &["init", "-q", "--bare", "."]);
    let (out, _) = sh_status(&["--bind", &format!("{}:/repo", bare.path().display())], "echo ran");
    assert_eq!(out.status.code(), Some(125), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(owner(bare.path()), (0, 0), "a refused bind was handed over");

    // E3: a tree of uid 1000's, bound read-write (idmapped onto the job).
    let user = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(user.path(), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(user.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let spec = format!("{}:/ud", user.path().display());
    let (out, _) = sh_status(&["--bind", &spec], "mkdir -m 0777 /ud/x && chmod 0777 /ud/x && echo made");
    assert_eq!(stdout(&out), "made\n", "{}", stderr(&out));
    assert_eq!(owner(&user.path().join("x")), (1000, 1000));
    let mode = std::fs::metadata(user.path().join("x")).unwrap().mode() & 0o7777;
    assert_eq!(mode & 0o022, 0, "E3: uid 1000's directory is still writable by others ({mode:o})");
}
