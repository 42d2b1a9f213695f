//! Limits: what a request asks for, the configured defaults and maxima,
//! and the caps a policy answers with. Clamping only ever lowers a limit,
//! and every lowered limit is named, so the outcome can say so.

use super::LimitsConfig;
use serde::{Deserialize, Serialize};

/// What a request asks for; `None` takes the configured default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LimitRequest {
    pub timeout_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub output_bytes: Option<u64>,
}

/// Limits in force after defaults, maxima and policy were applied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveLimits {
    pub timeout_ms: u64,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u64,
    pub output_bytes: u64,
    /// Names (camelCase, as in the outcome) of limits that were lowered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clamped: Vec<String>,
}

impl LimitsConfig {
    /// Defaults for what the request leaves out; maxima for what it asks
    /// too much of (clamped, and named in `clamped`). `outputBytes` is
    /// bounded by the default `[output]` caps here; the supervisor uses
    /// [`super::Config::resolve_limits`], which takes the configured ones.
    pub fn resolve(&self, req: &LimitRequest) -> EffectiveLimits {
        self.resolve_with_output(req, crate::output::OutputConfig::default().max_stored_bytes())
    }

    /// As [`LimitsConfig::resolve`], with `output_cap` (bytes stored per
    /// stream) as both the default and the maximum of `outputBytes`.
    pub fn resolve_with_output(&self, req: &LimitRequest, output_cap: u64) -> EffectiveLimits {
        let mut e = EffectiveLimits {
            timeout_ms: req.timeout_ms.unwrap_or(self.timeout_ms),
            memory_bytes: req.memory_bytes.unwrap_or(self.memory_bytes),
            cpus: req.cpus.unwrap_or(self.cpus),
            pids: req.pids.unwrap_or(self.pids),
            output_bytes: req.output_bytes.unwrap_or(output_cap),
            clamped: Vec::new(),
        };
        e.clamp_to(&LimitCaps {
            timeout_ms: Some(self.max_timeout_ms),
            memory_bytes: Some(self.max_memory_bytes),
            cpus: Some(self.max_cpus),
            pids: Some(self.max_pids),
            output_bytes: Some(output_cap),
        });
        e
    }
}

/// Upper bounds, from the configuration or a policy's `limits` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitCaps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
}

impl LimitCaps {
    /// The tighter of two sets of caps.
    pub fn min(&self, other: &LimitCaps) -> LimitCaps {
        fn lo<T: PartialOrd + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(x), Some(y)) => Some(if y < x { y } else { x }),
                (x, None) => x,
                (None, y) => y,
            }
        }
        LimitCaps {
            timeout_ms: lo(self.timeout_ms, other.timeout_ms),
            memory_bytes: lo(self.memory_bytes, other.memory_bytes),
            cpus: lo(self.cpus, other.cpus),
            pids: lo(self.pids, other.pids),
            output_bytes: lo(self.output_bytes, other.output_bytes),
        }
    }

    pub fn is_empty(&self) -> bool {
        *self == LimitCaps::default()
    }
}

impl EffectiveLimits {
    /// Lower every limit above its cap to the cap, recording its name once.
    pub fn clamp_to(&mut self, caps: &LimitCaps) {
        fn cap<T: PartialOrd + Copy>(v: &mut T, c: Option<T>, name: &str, clamped: &mut Vec<String>) {
            if let Some(c) = c {
                if *v > c {
                    *v = c;
                    if !clamped.iter().any(|n| n == name) {
                        clamped.push(name.to_string());
                    }
                }
            }
        }
        cap(&mut self.timeout_ms, caps.timeout_ms, "timeoutMs", &mut self.clamped);
        cap(&mut self.memory_bytes, caps.memory_bytes, "memoryBytes", &mut self.clamped);
        cap(&mut self.cpus, caps.cpus, "cpus", &mut self.clamped);
        cap(&mut self.pids, caps.pids, "pids", &mut self.clamped);
        cap(&mut self.output_bytes, caps.output_bytes, "outputBytes", &mut self.clamped);
    }

    /// The sandbox's view of these limits.
    pub fn to_job_limits(&self, tmp_size_bytes: u64) -> crate::job::Limits {
        crate::job::Limits {
            memory_bytes: Some(self.memory_bytes),
            cpus: Some(self.cpus),
            pids: Some(self.pids),
            timeout_ms: Some(self.timeout_ms),
            cpu_time_ms: None,
            tmp_size_bytes,
            clamped: self.clamped.clone(),
        }
    }
}
