//! Spawn latency: /bin/true run three ways in one run — plain fork/exec,
//! bubblewrap with full namespaces, and `confine run` — with p50/p99 and
//! the ratios the README quotes. A floor row runs util-linux `unshare`
//! with the same seven namespaces and nothing else: what the kernel alone
//! charges for them.
//!
//! A last row times the same job started from a warm supervisor (one
//! process, profile compiled once), which is what every MCP request gets:
//! no supervisor start, no seccomp profile to load.
//!
//! The last four rows price landlock and seccomp: the same warm job with
//! every layer, every layer with libseccomp's own program for the same
//! profile, landlock only, and neither, interleaved run by run.
//!
//! `cargo bench --bench spawn` (release build). `SPAWN_RUNS=N` sets the
//! number of runs per row (default 300); `SPAWN_ROWS=layers` runs only the
//! layer rows, `SPAWN_ROWS=governance-cli` the CLI's `exec` against its
//! `run` (interleaved, with `run` of bash as a control; `SPAWN_REPEAT=K`
//! measures it K times, each on a fresh store, and sums the rounds up,
//! since the host's load moves one round's figure by tenths of a
//! millisecond; `SPAWN_AGED=N` adds `exec` on a store aged by N runs
//! first, as a CI runner's store gets; `SPAWN_RELAYED=1` adds `exec`
//! relayed to a `confine serve` that holds its store),
//! `SPAWN_ROWS=workspace` a read-write workspace, idmapped and plain,
//! against bwrap's bind of it (`SPAWN_BASELINE` adds an earlier build),
//! `SPAWN_ROWS=governance` only the two warm rows that price
//! governance (interleaved); `CONFINE_LOG=confine=debug` logs each request's stages.
//! Rows whose tool is missing are reported as such, never invented.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Row {
    name: String,
    samples: Vec<Duration>,
}

impl Row {
    fn pct(&self, p: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        let idx = ((s.len() as f64 - 1.0) * p).round() as usize;
        s[idx]
    }
}

