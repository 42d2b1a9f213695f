//! `confine doctor`: print what this host can enforce, with a fix for each
//! gap. Exit 0 when full isolation is available, 1 otherwise.

use crate::sandbox::BackendKind;
use clap::Args;
use std::path::Path;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the sandbox smoke test (a real `confine run -- /bin/true`).
    #[arg(long)]
    pub no_smoke: bool,
}

/// The backend jobs get: `runtime.backend` of the configuration (global
/// --config, else the usual lookup) when it names one, else auto's. A
/// configuration that does not load is reported and the default assumed.
fn configured_backend(config: Option<&Path>) -> Option<(BackendKind, String)> {
    match crate::config::Config::load(config) {
        Ok(c) => c.runtime.backend.kind().map(|k| {
            let source = c.source.map_or_else(|| "the configuration".to_string(), |p| p.display().to_string());
            (k, source)
        }),
        Err(e) => {
            eprintln!("confine doctor: {e}; reporting the default backend");
            None
        }
    }
}

/// Without the Linux sandbox there is nothing to probe: only the weaker
/// backend, what it lacks, and what it guarantees.
#[cfg(not(target_os = "linux"))]
pub fn main(config: Option<&Path>, args: DoctorArgs) -> i32 {
    use crate::sandbox::{Backend, Guarantees};
    let kind = configured_backend(config).map_or_else(BackendKind::strongest, |(k, _)| k);
    let guarantees = Guarantees::of(kind, &crate::job::Layers::default());
    if args.json {
        let report = serde_json::json!({
            "backend": kind.name(),
            "fullIsolation": false,
            "missing": kind.lost(),
            "guarantees": guarantees,
        });
        outln!("{report}");
    } else {
        outln!(
            "backend: {} (degraded; runs need --allow-degraded)\nmissing: {}\nwhat it guarantees here:\n{}\
fix: use a Linux host (or the Vagrant VMs in vagrant/) for full isolation",
            kind.name(),
            kind.lost().join(", "),
            guarantees.render()
        );
    }
    1
}

#[cfg(target_os = "linux")]
pub fn main(config: Option<&Path>, args: DoctorArgs) -> i32 {
    let exe = std::env::current_exe().ok();
    let smoke = if args.no_smoke { None } else { exe.as_deref() };
    let mut report = crate::doctor::diagnose(smoke);
    if let Some((kind, source)) = configured_backend(config) {
        report = crate::doctor::for_backend(report, kind, &source);
    }
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => outln!("{s}"),
            Err(e) => {
                eprintln!("confine: {e}");
                return super::EXIT_CONFINE_FAILED;
            }
        }
    } else {
        {
            use std::io::Write as _;
            let _ = write!(std::io::stdout(), "{}", crate::doctor::render(&report));
        }
    }
    if report.full_isolation {
        0
    } else {
        1
    }
}
