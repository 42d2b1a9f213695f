//! The bearer tokens `confine serve --http` accepts: loaded from
//! `--token-file`, `$CONFINE_TOKEN` and `[[mcp.tokens]]`, or, when none is
//! given, generated at start and written where only this user can read
//! it, as Jupyter does.
//!
//! Every HTTP server has a token: on loopback too, since any local process
//! (a job run with `--net host` among them) can reach loopback. Only
//! `--no-token` on a loopback address serves without one. A token is
//! RFC 6750's `b64token` (A-Z a-z 0-9 - . _ ~ + /, then optional '='),
//! checked at load, so what a client must send is unambiguous. Tokens are
//! kept only as SHA-256 digests. The generated file is created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW`, 0600, in a directory this process
//! made (or found) owned by itself and writable by no one else, through
//! that directory's fd; it is removed at shutdown.

use super::access::{RepoScope, DEFAULT_TOKEN};
use super::McpError;
use crate::config::McpConfig;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Environment variable holding the bearer token when no --token-file is given.
pub const TOKEN_ENV: &str = "CONFINE_TOKEN";

/// One token the server accepts: its digest, and whose it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    /// `default` (the operator's token), or `token:<id>` of `[[mcp.tokens]]`.
    pub principal: String,
    pub digest: [u8; 32],
    pub repos: RepoScope,
}

impl Credential {
    /// The operator's own token: every repository.
    pub fn operator(token: &str) -> Credential {
        Credential { principal: DEFAULT_TOKEN.into(), digest: digest(token), repos: RepoScope::All }
    }
}

/// SHA-256 of a token.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// RFC 6750 §2.1 `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" /
/// "+" / "/" ) *"="`.
pub fn is_b64token(t: &str) -> bool {
    let body = t.trim_end_matches('=');
    !body.is_empty() && body.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b))
}

fn checked(token: String, from: &str) -> Result<String, McpError> {
    if is_b64token(&token) {
        Ok(token)
    } else {
        Err(McpError::Config(format!(
            "the bearer token from {from} has characters a client can't send (RFC 6750): use only A-Z a-z 0-9 \
             - . _ ~ + / and trailing '=', e.g. `openssl rand -hex 32`"
        )))
    }
}

/// The first line of a token file, checked.
fn read_token_file(path: &Path, from: &str) -> Result<String, McpError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| McpError::Config(format!("cannot read {from} {}: {e}", path.display())))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(McpError::Config(format!("{from} {} is empty", path.display())));
    }
    warn_if_readable_by_others(path);
    checked(token, &format!("{from} {}", path.display()))
}

/// The tokens given: `--token-file` (else `$CONFINE_TOKEN`, `env`) as the
/// operator's, then every `[[mcp.tokens]]` with its repositories. Empty
/// when none is given.
pub fn load(token_file: Option<&Path>, env: Option<String>, config: &McpConfig) -> Result<Vec<Credential>, McpError> {
    let mut out = Vec::new();
    if let Some(path) = token_file {
        out.push(Credential::operator(&read_token_file(path, "--token-file")?));
    } else if let Some(t) = env.map(|t| t.trim().to_string()).filter(|t| !t.is_empty()) {
        tracing::info!("using the bearer token from {TOKEN_ENV}");
        out.push(Credential::operator(&checked(t, TOKEN_ENV)?));
    }
    for t in &config.tokens {
        let digest = match (&t.file, &t.sha256) {
            (Some(f), _) => digest(&read_token_file(f, &format!("mcp.tokens '{}' file", t.id))?),
            (None, Some(h)) => {
                let mut d = [0u8; 32];
                hex::decode_to_slice(h, &mut d).map_err(|e| {
                    McpError::Config(format!("mcp.tokens '{}': sha256 is not 64 hex digits: {e}", t.id))
                })?;
                d
            }
            (None, None) => return Err(McpError::Config(format!("mcp.tokens '{}' has no file or sha256", t.id))),
        };
        out.push(Credential { principal: format!("token:{}", t.id), digest, repos: RepoScope::from_list(&t.repos) });
    }
    Ok(out)
}

#[cfg(unix)]
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(path = %path.display(), "the token file is readable by group or others; chmod 600 it");
        }
    }
}

#[cfg(not(unix))]
fn warn_if_readable_by_others(_path: &Path) {}

/// 32 random bytes, hex.
pub fn generate() -> Result<String, McpError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| McpError::Config(format!("cannot generate a bearer token: {e}")))?;
    Ok(hex::encode(bytes))
}

/// Where a generated token is written: `$XDG_RUNTIME_DIR/confine`, else,
/// for root, `/run/confine`. `env` reads the environment (a parameter, so
/// this is testable).
pub fn runtime_dir(env: impl Fn(&str) -> Option<std::ffi::OsString>, is_root: bool) -> Result<PathBuf, McpError> {
    let base = match env("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(dir) => dir,
        None if is_root => PathBuf::from("/run"),
        None => {
            return Err(McpError::Config(
                "no token was given and XDG_RUNTIME_DIR is not set, so there is nowhere private to write one: \
                 pass --token-file FILE, set CONFINE_TOKEN, or set XDG_RUNTIME_DIR"
                    .into(),
            ))
        }
    };
    Ok(base.join("confine"))
}

/// A generated token's file; removed when dropped (at shutdown).
#[derive(Debug)]
pub struct TokenFile {
    dir: crate::dirfd::Dir,
    name: String,
    path: PathBuf,
}

