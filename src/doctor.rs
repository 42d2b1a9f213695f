//! `confine doctor`: what this host can enforce, found by asking the kernel
//! (a real user namespace, a real sandbox run), not by guessing from
//! versions. Each finding carries a fix hint when it is missing.
//!
//! This module only reads and probes; it changes nothing on the host.

use crate::job::{LandlockLayer, Layers};
use crate::sandbox::{BackendKind, Guarantees};
use serde::Serialize;

/// One line of the doctor's table.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to fix it, when `ok` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// Whether full isolation needs this check to pass.
    pub required: bool,
}

/// All findings, and whether full isolation is available.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub backend: String,
    pub full_isolation: bool,
    /// What the backend guarantees on this host, row by row.
    pub guarantees: Guarantees,
    pub checks: Vec<Check>,
}

fn check(name: &str, ok: bool, detail: impl Into<String>, fix: &str, required: bool) -> Check {
    Check { name: name.into(), ok, detail: detail.into(), fix: if ok { None } else { Some(fix.into()) }, required }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Gather every finding. `smoke` runs `confine run -- /bin/true` with the
/// given binary, the truest test of all.
pub fn diagnose(smoke: Option<&std::path::Path>) -> Report {
    let mut checks = Vec::new();
    let uname = nix::sys::utsname::uname().ok();
    let release = uname.as_ref().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    checks.push(check("kernel", true, format!("Linux {release}"), "", false));
    let root = nix::unistd::geteuid().is_root();
    checks.push(check(
        "root",
        root,
        if root { "running as root".to_string() } else { format!("running as uid {}", nix::unistd::geteuid()) },
        &format!(
            "rootless mode works through unprivileged user namespaces; for cgroup limits, {}",
            crate::sandbox::linux::cgroup::rootless_hint()
        ),
        false,
    ));
    checks.push(userns_check());
    checks.push(nested_userns_check());
    if let Some(c) = apparmor_check(root) {
        checks.push(c);
    }
    let abi = crate::sandbox::linux::landlock::kernel_abi();
    checks.push(check(
        "landlock",
        abi >= 1,
        if abi >= 1 {
            format!("ABI {abi} (confine enforces up to ABI {})", crate::sandbox::linux::landlock::TARGET_ABI as u32)
        } else {
            "not available".to_string()
        },
        "boot with landlock in the LSM list (lsm=landlock,… on the kernel command line; Linux ≥ 5.13)",
        true,
    ));
    checks.push(seccomp_check());
    checks.extend(cgroup_checks(root));
    if root {
        checks.extend(supervisor_cgroup_check());
        checks.extend(git_bare_repository_check());
    }
    if let Some(bin) = smoke {
        checks.push(smoke_check(bin));
        checks.push(idmap_check(bin, root));
    }
    let full_isolation = checks.iter().all(|c| c.ok || !c.required);
    let guarantees = Guarantees::of(BackendKind::Linux, &host_layers(&checks, abi));
    Report { backend: "linux".into(), full_isolation, guarantees, checks }
}

/// The layers a job of the Linux backend would get on this host, as the
/// checks found them (a check that was not made counts as passed).
fn host_layers(checks: &[Check], landlock_abi: u32) -> Layers {
    let ok = |name: &str| checks.iter().find(|c| c.name == name).is_none_or(|c| c.ok);
    let ns = ok("user namespaces") && ok("apparmor userns restriction");
    let target = crate::sandbox::linux::landlock::TARGET_ABI as u32;
    let status = crate::sandbox::linux::landlock::expected_status(landlock_abi);
    Layers {
        userns: ns,
        mountns: ns,
        pidns: ns,
        netns: ns,
        ipcns: ns,
        utsns: ns,
        cgroupns: ns,
        landlock: LandlockLayer { abi: landlock_abi.min(target), status: status.into(), skipped: Vec::new() },
        seccomp: ok("seccomp").then(|| "default.json".to_string()),
        // The layer name a job would report (`cgroup::Job::layer`): the
        // layout's first word, and how its tree would be killed.
        cgroup: (ok("cgroup layout") && ok("cgroup limits")).then(|| {
            let detail = checks.iter().find(|c| c.name == "cgroup layout").map_or("", |c| c.detail.as_str());
            let kill = detail.contains("cgroup.kill");
            let layer = match (detail.split([' ', ';']).next().unwrap_or(""), kill) {
                ("v2", true) => "v2",
                ("v2", false) => "v2-freeze",
                ("hybrid", true) => "v1+unified-kill",
                (_, false) if !detail.contains("freezer") => "v1-signal",
                _ => "v1",
            };
            layer.to_string()
        }),
        caps_dropped: ns,
        no_new_privs: true,
        mounts_locked: ns && ok("nested user namespaces"),
        ..Layers::default()
    }
}

/// Doctor's report for another backend than the Linux sandbox (chosen in
/// confine.toml): the host checks stay, but full isolation is not what
/// jobs get, and the guarantees are that backend's.
pub fn for_backend(mut report: Report, kind: BackendKind, source: &str) -> Report {
    use crate::sandbox::Backend;
    if kind == BackendKind::Linux {
        return report;
    }
    report.checks.push(check(
        "backend",
        false,
        format!("runtime.backend = \"{}\" in {source}: weaker than full isolation", kind.name()),
        "set runtime.backend = \"auto\" to run jobs in the Linux sandbox",
        true,
    ));
    report.backend = kind.name().into();
    report.full_isolation = false;
    report.guarantees = Guarantees::of(kind, &Layers::default());
    report
}

fn userns_check() -> Check {
    let max = read_trim("/proc/sys/user/max_user_namespaces").and_then(|s| s.parse::<u64>().ok());
    let debian_knob = read_trim("/proc/sys/kernel/unprivileged_userns_clone");
    let probe = probe_unshare_user();
    let mut detail = match &probe {
        Ok(()) => "a new user namespace can be created".to_string(),
        Err(e) => format!("unshare(CLONE_NEWUSER) failed: {e}"),
    };
    if let Some(max) = max {
        detail.push_str(&format!("; max_user_namespaces={max}"));
    }
    if let Some(k) = &debian_knob {
        detail.push_str(&format!("; unprivileged_userns_clone={k}"));
    }
    check(
        "user namespaces",
        probe.is_ok() && max != Some(0),
        detail,
        "sysctl -w user.max_user_namespaces=15000 (and kernel.unprivileged_userns_clone=1 on older Debian)",
        true,
    )
}

/// The job runs in a user namespace nested in the sandbox's, which locks
/// the sandbox's mounts: made by a process that holds its capabilities
/// only in a user namespace of its own, as pid 1 does, and used with a
/// capability there (an LSM may grant the namespace but not those).
fn nested_userns_check() -> Check {
    let probe = probe_nested_userns();
    check(
        "nested user namespaces",
        probe.is_ok(),
        match &probe {
            Ok(()) => "a user namespace can be made and used inside another: the job's mounts are locked".to_string(),
            Err(e) => format!("{e}: jobs fail unless degraded runs are allowed, and then their mounts are not locked"),
        },
        "raise user.max_user_namespaces; on Ubuntu, install an AppArmor profile granting `userns,` to the confine \
         binary, or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        true,
    )
}

/// A child makes a user namespace and maps its ids there, then makes one
/// inside it and uses a capability of that one (setgroups), as the
/// sandbox's pid 1 and its job do.
fn probe_nested_userns() -> Result<(), NestedProbeError> {
    const STEPS: [&str; 6] = [
        "unshare(CLONE_NEWUSER)",
        "deny setgroups",
        "map the uid",
        "map the gid",
        "a nested unshare(CLONE_NEWUSER)",
        "deny setgroups in the nested namespace (a capability there)",
    ];
    // SAFETY: doctor runs before any runtime or thread is started, so the
    // child of this fork may run ordinary code; it makes namespaces,
    // writes its own /proc files and calls _exit.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
            let newuser = || nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER);
            let write = |file: &str, content: String| std::fs::write(format!("/proc/self/{file}"), content);
            // The exit code is the number of the step refused (1-based).
            let probe = || -> Result<(), i32> {
                newuser().map_err(|_| 1)?;
                write("setgroups", "deny".into()).map_err(|_| 2)?;
                write("uid_map", format!("{uid} {uid} 1")).map_err(|_| 3)?;
                write("gid_map", format!("{gid} {gid} 1")).map_err(|_| 4)?;
                newuser().map_err(|_| 5)?;
                write("setgroups", "deny".into()).map_err(|_| 6)
            };
            let code = probe().err().unwrap_or(0);
            // SAFETY: _exit is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, step)) => {
                Err(NestedProbeError::Step(STEPS.get(step as usize - 1).copied().unwrap_or("a step")))
            }
            Ok(other) => Err(NestedProbeError::Probe(ProbeError::Ended(other))),
            Err(e) => Err(NestedProbeError::Probe(ProbeError::Wait(e))),
        },
        Err(e) => Err(NestedProbeError::Probe(ProbeError::Fork(e))),
    }
}

