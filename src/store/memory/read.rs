//! The read side of [`MemoryDb`]: query (index search, then sled for the
//! page), surface (re-check staleness, rank, then sled), and the log.
//! Nothing here writes, except the staleness flags `check` updates.

use super::db::{corrupt, MemoryDb};
use super::search::Search;
use super::surface::rank;
use super::time::now_ms;
use super::types::*;
use super::validate;
use super::{invalid, MemoryError, MemoryStore};

impl MemoryDb {
    pub(crate) fn query_repo(&self, repo: &RepoRef, req: &MemoryQuery) -> Result<QueryResult, MemoryError> {
        if let Some(q) = &req.query {
            let n = q.chars().count();
            if n > MAX_QUERY_CHARS {
                return Err(invalid(format!("query is {n} characters; at most {MAX_QUERY_CHARS}")));
            }
        }
        let tags = validate::labels("tags", &req.tags, MAX_TAGS, MAX_TAG_CHARS)?;
        let symbol_ids = validate::labels("symbolIds", &req.symbol_ids, MAX_LINKS, MAX_SYMBOL_CHARS)?;
        let limit = validate::limit(req.limit, QUERY_LIMIT)?;
        let stale_only = req.stale_only.unwrap_or(false);
        if stale_only {
            self.check(repo)?;
        }
        let search = Search {
            text: req.query.as_deref(),
            types: &req.types,
            tags: &tags,
            symbol_ids: &symbol_ids,
            stale_only,
            sort_by: req.sort_by,
            limit,
        };
        let (ids, total) = self.with_index(&repo.id, |ix| ix.search(&search))?;
        let mut memories = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(r) = self.get(&repo.id, &id)?.filter(|r| !r.memory.deleted) {
                memories.push(r.memory);
            }
        }
        Ok(QueryResult { memories, total })
    }

    pub(crate) fn surface_repo(&self, repo: &RepoRef, req: &SurfaceRequest) -> Result<SurfaceResult, MemoryError> {
        let symbols = validate::labels("symbolIds", &req.symbol_ids, MAX_SURFACE_SYMBOLS, MAX_SYMBOL_CHARS)?;
        if req.file_rel_paths.len() > MAX_LINKS {
            return Err(invalid(format!("at most {MAX_LINKS} fileRelPaths (got {})", req.file_rel_paths.len())));
        }
        let mut files = Vec::with_capacity(req.file_rel_paths.len());
        for raw in &req.file_rel_paths {
            let rel = validate::rel_path(raw)?;
            if !files.contains(&rel) {
                files.push(rel);
            }
        }
        if symbols.is_empty() && files.is_empty() {
            return Err(invalid("give symbolIds and/or fileRelPaths: the symbols and files your task touches"));
        }
        let limit = validate::limit(req.limit, SURFACE_LIMIT)?;
        self.check(repo)?;
        let now = now_ms();
        let ranked = self.with_index(&repo.id, |ix| {
            let metas = ix.metas().filter(|m| req.types.is_empty() || req.types.contains(&m.memory_type));
            rank(metas, &symbols, &files, now, limit)
        })?;
        let mut memories = Vec::with_capacity(ranked.len());
        for r in ranked {
            if let Some(rec) = self.get(&repo.id, &r.memory_id)?.filter(|x| !x.memory.deleted) {
                memories.push(SurfacedMemory {
                    memory: rec.memory,
                    score: r.score,
                    factors: r.factors,
                    matched_symbols: r.matched_symbols,
                    matched_files: r.matched_files,
                });
            }
        }
        Ok(SurfaceResult { memories })
    }

    pub(crate) fn log_entries(
        &self,
        repo_id: &str,
        memory_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<LogEntry>, MemoryError> {
        let mut out = Vec::new();
        for kv in self.log.iter().rev() {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv?;
            let e: LogEntry = serde_json::from_slice(&v).map_err(|e| corrupt(&format!("log/{k:?}"), e))?;
            if e.repo_id == repo_id && (memory_id.is_none() || memory_id == Some(e.memory_id.as_str())) {
                out.push(e);
            }
        }
        Ok(out)
    }
}
