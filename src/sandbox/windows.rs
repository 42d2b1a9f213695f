//! The `windows` backend: the job and all its descendants in one Job
//! Object — kill on close (confine's death kills the tree), a memory cap,
//! a hard CPU-rate cap, a CPU-time cap, a process-count cap, and no
//! breakaway (the BREAKAWAY_OK flags are never set). The process starts
//! suspended, is assigned to the job, then resumed, so it never runs a
//! single instruction outside it. The tree kill is `TerminateJobObject`.
//!
//! Much weaker than the Linux sandbox: the host's filesystem, network and
//! user account are the job's. It only runs with `--allow-degraded`.
//! Written from the Win32 documentation; `tests/suite/windows.rs` runs it for
//! real on Windows in CI. Under Wine 8 the tree kills pass, but Wine keeps
//! only the limit flags (memory and process limits are ignored) and
//! rejects the CPU-rate information class, so `--cpus` fails there.

use super::host_paths::{self, HostLayout};
use super::{Backend, BackendKind, SandboxError, StdioSpec};
use crate::job::{JobSpec, LandlockLayer, Layers, Limits, Outcome, Status, Usage};
use std::ffi::c_void;
use std::future::Future;
use std::time::Duration;
use tokio::time::{sleep_until, Instant};
use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, INVALID_HANDLE_VALUE};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, Thread32First, Thread32Next, TH32CS_SNAPTHREAD, THREADENTRY32,
};
use windows_sys::Win32::System::JobObjects::{
    AssignProcessToJobObject, CreateJobObjectW, JobObjectBasicAccountingInformation,
    JobObjectCpuRateControlInformation, JobObjectExtendedLimitInformation, QueryInformationJobObject,
    SetInformationJobObject, TerminateJobObject, JOBOBJECTINFOCLASS, JOBOBJECT_BASIC_ACCOUNTING_INFORMATION,
    JOBOBJECT_CPU_RATE_CONTROL_INFORMATION, JOBOBJECT_EXTENDED_LIMIT_INFORMATION, JOB_OBJECT_CPU_RATE_CONTROL_ENABLE,
    JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP, JOB_OBJECT_LIMIT_ACTIVE_PROCESS, JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION,
    JOB_OBJECT_LIMIT_JOB_MEMORY, JOB_OBJECT_LIMIT_JOB_TIME, JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
};
use windows_sys::Win32::System::Threading::{OpenThread, ResumeThread, CREATE_SUSPENDED, THREAD_SUSPEND_RESUME};

/// Exit code of processes ended by `TerminateJobObject`.
const KILLED_EXIT_CODE: u32 = 1;
/// 100-nanosecond ticks per millisecond (Windows times).
const TICKS_PER_MS: i64 = 10_000;

/// An owned kernel handle, closed on drop. Closing the job handle kills
/// the tree (KILL_ON_JOB_CLOSE).
struct Handle(HANDLE);

// SAFETY: a kernel handle is valid in every thread of the process, and
// the kernel serializes what is done through it; `Handle` is its only
// owner and closes it once.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: we own this handle and close it once.
        unsafe { CloseHandle(self.0) };
    }
}

fn os_error(what: &str) -> SandboxError {
    let e = std::io::Error::last_os_error();
    SandboxError::Spawn(std::io::Error::new(e.kind(), format!("{what}: {e}")))
}

fn set_info<T>(job: &Handle, class: JOBOBJECTINFOCLASS, info: &T, what: &str) -> Result<(), SandboxError> {
    // SAFETY: `info` points to a live T of the size we pass, the layout
    // the information class expects.
    let ok =
        unsafe { SetInformationJobObject(job.0, class, (info as *const T).cast::<c_void>(), size_of::<T>() as u32) };
    if ok == 0 {
        return Err(os_error(what));
    }
    Ok(())
}

