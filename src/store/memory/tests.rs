//! The memory store's behaviour: store, deduplication, upsert, query,
//! soft delete and its log, surface order. Files and staleness: `tests_files.rs`.

use super::*;
use crate::store::Store;
use std::path::{Path, PathBuf};

/// Tree entries, and the files of `.confine-memory/` (`None`: no directory).
pub(super) type Snapshot = (Vec<(Vec<u8>, Vec<u8>)>, Option<Vec<(String, Vec<u8>)>>);

pub(super) struct Fixture {
    pub _tmp: tempfile::TempDir,
    pub store: Store,
    pub db: MemoryDb,
    pub repo: RepoRef,
}

impl Fixture {
    pub fn root(&self) -> &Path {
        &self.repo.root
    }

    pub fn md(&self, id: &str) -> PathBuf {
        self.repo.root.join(MEMORY_DIR).join(format!("{id}.md"))
    }

    /// Every key and value of the memory trees, and every file under
    /// `.confine-memory/`, to prove that a refused call changed nothing.
    pub fn snapshot(&self) -> Snapshot {
        let mut kv = Vec::new();
        for name in [RECORDS_TREE, "memory_addr", LOG_TREE] {
            for item in self.store.tree(name).unwrap().iter() {
                let (k, v) = item.unwrap();
                kv.push(([name.as_bytes(), b"/", &k].concat(), v.to_vec()));
            }
        }
        let dir = self.root().join(MEMORY_DIR);
        let files = std::fs::read_dir(&dir).ok().map(|rd| {
            let mut f: Vec<(String, Vec<u8>)> = rd
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default())
                })
                .collect();
            f.sort();
            f
        });
        (kv, files)
    }
}

pub(super) fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
    std::fs::write(root.join("src/db.rs"), "fn open() {}\n").unwrap();
    let store = Store::open(&tmp.path().join("db")).unwrap();
    let db = MemoryDb::open(&store).unwrap();
    Fixture { _tmp: tmp, store, db, repo: RepoRef { id: "demo".into(), root, files: true } }
}

pub(super) fn req(title: &str, content: &str) -> StoreRequest {
    StoreRequest {
        repo_id: "demo".into(),
        memory_type: MemoryType::Bugfix,
        title: title.into(),
        content: content.into(),
        tags: vec![],
        confidence: None,
        symbol_ids: vec![],
        file_rel_paths: vec![],
        memory_id: None,
    }
}

pub(super) fn query(f: &Fixture, text: Option<&str>) -> QueryResult {
    let q = MemoryQuery { repo_id: "demo".into(), query: text.map(str::to_string), ..MemoryQuery::default() };
    f.db.query(&f.repo, &q).unwrap()
}

fn ops(f: &Fixture, id: &str) -> Vec<String> {
    let mut ops: Vec<String> = f.db.log("demo", Some(id), 100).unwrap().into_iter().map(|e| e.op).collect();
    ops.reverse();
    ops
}

/// Without `memory_files` (the default), the memory tools write nothing
/// into the repository (its git tree stays clean) and read nothing from
/// it: store, update, remove with deleteFile, and sync.
#[test]
fn without_memory_files_nothing_is_written_into_the_repository() {
    let mut f = fixture();
    f.repo.files = false;
    let out = f.db.store(&f.repo, &req("Race", "not awaited")).unwrap();
    let mut update = req("Race", "not awaited, twice");
    update.memory_id = Some(out.memory_id.clone());
    f.db.store(&f.repo, &update).unwrap();
    assert!(!f.root().join(MEMORY_DIR).exists(), "a mirror was written");
    assert_eq!(query(&f, Some("twice")).total, 1);
    // A `.confine-memory` the repository has is not read.
    std::fs::create_dir(f.root().join(MEMORY_DIR)).unwrap();
    std::fs::write(f.root().join(MEMORY_DIR).join("mem_aaaaaaaaaaaaaaaaaaaaaaaa.md"), "---\nnot: parsed\n---\n")
        .unwrap();
    let report = f.db.sync(&f.repo).unwrap();
    assert_eq!(report, SyncReport { repo_id: "demo".into(), ..SyncReport::default() });
    let rm = RemoveRequest { repo_id: "demo".into(), memory_id: out.memory_id.clone(), delete_file: Some(true) };
    assert!(!f.db.remove(&f.repo, &rm).unwrap().file_deleted);
    assert_eq!(std::fs::read_dir(f.root().join(MEMORY_DIR)).unwrap().count(), 1, "the repository's file was touched");
    assert_eq!(query(&f, Some("twice")).total, 0);
}