/// Why the nested probe failed.
#[derive(Debug, thiserror::Error)]
enum NestedProbeError {
    #[error("refused at: {0}")]
    Step(&'static str),
    #[error("{0}")]
    Probe(ProbeError),
}

/// Ubuntu 23.10+ lets unprivileged processes create a user namespace but
/// strips its capabilities, so mounts inside fail later.
fn apparmor_check(root: bool) -> Option<Check> {
    let knob = read_trim("/proc/sys/kernel/apparmor_restrict_unprivileged_userns")?;
    let restricted = knob == "1";
    Some(check(
        "apparmor userns restriction",
        !restricted || root,
        format!("kernel.apparmor_restrict_unprivileged_userns={knob}{}", if root { " (root is exempt)" } else { "" }),
        "install an AppArmor profile granting `userns,` to the confine binary (see README), \
         or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        !root,
    ))
}

/// Why a child could not make a user namespace.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// unshare's errno, described alone (the check's text names the call).
    #[error("{}", .0.desc())]
    Unshare(nix::errno::Errno),
    #[error("probe ended as {0:?}")]
    Ended(nix::sys::wait::WaitStatus),
    #[error("{0}")]
    Wait(nix::errno::Errno),
    #[error("fork: {0}")]
    Fork(nix::errno::Errno),
}

