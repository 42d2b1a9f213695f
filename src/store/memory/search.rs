//! Full-text search over memories: a tokeniser and an in-memory inverted
//! index per repository, ranked with BM25 (k1 = 1.2, b = 0.75; title words
//! count [`TITLE_WEIGHT`] times). The index also holds what the filters need
//! (type, tags, symbols, stale, confidence, updatedAt), so a query touches
//! sled only for the few memories it returns.
//!
//! The index is derived data: built from sled on first use in a process,
//! kept current by the writes of that process (sled lets one process open
//! the store), never persisted. A replaced memory leaves a dead slot;
//! the index compacts itself when dead slots outnumber live ones.

use super::types::{MemoryType, SortBy};
use std::collections::HashMap;

/// How many times a title word counts.
pub const TITLE_WEIGHT: u32 = 2;
const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Words longer than this (hashes, base64) are not indexed.
const MAX_TOKEN_CHARS: usize = 64;

/// Lowercased words of `text`: runs of letters and digits, at least two
/// characters (or one digit). A camelCase word also yields its parts, so
/// `authenticateUser` is found by `authenticate`.
pub fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let n = word.chars().count();
        if n == 0 || n > MAX_TOKEN_CHARS || (n == 1 && !word.chars().all(|c| c.is_ascii_digit())) {
            continue;
        }
        out.push(word.to_lowercase());
        let parts = camel_parts(word);
        if parts.len() > 1 {
            out.extend(parts.into_iter().filter(|p| p.chars().count() > 1).map(|p| p.to_lowercase()));
        }
    }
    out
}

fn camel_parts(word: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut prev: Option<char> = None;
    for (i, c) in word.char_indices() {
        if let Some(p) = prev {
            let boundary = (p.is_lowercase() && c.is_uppercase()) || (p.is_alphabetic() != c.is_alphabetic());
            if boundary {
                parts.push(&word[start..i]);
                start = i;
            }
        }
        prev = Some(c);
    }
    parts.push(&word[start..]);
    parts
}

/// What the filters and orderings need of one memory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DocMeta {
    pub memory_id: String,
    pub memory_type: MemoryType,
    pub tags: Vec<String>,
    pub symbol_ids: Vec<String>,
    pub file_rel_paths: Vec<String>,
    pub confidence: f64,
    pub updated_ms: i64,
    pub stale: bool,
    pub stale_files: Vec<String>,
    /// The staleness baseline (for `check` without reading sled).
    pub baseline: super::stale::Baseline,
}

/// A query against the index.
#[derive(Debug, Clone, Default)]
pub(crate) struct Search<'a> {
    pub text: Option<&'a str>,
    pub types: &'a [MemoryType],
    pub tags: &'a [String],
    pub symbol_ids: &'a [String],
    pub stale_only: bool,
    pub sort_by: Option<SortBy>,
    pub limit: usize,
}

/// The inverted index of one repository's live memories.
#[derive(Debug, Default)]
pub(crate) struct RepoIndex {
    docs: Vec<Option<(DocMeta, u32)>>,
    slot_of: HashMap<String, u32>,
    postings: HashMap<String, Vec<(u32, u32)>>,
    live: u32,
    total_len: u64,
}

impl RepoIndex {
    /// Add or replace a memory.
    pub fn upsert(&mut self, meta: DocMeta, title: &str, content: &str) {
        self.remove(&meta.memory_id);
        let mut tf: HashMap<String, u32> = HashMap::new();
        for t in tokens(title) {
            *tf.entry(t).or_default() += TITLE_WEIGHT;
        }
        for t in tokens(content) {
            *tf.entry(t).or_default() += 1;
        }
        let len: u32 = tf.values().sum();
        let slot = self.docs.len() as u32;
        for (term, n) in tf {
            self.postings.entry(term).or_default().push((slot, n));
        }
        self.slot_of.insert(meta.memory_id.clone(), slot);
        self.docs.push(Some((meta, len)));
        self.live += 1;
        self.total_len += u64::from(len);
    }