fn time(name: &str, runs: usize, argv: &[&str]) -> Option<Row> {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    // Warm up (page cache, first-use costs), and check it works at all.
    for _ in 0..10 {
        let out = cmd.output().ok()?;
        if !out.status.success() {
            eprintln!("{name}: not measured: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
    }
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let status = cmd.status().ok()?;
        samples.push(t.elapsed());
        if !status.success() {
            return None;
        }
    }
    Some(Row { name: name.to_string(), samples })
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() {
    // A row runs confine's init stage with no control socket, which reads
    // its spec from fd 3: a descriptor this bench inherited there (a make
    // jobserver's, say) must not reach it.
    // SAFETY: F_SETFD on a descriptor number takes no pointers; on a closed
    // one it fails with EBADF, which is all right.
    unsafe { libc::fcntl(3, libc::F_SETFD, libc::FD_CLOEXEC) };
    // `CONFINE_LOG=confine=debug`: the stages of each request, with times.
    if let Ok(spec) = std::env::var("CONFINE_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(spec))
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_writer(std::io::stderr)
            .try_init();
    }
    let runs: usize = std::env::var("SPAWN_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(300);
    // The rows run a copy of the binary, as an install would have it. The
    // file cargo's linker just wrote runs `confine run` about 1.5 ms slower
    // while its pages stay cached (measured here on ext4: a copy, or the
    // same file after `echo 1 > /proc/sys/vm/drop_caches`, is fast), which
    // no installed binary is. bwrap is an installed binary too.
    let Some(installed) = installed_copy() else {
        eprintln!("cannot copy {} to a temporary directory", env!("CARGO_BIN_EXE_confine"));
        return;
    };
    let confine_path = installed.path().join("confine");
    let Some(confine) = confine_path.to_str() else { return };
    INSTALLED.get_or_init(|| confine_path.clone());
    let mut rows: Vec<Row> = Vec::new();
    // `SPAWN_ROWS=cli`: the command-line rows against bwrap, plain and the
    // floor, interleaved run by run; `SPAWN_BASELINE=FILE` adds another
    // confine binary (an earlier build), copied now as this one was.
    if std::env::var("SPAWN_ROWS").is_ok_and(|v| v == "cli") {
        let baseline = std::env::var_os("SPAWN_BASELINE").and_then(|b| {
            let copy = installed.path().join("confine-baseline");
            std::fs::copy(&b, &copy).ok().map(|_| copy)
        });
        rows.extend(cli_interleaved(confine, baseline.as_deref().and_then(|p| p.to_str()), runs).unwrap_or_default());
        print_rows(&rows, runs);
        return;
    }
    // `SPAWN_ROWS=workspace`: a workspace bound, idmapped (root's) and
    // plain (the job's own), against bwrap binding the same directory.
    if std::env::var("SPAWN_ROWS").is_ok_and(|v| v == "workspace") {
        let baseline = std::env::var_os("SPAWN_BASELINE").and_then(|b| {
            let copy = installed.path().join("confine-baseline");
            std::fs::copy(&b, &copy).ok().map(|_| copy)
        });
        rows.extend(
            workspace_interleaved(confine, baseline.as_deref().and_then(|p| p.to_str()), runs).unwrap_or_default(),
        );
        print_rows(&rows, runs);
        return;
    }
    // `SPAWN_ROWS=layers`: only the landlock + seccomp A/B rows.
    if std::env::var("SPAWN_ROWS").is_ok_and(|v| v == "layers") {
        rows.extend(layer_cost(runs));
        print_rows(&rows, runs);
        return;
    }
    // `SPAWN_ROWS=governance-cli`: the governance issue's own measure,
    // `confine exec --runtime shell --code true` against `confine run --
    // /bin/true`, both from the command line, interleaved run by run.
    if std::env::var("SPAWN_ROWS").is_ok_and(|v| v == "governance-cli") {
        let env_num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
        let repeat = env_num("SPAWN_REPEAT").unwrap_or(1).max(1);
        let aged = match env_num("SPAWN_AGED").unwrap_or(0) {
            0 => None,
            n => age_store(confine, n),
        };
        let aged_config = aged.as_ref().map(|(_, config)| config.as_path());
        // `SPAWN_BASELINE=FILE`: an earlier build's `exec` and `run` too,
        // on a store of its own (copied now, as this one was).
        let baseline = std::env::var_os("SPAWN_BASELINE").and_then(|b| {
            let copy = installed.path().join("confine-baseline");
            std::fs::copy(&b, &copy).ok().map(|_| copy)
        });
        let baseline = baseline.as_deref().and_then(|p| p.to_str());
        let mut adds = Vec::new();
        for round in 1..=repeat {
            rows = governance_cli_cost(confine, runs, aged_config, baseline);
            let [run, exec, bash, rest @ ..] = &rows[..] else { continue };
            let p50 = |r: &Row| r.pct(0.5).as_secs_f64() * 1000.0;
            adds.push(p50(exec) - p50(run));
            let of = if repeat > 1 { format!(" (round {round} of {repeat})") } else { String::new() };
            println!("governance from the CLI adds {:.3} ms at p50 (budget 5 ms){of}", p50(exec) - p50(run));
            println!(
                "  of which bash's own start over /bin/true: {:.3} ms; exec over run -- bash: {:.3} ms",
                p50(bash) - p50(run),
                p50(exec) - p50(bash)
            );
            if let Some([base_run, base_exec]) = rest.get(rest.len().saturating_sub(2)..).filter(|_| baseline.is_some())
            {
                println!(
                    "  baseline build: exec over run {:.3} ms; this build's exec {:+.3} ms and run {:+.3} ms against it",
                    p50(base_exec) - p50(base_run),
                    p50(exec) - p50(base_exec),
                    p50(run) - p50(base_run)
                );
            }
            let mut extra = rest.iter();
            if let Some(aged_row) = aged_config.and_then(|_| extra.next()) {
                println!(
                    "  on the aged store: {:.3} ms over run ({:+.3} ms against the fresh store)",
                    p50(aged_row) - p50(run),
                    p50(aged_row) - p50(exec)
                );
            }
            if let Some(relayed) = extra.next().filter(|r| r.name.starts_with("confine exec, relayed")) {
                println!(
                    "  relayed to a running server: {:.3} ms over run ({:+.3} ms against the CLI's own store)",
                    p50(relayed) - p50(run),
                    p50(relayed) - p50(exec)
                );
            }
        }
        if adds.len() > 1 {
            adds.sort_by(f64::total_cmp);
            let n = adds.len();
            let median = (adds[(n - 1) / 2] + adds[n / 2]) / 2.0;
            let over = adds.iter().filter(|&&a| a > 5.0).count();
            println!(
                "over {n} rounds: median {median:.3} ms, from {:.3} to {:.3} ms; {over} of {n} over the 5 ms budget",
                adds[0],
                adds[n - 1]
            );
        }
        print_rows(&rows, runs);
        return;
    }
    // `SPAWN_ROWS=governance`: only the two warm rows whose difference is
    // what governance adds to an MCP request.
    if std::env::var("SPAWN_ROWS").is_ok_and(|v| v == "governance") {
        rows.extend(governance_cost(runs));
        if let [a, b] = &rows[..] {
            let d = b.pct(0.5).as_secs_f64() - a.pct(0.5).as_secs_f64();
            println!("governance adds {:.3} ms at p50 (budget 2 ms)", d * 1000.0);
        }
        print_rows(&rows, runs);
        return;
    }
    let plain = time("plain fork/exec", runs, &["/bin/true"]);
    let bwrap = time(
        "bwrap --unshare-all",
        runs,
        &["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"],
    );
    if bwrap.is_none() {
        eprintln!("bwrap: not measured (apt-get install bubblewrap)");
    }
    let floor = time(FLOOR_NAME, runs, FLOOR);
    let confine_row = time("confine run", runs, &[confine, "run", "--", "/bin/true"]);
    let limits = time(
        "confine run + limits",
        runs,
        &[confine, "run", "--memory", "256M", "--cpus", "1", "--pids", "128", "--", "/bin/true"],
    );
    // The governed CLI, as the governance issue measures it.
    let exec_cli = exec_cli_row(confine, runs);
    let warm = warm_supervisor(runs, "/bin/true", "confine, warm supervisor (MCP path)");
    let warm_bash = warm_supervisor(runs, "/bin/bash", "warm supervisor, sandbox only: bash -c true");
    let governed = warm_governed(runs);
    rows.extend([plain, bwrap, floor, confine_row, limits, exec_cli, warm, warm_bash, governed].into_iter().flatten());
    rows.extend(layer_cost(runs));
    print_rows(&rows, runs);
}

/// A floor for any tool that gives a job these seven namespaces:
/// util-linux's unshare creates them, forks and execs, and does nothing
/// else (no root, no mounts, no /proc, no filters).
const FLOOR: &[&str] = &[
    "unshare",
    "--user",
    "--map-root-user",
    "--mount",
    "--pid",
    "--fork",
    "--net",
    "--ipc",
    "--uts",
    "--cgroup",
    "/bin/true",
];
const FLOOR_NAME: &str = "floor: unshare(1), the same 7 namespaces, nothing else";
const BWRAP_START: &str = "start only: bwrap --version";
const CONFINE_START: &str = "start only: confine's init stage, exiting at main";

/// The copy of the binary that every row runs (see `main`).
static INSTALLED: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// `confine` copied into a temporary directory, kept while the bench runs.
fn installed_copy() -> Option<tempfile::TempDir> {
    let dir = tempfile::tempdir().ok()?;
    std::fs::copy(env!("CARGO_BIN_EXE_confine"), dir.path().join("confine")).ok()?;
    Some(dir)
}

fn print_rows(rows: &[Row], runs: usize) {
    let base = |name: &str| rows.iter().find(|r| r.name.starts_with(name)).map(|r| r.pct(0.5));
    let (plain_p50, bwrap_p50) = (base("plain"), base("bwrap"));
    println!("runs per row: {runs}");
    println!("| how /bin/true is run | p50 ms | p99 ms | × plain | × bwrap |");
    println!("|---|---:|---:|---:|---:|");
    for r in rows {
        let p50 = r.pct(0.5);
        let ratio = |b: Option<Duration>| {
            b.map(|b| format!("{:.2}", p50.as_secs_f64() / b.as_secs_f64())).unwrap_or("–".into())
        };
        println!("| {} | {} | {} | {} | {} |", r.name, ms(p50), ms(r.pct(0.99)), ratio(plain_p50), ratio(bwrap_p50));
    }
    // A one-shot run starts confine twice (the command, then the init
    // stage it re-executes) and then has at least bwrap's own work to do:
    // bwrap's whole run less its start. That sum is a floor no cold run
    // of confine can go under, before its cgroups, landlock and seccomp.
    if let (Some(bwrap), Some(bwrap_start), Some(start)) = (bwrap_p50, base(BWRAP_START), base(CONFINE_START)) {
        let floor = bwrap.as_secs_f64() - bwrap_start.as_secs_f64() + 2.0 * start.as_secs_f64();
        println!(
            "floor of a cold confine run (bwrap - bwrap's start + 2 x confine's start, p50s): {:.2} ms, {:.2}x bwrap",
            floor * 1000.0,
            floor / bwrap.as_secs_f64()
        );
    }
}

/// A config of its own in `dir`: runtime enabled, a store, repository
/// `bench`.
fn bench_config(dir: &std::path::Path) -> Option<String> {
    let repo = dir.join("repo");
    std::fs::create_dir_all(&repo).ok()?;
    Some(format!(
        "[runtime]\nenabled = true\n[store]\npath = \"{}\"\n[[repos]]\nid = \"bench\"\nroot = \"{}\"\n",
        dir.join("store").display(),
        repo.display()
    ))
}

/// A temp dir with a config of its own in it ([`bench_config`]), and that
/// config's path.
fn bench_dir() -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::tempdir().ok()?;
    let config = dir.path().join("confine.toml");
    std::fs::write(&config, bench_config(dir.path())?).ok()?;
    Some((dir, config))
}

/// The governed `exec` of the code `true` under config `cfg`.
fn exec_argv<'a>(confine: &'a str, cfg: &'a str) -> [&'a str; 10] {
    [confine, "--config", cfg, "exec", "--repo-id", "bench", "--runtime", "shell", "--code", "true"]
}

/// Run `argv` once; None, and its stderr printed, when it fails.
fn succeeds(argv: &[&str]) -> Option<()> {
    let out = Command::new(argv[0]).args(&argv[1..]).stdin(Stdio::null()).stdout(Stdio::null()).output();
    match out {
        Ok(out) if out.status.success() => Some(()),
        Ok(out) => {
            eprintln!("{}: {}", argv.join(" "), String::from_utf8_lossy(&out.stderr).trim());
            None
        }
        Err(e) => {
            eprintln!("{}: {e}", argv.join(" "));
            None
        }
    }
}

/// `confine run -- /bin/true` and the governed `confine exec` of the code
/// `true`, each a process as a user starts it, interleaved run by run.
fn governance_cli_cost(
    confine: &str,
    runs: usize,
    aged_config: Option<&std::path::Path>,
    baseline: Option<&str>,
) -> Vec<Row> {
    let Some((_dir, config)) = bench_dir() else { return vec![] };
    let Some(cfg) = config.to_str() else { return vec![] };
    let Some((_base_dir, base_config)) = bench_dir() else { return vec![] };
    let Some(base_cfg) = base_config.to_str() else { return vec![] };
    let run_argv = [confine, "run", "--", "/bin/true"];
    let exec = exec_argv(confine, cfg);
    // A control: what the shell runtime's bash costs to start over
    // /bin/true, in the same sandbox, so that the table shows how much of
    // the difference is governance and how much is bash.
    // `SPAWN_RELAYED=1`: the same `exec` while a `confine serve` holds
    // its store, which runs it (the CLI opens no store).
    let relay_dir = std::env::var("SPAWN_RELAYED").is_ok_and(|v| v == "1").then(bench_dir).flatten();
    let server = relay_dir.as_ref().and_then(|(dir, config)| RelayServer::start(confine, dir.path(), config));
    let bash_argv = [confine, "run", "--", "/bin/bash", "-c", "true"];
    let mut variants: Vec<Variant<'_>> = vec![
        ("confine run -- /bin/true (CLI)", Box::new(move || succeeds(&run_argv))),
        ("confine exec --runtime shell --code true (CLI)", Box::new(move || succeeds(&exec))),
        ("confine run -- /bin/bash -c true (CLI, control)", Box::new(move || succeeds(&bash_argv))),
    ];
    if let Some(aged_cfg) = aged_config.and_then(|p| p.to_str()) {
        let aged = exec_argv(confine, aged_cfg);
        variants.push(("confine exec, the same, on an aged store (CLI)", Box::new(move || succeeds(&aged))));
    }
    if let (Some(_), Some(cfg)) = (&server, relay_dir.as_ref().and_then(|(_, c)| c.to_str())) {
        let relayed = exec_argv(confine, cfg);
        variants.push(("confine exec, relayed to a running confine serve (CLI)", Box::new(move || succeeds(&relayed))));
    }
    if let Some(b) = baseline {
        let (run, exec) = ([b, "run", "--", "/bin/true"], exec_argv(b, base_cfg));
        variants.push(("baseline: confine run -- /bin/true (CLI)", Box::new(move || succeeds(&run))));
        variants.push(("baseline: confine exec (CLI, its own store)", Box::new(move || succeeds(&exec))));
    }
    let rows = interleaved("governance-cli", runs, variants).unwrap_or_default();
    drop(server);
    rows
}

