//! confine.toml: the operator's configuration, with defaults embedded in the
//! binary (`confine.default.toml` at the repository root documents every key).
//!
//! This module owns finding, parsing and validating the file, resolving
//! `repoId`s and clamping requested limits to the configured maxima. It never
//! reads anything else from the environment than the lookup variables, and
//! every struct rejects unknown keys, so a typo is an error, not a silent default.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

mod limits;
pub use limits::{EffectiveLimits, LimitCaps, LimitRequest};

/// The embedded defaults, shown by `confine.default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../confine.default.toml");

/// Errors of loading or using the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named by --config or $CONFINE_CONFIG could not be read.
    #[error("config {path}: {source} (check the path given with --config or $CONFINE_CONFIG)")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not valid TOML or has an unknown or mistyped key.
    #[error("config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A value is out of range or inconsistent with another.
    #[error("config {path}: {key}: {message}")]
    Invalid { path: PathBuf, key: String, message: String },
    /// A request named a repository that is not configured.
    #[error("unknown repoId '{id}' (configured: {known}; add a [[repos]] entry with this id to confine.toml)")]
    UnknownRepo { id: String, known: String },
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub runtime: RuntimeConfig,
    pub limits: LimitsConfig,
    pub store: StoreConfig,
    pub policy: PolicyConfig,
    pub repos: Vec<RepoConfig>,
    pub sandbox: SandboxConfig,
    /// `[output]`: capture caps, artifact TTL, store size cap, redaction.
    pub output: crate::output::OutputConfig,
    /// `[mcp]`: the MCP server's bearer tokens.
    pub mcp: McpConfig,
    /// `[network]`: allowlisted networks' limits and named allowlists.
    pub network: NetworkConfig,
    /// Where this configuration came from (`None`: the embedded defaults).
    #[serde(skip)]
    pub source: Option<PathBuf>,
}

/// `[runtime]`: the gate and concurrency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeConfig {
    pub enabled: bool,
    pub allow_degraded: bool,
    /// The sandbox backend (`confine run --backend` overrides it); a weaker
    /// one than auto's needs `allow_degraded`.
    pub backend: crate::sandbox::BackendChoice,
    /// `None`: the number of CPU cores.
    pub max_concurrent_jobs: Option<usize>,
    pub max_queued: usize,
    pub background_max_ms: u64,
}

/// `[limits]`: defaults and maxima of what a request may ask for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub memory_bytes: u64,
    pub max_memory_bytes: u64,
    pub cpus: f64,
    pub max_cpus: f64,
    pub pids: u64,
    pub max_pids: u64,
    pub max_code_bytes: u64,
    pub max_stdin_bytes: u64,
    pub max_args: usize,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub path: Option<PathBuf>,
    /// Bytes kept free on the store's file system: no job starts below it.
    pub min_free_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig { path: None, min_free_bytes: 32 << 20 }
    }
}

/// Keys that were removed, with what to use instead: a file that still has
/// one is refused with that advice rather than serde's bare "unknown field".
const REMOVED_KEYS: &[(&str, &str, &str)] = &[
    (
        "store",
        "artifact_ttl_secs",
        "removed; artifacts live for output.ttl_secs seconds (default 86400): move the value there",
    ),
    (
        "limits",
        "output_bytes",
        "removed; the bytes kept of each stream are output.stdout_stored_bytes and output.stderr_stored_bytes \
         (past them output is drained, counted and marked truncated): set those instead",
    ),
    (
        "limits",
        "max_output_bytes",
        "removed; the bytes kept of each stream are output.stdout_stored_bytes and output.stderr_stored_bytes \
         (a request can't raise them; a policy can lower them with limits.outputBytes): set those instead",
    ),
];

/// How several evaluators' answers combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PolicyMode {
    /// Every evaluator must allow.
    #[default]
    All,
    /// One allowing evaluator is enough.
    Any,
}

