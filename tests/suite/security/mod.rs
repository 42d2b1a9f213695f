//! The security suite: one regression test (or more) per class of escape
//! found by the hostile-job probes of issue 27, each named after its class
//! (`class01_…` to `class12_…`), and the sandbox posture test. Every test
//! runs the real `confine` binary against real namespaces, landlock,
//! seccomp and cgroups; under `CONFINE_REQUIRE_ISOLATION=1` a test that
//! can't run fails.

mod governance;
mod sandbox;
