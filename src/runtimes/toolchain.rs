//! Which host paths a toolchain needs read-only inside the sandbox, found
//! from where its executable really resolves, never from a list of one
//! distribution's directories.
//!
//! Executables come only from trusted locations ([`trust`]): the
//! supervisor's PATH (outside every repository) and the system
//! directories. A `--executable` path anywhere else, a repository's file
//! above all, is refused before anything is read.
//!
//! Rules, in order, for the executable as found and for its real path
//! (symlinks followed: trusted locations are the operator's): the
//! dot-directory of a known toolchain manager in a home (`~/.cargo`,
//! `~/.rustup`, `~/.pyenv`, `~/.nvm`, …) is bound whole, with the
//! variables that tell the tool where it lives (HOME is /tmp inside); a
//! package under `node_modules` is bound whole; a JDK under `lib/jvm` is
//! bound whole; `<prefix>/bin/<exe>` binds `<prefix>`; else, when the file
//! sits directly in a trusted PATH directory, that directory. Nothing
//! else: a home itself, `/`, a top-level directory, and anything inside
//! or around a repository are never bound. A trusted script's `#!`
//! interpreter is followed the same way, and must itself be trusted
//! ([`shebang`]). Paths the sandbox binds anyway (/usr, /etc, …) are dropped.

mod shebang;
mod trust;

use super::{plan, Runtime, RuntimeError};
use shebang::Interpreter;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use trust::{Trust, Untrusted};

/// Home dot-directories of toolchain managers, bound whole when an
/// executable resolves into one, and the variable that points the tool
/// at its home when HOME is elsewhere (none: the tool finds itself).
const TOOLCHAIN_HOMES: &[(&str, Option<&str>)] = &[
    (".cargo", Some("CARGO_HOME")),
    (".rustup", Some("RUSTUP_HOME")),
    (".pyenv", Some("PYENV_ROOT")),
    (".rbenv", Some("RBENV_ROOT")),
    (".nvm", Some("NVM_DIR")),
    (".dotnet", Some("DOTNET_ROOT")),
    (".sdkman", Some("SDKMAN_DIR")),
    (".bun", Some("BUN_INSTALL")),
    (".deno", Some("DENO_INSTALL")),
    (".volta", Some("VOLTA_HOME")),
    (".nodenv", Some("NODENV_ROOT")),
    (".goenv", Some("GOENV_ROOT")),
    (".asdf", Some("ASDF_DATA_DIR")),
    (".jenv", None),
    (".ghcup", None),
    (".elan", None),
    (".juliaup", None),
];

/// How deep `#!` interpreters are followed.
const MAX_SHEBANG_DEPTH: usize = 3;

/// The host as the resolver sees it (parameters, so tests use a tempdir).
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// The supervisor's PATH, where toolchains are looked up.
    pub path: OsString,
    /// The supervisor's HOME.
    pub home: Option<PathBuf>,
    /// Host paths the sandbox binds anyway; toolchain paths under them are
    /// dropped, and executables in them are trusted.
    pub bound: Vec<PathBuf>,
    /// Canonical roots of the configured repositories: no executable is
    /// taken from them, and no directory in or around them is bound.
    pub repos: Vec<PathBuf>,
}

impl Host {
    /// This process's PATH and HOME, and the system paths the Linux
    /// backend binds into every sandbox. No repositories: add them with
    /// [`Host::with_repos`].
    pub fn from_env() -> Host {
        #[cfg(target_os = "linux")]
        let bound = crate::sandbox::linux::mounts::SYSTEM_PATHS.iter().map(PathBuf::from).collect();
        #[cfg(not(target_os = "linux"))]
        let bound = Vec::new();
        Host {
            path: std::env::var_os("PATH").unwrap_or_else(|| crate::env::SANDBOX_PATH.into()),
            home: std::env::var_os("HOME").map(PathBuf::from),
            bound,
            repos: Vec::new(),
        }
    }

    /// The same host, knowing the repositories' roots (canonicalised here).
    pub fn with_repos<'a>(mut self, roots: impl IntoIterator<Item = &'a Path>) -> Host {
        self.repos = trust::canonical_roots(roots);
        self
    }
}

