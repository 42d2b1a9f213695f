//! Which host paths a toolchain needs read-only inside the sandbox, found
//! from where its executable really resolves, never from a list of one
//! distribution's directories.
//!
//! Rules, in order, for the executable as found on PATH and for its real
//! path (symlinks followed): a dot-directory of a home (`~/.cargo`,
//! `~/.pyenv`, `~/.nvm`, …) is bound whole, with the variables that tell the
//! tool where it lives (HOME is /tmp inside); a package under `node_modules`
//! is bound whole; `<prefix>/bin/<exe>` binds `<prefix>` (a JDK, a Go root);
//! otherwise the real file's directory. A script's `#!` interpreter is
//! followed the same way. Paths the sandbox binds anyway (/usr, /etc, …)
//! are dropped.

use super::{find_on_path, plan, Runtime, RuntimeError};
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Dot-directories that hold a user's files, not a toolchain.
const NOT_TOOLCHAINS: &[&str] = &[".local", ".config", ".cache", ".ssh", ".gnupg", ".aws", ".kube", ".docker"];

/// Variables that point a tool at its home when HOME is elsewhere.
const HOME_VARS: &[(&str, &str)] = &[
    (".cargo", "CARGO_HOME"),
    (".rustup", "RUSTUP_HOME"),
    (".pyenv", "PYENV_ROOT"),
    (".rbenv", "RBENV_ROOT"),
    (".nvm", "NVM_DIR"),
    (".dotnet", "DOTNET_ROOT"),
    (".sdkman", "SDKMAN_DIR"),
    (".bun", "BUN_INSTALL"),
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
    /// Host paths the sandbox binds anyway; toolchain paths under them are dropped.
    pub bound: Vec<PathBuf>,
}