fn query_info<T: Default>(job: &Handle, class: JOBOBJECTINFOCLASS) -> Option<T> {
    let mut info = T::default();
    // SAFETY: `info` is a writable T of the size we pass.
    let ok = unsafe {
        QueryInformationJobObject(
            job.0,
            class,
            (&mut info as *mut T).cast::<c_void>(),
            size_of::<T>() as u32,
            std::ptr::null_mut(),
        )
    };
    (ok != 0).then_some(info)
}

/// The CPU-rate cap in 1/100 of a percent of all processors.
fn cpu_rate(cpus: f64) -> u32 {
    let online = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
    (cpus / online * 10_000.0).round().clamp(1.0, 10_000.0) as u32
}

/// An anonymous Job Object with the job's limits.
fn job_object(limits: &Limits) -> Result<Handle, SandboxError> {
    // SAFETY: null attributes and name: an anonymous job, not inheritable.
    let raw = unsafe { CreateJobObjectW(std::ptr::null(), std::ptr::null()) };
    if raw.is_null() {
        return Err(os_error("CreateJobObjectW"));
    }
    let job = Handle(raw);
    let mut info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION::default();
    let basic = &mut info.BasicLimitInformation;
    basic.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE | JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION;
    if let Some(bytes) = limits.memory_bytes {
        basic.LimitFlags |= JOB_OBJECT_LIMIT_JOB_MEMORY;
        info.JobMemoryLimit = usize::try_from(bytes).unwrap_or(usize::MAX);
    }
    let basic = &mut info.BasicLimitInformation;
    if let Some(n) = limits.pids {
        basic.LimitFlags |= JOB_OBJECT_LIMIT_ACTIVE_PROCESS;
        basic.ActiveProcessLimit = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(ms) = limits.cpu_time_ms {
        basic.LimitFlags |= JOB_OBJECT_LIMIT_JOB_TIME;
        basic.PerJobUserTimeLimit = i64::try_from(ms).unwrap_or(i64::MAX / TICKS_PER_MS) * TICKS_PER_MS;
    }
    set_info(&job, JobObjectExtendedLimitInformation, &info, "job object limits")?;
    if let Some(cpus) = limits.cpus {
        let mut rate = JOBOBJECT_CPU_RATE_CONTROL_INFORMATION {
            ControlFlags: JOB_OBJECT_CPU_RATE_CONTROL_ENABLE | JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP,
            ..Default::default()
        };
        rate.Anonymous.CpuRate = cpu_rate(cpus);
        set_info(&job, JobObjectCpuRateControlInformation, &rate, "job object CPU rate")?;
    }
    Ok(job)
}

/// Resume the threads of a process created suspended (its main thread).
fn resume(pid: u32) -> Result<(), SandboxError> {
    // SAFETY: a snapshot of all threads; the handle is checked below.
    let snap = unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) };
    if snap == INVALID_HANDLE_VALUE {
        return Err(os_error("CreateToolhelp32Snapshot"));
    }
    let snap = Handle(snap);
    let mut entry = THREADENTRY32 { dwSize: size_of::<THREADENTRY32>() as u32, ..Default::default() };
    let mut resumed = 0;
    // SAFETY: entry is a THREADENTRY32 with dwSize set, as the API requires.
    let mut more = unsafe { Thread32First(snap.0, &mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == pid {
            // SAFETY: opening a thread of our own suspended child by id.
            let thread = unsafe { OpenThread(THREAD_SUSPEND_RESUME, 0, entry.th32ThreadID) };
            if !thread.is_null() {
                let thread = Handle(thread);
                // SAFETY: a valid thread handle with THREAD_SUSPEND_RESUME.
                if unsafe { ResumeThread(thread.0) } != u32::MAX {
                    resumed += 1;
                }
            }
        }
        // SAFETY: as for Thread32First.
        more = unsafe { Thread32Next(snap.0, &mut entry) } != 0;
    }
    if resumed == 0 {
        return Err(os_error("ResumeThread"));
    }
    Ok(())
}

/// Variables that locate Windows itself. They name system directories,
/// never a secret, and Windows programs need them: without `SystemRoot`,
/// Winsock cannot load its providers, for one.
const SYSTEM_VARS: [&str; 5] = ["SystemRoot", "SystemDrive", "windir", "ComSpec", "PATHEXT"];

