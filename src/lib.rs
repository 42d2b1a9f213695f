//! confine: a hardened sandbox supervisor for untrusted code.
//!
//! Data flows one way: request (CLI or MCP) → [`job::JobSpec`] →
//! supervisor → backend spawn → output capture → store → response.

pub mod cli;
pub mod env;
pub mod job;
pub mod sandbox;
pub mod store;
