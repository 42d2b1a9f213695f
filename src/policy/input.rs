//! The policy input document and its canonical JSON form.
//!
//! This module owns the shape every evaluator sees (local Rego and a remote
//! OPA alike) and the checks of a request that need no policy: the bad-input
//! errors (code and args both or neither, sizes, NUL bytes). It never
//! resolves paths or executables; the supervisor does that after the policy.

use crate::config::{EffectiveLimits, LimitRequest, LimitsConfig};
use crate::job::Network;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `operation` of a request that runs inline code.
pub const OP_CODE: &str = "execute_code";
/// `operation` of a request that runs the runtime's executable with args.
pub const OP_ARGS: &str = "execute_args";
/// Bytes of inline code the input document carries (`code`); the rest is
/// still counted (`code_bytes`) and hashed (`code_sha256`). A policy that
/// must see all of it refuses `code_truncated`.
pub const CODE_PREFIX_BYTES: usize = 64 << 10;

/// A request as the MCP tool or the CLI receives it, before any check.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecRequest {
    pub repo_id: Option<String>,
    pub runtime: String,
    /// Override of the runtime's default executable.
    pub executable: Option<String>,
    pub code: Option<String>,
    pub args: Vec<String>,
    /// Working directory relative to the repository root (default ".").
    pub relative_cwd: Option<String>,
    pub limits: LimitRequest,
    pub network: Network,
    /// Names of the variables the caller wants passed through.
    pub env_keys: Vec<String>,
    pub stdin_bytes: u64,
}

/// The request's network as policies see it: `{mode: "none"|"host"|"allow",
/// allow: [entries]}`, the entries expanded (`@name`s replaced by their
/// lists) and normalized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct NetworkInput {
    pub mode: String,
    pub allow: Vec<String>,
}

impl NetworkInput {
    pub fn of(net: &Network) -> NetworkInput {
        NetworkInput {
            mode: net.mode().to_string(),
            allow: match net {
                Network::Allow(entries) => entries.clone(),
                _ => Vec::new(),
            },
        }
    }
}

/// A request that is malformed whatever the policy says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("code and args are exclusive: pass code (inline source) or args (arguments of the runtime's executable), not both")]
    CodeAndArgs,
    #[error("nothing to run: pass code (inline source) or args (arguments of the runtime's executable)")]
    NothingToRun,
    #[error("code is {bytes} bytes, above the limit of {max} bytes (limits.max_code_bytes)")]
    CodeTooLarge { bytes: u64, max: u64 },
    #[error("stdin is {bytes} bytes, above the limit of {max} bytes (limits.max_stdin_bytes)")]
    StdinTooLarge { bytes: u64, max: u64 },
    #[error("{count} arguments, above the limit of {max} (limits.max_args)")]
    TooManyArgs { count: usize, max: usize },
    #[error("{what} contains a NUL byte, which no program can receive")]
    NulByte { what: String },
    #[error("environment variable {why}")]
    EnvName { why: String },
    #[error("{what} must be greater than 0")]
    Zero { what: &'static str },
}

