use super::*;
use crate::sandbox::identity;

#[test]
fn the_stage_environment_sets_the_marker() {
    assert_eq!(INIT_MARKER_ENV.to_str().unwrap(), format!("{INIT_MARKER}=1"));
}

/// A program that embeds the library and re-executes itself as the
/// init stage without dispatching `__init` must fail, not recurse.
#[test]
fn an_undispatched_init_stage_refuses_to_spawn() {
    const NAME: &str = "sandbox::linux::tests::an_undispatched_init_stage_refuses_to_spawn";
    if std::env::var_os(INIT_MARKER).is_some() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let spec = JobSpec::new(vec!["true".into()]);
        let err = rt.block_on(spawn(&spec, StdioSpec::piped(), None)).err().expect("spawn must refuse");
        assert!(err.to_string().contains("__init"), "{err}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--test-threads=1"])
        .env(INIT_MARKER, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("1 passed"), "{text}{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn landlock_follows_the_mount_plan() {
    let mut spec = JobSpec::new(vec!["true".into()]);
    spec.workspace = Some("/w".into());
    spec.workspace_rw = true;
    let ops = vec![
        MountOp::Bind {
            src: "/usr".into(),
            dst: "/usr".into(),
            rw: false,
            dev: false,
            optional: true,
            exact: false,
            idmap: None,
            workspace: false,
        },
        MountOp::Bind {
            src: "/w".into(),
            dst: "/workspace".into(),
            rw: true,
            dev: false,
            optional: false,
            exact: true,
            idmap: None,
            workspace: false,
        },
        MountOp::Bind {
            src: "/dev/null".into(),
            dst: "/dev/null".into(),
            rw: true,
            dev: true,
            optional: false,
            exact: false,
            idmap: None,
            workspace: false,
        },
    ];
    let plan = landlock_plan(&ops, &spec);
    assert!(plan.read.contains(&"/usr".into()));
    assert!(plan.write.contains(&"/workspace".into()));
    assert!(!plan.write.contains(&"/dev/null".into()), "devices get their own narrow rule");
    assert!(plan.scope, "abstract unix sockets and signals stay within the sandbox");
}

#[test]
fn rlimits_back_the_cgroup_or_stand_in_for_it() {
    let limits = crate::job::Limits {
        memory_bytes: Some(64 << 20),
        pids: Some(10),
        cpu_time_ms: Some(1500),
        tmp_size_bytes: 1 << 20,
        ..crate::job::Limits::default()
    };
    let with = limit_rlimits(&limits, true);
    assert_eq!(with, vec![protocol::Rlimit { resource: libc::RLIMIT_CPU as i32, soft: 3, hard: 4 }]);
    let without = limit_rlimits(&limits, false);
    let get = |r: i32| without.iter().find(|l| l.resource == r).map(|l| (l.soft, l.hard));
    assert_eq!(get(libc::RLIMIT_CPU as i32), Some((2, 3)));
    assert_eq!(get(libc::RLIMIT_AS as i32), Some((64 << 20, 64 << 20)));
    assert_eq!(get(libc::RLIMIT_NPROC as i32), Some((10, 10)));
    assert_eq!(get(libc::RLIMIT_FSIZE as i32), Some((1 << 20, 1 << 20)));
    assert!(limit_rlimits(&crate::job::Limits::default(), false).is_empty());
}

/// A host made of a table: each path's symlink target (None: not a link)
/// and owner, and our effective ids. Paths not in it do not exist.
struct FakeHost {
    ids: (u32, u32),
    paths: std::collections::BTreeMap<&'static str, (Option<&'static str>, (u32, u32))>,
}

impl FakeHost {
    /// A merged-/usr host, with a user's project, root's CI checkout and
    /// a user's tool, run by `ids`.
    fn new(ids: (u32, u32)) -> FakeHost {
        let paths = [
            ("/usr", (None, (0, 0))),
            ("/etc", (None, (0, 0))),
            ("/bin", (Some("usr/bin"), (0, 0))),
            ("/sbin", (Some("usr/sbin"), (0, 0))),
            ("/lib", (Some("usr/lib"), (0, 0))),
            ("/lib64", (Some("usr/lib64"), (0, 0))),
            ("/home/alice/project", (None, (1000, 1000))),
            ("/srv/ci/checkout", (None, (0, 0))),
            ("/opt/tool", (None, (1000, 1000))),
            ("/tmp/ci/checkout", (None, (1000, 1000))),
            ("/", (None, (0, 0))),
        ];
        FakeHost { ids, paths: paths.into_iter().collect() }
    }
}

