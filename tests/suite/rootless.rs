//! Rootless, as an unprivileged user made by the test (uid 65534): the
//! way out a refusal names works on this host, `confine exec
//! --allow-degraded` runs, and what nothing measured is `null`.

use crate::common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const NOBODY: u32 = 65534;

/// A directory that uid 65534 owns, with a copy of the binary it can run,
/// a repository and a confine.toml for `exec`.
struct Rootless {
    dir: tempfile::TempDir,
    bin: PathBuf,
    config: PathBuf,
}

impl Rootless {
    fn new() -> Option<Rootless> {
        if !is_root() {
            skip("needs root to switch to an unprivileged user for the test");
            return None;
        }
        if !sandbox_available() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path();
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = base.join("confine");
        std::fs::copy(common::bin(), &bin).unwrap();
        let repo = base.join("repo");
        std::fs::create_dir(&repo).unwrap();
        std::fs::write(repo.join("data.txt"), "repo data\n").unwrap();
        let config = base.join("confine.toml");
        std::fs::write(&config, exec_config(&base.join("store"), "demo", &repo)).unwrap();
        for p in [base.to_path_buf(), repo.clone(), repo.join("data.txt"), config.clone()] {
            std::os::unix::fs::chown(&p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        Some(Rootless { dir, bin, config })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn confine(&self, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&self.bin)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("XDG_DATA_HOME", self.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn exec(&self, extra: &[&str]) -> Output {
        let config = self.config.to_str().unwrap();
        let mut all = vec!["--config", config, "exec", "--json"];
        all.extend_from_slice(extra);
        all.extend(["--repo-id", "demo", "--runtime", "shell", "--code", "cat data.txt; id -u"]);
        self.confine(&all)
    }

    /// Whether this host has a cgroup this user may use (pure v2 with
    /// delegation): then nothing degrades and the test has less to see.
    fn has_cgroup(&self) -> bool {
        let out = self.confine(&["run", "--", "/bin/true"]);
        if stderr(&out).contains("clone namespaces") {
            panic!("unprivileged user namespaces are disabled here: {}", stderr(&out));
        }
        out.status.success()
    }
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {} / {}", stdout(out), stderr(out)))
}

/// Without a delegated cgroup, `exec` refuses with a way out; the way out
/// it names (`--allow-degraded`) works, the outcome names the missing
/// layer, and the usage nothing measured is `null`, not 0.
#[test]
fn exec_allow_degraded_works_rootless_and_unmeasured_usage_is_null() {
    let Some(r) = Rootless::new() else { return };
    if r.has_cgroup() {
        // Not a missing layer: nothing degrades on such a host.
        eprintln!("this host delegates a cgroup to uid 65534: nothing degrades, nothing to test");
        return;
    }
    let refused = r.exec(&[]);
    assert_eq!(refused.status.code(), Some(125), "{}", stderr(&refused));
    let v = json(&refused);
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("no cgroup is delegated to uid 65534") && err.contains("--allow-degraded"), "{err}");
    if !Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        // Hybrid or v1: systemd can't hand a user v1 controllers, so the
        // hint must not send them there.
        assert!(!err.contains("systemd-run"), "{err}");
    }

    let out = r.exec(&["--allow-degraded"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["status"], "success", "{v}");
    let o = &v["outcome"];
    assert_eq!(o["layers"]["missing"], serde_json::json!(["cgroup"]), "{o}");
    assert_eq!(o["layers"]["hostUid"], NOBODY, "{o}");
    for k in ["cpuUserMs", "cpuSysMs", "peakMemoryBytes", "pidsPeak"] {
        assert!(o["usage"][k].is_null(), "{k} was not measured, so it must be null: {o}");
    }
    assert_eq!(o["guarantees"]["memory"]["level"], "partial", "{o}");
    let handle = v["artifactHandle"].as_str().unwrap();
    let shown = r.confine(&["--config", r.config.to_str().unwrap(), "artifacts", "show", handle, "--stream", "stdout"]);
    assert!(stdout(&shown).starts_with("repo data\n"), "{} / {}", stdout(&shown), stderr(&shown));
}

/// `confine run --allow-degraded`: the status file says null for what no
/// cgroup counted. As root, with a cgroup, the same fields are numbers.
#[test]
fn run_status_has_null_usage_without_a_cgroup_and_numbers_with_one() {
    let Some(r) = Rootless::new() else { return };
    if r.has_cgroup() {
        // Not a missing layer: nothing degrades on such a host.
        eprintln!("this host delegates a cgroup to uid 65534: nothing degrades, nothing to test");
        return;
    }
    let st = r.path().join("status.json");
    let out = r.confine(&["run", "--allow-degraded", "--json-status", st.to_str().unwrap(), "--", "/bin/echo", "hi"]);
    assert_eq!(stdout(&out), "hi\n", "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    for k in ["cpuUserMs", "cpuSysMs", "peakMemoryBytes", "pidsPeak"] {
        assert!(v["usage"][k].is_null(), "{k}: {v}");
    }

    let root_st = r.path().join("root.json");
    let out = run(&["--json-status", root_st.to_str().unwrap(), "--", "/bin/echo", "hi"]);
    assert_eq!(stdout(&out), "hi\n", "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&root_st).unwrap()).unwrap();
    for k in ["cpuUserMs", "cpuSysMs", "peakMemoryBytes", "pidsPeak"] {
        assert!(v["usage"][k].is_u64(), "{k}: {v}");
    }
}

/// Rootless, where pid 1's root is out of the supervisor's reach, a full
/// /tmp is still named (pid 1 measures it as the job ends), and the job's
/// own ptys work.
#[test]
fn rootless_names_a_full_tmp_and_has_ptys() {
    let Some(r) = Rootless::new() else { return };
    let st = r.path().join("status.json");
    let script = "head -c 2000000 /dev/zero > /tmp/big; python3 -c 'import os; print(os.ttyname(os.openpty()[1]))'";
    let limits = ["--memory", "unlimited", "--cpus", "unlimited", "--pids", "unlimited", "--allow-degraded"];
    let mut args = vec!["run", "--tmp-size", "1M", "--json-status", st.to_str().unwrap()];
    args.extend(limits);
    args.extend(["--", "/bin/sh", "-c", script]);
    let out = r.confine(&args);
    assert_eq!(stdout(&out), "/dev/pts/0\n", "{}", stderr(&out));
    assert!(stderr(&out).contains("/tmp (also the job's HOME) was full"), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    assert_eq!(v["tmpFull"]["outOf"], "space", "{v}");
}

/// Rootless doctor names only ways out that work on this host: no
/// systemd-run where no user manager is reachable or the controllers are
/// v1's; `--allow-degraded`, which the tests above run, instead.
#[test]
fn rootless_doctor_names_only_ways_out_that_work_here() {
    let Some(r) = Rootless::new() else { return };
    let out = r.confine(&["doctor"]);
    let text = stdout(&out) + &stderr(&out);
    let pure_v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let bus = Path::new("/run/user/65534/bus").exists();
    if !pure_v2 || !bus {
        assert!(!text.contains("systemd-run"), "{text}");
    }
    if !r.has_cgroup() {
        assert!(text.contains("--allow-degraded"), "{text}");
        assert!(text.contains("no cgroup of this process is writable by uid 65534"), "{text}");
    }
}

/// Rootless, the host's `/` can't be bound alone (only a copy made as
/// host root leaves the file systems below it, and their sockets, out):
/// refused, with what to do, rather than bound with all of them.
#[test]
fn the_hosts_root_is_refused_rootless() {
    let Some(r) = Rootless::new() else { return };
    let out = r.confine(&["run", "--allow-degraded", "--ro-bind", "/:/host", "--", "/bin/true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the host's whole root is not bound") && err.contains("bind the directories the job needs"),
        "{err}"
    );
}