    /// Drop a memory (removed, or about to be replaced).
    pub fn remove(&mut self, memory_id: &str) {
        if let Some(slot) = self.slot_of.remove(memory_id) {
            if let Some(Some((_, len))) = self.docs.get(slot as usize) {
                self.total_len -= u64::from(*len);
                self.live -= 1;
            }
            if let Some(d) = self.docs.get_mut(slot as usize) {
                *d = None;
            }
        }
        if self.docs.len() > 1024 && self.docs.len() > 2 * self.live as usize {
            self.compact();
        }
    }

    /// Update the staleness of a memory in place (no re-tokenising).
    pub fn set_stale(&mut self, memory_id: &str, stale_files: &[String]) {
        if let Some(&slot) = self.slot_of.get(memory_id) {
            if let Some(Some((meta, _))) = self.docs.get_mut(slot as usize) {
                meta.stale = !stale_files.is_empty();
                meta.stale_files = stale_files.to_vec();
            }
        }
    }

    /// The live memories, in no particular order.
    pub fn metas(&self) -> impl Iterator<Item = &DocMeta> {
        self.docs.iter().flatten().map(|(m, _)| m)
    }

    /// Renumber the live slots and drop the postings of dead ones.
    fn compact(&mut self) {
        let mut renumber = vec![u32::MAX; self.docs.len()];
        let mut docs = Vec::with_capacity(self.live as usize);
        for (old, d) in std::mem::take(&mut self.docs).into_iter().enumerate() {
            if let Some(d) = d {
                renumber[old] = docs.len() as u32;
                self.slot_of.insert(d.0.memory_id.clone(), docs.len() as u32);
                docs.push(Some(d));
            }
        }
        self.docs = docs;
        self.postings.retain(|_, list| {
            list.retain_mut(|(slot, _)| {
                let new = renumber[*slot as usize];
                *slot = new;
                new != u32::MAX
            });
            !list.is_empty()
        });
    }

    fn passes(meta: &DocMeta, s: &Search<'_>) -> bool {
        (s.types.is_empty() || s.types.contains(&meta.memory_type))
            && (s.tags.is_empty() || meta.tags.iter().any(|t| s.tags.contains(t)))
            && (s.symbol_ids.is_empty() || meta.symbol_ids.iter().any(|t| s.symbol_ids.contains(t)))
            && (!s.stale_only || meta.stale)
    }

    /// The ids of the best `limit` matches, and how many matched.
    pub fn search(&self, s: &Search<'_>) -> (Vec<String>, usize) {
        let terms: Vec<String> = {
            let mut t = s.text.map(tokens).unwrap_or_default();
            t.sort();
            t.dedup();
            t
        };
        let text_given = s.text.is_some_and(|t| !t.trim().is_empty());
        let mut hits: Vec<(u32, f64)> = if text_given {
            self.bm25(&terms)
        } else {
            (0..self.docs.len() as u32).filter(|&i| self.docs[i as usize].is_some()).map(|i| (i, 0.0)).collect()
        };
        hits.retain(|(slot, _)| matches!(&self.docs[*slot as usize], Some((m, _)) if Self::passes(m, s)));
        let total = hits.len();
        let meta = |slot: u32| self.docs[slot as usize].as_ref().map(|(m, _)| m);
        let key = |&(slot, score): &(u32, f64)| -> (f64, i64) {
            match (s.sort_by, meta(slot)) {
                (Some(SortBy::Confidence), Some(m)) => (m.confidence, m.updated_ms),
                (Some(SortBy::Recency), Some(m)) => (m.updated_ms as f64, 0),
                (None, Some(m)) if text_given => (score, m.updated_ms),
                (None, Some(m)) => (m.updated_ms as f64, 0),
                (_, None) => (f64::MIN, 0),
            }
        };
        let cmp = |a: &(u32, f64), b: &(u32, f64)| {
            let (ka, kb) = (key(a), key(b));
            kb.0.total_cmp(&ka.0).then(kb.1.cmp(&ka.1)).then(a.0.cmp(&b.0))
        };
        if hits.len() > s.limit {
            hits.select_nth_unstable_by(s.limit, cmp);
            hits.truncate(s.limit);
        }
        hits.sort_unstable_by(cmp);
        let ids = hits.into_iter().filter_map(|(slot, _)| meta(slot).map(|m| m.memory_id.clone())).collect();
        (ids, total)
    }