#[test]
fn store_writes_the_record_and_its_markdown_mirror() {
    let f = fixture();
    let mut r = req("Race in authenticate()", "The token refresh was not awaited.");
    r.tags = vec!["auth".into()];
    r.confidence = Some(0.9);
    r.file_rel_paths = vec!["./src//auth.rs".into()];
    let out = f.db.store(&f.repo, &r).unwrap();
    assert!(out.ok && out.created && !out.deduplicated, "{out:?}");
    assert!(out.memory_id.starts_with("mem_") && out.memory_id.len() == 28, "{}", out.memory_id);
    let text = std::fs::read_to_string(f.md(&out.memory_id)).unwrap();
    let parsed = markdown::parse(&text).unwrap();
    assert_eq!(parsed.content, "The token refresh was not awaited.");
    assert_eq!(parsed.front.file_rel_paths, ["src/auth.rs"], "normalised");
    assert_eq!(parsed.front.file_hashes.len(), 1);
    let q = query(&f, Some("token refresh"));
    assert_eq!(q.total, 1);
    let m = &q.memories[0];
    assert_eq!((m.memory_id.as_str(), m.confidence, m.stale, m.deleted), (out.memory_id.as_str(), 0.9, false, false));
    assert_eq!(m.created_at, m.updated_at);
    assert_eq!(ops(&f, &out.memory_id), ["store"]);
}

#[test]
fn the_same_content_address_is_deduplicated() {
    let f = fixture();
    let a = f.db.store(&f.repo, &req("Use sled", "One store per host.")).unwrap();
    let b = f.db.store(&f.repo, &req("Use sled", "One store per host.")).unwrap();
    assert_eq!(b, StoreResult { ok: true, memory_id: a.memory_id.clone(), created: false, deduplicated: true });
    // Tags and confidence are not part of the address.
    let mut same = req("Use sled", "One store per host.");
    same.tags = vec!["storage".into()];
    assert!(f.db.store(&f.repo, &same).unwrap().deduplicated);
    // Type, title and content are.
    let mut other_type = req("Use sled", "One store per host.");
    other_type.memory_type = MemoryType::Decision;
    for other in [req("Use sled!", "One store per host."), req("Use sled", "One store per host"), other_type] {
        let c = f.db.store(&f.repo, &other).unwrap();
        assert!(c.created && c.memory_id != a.memory_id, "{other:?}");
    }
    assert_eq!(query(&f, None).total, 4);
    assert_eq!(ops(&f, &a.memory_id), ["store", "deduplicate", "deduplicate"]);
    let files = std::fs::read_dir(f.root().join(MEMORY_DIR)).unwrap().count();
    assert_eq!(files, 4);
}

#[test]
fn memory_id_upserts_in_place() {
    let f = fixture();
    let a = f.db.store(&f.repo, &req("Cache TTL", "Five minutes, because of the upstream limit.")).unwrap();
    let before = query(&f, None).memories.remove(0);
    std::thread::sleep(std::time::Duration::from_millis(5));
    let mut up = req("Cache TTL", "Ten minutes since the quota was raised.");
    up.memory_id = Some(a.memory_id.clone());
    up.confidence = Some(0.8);
    let b = f.db.store(&f.repo, &up).unwrap();
    assert_eq!(b, StoreResult { ok: true, memory_id: a.memory_id.clone(), created: false, deduplicated: false });
    let all = query(&f, None);
    assert_eq!(all.total, 1);
    let after = &all.memories[0];
    assert_eq!(after.content, "Ten minutes since the quota was raised.");
    assert_eq!(after.created_at, before.created_at);
    assert!(after.updated_at > before.updated_at);
    assert_eq!(query(&f, Some("upstream")).total, 0, "the old text left the index");
    assert_eq!(query(&f, Some("quota")).total, 1);
    let text = std::fs::read_to_string(f.md(&a.memory_id)).unwrap();
    assert!(text.contains("Ten minutes") && text.contains("confidence: 0.8"), "{text}");
    // The old content's address is free again: storing it creates a memory.
    let c = f.db.store(&f.repo, &req("Cache TTL", "Five minutes, because of the upstream limit.")).unwrap();
    assert!(c.created && c.memory_id != a.memory_id);
    // Upserting onto another memory's address is a conflict.
    let mut clash = req("Cache TTL", "Ten minutes since the quota was raised.");
    clash.memory_id = Some(c.memory_id.clone());
    let e = f.db.store(&f.repo, &clash).unwrap_err();
    assert!(matches!(&e, MemoryError::Conflict { existing } if *existing == a.memory_id), "{e}");
    assert_eq!(ops(&f, &a.memory_id), ["store", "update"]);
}

