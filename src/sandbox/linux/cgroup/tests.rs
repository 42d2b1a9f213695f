//! Unit tests against a fake cgroupfs in a temp dir (after Firecracker's
//! `MockCgroupFs`): directories stand for cgroups, regular files for
//! control files. [`fake_mkdir`] plays the kernel's part of filling a new
//! cgroup with its parent's control files; [`fake_rmdir`] refuses a cgroup
//! with children or members, as the kernel does.

use super::*;
use std::fs;

fn fake_mkdir(p: &Path) -> io::Result<()> {
    fs::create_dir(p)?;
    let parent = p.parent().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    for entry in fs::read_dir(parent)?.flatten() {
        if !entry.path().is_file() {
            continue;
        }
        let name = entry.file_name();
        // A child is offered what its parent switched on for it.
        let content = if name == "cgroup.controllers" {
            fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default().replace('+', "")
        } else {
            String::new()
        };
        fs::write(p.join(name), content)?;
    }
    Ok(())
}

fn fake_rmdir(p: &Path) -> io::Result<()> {
    if fs::read_dir(p)?.flatten().any(|e| e.path().is_dir()) {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    if fs::read_to_string(p.join("cgroup.procs")).is_ok_and(|s| !s.trim().is_empty()) {
        return Err(io::Error::from_raw_os_error(libc::EBUSY));
    }
    fs::remove_dir_all(p)
}

const FAKE: FsOps = FsOps { mkdir: fake_mkdir, rmdir: fake_rmdir };

/// A cgroup directory holding `files` (name, content).
fn cgroup_dir(dir: &Path, files: &[(&str, &str)]) {
    fs::create_dir_all(dir).unwrap();
    for (name, content) in files {
        fs::write(dir.join(name), content).unwrap();
    }
}

const V2_FILES: &[(&str, &str)] = &[
    ("cgroup.controllers", "cpu memory pids"),
    ("cgroup.subtree_control", ""),
    ("cgroup.procs", ""),
    ("cgroup.kill", ""),
    ("cgroup.freeze", ""),
    ("cpu.stat", ""),
    ("cpu.max", ""),
    ("memory.max", ""),
    ("memory.swap.max", ""),
    ("memory.peak", ""),
    ("memory.events", ""),
    ("pids.max", ""),
    ("pids.peak", ""),
    ("pids.current", ""),
];

fn limits(memory: Option<u64>, cpus: Option<f64>, pids: Option<u64>) -> Limits {
    Limits { memory_bytes: memory, cpus, pids, ..Limits::default() }
}

fn read(p: impl AsRef<Path>) -> String {
    fs::read_to_string(p).unwrap()
}

fn v2_cgroups(root: &Path, own: &str, parent: Option<&str>) -> Cgroups {
    let config = CgroupConfig { parent: parent.map(PathBuf::from) };
    let mut c = Cgroups::new(Layout::v2_at(root, Path::new(own)), config, FAKE).unwrap();
    c.privileged = true;
    c
}

/// How many `confine/` bases [`racing_mkdir`] has made.
static BASES_MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// [`fake_mkdir`], but the first `confine/` base it makes is removed at
/// once, as another supervisor whose last job ended removes an empty one.
fn racing_mkdir(p: &Path) -> io::Result<()> {
    fake_mkdir(p)?;
    if p.file_name().is_some_and(|n| n == BASE) && BASES_MADE.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
        fs::remove_dir_all(p)?;
    }
    Ok(())
}

#[test]
fn a_base_removed_by_another_supervisor_before_its_controllers_are_on_is_made_again() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    cgroup_dir(&root.join("svc"), V2_FILES);
    let config = CgroupConfig { parent: None };
    let mut cgroups =
        Cgroups::new(Layout::v2_at(root, Path::new("/svc")), config, FsOps { mkdir: racing_mkdir, rmdir: fake_rmdir })
            .unwrap();
    cgroups.privileged = true;
    let job = cgroups.create("job-1", &limits(Some(64 << 20), Some(0.5), Some(10))).unwrap();
    assert_eq!(BASES_MADE.load(std::sync::atomic::Ordering::SeqCst), 2, "the base was made again");
    let dir = root.join("svc/confine").join(job.name());
    assert_eq!(read(root.join("svc/confine/cgroup.subtree_control")), "+memory +pids +cpu");
    assert_eq!(read(dir.join("memory.max")), "67108864");
}

