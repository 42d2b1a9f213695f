//! The memory wire types: what the MCP tools and `confine memory` take and
//! return (camelCase, the SDL-MCP parameter names), with their ranges.
//! Shape only: the checks live in `validate.rs`, the behaviour in `db.rs`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Longest `title`, in characters.
pub const MAX_TITLE_CHARS: usize = 120;
/// Longest `content`, in characters.
pub const MAX_CONTENT_CHARS: usize = 50_000;
/// Most `tags` on a memory or in a filter.
pub const MAX_TAGS: usize = 20;
/// Longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 64;
/// Most `symbolIds` and most `fileRelPaths` on a memory.
pub const MAX_LINKS: usize = 100;
/// Longest symbol id, in characters.
pub const MAX_SYMBOL_CHARS: usize = 512;
/// Most `symbolIds` a surface call may name.
pub const MAX_SURFACE_SYMBOLS: usize = 500;
/// Longest full-text `query`, in characters.
pub const MAX_QUERY_CHARS: usize = 1000;
/// `limit` of a query: range and default.
pub const QUERY_LIMIT: (u32, u32, u32) = (1, 100, 20);
/// `limit` of a surface call: range and default.
pub const SURFACE_LIMIT: (u32, u32, u32) = (1, 50, 10);
/// `confidence` when a store call gives none: "unknown", halfway.
pub const DEFAULT_CONFIDENCE: f64 = 0.5;

/// What kind of knowledge a memory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryType {
    /// A design or process decision, with its reason.
    Decision,
    /// What broke, why, and how it was fixed.
    Bugfix,
    /// Notes that help resume a task.
    TaskContext,
}

impl MemoryType {
    /// The wire name (`decision`, `bugfix`, `task_context`).
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryType::Decision => "decision",
            MemoryType::Bugfix => "bugfix",
            MemoryType::TaskContext => "task_context",
        }
    }

    /// Parse a wire name (the CLI's `--type`).
    pub fn parse(s: &str) -> Option<MemoryType> {
        match s {
            "decision" => Some(MemoryType::Decision),
            "bugfix" => Some(MemoryType::Bugfix),
            "task_context" => Some(MemoryType::TaskContext),
            _ => None,
        }
    }
}

/// A repository as the memory store sees it: its id and its root on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    pub id: String,
    pub root: PathBuf,
    /// The `.confine-memory/` mirror is on (`memory_files` in confine.toml).
    pub files: bool,
}

/// A memory as tools and the CLI show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    pub memory_id: String,
    pub repo_id: String,
    #[serde(rename = "type")]
    pub memory_type: MemoryType,
    pub title: String,
    pub content: String,
    pub tags: Vec<String>,
    /// 0–1: 0.9 for a verified fact, 0.7 for a hypothesis.
    pub confidence: f64,
    pub symbol_ids: Vec<String>,
    /// Files of the repository, relative to its root.
    pub file_rel_paths: Vec<String>,
    /// RFC 3339, UTC, milliseconds.
    pub created_at: String,
    pub updated_at: String,
    /// Removed (soft delete): hidden from query and surface.
    pub deleted: bool,
    /// A linked file changed or vanished since the memory was stored.
    pub stale: bool,
    /// Which linked files changed or vanished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stale_files: Vec<String>,
}

/// Arguments of `memory_store`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoreRequest {
    pub repo_id: String,
    #[serde(rename = "type")]
    pub memory_type: MemoryType,
    /// One line, 1–120 characters.
    pub title: String,
    /// The why, not only the what (at most 50,000 characters).
    pub content: String,
    /// At most 20.
    #[serde(default)]
    pub tags: Vec<String>,
    /// 0.9 verified, 0.7 a hypothesis. Default 0.5.
    #[serde(default)]
    pub confidence: Option<f64>,
    /// At most 100.
    #[serde(default)]
    pub symbol_ids: Vec<String>,
    /// Files it concerns (at most 100): edits make it stale.
    #[serde(default)]
    pub file_rel_paths: Vec<String>,
    /// Update this memory instead.
    #[serde(default)]
    pub memory_id: Option<String>,
}

