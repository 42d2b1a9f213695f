//! The supervisor: admission (gate, policy, concurrency), timeouts, output
//! capture and audit, between a request and a sandbox backend.

pub mod cwd;
pub mod queue;
