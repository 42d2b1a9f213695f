//! Seccomp, both sides. The supervisor compiles a profile (OCI/Docker JSON,
//! [`profile`]) once with libseccomp ([`compile`]) into a sealed memfd of
//! BPF; every job's init stage reads that memfd at fd 4 and installs the
//! program, last of all its confinement steps.
//!
//! The default profile is `seccomp/default.json`, embedded in the binary.
//! It is an allowlist, as Docker's is: a syscall added to the kernel next
//! year is denied until someone reads what it does, which a denylist can't
//! promise. Unlisted calls fail with ENOSYS, so libcs and runtimes take the
//! fallback they have for older kernels (clone3 → clone, faccessat2 →
//! faccessat); the calls denied on purpose are listed with EPERM and why.
//!
//! Nothing here may fall back to a weaker filter: a profile that can't be
//! compiled exactly as written is an error, and the job does not run.

pub mod bpf;
pub mod cache;
pub mod compile;
#[cfg(any(test, fuzzing))]
pub mod interp;
pub mod profile;

use super::sys::SysError;
use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The name the embedded default profile is reported under.
pub const DEFAULT_NAME: &str = "default.json";

/// `seccomp/default.json`, as built into this binary.
pub const DEFAULT_PROFILE: &str = include_str!("../../../../seccomp/default.json");

/// The kernel's limit on one filter (BPF_MAXINSNS).
const MAX_INSNS: usize = 4096;
const INSN: usize = std::mem::size_of::<libc::sock_filter>();

/// A profile that could not be turned into a filter. Messages name the file
/// and the entry, and say what to change.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// The profile file could not be read.
    #[error("cannot read seccomp profile {file}: {source}")]
    Read { file: String, source: std::io::Error },
    /// Not JSON, or not shaped like an OCI/Docker seccomp profile.
    #[error("seccomp profile {file} is not a valid OCI/Docker seccomp profile: {reason}")]
    Format { file: String, reason: String },
    /// A top-level field confine can't honour.
    #[error("seccomp profile {file}: {field}: {reason}")]
    Field { file: String, field: String, reason: String },
    /// One entry of `syscalls` is malformed.
    #[error("seccomp profile {file}: syscalls[{index}] ({names}): {reason}")]
    Entry { file: String, index: usize, names: String, reason: String },
    /// One syscall of an entry can't be compiled as written.
    #[error("seccomp profile {file}: syscalls[{index}]: '{name}': {reason}")]
    Rule { file: String, index: usize, name: String, reason: String },
    /// libseccomp failed outside any one rule.
    #[error("seccomp profile {file}: libseccomp failed to {step}: {source}")]
    Libseccomp { file: String, step: String, source: libseccomp::error::SeccompError },
    /// The program is longer than the kernel accepts.
    #[error(
        "seccomp profile {file} compiles to {insns} BPF instructions, more than the kernel's limit of {MAX_INSNS}: \
         merge entries or drop argument conditions"
    )]
    TooLarge { file: String, insns: usize },
    /// A fact about this host (kernel version) could not be read.
    #[error("cannot evaluate seccomp profiles on this host: {reason}")]
    Host { reason: String },
    /// The sealed memfd holding the program could not be made.
    #[error("cannot store the compiled seccomp program ({step}): {source}")]
    Memfd { step: &'static str, source: Errno },
}

/// A compiled profile: its BPF program in a sealed memfd (close-on-exec),
/// ready to be placed at fd 4 of any number of jobs.
#[derive(Debug)]
pub struct CompiledProfile {
    /// What the outcome reports: `default.json`, or the file name given.
    pub name: String,
    pub fd: OwnedFd,
}

impl CompiledProfile {
    /// The BPF program, read from offset 0 without moving the shared offset.
    pub fn bpf(&self) -> std::io::Result<Vec<u8>> {
        read_all_at(&File::from(self.fd.try_clone()?))
    }

    /// Number of BPF instructions in the program.
    pub fn instructions(&self) -> std::io::Result<usize> {
        Ok(File::from(self.fd.try_clone()?).metadata()?.len() as usize / INSN)
    }
}

/// Compile the embedded `seccomp/default.json` for this host (or load it
/// from the [`cache`]).
pub fn compile_default() -> Result<CompiledProfile, SeccompError> {
    compile_cached(DEFAULT_NAME, DEFAULT_PROFILE, &profile::HostFacts::current()?)
}

/// Compile the profile at `path` for this host (or load it from the
/// [`cache`]). It is reported under its file name.
pub fn compile_file(path: &Path) -> Result<CompiledProfile, SeccompError> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| path.display().to_string());
    let text = std::fs::read_to_string(path)
        .map_err(|source| SeccompError::Read { file: path.display().to_string(), source })?;
    compile_cached(&name, &text, &profile::HostFacts::current()?)
}

