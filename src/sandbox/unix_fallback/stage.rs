//! The `__fallback-init` stage: a single-threaded re-exec of confine that
//! starts the job and outlives it.
//!
//! It reads a [`StageSpec`] from fd 3, becomes a child subreaper (Linux),
//! forks the job into its own session with its rlimits, forwards stop
//! signals to the job's process group, and when the job ends — or on
//! SIGUSR1, the supervisor's "kill the tree" — kills every process left
//! below it, reaps them, and writes a [`StageReport`] back on fd 3.
//! It never runs inside tokio: no threads exist here, so `fork` is sound.

use super::{Resource, StageReport, StageSpec, KILL_TREE_SIGNAL, STAGE_FD};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Why the stage could not set up or start the job. The report to the
/// supervisor carries it as text ([`StageReport::error`]).
#[derive(Debug, thiserror::Error)]
enum StageError {
    #[error("reading the spec: {0}")]
    ReadSpec(std::io::Error),
    #[error("bad spec: {0}")]
    BadSpec(serde_json::Error),
    #[error("an argument or variable contains a NUL byte")]
    Nul,
    /// A system call failed: its name, and the error.
    #[error("{call}: {source}")]
    Sys { call: &'static str, source: std::io::Error },
}

impl StageError {
    /// The system call `call` that just failed, with errno's error.
    fn last_os(call: &'static str) -> StageError {
        StageError::Sys { call, source: std::io::Error::last_os_error() }
    }
}

/// Signals received and not yet forwarded, one bit per signal number.
static PENDING: AtomicU64 = AtomicU64::new(0);
/// The supervisor asked for the tree kill (or died).
static KILL_TREE: AtomicBool = AtomicBool::new(false);

/// Forwarded to the job's process group.
const FORWARDED: &[libc::c_int] = &[libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR2];

/// How long the stage waits for killed processes to be reaped.
const REAP_BOUND: Duration = Duration::from_secs(5);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only lock-free atomics: async-signal-safe.
    if sig == KILL_TREE_SIGNAL {
        KILL_TREE.store(true, Ordering::SeqCst);
    } else if (0..64).contains(&sig) {
        PENDING.fetch_or(1 << sig, Ordering::SeqCst);
    }
}