/// A runtime's executables, found, with what they need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub runtime: &'static Runtime,
    /// The main executable as found on PATH (argv[0]: rustup's proxies
    /// dispatch on their name, so it is not the symlink target).
    pub executable: PathBuf,
    /// Other executables the plan runs (`java` after `javac`), by name.
    pub helpers: Vec<(String, PathBuf)>,
    /// Host paths to bind read-only at the same place.
    pub ro_paths: Vec<PathBuf>,
    /// Variables the toolchain needs (RUSTUP_HOME, PYENV_ROOT, …).
    pub env: Vec<(String, String)>,
    /// Directories to put in front of the sandbox's PATH.
    pub path_dirs: Vec<PathBuf>,
}

impl Resolved {
    /// The path of helper `name`.
    pub fn helper(&self, name: &str) -> Option<&Path> {
        self.helpers.iter().find(|(n, _)| n == name).map(|(_, p)| p.as_path())
    }
}

/// Find the executables of `rt` (the override, else the first default
/// found) and everything they need. A missing one is "not installed"; one
/// outside the trusted locations is refused.
pub fn resolve(
    rt: &'static Runtime,
    executable: Option<&str>,
    code_mode: bool,
    host: &Host,
) -> Result<Resolved, RuntimeError> {
    let trust = Trust::new(&host.path, &host.bound, &host.repos);
    let not_installed = |names: &[&str]| RuntimeError::NotInstalled {
        runtime: rt.name.to_string(),
        executable: match names {
            [one] => one.to_string(),
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
            [] => String::new(),
        },
    };
    let untrusted =
        |exe: &str, why: Untrusted| RuntimeError::Untrusted { executable: exe.to_string(), reason: why.reason() };
    let main = match executable {
        Some(exe) => {
            rt.check_override(exe)?;
            let code_capable = plan::code_executables(rt);
            if code_mode && !super::name_matches(super::basename(exe), code_capable) {
                return Err(RuntimeError::Incompatible {
                    runtime: format!("{} (code mode)", rt.name),
                    executable: super::basename(exe).to_string(),
                    expected: code_capable.join(", "),
                });
            }
            trust
                .lookup(exe, None)
                .map_err(|why| untrusted(exe, why))?
                .ok_or_else(|| not_installed(&[super::basename(exe)]))?
        }
        None => {
            let defaults = plan::default_executables(rt, code_mode);
            let mut found = None;
            for e in defaults {
                if let Some(p) = trust.lookup(e, None).map_err(|why| untrusted(e, why))? {
                    found = Some(p);
                    break;
                }
            }
            found.ok_or_else(|| not_installed(defaults))?
        }
    };
    let mut r = Resolved {
        runtime: rt,
        executable: main.clone(),
        helpers: Vec::new(),
        ro_paths: Vec::new(),
        env: Vec::new(),
        path_dirs: Vec::new(),
    };
    collect(&main, host, &trust, &mut r, 0);
    let name = super::basename(&main.to_string_lossy()).to_string();
    for helper in plan::helpers(rt, &name, code_mode) {
        let found = trust
            .lookup(helper, None)
            .map_err(|why| untrusted(helper, why))?
            .ok_or_else(|| not_installed(&[helper]))?;
        collect(&found, host, &trust, &mut r, 0);
        r.helpers.push((helper.to_string(), found));
    }
    r.ro_paths = minimal_roots(std::mem::take(&mut r.ro_paths), &host.bound);
    Ok(r)
}

