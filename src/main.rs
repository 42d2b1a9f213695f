//! The `confine` binary: parse the command line and hand over to the library.

fn main() {
    // The init stage runs before anything else (no clap, no tokio): it is a
    // single-threaded re-exec of this binary that builds the sandbox.
    #[cfg(target_os = "linux")]
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new("__init")) {
        confine::sandbox::linux::init::main();
    }
    // The unix-fallback backend's stage: forks the job, reaps, kills the tree.
    #[cfg(unix)]
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new("__fallback-init")) {
        confine::sandbox::unix_fallback::stage::main();
    }
    std::process::exit(confine::cli::main());
}