/// `[policy]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub mode: PolicyMode,
    pub timeout_ms: u64,
    /// Evaluate the embedded `policies/default.rego` first.
    pub builtin: bool,
    pub allow_host_network: bool,
    /// Every entry of `[network.allow]`'s lists, normalized: the built-in
    /// policy allows an allowlisted network only within these. Filled
    /// from `[network]` when the file is read; not a key of `[policy]`.
    #[serde(skip)]
    pub network_allowlisted: Vec<String>,
    pub evaluators: Vec<EvaluatorConfig>,
    /// Extra data for local policies (`data.confine_data`).
    pub data: BTreeMap<String, toml::Value>,
}

/// One `[[policy.evaluators]]` entry: exactly one of `path` (local Rego) or
/// `url` (remote OPA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EvaluatorConfig {
    /// A .rego file or a directory of them.
    pub path: Option<PathBuf>,
    /// The package that defines `allow` and `deny_reasons` (local).
    pub package: Option<String>,
    /// Base URL of an OPA server, `http://` or `https://`.
    pub url: Option<String>,
    /// Path under /v1/data/ on the OPA server (remote).
    pub policy_path: Option<String>,
}

/// One `[[repos]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RepoConfig {
    pub id: String,
    pub root: PathBuf,
    /// Mirror the repository's memories as `.confine-memory/<id>.md` in
    /// its tree, for the team to commit and review (and read hand edits
    /// back). Off: memories live in the store only, and nothing is written
    /// into the repository.
    #[serde(default)]
    pub memory_files: bool,
    /// Where the repository is mounted inside its jobs: `/workspace`,
    /// `host` (its own path, for a virtualenv or an editable install that
    /// holds it), or an absolute path (`sandbox::workspace_at`).
    #[serde(default, skip_serializing_if = "is_default_workspace_at")]
    pub workspace_at: crate::sandbox::workspace_at::WorkspaceAt,
}

fn is_default_workspace_at(at: &crate::sandbox::workspace_at::WorkspaceAt) -> bool {
    *at == crate::sandbox::workspace_at::WorkspaceAt::Default
}

/// `[network]`: what a job with `--net allow:…` (MCP `network: {allow}`)
/// may use, and allowlists by name (`[network.allow] python = [...]`,
/// used as `allow:@python`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkConfig {
    /// Connections to the job's proxy open at once.
    pub max_connections: usize,
    /// Bytes through the proxy per job, both ways (unset: no cap).
    pub max_bytes: Option<u64>,
    /// A connection idle this long is cut.
    pub idle_timeout_ms: u64,
    /// Named allowlists.
    pub allow: std::collections::BTreeMap<String, Vec<String>>,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        let l = crate::job::NetLimits::default();
        NetworkConfig {
            max_connections: l.max_connections,
            max_bytes: l.max_bytes,
            idle_timeout_ms: l.idle_timeout_ms,
            allow: Default::default(),
        }
    }
}

impl NetworkConfig {
    /// The limits a job's proxy enforces.
    pub fn limits(&self) -> crate::job::NetLimits {
        crate::job::NetLimits {
            max_connections: self.max_connections,
            max_bytes: self.max_bytes,
            idle_timeout_ms: self.idle_timeout_ms,
        }
    }

    /// Every entry of the named lists, normalized, sorted, once each.
    pub fn allowlisted(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .allow
            .values()
            .filter_map(|l| crate::proxy::allowlist::Allowlist::parse(l).ok())
            .flat_map(|l| l.to_strings())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// A request's network with its `@name`s expanded and every entry
    /// parsed and normalized; `none` and `host` as they are.
    pub fn expand(
        &self,
        net: &crate::job::Network,
    ) -> Result<crate::job::Network, crate::proxy::allowlist::EntryError> {
        match net {
            crate::job::Network::Allow(entries) => crate::proxy::allowlist::expand(entries, &self.allow)
                .map(|l| crate::job::Network::Allow(l.to_strings())),
            other => Ok(other.clone()),
        }
    }
}

/// `[mcp]`: what `confine serve --http` accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    pub tokens: Vec<TokenConfig>,
}

