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
#[error("invalid environment variable '{0}': {1}")]
pub struct InvalidEnvArg(String, String);

/// Why `key` is not a variable name, or `None`: letters, digits and `_`,
/// not starting with a digit (POSIX's portable names, and what docker's
/// `--env-file` and shells accept). Every name a job is given passes here:
/// `-e`, `--env-file` and requests alike.
pub fn invalid_name(key: &str) -> Option<String> {
    let valid = !key.is_empty()
        && !key.starts_with(|c: char| c.is_ascii_digit())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        return None;
    }
    let shown: String = key.chars().take(40).collect();
    Some(format!("'{shown}' is not a variable name (letters, digits and _, not starting with a digit)"))
}

impl std::str::FromStr for EnvArg {
    type Err = InvalidEnvArg;
    fn from_str(s: &str) -> Result<Self, InvalidEnvArg> {
        let (key, value) = match s.split_once('=') {
            Some((k, v)) => (k, Some(v.to_string())),
            None => (s, None),
        };
        if let Some(why) = invalid_name(key) {
            return Err(InvalidEnvArg(s.to_string(), format!("{why}: expected KEY or KEY=VALUE")));
        }
        if value.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(InvalidEnvArg(s.to_string(), "a value can't hold a NUL byte".into()));
        }
        Ok(EnvArg { key: key.to_string(), value })
    }
}

/// The `--env` arguments of an env file (docker's `--env-file` format):
/// one `KEY=VAL` or `KEY` per line, blank lines and `#` comments skipped,
/// values taken as written (no quotes removed, no expansion). A bare
/// `KEY` takes this process's value, as docker's does, only when
/// `may_inherit(KEY)`: a file someone else wrote (a `.env` a job planted
/// in its workspace) must not choose which of this process's variables
/// the job gets, so the caller says which names a file may name bare.
/// A bad line is an error naming the file, the line and why.
///
/// The file may lie where a job wrote (a `.env` in a read-write
/// workspace): it is read as `safe_fs` reads such files, never through a
/// symlink at its name (which could point at a secret only root may
/// read), never blocking on a FIFO, a regular file of at most 1 MiB.
pub fn read_env_file(path: &Path, may_inherit: impl Fn(&str) -> bool) -> Result<Vec<EnvArg>, EnvFileError> {
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
    let line_error = |line, why| EnvFileError::Line { path: path.to_path_buf(), line, why };
    let mut out = Vec::new();
    for (line, arg) in parse_env_file(&text).map_err(|(line, why)| line_error(line, why))? {
        if arg.value.is_none() && !may_inherit(&arg.key) {
            return Err(line_error(line, format!("'{}' would take confine's own value of {0}, which a file may not choose: add {0} to sandbox.env_allowlist in confine.toml, or pass -e {0} on the command line", arg.key)));
        }
        out.push(arg);
    }
    Ok(out)
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

/// The arguments of an env file's text, each with its line number.
fn parse_env_file(text: &str) -> Result<Vec<(usize, EnvArg)>, (usize, String)> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let key = trimmed.split_once('=').map_or(trimmed, |(k, _)| k);
        if let Some(why) = invalid_name(key) {
            return Err((n + 1, format!("{why}: expected KEY=VALUE or KEY")));
        }
        let arg: EnvArg = trimmed.parse().map_err(|e: InvalidEnvArg| (n + 1, e.to_string()))?;
        out.push((n + 1, arg));
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
        let text = "# comment\n\nA=1\n  B=two words \nC=\"quoted\"\nD=x=y\r\nEDITOR\n";
        let got = parse_env_file(text).unwrap();
        let pairs: Vec<(usize, &str, Option<&str>)> =
            got.iter().map(|(n, e)| (*n, e.key.as_str(), e.value.as_deref())).collect();
        assert_eq!(
            pairs,
            [
                (3, "A", Some("1")),
                (4, "B", Some("two words ")),
                (5, "C", Some("\"quoted\"")),
                (6, "D", Some("x=y")),
                (7, "EDITOR", None)
            ]
        );
        let (line, why) = parse_env_file("A=1\nexport B=2\n").unwrap_err();
        assert_eq!(line, 2);
        assert!(why.contains("'export B' is not a variable name"), "{why}");
        assert_eq!(parse_env_file("=x\n").unwrap_err().0, 1);
        assert_eq!(parse_env_file("A=1\n1X=2\n").unwrap_err().0, 2);
        assert_eq!(parse_env_file("A=1\nB \n").unwrap_err().0, 2);
    }

    /// The attack: a `.env` planted where a job writes names a variable of
    /// confine's own (a token) bare, to have the next run hand it over.
    /// A bare name passes only when the caller lets it.
    #[test]
    fn a_bare_name_in_a_file_takes_our_value_only_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let planted = dir.path().join(".env");
        std::fs::write(&planted, "MODE=test\nEDITOR\nGITHUB_TOKEN\n").unwrap();
        let e = read_env_file(&planted, |k| k == "EDITOR").unwrap_err().to_string();
        assert!(e.starts_with(&format!("--env-file {}, line 3: 'GITHUB_TOKEN'", planted.display())), "{e}");
        assert!(e.contains("sandbox.env_allowlist") && e.contains("-e GITHUB_TOKEN"), "{e}");
        let got = read_env_file(&planted, |k| ["EDITOR", "GITHUB_TOKEN"].contains(&k)).unwrap();
        assert_eq!(got[2], EnvArg { key: "GITHUB_TOKEN".into(), value: None });
        // What the job then gets: the caller's value, as docker's bare KEY.
        let env = scrubbed(&got, host);
        assert!(env.contains(&("EDITOR".into(), "vi".into())) && env.contains(&("MODE".into(), "test".into())));
    }

    #[test]
    fn one_name_rule_for_flags_and_files() {
        for bad in ["=x", "1X", "A B", "A-B=1", "a.b", "X\0Y=1", ""] {
            assert!(bad.parse::<EnvArg>().is_err(), "{bad:?}");
            let key = bad.split_once('=').map_or(bad, |(k, _)| k);
            assert!(invalid_name(key).is_some(), "{bad:?}");
        }
        let e = "A-B=1".parse::<EnvArg>().unwrap_err().to_string();
        assert_eq!(e, "invalid environment variable 'A-B=1': 'A-B' is not a variable name (letters, digits and _, not starting with a digit): expected KEY or KEY=VALUE");
        assert!("X=a\0b".parse::<EnvArg>().is_err());
        for good in ["_", "a1", "HTTPS_PROXY", "X=", "X=a=b c"] {
            assert!(good.parse::<EnvArg>().is_ok(), "{good}");
        }
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
        let e = read_env_file(&link, |_| true).unwrap_err().to_string();
        assert!(e.starts_with(&format!("--env-file {}", link.display())) && !e.contains("hunter2"), "{e}");
        let fifo = dir.path().join("fifo.env");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read_env_file(&fifo, |_| true).is_err());
        assert_eq!(read_env_file(&secret, |_| true).unwrap()[0].value.as_deref(), Some("hunter2"));
        // Nor through a linked directory (red-team finding R7).
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::fs::write(real.join(".env"), "TOKEN=hunter2\n").unwrap();
        std::os::unix::fs::symlink(&real, dir.path().join("config")).unwrap();
        let e = read_env_file(&dir.path().join("config/.env"), |_| true).unwrap_err().to_string();
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