    /// BM25 over the live documents containing any of `terms`.
    fn bm25(&self, terms: &[String]) -> Vec<(u32, f64)> {
        let n = f64::from(self.live.max(1));
        let avg = (self.total_len as f64 / n).max(1.0);
        let mut scores = vec![0.0f64; self.docs.len()];
        let mut touched = Vec::new();
        for term in terms {
            let Some(list) = self.postings.get(term) else { continue };
            let df = list.iter().filter(|(slot, _)| self.docs[*slot as usize].is_some()).count() as f64;
            if df == 0.0 {
                continue;
            }
            let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
            for &(slot, tf) in list {
                let Some((_, len)) = &self.docs[slot as usize] else { continue };
                let tf = f64::from(tf);
                let norm = K1 * (1.0 - B + B * f64::from(*len) / avg);
                if scores[slot as usize] == 0.0 {
                    touched.push(slot);
                }
                scores[slot as usize] += idf * tf * (K1 + 1.0) / (tf + norm);
            }
        }
        touched.into_iter().map(|slot| (slot, scores[slot as usize])).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str, t: MemoryType, updated_ms: i64) -> DocMeta {
        DocMeta {
            memory_id: id.into(),
            memory_type: t,
            tags: vec![],
            symbol_ids: vec![],
            file_rel_paths: vec![],
            confidence: 0.5,
            updated_ms,
            stale: false,
            stale_files: vec![],
            baseline: Default::default(),
        }
    }

    #[test]
    fn tokens_are_words_not_substrings() {
        assert_eq!(
            tokens("The authenticateUser() token_refresh, v2 x"),
            ["the", "authenticateuser", "authenticate", "user", "token", "refresh", "v2"]
        );
        assert!(tokens("a b c").is_empty());
        assert_eq!(tokens("7"), ["7"]);
    }

    #[test]
    fn bm25_ranks_the_denser_and_title_matches_first() {
        let mut ix = RepoIndex::default();
        ix.upsert(meta("a", MemoryType::Bugfix, 1), "Logging", "auth is mentioned once among many other words here");
        ix.upsert(meta("b", MemoryType::Bugfix, 2), "Auth token refresh", "auth auth token");
        ix.upsert(meta("c", MemoryType::Decision, 3), "Unrelated", "nothing to see");
        let s = Search { text: Some("auth token"), limit: 10, ..Search::default() };
        assert_eq!(ix.search(&s), (vec!["b".to_string(), "a".to_string()], 2));
        // "authentication" does not match "auth": words, not substrings.
        let s = Search { text: Some("authentic"), limit: 10, ..Search::default() };
        assert_eq!(ix.search(&s).1, 0);
    }

    #[test]
    fn filters_limit_and_replacement() {
        let mut ix = RepoIndex::default();
        for i in 0..5 {
            ix.upsert(meta(&format!("m{i}"), MemoryType::Bugfix, i), "same words", "same words");
        }
        let s = Search { limit: 2, ..Search::default() };
        assert_eq!(ix.search(&s), (vec!["m4".to_string(), "m3".to_string()], 5));
        let types = [MemoryType::Decision];
        assert_eq!(ix.search(&Search { types: &types, limit: 10, ..Search::default() }).1, 0);
        ix.upsert(meta("m0", MemoryType::Decision, 9), "other", "text");
        ix.remove("m1");
        let s = Search { text: Some("same"), limit: 10, ..Search::default() };
        assert_eq!(ix.search(&s).1, 3);
        assert_eq!(ix.search(&Search { types: &types, limit: 10, ..Search::default() }).0, ["m0"]);
    }

    #[test]
    fn compaction_keeps_results() {
        let mut ix = RepoIndex::default();
        for round in 0..3 {
            for i in 0..1000 {
                ix.upsert(meta(&format!("m{i}"), MemoryType::Bugfix, round), &format!("t{round}"), "body words");
            }
        }
        assert!(ix.docs.len() < 3000, "compacted: {}", ix.docs.len());
        let s = Search { text: Some("t2 body"), limit: 5, ..Search::default() };
        assert_eq!(ix.search(&s).1, 1000);
        assert_eq!(ix.search(&Search { text: Some("t1"), limit: 5, ..Search::default() }).1, 0);
    }
}