/// A `confine serve` holding a bench store, listening on its socket;
/// killed (by pid) when dropped.
struct RelayServer(std::process::Child);

impl RelayServer {
    fn start(confine: &str, dir: &std::path::Path, config: &std::path::Path) -> Option<RelayServer> {
        let child = Command::new(confine)
            .arg("--config")
            .arg(config)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let server = RelayServer(child);
        let socket = dir.join("store").join("serve.sock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !socket.exists() {
            if std::time::Instant::now() > deadline {
                eprintln!("confine serve never listened at {}", socket.display());
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Some(server)
    }
}

impl Drop for RelayServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A store that `n` runs of the governed `exec` have filled (audit records
/// and artifacts), in a temp dir with a config of its own, which is
/// returned; a progress line every 500 runs.
fn age_store(confine: &str, n: usize) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let (dir, config) = bench_dir()?;
    let argv = exec_argv(confine, config.to_str()?);
    for i in 1..=n {
        if succeeds(&argv).is_none() {
            eprintln!("aging the store: run {i} failed");
            return None;
        }
        if i % 500 == 0 || i == n {
            eprintln!("aging a store: {i}/{n} runs");
        }
    }
    Some((dir, config))
}

/// `confine exec` from the command line, with a config of its own in a
/// temp dir (store, repository).
fn exec_cli_row(confine: &str, runs: usize) -> Option<Row> {
    let (_dir, config) = bench_dir()?;
    time("confine exec --runtime shell --code true (CLI)", runs, &exec_argv(confine, config.to_str()?))
}

/// `SPAWN_ROWS=cli`: whole commands, interleaved run by run.
fn cli_interleaved(confine: &str, baseline: Option<&str>, runs: usize) -> Option<Vec<Row>> {
    // A run counts when the program exits with `code`.
    let exiting = |argv: Vec<String>, code: i32| {
        Box::new(move || {
            let status = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .ok()?;
            (status.code() == Some(code)).then_some(())
        }) as Box<dyn FnMut() -> Option<()>>
    };
    let command = |argv: Vec<String>| exiting(argv, 0);
    let v = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let mut variants: Vec<Variant<'_>> = vec![
        ("plain fork/exec", command(v(&["/bin/true"]))),
        // Starts and nothing else: each exits at main.
        (BWRAP_START, command(v(&["bwrap", "--version"]))),
        // Without the control socket at fd 3 the init stage exits 125 at once.
        (CONFINE_START, exiting(v(&[confine, "__init"]), 125)),
        (
            "bwrap --unshare-all",
            command(v(&["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"])),
        ),
        (FLOOR_NAME, command(v(FLOOR))),
        ("confine run (default limits)", command(v(&[confine, "run", "--", "/bin/true"]))),
        (
            "confine run --memory/--cpus/--pids unlimited",
            command(v(&[
                confine,
                "run",
                "--memory",
                "unlimited",
                "--cpus",
                "unlimited",
                "--pids",
                "unlimited",
                "--",
                "/bin/true",
            ])),
        ),
    ];
    if let Some(b) = baseline {
        variants.push(("baseline: confine run (its defaults)", command(v(&[b, "run", "--", "/bin/true"]))));
    }
    interleaved("cli", runs, variants)
}

/// `SPAWN_ROWS=workspace`: `/bin/true` with a read-write workspace, as
/// root: root's own 0755 directory (idmapped onto the job) and one that
/// already belongs to the job's ids (bound plainly), interleaved with
/// bwrap binding the same directory and an earlier build's plain bind.
fn workspace_interleaved(confine: &str, baseline: Option<&str>, runs: usize) -> Option<Vec<Row>> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().ok()?;
    let roots = dir.path().join("roots");
    let jobs = dir.path().join("jobs");
    for d in [&roots, &jobs] {
        std::fs::create_dir(d).ok()?;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).ok()?;
    }
    std::os::unix::fs::chown(&jobs, Some(65534), Some(65534)).ok()?;
    let (roots, jobs) = (roots.to_str()?.to_string(), jobs.to_str()?.to_string());
    let command = |argv: Vec<String>| {
        Box::new(move || {
            let status = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .ok()?;
            status.success().then_some(())
        }) as Box<dyn FnMut() -> Option<()>>
    };
    let v = |s: &[&str]| s.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let unlimited = ["--memory", "unlimited", "--cpus", "unlimited", "--pids", "unlimited"];
    let run = |bin: &str, ws: &str| {
        let mut a = v(&[bin, "run"]);
        a.extend(v(&unlimited));
        a.extend(v(&["--workspace", ws, "--rw", "--", "/bin/true"]));
        a
    };
    let mut variants: Vec<Variant<'_>> = vec![
        ("plain fork/exec", command(v(&["/bin/true"]))),
        (
            "bwrap --unshare-all, workspace bound",
            command(v(&[
                "bwrap",
                "--unshare-all",
                "--ro-bind",
                "/",
                "/",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                // At its own path: the read-only root has no /workspace.
                "--bind",
                &roots,
                &roots,
                "true",
            ])),
        ),
        ("confine run, root's workspace (idmapped)", command(run(confine, &roots))),
        ("confine run, the job's own workspace (plain bind)", command(run(confine, &jobs))),
    ];
    if let Some(b) = baseline {
        variants.push(("baseline build: confine run, root's workspace", command(run(b, &roots))));
    }
    let rows = interleaved("workspace", runs, variants);
    drop(dir);
    rows
}