impl mounts::HostFs for FakeHost {
    fn symlink_target(&self, path: &std::path::Path) -> std::io::Result<Option<PathBuf>> {
        match self.paths.get(path.to_str().unwrap_or("")) {
            Some((link, _)) => Ok(link.map(PathBuf::from)),
            None => Err(std::io::ErrorKind::NotFound.into()),
        }
    }
}

impl Host for FakeHost {
    fn effective_ids(&self) -> (u32, u32) {
        self.ids
    }

    fn owner(&self, path: &std::path::Path) -> Option<(u32, u32)> {
        self.paths.get(path.to_str().unwrap_or("")).map(|(_, owner)| *owner)
    }

    fn userns_owner(&self) -> u32 {
        namespaces::USERNS_OWNER_BASE + 7
    }
}

const ROOT: (u32, u32) = (0, 0);
const ALICE: (u32, u32) = (1000, 1000);

/// `spec`'s init spec on `host`, against `golden/<name>.json`.
fn golden(name: &str, spec: &JobSpec, host: &FakeHost) -> InitSpec {
    let init = init_spec_on(spec, host);
    let text = serde_json::to_string_pretty(&init).unwrap();
    crate::golden::check("src/sandbox/linux/golden", &format!("{name}.json"), &text);
    init
}

fn job(argv: &[&str]) -> JobSpec {
    JobSpec::new(argv.iter().map(|a| a.to_string()).collect())
}

/// As root, with no workspace: the job is nobody, its user namespace has
/// an owner of its own, merged-/usr links are links and what is missing
/// is left out.
#[test]
fn golden_a_plain_job_as_root() {
    let init = golden("plain_as_root", &job(&["true"]), &FakeHost::new(ROOT));
    assert_eq!((init.uid.outside, init.gid.outside), (identity::NOBODY, identity::NOBODY));
    assert!(!init.rootless && init.userns_owner.is_some());
}

/// Rootless, the job has our ids and its own workspace is bound as is.
#[test]
fn golden_a_rootless_job_in_its_own_workspace() {
    let mut spec = job(&["make"]);
    spec.workspace = Some("/home/alice/project".into());
    spec.workspace_rw = true;
    spec.cwd = "/workspace".into();
    let init = golden("rootless_own_workspace", &spec, &FakeHost::new(ALICE));
    assert!(init.rootless && init.userns_owner.is_none());
    assert_eq!((init.uid.outside, init.gid.outside), ALICE);
    assert!(!init.mounts.iter().any(|op| matches!(op, MountOp::Bind { idmap: Some(_), .. })));
}

/// As root, a user's workspace: the job is that user with `nogroup`, so
/// the workspace (the user's group too) is idmapped onto it; root's CI
/// checkout makes the job nobody and is idmapped from root.
#[test]
fn golden_a_workspace_of_another_owner_is_idmapped() {
    let mut spec = job(&["make"]);
    spec.workspace = Some("/home/alice/project".into());
    spec.workspace_rw = true;
    let init = golden("root_user_workspace", &spec, &FakeHost::new(ROOT));
    assert_eq!((init.uid.outside, init.gid.outside), (1000, identity::NOBODY));
    let idmap_of = |init: &InitSpec| {
        init.mounts.iter().find_map(|op| match op {
            MountOp::Bind { dst, idmap, .. } if dst == std::path::Path::new("/workspace") => Some(*idmap),
            _ => None,
        })
    };
    assert_eq!(idmap_of(&init), Some(Some(ALICE)));
    spec.workspace = Some("/srv/ci/checkout".into());
    let init = golden("root_ci_checkout", &spec, &FakeHost::new(ROOT));
    assert_eq!((init.uid.outside, init.gid.outside), (identity::NOBODY, identity::NOBODY));
    assert_eq!(idmap_of(&init), Some(Some(ROOT)));
}

