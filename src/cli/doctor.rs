//! `confine doctor`: print what this host can enforce, with a fix for each
//! gap. Exit 0 when full isolation is available, 1 otherwise.

use clap::Args;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
    /// Skip the sandbox smoke test (a real `confine run -- /bin/true`).
    #[arg(long)]
    pub no_smoke: bool,
}

/// Without the Linux sandbox there is nothing to probe: only the weaker
/// backend, and what it lacks.
#[cfg(not(target_os = "linux"))]
pub fn main(args: DoctorArgs) -> i32 {
    use crate::sandbox::{Backend, BackendKind};
    let kind = BackendKind::strongest();
    if args.json {
        let report = serde_json::json!({"backend": kind.name(), "fullIsolation": false, "missing": kind.lost()});
        println!("{report}");
    } else {
        println!(
            "backend: {} (degraded; runs need --allow-degraded)\nmissing: {}\nfix: use a Linux host (or the Vagrant VMs in vagrant/) for full isolation",
            kind.name(),
            kind.lost().join(", ")
        );
    }
    1
}

#[cfg(target_os = "linux")]
pub fn main(args: DoctorArgs) -> i32 {
    let exe = std::env::current_exe().ok();
    let smoke = if args.no_smoke { None } else { exe.as_deref() };
    let report = crate::doctor::diagnose(smoke);
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("confine: {e}");
                return super::EXIT_CONFINE_FAILED;
            }
        }
    } else {
        print!("{}", crate::doctor::render(&report));
    }
    if report.full_isolation {
        0
    } else {
        1
    }
}