/// In-process variants timed interleaved, run by run, so that drift in the
/// host's load hits them alike: 10 unmeasured rounds, then `runs` timed
/// ones. None (and a line saying so) when a run fails.
type Variant<'a> = (&'a str, Box<dyn FnMut() -> Option<()> + 'a>);

fn interleaved(what: &str, runs: usize, mut variants: Vec<Variant<'_>>) -> Option<Vec<Row>> {
    let mut rows: Vec<Row> =
        variants.iter().map(|(name, _)| Row { name: name.to_string(), samples: Vec::with_capacity(runs) }).collect();
    for round in 0..runs + 10 {
        for (row, (_, once)) in rows.iter_mut().zip(variants.iter_mut()) {
            let t = Instant::now();
            if once().is_none() {
                eprintln!("{what}: not measured (a job failed)");
                return None;
            }
            if round >= 10 {
                row.samples.push(t.elapsed());
            }
        }
    }
    Some(rows)
}

/// Start `spec` from this warm process and wait for it: the library's
/// spawn and supervise, with `seccomp` compiled beforehand, and landlock
/// dropped from the init plan when `landlock` is false.
#[cfg(target_os = "linux")]
fn warm_job(
    rt: &tokio::runtime::Runtime,
    spec: &confine::job::JobSpec,
    seccomp: Option<(&str, &std::os::fd::OwnedFd)>,
    landlock: bool,
) -> Option<()> {
    use confine::sandbox::StdioSpec;
    rt.block_on(async {
        let stdio = StdioSpec::null();
        let job = confine::sandbox::linux::spawn_adjusted(spec, stdio, seccomp, |init| {
            if !landlock {
                init.landlock = None;
            }
        })
        .await
        .ok()?;
        let outcome = job.supervise(Duration::from_secs(2), std::future::pending()).await;
        (outcome.exit_code == Some(0)).then_some(())
    })
}

