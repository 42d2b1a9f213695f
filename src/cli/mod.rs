//! Command-line interface: one file per subcommand. Parsing and exit codes
//! live here; everything else is a library call.

pub mod run;

use clap::{Parser, Subcommand};

/// Exit code when confine itself failed.
pub const EXIT_CONFINE_FAILED: i32 = 125;

#[derive(Debug, Parser)]
#[command(
    name = "confine",
    version,
    about = "A hardened sandbox supervisor for untrusted code",
    long_about = "confine runs untrusted code in fresh Linux namespaces (user, mount, pid, net, ipc, uts, cgroup) \
on a private read-only root, with landlock, seccomp, dropped capabilities and no_new_privs.\n\n\
Examples:\n  confine run -- python3 -c 'print(1)'\n  confine run --workspace . --rw -- make test\n  echo hi | confine run -- cat"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one command in a fresh sandbox and exit with its status.
    Run(run::RunArgs),
}

/// Parse the command line, run it, and return the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run::main(args),
    }
}