/// The job's environment on Windows. `env::scrubbed` is written for a
/// Unix sandbox: its default PATH (`/usr/local/sbin:…`) names no Windows
/// directory, so `cmd` could run nothing but its built-ins. Keep what the
/// scrub let in, replace that default PATH (not one the user chose with
/// `-e PATH`) by the system directories, add SYSTEM_VARS from the host, and
/// point TEMP and TMP at the private /tmp, as HOME and TMPDIR already are.
/// Windows' variable names ignore case, so the checks do too.
fn windows_env(
    mut env: Vec<(String, String)>,
    tmp: &std::path::Path,
    host: impl Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let root = host("SystemRoot").unwrap_or_else(|| r"C:\Windows".into());
    let system_path = format!(r"{root}\System32;{root};{root}\System32\Wbem");
    match env.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case("PATH")) {
        Some(slot) if slot.1 == crate::env::SANDBOX_PATH => slot.1 = system_path,
        Some(_) => {}
        None => env.push(("PATH".into(), system_path)),
    }
    let tmp = tmp.to_string_lossy().into_owned();
    let defaults = SYSTEM_VARS.iter().filter_map(|&k| host(k).map(|v| (k, v)));
    let defaults: Vec<(&str, String)> = defaults.chain([("TEMP", tmp.clone()), ("TMP", tmp)]).collect();
    for (key, value) in defaults {
        if !env.iter().any(|(k, _)| k.eq_ignore_ascii_case(key)) {
            env.push((key.into(), value));
        }
    }
    env
}

fn terminate(job: &Handle) {
    // SAFETY: a valid job handle; ends every process in it.
    unsafe { TerminateJobObject(job.0, KILLED_EXIT_CODE) };
}

/// A job in its Job Object, or a program that could not be executed
/// (whose outcome says so: no sandbox failed).
pub struct WindowsJob {
    spec: JobSpec,
    job_id: String,
    started: std::time::Instant,
    run: Running,
    /// Last field: the directory goes after the job is gone.
    _tmp: TmpDir,
}

enum Running {
    Job { child: tokio::process::Child, job: Handle },
    NotExecuted(Box<Outcome>),
}

/// Start `spec` in a Job Object. A program that can't be executed is no
/// error of the sandbox: its job's outcome is exit code 127 or 126.
pub(crate) fn spawn_job(
    spec: &JobSpec,
    stdio: StdioSpec,
    launch: super::Launch<'_>,
) -> Result<Box<dyn super::Job>, SandboxError> {
    let program = spec.argv.first().ok_or(SandboxError::NoCommand)?;
    if let crate::job::Network::Allow(_) = spec.network {
        return Err(SandboxError::Unavailable(super::NET_ALLOW_NEEDS_LINUX.into()));
    }
    if let Some(ws) = &spec.workspace {
        if !ws.is_dir() {
            return Err(SandboxError::Workspace { path: ws.clone(), reason: "not a directory".into() });
        }
    }
    let job_id = launch.job_id.map_or_else(crate::ids::job_id, str::to_string);
    let tmp = host_paths::private_tmp(&job_id).map_err(SandboxError::Spawn)?;
    let cleanup = TmpDir(tmp.clone());
    let layout = HostLayout { tmp, workspace: spec.workspace.clone() };
    layout.write_files(&spec.files).map_err(|e| SandboxError::Unavailable(e.to_string()))?;
    let cwd = layout.host_path(&spec.cwd).map_err(|e| SandboxError::Unavailable(format!("--cwd {e}")))?;
    let job = job_object(&spec.limits)?;

    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&spec.argv[1..])
        .env_clear()
        .envs(windows_env(layout.host_env(&spec.env), &layout.tmp, |k| std::env::var(k).ok()))
        .current_dir(cwd)
        .stdin(stdio.stdin)
        .stdout(stdio.stdout)
        .stderr(stdio.stderr)
        .creation_flags(CREATE_SUSPENDED)
        .kill_on_drop(true);
    let started = std::time::Instant::now();
    let done = |run| {
        Ok(Box::new(WindowsJob { spec: spec.clone(), job_id: job_id.clone(), started, run, _tmp: cleanup })
            as Box<dyn super::Job>)
    };
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.kind() == std::io::ErrorKind::NotFound { 127 } else { 126 };
            let mut o = outcome(spec, job_id.clone(), started, Some(code), None);
            o.error = Some(format!("{program}: cannot execute ({e})"));
            return done(Running::NotExecuted(Box::new(o)));
        }
    };
    let mut child = child;
    let process = child.raw_handle().ok_or_else(|| os_error("process handle"))?;
    // SAFETY: both handles are valid; the child is still suspended.
    if unsafe { AssignProcessToJobObject(job.0, process as HANDLE) } == 0 {
        let err = os_error("AssignProcessToJobObject");
        let _ = child.start_kill();
        return Err(err);
    }
    if let Some(pid) = child.id() {
        if let Err(e) = resume(pid) {
            terminate(&job);
            return Err(e);
        }
    }
    done(Running::Job { child, job })
}