#[test]
fn soft_delete_hides_the_memory_but_the_log_keeps_it() {
    let f = fixture();
    let a = f.db.store(&f.repo, &req("Flaky test", "test_upload races the GC.")).unwrap();
    let b = f.db.store(&f.repo, &req("Flaky test two", "test_download races the GC.")).unwrap();
    let rm = RemoveRequest { repo_id: "demo".into(), memory_id: a.memory_id.clone(), delete_file: None };
    assert_eq!(
        f.db.remove(&f.repo, &rm).unwrap(),
        RemoveResult { ok: true, memory_id: a.memory_id.clone(), file_deleted: false }
    );
    let q = query(&f, Some("races"));
    assert_eq!((q.total, q.memories[0].memory_id.as_str()), (1, b.memory_id.as_str()));
    let surfaced = SurfaceRequest { repo_id: "demo".into(), symbol_ids: vec!["x".into()], ..Default::default() };
    assert!(f.db.surface(&f.repo, &surfaced).unwrap().memories.is_empty());
    // Still in sled and in the file, marked deleted; and in the log.
    let rec = f.db.get("demo", &a.memory_id).unwrap().unwrap();
    assert!(rec.memory.deleted);
    let text = std::fs::read_to_string(f.md(&a.memory_id)).unwrap();
    assert!(text.contains("deleted: true"), "{text}");
    assert_eq!(ops(&f, &a.memory_id), ["store", "remove"]);
    // Storing the same content again makes a new memory (the address was freed).
    let again = f.db.store(&f.repo, &req("Flaky test", "test_upload races the GC.")).unwrap();
    assert!(again.created && again.memory_id != a.memory_id);
    // deleteFile removes the mirror too.
    let rm = RemoveRequest { repo_id: "demo".into(), memory_id: b.memory_id.clone(), delete_file: Some(true) };
    assert!(f.db.remove(&f.repo, &rm).unwrap().file_deleted);
    assert!(!f.md(&b.memory_id).exists());
    assert!(f.db.get("demo", &b.memory_id).unwrap().unwrap().memory.deleted);
    let log = f.db.log("demo", Some(&b.memory_id), 10).unwrap();
    assert_eq!(log[0].detail.as_deref(), Some("fileDeleted: true"));
}

#[test]
fn query_filters_sorts_and_counts() {
    let f = fixture();
    let mk = |title: &str, t: MemoryType, tags: &[&str], conf: f64, syms: &[&str]| {
        let mut r = req(title, &format!("{title} details about the parser"));
        r.memory_type = t;
        r.tags = tags.iter().map(|s| s.to_string()).collect();
        r.confidence = Some(conf);
        r.symbol_ids = syms.iter().map(|s| s.to_string()).collect();
        let id = f.db.store(&f.repo, &r).unwrap().memory_id;
        std::thread::sleep(std::time::Duration::from_millis(3));
        id
    };
    let a = mk("alpha", MemoryType::Decision, &["x"], 0.2, &["S1"]);
    let b = mk("beta", MemoryType::Bugfix, &["y"], 0.9, &["S2"]);
    let c = mk("gamma", MemoryType::Bugfix, &["x", "y"], 0.5, &[]);
    let run = |q: MemoryQuery| -> (Vec<String>, usize) {
        let r = f.db.query(&f.repo, &MemoryQuery { repo_id: "demo".into(), ..q }).unwrap();
        (r.memories.into_iter().map(|m| m.memory_id).collect(), r.total)
    };
    assert_eq!(run(MemoryQuery::default()), (vec![c.clone(), b.clone(), a.clone()], 3), "recency");
    let by_conf = MemoryQuery { sort_by: Some(SortBy::Confidence), ..Default::default() };
    assert_eq!(run(by_conf).0, [b.clone(), c.clone(), a.clone()]);
    let limited = MemoryQuery { limit: Some(1), ..Default::default() };
    assert_eq!(run(limited), (vec![c.clone()], 3));
    assert_eq!(run(MemoryQuery { types: vec![MemoryType::Decision], ..Default::default() }).0, vec![a.clone()]);
    assert_eq!(run(MemoryQuery { tags: vec!["y".into()], ..Default::default() }).1, 2);
    assert_eq!(run(MemoryQuery { symbol_ids: vec!["S2".into()], ..Default::default() }).0, vec![b.clone()]);
    let text = MemoryQuery { query: Some("gamma parser".into()), ..Default::default() };
    assert_eq!(run(text), (vec![c, b, a], 3), "the title match ranks first; all mention the parser");
    let bad = MemoryQuery { limit: Some(101), ..Default::default() };
    let e = f.db.query(&f.repo, &MemoryQuery { repo_id: "demo".into(), ..bad }).unwrap_err();
    assert_eq!(e.to_string(), "limit must be 1–100 (got 101)");
}