/// The runtime and compiled default profile of a warm supervisor. This
/// bench binary can't be the init stage: confine's is used. The runtime
/// has a server's flavor (several workers), so that a job's cgroups are
/// removed on a blocking thread as a server's are (`Teardown::start`);
/// the warm rows still wait for that removal, which a server overlaps.
#[cfg(target_os = "linux")]
fn warm_parts() -> Option<(tokio::runtime::Runtime, confine::sandbox::linux::seccomp::CompiledProfile)> {
    let exe = INSTALLED.get().cloned().unwrap_or_else(|| env!("CARGO_BIN_EXE_confine").into());
    confine::sandbox::linux::set_init_executable(exe);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().ok()?;
    Some((rt, confine::sandbox::linux::seccomp::compile_default().ok()?))
}

/// `program` started by a long-lived supervisor, every layer on.
#[cfg(target_os = "linux")]
fn warm_supervisor(runs: usize, program: &str, name: &str) -> Option<Row> {
    let (rt, profile) = warm_parts()?;
    let mut argv = vec![program.to_string()];
    if program.ends_with("bash") {
        argv.extend(["-c".to_string(), "true".to_string()]);
    }
    let spec = confine::job::JobSpec::new(argv);
    let filter = Some((profile.name.as_str(), &profile.fd));
    let once = Box::new(|| warm_job(&rt, &spec, filter, true));
    interleaved(name, runs, vec![(name, once)])?.pop()
}

