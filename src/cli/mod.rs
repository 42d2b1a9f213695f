//! Command-line interface: one file per subcommand. Parsing and exit codes
//! live here; everything else is a library call.

/// `println!` for a command's report: a reader that closed the pipe
/// (`confine doctor --json | head`) ends the report, not the process with
/// a panic.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub mod args;
pub mod artifacts;
pub mod audit;
pub mod doctor;
#[cfg(target_os = "linux")]
pub mod exec;
pub mod manuals;
pub mod memory;
pub mod policy;
pub mod run;
pub mod serve;
#[cfg(target_os = "linux")]
mod stdio;

use clap::{Parser, Subcommand};
use std::io::Write;

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
    /// Print a completion script for bash, zsh, fish, elvish or PowerShell.
    Completions(manuals::CompletionsArgs),
    /// Print the man page, or write every page into a directory (--dir).
    Man(manuals::ManArgs),
}

/// Where a command writes: this process's standard output and error, or,
/// for a command relayed to a running `confine serve` ([`crate::relay`]),
/// the client's, passed over the store's socket.
pub struct Io {
    pub out: Box<dyn Write + Send>,
    pub err: Box<dyn Write + Send>,
}

impl Io {
    /// This process's standard output and error.
    pub fn std() -> Io {
        Io { out: Box::new(std::io::stdout()), err: Box::new(std::io::stderr()) }
    }

    /// Write what is buffered (a relayed command's output is).
    pub fn flush(&mut self) {
        let _ = self.out.flush();
        let _ = self.err.flush();
    }
}

/// Run a store command: relayed to the `confine serve` that holds the
/// store ([`crate::relay`]), else here, on the store opened for it.
pub(crate) fn with_store(
    cfg: &crate::config::Config,
    command: crate::relay::RelayedCommand,
    local: impl FnOnce(crate::store::Store, crate::relay::RelayedCommand, &mut Io) -> i32,
) -> i32 {
    let path = cfg.store_path();
    // A holder that closed the connection before it took the command was
    // stopping (a `confine exec` whose jobs all ended): the store is
    // tried again, a bounded number of times.
    #[cfg(target_os = "linux")]
    for _ in 0..RELAY_TRIES {
        match crate::relay::client::call(&path, cfg, &command) {
            Some(Err(crate::relay::RelayError::NotTaken { .. })) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                if let Ok(store) = crate::store::Store::open(&path) {
                    return run_local(cfg, store, command, local);
                }
            }
            Some(r) => return relayed(r),
            None => break,
        }
    }
    match crate::store::Store::open(&path) {
        Ok(store) => run_local(cfg, store, command, local),
        Err(e) => {
            // A server that took the store a moment ago listens by now.
            #[cfg(target_os = "linux")]
            if matches!(e, crate::store::StoreError::Busy { .. }) {
                if let Some(r) = crate::relay::client::call(&path, cfg, &command) {
                    return relayed(r);
                }
            }
            eprintln!("confine: {e}");
            EXIT_CONFINE_FAILED
        }
    }
}

/// How many times a store command tries a holder that was stopping.
#[cfg(target_os = "linux")]
const RELAY_TRIES: usize = 100;

/// A store command, run here on the store opened for it.
fn run_local(
    cfg: &crate::config::Config,
    store: crate::store::Store,
    command: crate::relay::RelayedCommand,
    local: impl FnOnce(crate::store::Store, crate::relay::RelayedCommand, &mut Io) -> i32,
) -> i32 {
    store.set_min_free(cfg.store.min_free_bytes);
    let mut io = Io::std();
    let code = local(store, command, &mut io);
    io.flush();
    code
}

#[cfg(target_os = "linux")]
fn relayed(r: Result<crate::relay::Reply, crate::relay::RelayError>) -> i32 {
    match r {
        Ok(reply) => reply.exit,
        Err(e) => {
            eprintln!("confine: {e}");
            EXIT_CONFINE_FAILED
        }
    }
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
        Command::Completions(args) => manuals::completions(args),
        Command::Man(args) => manuals::man(args),
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
