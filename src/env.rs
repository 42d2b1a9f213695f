//! Environment scrubbing: the job sees PATH, a sandbox HOME and TMPDIR,
//! LANG, and only the variables the caller names. The supervisor's own
//! variables (tokens and the like) never reach a job.

use std::path::{Path, PathBuf};

/// Default PATH inside the sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An `--env` argument: `KEY` (take the supervisor's value) or `KEY=VAL`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvArg {
    pub key: String,
    pub value: Option<String>,
}

/// An `--env` argument that is neither `KEY` nor `KEY=VALUE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid environment variable '{0}': expected KEY or KEY=VALUE")]
pub struct InvalidEnvArg(String);

impl std::str::FromStr for EnvArg {
    type Err = InvalidEnvArg;
    fn from_str(s: &str) -> Result<Self, InvalidEnvArg> {
        let (key, value) = match s.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (s, None),
        };
        if key.is_empty() || key.contains('\0') || value.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(InvalidEnvArg(s.to_string()));
        }
        Ok(EnvArg { key: key.to_string(), value })
    }
}

/// The `--env` arguments of an env file (docker's `--env-file` format):
/// one `KEY=VAL` or `KEY` per line, blank lines and `#` comments skipped,
/// values taken as written (no quotes removed, no expansion). A bad line
/// is an error naming the file, the line and why.
///
/// The file may lie where a job wrote (a `.env` in a read-write
/// workspace): it is read as `safe_fs` reads such files, never through a
/// symlink at its name (which could point at a secret only root may
/// read), never blocking on a FIFO, a regular file of at most 1 MiB. A
/// bare `KEY` line, which docker fills from its own environment, is
/// refused: a file someone else wrote would choose which of this
/// process's variables the job gets.
pub fn read_env_file(path: &Path) -> Result<Vec<EnvArg>, EnvFileError> {
    // Its directories too: a `config -> /root/secrets` link a job left in
    // a workspace must not lead root's read elsewhere.
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let real =
        std::fs::canonicalize(parent).map_err(|source| EnvFileError::Directory { path: path.to_path_buf(), source })?;
    if crate::safe_fs::through_symlink(parent, &real) {
        return Err(EnvFileError::ThroughSymlink {
            path: path.to_path_buf(),
            real: real.join(path.file_name().unwrap_or_default()),
        });
    }
    let text = crate::safe_fs::read_regular_string(path, 1 << 20)
        .map_err(|source| EnvFileError::Read { path: path.to_path_buf(), source })?;
    parse_env_file(&text).map_err(|(line, why)| EnvFileError::Line { path: path.to_path_buf(), line, why })
}

/// Why an env file gave no variables.
#[derive(Debug, thiserror::Error)]
pub enum EnvFileError {
    #[error("--env-file {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error("--env-file {path}: its directory is reached through a symbolic link; give its real path, {real}")]
    ThroughSymlink { path: PathBuf, real: PathBuf },
    #[error("--env-file {path}: {source}")]
    Read { path: PathBuf, source: crate::safe_fs::SafeFsError },
    #[error("--env-file {path}, line {line}: {why}")]
    Line { path: PathBuf, line: usize, why: String },
}

fn parse_env_file(text: &str) -> Result<Vec<EnvArg>, (usize, String)> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let key = trimmed.split_once('=').map_or(trimmed, |(k, _)| k);
        let valid = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            let shown: String = key.chars().take(40).collect();
            return Err((
                n + 1,
                format!("'{shown}' is not a variable name (letters, digits and _, not starting with a digit): expected KEY=VALUE"),
            ));
        }
        if !trimmed.contains('=') {
            return Err((
                n + 1,
                format!(
                    "'{key}' has no value: write {key}=VALUE (to pass this process's own {key}, use -e {key} on \
                     the command line)"
                ),
            ));
        }
        let arg: EnvArg = trimmed.parse().map_err(|e: InvalidEnvArg| (n + 1, e.to_string()))?;
        out.push(arg);
    }
    Ok(out)
}