impl super::Job for WindowsJob {
    fn take_stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        match &mut self.run {
            Running::Job { child, .. } => child.stdin.take(),
            Running::NotExecuted(_) => None,
        }
    }

    fn stdin_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        self.take_stdin().map(|p| p.into_owned_handle())
    }

    fn stdout_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        match &mut self.run {
            Running::Job { child, .. } => child.stdout.take().map(|p| p.into_owned_handle()),
            Running::NotExecuted(_) => None,
        }
    }

    fn stderr_pipe(&mut self) -> Option<std::io::Result<super::Pipe>> {
        match &mut self.run {
            Running::Job { child, .. } => child.stderr.take().map(|p| p.into_owned_handle()),
            Running::NotExecuted(_) => None,
        }
    }

    fn kill_tree(&mut self) {
        if let Running::Job { job, .. } = &self.run {
            terminate(job);
        }
    }

    /// The timeout and a stop both kill the tree at once: Windows has no
    /// signal to forward, and `TerminateJobObject` needs no grace.
    fn supervise(
        self: Box<Self>,
        _kill_grace: Duration,
        stop: super::BoxFuture<'static, super::Stop>,
    ) -> super::BoxFuture<'static, (Outcome, super::Teardown)> {
        Box::pin(async move { (self.wait(stop).await, super::Teardown::none()) })
    }
}

impl WindowsJob {
    async fn wait(self, cancel: impl Future<Output = super::Stop>) -> Outcome {
        let WindowsJob { spec, job_id, started, run, _tmp } = self;
        let (mut child, job) = match run {
            Running::Job { child, job } => (child, job),
            Running::NotExecuted(o) => return *o,
        };
        let deadline = spec.limits.timeout_ms.map(|ms| Instant::from_std(started) + Duration::from_millis(ms));
        let never = Instant::now() + Duration::from_secs(100 * 365 * 86400);
        let mut ending = None;
        let status = {
            let exit = child.wait();
            tokio::pin!(exit);
            tokio::pin!(cancel);
            loop {
                tokio::select! {
                    status = &mut exit => break status,
                    _ = sleep_until(deadline.unwrap_or(never)), if deadline.is_some() && ending.is_none() => {
                        ending = Some(Status::Timeout);
                        terminate(&job);
                    }
                    _ = &mut cancel, if ending.is_none() => {
                        ending = Some(Status::Cancelled);
                        terminate(&job);
                    }
                }
            }
        };
        // The main process is gone: so is everything it started.
        terminate(&job);
        let code = status.as_ref().ok().and_then(|s| s.code());
        let mut o = outcome(&spec, job_id, started, code, ending);
        if let Err(e) = status {
            o.error = Some(format!("waiting for the job failed: {e}"));
        }
        account(&job, &spec, &mut o);
        o
    }
}

