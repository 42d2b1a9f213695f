//! What a request runs, worked out before any sandbox is asked for: the
//! checks that refuse a request before the policy sees it, steps 3 to 5
//! of the pipeline (executable, environment, working directory) and the
//! job's spec.
//!
//! It reads the configuration and the host's toolchains (it stats and
//! reads executables) and changes nothing, except the unix-fallback
//! backend's private /tmp, made when a plan is placed on it. Nothing here
//! depends on the policy's decision but the limits, which the caller
//! passes in: so a one-shot supervisor can work out the job before its
//! policy has decided and build the sandbox meanwhile
//! ([`super::one_shot`]), and the pipeline, which works it out again
//! after the decision, checks that it got the same spec before it uses
//! that sandbox.

use super::cwd::{self, JailedCwd};
use super::exec::JobRequest;
use crate::config::{Config, EffectiveLimits, LimitRequest, RepoConfig};
use crate::job::{Bind, JobFile, JobSpec, Status};
use crate::policy::input::ExecRequest;
use crate::runtimes::toolchain::Host;
use crate::runtimes::{self, plan, Runtime};
use crate::sandbox::unix_fallback::PrivateTmp;
use crate::sandbox::BackendKind;
use std::path::Path;
use std::time::Duration;

/// What the plans of one supervisor are made from.
pub(crate) struct Planner<'a> {
    pub config: &'a Config,
    pub host: &'a Host,
    pub backend: BackendKind,
}

/// A request refused before it ran: the status it gets, and why.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub status: Status,
    pub message: String,
}