fn probe_unshare_user() -> Result<(), ProbeError> {
    // SAFETY: doctor runs before any runtime or thread is started, so the
    // child of this fork may run ordinary code; it only calls unshare and
    // _exit.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = match nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
                Ok(()) => 0,
                Err(e) => e as i32,
            };
            // SAFETY: _exit is async-signal-safe and ends the child at once.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => match nix::sys::wait::waitpid(child, None) {
            Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(()),
            Ok(nix::sys::wait::WaitStatus::Exited(_, e)) => Err(ProbeError::Unshare(nix::errno::Errno::from_raw(e))),
            Ok(other) => Err(ProbeError::Ended(other)),
            Err(e) => Err(ProbeError::Wait(e)),
        },
        Err(e) => Err(ProbeError::Fork(e)),
    }
}

fn seccomp_check() -> Check {
    let actions = read_trim("/proc/sys/kernel/seccomp/actions_avail");
    let lib = libseccomp::ScmpVersion::current().map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro)).ok();
    let ok = actions.as_deref().is_some_and(|a| a.contains("errno")) && lib.is_some();
    check(
        "seccomp",
        ok,
        format!(
            "filter actions: {}; libseccomp {}",
            actions.as_deref().unwrap_or("none (CONFIG_SECCOMP_FILTER off)"),
            lib.as_deref().unwrap_or("missing")
        ),
        "install libseccomp (apt-get install libseccomp2) on a kernel built with CONFIG_SECCOMP_FILTER",
        true,
    )
}