impl Host {
    /// This process's PATH and HOME, and the system paths the Linux
    /// backend binds into every sandbox.
    pub fn from_env() -> Host {
        #[cfg(target_os = "linux")]
        let bound = crate::sandbox::linux::mounts::SYSTEM_PATHS.iter().map(PathBuf::from).collect();
        #[cfg(not(target_os = "linux"))]
        let bound = Vec::new();
        Host {
            path: std::env::var_os("PATH").unwrap_or_else(|| crate::env::SANDBOX_PATH.into()),
            home: std::env::var_os("HOME").map(PathBuf::from),
            bound,
        }
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
/// found) and everything they need. A missing one is "not installed".
pub fn resolve(
    rt: &'static Runtime,
    executable: Option<&str>,
    code_mode: bool,
    host: &Host,
) -> Result<Resolved, RuntimeError> {
    let not_installed = |names: &[&str]| RuntimeError::NotInstalled {
        runtime: rt.name.to_string(),
        executable: match names {
            [one] => one.to_string(),
            [init @ .., last] => format!("{} or {last}", init.join(", ")),
            [] => String::new(),
        },
    };
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
            find_on_path(exe, &host.path).ok_or_else(|| not_installed(&[super::basename(exe)]))?
        }
        None => {
            let defaults = plan::default_executables(rt, code_mode);
            defaults.iter().find_map(|e| find_on_path(e, &host.path)).ok_or_else(|| not_installed(defaults))?
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
    collect(&main, host, &mut r, 0);
    let name = super::basename(&main.to_string_lossy()).to_string();
    for helper in plan::helpers(rt, &name, code_mode) {
        let found = find_on_path(helper, &host.path).ok_or_else(|| not_installed(&[helper]))?;
        collect(&found, host, &mut r, 0);
        r.helpers.push((helper.to_string(), found));
    }
    r.ro_paths = minimal_roots(std::mem::take(&mut r.ro_paths), &host.bound);
    Ok(r)
}

/// Add what `exe` (as found on PATH) needs to `r`.
fn collect(exe: &Path, host: &Host, r: &mut Resolved, depth: usize) {
    let real = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    if let Some(dir) = exe.parent() {
        let on_sandbox_path = std::env::split_paths(crate::env::SANDBOX_PATH).any(|d| d == dir);
        if !on_sandbox_path && !r.path_dirs.iter().any(|d| d == dir) {
            r.path_dirs.push(dir.to_path_buf());
        }
    }
    let mut found_home = false;
    for p in [exe, real.as_path()] {
        if let Some((dot, name)) = home_dot_dir(p, host.home.as_deref()) {
            found_home = true;
            add_home_dir(&dot, &name, r);
            if name == ".cargo" {
                // A rustup proxy in ~/.cargo/bin needs the toolchains in ~/.rustup.
                if let Some(rustup) = dot.parent().map(|h| h.join(".rustup")).filter(|p| p.is_dir()) {
                    add_home_dir(&rustup, ".rustup", r);
                }
            }
        }
    }
    if !found_home {
        if let Some(root) = prefix_of(&real) {
            r.ro_paths.push(root);
        }
    }
    if depth < MAX_SHEBANG_DEPTH {
        if let Some(interp) = shebang_interpreter(&real, &host.path) {
            collect(&interp, host, r, depth + 1);
        }
    }
}

fn add_home_dir(dir: &Path, name: &str, r: &mut Resolved) {
    r.ro_paths.push(dir.to_path_buf());
    if let Some((_, var)) = HOME_VARS.iter().find(|(n, _)| *n == name) {
        let value = dir.to_string_lossy().into_owned();
        if !r.env.iter().any(|(k, _)| k == var) {
            r.env.push((var.to_string(), value));
        }
    }
}

/// `<home>/.<name>` when `p` lies in a toolchain dot-directory of a home
/// (`$HOME`, `/root`, `/home/<user>`).
fn home_dot_dir(p: &Path, home: Option<&Path>) -> Option<(PathBuf, String)> {
    let mut homes: Vec<PathBuf> = home.map(Path::to_path_buf).into_iter().collect();
    homes.push(PathBuf::from("/root"));
    let comps: Vec<Component> = p.components().collect();
    if let [Component::RootDir, Component::Normal(h), Component::Normal(user), ..] = comps.as_slice() {
        if *h == "home" {
            homes.push(Path::new("/home").join(user));
        }
    }
    homes.iter().find_map(|home| {
        let rest = p.strip_prefix(home).ok()?;
        let first = rest.components().next()?.as_os_str().to_string_lossy().into_owned();
        let is_toolchain = first.starts_with('.') && first.len() > 1 && !NOT_TOOLCHAINS.contains(&first.as_str());
        (is_toolchain && rest.components().count() > 1).then(|| (home.join(&first), first))
    })
}

/// The directory that holds the toolchain of the real executable `real`.
fn prefix_of(real: &Path) -> Option<PathBuf> {
    let comps: Vec<&std::ffi::OsStr> = real.components().map(|c| c.as_os_str()).collect();
    // …/node_modules/<pkg>/… or …/node_modules/@scope/<pkg>/…
    if let Some(i) = comps.iter().rposition(|c| *c == "node_modules") {
        let scoped = comps.get(i + 1).is_some_and(|c| c.to_string_lossy().starts_with('@'));
        let end = i + if scoped { 3 } else { 2 };
        if end < comps.len() {
            return Some(comps[..end].iter().collect());
        }
    }
    // …/lib/jvm/<jdk>/… (the JRE inside a JDK needs the whole JDK)
    if let Some(i) = comps.windows(2).position(|w| w[0] == "lib" && w[1] == "jvm") {
        if i + 3 < comps.len() {
            return Some(comps[..i + 3].iter().collect());
        }
    }
    let parent = real.parent()?;
    let root = if parent.file_name().is_some_and(|n| n == "bin" || n == "sbin") { parent.parent()? } else { parent };
    Some(root.to_path_buf()).filter(|r| r.components().count() > 1)
}

/// The interpreter of a `#!` script: an absolute path, or what `env NAME`
/// would find on `path`.
fn shebang_interpreter(file: &Path, path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(file).and_then(|mut f| f.read(&mut head)).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|b| *b == b'\n').next()?).into_owned();
    let mut words = line.split_whitespace();
    let interp = words.next()?;
    if super::basename(interp) != "env" {
        return Some(PathBuf::from(interp)).filter(|p| p.is_absolute() && p.exists());
    }
    let name = words.find(|w| !w.starts_with('-') && !w.contains('='))?;
    find_on_path(name, path)
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
