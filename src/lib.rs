//! confine: a hardened sandbox supervisor for untrusted code.
//!
//! Data flows one way: request (CLI or MCP) → [`job::JobSpec`] →
//! supervisor → backend spawn → output capture → store → response.

pub mod cli;
pub mod config;
pub mod crashpoint;
pub mod dirfd;
#[cfg(target_os = "linux")]
pub mod doctor;
pub mod env;
#[cfg(all(target_os = "linux", any(test, fuzzing)))]
pub mod fuzz;
#[cfg(test)]
mod golden;
pub mod ids;
pub mod job;
pub mod mcp;
pub mod output;
pub mod policy;
pub mod proxy;
pub mod relay;
pub mod runtimes;
pub mod safe_fs;
pub mod sandbox;
pub mod store;
pub mod supervisor;