impl TokenFile {
    /// Write `token` to `<dir>/<name>`, 0600. `dir`'s parent must exist;
    /// `dir` is created 0700 if missing and must be owned by this user and
    /// writable by no one else, or nothing is written.
    pub fn create(dir: &Path, name: &str, token: &str) -> Result<TokenFile, McpError> {
        use std::io::Write;
        let shown = dir.join(name);
        let fail = |what: &str, e: std::io::Error| {
            McpError::Config(format!("cannot write the generated token to {}: {what}: {e}", shown.display()))
        };
        let (Some(parent), Some(leaf)) = (dir.parent(), dir.file_name()) else {
            return Err(fail("bad directory", std::io::ErrorKind::InvalidInput.into()));
        };
        let base = crate::dirfd::Dir::open(parent).map_err(|e| fail("opening its parent", e))?;
        base.mkdir(leaf, 0o700).map_err(|e| fail("creating its directory", e))?;
        let d = base.dir(Path::new(leaf)).map_err(|e| fail("opening its directory (a symlink?)", e))?;
        let st = d.stat().map_err(|e| fail("checking its directory", e))?;
        if st.uid != effective_uid() || st.mode & 0o022 != 0 {
            return Err(McpError::Config(format!(
                "{} is owned by uid {} or writable by group or others (mode {:o}); a token written there could be \
                 read or replaced: remove it, or pass --token-file FILE",
                dir.display(),
                st.uid,
                st.mode
            )));
        }
        let os = std::ffi::OsStr::new(name);
        let mut f = match d.create_new(os, 0o600) {
            Ok(f) => f,
            // A file a crashed server left: this directory is ours alone
            // (checked above), so it is ours to replace.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                d.unlink(os).map_err(|e| fail("removing a stale file", e))?;
                d.create_new(os, 0o600).map_err(|e| fail("creating", e))?
            }
            Err(e) => return Err(fail("creating", e)),
        };
        f.write_all(format!("{token}\n").as_bytes()).and_then(|()| f.sync_all()).map_err(|e| fail("writing", e))?;
        Ok(TokenFile { dir: d, name: name.to_string(), path: shown })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if let Err(e) = self.dir.unlink(std::ffi::OsStr::new(&self.name)) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove the generated token file");
        }
    }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    cfg!(unix) && effective_uid() == 0
}

#[cfg(unix)]
fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and can't fail.
    unsafe { libc::geteuid() }
}

#[cfg(not(unix))]
fn effective_uid() -> u32 {
    u32::MAX
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_b64token() {
        for ok in ["s3cret", "e2e-token", "a.b_c~d+e/f==", &generate().unwrap()] {
            assert!(is_b64token(ok), "{ok}");
        }
        for bad in ["", "==", "two words", "tab\there", "quote\"", "comma,", "é"] {
            assert!(!is_b64token(bad), "{bad}");
        }
        assert_eq!(generate().unwrap().len(), 64);
        assert_ne!(generate().unwrap(), generate().unwrap());
    }

    #[test]
    fn the_runtime_dir_is_xdg_else_run_for_root_else_an_error() {
        let xdg = |v: &'static str| move |k: &str| (k == "XDG_RUNTIME_DIR").then(|| v.into());
        assert_eq!(runtime_dir(xdg("/run/user/1000"), false).unwrap(), PathBuf::from("/run/user/1000/confine"));
        assert_eq!(runtime_dir(|_| None, true).unwrap(), PathBuf::from("/run/confine"));
        assert_eq!(runtime_dir(xdg("relative"), true).unwrap(), PathBuf::from("/run/confine"));
        let e = runtime_dir(|_| None, false).unwrap_err().to_string();
        assert!(e.contains("--token-file") && e.contains("XDG_RUNTIME_DIR"), "{e}");
    }

    #[test]
    fn the_token_file_is_private_never_follows_a_link_and_goes_at_drop() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("confine");
        let f = TokenFile::create(&dir, "mcp-1.token", "abc").unwrap();
        assert_eq!(std::fs::read_to_string(f.path()).unwrap(), "abc\n");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&dir), mode(f.path())), (0o700, 0o600));
        let path = f.path().to_path_buf();
        drop(f);
        assert!(!path.exists());
        // A directory others can write is refused, and so is a symlink.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = TokenFile::create(&dir, "x", "abc").unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::remove_dir(&dir).unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        assert!(TokenFile::create(&dir, "x", "abc").is_err());
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn configured_tokens_carry_their_repositories() {
        let t = tempfile::tempdir().unwrap();
        let file = t.path().join("ops");
        std::fs::write(&file, "ops-token\n").unwrap();
        let config = McpConfig {
            tokens: vec![
                crate::config::TokenConfig {
                    id: "ci".into(),
                    file: None,
                    sha256: Some(hex::encode(digest("ci-token"))),
                    repos: vec!["web".into()],
                },
                crate::config::TokenConfig {
                    id: "ops".into(),
                    file: Some(file),
                    sha256: None,
                    repos: vec!["*".into()],
                },
            ],
        };
        let creds = load(None, Some(" env-token ".into()), &config).unwrap();
        assert_eq!(creds[0], Credential::operator("env-token"));
        assert_eq!((creds[1].principal.as_str(), creds[1].digest), ("token:ci", digest("ci-token")));
        assert!(creds[1].repos.allows("web") && !creds[1].repos.allows("api"));
        assert_eq!((creds[2].digest, creds[2].repos.clone()), (digest("ops-token"), RepoScope::All));
        assert!(load(None, None, &McpConfig::default()).unwrap().is_empty());
        let e = load(None, Some("has space".into()), &McpConfig::default()).unwrap_err().to_string();
        assert!(e.contains("RFC 6750"), "{e}");
    }
}