/// Usage from the job's accounting, and a CPU-time or memory ending the
/// exit code alone does not tell.
fn account(job: &Handle, spec: &JobSpec, o: &mut Outcome) {
    if let Some(acct) = query_info::<JOBOBJECT_BASIC_ACCOUNTING_INFORMATION>(job, JobObjectBasicAccountingInformation) {
        o.usage.cpu_user_ms = Some((acct.TotalUserTime / TICKS_PER_MS).max(0) as u64);
        o.usage.cpu_sys_ms = Some((acct.TotalKernelTime / TICKS_PER_MS).max(0) as u64);
        o.usage.pids_peak = Some(u64::from(acct.TotalProcesses));
    }
    if let Some(ext) = query_info::<JOBOBJECT_EXTENDED_LIMIT_INFORMATION>(job, JobObjectExtendedLimitInformation) {
        o.usage.peak_memory_bytes = Some(ext.PeakJobMemoryUsed as u64);
    }
    if o.status == Status::Failure {
        if spec.limits.cpu_time_ms.is_some_and(|ms| o.usage.cpu_user_ms.is_some_and(|used| used >= ms)) {
            o.status = Status::Timeout;
        } else if spec
            .limits
            .memory_bytes
            .is_some_and(|m| o.usage.peak_memory_bytes.is_some_and(|p| p + (1 << 20) >= m))
        {
            o.status = Status::Oom;
        }
    }
}

fn outcome(
    spec: &JobSpec,
    job_id: String,
    started: std::time::Instant,
    code: Option<i32>,
    ending: Option<Status>,
) -> Outcome {
    let mut missing: Vec<String> = BackendKind::Windows.lost().iter().map(|s| s.to_string()).collect();
    missing.extend(["capsDropped".to_string(), "noNewPrivs".to_string()]);
    if !spec.binds.is_empty() {
        missing.push("binds".into());
    }
    if spec.workspace.is_some() && !spec.workspace_rw {
        missing.push("readOnlyWorkspace".into());
    }
    Outcome {
        job_id,
        status: match (ending, code) {
            (Some(s), _) => s,
            (None, Some(0)) => Status::Success,
            _ => Status::Failure,
        },
        exit_code: code,
        signal: None,
        duration_ms: started.elapsed().as_millis() as u64,
        queued_ms: 0,
        usage: Usage::default(),
        backend: BackendKind::Windows.name().into(),
        layers: Layers {
            landlock: LandlockLayer { abi: 0, status: "off".into(), skipped: Vec::new() },
            missing,
            ..Layers::default()
        },
        guarantees: crate::sandbox::Guarantees::windows(),
        limits: spec.limits.clone(),
        error: None,
        setup_step: None,
        network: None,
        tmp_full: None,
    }
}

/// The private /tmp, removed when the run ends.
struct TmpDir(std::path::PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_rate_is_a_share_of_all_processors() {
        assert!(cpu_rate(0.0001) >= 1);
        assert!(cpu_rate(1_000.0) <= 10_000);
    }

    #[test]
    fn job_env_locates_windows_but_keeps_the_scrub() {
        let host = |k: &str| match k {
            "SystemRoot" => Some(r"C:\Windows".to_string()),
            "ComSpec" => Some(r"C:\Windows\system32\cmd.exe".to_string()),
            _ => Some(format!("host {k}")),
        };
        let tmp = std::path::Path::new(r"C:\Temp\confine-job");
        let scrubbed = crate::env::scrubbed(&[], |_| None);
        let env = windows_env(scrubbed, tmp, host);
        let get = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some(r"C:\Windows\System32;C:\Windows;C:\Windows\System32\Wbem"));
        assert_eq!(get("SystemRoot"), Some(r"C:\Windows"));
        assert_eq!(get("TEMP"), Some(r"C:\Temp\confine-job"));
        assert!(!env.iter().any(|(k, _)| k == "USERPROFILE"));
        let chosen = windows_env(vec![("Path".into(), r"D:\tools".into())], tmp, host);
        assert_eq!(chosen.iter().filter(|(k, _)| k.eq_ignore_ascii_case("PATH")).count(), 1);
        assert_eq!(chosen[0].1, r"D:\tools");
    }
}