/// What makes `command`, which a job could not find, run in the sandbox:
/// the flags that bind its toolchain read-only at the same place and set
/// the variables it needs (`--ro-bind /root/.cargo:/root/.cargo …`), as
/// one line for the error to print. `None` when the host has no such
/// executable in a trusted location (the caller's PATH and the system
/// directories, never a repository), or when it needs no bind.
pub fn bind_hint(command: &str, host: &Host) -> Option<String> {
    let trust = Trust::new(&host.path, &host.bound, &host.repos);
    let exe = trust.lookup(command, None).ok()??;
    static ANY: Runtime = Runtime { name: "command", executables: &[], compatible: &[], source_file: "" };
    let mut r = Resolved {
        runtime: &ANY,
        executable: exe.clone(),
        helpers: Vec::new(),
        ro_paths: Vec::new(),
        env: Vec::new(),
        path_dirs: Vec::new(),
    };
    collect(&exe, host, &trust, &mut r, 0);
    let roots = minimal_roots(std::mem::take(&mut r.ro_paths), &host.bound);
    if roots.is_empty() {
        return None;
    }
    let mut flags: Vec<String> = roots.iter().map(|p| format!("--ro-bind {0}:{0}", p.display())).collect();
    flags.extend(r.env.iter().map(|(k, v)| format!("--env {k}={v}")));
    if !command.contains('/') {
        flags.push("--".into());
        flags.push(exe.display().to_string());
    }
    Some(flags.join(" "))
}

/// Add what `exe` needs to `r`. `exe` passed the trust rules (it was
/// looked up through [`Trust`]), so its real path may be followed and its
/// `#!` line read.
fn collect(exe: &Path, host: &Host, trust: &Trust, r: &mut Resolved, depth: usize) {
    let Ok(real) = std::fs::canonicalize(exe) else { return };
    if trust.in_repository(&real) {
        return;
    }
    if let Some(dir) = exe.parent() {
        let on_sandbox_path = std::env::split_paths(crate::env::SANDBOX_PATH).any(|d| d == dir);
        if !on_sandbox_path && !r.path_dirs.iter().any(|d| d == dir) {
            r.path_dirs.push(dir.to_path_buf());
        }
    }
    let mut found_home = false;
    for p in [exe, real.as_path()] {
        if let Some((dot, name)) = home_dot_dir(p, host.home.as_deref()) {
            if trust.touches_repository(&dot) {
                continue;
            }
            found_home = true;
            add_home_dir(&dot, &name, r);
            if name == ".cargo" {
                // A rustup proxy in ~/.cargo/bin needs the toolchains in ~/.rustup.
                if let Some(rustup) = dot.parent().map(|h| h.join(".rustup")).filter(|p| p.is_dir()) {
                    if !trust.touches_repository(&rustup) {
                        add_home_dir(&rustup, ".rustup", r);
                    }
                }
            }
        }
    }
    if !found_home {
        if let Some(root) = toolchain_roots(&real, trust).into_iter().find(|root| bindable(root, host, trust)) {
            r.ro_paths.push(root);
        }
    }
    if depth >= MAX_SHEBANG_DEPTH {
        return;
    }
    let interp = match shebang::interpreter(&real) {
        Some(Interpreter::Path(p)) => trust.lookup(&p, None),
        Some(Interpreter::Env { env, command, alt_path }) => match trust.lookup(&env, None) {
            // `env` itself must be trusted before what it would look up.
            Ok(Some(_)) => trust.lookup(&command, alt_path.as_deref().map(std::ffi::OsStr::new)),
            other => other,
        },
        None => Ok(None),
    };
    match interp {
        Ok(Some(interp)) => collect(&interp, host, trust, r, depth + 1),
        Ok(None) => {}
        // Not bound; the job then fails to start its interpreter, visibly.
        Err(why) => tracing::debug!(script = %exe.display(), reason = why.reason(), "#! interpreter not trusted"),
    }
}

fn add_home_dir(dir: &Path, name: &str, r: &mut Resolved) {
    r.ro_paths.push(dir.to_path_buf());
    if let Some((_, Some(var))) = TOOLCHAIN_HOMES.iter().find(|(n, _)| *n == name) {
        let value = dir.to_string_lossy().into_owned();
        if !r.env.iter().any(|(k, _)| k == var) {
            r.env.push((var.to_string(), value));
        }
    }
}

/// The homes of this host as the resolver knows them: `$HOME`, `/root`,
/// and `/home/<user>` for the path at hand.
fn homes(p: &Path, home: Option<&Path>) -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = home.map(Path::to_path_buf).into_iter().collect();
    homes.push(PathBuf::from("/root"));
    let comps: Vec<Component> = p.components().collect();
    if let [Component::RootDir, Component::Normal(h), Component::Normal(user), ..] = comps.as_slice() {
        if *h == "home" {
            homes.push(Path::new("/home").join(user));
        }
    }
    homes
}

