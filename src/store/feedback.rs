//! Agent feedback (after the SDL-MCP `agent_feedback` tools): after a task,
//! which of the handles confine returned helped (an `artifactHandle`, a
//! `jobId`, a `memoryId`) and what was missing, kept for offline tuning. This module owns the `feedback` sled tree (key `repoId \0`
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
/// Most entries in `usefulHandles`, `missing` or `ids`.
pub const MAX_IDS: usize = 1000;
/// The handles confine returns: artifacts, jobs, memories.
pub const HANDLE_PREFIXES: [&str; 3] = ["run-", "job-", "mem_"];
/// Longest handle or id, in characters.
pub const MAX_ID_CHARS: usize = 512;
/// Most `taskTags`.
pub const MAX_TASK_TAGS: usize = 20;
/// Longest `taskText`, in characters.
pub const MAX_TASK_TEXT_CHARS: usize = 10_000;
/// `limit` of a query: range and default.
pub const QUERY_LIMIT: (u32, u32, u32) = (1, 1000, 50);
/// How many entries each top list of the aggregated stats holds.
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

/// The kind of task (memory_surface filters by memory `types` instead).
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
    /// artifactHandles, jobIds or memoryIds that helped (at least 1).
    pub useful_handles: Vec<String>,
    /// What was missing (free-form).
    #[serde(default)]
    pub missing: Vec<String>,
    /// Your own ids (a commit, an issue).
    #[serde(default)]
    pub ids: Vec<String>,
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
    /// Useful handles and missing entries recorded.
    pub recorded: usize,
}

/// One stored feedback record. Records of the first format (symbols of a
/// slice, a version) read back with their symbols as handles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackRecord {
    pub feedback_id: String,
    pub repo_id: String,
    #[serde(alias = "usefulSymbols")]
    pub useful_handles: Vec<String>,
    #[serde(default, alias = "missingSymbols")]
    pub missing: Vec<String>,
    #[serde(default)]
    pub ids: Vec<String>,
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
    /// Only records naming this handle or id.
    #[serde(default)]
    pub handle: Option<String>,
    /// Default 50.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<u32>,
    /// Only feedback since this time (2026-05-20T00:00:00Z).
    #[serde(default)]
    pub since: Option<String>,
}

/// A handle (or a missing entry) and how many matching records named it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Count {
    pub name: String,
    pub count: usize,
}

/// Totals over every record that matched (not only the returned page).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AggregatedStats {
    pub total_feedback: usize,
    /// The 10 most often useful handles, most first.
    pub top_useful: Vec<Count>,
    /// The 10 most often missing entries, most first.
    pub top_missing: Vec<Count>,
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

fn id_list(name: &str, list: &[String], min: usize, max: usize, what: &str) -> Result<(), FeedbackError> {
    if list.len() < min {
        return Err(invalid(format!("{name} needs at least {min} {what}")));
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
        let what = "handle confine returned that helped (an artifactHandle, jobId or memoryId)";
        id_list("usefulHandles", &req.useful_handles, 1, MAX_IDS, what)?;
        if let Some(h) = req.useful_handles.iter().find(|h| !HANDLE_PREFIXES.iter().any(|p| h.starts_with(p))) {
            return Err(invalid(format!(
                "usefulHandles: '{h}' is not a handle confine returned (an artifactHandle run-…, a jobId job-… or a \
                 memoryId mem_…); put your own ids in ids"
            )));
        }
        id_list("missing", &req.missing, 0, MAX_IDS, "entry")?;
        id_list("ids", &req.ids, 0, MAX_IDS, "id")?;
        id_list("taskTags", &req.task_tags, 0, MAX_TASK_TAGS, "tag")?;
        if let Some(text) = &req.task_text {
            let n = text.chars().count();
            if n > MAX_TASK_TEXT_CHARS {
                return Err(invalid(format!("taskText is {n} characters; at most {MAX_TASK_TEXT_CHARS}")));
            }
        }
        self.store.check_room_for_records()?;
        let seq = self
            .tree
            .update_and_fetch(SEQ_KEY, |old| {
                let n = old.and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
                Some((n + 1).to_be_bytes().to_vec())
            })
            .map_err(|e| self.store.failed_with(e.into()))?;
        let seq = seq.and_then(|b| b.as_ref().try_into().ok()).map_or(0, u64::from_be_bytes);
        let created_ms = now_ms();
        let record = FeedbackRecord {
            feedback_id: format!("fb_{created_ms:x}_{seq}"),
            repo_id: req.repo_id.clone(),
            useful_handles: req.useful_handles.clone(),
            missing: req.missing.clone(),
            ids: req.ids.clone(),
            task_tags: req.task_tags.clone(),
            task_type: req.task_type,
            task_text: req.task_text.clone(),
            created_at: format_ms(created_ms),
            created_ms,
        };
        let mut key = Self::prefix(&req.repo_id);
        key.extend_from_slice(&seq.to_be_bytes());
        let bytes = serde_json::to_vec(&record).map_err(|e| FeedbackError::Corrupt(e.to_string()))?;
        self.tree.insert(key, bytes).map_err(|e| self.store.failed_with(e.into()))?;
        self.store.flush()?;
        Ok(FeedbackResult {
            ok: true,
            feedback_id: record.feedback_id,
            repo_id: record.repo_id,
            recorded: req.useful_handles.len() + req.missing.len(),
        })
    }

    fn query(&self, q: &FeedbackQuery) -> Result<FeedbackQueryResult, FeedbackError> {
        id_field("repoId", &q.repo_id)?;
        if let Some(h) = &q.handle {
            id_field("handle", h)?;
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
            if q.handle.as_ref().is_some_and(|h| !r.useful_handles.contains(h) && !r.ids.contains(h)) {
                continue;
            }
            stats.total_feedback += 1;
            for s in &r.useful_handles {
                *useful.entry(s.clone()).or_default() += 1;
            }
            for s in &r.missing {
                *missing.entry(s.clone()).or_default() += 1;
            }
            if feedback.len() < limit {
                feedback.push(r);
            }
        }
        stats.top_useful = top(useful);
        stats.top_missing = top(missing);
        let has_more = stats.total_feedback > feedback.len();
        Ok(FeedbackQueryResult { repo_id: q.repo_id.clone(), feedback, aggregated_stats: stats, has_more })
    }
}