/// `--net allow:`: our proxy variables replace the caller's, in any case,
/// and the job may connect to the proxy's port alone.
#[test]
fn golden_an_allowlisted_job_gets_our_proxy_and_not_the_callers() {
    let mut spec = job(&["curl", "https://pypi.org"]);
    spec.network = Network::Allow(vec!["pypi.org".into()]);
    spec.env = vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("HTTPS_PROXY".into(), "http://attacker:3128".into()),
        ("no_proxy".into(), "*".into()),
    ];
    let init = golden("net_allow_proxy", &spec, &FakeHost::new(ROOT));
    assert!(!init.env.iter().any(|(_, v)| v.contains("attacker") || v == "*"));
    assert_eq!(init.proxy_port, Some(crate::proxy::serve::PROXY_PORT));
}

/// A bind asked to be idmapped whose path went through a symlink is
/// bound plainly, and the reason is given; one given by its real path is
/// idmapped.
#[test]
fn golden_a_bind_through_a_symlink_is_not_idmapped() {
    let mut spec = job(&["tool"]);
    spec.binds.push(crate::job::Bind {
        source: "/opt/tool".into(),
        dest: "/opt/tool".into(),
        writable: true,
        idmap: true,
    });
    spec.through_symlink.push("/opt/tool".into());
    let init = golden("bind_through_symlink", &spec, &FakeHost::new(ROOT));
    assert_eq!(init.idmap_refused.len(), 1, "{:?}", init.idmap_refused);
    assert!(init.idmap_refused[0].starts_with("/opt/tool: its path goes through a symbolic link"));
    spec.through_symlink.clear();
    let init = init_spec_on(&spec, &FakeHost::new(ROOT));
    assert!(init.idmap_refused.is_empty());
    assert!(init.mounts.iter().any(|op| matches!(op, MountOp::Bind { idmap: Some(ALICE), .. })));
}

/// `--user 0:0`, rootless: root inside the job's namespace, our ids outside.
#[test]
fn golden_user_changes_the_ids_inside_only() {
    let mut spec = job(&["id"]);
    spec.user = Some((0, 0));
    let init = golden("user_root_inside", &spec, &FakeHost::new(ALICE));
    assert_eq!((init.uid, init.gid), (IdMap { inside: 0, outside: 1000 }, IdMap { inside: 0, outside: 1000 }));
}

/// The workspace at its host path (`--workspace-at host`) in a temporary
/// directory: it is mounted after the private /tmp (on top of it, not
/// hidden under it), and everything that follows the workspace follows
/// its path: the paths to protect, the idmap, landlock's write rule.
#[test]
fn a_workspace_at_its_host_path_is_followed_everywhere() {
    let mut spec = job(&["make"]);
    spec.workspace = Some("/tmp/ci/checkout".into());
    spec.workspace_at = "/tmp/ci/checkout".into();
    spec.workspace_rw = true;
    let init = init_spec_on(&spec, &FakeHost::new(ROOT));
    let at = |f: &dyn Fn(&MountOp) -> bool| init.mounts.iter().position(f).unwrap();
    let tmp = at(&|op| matches!(op, MountOp::Tmpfs { dst, .. } if dst == std::path::Path::new("/tmp")));
    let ws = at(
        &|op| matches!(op, MountOp::Bind { dst, workspace: true, idmap: Some(_), .. } if dst == std::path::Path::new("/tmp/ci/checkout")),
    );
    assert!(tmp < ws, "the workspace lands in the private /tmp");
    assert!(init.mounts.iter().any(
        |op| matches!(op, MountOp::Protect { base, path } if base == std::path::Path::new("/tmp/ci/checkout") && path == std::path::Path::new(".git"))
    ));
    assert!(!init.mounts.iter().any(|op| format!("{op:?}").contains("/workspace")));
    let landlock = init.landlock.unwrap();
    assert!(landlock.write.iter().any(|p| p == std::path::Path::new("/tmp/ci/checkout")));
}

/// The host's `/` is never idmapped: root's own files would be the job's.
#[test]
fn the_hosts_root_is_never_idmapped() {
    let mut spec = job(&["ls"]);
    spec.binds.push(crate::job::Bind { source: "/".into(), dest: "/host".into(), writable: false, idmap: true });
    let init = init_spec_on(&spec, &FakeHost::new(ROOT));
    let host =
        init.mounts.iter().find(|op| matches!(op, MountOp::Bind { dst, .. } if dst == std::path::Path::new("/host")));
    assert!(matches!(host, Some(MountOp::Bind { idmap: None, rw: false, .. })), "{host:?}");
}
