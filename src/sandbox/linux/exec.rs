//! The last step of the job process: find the command in the sandbox's
//! PATH and execve it with the scrubbed environment. Runs after
//! `pivot_root`, so nothing outside the new root can be found.

use nix::errno::Errno;
use std::ffi::CString;

/// The default PATH of a job when none is given.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Replace this process with `argv`. Returns only on failure, with the
/// errno that explains it (ENOENT when no PATH entry holds the command).
pub fn execvpe(argv: &[String], env: &[(String, String)]) -> Errno {
    let Some(cmd) = argv.first() else { return Errno::ENOENT };
    let Ok(args) = argv.iter().map(|a| CString::new(a.as_bytes())).collect::<Result<Vec<_>, _>>() else {
        return Errno::EINVAL;
    };
    let Ok(envp) = env.iter().map(|(k, v)| CString::new(format!("{k}={v}"))).collect::<Result<Vec<_>, _>>() else {
        return Errno::EINVAL;
    };
    if cmd.contains('/') {
        return match CString::new(cmd.as_bytes()) {
            Ok(path) => exec_one(&path, &args, &envp),
            Err(_) => Errno::EINVAL,
        };
    }
    if cmd.is_empty() {
        return Errno::ENOENT;
    }
    let path_var = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or(DEFAULT_PATH);
    // As execvp does: keep looking past EACCES, report it if nothing else ran.
    let mut seen_eacces = false;
    for dir in path_var.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let Ok(full) = CString::new(format!("{dir}/{cmd}")) else { continue };
        match exec_one(&full, &args, &envp) {
            Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::ENAMETOOLONG => {}
            Errno::EACCES => seen_eacces = true,
            other => return other,
        }
    }
    if seen_eacces {
        Errno::EACCES
    } else {
        Errno::ENOENT
    }
}

fn exec_one(path: &CString, args: &[CString], env: &[CString]) -> Errno {
    match nix::unistd::execve(path, args, env) {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

/// The CLI exit code for an exec failure: 127 not found, 126 can't execute.
pub fn exit_code_for(errno: i32) -> i32 {
    match Errno::from_raw(errno) {
        Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::ENAMETOOLONG => 127,
        _ => 126,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_and_not_executable_codes() {
        assert_eq!(exit_code_for(libc::ENOENT), 127);
        assert_eq!(exit_code_for(libc::EACCES), 126);
        assert_eq!(exit_code_for(libc::ENOEXEC), 126);
    }

    #[test]
    fn empty_or_nul_commands_fail_without_exec() {
        assert_eq!(execvpe(&[], &[]), Errno::ENOENT);
        assert_eq!(execvpe(&["".into()], &[]), Errno::ENOENT);
        assert_eq!(execvpe(&["a\0b".into()], &[]), Errno::EINVAL);
    }
}