/// As root: whether a user owns a cgroup above this process (`sudo
/// confine` from a desktop session runs in `user@UID.service`): that user
/// could then freeze or kill the supervisor before the sweep of a
/// read-write workspace (docs/threat-model.md).
fn supervisor_cgroup_check() -> Option<Check> {
    use crate::sandbox::linux::cgroup::layout::Layout;
    use std::os::unix::fs::MetadataExt;
    let layout = Layout::from_proc(std::path::Path::new("/proc")).ok()?;
    let unified = layout.unified()?;
    let mut dir = unified.dir_of(&unified.own)?;
    let mut owner = None;
    loop {
        if let Ok(m) = std::fs::symlink_metadata(&dir) {
            if m.uid() != 0 {
                owner = Some((dir.clone(), m.uid()));
            }
        }
        if dir == unified.mount_point || !dir.pop() {
            break;
        }
    }
    Some(match owner {
        None => check(
            "supervisor cgroup",
            true,
            format!("{} (v2) and its parents are root's", unified.own.display()),
            "",
            false,
        ),
        Some((dir, uid)) => check(
            "supervisor cgroup",
            false,
            format!("{} is uid {uid}'s: that user can freeze or kill a root supervisor", dir.display()),
            "run root's confine from a root-owned unit (a CI runner's service, or systemd-run --pipe --wait confine …)",
            false,
        ),
    })
}