/// One `[[mcp.tokens]]` entry: a bearer token (exactly one of `file` or
/// `sha256`) and the repositories its holder may use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// A name for logs and errors (never the token itself).
    pub id: String,
    /// A file whose first line is the token (keep it 0600).
    pub file: Option<PathBuf>,
    /// The token's SHA-256, in hex: the token itself is then kept nowhere.
    pub sha256: Option<String>,
    /// The repoIds this token may use; `["*"]` for every repository.
    pub repos: Vec<String>,
}

/// `[sandbox]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxConfig {
    pub tmp_size_bytes: u64,
    pub env_allowlist: Vec<String>,
    pub workspace_rw: bool,
    /// Parent cgroup of the job cgroups (`<parent>/confine/<job>` in each
    /// hierarchy used); unset: the supervisor's own cgroup.
    pub cgroup_parent: Option<PathBuf>,
    /// Sandboxes a server keeps built ahead of its requests, of the shape
    /// of the last request (`supervisor/warm.rs`); unset: 2 for a server,
    /// none for a one-shot command. 0 turns them off.
    pub warm: Option<usize>,
    /// Seconds a warm sandbox may wait before it is replaced.
    pub warm_max_idle_secs: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            enabled: false,
            allow_degraded: false,
            backend: crate::sandbox::BackendChoice::Auto,
            max_concurrent_jobs: None,
            max_queued: 64,
            background_max_ms: 600_000,
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            timeout_ms: 30_000,
            max_timeout_ms: 300_000,
            memory_bytes: 512 << 20,
            max_memory_bytes: 4 << 30,
            cpus: 1.0,
            max_cpus: 4.0,
            pids: 256,
            max_pids: 4096,
            max_code_bytes: 1 << 20,
            max_stdin_bytes: 512 << 10,
            max_args: 100,
        }
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            mode: PolicyMode::All,
            timeout_ms: 1000,
            builtin: true,
            allow_host_network: false,
            network_allowlisted: Vec::new(),
            evaluators: Vec::new(),
            data: BTreeMap::new(),
        }
    }
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            tmp_size_bytes: crate::job::DEFAULT_TMP_SIZE,
            env_allowlist: Vec::new(),
            workspace_rw: false,
            cgroup_parent: None,
            warm: None,
            warm_max_idle_secs: 600,
        }
    }
}

impl Config {
    /// Load the configuration: `explicit` (--config), else `$CONFINE_CONFIG`,
    /// else `$XDG_CONFIG_HOME/confine/config.toml` (or
    /// `~/.config/confine/config.toml`) when it exists, else the defaults.
    pub fn load(explicit: Option<&Path>) -> Result<Config, ConfigError> {
        match Config::locate(explicit, |k| std::env::var_os(k)) {
            Some(path) => Config::from_file(&path),
            None => Config::parse(DEFAULT_TOML, Path::new("<embedded defaults>")).map(|mut c| {
                c.source = None;
                c
            }),
        }
    }

    /// Which file [`Config::load`] reads; `env` reads the environment (a
    /// parameter, so this is testable). An explicit or `$CONFINE_CONFIG` path
    /// is returned even when missing: reading it then fails loudly.
    pub fn locate(explicit: Option<&Path>, env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
        if let Some(p) = explicit {
            return Some(p.to_path_buf());
        }
        let set = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(p) = set("CONFINE_CONFIG") {
            return Some(PathBuf::from(p));
        }
        let base = match set("XDG_CONFIG_HOME") {
            Some(x) => PathBuf::from(x),
            None => PathBuf::from(set("HOME")?).join(".config"),
        };
        Some(base.join("confine/config.toml")).filter(|p| p.is_file())
    }