/// The job's complete environment. `lookup` reads the supervisor's
/// environment (a parameter, so this is testable).
pub fn scrubbed(extra: &[EnvArg], lookup: impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), SANDBOX_PATH.into()),
        ("HOME".into(), "/tmp".into()),
        ("TMPDIR".into(), "/tmp".into()),
        ("LANG".into(), lookup("LANG").unwrap_or_else(|| "C.UTF-8".into())),
    ];
    for arg in extra {
        let Some(value) = arg.value.clone().or_else(|| lookup(&arg.key)) else { continue };
        match env.iter_mut().find(|(k, _)| *k == arg.key) {
            Some(slot) => slot.1 = value,
            None => env.push((arg.key.clone(), value)),
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(k: &str) -> Option<String> {
        match k {
            "SECRET_TOKEN" => Some("s3cr3t".into()),
            "LANG" => Some("de_DE.UTF-8".into()),
            "EDITOR" => Some("vi".into()),
            _ => None,
        }
    }

    #[test]
    fn only_named_variables_pass() {
        let env = scrubbed(&["EDITOR".parse().unwrap(), "X=1".parse().unwrap()], host);
        let keys: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["PATH", "HOME", "TMPDIR", "LANG", "EDITOR", "X"]);
        assert!(!env.iter().any(|(_, v)| v.contains("s3cr3t")));
        assert!(env.contains(&("LANG".into(), "de_DE.UTF-8".into())));
    }

    #[test]
    fn env_files_are_read_as_docker_reads_them() {
        let text = "# comment\n\nA=1\n  B=two words \nC=\"quoted\"\nD=x=y\r\n";
        let got = parse_env_file(text).unwrap();
        let pairs: Vec<(&str, Option<&str>)> = got.iter().map(|e| (e.key.as_str(), e.value.as_deref())).collect();
        assert_eq!(pairs, [("A", Some("1")), ("B", Some("two words ")), ("C", Some("\"quoted\"")), ("D", Some("x=y"))]);
        let (line, why) = parse_env_file("A=1\nexport B=2\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("'export B' is not a variable name"), "{why}");
        assert_eq!(parse_env_file("=x\n").unwrap_err().0, 1);
        assert_eq!(parse_env_file("A=1\n1X=2\n").unwrap_err().0, 2);
        // A bare name would take this process's own value: refused.
        let (line, why) = parse_env_file("A=1\nAWS_SECRET_ACCESS_KEY\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("has no value") && why.contains("-e AWS_SECRET_ACCESS_KEY"), "{why}");
    }

    /// A `.env` a job left as a symlink to a root-only file, or as a FIFO,
    /// is refused, not read (or waited on).
    #[test]
    fn an_env_file_is_never_a_link_or_a_fifo() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "TOKEN=hunter2\n").unwrap();
        let link = dir.path().join(".env");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        let e = read_env_file(&link).unwrap_err().to_string();
        assert!(e.starts_with(&format!("--env-file {}", link.display())) && !e.contains("hunter2"), "{e}");
        let fifo = dir.path().join("fifo.env");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_env_file(&fifo).is_err());
        assert_eq!(read_env_file(&secret).unwrap()[0].value.as_deref(), Some("hunter2"));
        // Nor through a linked directory (red-team finding R7).
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join(".env"), "TOKEN=hunter2\n").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("config")).unwrap();
        let e = read_env_file(&dir.path().join("config/.env")).unwrap_err().to_string();
        assert!(e.contains("symbolic link") && !e.contains("TOKEN=hunter2"), "{e}");
    }

    #[test]
    fn explicit_value_overrides_defaults() {
        let env = scrubbed(&["HOME=/workspace".parse().unwrap()], host);
        assert!(env.contains(&("HOME".into(), "/workspace".into())));
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
    }

    #[test]
    fn unset_named_variable_is_skipped_and_bad_names_rejected() {
        assert_eq!(scrubbed(&["NOPE".parse().unwrap()], host).len(), 4);
        assert!("=x".parse::<EnvArg>().is_err());
    }
}
