//! Requests through the planner, each against a golden file of what it
//! was admitted, prepared and placed as (or where it was refused). The
//! host is a tempdir: a toolchain on PATH and a repository; its path is
//! shown as `$TMP` in the golden files.

use super::*;
use crate::job::Network;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// A tempdir with `opt/shell/bin/bash` (the only directory on PATH) and
/// a repository `repo` with a `src` directory, and the configuration
/// that names it `web`.
struct World {
    dir: tempfile::TempDir,
    config: Config,
    host: Host,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let bash = root.join("opt/shell/bin/bash");
        std::fs::create_dir_all(bash.parent().unwrap()).unwrap();
        std::fs::write(&bash, "\x7fELF").unwrap();
        std::fs::set_permissions(&bash, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir_all(root.join("repo/src")).unwrap();
        let toml = format!(
            "[[repos]]\nid = \"web\"\nroot = \"{}\"\n\n[sandbox]\nenv_allowlist = [\"LANG\", \"RUST_LOG\"]\n\n\
             [network.allow]\npython = [\"pypi.org\", \"files.pythonhosted.org\"]\n",
            root.join("repo").display()
        );
        let config = Config::parse(&toml, Path::new("confine.toml")).unwrap();
        let host = Host {
            path: root.join("opt/shell/bin").into_os_string(),
            home: Some(root.join("home")),
            bound: ["/usr", "/etc"].iter().map(PathBuf::from).collect(),
            repos: Vec::new(),
        }
        .with_repos([root.join("repo").as_path()]);
        World { dir, config, host }
    }

    fn planner(&self) -> Planner<'_> {
        Planner { config: &self.config, host: &self.host, backend: BackendKind::Linux }
    }

    /// `req` through admit, prepare and place, as the pipeline runs them
    /// with the configuration's default limits, rendered with the
    /// tempdir's path as `$TMP`.
    fn plan(&self, req: &JobRequest) -> String {
        let planner = self.planner();
        let policy_req = policy_request(req, &self.config.network);
        let rendered = match planner.admit(req, &policy_req) {
            Err(e) => serde_json::json!({ "refused": { "at": "admit", "message": e.to_string() } }),
            Ok(admitted) => {
                let admitted_view = serde_json::json!({ "runtime": admitted.runtime.name, "repo": admitted.repo.id });
                match planner.prepare(req, &admitted) {
                    Err(r) => serde_json::json!({ "admitted": admitted_view, "refused": refusal("prepare", &r) }),
                    Ok(prepared) => {
                        let limits = self.config.resolve_limits(&policy_req.limits);
                        let timeout = Duration::from_millis(limits.timeout_ms);
                        let prepared_view = serde_json::json!({
                            "argv": prepared.plan.argv(),
                            "roPaths": prepared.plan.ro_paths,
                            "cwd": { "root": prepared.jailed.root, "relative": prepared.jailed.relative },
                        });
                        match planner.place(req, &prepared, &limits, timeout) {
                            Err(r) => serde_json::json!({
                                "admitted": admitted_view,
                                "prepared": prepared_view,
                                "refused": refusal("place", &r),
                            }),
                            Ok(placed) => serde_json::json!({
                                "admitted": admitted_view,
                                "prepared": prepared_view,
                                "spec": placed.spec,
                                "fallbackTmp": placed.fallback_tmp.is_some(),
                            }),
                        }
                    }
                }
            }
        };
        let text = serde_json::to_string_pretty(&rendered).unwrap();
        // The real path first: it may be longer than the one given.
        let real = std::fs::canonicalize(self.dir.path()).unwrap();
        text.replace(&*real.to_string_lossy(), "$TMP").replace(&*self.dir.path().to_string_lossy(), "$TMP")
    }
}

fn refusal(at: &str, r: &Refusal) -> serde_json::Value {
    serde_json::json!({ "at": at, "status": r.status, "message": r.message })
}

