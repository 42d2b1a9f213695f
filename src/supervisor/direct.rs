//! `confine run` through a running server: a job the client planned
//! (its spec, resolved in the client as an in-process run resolves it),
//! given the client's own streams, in one of the server's warm sandboxes
//! when one fits, else cold. No policy is asked and no record written:
//! this is `confine run`, not a governed request, only started by the
//! process that holds the store and keeps sandboxes ready.

use super::Supervisor;
use crate::job::{JobSpec, Outcome};
use crate::sandbox::{BoxFuture, Early, Launch, SandboxError, StdioSpec, StdioTarget, Stop};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

impl Supervisor {
    /// Run `spec` with `streams` (stdin, stdout, stderr) as the job's
    /// standard streams, until it ends or `stop` asks (the signal is
    /// forwarded, the tree killed `kill_grace` later), and return its
    /// outcome; its cgroups are removed after. The signals `others` gives
    /// meanwhile are passed on to the job.
    pub async fn run_direct(
        &self,
        spec: &JobSpec,
        streams: [OwnedFd; 3],
        kill_grace: Duration,
        stop: BoxFuture<'static, Stop>,
        mut others: tokio::sync::mpsc::UnboundedReceiver<i32>,
    ) -> Result<Outcome, SandboxError> {
        if self.backend != crate::sandbox::BackendKind::Linux || spec.allow_degraded || spec.tty {
            return Err(SandboxError::Unavailable(
                "the server runs `confine run` jobs on the linux backend only, never degraded and without a tty: \
                 run it with --no-server"
                    .into(),
            ));
        }
        // Holding a job before its execve (and its limits until then) is
        // the supervisor's, for its audit trail: never a client's to ask.
        let mut spec = spec.clone();
        spec.hold = false;
        let spec = &spec;
        let target = |fd: &OwnedFd| StdioTarget::Fd(fd.as_raw_fd());
        let stdio = StdioSpec { stdin: target(&streams[0]), stdout: target(&streams[1]), stderr: target(&streams[2]) };
        let early = self.warm_with_streams(spec, &streams);
        let launch = Launch { job_id: None, seccomp: self.seccomp.as_ref(), early, private_tmp: None };
        let job = self.backend.spawn(spec, stdio, launch).await?;
        // The job holds its streams now (or its stage does): ours go, so
        // that the caller sees their end when the job's tree is gone.
        drop(streams);
        // Signals that are not stops go to the job as they come; the task
        // ends with the sender, which `stop` holds.
        if let Some(send) = job.signaller() {
            tokio::spawn(async move {
                while let Some(sig) = others.recv().await {
                    send(sig);
                }
            });
        }
        // The tree is dead and counted: the caller has its outcome while
        // the cgroups' removal goes on as a task of its own, on a server's
        // runtime (`Teardown::start`; a server stopped meanwhile leaves
        // them to the next one's sweep).
        let (outcome, teardown) = job.supervise(kill_grace, stop).await;
        drop(teardown);
        Ok(outcome)
    }

    /// A warm sandbox for `spec`, given copies of `streams` for its job.
    fn warm_with_streams(&self, spec: &JobSpec, streams: &[OwnedFd; 3]) -> Option<Early> {
        let pool = self.warm.as_ref()?;
        let profile = self.seccomp.as_ref()?;
        // The sandbox's own stdin is never the job's: no piped one needed.
        let (shape, base, part) = crate::sandbox::linux::warm::shape_of(spec, &profile.name, false)?;
        let copies = [streams[0].try_clone().ok()?, streams[1].try_clone().ok()?, streams[2].try_clone().ok()?];
        let warm = pool.take(&shape, &base, &spec.limits)?;
        Some(Early::Warm(Box::new(warm).with_streams(copies), Box::new(part)))
    }
}