/// Result of `memory_store`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreResult {
    pub ok: bool,
    pub memory_id: String,
    /// A new memory was created (false: updated, or deduplicated).
    pub created: bool,
    /// A memory with the same repoId, type, title and content existed; its id is returned.
    pub deduplicated: bool,
}

/// How `memory_query` orders its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SortBy {
    /// Newest `updatedAt` first.
    Recency,
    /// Highest `confidence` first.
    Confidence,
}

/// Arguments of `memory_query`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
// The tool's published input schema keeps its title.
#[schemars(rename = "QueryRequest")]
pub struct MemoryQuery {
    pub repo_id: String,
    /// Words to find in title and content (ranked; not substrings).
    #[serde(default)]
    pub query: Option<String>,
    #[serde(default)]
    pub types: Vec<MemoryType>,
    /// Any of these tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Any of these symbols.
    #[serde(default)]
    pub symbol_ids: Vec<String>,
    /// Only those whose files changed.
    #[serde(default)]
    pub stale_only: Option<bool>,
    /// Default 20.
    #[serde(default)]
    #[schemars(range(min = 1, max = 100))]
    pub limit: Option<u32>,
    /// Default: relevance with a query, else recency.
    #[serde(default)]
    pub sort_by: Option<SortBy>,
}

/// Result of `memory_query`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueryResult {
    pub memories: Vec<Memory>,
    /// How many memories matched, before `limit`.
    pub total: usize,
}

/// Arguments of `memory_remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RemoveRequest {
    pub repo_id: String,
    pub memory_id: String,
    /// Delete its mirror file too.
    #[serde(default)]
    pub delete_file: Option<bool>,
}

/// Result of `memory_remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoveResult {
    pub ok: bool,
    pub memory_id: String,
    pub file_deleted: bool,
}

/// Arguments of `memory_surface`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SurfaceRequest {
    pub repo_id: String,
    /// At most 500.
    #[serde(default)]
    pub symbol_ids: Vec<String>,
    /// Relative to the repository (at most 100).
    #[serde(default)]
    pub file_rel_paths: Vec<String>,
    /// Only these types.
    #[serde(default)]
    pub types: Vec<MemoryType>,
    /// Default 10.
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    pub limit: Option<u32>,
}

/// The three factors of a surface score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScoreFactors {
    pub confidence: f64,
    pub recency_factor: f64,
    pub overlap_factor: f64,
}

/// One memory `memory_surface` returns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurfacedMemory {
    #[serde(flatten)]
    pub memory: Memory,
    /// confidence × recencyFactor × overlapFactor.
    pub score: f64,
    pub factors: ScoreFactors,
    /// The queried symbolIds this memory is linked to.
    pub matched_symbols: Vec<String>,
    /// The queried fileRelPaths this memory is linked to.
    pub matched_files: Vec<String>,
}

/// Result of `memory_surface`, best first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SurfaceResult {
    pub memories: Vec<SurfacedMemory>,
}

/// What a staleness check found in one repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    pub repo_id: String,
    /// Live memories with linked files, checked.
    pub checked: usize,
    /// Live memories now stale.
    pub stale: usize,
    /// Memories that became stale in this check.
    pub newly_stale: Vec<String>,
    /// Memories whose linked files are back to what was recorded.
    pub no_longer_stale: Vec<String>,
}

/// One `.md` file sync could not read back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncProblem {
    /// The file, relative to the repository root.
    pub file: String,
    pub message: String,
}

/// What `sync` did with the `.confine-memory/*.md` files of one repository.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncReport {
    pub repo_id: String,
    /// Files with no memory in the store, read in.
    pub imported: Vec<String>,
    /// Files edited after the stored memory: the file won.
    pub updated: Vec<String>,
    /// Files edited but older than the stored memory: rewritten from the store.
    pub rewritten: Vec<String>,
    /// Files that match the store.
    pub unchanged: usize,
    /// Live memories whose file is gone (left as they are; `memory_remove` removes them).
    pub missing: Vec<String>,
    pub problems: Vec<SyncProblem>,
}

/// One entry of the append-only memory log (`confine memory log`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    pub seq: u64,
    pub timestamp: String,
    /// store, update, deduplicate, remove, import, stale, fresh.
    pub op: String,
    pub repo_id: String,
    pub memory_id: String,
    pub title: String,
    pub content_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}