#[test]
fn v2_limits_kill_stats_and_removal() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    cgroup_dir(&root.join("svc"), V2_FILES);
    let cgroups = v2_cgroups(root, "/svc", None);
    let job = cgroups.create("job-1", &limits(Some(64 << 20), Some(0.5), Some(10))).unwrap();

    let dir = root.join("svc/confine").join(job.name());
    assert_eq!(Owner::parse(job.name()), Some(Owner::current()));
    assert_eq!(job.procs_files(), vec![dir.join("cgroup.procs")]);
    assert_eq!(job.layer(), "v2");
    // Controllers are handed down along <own>/confine/<job>.
    assert_eq!(read(root.join("svc/cgroup.subtree_control")), "+memory +pids +cpu");
    assert_eq!(read(root.join("svc/confine/cgroup.subtree_control")), "+memory +pids +cpu");
    assert_eq!(read(dir.join("memory.max")), "67108864");
    assert_eq!(read(dir.join("memory.swap.max")), "0");
    assert_eq!(read(dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(dir.join("pids.max")), (10 + init_processes(Version::V2)).to_string());

    job.kill_tree().unwrap();
    assert_eq!(read(dir.join("cgroup.kill")), "1");

    fs::write(dir.join("cpu.stat"), "usage_usec 3000\nuser_usec 2000\nsystem_usec 1000\n").unwrap();
    fs::write(dir.join("memory.peak"), "1048576\n").unwrap();
    fs::write(dir.join("memory.events"), "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n").unwrap();
    fs::write(dir.join("pids.peak"), "7\n").unwrap();
    let stats = job.stats();
    assert_eq!(stats.cpu_user, Duration::from_millis(2));
    assert_eq!(stats.cpu_sys, Duration::from_millis(1));
    assert_eq!(stats.memory_peak, Some(1 << 20));
    assert_eq!(stats.pids_peak, Some(7 - init_processes(Version::V2)), "pid 1 is not the job's");
    assert!(stats.oom_killed(false));
    assert_eq!(job.cpu_usage(), Some(Duration::from_millis(3)));

    job.remove_blocking().unwrap();
    assert!(!root.join("svc/confine").exists(), "the empty confine/ goes too");
    assert!(root.join("svc").exists(), "the parent is not ours");
}

/// Kernel 5.10 (Debian 11): pure v2 without `cgroup.kill`. The tree is
/// frozen, every member killed, then thawed, and the outcome says so.
#[test]
fn v2_before_cgroup_kill_freezes_then_kills() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let files: Vec<(&str, &str)> = V2_FILES.iter().copied().filter(|(n, _)| *n != "cgroup.kill").collect();
    cgroup_dir(root, &files);
    let cgroups = v2_cgroups(root, "/", None);
    let job = cgroups.create("job-5", &Limits::default()).unwrap();
    let dir = root.join("confine").join(job.name());
    // A fake cgroup: the freeze is reported done at once.
    fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
    assert_eq!(job.layer(), "v2-freeze");
    job.kill_tree().unwrap();
    assert!(!dir.join("cgroup.kill").exists());
    assert_eq!(read(dir.join("cgroup.freeze")), "0", "frozen, killed, thawed");
    let g = crate::sandbox::Guarantees::of(
        crate::sandbox::BackendKind::Linux,
        &crate::job::Layers { pidns: true, cgroup: Some(job.layer().into()), ..Default::default() },
    );
    assert!(g.tree_kill.how.starts_with("cgroup freeze"), "{}", g.tree_kill.how);
}

#[test]
fn v2_without_controllers_still_kills_and_counts_cpu() {
    // The unified hierarchy of a hybrid host: no controllers, cgroup.kill works.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    fs::write(root.join("cgroup.controllers"), "hugetlb").unwrap();
    let cgroups = v2_cgroups(root, "/", None);

    let job = cgroups.create("job-2", &Limits::default()).unwrap();
    assert_eq!(read(root.join("cgroup.subtree_control")), "", "accounting asks for nothing unavailable");
    assert_eq!(job.layer(), "v2");
    drop(job);
    assert!(!root.join("confine").exists(), "drop removes");

    let err = cgroups.create("job-3", &limits(Some(1 << 20), None, None)).unwrap_err();
    assert!(matches!(err, CgroupError::ControllerMissing { controller: "memory", .. }), "{err}");
    assert!(err.to_string().contains("Delegate=yes"), "{err}");
    assert!(!root.join("confine").exists(), "nothing left after a failed create");
}

