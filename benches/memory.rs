//! Memory store benchmark: 10,000 memories in one repository, then
//! `memory_query` latency (budget: p50 ≤ 20 ms), plus the first sync that
//! reads the 10,000 `.md` files in, the index build after a restart,
//! surface, and single stores (each one an fsync'd `.md` and sled flush).
//!
//! `cargo bench --bench memory` (add `-- --memories N` for another size).
//! Synthetic text: a 3,000-word vocabulary drawn with a Zipf-like skew, so
//! common words have long postings lists as in real notes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use confine::store::memory::{
    MemoryDb, MemoryQuery, MemoryStore, MemoryType, RepoRef, SortBy, StoreRequest, SurfaceRequest,
};
use confine::store::Store;
use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Zipf-ish: small indices much more often.
    fn skewed(&mut self, n: usize) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((n as f64).powf(u) as usize).saturating_sub(1).min(n - 1)
    }
}

fn vocabulary(n: usize) -> Vec<String> {
    const SYL: [&str; 20] = [
        "ka", "to", "re", "mi", "su", "lo", "ne", "da", "pi", "go", "ra", "ve", "shi", "tu", "bo", "le", "zen", "qua",
        "fi", "mo",
    ];
    (0..n).map(|i| format!("{}{}{}", SYL[i % 20], SYL[(i / 20) % 20], SYL[(i / 400) % 20])).collect()
}

fn words(rng: &mut Rng, vocab: &[String], n: usize) -> String {
    (0..n).map(|_| vocab[rng.skewed(vocab.len())].as_str()).collect::<Vec<_>>().join(" ")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    let (p50, p99) = (percentile(&samples, 0.5), percentile(&samples, 0.99));
    println!("{name:<44} n={:<5} p50 {:>8.3} ms   p99 {:>8.3} ms", samples.len(), ms(p50), ms(p99));
    p50
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize =
        args.iter().position(|a| a == "--memories").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(10_000);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    let dir = root.join(".confine-memory");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("src/f{i}.rs")), format!("// file {i}\n")).unwrap();
    }
    let vocab = vocabulary(3000);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let types = ["decision", "bugfix", "task_context"];
    for i in 0..n {
        let (title_words, content_words) = (3 + rng.below(4), 40 + rng.below(80));
        let title = words(&mut rng, &vocab, title_words);
        let content = words(&mut rng, &vocab, content_words);
        let file = rng.below(50);
        let text = format!(
            "---\ntype: {}\ntitle: {title}\ntags: [t{}]\nconfidence: {}\nsymbolIds: [sym{}]\nfileRelPaths: [src/f{file}.rs]\n---\n{content}\n",
            types[i % 3],
            rng.below(30),
            (rng.below(10) as f64) / 10.0,
            rng.below(500),
        );
        std::fs::write(dir.join(format!("m{i:05}.md")), text).unwrap();
    }
    let repo = RepoRef { id: "bench".into(), root: root.clone(), files: true };
    let store = Store::open(&tmp.path().join("db")).unwrap();
    println!("memory benchmark: {n} memories, vocabulary {} words, 40–120 words each", vocab.len());

    let t = Instant::now();
    let db = MemoryDb::open(&store).unwrap();
    let synced = db.sync(&repo).unwrap();
    assert_eq!(synced.imported.len(), n, "{:?}", synced.problems.first());
    println!(
        "{:<44} {:>8.1} ms (one transaction per 1,000, one flush each)",
        "first sync (read the .md files in)",
        ms(t.elapsed())
    );

    // A restart: the index is built from sled on the first query.
    drop(db);
    let db = MemoryDb::open(&store).unwrap();
    let t = Instant::now();
    let first = MemoryQuery { repo_id: "bench".into(), query: Some(vocab[10].clone()), ..Default::default() };
    db.query(&repo, &first).unwrap();
    println!("{:<44} {:>8.1} ms", "first query after a restart (index build)", ms(t.elapsed()));

    let queries: Vec<String> =
        (0..500).map(|_| format!("{} {}", vocab[rng.below(300)], vocab[20 + rng.below(2000)])).collect();
    let run = |name: &str, make: &dyn Fn(&str) -> MemoryQuery| -> Duration {
        let mut samples = Vec::with_capacity(queries.len());
        let mut total = 0usize;
        for q in &queries {
            let req = make(q);
            let t = Instant::now();
            let r = db.query(&repo, &req).unwrap();
            samples.push(t.elapsed());
            total += r.total;
        }
        let p50 = report(name, samples);
        println!("{:<44} mean matches {}", "", total / queries.len());
        p50
    };
    let text_p50 = run("query: 2 words, limit 20 (BM25)", &|q| MemoryQuery {
        repo_id: "bench".into(),
        query: Some(q.to_string()),
        ..Default::default()
    });
    run("query: 2 words + type + tag filters", &|q| MemoryQuery {
        repo_id: "bench".into(),
        query: Some(q.to_string()),
        types: vec![MemoryType::Bugfix],
        tags: vec!["t3".into(), "t7".into()],
        limit: Some(100),
        ..Default::default()
    });
    run("query: no text, sortBy confidence, limit 100", &|_| MemoryQuery {
        repo_id: "bench".into(),
        sort_by: Some(SortBy::Confidence),
        limit: Some(100),
        ..Default::default()
    });

    let mut samples = Vec::new();
    for i in 0..50 {
        let req = SurfaceRequest {
            repo_id: "bench".into(),
            symbol_ids: vec![format!("sym{}", i * 7)],
            file_rel_paths: vec![format!("src/f{}.rs", i % 50)],
            ..Default::default()
        };
        let t = Instant::now();
        db.surface(&repo, &req).unwrap();
        samples.push(t.elapsed());
    }
    report("surface (re-hashes 50 linked files first)", samples);

    let mut samples = Vec::new();
    for i in 0..100 {
        let req = StoreRequest {
            repo_id: "bench".into(),
            memory_type: MemoryType::Decision,
            title: format!("bench store {i}"),
            content: words(&mut rng, &vocab, 80),
            tags: vec![],
            confidence: Some(0.7),
            symbol_ids: vec![],
            file_rel_paths: vec!["src/f1.rs".into()],
            memory_id: None,
        };
        let t = Instant::now();
        db.store(&repo, &req).unwrap();
        samples.push(t.elapsed());
    }
    report("store (fsync'd .md + sled flush)", samples);

    let verdict = if text_p50 <= Duration::from_millis(20) { "within" } else { "OVER" };
    println!("query p50 {:.3} ms: {verdict} the 20 ms budget", ms(text_p50));
}