/// The governed pipeline in a warm supervisor: `runtime shell`, code
/// `true` (gate, policy, env, cwd jail, queue, sandbox running bash on the
/// code file, capture into sled, audit record flushed). Against the row
/// above, it is what governance adds per request in `confine serve`.
#[cfg(target_os = "linux")]
fn warm_governed(runs: usize) -> Option<Row> {
    let dir = tempfile::tempdir().ok()?;
    let (rt, sup) = governed_parts(dir.path())?;
    let once = Box::new(|| governed_once(&rt, &sup));
    let name = "warm supervisor, governed: exec --runtime shell --code true";
    interleaved(name, runs, vec![(name, once)])?.pop()
}

/// A warm supervisor with the bench's config (store and repo under `dir`).
#[cfg(target_os = "linux")]
fn governed_parts(dir: &std::path::Path) -> Option<(tokio::runtime::Runtime, confine::supervisor::Supervisor)> {
    let config = confine::config::Config::parse(&bench_config(dir)?, &dir.join("confine.toml")).ok()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().ok()?;
    let sup = rt.block_on(async { confine::supervisor::Supervisor::open(config) }).ok()?;
    Some((rt, sup))
}

/// One governed request: `runtime shell`, code `true`.
#[cfg(target_os = "linux")]
fn governed_once(rt: &tokio::runtime::Runtime, sup: &confine::supervisor::Supervisor) -> Option<()> {
    use confine::supervisor::exec::{JobControl, JobRequest};
    let req = JobRequest {
        repo_id: Some("bench".into()),
        runtime: "shell".into(),
        code: Some("true".into()),
        ..JobRequest::default()
    };
    let resp = rt.block_on(sup.execute(req, JobControl::default()));
    (resp.exit_code == Some(0)).then_some(()).or_else(|| {
        eprintln!("governed: {:?}", resp.error);
        None
    })
}

