//! Which backend runs a job, and what each one gives up.
//!
//! `linux` is the real sandbox; `unix-fallback` (process group, session,
//! rlimits, a subreaper on Linux) and `windows` (a Job Object) are weaker.
//! `auto` picks the strongest backend this build has and never silently a
//! weaker one: a weaker backend needs `--allow-degraded`, otherwise the run
//! is refused and the refusal names what would be lost.

use super::SandboxError;
use serde::{Deserialize, Serialize};

/// A sandbox backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// Namespaces, landlock, seccomp, cgroups, dropped capabilities.
    Linux,
    /// Process group and session, rlimits, tree kill (Linux and macOS).
    UnixFallback,
    /// A Job Object: memory, CPU rate and process-count limits, tree kill.
    Windows,
}

/// The backend asked for, by `--backend` or `runtime.backend`: `auto` is
/// the strongest this build has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// The strongest backend of this build (linux on Linux); never a weaker one.
    #[default]
    Auto,
    /// Namespaces, landlock, seccomp, cgroups.
    Linux,
    /// Process group, session, rlimits, tree kill (weaker; needs allow-degraded).
    UnixFallback,
    /// A Job Object (weaker; needs allow-degraded).
    Windows,
}

impl BackendChoice {
    /// `None` for auto.
    pub fn kind(self) -> Option<BackendKind> {
        match self {
            BackendChoice::Auto => None,
            BackendChoice::Linux => Some(BackendKind::Linux),
            BackendChoice::UnixFallback => Some(BackendKind::UnixFallback),
            BackendChoice::Windows => Some(BackendKind::Windows),
        }
    }
}

/// What a backend is and what it can't guarantee.
pub trait Backend {
    /// The name in `Outcome.backend`.
    fn name(&self) -> &'static str;
    /// Whether this binary has the backend for this platform.
    fn compiled(&self) -> bool;
    /// The Linux backend's guarantees this one lacks, as `layers.missing`
    /// names them (empty for the full sandbox).
    fn lost(&self) -> &'static [&'static str];
    /// Whether `confine run` keeps the caller's own terminal and files
    /// from the job, relaying them through pipes (or a pty of the job's
    /// own), rather than passing them through.
    fn relays_caller_streams(&self) -> bool;
}

/// What the fallback backends lack; the names of `Layers`' fields.
const NO_NAMESPACES_ETC: &[&str] =
    &["userns", "mountns", "pidns", "netns", "ipcns", "utsns", "cgroupns", "landlock", "seccomp", "cgroup"];

impl Backend for BackendKind {
    fn name(&self) -> &'static str {
        match self {
            BackendKind::Linux => "linux",
            BackendKind::UnixFallback => "unix-fallback",
            BackendKind::Windows => "windows",
        }
    }

    fn compiled(&self) -> bool {
        match self {
            BackendKind::Linux => cfg!(target_os = "linux"),
            BackendKind::UnixFallback => cfg!(unix),
            BackendKind::Windows => cfg!(windows),
        }
    }

    fn lost(&self) -> &'static [&'static str] {
        match self {
            BackendKind::Linux => &[],
            BackendKind::UnixFallback | BackendKind::Windows => NO_NAMESPACES_ETC,
        }
    }

    fn relays_caller_streams(&self) -> bool {
        matches!(self, BackendKind::Linux)
    }
}

impl BackendKind {
    /// The strongest backend of this build.
    pub fn strongest() -> BackendKind {
        if cfg!(target_os = "linux") {
            BackendKind::Linux
        } else if cfg!(windows) {
            BackendKind::Windows
        } else {
            BackendKind::UnixFallback
        }
    }
}

/// The backend for a run: `requested` (`None` is auto), refused when it is
/// not built in, or weaker than the full sandbox without `allow_degraded`.
pub fn select(requested: Option<BackendKind>, allow_degraded: bool) -> Result<BackendKind, SandboxError> {
    let kind = requested.unwrap_or_else(BackendKind::strongest);
    if !kind.compiled() {
        return Err(SandboxError::BackendUnavailable {
            backend: kind.name(),
            reason: format!(
                "this build is for {}; use --backend auto or {}",
                std::env::consts::OS,
                BackendKind::strongest().name()
            ),
        });
    }
    if !kind.lost().is_empty() && !allow_degraded {
        return Err(SandboxError::Degraded { backend: kind.name(), lost: describe(kind.lost()) });
    }
    Ok(kind)
}

