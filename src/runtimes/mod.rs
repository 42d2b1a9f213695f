//! The runtime table: the 16 languages a request may name, their default
//! and compatible executables, and what their toolchains need.
//!
//! This module is data plus pure functions: it checks `--executable`
//! overrides, finds executables in the trusted locations of a host it is
//! given and works out which host paths a toolchain needs read-only
//! ([`toolchain`]), and how code mode compiles and runs ([`plan`]). It
//! never spawns anything, never takes an executable from a repository,
//! and needs no root.

pub mod plan;
pub mod toolchain;

/// The names a request may use for `runtime`, in table order.
pub const NAMES: [&str; 16] = [
    "node",
    "typescript",
    "python",
    "shell",
    "go",
    "java",
    "kotlin",
    "rust",
    "c",
    "cpp",
    "csharp",
    "ruby",
    "php",
    "perl",
    "r",
    "elixir",
];

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    pub name: &'static str,
    /// Default executables in order of preference: the first found wins.
    pub executables: &'static [&'static str],
    /// What `--executable` may name (a version suffix such as `3.12` or
    /// `-17` is accepted: `python3.12`, `gcc-13`).
    pub compatible: &'static [&'static str],
    /// The source file of code mode, in the sandbox's private /tmp.
    pub source_file: &'static str,
}

const fn rt(
    name: &'static str,
    executables: &'static [&'static str],
    compatible: &'static [&'static str],
    source_file: &'static str,
) -> Runtime {
    Runtime { name, executables, compatible, source_file }
}

/// The table. Compilers come first for compiled languages: code mode
/// compiles, then runs, inside the same sandbox.
pub const TABLE: [Runtime; 16] = [
    rt("node", &["node", "bun"], &["node", "nodejs", "bun", "deno"], "main.js"),
    rt("typescript", &["tsx", "ts-node", "node"], &["tsx", "ts-node", "node", "nodejs", "bun", "deno"], "main.ts"),
    rt("python", &["python3", "python"], &["python3", "python", "pypy3", "pypy"], "main.py"),
    rt("shell", &["bash"], &["bash", "sh", "dash", "zsh", "ksh", "mksh"], "main.sh"),
    rt("go", &["go"], &["go"], "main.go"),
    rt("java", &["javac"], &["javac", "java"], "Main.java"),
    rt("kotlin", &["kotlinc"], &["kotlinc", "kotlinc-jvm", "kotlin"], "main.kt"),
    rt("rust", &["rustc"], &["rustc", "cargo"], "main.rs"),
    rt("c", &["cc", "gcc", "clang"], &["cc", "gcc", "clang", "tcc"], "main.c"),
    rt("cpp", &["c++", "g++", "clang++"], &["c++", "g++", "clang++"], "main.cpp"),
    rt("csharp", &["dotnet-script", "csc"], &["dotnet-script", "csc", "mcs", "dotnet"], "main.csx"),
    rt("ruby", &["ruby"], &["ruby", "jruby", "truffleruby"], "main.rb"),
    rt("php", &["php"], &["php"], "main.php"),
    rt("perl", &["perl"], &["perl"], "main.pl"),
    rt("r", &["Rscript"], &["Rscript", "R"], "main.R"),
    rt("elixir", &["elixir"], &["elixir", "mix"], "main.exs"),
];

/// Errors of choosing and finding a runtime's executables.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error("unknown runtime '{name}' (expected one of: {})", NAMES.join(", "))]
    Unknown { name: String },
    /// The toolchain is absent on this host.
    #[error("runtime '{runtime}' is not installed ({executable} not found)")]
    NotInstalled { runtime: String, executable: String },
    #[error("executable '{executable}' is not compatible with runtime '{runtime}' (expected one of: {expected})")]
    Incompatible { runtime: String, executable: String, expected: String },
    #[error("executable '{executable}': {reason}")]
    BadExecutable { executable: String, reason: String },
    /// The executable is outside the trusted locations (the supervisor's
    /// PATH and system directories), or inside a repository.
    #[error("executable '{executable}' is not trusted: {reason}")]
    Untrusted { executable: String, reason: &'static str },
}