impl ExecRequest {
    /// The checks that need no policy and no filesystem.
    pub fn check(&self, limits: &LimitsConfig) -> Result<(), InputError> {
        match (&self.code, self.args.is_empty()) {
            (Some(_), false) => return Err(InputError::CodeAndArgs),
            (None, true) => return Err(InputError::NothingToRun),
            _ => {}
        }
        if let Some(code) = &self.code {
            let bytes = code.len() as u64;
            if bytes > limits.max_code_bytes {
                return Err(InputError::CodeTooLarge { bytes, max: limits.max_code_bytes });
            }
            if code.contains('\0') {
                return Err(InputError::NulByte { what: "code".into() });
            }
        }
        if self.stdin_bytes > limits.max_stdin_bytes {
            return Err(InputError::StdinTooLarge { bytes: self.stdin_bytes, max: limits.max_stdin_bytes });
        }
        if self.args.len() > limits.max_args {
            return Err(InputError::TooManyArgs { count: self.args.len(), max: limits.max_args });
        }
        let nul = |what: String, s: &str| if s.contains('\0') { Err(InputError::NulByte { what }) } else { Ok(()) };
        for (i, a) in self.args.iter().enumerate() {
            nul(format!("args[{i}]"), a)?;
        }
        for (what, s) in
            [("executable", &self.executable), ("relativeCwd", &self.relative_cwd), ("repoId", &self.repo_id)]
        {
            if let Some(s) = s {
                nul(what.into(), s)?;
            }
        }
        for k in &self.env_keys {
            if let Some(why) = crate::env::invalid_name(k) {
                return Err(InputError::EnvName { why });
            }
        }
        nul("runtime".into(), &self.runtime)?;
        let l = &self.limits;
        for (what, zero) in [
            ("timeoutMs", l.timeout_ms == Some(0)),
            ("memoryBytes", l.memory_bytes == Some(0)),
            ("pids", l.pids == Some(0)),
            ("outputBytes", l.output_bytes == Some(0)),
            ("cpus", l.cpus.is_some_and(|c| c.is_nan() || c <= 0.0)),
        ] {
            if zero {
                return Err(InputError::Zero { what });
            }
        }
        Ok(())
    }

    /// The input document for this request. `command` is the executable
    /// that will run (the override, else the runtime's default).
    pub fn to_input(&self, command: &str, limits: EffectiveLimits) -> PolicyInput {
        let mut env_keys = self.env_keys.clone();
        env_keys.sort();
        env_keys.dedup();
        PolicyInput {
            operation: if self.code.is_some() { OP_CODE } else { OP_ARGS }.to_string(),
            runtime: self.runtime.clone(),
            command: command.to_string(),
            args: self.args.clone(),
            cwd: self.relative_cwd.clone().unwrap_or_else(|| ".".into()),
            env_keys,
            timeout_ms: limits.timeout_ms,
            limits,
            network: NetworkInput::of(&self.network),
            repo_id: self.repo_id.clone(),
            code_sha256: self.code.as_deref().map(|c| sha256_hex(c.as_bytes())),
            code_bytes: self.code.as_ref().map_or(0, |c| c.len() as u64),
            code: self.code.as_deref().map(|c| code_prefix(c).to_string()),
            code_truncated: self.code.as_ref().is_some_and(|c| c.len() > CODE_PREFIX_BYTES),
        }
    }
}

/// The first [`CODE_PREFIX_BYTES`] of `code`, cut at a character boundary.
fn code_prefix(code: &str) -> &str {
    if code.len() <= CODE_PREFIX_BYTES {
        return code;
    }
    let mut end = CODE_PREFIX_BYTES;
    while !code.is_char_boundary(end) {
        end -= 1;
    }
    &code[..end]
}

/// What every evaluator receives as `input`. The policy sees what will
/// run, not only its name: the arguments, and the inline code itself (its
/// first 64 KiB, with its full length and SHA-256), so that an operator's
/// Rego can refuse `sh -c 'curl …'` or a script that calls wget. The audit
/// hash covers this whole document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInput {
    pub operation: String,
    pub runtime: String,
    pub command: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub env_keys: Vec<String>,
    #[serde(rename = "timeoutMs")]
    pub timeout_ms: u64,
    pub limits: EffectiveLimits,
    pub network: NetworkInput,
    #[serde(rename = "repoId")]
    pub repo_id: Option<String>,
    pub code_sha256: Option<String>,
    /// The whole code's length in bytes.
    pub code_bytes: u64,
    /// The inline code, up to [`CODE_PREFIX_BYTES`] (null in args mode).
    pub code: Option<String>,
    /// `code` holds only the start of the code.
    pub code_truncated: bool,
}

impl PolicyInput {
    /// The document as a JSON value.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The canonical JSON text the audit hash is computed over.
    pub fn canonical(&self) -> String {
        canonical_json(&self.to_value())
    }
}

/// JSON with object keys sorted and no insignificant whitespace, so equal
/// documents hash equally whatever map type produced them.
pub fn canonical_json(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(val) = map.get(k) {
                    write_canonical(val, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests;
