//! Seccomp: load the BPF program the supervisor compiled once, from the
//! sealed memfd at fd 4. Installed last, after landlock, capabilities and
//! no_new_privs.

use super::sys::SysError;
use nix::errno::Errno;
use std::io::Read;
use std::os::fd::FromRawFd;

/// Read the BPF program from `fd` and install it on the calling thread.
pub fn load_from_fd(fd: i32) -> Result<(), SysError> {
    // SAFETY: fd 4 is the memfd the supervisor placed there for us; we take
    // it over and close it, so the job can't read it after exec either.
    let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| SysError::io("read seccomp program", std::path::Path::new("memfd"), e))?;
    install(&bytes)
}

/// Install a raw BPF program (a sequence of `struct sock_filter`).
pub fn install(bytes: &[u8]) -> Result<(), SysError> {
    const INSN: usize = std::mem::size_of::<libc::sock_filter>();
    if bytes.is_empty() || bytes.len() % INSN != 0 || bytes.len() / INSN > u16::MAX as usize {
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