/// What governance adds to a warm request: the same sandbox running
/// `bash -c true` bare, and as a governed `runtime shell` request for the
/// code `true`, interleaved run by run.
#[cfg(target_os = "linux")]
fn governance_cost(runs: usize) -> Vec<Row> {
    let Some((bare_rt, profile)) = warm_parts() else { return vec![] };
    let spec = confine::job::JobSpec::new(vec!["/bin/bash".into(), "-c".into(), "true".into()]);
    let filter = Some((profile.name.as_str(), &profile.fd));
    let Some(dir) = tempfile::tempdir().ok() else { return vec![] };
    let Some((rt, sup)) = governed_parts(dir.path()) else { return vec![] };
    let (bare_rt, spec, rt, sup) = (&bare_rt, &spec, &rt, &sup);
    let variants: Vec<Variant<'_>> = vec![
        ("warm supervisor, sandbox only: bash -c true", Box::new(move || warm_job(bare_rt, spec, filter, true))),
        ("warm supervisor, governed: exec --runtime shell --code true", Box::new(move || governed_once(rt, sup))),
    ];
    interleaved("governance", runs, variants).unwrap_or_default()
}

#[cfg(not(target_os = "linux"))]
fn governance_cost(_runs: usize) -> Vec<Row> {
    Vec::new()
}