/// As root, with git installed: whether root's git refuses bare
/// repositories it was not pointed at (`safe.bareRepository=explicit`),
/// the general defence against a repository a job or a local user made
/// where root runs git (docs/threat-model.md).
fn git_bare_repository_check() -> Option<Check> {
    let git = ["/usr/bin/git", "/bin/git"].into_iter().find(|g| std::path::Path::new(g).exists())?;
    let out = std::process::Command::new(git)
        .args(["config", "--system", "--get", "safe.bareRepository"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let value = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let ok = value == "explicit";
    Some(check(
        "git bare repositories",
        ok,
        if ok { "safe.bareRepository = explicit".to_string() } else { format!("safe.bareRepository = {}", if value.is_empty() { "all (git's default)" } else { &value }) },
        "git config --system safe.bareRepository explicit (root's git then never uses a bare repository a job made in a workspace)",
        false,
    ))
}

fn cgroup_checks(root: bool) -> Vec<Check> {
    use crate::sandbox::linux::cgroup::layout::{Layout, LayoutKind, Version};
    let Ok(layout) = Layout::from_proc(std::path::Path::new("/proc")) else {
        return vec![check("cgroups", false, "cannot read /proc/self/cgroup", "mount /proc", true)];
    };
    let kind = match layout.kind() {
        Some(LayoutKind::V1) => "v1",
        Some(LayoutKind::V2) => "v2",
        Some(LayoutKind::Hybrid) => "hybrid (v1 controllers + v2 unified)",
        None => "none",
    };
    let mut controllers: Vec<String> = layout
        .hierarchies
        .iter()
        .filter(|h| h.version == Version::V1)
        .flat_map(|h| h.controllers.clone())
        .filter(|c| !c.starts_with("name="))
        .collect();
    if let Some(u) = layout.unified() {
        if let Some(own) = u.dir_of(&u.own) {
            if let Some(list) =
                std::fs::read_to_string(own.join("cgroup.controllers")).ok().filter(|l| !l.trim().is_empty())
            {
                controllers.extend(list.split_whitespace().map(|c| format!("{c} (v2)")));
            }
            if own.join("cgroup.kill").exists() {
                controllers.push("cgroup.kill (v2)".into());
            }
        }
    }
    let needed = ["memory", "cpu", "pids"];
    let have = |c: &str| {
        layout.v1(c).is_some()
            || layout.unified().and_then(|u| u.dir_of(&u.own)).is_some_and(|d| {
                std::fs::read_to_string(d.join("cgroup.controllers"))
                    .is_ok_and(|l| l.split_whitespace().any(|x| x == c))
            })
    };
    let missing: Vec<&str> = needed.iter().copied().filter(|c| !have(c)).collect();
    let writable: Vec<String> = layout
        .hierarchies
        .iter()
        .filter_map(|h| h.dir_of(&h.own).map(|d| (h.label(), d)))
        .filter(|(_, d)| nix::unistd::access(d, nix::unistd::AccessFlags::W_OK).is_ok())
        .map(|(l, _)| l)
        .collect();
    vec![
        check(
            "cgroup layout",
            kind != "none",
            format!("{kind}; controllers: {}", controllers.join(" ")),
            "mount cgroup2 at /sys/fs/cgroup (systemd does this by default)",
            true,
        ),
        check(
            "cgroup limits",
            missing.is_empty() && !writable.is_empty(),
            if missing.is_empty() {
                if writable.is_empty() {
                    format!(
                        "memory, cpu and pids available, but no cgroup of this process is writable by uid {}",
                        nix::unistd::geteuid()
                    )
                } else {
                    format!("memory, cpu and pids available; writable here: {}", writable.join(" "))
                }
            } else {
                format!("missing controllers: {}", missing.join(", "))
            },
            &if root {
                "enable the memory, cpu and pids controllers (cgroup_enable=memory on the kernel command line)"
                    .to_string()
            } else {
                crate::sandbox::linux::cgroup::rootless_hint()
            },
            true,
        ),
    ]
}

fn smoke_check(bin: &std::path::Path) -> Check {
    // The built-in defaults (/dev/null is an empty config): the smoke test
    // is of the full sandbox, whatever confine.toml allows or chooses.
    let out = std::process::Command::new(bin)
        .args(["--config", "/dev/null", "run", "--backend", "linux", "--", "/bin/true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .output();
    let (ok, detail) = match out {
        Ok(o) if o.status.success() => (true, "confine run -- /bin/true succeeded with every layer".to_string()),
        Ok(o) => (false, String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => (false, e.to_string()),
    };
    check("sandbox smoke test", ok, detail, "fix the first ✗ above; then rerun confine doctor", true)
}

/// Whether a workspace here (the current directory, as `--workspace .`
/// would bind it) is shown to jobs as their own through an idmapped
/// mount, asked of a real run; not required: without it, a workspace
/// works when the job's uid may use it (see docs/design.md).
fn idmap_check(bin: &std::path::Path, root: bool) -> Check {
    const NAME: &str = "idmapped workspaces";
    const FIX: &str = "keep workspaces on a file system with idmapped mounts (ext4, xfs, btrfs; tmpfs from Linux \
                       6.3), or make them usable by the uid jobs run as";
    if !root {
        return check(
            NAME,
            false,
            "rootless: a workspace is bound as it is (only root can idmap a host file system); yours work",
            "run confine as root for root-owned or other users' workspaces",
            false,
        );
    }
    let Ok(cwd) = std::env::current_dir() else {
        return check(NAME, false, "no current directory to probe", FIX, false);
    };
    let dir = std::env::temp_dir().join(format!("confine-doctor-{}", std::process::id()));
    if let Err(e) = std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(&dir) {
        return check(NAME, false, format!("could not make {}: {e}", dir.display()), FIX, false);
    }
    let status = dir.join("status.json");
    let out = std::process::Command::new(bin)
        // Degraded runs allowed: this probe is about the workspace, and a
        // kernel without landlock is the smoke test's to report.
        .args(["--config", "/dev/null", "run", "--backend", "linux", "--allow-degraded", "--workspace"])
        .arg(&cwd)
        .arg("--json-status")
        .arg(&status)
        .args(["--", "/bin/true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .output();
    let layers = std::fs::read(&status)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|v| v["layers"].clone());
    let _ = std::fs::remove_dir_all(&dir);
    let here = cwd.display();
    match (out, layers) {
        (Ok(_), Some(l)) if l["idmapped"].is_array() => {
            check(NAME, true, format!("{here} is idmapped: its owner's files are the job's own"), FIX, false)
        }
        (Ok(_), Some(l)) => match l["notIdmapped"][0].as_str() {
            Some(why) => {
                let why = why.strip_prefix("/workspace: ").unwrap_or(why);
                check(NAME, false, format!("{here} is bound as it is: {why}"), FIX, false)
            }
            None => check(NAME, true, format!("{here} needs none: it belongs to the uid jobs run as"), FIX, false),
        },
        (Ok(o), None) => check(NAME, false, String::from_utf8_lossy(&o.stderr).trim().to_string(), FIX, false),
        (Err(e), _) => check(NAME, false, e.to_string(), FIX, false),
    }
}

/// The human table: one line per check, with a fix hint under each ✗.
pub fn render(report: &Report) -> String {
    let width = report.checks.iter().map(|c| c.name.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for c in &report.checks {
        let mark = if c.ok {
            "✓"
        } else if c.required {
            "✗"
        } else {
            "-"
        };
        out.push_str(&format!("{mark} {:width$}  {}\n", c.name, c.detail));
        if let Some(fix) = &c.fix {
            out.push_str(&format!("  {:width$}  fix: {fix}\n", ""));
        }
    }
    out.push_str(&format!("\nbackend: {}; what it guarantees here:\n", report.backend));
    out.push_str(&report.guarantees.render());
    out.push_str(if report.full_isolation {
        "\nfull isolation is available (backend: linux)\n"
    } else if report.backend != "linux" {
        "\nfull isolation is NOT what jobs get: the backend is weaker (runs need allow_degraded)\n"
    } else {
        "\nfull isolation is NOT available: confine refuses to run jobs unless --allow-degraded is given\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_isolation_needs_every_required_check() {
        let report = |ok: bool, required: bool| Report {
            backend: "linux".into(),
            guarantees: Guarantees::default(),
            full_isolation: [check("a", true, "", "", true), check("b", ok, "", "do x", required)]
                .iter()
                .all(|c| c.ok || !c.required),
            checks: vec![check("b", ok, "found", "do x", required)],
        };
        assert!(report(true, true).full_isolation);
        assert!(!report(false, true).full_isolation);
        assert!(report(false, false).full_isolation);
        let text = render(&report(false, true));
        assert!(text.contains("✗ b") && text.contains("fix: do x"), "{text}");
    }

    #[test]
    fn guarantees_follow_the_checks() {
        let all_ok = ["user namespaces", "seccomp", "cgroup layout", "cgroup limits"]
            .map(|n| check(n, true, "", "", true))
            .to_vec();
        let target = crate::sandbox::linux::landlock::TARGET_ABI as u32;
        let g = Guarantees::of(BackendKind::Linux, &host_layers(&all_ok, target));
        for (name, row) in g.rows() {
            assert_eq!(row.level, crate::sandbox::Level::Enforced, "{name}: {}", row.how);
        }
        let layout = |detail: &str| {
            let mut c = all_ok.clone();
            c[2].detail = detail.into();
            Guarantees::of(BackendKind::Linux, &host_layers(&c, target)).tree_kill.how
        };
        assert!(layout("v2; controllers: memory (v2), cgroup.kill (v2)").starts_with("cgroup.kill"));
        assert!(layout("v2; controllers: memory (v2)").starts_with("cgroup freeze"), "5.10: no cgroup.kill");
        assert!(layout("v1; controllers: memory freezer").starts_with("cgroup freeze"));
        assert!(layout("v1; controllers: memory pids").starts_with("SIGKILL of what"));
        let mut no_cgroup = all_ok.clone();
        no_cgroup[3].ok = false;
        let g = Guarantees::of(BackendKind::Linux, &host_layers(&no_cgroup, 0));
        assert_eq!(g.memory.level, crate::sandbox::Level::Partial);
        assert_eq!(g.filesystem.level, crate::sandbox::Level::Partial);
    }

    #[test]
    fn a_configured_fallback_backend_is_named_with_its_guarantees() {
        let base = Report {
            backend: "linux".into(),
            full_isolation: true,
            guarantees: Guarantees::default(),
            checks: vec![check("kernel", true, "Linux", "", false)],
        };
        let r = for_backend(base, BackendKind::UnixFallback, "/etc/confine.toml");
        assert_eq!(r.backend, "unix-fallback");
        assert!(!r.full_isolation);
        assert_eq!(r.guarantees.network.level, crate::sandbox::Level::None);
        let text = render(&r);
        assert!(text.contains("backend: unix-fallback"), "{text}");
        assert!(text.contains("✗ backend") && text.contains("runtime.backend = \"auto\""), "{text}");
        assert!(text.contains("treeKill"), "{text}");
    }
}