#[test]
fn enable_failure_fails_limits_but_not_accounting() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    cgroup_dir(&root.join("busy"), V2_FILES);
    // Unwritable subtree_control: what EBUSY (processes in our own cgroup) looks like.
    fs::remove_file(root.join("busy/cgroup.subtree_control")).unwrap();
    fs::create_dir(root.join("busy/cgroup.subtree_control")).unwrap();
    fs::write(root.join("busy/cgroup.subtree_control/x"), "").unwrap();
    let cgroups = v2_cgroups(root, "/busy", None);

    let job = cgroups.create("job-4", &Limits::default()).unwrap();
    assert!(job.paths()[0].exists());
    job.remove_blocking().unwrap();

    let err = cgroups.create("job-5", &limits(None, None, Some(5))).unwrap_err();
    assert!(matches!(err, CgroupError::Enable { .. }), "{err}");
    assert!(err.to_string().contains("--cgroup-parent"), "{err}");
}

#[test]
fn configured_parent_and_bad_names() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    cgroup_dir(&root.join("jobs.slice"), V2_FILES);
    let cgroups = v2_cgroups(root, "/somewhere/else", Some("/jobs.slice"));
    let job = cgroups.create("job-6", &Limits::default()).unwrap();
    assert!(job.paths()[0].starts_with(root.join("jobs.slice/confine")));
    drop(job);

    assert!(matches!(cgroups.create("../x", &Limits::default()), Err(CgroupError::BadName(_))));
    let bad = Cgroups::new(Layout::v2_at(root, Path::new("/")), CgroupConfig { parent: Some("rel".into()) }, FAKE);
    assert!(matches!(bad, Err(CgroupError::BadParent(_))));
    let bad = Cgroups::new(Layout::v2_at(root, Path::new("/")), CgroupConfig { parent: Some("/a/../..".into()) }, FAKE);
    assert!(matches!(bad, Err(CgroupError::BadParent(_))));
    let missing = v2_cgroups(root, "/", Some("/no/such.slice"));
    let e = missing.create("job-7", &Limits::default()).unwrap_err();
    assert!(matches!(e, CgroupError::ParentMissing { .. }), "{e:?}");
    assert!(e.to_string().contains("'/no/such.slice'") && e.to_string().contains("does not exist"), "{e}");
    assert!(!root.join("no").exists(), "nothing was made");
}

/// A hybrid host like this one: v1 controllers plus an unified hierarchy.
fn hybrid(root: &Path, unified_kill: bool, unified: bool) -> Cgroups {
    let mut mounts = String::new();
    let mut own = String::new();
    for (i, c) in ["memory", "pids", "cpu", "cpuacct", "freezer"].iter().enumerate() {
        mounts += &format!("{} 31 0:{} / {}/{c} rw - cgroup cgroup rw,{c}\n", 40 + i, 29 + i, root.display());
        own += &format!("{}:{c}:/\n", i + 1);
    }
    cgroup_dir(
        &root.join("memory"),
        &[
            ("cgroup.procs", ""),
            ("memory.limit_in_bytes", ""),
            ("memory.max_usage_in_bytes", ""),
            ("memory.oom_control", ""),
            ("memory.failcnt", ""),
        ],
    );
    cgroup_dir(&root.join("pids"), &[("cgroup.procs", ""), ("pids.max", ""), ("pids.current", "")]);
    cgroup_dir(&root.join("cpu"), &[("cgroup.procs", ""), ("cpu.cfs_period_us", ""), ("cpu.cfs_quota_us", "")]);
    cgroup_dir(
        &root.join("cpuacct"),
        &[("cgroup.procs", ""), ("cpuacct.usage", ""), ("cpuacct.usage_user", ""), ("cpuacct.usage_sys", "")],
    );
    cgroup_dir(&root.join("freezer"), &[("cgroup.procs", ""), ("freezer.state", "THAWED")]);
    if unified {
        mounts += &format!("49 31 0:38 / {}/unified rw - cgroup2 cgroup2 rw\n", root.display());
        own += "0::/\n";
        let files: &[(&str, &str)] = if unified_kill {
            &[("cgroup.procs", ""), ("cgroup.kill", ""), ("cpu.stat", ""), ("cgroup.controllers", "")]
        } else {
            &[("cgroup.procs", ""), ("cgroup.freeze", ""), ("cpu.stat", ""), ("cgroup.controllers", "")]
        };
        cgroup_dir(&root.join("unified"), files);
    }
    let mut c = Cgroups::new(Layout::parse(&mounts, &own), CgroupConfig::default(), FAKE).unwrap();
    c.privileged = true;
    c
}

