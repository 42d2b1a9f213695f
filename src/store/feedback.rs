//! Agent feedback (the SDL-MCP `agent_feedback` tools): after a task, which
//! symbols of a slice were useful and which were missing, kept for offline
//! tuning. This module owns the `feedback` sled tree (key `repoId \0`
//! big-endian sequence, so one repository's records are one range, oldest
//! first) and the aggregation a query returns. Records are append-only:
//! nothing here edits or removes one.

use super::memory::{format_ms, now_ms, parse_rfc3339_ms};
use super::{Store, StoreError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The feedback records.
pub const FEEDBACK_TREE: &str = "feedback";
/// The sequence counter of the records.
const SEQ_KEY: &[u8] = b"seq";
/// Most symbols in `usefulSymbols` or `missingSymbols`.
pub const MAX_SYMBOLS: usize = 1000;
/// Longest symbol id, handle or version, in characters.
pub const MAX_ID_CHARS: usize = 512;
/// Most `taskTags`.
pub const MAX_TASK_TAGS: usize = 20;
/// Longest `taskText`, in characters.
pub const MAX_TASK_TEXT_CHARS: usize = 10_000;
/// `limit` of a query: range and default.
pub const QUERY_LIMIT: (u32, u32, u32) = (1, 1000, 50);
/// How many symbols each top list of the aggregated stats holds.
pub const TOP_SYMBOLS: usize = 10;

/// Errors of the feedback store.
#[derive(Debug, thiserror::Error)]
pub enum FeedbackError {
    /// An argument is malformed or out of range (nothing was written).
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("feedback record is unreadable: {0}")]
    Corrupt(String),
}

impl From<sled::Error> for FeedbackError {
    fn from(e: sled::Error) -> Self {
        FeedbackError::Store(StoreError::Db(e))
    }
}

fn invalid(msg: impl Into<String>) -> FeedbackError {
    FeedbackError::Invalid(msg.into())
}

/// The kind of task the feedback is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskType {
    Debug,
    Review,
    Implement,
    Explain,
}

/// Arguments of `agent_feedback`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FeedbackRequest {
    pub repo_id: String,
    /// The version (a commit) it applies to.
    pub version_id: String,
    /// The slice used.
    pub slice_handle: String,
    /// At least 1.
    pub useful_symbols: Vec<String>,
    /// Expected but absent.
    #[serde(default)]
    pub missing_symbols: Vec<String>,
    /// At most 20.
    #[serde(default)]
    pub task_tags: Vec<String>,
    #[serde(default)]
    pub task_type: Option<TaskType>,
    /// What the task was.
    #[serde(default)]
    pub task_text: Option<String>,
}

/// Result of `agent_feedback`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackResult {
    pub ok: bool,
    pub feedback_id: String,
    pub repo_id: String,
    pub version_id: String,
    /// useful + missing symbols recorded.
    pub symbols_recorded: usize,
}

/// One stored feedback record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackRecord {
    pub feedback_id: String,
    pub repo_id: String,
    pub version_id: String,
    pub slice_handle: String,
    pub useful_symbols: Vec<String>,
    pub missing_symbols: Vec<String>,
    pub task_tags: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_type: Option<TaskType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_text: Option<String>,
    pub created_at: String,
    #[serde(skip)]
    created_ms: i64,
}

/// Arguments of `agent_feedback_query`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FeedbackQuery {
    pub repo_id: String,
    /// Only this version.
    #[serde(default)]
    pub version_id: Option<String>,
    /// Default 50.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<u32>,
    /// Only feedback since this time (2026-05-20T00:00:00Z).
    #[serde(default)]
    pub since: Option<String>,
}

/// A symbol and how many matching records named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SymbolCount {
    pub symbol_id: String,
    pub count: usize,
}

/// Totals over every record that matched (not only the returned page).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStats {
    pub total_feedback: usize,
    /// The 10 most often useful symbols, most first.
    pub top_useful_symbols: Vec<SymbolCount>,
    /// The 10 most often missing symbols, most first.
    pub top_missing_symbols: Vec<SymbolCount>,
}

/// Result of `agent_feedback_query`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackQueryResult {
    pub repo_id: String,
    /// Newest first, at most `limit`.
    pub feedback: Vec<FeedbackRecord>,
    pub aggregated_stats: AggregatedStats,
    /// More records matched than `limit` returned.
    pub has_more: bool,
}

/// Where feedback goes. Today a sled tree; an offline tuning pipeline's
/// own sink can implement this.
pub trait FeedbackStore: Send + Sync {
    /// Check and store one record (flushed).
    fn record(&self, req: &FeedbackRequest) -> Result<FeedbackResult, FeedbackError>;
    /// The newest matching records and the stats over all of them.
    fn query(&self, q: &FeedbackQuery) -> Result<FeedbackQueryResult, FeedbackError>;
}

/// The sled-backed feedback store.
#[derive(Clone)]
pub struct FeedbackDb {
    store: Store,
    tree: sled::Tree,
}

