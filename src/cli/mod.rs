//! Command-line interface: one file per subcommand. Parsing and exit codes
//! live here; everything else is a library call.

pub mod artifacts;
pub mod audit;
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod exec;
pub mod memory;
pub mod policy;
pub mod run;
pub mod serve;
#[cfg(target_os = "linux")]
mod stdio;

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
    /// Read the configuration from FILE (else $CONFINE_CONFIG, else
    /// $XDG_CONFIG_HOME/confine/config.toml, else the built-in defaults).
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one command in a fresh sandbox and exit with its status.
    Run(run::RunArgs),
    /// Run code or a command through the governed pipeline (gate, policy, queue, audit).
    #[cfg(target_os = "linux")]
    Exec(exec::ExecArgs),
    /// Report what this host can enforce, with a fix for each gap (exit 1 if not everything).
    Doctor(doctor::DoctorArgs),
    /// Dry-run the policy for a request.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Inspect, verify and export the audit trail.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// List, show, query and remove stored job output.
    #[command(subcommand)]
    Artifacts(artifacts::ArtifactsCommand),
    /// Remove expired and incomplete artifacts, then the oldest past the size cap.
    Gc(artifacts::GcArgs),
    /// Serve the MCP tools (runtime_execute, …) over stdio, or streamable HTTP with --http.
    Serve(serve::ServeArgs),
    /// Store, search, surface and check the memories of the configured repositories.
    #[command(subcommand)]
    Memory(memory::MemoryCommand),
}

/// Parse the command line, run it, and return the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    init_logging(matches!(cli.command, Command::Serve(_)));
    match cli.command {
        Command::Run(args) => run::main(cli.config.as_deref(), args),
        Command::Doctor(args) => doctor::main(cli.config.as_deref(), args),
        #[cfg(target_os = "linux")]
        Command::Exec(args) => exec::main(cli.config.as_deref(), args),
        Command::Policy(cmd) => policy::main(cli.config.as_deref(), cmd),
        Command::Audit(cmd) => audit::main(cli.config.as_deref(), cmd),
        Command::Artifacts(cmd) => artifacts::main(cli.config.as_deref(), cmd),
        Command::Gc(args) => artifacts::gc_main(cli.config.as_deref(), args),
        Command::Serve(args) => serve::main(cli.config.as_deref(), args),
        Command::Memory(cmd) => memory::main(cli.config.as_deref(), cmd),
    }
}

/// Logs go to stderr, never stdout (stdout is `serve`'s stdio transport
/// and the job's output elsewhere). `CONFINE_LOG` takes an env-filter
/// (`CONFINE_LOG=confine=debug` shows each stage of a request with
/// microsecond times); without it the server logs `info` and the other
/// commands only warnings (a cheaper filter than parsing one).
fn init_logging(server: bool) {
    use tracing_subscriber::fmt::time::uptime;
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_ansi(false);
    let _ = match std::env::var("CONFINE_LOG") {
        Ok(spec) => builder.with_timer(uptime()).with_env_filter(tracing_subscriber::EnvFilter::new(spec)).try_init(),
        Err(_) if server => builder.with_env_filter(tracing_subscriber::EnvFilter::new("warn,confine=info")).try_init(),
        Err(_) => builder.with_max_level(tracing::Level::WARN).without_time().try_init(),
    };
}