fn names(job: &JobCgroup, root: &Path) -> Vec<String> {
    job.paths().iter().map(|p| p.strip_prefix(root).unwrap().iter().next().unwrap().to_string_lossy().into()).collect()
}

#[test]
fn hybrid_uses_unified_kill_and_only_needed_v1_controllers() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let cgroups = hybrid(root, true, true);
    assert_eq!(cgroups.layout().kind(), Some(LayoutKind::Hybrid));

    let job = cgroups.create("job-7", &Limits::default()).unwrap();
    assert_eq!(names(&job, root), ["unified", "memory", "pids"], "no cpu, cpuacct or freezer without need");
    assert_eq!(job.layer(), "v1+unified-kill");
    drop(job);

    let job = cgroups.create("job-8", &limits(Some(64 << 20), Some(1.5), Some(100))).unwrap();
    assert_eq!(names(&job, root), ["unified", "memory", "pids", "cpu"]);
    let d = |h: &str| root.join(h).join("confine").join(job.name());
    assert_eq!(read(d("memory").join("memory.limit_in_bytes")), "67108864");
    assert!(!d("memory").join("memory.memsw.limit_in_bytes").exists(), "no swap accounting: not created");
    assert_eq!(read(d("cpu").join("cpu.cfs_quota_us")), "150000");
    assert_eq!(read(d("cpu").join("cpu.cfs_period_us")), "100000");
    assert_eq!(read(d("pids").join("pids.max")), "102");
    let joins = job.procs_files();
    assert_eq!(joins.len(), 4);
    assert!(joins[0].ends_with("cgroup.procs") && joins[1..].iter().all(|p| p.ends_with("tasks")), "{joins:?}");
    job.kill_tree().unwrap();
    assert_eq!(read(d("unified").join("cgroup.kill")), "1");

    // No pids.peak here: the peak is sampled.
    assert!(job.tracks_pids());
    fs::write(d("pids").join("pids.current"), "9\n").unwrap();
    job.sample_pids();
    fs::write(d("pids").join("pids.current"), "4\n").unwrap();
    job.sample_pids();
    fs::write(d("memory").join("memory.oom_control"), "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n").unwrap();
    fs::write(d("memory").join("memory.max_usage_in_bytes"), "5000\n").unwrap();
    let stats = job.stats();
    assert_eq!(stats.pids_peak, Some(9 - init_processes(Version::V1)), "outer and pid 1 are not the job's");
    assert_eq!(stats.oom_kills, Some(2));
    assert_eq!(stats.memory_peak, Some(5000));
    job.remove_blocking().unwrap();
    for h in ["unified", "memory", "pids", "cpu"] {
        assert!(!root.join(h).join("confine").exists(), "{h}");
    }
}

#[test]
fn v1_without_cgroup_kill_freezes() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // Pure v1: cpuacct for CPU time, freezer for the kill.
    let cgroups = hybrid(root, false, false);
    assert_eq!(cgroups.layout().kind(), Some(LayoutKind::V1));
    let job = cgroups.create("job-9", &Limits::default()).unwrap();
    assert_eq!(names(&job, root), ["memory", "pids", "cpuacct", "freezer"]);
    assert_eq!(job.layer(), "v1");
    job.kill_tree().unwrap();
    let d = |h: &str| root.join(h).join("confine").join(job.name());
    assert_eq!(read(d("freezer").join("freezer.state")), "THAWED", "frozen, killed, thawed");
    fs::write(d("cpuacct").join("cpuacct.usage_user"), "2000000\n").unwrap();
    fs::write(d("cpuacct").join("cpuacct.usage_sys"), "1000000\n").unwrap();
    fs::write(d("cpuacct").join("cpuacct.usage"), "3000000\n").unwrap();
    let stats = job.stats();
    assert_eq!((stats.cpu_user, stats.cpu_sys), (Duration::from_millis(2), Duration::from_millis(1)));
    assert_eq!(job.cpu_usage(), Some(Duration::from_millis(3)));
    // Ticks that missed time (as in an emulated guest, where user and sys
    // added up to 912 ms of the 1007 ms the limit saw): the exact total,
    // split in the ticks' proportion, so a job stopped at its CPU-time
    // limit never reports less than the limit.
    fs::write(d("cpuacct").join("cpuacct.usage_user"), "128000000\n").unwrap();
    fs::write(d("cpuacct").join("cpuacct.usage_sys"), "784000000\n").unwrap();
    fs::write(d("cpuacct").join("cpuacct.usage"), "1007000000\n").unwrap();
    let stats = job.stats();
    assert_eq!(stats.cpu_user + stats.cpu_sys, Duration::from_millis(1007));
    assert_eq!(stats.cpu_user, Duration::from_nanos(1_007_000_000 * 128 / 912));
    // No ticks at all: the whole total is user time.
    fs::write(d("cpuacct").join("cpuacct.usage_user"), "0\n").unwrap();
    fs::write(d("cpuacct").join("cpuacct.usage_sys"), "0\n").unwrap();
    let stats = job.stats();
    assert_eq!((stats.cpu_user, stats.cpu_sys), (Duration::from_millis(1007), Duration::ZERO));
    drop(job);

    // Hybrid whose kernel predates cgroup.kill: the v1 freezer does the kill.
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = hybrid(tmp.path(), false, true);
    let job = cgroups.create("job-10", &Limits::default()).unwrap();
    assert_eq!(names(&job, tmp.path()), ["unified", "memory", "pids", "freezer"]);
    assert_eq!(job.layer(), "v1");
}