/// The fixed scenario: a task touching symbols A, B and file src/auth.rs.
#[test]
fn surface_ranks_by_confidence_and_overlap() {
    let f = fixture();
    let mk = |title: &str, conf: f64, syms: &[&str], files: &[&str], t: MemoryType| {
        let mut r = req(title, "content");
        r.confidence = Some(conf);
        r.symbol_ids = syms.iter().map(|s| s.to_string()).collect();
        r.file_rel_paths = files.iter().map(|s| s.to_string()).collect();
        r.memory_type = t;
        f.db.store(&f.repo, &r).unwrap().memory_id
    };
    let exact = mk("exact", 0.9, &["A", "B"], &["src/auth.rs"], MemoryType::Bugfix);
    let file_only = mk("file only", 0.9, &[], &["src/auth.rs"], MemoryType::Bugfix);
    let unsure = mk("unsure", 0.4, &["A", "B"], &["src/auth.rs"], MemoryType::Bugfix);
    let broad = mk("broad", 1.0, &["A", "C", "D", "E", "F", "G"], &["src/db.rs"], MemoryType::Bugfix);
    let decision = mk("decision", 1.0, &["A", "B"], &[], MemoryType::Decision);
    let _unrelated = mk("unrelated", 1.0, &["Z"], &["src/db.rs"], MemoryType::Bugfix);
    let s = SurfaceRequest {
        repo_id: "demo".into(),
        symbol_ids: vec!["A".into(), "B".into()],
        file_rel_paths: vec!["src/auth.rs".into()],
        types: Vec::new(),
        limit: None,
    };
    let got = f.db.surface(&f.repo, &s).unwrap().memories;
    let order: Vec<&str> = got.iter().map(|m| m.memory.memory_id.as_str()).collect();
    // exact 0.9·1·1 = .9; decision 1·(2/3+1)/2 ≈ .83; file_only .9·(1/3+1)/2 = .6;
    // unsure .4·1 = .4; broad 1·(1/3+1/7)/2 ≈ .24.
    assert_eq!(order, [&exact, &decision, &file_only, &unsure, &broad]);
    assert_eq!(got[0].matched_symbols, ["A", "B"]);
    assert_eq!(got[0].matched_files, ["src/auth.rs"]);
    assert!((got[0].score - 0.9).abs() < 1e-3, "{}", got[0].score);
    assert!(got
        .iter()
        .all(|m| (m.score - m.factors.confidence * m.factors.recency_factor * m.factors.overlap_factor).abs() < 1e-12));
    let bugfix_only = SurfaceRequest { types: vec![MemoryType::Bugfix], limit: Some(2), ..s.clone() };
    let order: Vec<String> =
        f.db.surface(&f.repo, &bugfix_only).unwrap().memories.into_iter().map(|m| m.memory.memory_id).collect();
    assert_eq!(order, [exact, file_only]);
    let none = SurfaceRequest { repo_id: "demo".into(), ..Default::default() };
    assert!(f.db.surface(&f.repo, &none).unwrap_err().to_string().contains("give symbolIds and/or fileRelPaths"));
}

#[test]
fn the_index_is_rebuilt_from_sled_after_a_restart() {
    let f = fixture();
    let a = f.db.store(&f.repo, &req("Index rebuild", "postings come back")).unwrap();
    let db2 = MemoryDb::open(&f.store).unwrap();
    let q = MemoryQuery { repo_id: "demo".into(), query: Some("postings".into()), ..Default::default() };
    assert_eq!(db2.query(&f.repo, &q).unwrap().memories[0].memory_id, a.memory_id);
    // The log sequence continues after the last entry.
    let last = f.db.log("demo", None, 1).unwrap()[0].seq;
    db2.store(&f.repo, &req("second", "entry")).unwrap();
    assert_eq!(db2.log("demo", None, 1).unwrap()[0].seq, last + 1);
}

#[test]
fn the_service_resolves_repositories() {
    let f = fixture();
    let repos = [crate::config::RepoConfig {
        id: "demo".into(),
        root: f.repo.root.clone(),
        memory_files: true,
        workspace_at: Default::default(),
    }];
    let svc = MemoryService::open(&f.store, &repos).unwrap();
    assert!(svc.store(&req("via service", "works")).unwrap().created);
    let mut other = req("x", "y");
    other.repo_id = "nope".into();
    let e = svc.store(&other).unwrap_err().to_string();
    assert_eq!(e, "unknown repoId 'nope' (configured: demo; add a [[repos]] entry with this id to confine.toml)");
    assert_eq!(svc.stale_count("demo").unwrap(), 0);
    assert!(svc.startup().is_empty());
}