/// [`compile_str`], through the on-disk cache when this process may trust
/// one. Only programs that compiled are ever stored, so a bad profile is
/// an error on every run.
pub fn compile_cached(name: &str, text: &str, host: &profile::HostFacts) -> Result<CompiledProfile, SeccompError> {
    let Some(cache) = cache::Cache::open() else { return compile_str(name, text, host) };
    let key = cache::Cache::key(name, text, &format!("{host:?}"));
    if let Some(program) = cache.load(&key) {
        return sealed(name, |fd| {
            fd.try_clone()
                .and_then(|fd| File::from(fd).write_all(&program))
                .map_err(|e| SeccompError::Memfd { step: "write", source: io_errno(e) })
        });
    }
    let compiled = compile_str(name, text, host)?;
    if let Ok(program) = compiled.bpf() {
        cache.store(&key, &program);
    }
    Ok(compiled)
}

/// Compile profile text named `name` for `host`.
pub fn compile_str(name: &str, text: &str, host: &profile::HostFacts) -> Result<CompiledProfile, SeccompError> {
    let parsed = profile::parse(name, text)?;
    let plan = profile::plan(name, &parsed, host)?;
    let Some(arch) = bpf::native_arch() else {
        let ctx = compile::filter(name, &plan)?;
        return sealed(name, |fd| compile::export(name, &ctx, fd));
    };
    let program = bpf::program(name, &plan, arch)?;
    sealed(name, |fd| {
        fd.try_clone()
            .and_then(|fd| File::from(fd).write_all(&to_bytes(&program)))
            .map_err(|e| SeccompError::Memfd { step: "write", source: io_errno(e) })
    })
}

/// The program as the kernel reads it: `struct sock_filter` after another.
pub fn to_bytes(program: &[libc::sock_filter]) -> Vec<u8> {
    let mut out = Vec::with_capacity(program.len() * INSN);
    for i in program {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.extend([i.jt, i.jf]);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

/// A sealed memfd holding the program that `fill` writes into it, checked
/// to be a whole number of instructions within the kernel's limit.
fn sealed(
    name: &str,
    fill: impl FnOnce(&OwnedFd) -> Result<(), SeccompError>,
) -> Result<CompiledProfile, SeccompError> {
    let memfd = |step| move |source| SeccompError::Memfd { step, source };
    let fd = memfd_create(c"confine-seccomp", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(memfd("memfd_create"))?;
    fill(&fd)?;
    let file = File::from(fd);
    let len = file.metadata().map_err(|e| SeccompError::Memfd { step: "measure", source: io_errno(e) })?.len() as usize;
    if len == 0 || !len.is_multiple_of(INSN) {
        return Err(SeccompError::Memfd { step: "export produced a malformed program", source: Errno::EINVAL });
    }
    if len / INSN > MAX_INSNS {
        return Err(SeccompError::TooLarge { file: name.into(), insns: len / INSN });
    }
    let fd = OwnedFd::from(file);
    // Sealed, a job (or a bug) holding the fd can't change what later jobs load.
    let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
    fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(memfd("seal"))?;
    Ok(CompiledProfile { name: name.into(), fd })
}

/// Read all of `file` with positioned reads from offset 0. Jobs started
/// together share the memfd's open file description, so its offset must
/// never be used.
fn read_all_at(file: &File) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match file.read_at(&mut buf, bytes.len() as u64) {
            Ok(0) => return Ok(bytes),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Init stage: read the BPF program from `fd` and install it on the calling
/// thread (no_new_privs is already set). Closes `fd`, so the job can't read
/// it after exec.
pub fn load_from_fd(fd: i32) -> Result<(), SysError> {
    // SAFETY: fd 4 is the memfd the supervisor placed there for us; we take
    // it over and close it, so the job can't read it after exec either.
    let file = unsafe { File::from_raw_fd(fd) };
    let bytes = read_all_at(&file).map_err(|e| SysError::io("read seccomp program", Path::new("memfd"), e))?;
    install(&bytes)
}

/// Install a raw BPF program (a sequence of `struct sock_filter`).
pub fn install(bytes: &[u8]) -> Result<(), SysError> {
    if bytes.is_empty() || !bytes.len().is_multiple_of(INSN) || bytes.len() / INSN > MAX_INSNS {
        return Err(SysError::call("seccomp program is malformed", Errno::EINVAL));
    }
    let filters: Vec<libc::sock_filter> = bytes
        .chunks_exact(INSN)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let prog = libc::sock_fprog { len: filters.len() as u16, filter: filters.as_ptr() as *mut libc::sock_filter };
    // SAFETY: prog points at `filters`, which outlives the call; the kernel
    // copies the program. no_new_privs is set by the caller.
    let ret = unsafe { libc::syscall(libc::SYS_seccomp, libc::SECCOMP_SET_MODE_FILTER, 0u32, &prog as *const _) };
    Errno::result(ret).map(drop).map_err(|e| SysError::call("install seccomp filter", e))
}

#[cfg(test)]
mod tests;