#[test]
fn rootless_needs_a_delegated_v2_subtree() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cgroups = hybrid(tmp.path(), true, false);
    cgroups.privileged = false;
    let err = cgroups.create("job-11", &Limits::default()).unwrap_err();
    assert!(matches!(err, CgroupError::NotDelegated { .. }), "{err}");
    assert!(err.to_string().contains("--allow-degraded"), "{err}");
}

#[test]
fn stale_cleanup_removes_only_dead_owners() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    cgroup_dir(root, V2_FILES);
    let cgroups = v2_cgroups(root, "/", None);
    let base = root.join(BASE);
    fake_mkdir(&base).unwrap();
    let me = Owner::current();
    let init = Owner { pid: 1, start: start_time(1).unwrap() };
    let dead_recycled = Owner { pid: me.pid, start: me.start + 1 };
    let dead_gone = Owner { pid: u32::MAX - 1, start: 5 };
    for name in [
        me.dir_name("job-live"),
        init.dir_name("job-other-live"),
        dead_recycled.dir_name("job-dead-1"),
        dead_gone.dir_name("job-dead-2"),
        "not-ours".to_string(),
        "job-x.12.abc".to_string(),
    ] {
        fake_mkdir(&base.join(name)).unwrap();
    }
    let removed = cgroups.cleanup_stale();
    assert_eq!(removed, vec![dead_recycled.dir_name("job-dead-1"), dead_gone.dir_name("job-dead-2")]);
    let left: Vec<String> = fs::read_dir(&base)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into())
        .collect();
    assert_eq!(left.len(), 4, "{left:?}");
    assert!(base.join(me.dir_name("job-live")).exists());
    assert!(base.join("not-ours").exists());
}

#[test]
fn owner_names_round_trip() {
    let o = Owner { pid: 42, start: 12345 };
    assert_eq!(o.dir_name("job-1-ab"), "job-1-ab.42.12345");
    assert_eq!(Owner::parse("job-1-ab.42.12345"), Some(o));
    assert_eq!(Owner::parse("job.42"), None);
    assert_eq!(Owner::parse(".42.1"), None);
    assert_eq!(Owner::parse("a b.42.1"), None);
    assert!(Owner::current().alive());
    assert!(!Owner { pid: std::process::id(), start: Owner::current().start + 7 }.alive());
}

#[test]
fn oom_is_never_guessed_from_the_signal() {
    let mut s = Stats::default();
    assert!(!s.oom_killed(true), "no counter, no failure: a plain SIGKILL");
    s.memory_failcnt = 3;
    assert!(s.oom_killed(true), "old v1 kernel: limit hit and SIGKILL");
    assert!(!s.oom_killed(false));
    s.oom_kills = Some(0);
    assert!(!s.oom_killed(true), "the counter is authoritative when present");
    s.oom_kills = Some(1);
    assert!(s.oom_killed(false));
}

#[test]
fn limits_that_need_a_cgroup() {
    assert!(!limits_need_cgroup(&Limits::default()));
    assert!(limits_need_cgroup(&limits(None, None, Some(1))));
    assert!(limits_need_cgroup(&Limits { cpu_time_ms: Some(1), ..Limits::default() }));
}