/// The backend for a run given the command line's choice (`flag`, which
/// wins) and the configuration's (`configured`, read from `config_source`).
/// A refusal of a configured backend names the key and the file.
pub fn select_with_config(
    flag: Option<BackendChoice>,
    configured: BackendChoice,
    config_source: Option<&std::path::Path>,
    allow_degraded: bool,
) -> Result<BackendKind, SandboxError> {
    let choice = flag.unwrap_or(configured);
    select(choice.kind(), allow_degraded).map_err(|e| match (flag, choice.kind()) {
        (None, Some(kind)) => SandboxError::Configured {
            backend: kind.name(),
            config: config_source.map_or_else(|| "the configuration".to_string(), |p| p.display().to_string()),
            source: Box::new(e),
        },
        _ => e,
    })
}

/// `user, mount, pid … namespaces, landlock, seccomp, cgroup limits` in words.
fn describe(lost: &[&str]) -> String {
    let ns: Vec<&str> = lost.iter().filter_map(|l| l.strip_suffix("ns")).collect();
    let mut parts = Vec::new();
    if !ns.is_empty() {
        parts.push(format!("namespaces ({})", ns.join(", ")));
    }
    for l in lost.iter().filter(|l| !l.ends_with("ns")) {
        parts.push(match *l {
            "landlock" => "landlock filesystem rules".to_string(),
            "seccomp" => "seccomp syscall filter".to_string(),
            "cgroup" => "cgroup limits and cgroup tree kill".to_string(),
            other => other.to_string(),
        });
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_the_strongest_and_weaker_needs_consent() {
        let strongest = BackendKind::strongest();
        if strongest == BackendKind::Linux {
            assert_eq!(select(None, false).unwrap(), BackendKind::Linux);
        } else {
            assert!(matches!(select(None, false), Err(SandboxError::Degraded { .. })));
        }
        if cfg!(unix) {
            let err = select(Some(BackendKind::UnixFallback), false).unwrap_err().to_string();
            assert!(err.contains("--allow-degraded"), "{err}");
            assert!(err.contains("namespaces (user, mount, pid, net, ipc, uts, cgroup)"), "{err}");
            assert!(err.contains("seccomp"), "{err}");
            assert_eq!(select(Some(BackendKind::UnixFallback), true).unwrap(), BackendKind::UnixFallback);
            let err = select(Some(BackendKind::Windows), true).unwrap_err().to_string();
            assert!(err.contains("not available"), "{err}");
        }
    }

    #[test]
    fn the_flag_wins_over_the_config_and_a_configured_refusal_names_the_key() {
        let cfg = std::path::Path::new("/etc/confine.toml");
        let strongest = BackendKind::strongest();
        if cfg!(unix) && strongest == BackendKind::Linux {
            let fallback = BackendChoice::UnixFallback;
            let err = select_with_config(None, fallback, Some(cfg), false).unwrap_err().to_string();
            assert!(err.contains("runtime.backend = \"unix-fallback\" in /etc/confine.toml"), "{err}");
            assert!(err.contains("allow_degraded = true"), "{err}");
            assert_eq!(select_with_config(None, fallback, Some(cfg), true).unwrap(), BackendKind::UnixFallback);
            let flag = Some(BackendChoice::Auto);
            assert_eq!(select_with_config(flag, fallback, Some(cfg), false).unwrap(), BackendKind::Linux);
            let err = select_with_config(Some(fallback), BackendChoice::Auto, None, false).unwrap_err().to_string();
            assert!(!err.contains("runtime.backend"), "{err}");
        }
        assert_eq!(select_with_config(None, BackendChoice::Auto, Some(cfg), true).unwrap(), strongest);
    }

    #[test]
    fn names_are_the_cli_and_outcome_names() {
        assert_eq!(BackendKind::UnixFallback.name(), "unix-fallback");
        assert_eq!(serde_json::to_string(&BackendKind::UnixFallback).unwrap(), "\"unix-fallback\"");
        assert!(BackendKind::Linux.lost().is_empty());
    }

    #[test]
    fn only_the_full_sandbox_relays_the_callers_streams() {
        assert!(BackendKind::Linux.relays_caller_streams());
        assert!(!BackendKind::UnixFallback.relays_caller_streams());
        assert!(!BackendKind::Windows.relays_caller_streams());
    }
}