fn golden(name: &str, text: &str) {
    crate::golden::check("src/supervisor/golden", &format!("{name}.json"), text);
}

fn shell(args: &[&str]) -> JobRequest {
    JobRequest {
        repo_id: Some("web".into()),
        runtime: "shell".into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..JobRequest::default()
    }
}

/// A shell command: bash from PATH, its prefix bound, the scrubbed
/// environment, the repository's root as the read-only workspace.
#[test]
fn golden_a_plain_shell_command() {
    let world = World::new();
    let text = world.plan(&shell(&["-c", "echo hi"]));
    golden("plain_shell", &text);
    assert!(text.contains("\"spec\""), "{text}");
}

/// A job in a directory of the repository, with an allowed variable and
/// its own limits.
#[test]
fn golden_a_repository_job_in_a_subdirectory() {
    let world = World::new();
    let mut req = shell(&["-c", "make"]);
    req.relative_cwd = Some("src".into());
    req.env = vec![("RUST_LOG".into(), "debug".into())];
    req.timeout_ms = Some(5000);
    req.memory_bytes = Some(64 << 20);
    let text = world.plan(&req);
    golden("repo_cwd", &text);
    assert!(text.contains("\"/workspace/src\""), "{text}");
}

/// No repository named: refused before the policy sees the request.
#[test]
fn golden_no_repository_is_refused_at_admission() {
    let world = World::new();
    let mut req = shell(&["-c", "true"]);
    req.repo_id = None;
    let text = world.plan(&req);
    golden("refused_no_repo", &text);
    let planner = world.planner();
    let err = planner.admit(&req, &policy_request(&req, &world.config.network)).err();
    assert!(matches!(err, Some(Invalid::NoRepo)), "{err:?}");
}

/// An allowlist: `@python` expanded from the configuration into the
/// spec; a name the configuration lacks is refused at admission.
#[test]
fn golden_a_network_allowlist_is_expanded() {
    let world = World::new();
    let mut req = shell(&["-c", "pip download requests"]);
    req.network = Network::Allow(vec!["@python".into(), "example.org".into()]);
    golden("net_allowlist", &world.plan(&req));
    req.network = Network::Allow(vec!["@nope".into()]);
    golden("net_allowlist_unknown_name", &world.plan(&req));
}

/// What `prepare` refuses: a variable off the allowlist, a working
/// directory out of the repository, an executable that is not installed.
#[test]
fn golden_prepare_refusals() {
    let world = World::new();
    let mut env = shell(&["-c", "true"]);
    env.env = vec![("AWS_SECRET_ACCESS_KEY".into(), "x".into())];
    let mut cwd = shell(&["-c", "true"]);
    cwd.relative_cwd = Some("../".into());
    let mut exe = shell(&["-c", "true"]);
    exe.executable = Some("zsh".into());
    let text = [env, cwd, exe].iter().map(|r| world.plan(r)).collect::<Vec<_>>().join("\n");
    golden("refused_prepare", &text);
}

/// A name the caller's environment does not set meets the allowlist all
/// the same: whether a request is refused must not depend on what
/// happens to be set where it came from.
#[test]
fn an_unset_name_is_held_to_the_allowlist() {
    let world = World::new();
    let mut req = shell(&["-c", "true"]);
    req.env_unset = vec!["GITHUB_TOKEN".into(), "RUST_LOG".into()];
    req.env = vec![("GITHUB_TOKEN".into(), "x".into())];
    let plan = world.plan(&req);
    assert!(plan.contains("environment variable(s) GITHUB_TOKEN not allowed"), "{plan}");
    req.env.clear();
    let plan = world.plan(&req);
    assert!(plan.contains("GITHUB_TOKEN not allowed"), "{plan}");
    req.env_unset = vec!["RUST_LOG".into()];
    let plan = world.plan(&req);
    assert!(!plan.contains("not allowed"), "an allowlisted unset name sets nothing and passes: {plan}");
    assert!(!plan.contains("RUST_LOG"), "{plan}");
}