/// What landlock and seccomp add to a spawn (the confinement issue's
/// budget: ≤ 0.5 ms at p50). The same warm-supervisor job four ways,
/// interleaved: every layer; every layer with libseccomp's own program for the same profile; landlock only; neither.
#[cfg(target_os = "linux")]
fn layer_cost(runs: usize) -> Vec<Row> {
    let Some((rt, profile)) = warm_parts() else { return vec![] };
    let spec = confine::job::JobSpec::new(vec!["/bin/true".to_string()]);
    let filter = Some((profile.name.as_str(), &profile.fd));
    let (rt, spec) = (&rt, &spec);
    // The same profile as libseccomp's generator writes it, for the row
    // that prices confine's range compiler against it.
    let Some(libseccomp) = libseccomp_program() else { return vec![] };
    let old_filter = Some((profile.name.as_str(), &libseccomp));
    let variants: Vec<Variant<'_>> = vec![
        ("warm, landlock + seccomp (layer cost: A)", Box::new(move || warm_job(rt, spec, filter, true))),
        ("warm, landlock + seccomp, libseccomp's program", Box::new(move || warm_job(rt, spec, old_filter, true))),
        ("warm, landlock only", Box::new(move || warm_job(rt, spec, None, true))),
        ("warm, neither (layer cost: B)", Box::new(move || warm_job(rt, spec, None, false))),
    ];
    let Some(rows) = interleaved("layer cost", runs, variants) else { return vec![] };
    let p50 = |i: usize| rows[i].pct(0.5).as_secs_f64() * 1000.0;
    let insns =
        |fd: &std::os::fd::OwnedFd| std::fs::File::from(fd.try_clone().ok()?).metadata().ok().map(|m| m.len() / 8);
    println!(
        "seccomp program: {} instructions; libseccomp's: {}",
        insns(&profile.fd).unwrap_or(0),
        insns(&libseccomp).unwrap_or(0)
    );
    println!("landlock + seccomp add {:.3} ms at p50 (A − B; budget 0.5 ms)", p50(0) - p50(3));
    println!("with libseccomp's program they would add {:.3} ms", p50(1) - p50(3));
    rows
}

/// The default profile compiled by libseccomp's own generator, in a file.
#[cfg(target_os = "linux")]
fn libseccomp_program() -> Option<std::os::fd::OwnedFd> {
    use confine::sandbox::linux::seccomp::{compile, profile, DEFAULT_NAME, DEFAULT_PROFILE};
    use std::io::{Seek, SeekFrom};
    let host = profile::HostFacts::current().ok()?;
    let plan = profile::plan(DEFAULT_NAME, &profile::parse(DEFAULT_NAME, DEFAULT_PROFILE).ok()?, &host).ok()?;
    let ctx = compile::filter(DEFAULT_NAME, &plan).ok()?;
    let mut file = tempfile::tempfile().ok()?;
    compile::export(DEFAULT_NAME, &ctx, &file).ok()?;
    file.seek(SeekFrom::Start(0)).ok()?;
    Some(file.into())
}

#[cfg(not(target_os = "linux"))]
fn layer_cost(_runs: usize) -> Vec<Row> {
    Vec::new()
}

#[cfg(not(target_os = "linux"))]
fn warm_supervisor(_runs: usize, _program: &str, _name: &str) -> Option<Row> {
    None
}

#[cfg(not(target_os = "linux"))]
fn warm_governed(_runs: usize) -> Option<Row> {
    None
}
