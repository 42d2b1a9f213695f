//! The suites, one module each (see tests/all.rs). Linux is the real
//! sandbox and runs them all; macOS and Windows build only the suites of
//! their own backends (unix-fallback, the Job Object).

#[cfg(target_os = "linux")]
mod artifacts;
#[cfg(target_os = "linux")]
mod binds;
#[cfg(target_os = "linux")]
mod cli_habits;
#[cfg(target_os = "linux")]
mod doctor;
#[cfg(target_os = "linux")]
mod exec;
#[cfg(unix)]
mod fallback;
#[cfg(target_os = "linux")]
mod faults;
#[cfg(target_os = "linux")]
mod governance_cli;
#[cfg(target_os = "linux")]
mod idmap;
#[cfg(target_os = "linux")]
mod landlock;
#[cfg(target_os = "linux")]
mod limits;
#[cfg(target_os = "linux")]
mod mcp_e2e;
#[cfg(target_os = "linux")]
mod mcp_memory;
#[cfg(target_os = "linux")]
mod mcp_memory_e2e;
#[cfg(target_os = "linux")]
mod mcp_wire;
#[cfg(target_os = "linux")]
mod memory_cli;
#[cfg(target_os = "linux")]
mod network;
#[cfg(target_os = "linux")]
mod one_shot;
#[cfg(target_os = "linux")]
mod papercuts;
#[cfg(target_os = "linux")]
mod parallel_exec;
#[cfg(target_os = "linux")]
mod pty;
#[cfg(target_os = "linux")]
mod readme;
#[cfg(target_os = "linux")]
mod relay;
#[cfg(target_os = "linux")]
mod rootless;
#[cfg(target_os = "linux")]
mod sandbox;
#[cfg(target_os = "linux")]
mod seccomp;
#[cfg(target_os = "linux")]
mod security;
#[cfg(target_os = "linux")]
mod signals;
#[cfg(target_os = "linux")]
mod soak;
#[cfg(target_os = "linux")]
mod store;
#[cfg(target_os = "linux")]
mod supervisor;
#[cfg(target_os = "linux")]
mod warm;
#[cfg(windows)]
mod windows;
#[cfg(target_os = "linux")]
mod workspace_at;