/// Entry point of `confine __fallback-init`; never returns.
pub fn main() -> ! {
    // SAFETY: the supervisor placed our end of its socket at STAGE_FD and
    // nothing else in this process owns that fd.
    let mut ctl = unsafe { std::os::unix::net::UnixStream::from_raw_fd(STAGE_FD) };
    // The job must never inherit it: it could forge the report, and an
    // escapee holding it would keep the supervisor waiting for EOF.
    // SAFETY: fcntl on the fd we just took ownership of.
    unsafe { libc::fcntl(STAGE_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    let report = match read_spec(&mut ctl) {
        Ok(spec) => run(&spec),
        Err(e) => StageReport { error: Some(format!("fallback stage: {e}")), ..StageReport::default() },
    };
    let mut line = serde_json::to_vec(&report).unwrap_or_default();
    line.push(b'\n');
    let _ = ctl.write_all(&line);
    std::process::exit(if report.error.is_some() && report.exit_code.is_none() { 125 } else { 0 })
}

fn read_spec(ctl: &mut std::os::unix::net::UnixStream) -> Result<StageSpec, StageError> {
    let mut buf = Vec::new();
    ctl.read_to_end(&mut buf).map_err(StageError::ReadSpec)?;
    serde_json::from_slice(&buf).map_err(StageError::BadSpec)
}

/// Everything `execve` needs, built before `fork` so that the child only
/// makes syscalls.
struct Prepared {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: CString,
}

fn cstring(s: impl Into<Vec<u8>>) -> Result<CString, StageError> {
    CString::new(s).map_err(|_| StageError::Nul)
}

/// `argv[0]` looked up in the job's own PATH (ours is empty).
fn resolve(program: &str, env: &[(String, String)]) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.contains('/') {
        return Some(program.into());
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| std::path::Path::new(d).join(program))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

fn prepare(spec: &StageSpec) -> Result<Prepared, StageReport> {
    let fail =
        |code: i32, msg: String| StageReport { exit_code: Some(code), error: Some(msg), ..StageReport::default() };
    let program = spec.argv.first().ok_or_else(|| fail(125, "no command given".into()))?;
    let path = resolve(program, &spec.env)
        .ok_or_else(|| fail(127, format!("{program}: command not found in the job's PATH")))?;
    let built = (|| {
        Ok::<_, StageError>(Prepared {
            path: cstring(path.as_os_str().as_encoded_bytes())?,
            argv: spec.argv.iter().map(|a| cstring(a.as_str())).collect::<Result<_, _>>()?,
            envp: spec.env.iter().map(|(k, v)| cstring(format!("{k}={v}"))).collect::<Result<_, _>>()?,
            cwd: cstring(spec.cwd.as_os_str().as_encoded_bytes())?,
        })
    })();
    built.map_err(|e| fail(125, e.to_string()))
}

fn install_handlers() {
    for &sig in FORWARDED.iter().chain([KILL_TREE_SIGNAL].iter()) {
        // SAFETY: a zeroed sigaction is valid; the handler only touches
        // atomics. No SA_RESTART: sleeps end early on a signal.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Linux: orphans of the tree are reparented to us, not to init, so that
/// a double-forked `setsid` escapee is still ours to kill; and if the
/// supervisor dies we get the tree-kill signal.
#[cfg(target_os = "linux")]
fn become_subreaper() -> Result<(), StageError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(StageError::last_os("PR_SET_CHILD_SUBREAPER"));
    }
    // SAFETY: as above; the handler is installed already.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, KILL_TREE_SIGNAL, 0, 0, 0) } != 0 {
        return Err(StageError::last_os("PR_SET_PDEATHSIG"));
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn become_subreaper() -> Result<(), StageError> {
    Ok(())
}

fn run(spec: &StageSpec) -> StageReport {
    install_handlers();
    if let Err(e) = become_subreaper() {
        return StageReport { error: Some(e.to_string()), ..StageReport::default() };
    }
    let prepared = match prepare(spec) {
        Ok(p) => p,
        Err(report) => return report,
    };
    let job = match start(spec, &prepared) {
        Ok(pid) => pid,
        Err(report) => return report,
    };
    let mut report = watch(job);
    report.escapees_killed = kill_tree(job);
    usage(&mut report);
    report
}

/// A pipe whose ends close on exec (macOS has no pipe2).
fn cloexec_pipe() -> Result<[libc::c_int; 2], StageError> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        return Err(StageError::last_os("pipe"));
    }
    for fd in fds {
        // SAFETY: fd was just returned by pipe; single-threaded, so no fork races.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    Ok(fds)
}

/// Fork and exec the job; its pid, or the report of why it could not start.
fn start(spec: &StageSpec, p: &Prepared) -> Result<libc::pid_t, StageReport> {
    let fail =
        |code: i32, msg: String| StageReport { exit_code: Some(code), error: Some(msg), ..StageReport::default() };
    let [rd, wr] = cloexec_pipe().map_err(|e| fail(125, e.to_string()))?;
    let mut argv: Vec<*const libc::c_char> = p.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = p.envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let rlimits: Vec<(Resource, libc::rlimit)> = spec
        .rlimits
        .iter()
        .map(|r| (r.resource, libc::rlimit { rlim_cur: r.soft as libc::rlim_t, rlim_max: r.hard as libc::rlim_t }))
        .collect();
    // SAFETY: this process is single-threaded (no tokio, no threads), so
    // the child may run anything; it still only makes syscalls on data
    // built before the fork, and leaves by execve or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(fail(125, format!("fork: {}", std::io::Error::last_os_error())));
    }
    if pid == 0 {
        // SAFETY: the child: syscalls on prepared data only, then execve or _exit.
        unsafe { child(wr, spec, p, &rlimits, &argv, &envp) }
    }
    // SAFETY: closing our copy of the write end; rd is ours to read and close.
    unsafe { libc::close(wr) };
    let mut errno = [0u8; 8];
    // SAFETY: rd is open and errno is 8 writable bytes.
    let n = unsafe { libc::read(rd, errno.as_mut_ptr().cast(), errno.len()) };
    // SAFETY: rd is ours.
    unsafe { libc::close(rd) };
    if n == 8 {
        let step = i32::from_ne_bytes([errno[0], errno[1], errno[2], errno[3]]);
        let err = i32::from_ne_bytes([errno[4], errno[5], errno[6], errno[7]]);
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let reason = std::io::Error::from_raw_os_error(err);
        let program = spec.argv.first().map(String::as_str).unwrap_or("");
        return Err(match step {
            STEP_EXEC if err == libc::ENOENT => fail(127, format!("{program}: command not found ({reason})")),
            STEP_EXEC => fail(126, format!("{program}: cannot execute ({reason})")),
            STEP_CHDIR => fail(125, format!("cannot enter the working directory: {reason}")),
            _ => fail(125, format!("job setup failed at step {step}: {reason}")),
        });
    }
    Ok(pid)
}

const STEP_SETSID: i32 = 1;
const STEP_IDS: i32 = 2;
const STEP_RLIMIT: i32 = 3;
const STEP_CHDIR: i32 = 4;
const STEP_EXEC: i32 = 5;

/// The job side of the fork. Reports `(step, errno)` on `wr` and exits 127
/// if a step fails.
///
/// # Safety
/// Call only in a freshly forked child of a single-threaded process.
unsafe fn child(
    wr: libc::c_int,
    spec: &StageSpec,
    p: &Prepared,
    rlimits: &[(Resource, libc::rlimit)],
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
) -> ! {
    let die = |step: i32| -> ! {
        let err = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&step.to_ne_bytes());
        msg[4..].copy_from_slice(&err.to_ne_bytes());
        // SAFETY: write and _exit are async-signal-safe; msg is 8 readable bytes.
        unsafe {
            libc::write(wr, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };
    // SAFETY: plain syscalls on values built before the fork, in the
    // child of a single-threaded process; the caller guarantees that.
    unsafe {
        // Default actions for our handlers, and for SIGPIPE, which the Rust
        // runtime of this stage ignores: `yes | head` must end by SIGPIPE.
        for sig in FORWARDED.iter().chain([KILL_TREE_SIGNAL, libc::SIGPIPE].iter()) {
            libc::signal(*sig, libc::SIG_DFL);
        }
        // Its own session and process group: a stop signal reaches the
        // whole group, and the terminal's job control does not.
        if libc::setsid() < 0 {
            die(STEP_SETSID);
        }
        #[cfg(target_os = "linux")]
        {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            if spec.no_new_privs {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            }
        }
        if let Some((uid, gid)) = spec.ids {
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
                die(STEP_IDS);
            }
        }
        for (resource, lim) in rlimits {
            if libc::setrlimit(resource.raw() as _, lim) != 0 {
                die(STEP_RLIMIT);
            }
        }
        if libc::chdir(p.cwd.as_ptr()) != 0 {
            die(STEP_CHDIR);
        }
        libc::execve(p.path.as_ptr(), argv.as_ptr(), envp.as_ptr());
        die(STEP_EXEC)
    }
}

/// Reap until the job itself exits, forwarding signals; on the tree-kill
/// request, kill everything and keep reaping.
fn watch(job: libc::pid_t) -> StageReport {
    let mut report = StageReport::default();
    loop {
        let pending = PENDING.swap(0, Ordering::SeqCst);
        for &sig in FORWARDED {
            if pending & (1 << sig) != 0 {
                // SAFETY: signalling the job's process group (its pgid is its pid).
                unsafe { libc::kill(-job, sig) };
            }
        }
        if KILL_TREE.load(Ordering::SeqCst) {
            kill_tree(job);
        }
        loop {
            let mut status = 0;
            // SAFETY: reaping any child of ours, without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            if pid == job {
                if libc::WIFEXITED(status) {
                    report.exit_code = Some(libc::WEXITSTATUS(status));
                } else if libc::WIFSIGNALED(status) {
                    report.signal = Some(libc::WTERMSIG(status));
                }
                return report;
            }
        }
        // A signal cuts the nap short; a poll bounds the lost-wakeup race.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kill the job's group and every process left below this stage, and reap
/// them. Returns how many processes were found outside the job's group.
fn kill_tree(job: libc::pid_t) -> u32 {
    // SAFETY: signalling the job's process group; ESRCH when it is empty.
    unsafe { libc::kill(-job, libc::SIGKILL) };
    let me = std::process::id() as libc::pid_t;
    let until = Instant::now() + REAP_BOUND;
    let mut escapees = 0;
    loop {
        let rest = descendants(me);
        if rest.is_empty() || Instant::now() > until {
            break;
        }
        // Stop them all first: a process whose child dies before it does
        // would otherwise run on between two kills.
        for sig in [libc::SIGSTOP, libc::SIGKILL] {
            for pid in &rest {
                // SAFETY: kill(2) on a process below us.
                unsafe { libc::kill(*pid, sig) };
            }
        }
        escapees += rest.len() as u32;
        reap_all();
        std::thread::sleep(Duration::from_millis(5));
    }
    reap_all();
    escapees
}

fn reap_all() {
    loop {
        let mut status = 0;
        // SAFETY: reaping any child of ours, without blocking.
        if unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } <= 0 {
            break;
        }
    }
}

/// Live processes whose parent chain leads to `root` (Linux: from /proc).
/// Zombies are left to [`reap_all`]; they can't run any more.
#[cfg(target_os = "linux")]
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    let mut parent = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or("");
        let Some(ppid) = fields.next().and_then(|s| s.parse::<libc::pid_t>().ok()) else { continue };
        parent.insert(pid, (ppid, state == "Z"));
    }
    let below = |mut pid: libc::pid_t| {
        for _ in 0..4096 {
            match parent.get(&pid) {
                Some((ppid, _)) if *ppid == root => return true,
                Some((ppid, _)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    parent.iter().filter(|(pid, (_, zombie))| !zombie && below(**pid)).map(|(pid, _)| *pid).collect()
}

/// Without /proc and a subreaper only the job's process group is known.
#[cfg(not(target_os = "linux"))]
fn descendants(_root: libc::pid_t) -> Vec<libc::pid_t> {
    Vec::new()
}

/// CPU time and peak RSS of everything reaped.
fn usage(report: &mut StageReport) {
    // SAFETY: a zeroed rusage is valid and getrusage fills it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let ms = |tv: libc::timeval| tv.tv_sec as u64 * 1000 + tv.tv_usec as u64 / 1000;
    report.cpu_user_ms = ms(ru.ru_utime);
    report.cpu_sys_ms = ms(ru.ru_stime);
    // ru_maxrss is KiB on Linux, bytes on macOS.
    let scale = if cfg!(target_os = "macos") { 1 } else { 1024 };
    report.peak_memory_bytes = (ru.ru_maxrss.max(0) as u64) * scale;
}