    /// Read and validate one file.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        Config::parse(&text, path)
    }

    /// Parse and validate TOML text; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            removed_key(text, path).unwrap_or_else(|| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string().trim_end().replace('\n', "\n  "),
            })
        })?;
        config.source = Some(path.to_path_buf());
        config.validate()?;
        config.policy.network_allowlisted = config.network.allowlisted();
        Ok(config)
    }

    fn invalid(&self, key: &str, message: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            path: self.source.clone().unwrap_or_else(|| PathBuf::from("<embedded defaults>")),
            key: key.to_string(),
            message: message.into(),
        }
    }

    /// Check values that TOML types alone can't.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        let pairs: [(&str, u64, u64); 3] = [
            ("limits.timeout_ms", l.timeout_ms, l.max_timeout_ms),
            ("limits.memory_bytes", l.memory_bytes, l.max_memory_bytes),
            ("limits.pids", l.pids, l.max_pids),
        ];
        for (key, default, max) in pairs {
            if default == 0 || max == 0 {
                return Err(self.invalid(key, "must be greater than 0"));
            }
            if default > max {
                return Err(self.invalid(key, format!("default {default} is above its maximum {max}")));
            }
        }
        if !(l.cpus > 0.0 && l.cpus.is_finite() && l.max_cpus.is_finite() && l.cpus <= l.max_cpus) {
            return Err(self.invalid("limits.cpus", "must be greater than 0 and at most limits.max_cpus"));
        }
        if self.runtime.max_concurrent_jobs == Some(0) {
            return Err(self.invalid("runtime.max_concurrent_jobs", "must be at least 1 (or unset: one per core)"));
        }
        if self.output.ttl_secs == 0 {
            return Err(self.invalid(
                "output.ttl_secs",
                "must be greater than 0 (to keep nothing, ask with persistOutput: false)",
            ));
        }
        if self.policy.timeout_ms == 0 {
            return Err(self.invalid("policy.timeout_ms", "must be greater than 0"));
        }
        for (i, e) in self.policy.evaluators.iter().enumerate() {
            let key = format!("policy.evaluators[{i}]");
            match (&e.path, &e.url) {
                (Some(_), None) if e.policy_path.is_none() => {}
                (Some(_), None) => return Err(self.invalid(&key, "policy_path is for a remote evaluator (url)")),
                (None, Some(url)) if url.starts_with("http://") || url.starts_with("https://") => {
                    if e.package.is_some() {
                        return Err(self.invalid(&key, "package is for a local evaluator (path); use policy_path"));
                    }
                }
                (None, Some(_)) => return Err(self.invalid(&key, "url must start with http:// or https://")),
                _ => return Err(self.invalid(&key, "set exactly one of path (local .rego) or url (remote OPA)")),
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for r in &self.repos {
            if r.id.is_empty() || !seen.insert(r.id.as_str()) {
                return Err(self.invalid("repos", format!("repo id '{}' is empty or repeated", r.id)));
            }
            if !r.root.is_absolute() {
                return Err(self.invalid("repos", format!("root of '{}' must be an absolute path", r.id)));
            }
        }
        self.validate_network()?;
        self.validate_tokens()
    }

    /// `[network]`: limits above zero, and named allowlists whose entries
    /// all parse (an error names the list and the entry).
    fn validate_network(&self) -> Result<(), ConfigError> {
        let n = &self.network;
        if n.max_connections == 0 {
            return Err(self.invalid("network.max_connections", "must be at least 1"));
        }
        if n.idle_timeout_ms == 0 {
            return Err(self.invalid("network.idle_timeout_ms", "must be greater than 0"));
        }
        if n.max_bytes == Some(0) {
            return Err(self.invalid("network.max_bytes", "must be greater than 0 (or unset: no cap)"));
        }
        for (name, entries) in &n.allow {
            let key = format!("network.allow.{name}");
            if let Some(e) = entries.iter().find(|e| e.trim_start().starts_with('@')) {
                return Err(self.invalid(&key, format!("'{e}': a named list can't name another")));
            }
            crate::proxy::allowlist::Allowlist::parse(entries).map_err(|e| self.invalid(&key, e.to_string()))?;
        }
        Ok(())
    }

    /// `[[mcp.tokens]]`: unique ids, one secret each, and repositories that
    /// exist (a typo must not leave a token with fewer repos than meant,
    /// nor silently with none).
    fn validate_tokens(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, t) in self.mcp.tokens.iter().enumerate() {
            let key = format!("mcp.tokens[{i}]");
            let id_ok = !t.id.is_empty() && t.id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !id_ok || !seen.insert(t.id.as_str()) {
                return Err(self.invalid(&key, format!("id '{}' is empty, repeated, or not [A-Za-z0-9._-]", t.id)));
            }
            match (&t.file, &t.sha256) {
                (Some(f), None) if f.is_absolute() => {}
                (Some(_), None) => return Err(self.invalid(&key, "file must be an absolute path")),
                (None, Some(h)) if h.len() == 64 && h.chars().all(|c| c.is_ascii_hexdigit()) => {}
                (None, Some(_)) => {
                    return Err(self.invalid(&key, "sha256 must be 64 hex digits (sha256sum of the token, no newline)"))
                }
                _ => return Err(self.invalid(&key, "set exactly one of file (holds the token) or sha256 (its hash)")),
            }
            if t.repos.is_empty() {
                return Err(self.invalid(&key, "repos is empty: list the repoIds this token may use, or [\"*\"]"));
            }
            for r in t.repos.iter().filter(|r| *r != "*") {
                if !self.repos.iter().any(|c| c.id == *r) {
                    return Err(self.invalid(&key, format!("repos names '{r}', which is not a [[repos]] id")));
                }
            }
        }
        Ok(())
    }

    /// Where the sled store lives: `store.path`, else [`crate::store::default_path`].
    pub fn store_path(&self) -> PathBuf {
        self.store.path.clone().unwrap_or_else(crate::store::default_path)
    }

    /// The limits in force for a request, before policy: the request's,
    /// else the defaults, clamped to the maxima. `outputBytes` is the
    /// `[output]` stored cap (per stream); a request can't raise it.
    pub fn resolve_limits(&self, req: &LimitRequest) -> EffectiveLimits {
        self.limits.resolve_with_output(req, self.output.max_stored_bytes())
    }

    /// Jobs that may run at once: configured, else one per core.
    pub fn max_concurrent_jobs(&self) -> usize {
        self.runtime
            .max_concurrent_jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    }

    /// The repository a `repoId` names.
    pub fn repo(&self, id: &str) -> Result<&RepoConfig, ConfigError> {
        self.repos.iter().find(|r| r.id == id).ok_or_else(|| ConfigError::UnknownRepo {
            id: id.to_string(),
            known: if self.repos.is_empty() {
                "none".into()
            } else {
                self.repos.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ")
            },
        })
    }

    /// Register an ad-hoc repository (the CLI's `--repo DIR`) and return its
    /// id: the id of a configured repository with the same root, else `id`.
    pub fn add_adhoc_repo(&mut self, id: &str, root: &Path) -> String {
        let same = |r: &RepoConfig| std::fs::canonicalize(&r.root).ok().as_deref() == Some(root);
        if let Some(r) = self.repos.iter().find(|r| same(r)) {
            return r.id.clone();
        }
        self.repos.retain(|r| r.id != id);
        self.repos.push(RepoConfig {
            id: id.to_string(),
            root: root.to_path_buf(),
            memory_files: false,
            workspace_at: Default::default(),
        });
        id.to_string()
    }
}

/// The advice for a removed key in `text`, if it has one.
fn removed_key(text: &str, path: &Path) -> Option<ConfigError> {
    let table: toml::Table = toml::from_str(text).ok()?;
    REMOVED_KEYS.iter().find_map(|(section, key, advice)| {
        table.get(*section)?.as_table()?.get(*key)?;
        Some(ConfigError::Invalid {
            path: path.to_path_buf(),
            key: format!("{section}.{key}"),
            message: advice.to_string(),
        })
    })
}

#[cfg(test)]
mod tests;