fn top(counts: HashMap<String, usize>) -> Vec<Count> {
    let mut v: Vec<Count> = counts.into_iter().map(|(name, count)| Count { name, count }).collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.name.cmp(&b.name)));
    v.truncate(TOP_SYMBOLS);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, useful: &[&str], missing: &[&str]) -> FeedbackRequest {
        FeedbackRequest {
            repo_id: "demo".into(),
            useful_handles: useful.iter().map(|s| s.to_string()).collect(),
            missing: missing.iter().map(|s| s.to_string()).collect(),
            ids: vec![id.to_string()],
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
        let r = db.record(&req("v1", &["run-a", "job-b"], &["the test log"])).unwrap();
        assert_eq!(r.recorded, 3);
        assert!(r.feedback_id.starts_with("fb_"));
        db.record(&req("v1", &["run-a"], &["the test log", "d"])).unwrap();
        db.record(&req("v2", &["job-b"], &[])).unwrap();
        let q = db.query(&FeedbackQuery { repo_id: "demo".into(), limit: Some(2), ..Default::default() }).unwrap();
        assert_eq!(q.feedback.len(), 2);
        assert!(q.has_more);
        assert_eq!(q.feedback[0].ids, ["v2"], "newest first");
        assert_eq!(q.aggregated_stats.total_feedback, 3);
        let top: Vec<(&str, usize)> =
            q.aggregated_stats.top_useful.iter().map(|s| (s.name.as_str(), s.count)).collect();
        assert_eq!(top, [("job-b", 2), ("run-a", 2)]);
        assert_eq!(q.aggregated_stats.top_missing[0], Count { name: "the test log".into(), count: 2 });
        let v1 = FeedbackQuery { repo_id: "demo".into(), handle: Some("v1".into()), ..Default::default() };
        let q = db.query(&v1).unwrap();
        assert_eq!((q.feedback.len(), q.has_more), (2, false));
        let a = FeedbackQuery { repo_id: "demo".into(), handle: Some("run-a".into()), ..Default::default() };
        assert_eq!(db.query(&a).unwrap().feedback.len(), 2);
        let other = db.query(&FeedbackQuery { repo_id: "other".into(), ..Default::default() }).unwrap();
        assert_eq!(other.aggregated_stats.total_feedback, 0);
    }

    /// Records of the first format (symbols of a slice, a version) still
    /// read, their symbols as handles.
    #[test]
    fn first_format_records_read_back() {
        let (_d, db) = db();
        let old = r#"{"feedbackId":"fb_1_1","repoId":"demo","versionId":"v1","sliceHandle":"h_1",
            "usefulSymbols":["a"],"missingSymbols":["c"],"taskTags":[],"createdAt":"2026-05-20T00:00:00.000Z"}"#;
        let mut key = FeedbackDb::prefix("demo");
        key.extend_from_slice(&1u64.to_be_bytes());
        db.tree.insert(key, old.as_bytes()).unwrap();
        let q = db.query(&FeedbackQuery { repo_id: "demo".into(), ..Default::default() }).unwrap();
        assert_eq!(
            (q.feedback[0].useful_handles.clone(), q.feedback[0].missing.clone()),
            (vec!["a".into()], vec!["c".into()])
        );
    }

    #[test]
    fn since_filters_by_time() {
        let (_d, db) = db();
        db.record(&req("v1", &["run-a"], &[])).unwrap();
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
            (req("v1", &[], &[]), "usefulHandles needs at least 1 handle confine returned"),
            (req("v1", &["h_1"], &[]), "usefulHandles: 'h_1' is not a handle confine returned"),
            (req("", &["run-a"], &[]), "each of ids must be"),
            (FeedbackRequest { task_tags: vec!["t".into(); 21], ..req("v", &["mem_a"], &[]) }, "at most 20 taskTags"),
            (
                FeedbackRequest { task_text: Some("x".repeat(10_001)), ..req("v", &["job-a"], &[]) },
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