/// `<home>/.<name>` when `p` lies in the dot-directory of a known
/// toolchain manager in a home (`$HOME`, `/root`, `/home/<user>`).
fn home_dot_dir(p: &Path, home: Option<&Path>) -> Option<(PathBuf, String)> {
    homes(p, home).iter().find_map(|home| {
        let rest = p.strip_prefix(home).ok()?;
        let first = rest.components().next()?.as_os_str().to_string_lossy().into_owned();
        let known = TOOLCHAIN_HOMES.iter().any(|(n, _)| *n == first);
        (known && rest.components().count() > 1).then(|| (home.join(&first), first))
    })
}

/// The directories that could hold the toolchain of the real executable
/// `real`, best first: a `node_modules` package, a JDK under `lib/jvm`,
/// `<prefix>` of `<prefix>/bin/<exe>`, then the directory the file is in
/// when it is a trusted PATH directory (never the directory of an
/// arbitrary file). The caller binds the first that is [`bindable`].
fn toolchain_roots(real: &Path, trust: &Trust) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let comps: Vec<&std::ffi::OsStr> = real.components().map(|c| c.as_os_str()).collect();
    // …/node_modules/<pkg>/… or …/node_modules/@scope/<pkg>/…
    if let Some(i) = comps.iter().rposition(|c| *c == "node_modules") {
        let scoped = comps.get(i + 1).is_some_and(|c| c.to_string_lossy().starts_with('@'));
        let end = i + if scoped { 3 } else { 2 };
        if end < comps.len() {
            roots.push(comps[..end].iter().collect());
        }
    }
    // …/lib/jvm/<jdk>/… (the JRE inside a JDK needs the whole JDK)
    if let Some(i) = comps.windows(2).position(|w| w[0] == "lib" && w[1] == "jvm") {
        if i + 3 < comps.len() {
            roots.push(comps[..i + 3].iter().collect());
        }
    }
    let Some(parent) = real.parent() else { return roots };
    if parent.file_name().is_some_and(|n| n == "bin" || n == "sbin") {
        roots.extend(parent.parent().map(Path::to_path_buf));
    }
    if trust.is_path_dir(parent) {
        roots.push(parent.to_path_buf());
    }
    roots
}

/// At least two levels below `/` (`/opt/go`, not `/opt` or `/`).
fn shape_ok(dir: &Path) -> bool {
    dir.is_absolute() && dir.components().filter(|c| matches!(c, Component::Normal(_))).count() >= 2
}

/// Whether `dir` may be bound into a job: not `/`, not a top-level
/// directory, not a home (nor above one), not a dot-directory of a home
/// that is not a toolchain manager's (`~/.local`, `~/.config` hold a
/// user's files), and not a repository, inside one or holding one.
fn bindable(dir: &Path, host: &Host, trust: &Trust) -> bool {
    if !shape_ok(dir) || trust.touches_repository(dir) {
        return false;
    }
    let homes = homes(dir, host.home.as_deref());
    if homes.iter().any(|h| h.starts_with(dir)) {
        return false;
    }
    let user_dot_dir = homes.iter().any(|h| {
        dir.parent() == Some(h.as_path())
            && dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'))
            && home_dot_dir(&dir.join("x"), host.home.as_deref()).is_none()
    });
    !user_dot_dir
}

/// Drop paths under `bound` and paths nested in another, keep the order.
fn minimal_roots(mut roots: Vec<PathBuf>, bound: &[PathBuf]) -> Vec<PathBuf> {
    roots.retain(|r| r.is_absolute() && !bound.iter().any(|b| r.starts_with(b)));
    let mut out: Vec<PathBuf> = Vec::new();
    for r in roots {
        if out.iter().any(|o| r.starts_with(o)) {
            continue;
        }
        out.retain(|o| !o.starts_with(&r));
        out.push(r);
    }
    out
}

#[cfg(test)]
mod tests;