impl FeedbackDb {
    pub fn open(store: &Store) -> Result<FeedbackDb, FeedbackError> {
        Ok(FeedbackDb { store: store.clone(), tree: store.tree(FEEDBACK_TREE)? })
    }

    fn prefix(repo_id: &str) -> Vec<u8> {
        let mut k = repo_id.as_bytes().to_vec();
        k.push(0);
        k
    }
}

fn id_field(name: &str, value: &str) -> Result<(), FeedbackError> {
    let n = value.chars().count();
    if value.trim().is_empty() || n > MAX_ID_CHARS || value.chars().any(char::is_control) {
        return Err(invalid(format!("{name} must be 1–{MAX_ID_CHARS} characters without control characters")));
    }
    Ok(())
}

fn symbol_list(name: &str, list: &[String], min: usize, max: usize) -> Result<(), FeedbackError> {
    if list.len() < min {
        return Err(invalid(format!("{name} needs at least {min} symbol id (the symbols that helped)")));
    }
    if list.len() > max {
        return Err(invalid(format!("at most {max} {name} (got {})", list.len())));
    }
    for s in list {
        id_field(&format!("each of {name}"), s)?;
    }
    Ok(())
}

impl FeedbackStore for FeedbackDb {
    fn record(&self, req: &FeedbackRequest) -> Result<FeedbackResult, FeedbackError> {
        id_field("repoId", &req.repo_id)?;
        id_field("versionId", &req.version_id)?;
        id_field("sliceHandle", &req.slice_handle)?;
        symbol_list("usefulSymbols", &req.useful_symbols, 1, MAX_SYMBOLS)?;
        symbol_list("missingSymbols", &req.missing_symbols, 0, MAX_SYMBOLS)?;
        symbol_list("taskTags", &req.task_tags, 0, MAX_TASK_TAGS)?;
        if let Some(text) = &req.task_text {
            let n = text.chars().count();
            if n > MAX_TASK_TEXT_CHARS {
                return Err(invalid(format!("taskText is {n} characters; at most {MAX_TASK_TEXT_CHARS}")));
            }
        }
        let seq = self.tree.update_and_fetch(SEQ_KEY, |old| {
            let n = old.and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
            Some((n + 1).to_be_bytes().to_vec())
        })?;
        let seq = seq.and_then(|b| b.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
        let created_ms = now_ms();
        let record = FeedbackRecord {
            feedback_id: format!("fb_{created_ms:x}_{seq}"),
            repo_id: req.repo_id.clone(),
            version_id: req.version_id.clone(),
            slice_handle: req.slice_handle.clone(),
            useful_symbols: req.useful_symbols.clone(),
            missing_symbols: req.missing_symbols.clone(),
            task_tags: req.task_tags.clone(),
            task_type: req.task_type,
            task_text: req.task_text.clone(),
            created_at: format_ms(created_ms),
            created_ms,
        };
        let mut key = Self::prefix(&req.repo_id);
        key.extend_from_slice(&seq.to_be_bytes());
        let bytes = serde_json::to_vec(&record).map_err(|e| FeedbackError::Corrupt(e.to_string()))?;
        self.tree.insert(key, bytes)?;
        self.store.flush()?;
        Ok(FeedbackResult {
            ok: true,
            feedback_id: record.feedback_id,
            repo_id: record.repo_id,
            version_id: record.version_id,
            symbols_recorded: req.useful_symbols.len() + req.missing_symbols.len(),
        })
    }

    fn query(&self, q: &FeedbackQuery) -> Result<FeedbackQueryResult, FeedbackError> {
        id_field("repoId", &q.repo_id)?;
        if let Some(v) = &q.version_id {
            id_field("versionId", v)?;
        }
        let (min, max, default) = QUERY_LIMIT;
        let limit = match q.limit {
            None => default as usize,
            Some(n) if (min..=max).contains(&n) => n as usize,
            Some(n) => return Err(invalid(format!("limit must be {min}–{max} (got {n})"))),
        };
        let since = match &q.since {
            None => None,
            Some(s) => Some(parse_rfc3339_ms(s).ok_or_else(|| {
                invalid(format!("since '{s}' is not an ISO 8601 time; use e.g. 2026-05-20T00:00:00Z"))
            })?),
        };
        let mut feedback = Vec::new();
        let mut stats = AggregatedStats::default();
        let (mut useful, mut missing) = (HashMap::<String, usize>::new(), HashMap::<String, usize>::new());
        for kv in self.tree.scan_prefix(Self::prefix(&q.repo_id)).rev() {
            let (_, v) = kv?;
            let mut r: FeedbackRecord =
                serde_json::from_slice(&v).map_err(|e| FeedbackError::Corrupt(e.to_string()))?;
            r.created_ms = parse_rfc3339_ms(&r.created_at).unwrap_or(0);
            if since.is_some_and(|s| r.created_ms < s) {
                // Keys are in time order: everything further back is older.
                break;
            }
            if q.version_id.as_ref().is_some_and(|v| *v != r.version_id) {
                continue;
            }
            stats.total_feedback += 1;
            for s in &r.useful_symbols {
                *useful.entry(s.clone()).or_default() += 1;
            }
            for s in &r.missing_symbols {
                *missing.entry(s.clone()).or_default() += 1;
            }
            if feedback.len() < limit {
                feedback.push(r);
            }
        }
        stats.top_useful_symbols = top(useful);
        stats.top_missing_symbols = top(missing);
        let has_more = stats.total_feedback > feedback.len();
        Ok(FeedbackQueryResult { repo_id: q.repo_id.clone(), feedback, aggregated_stats: stats, has_more })
    }
}

fn top(counts: HashMap<String, usize>) -> Vec<SymbolCount> {
    let mut v: Vec<SymbolCount> =
        counts.into_iter().map(|(symbol_id, count)| SymbolCount { symbol_id, count }).collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.symbol_id.cmp(&b.symbol_id)));
    v.truncate(TOP_SYMBOLS);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: &str, useful: &[&str], missing: &[&str]) -> FeedbackRequest {
        FeedbackRequest {
            repo_id: "demo".into(),
            version_id: version.into(),
            slice_handle: "h_1".into(),
            useful_symbols: useful.iter().map(|s| s.to_string()).collect(),
            missing_symbols: missing.iter().map(|s| s.to_string()).collect(),
            task_tags: vec!["auth".into()],
            task_type: Some(TaskType::Debug),
            task_text: Some("traced the timeout".into()),
        }
    }

    fn db() -> (tempfile::TempDir, FeedbackDb) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db")).unwrap();
        (dir, FeedbackDb::open(&store).unwrap())
    }

    #[test]
    fn records_and_aggregates() {
        let (_d, db) = db();
        let r = db.record(&req("v1", &["a", "b"], &["c"])).unwrap();
        assert_eq!(r.symbols_recorded, 3);
        assert!(r.feedback_id.starts_with("fb_"));
        db.record(&req("v1", &["a"], &["c", "d"])).unwrap();
        db.record(&req("v2", &["b"], &[])).unwrap();
        let q = db.query(&FeedbackQuery { repo_id: "demo".into(), limit: Some(2), ..Default::default() }).unwrap();
        assert_eq!(q.feedback.len(), 2);
        assert!(q.has_more);
        assert_eq!(q.feedback[0].version_id, "v2", "newest first");
        assert_eq!(q.aggregated_stats.total_feedback, 3);
        let top: Vec<(&str, usize)> =
            q.aggregated_stats.top_useful_symbols.iter().map(|s| (s.symbol_id.as_str(), s.count)).collect();
        assert_eq!(top, [("a", 2), ("b", 2)]);
        assert_eq!(q.aggregated_stats.top_missing_symbols[0], SymbolCount { symbol_id: "c".into(), count: 2 });
        let v1 = FeedbackQuery { repo_id: "demo".into(), version_id: Some("v1".into()), ..Default::default() };
        let q = db.query(&v1).unwrap();
        assert_eq!((q.feedback.len(), q.has_more), (2, false));
        let other = db.query(&FeedbackQuery { repo_id: "other".into(), ..Default::default() }).unwrap();
        assert_eq!(other.aggregated_stats.total_feedback, 0);
    }

    #[test]
    fn since_filters_by_time() {
        let (_d, db) = db();
        db.record(&req("v1", &["a"], &[])).unwrap();
        let future = FeedbackQuery { repo_id: "demo".into(), since: Some("2999-01-01".into()), ..Default::default() };
        assert_eq!(db.query(&future).unwrap().feedback.len(), 0);
        let past =
            FeedbackQuery { repo_id: "demo".into(), since: Some("2000-01-01T00:00:00Z".into()), ..Default::default() };
        assert_eq!(db.query(&past).unwrap().feedback.len(), 1);
    }

    #[test]
    fn bad_input_is_refused_and_nothing_is_written() {
        let (_d, db) = db();
        let cases: Vec<(FeedbackRequest, &str)> = vec![
            (req("v1", &[], &[]), "usefulSymbols needs at least 1"),
            (req("", &["a"], &[]), "versionId must be"),
            (FeedbackRequest { task_tags: vec!["t".into(); 21], ..req("v", &["a"], &[]) }, "at most 20 taskTags"),
            (
                FeedbackRequest { task_text: Some("x".repeat(10_001)), ..req("v", &["a"], &[]) },
                "taskText is 10001 characters",
            ),
        ];
        for (r, want) in cases {
            let e = db.record(&r).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert!(db.tree.is_empty(), "nothing written");
        let bad = FeedbackQuery { repo_id: "demo".into(), limit: Some(1001), ..Default::default() };
        assert!(db.query(&bad).unwrap_err().to_string().contains("limit must be 1–1000"));
        let bad = FeedbackQuery { repo_id: "demo".into(), since: Some("last week".into()), ..Default::default() };
        assert!(db.query(&bad).unwrap_err().to_string().contains("not an ISO 8601 time"));
    }
}