/// Why a request is refused before the policy sees it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Invalid {
    #[error(transparent)]
    Input(#[from] crate::policy::input::InputError),
    #[error(transparent)]
    Network(#[from] crate::proxy::allowlist::EntryError),
    #[error(transparent)]
    Runtime(#[from] runtimes::RuntimeError),
    #[error(transparent)]
    Repo(#[from] crate::config::ConfigError),
    #[error("repoId is required: name a repository of [[repos]] in confine.toml")]
    NoRepo,
}

/// The unix-fallback backend's private /tmp of a job could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot create the job's private /tmp: {0}")]
struct NoPrivateTmp(std::io::Error);

/// A request that passed the checks before the policy: its runtime and
/// repository.
pub(crate) struct Admitted {
    pub runtime: &'static Runtime,
    pub repo: RepoConfig,
}

/// Steps 3 to 5 done: what runs, with which environment, where.
pub(crate) struct Prepared {
    pub plan: plan::ExecPlan,
    pub env: Vec<(String, String)>,
    pub jailed: JailedCwd,
    /// The repository's root as configured (`jailed.root` is its real path).
    pub repo_root: std::path::PathBuf,
    /// Where the repository is mounted inside.
    pub workspace_at: crate::sandbox::workspace_at::WorkspaceAt,
}

/// A job ready to start: its spec and, on the unix-fallback backend, the
/// private /tmp its host paths point into.
pub(crate) struct Placed {
    pub spec: JobSpec,
    pub fallback_tmp: Option<PrivateTmp>,
}

/// The request as the policy and the input checks see it.
/// `@name`s of the network's allowlist are expanded here, where a name
/// `[network.allow]` lacks is left for [`Planner::admit`] to refuse.
pub(crate) fn policy_request(req: &JobRequest, net: &crate::config::NetworkConfig) -> ExecRequest {
    ExecRequest {
        repo_id: req.repo_id.clone(),
        runtime: req.runtime.clone(),
        executable: req.executable.clone(),
        code: req.code.clone(),
        args: req.args.clone(),
        relative_cwd: req.relative_cwd.clone(),
        limits: LimitRequest {
            timeout_ms: req.timeout_ms,
            memory_bytes: req.memory_bytes,
            cpus: req.cpus,
            pids: req.pids,
            output_bytes: None,
        },
        network: net.expand(&req.network).unwrap_or_else(|_| req.network.clone()),
        env_keys: req.env.iter().map(|(k, _)| k.clone()).chain(req.env_unset.iter().cloned()).collect(),
        stdin_bytes: req.stdin.as_ref().map_or(0, |s| s.len() as u64),
    }
}

impl Planner<'_> {
    /// Bad input, an unknown runtime or repository: refused before the
    /// policy sees the request (and audited all the same by the caller).
    pub fn admit(&self, req: &JobRequest, policy_req: &ExecRequest) -> Result<Admitted, Invalid> {
        policy_req.check(&self.config.limits)?;
        self.config.network.expand(&req.network)?;
        let runtime = runtimes::lookup(&req.runtime)?;
        let repo = match req.repo_id.as_deref() {
            Some(id) => self.config.repo(id)?.clone(),
            None => return Err(Invalid::NoRepo),
        };
        Ok(Admitted { runtime, repo })
    }

    /// Steps 3 to 5: the executable (validated against the runtime and
    /// resolved with its toolchain), the scrubbed environment, and the
    /// working directory jailed in the repository.
    pub fn prepare(&self, req: &JobRequest, admitted: &Admitted) -> Result<Prepared, Refusal> {
        // 3. executable validation and toolchain resolution.
        let resolved =
            runtimes::toolchain::resolve(admitted.runtime, req.executable.as_deref(), req.code.is_some(), self.host)
                .map_err(|e| Refusal { status: Status::Failure, message: e.to_string() })?;
        let plan = match &req.code {
            Some(code) => plan::code_plan(&resolved, code),
            None => plan::args_plan(&resolved, &req.args),
        };

        // 4. environment: scrubbed, plus the toolchain's and allowlisted keys.
        let allowlist = &self.config.sandbox.env_allowlist;
        let mut not_allowed: Vec<&str> = Vec::new();
        for k in req.env.iter().map(|(k, _)| k.as_str()).chain(req.env_unset.iter().map(String::as_str)) {
            if !allowlist.iter().any(|a| a == k) && !not_allowed.contains(&k) {
                not_allowed.push(k);
            }
        }
        if !not_allowed.is_empty() {
            let message = format!(
                "environment variable(s) {} not allowed (add them to sandbox.env_allowlist)",
                not_allowed.join(", ")
            );
            return Err(Refusal { status: Status::Denied, message });
        }
        let mut env = crate::env::scrubbed(&[], |_| None);
        if !plan.path_dirs.is_empty() {
            let dirs: Vec<String> = plan.path_dirs.iter().map(|d| d.display().to_string()).collect();
            env[0].1 = format!("{}:{}", dirs.join(":"), crate::env::SANDBOX_PATH);
        }
        for (k, v) in plan.env.iter().chain(req.env.iter()) {
            match env.iter_mut().find(|(ek, _)| ek == k) {
                Some(slot) => slot.1 = v.clone(),
                None => env.push((k.clone(), v.clone())),
            }
        }

        // 5. cwd jail.
        let jailed = cwd::jail(&admitted.repo.root, req.relative_cwd.as_deref())
            .map_err(|e| Refusal { status: Status::Denied, message: e.to_string() })?;
        Ok(Prepared {
            plan,
            env,
            jailed,
            repo_root: admitted.repo.root.clone(),
            workspace_at: admitted.repo.workspace_at.clone(),
        })
    }

    /// The job's spec (step 7), with `limits` as decided and `timeout` left
    /// of them.
    pub fn place(
        &self,
        req: &JobRequest,
        prepared: &Prepared,
        limits: &EffectiveLimits,
        timeout: Duration,
    ) -> Result<Placed, Refusal> {
        let (argv, fallback_tmp) = self
            .place_plan(&prepared.plan, &prepared.jailed.root)
            .map_err(|e| Refusal { status: Status::Failure, message: e.to_string() })?;
        let mut spec = JobSpec::new(argv);
        spec.env = prepared.env.clone();
        spec.workspace = Some(prepared.jailed.root.clone());
        if crate::safe_fs::through_symlink(&prepared.repo_root, &prepared.jailed.root) {
            spec.through_symlink.push(prepared.jailed.root.clone());
        }
        spec.workspace_rw = self.config.sandbox.workspace_rw;
        spec.protect = if spec.workspace_rw {
            crate::sandbox::protect::defaults(&prepared.jailed.root)
                .map_err(|e| Refusal { status: Status::Failure, message: e.to_string() })?
        } else {
            Vec::new()
        };
        spec.workspace_at = prepared.workspace_at.resolve(&prepared.jailed.root).map_err(|e| Refusal {
            status: Status::Failure,
            message: format!("workspace_at {}: {e}", prepared.workspace_at),
        })?;
        spec.cwd = prepared.jailed.in_sandbox(&spec.workspace_at);
        spec.network = self
            .config
            .network
            .expand(&req.network)
            .map_err(|e| Refusal { status: Status::Failure, message: e.to_string() })?;
        spec.net_limits = self.config.network.limits();
        spec.allow_degraded = self.config.runtime.allow_degraded;
        spec.binds = prepared
            .plan
            .ro_paths
            .iter()
            // Bound from its real path (the sandbox opens sources refusing
            // any symlink on the way), at the path the toolchain knows.
            .map(|p| Bind {
                source: std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()),
                dest: p.clone(),
                writable: false,
                idmap: false,
            })
            .collect();
        if let Some(src) = &prepared.plan.source {
            spec.files.push(JobFile { path: src.path.clone(), contents: src.contents.clone() });
        }
        let mut job_limits = limits.to_job_limits(self.config.sandbox.tmp_size_bytes);
        // Rounded up: what is left of a 30 s budget after a fraction of a
        // millisecond of setup is 30000 ms, as asked, not 29999.
        job_limits.timeout_ms = Some(timeout.as_micros().div_ceil(1000).max(1) as u64);
        spec.limits = job_limits;
        Ok(Placed { spec, fallback_tmp })
    }

    /// The plan's argv for this backend. The Linux sandbox mounts `/tmp`
    /// and `/workspace`; the unix-fallback backend has no mount namespace,
    /// so the sandbox paths in the plan's words (code mode's source and
    /// build products) become host paths in the job's private /tmp, made
    /// here, before the words are joined into a script.
    fn place_plan(
        &self,
        exec_plan: &plan::ExecPlan,
        workspace: &Path,
    ) -> Result<(Vec<String>, Option<PrivateTmp>), NoPrivateTmp> {
        if self.backend != BackendKind::UnixFallback {
            return Ok((exec_plan.argv(), None));
        }
        let tmp = PrivateTmp::create().map_err(NoPrivateTmp)?;
        let layout = tmp.layout(Some(workspace.to_path_buf()));
        let mut placed = exec_plan.clone();
        for word in placed.steps.iter_mut().flatten() {
            *word = layout.host_word(word);
        }
        Ok((placed.argv(), Some(tmp)))
    }
}

#[cfg(test)]
mod tests;