/// The row for `name`.
pub fn lookup(name: &str) -> Result<&'static Runtime, RuntimeError> {
    TABLE.iter().find(|r| r.name == name).ok_or_else(|| RuntimeError::Unknown { name: name.to_string() })
}

/// Whether `name` (a basename) is one of `candidates`, allowing a version
/// suffix: `python3.12` for `python3`, `gcc-13` for `gcc`.
pub fn name_matches(name: &str, candidates: &[&str]) -> bool {
    candidates.iter().any(|c| match name.strip_prefix(c) {
        Some("") => true,
        Some(rest) => {
            let digits = rest.strip_prefix(['-', '.']).unwrap_or(rest);
            digits.starts_with(|ch: char| ch.is_ascii_digit())
                && digits.chars().all(|ch| ch.is_ascii_digit() || ch == '.')
        }
        None => false,
    })
}

/// The basename of an executable as given.
pub fn basename(executable: &str) -> &str {
    executable.rsplit('/').next().unwrap_or(executable)
}

impl Runtime {
    /// Check an `--executable` override: a name looked up on PATH, or an
    /// absolute path, whose basename is compatible with this runtime.
    pub fn check_override(&self, executable: &str) -> Result<(), RuntimeError> {
        let bad =
            |reason: &str| RuntimeError::BadExecutable { executable: executable.to_string(), reason: reason.into() };
        if executable.is_empty() {
            return Err(bad("is empty"));
        }
        if executable.contains('/') && !executable.starts_with('/') {
            return Err(bad("must be a name looked up on PATH or an absolute path"));
        }
        if executable.split('/').any(|c| c == "..") {
            return Err(bad("must not contain '..'"));
        }
        if !name_matches(basename(executable), self.compatible) {
            return Err(RuntimeError::Incompatible {
                runtime: self.name.to_string(),
                executable: basename(executable).to_string(),
                expected: self.compatible.join(", "),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_the_sixteen_runtimes_in_order() {
        let names: Vec<&str> = TABLE.iter().map(|r| r.name).collect();
        assert_eq!(names, NAMES);
        for r in &TABLE {
            for e in r.executables {
                assert!(name_matches(e, r.compatible), "{}: default {e} must be compatible", r.name);
            }
        }
    }

    #[test]
    fn an_unknown_runtime_is_named_with_the_choices() {
        let err = lookup("cobol").unwrap_err().to_string();
        assert!(err.starts_with("unknown runtime 'cobol' (expected one of: node, typescript, python"), "{err}");
        assert_eq!(lookup("rust").unwrap().executables, ["rustc"]);
    }

    #[test]
    fn compatible_overrides_are_accepted_with_version_suffixes() {
        let node = lookup("node").unwrap();
        assert_eq!(node.check_override("bun"), Ok(()));
        let py = lookup("python").unwrap();
        for ok in ["pypy3", "python3.12", "/usr/bin/python3", "python3-dbg".trim_end_matches("-dbg")] {
            assert_eq!(py.check_override(ok), Ok(()), "{ok}");
        }
        assert_eq!(lookup("c").unwrap().check_override("gcc-13"), Ok(()));
        assert!(!name_matches("ccache", &["cc"]));
        assert!(!name_matches("python3-config", &["python3"]));
    }

    #[test]
    fn incompatible_and_odd_overrides_are_denied_with_the_reason() {
        let shell = lookup("shell").unwrap();
        let err = shell.check_override("curl").unwrap_err().to_string();
        assert_eq!(err, "executable 'curl' is not compatible with runtime 'shell' (expected one of: bash, sh, dash, zsh, ksh, mksh)");
        assert!(matches!(shell.check_override("bin/bash"), Err(RuntimeError::BadExecutable { .. })));
        assert!(matches!(shell.check_override("/usr/../bin/bash"), Err(RuntimeError::BadExecutable { .. })));
        assert!(matches!(lookup("node").unwrap().check_override("python3"), Err(RuntimeError::Incompatible { .. })));
    }
}
