//! The surface ranking: which memories matter for the symbols and files a
//! task touches, as `score = confidence × recencyFactor × overlapFactor`.
//!
//! - `confidence`: the memory's own, 0–1.
//! - `recencyFactor = max(0.1, 0.5^(ageDays / 30))`: halves every 30 days
//!   since `updatedAt`, never below 0.1, so an old decision that still
//!   matches exactly is not buried under fresh notes that barely match.
//! - `overlapFactor = (m / q + m / l) / 2`, where `m` is how many of the
//!   queried symbols and files the memory links, `q` how many were queried,
//!   `l` how many the memory links: the mean of how much of the task the
//!   memory covers and how focused the memory is on it. 0 < overlap ≤ 1;
//!   a memory with no overlap is not surfaced at all.
//!
//! Ties go to the newer memory, then the smaller memoryId. Pure functions:
//! `now` is a parameter so the order is testable.

use super::search::DocMeta;
use super::types::ScoreFactors;

/// Days for the recency factor to halve.
pub const RECENCY_HALF_LIFE_DAYS: f64 = 30.0;
/// The lowest recency factor.
pub const RECENCY_FLOOR: f64 = 0.1;

/// `max(0.1, 0.5^(ageDays / 30))`; a future `updatedAt` counts as now.
pub fn recency_factor(updated_ms: i64, now_ms: i64) -> f64 {
    let age_days = (now_ms - updated_ms).max(0) as f64 / 86_400_000.0;
    0.5f64.powf(age_days / RECENCY_HALF_LIFE_DAYS).max(RECENCY_FLOOR)
}

/// `(matched / queried + matched / linked) / 2`, 0 when nothing matched.
pub fn overlap_factor(matched: usize, queried: usize, linked: usize) -> f64 {
    if matched == 0 || queried == 0 || linked == 0 {
        return 0.0;
    }
    (matched as f64 / queried as f64 + matched as f64 / linked as f64) / 2.0
}

/// One ranked candidate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ranked {
    pub memory_id: String,
    pub score: f64,
    pub factors: ScoreFactors,
    pub matched_symbols: Vec<String>,
    pub matched_files: Vec<String>,
    pub updated_ms: i64,
}

/// Score every memory against the queried symbols and files (already
/// normalised), best first, at most `limit`.
pub(crate) fn rank<'a>(
    metas: impl Iterator<Item = &'a DocMeta>,
    symbols: &[String],
    files: &[String],
    now_ms: i64,
    limit: usize,
) -> Vec<Ranked> {
    let queried = symbols.len() + files.len();
    let mut out: Vec<Ranked> = metas
        .filter_map(|m| {
            let matched_symbols: Vec<String> = symbols.iter().filter(|s| m.symbol_ids.contains(s)).cloned().collect();
            let matched_files: Vec<String> = files.iter().filter(|f| m.file_rel_paths.contains(f)).cloned().collect();
            let matched = matched_symbols.len() + matched_files.len();
            let linked = m.symbol_ids.len() + m.file_rel_paths.len();
            let overlap = overlap_factor(matched, queried, linked);
            if overlap == 0.0 {
                return None;
            }
            let recency = recency_factor(m.updated_ms, now_ms);
            let factors = ScoreFactors { confidence: m.confidence, recency_factor: recency, overlap_factor: overlap };
            Some(Ranked {
                memory_id: m.memory_id.clone(),
                score: m.confidence * recency * overlap,
                factors,
                matched_symbols,
                matched_files,
                updated_ms: m.updated_ms,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then(b.updated_ms.cmp(&a.updated_ms)).then(a.memory_id.cmp(&b.memory_id))
    });
    out.truncate(limit);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryType;

    const DAY: i64 = 86_400_000;

    fn meta(id: &str, confidence: f64, age_days: i64, symbols: &[&str], files: &[&str]) -> DocMeta {
        DocMeta {
            memory_id: id.into(),
            memory_type: MemoryType::Decision,
            tags: vec![],
            symbol_ids: symbols.iter().map(|s| s.to_string()).collect(),
            file_rel_paths: files.iter().map(|s| s.to_string()).collect(),
            confidence,
            updated_ms: 1000 * DAY - age_days * DAY,
            stale: false,
            stale_files: vec![],
            baseline: Default::default(),
        }
    }

    #[test]
    fn the_factors_are_as_documented() {
        let now = 1000 * DAY;
        assert_eq!(recency_factor(now, now), 1.0);
        assert!((recency_factor(now - 30 * DAY, now) - 0.5).abs() < 1e-12);
        assert_eq!(recency_factor(now - 3650 * DAY, now), RECENCY_FLOOR);
        assert_eq!(recency_factor(now + DAY, now), 1.0);
        assert_eq!(overlap_factor(0, 3, 3), 0.0);
        assert_eq!(overlap_factor(2, 2, 2), 1.0);
        assert_eq!(overlap_factor(1, 2, 4), (0.5 + 0.25) / 2.0);
    }

    /// The fixed scenario: query symbols {A, B} and file f.rs.
    #[test]
    fn ranking_order_in_a_fixed_scenario() {
        let now = 1000 * DAY;
        let metas = [
            // exact: all three, fresh, 0.9 → 0.9 × 1 × 1 = 0.9
            meta("exact", 0.9, 0, &["A", "B"], &["f.rs"]),
            // broad: A among 9 other links, fresh → 0.9 × 1 × (1/3 + 1/10)/2 ≈ 0.195
            meta("broad", 0.9, 0, &["A", "x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9"], &[]),
            // old: exact but 60 days old → 0.9 × 0.25 × 1 = 0.225
            meta("old", 0.9, 60, &["A", "B"], &["f.rs"]),
            // unsure: exact, fresh, 0.3 → 0.3
            meta("unsure", 0.3, 0, &["B", "A"], &["f.rs"]),
            // file only, fresh, 0.9 → 0.9 × (1/3 + 1)/2 = 0.6
            meta("file", 0.9, 0, &[], &["f.rs"]),
            // no overlap: never surfaced
            meta("other", 1.0, 0, &["Z"], &["g.rs"]),
        ];
        let symbols = ["A".to_string(), "B".to_string()];
        let files = ["f.rs".to_string()];
        let ranked = rank(metas.iter(), &symbols, &files, now, 10);
        let order: Vec<&str> = ranked.iter().map(|r| r.memory_id.as_str()).collect();
        assert_eq!(order, ["exact", "file", "unsure", "old", "broad"]);
        assert_eq!(ranked[0].matched_symbols, ["A", "B"]);
        assert_eq!(ranked[1].matched_files, ["f.rs"]);
        assert!((ranked[3].score - 0.225).abs() < 1e-9, "{}", ranked[3].score);
        assert_eq!(rank(metas.iter(), &symbols, &files, now, 2).len(), 2);
    }
}
