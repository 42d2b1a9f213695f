//! Every integration suite, in one test binary: linked once instead of
//! once per suite, and run in one pool of test threads, so that a long
//! test in one suite no longer leaves the other thread idle. A suite is a
//! module of `suite/` (`cargo test --test all suite::<name>::` runs one);
//! `common/` holds what they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(target_os = "linux")]
mod common;
mod suite;
