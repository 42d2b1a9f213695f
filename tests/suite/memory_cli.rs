//! `confine memory …` end to end: the binary with a temporary confine.toml
//! (its own store and one repository). Store, deduplicate, upsert, query,
//! surface, remove, the log, check and sync, and refused input with its
//! exit code and message, leaving nothing behind.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

struct Env {
    tmp: tempfile::TempDir,
    config: PathBuf,
}

impl Env {
    fn new() -> Env {
        Env::with_files(true)
    }

    /// `memory_files` of the repository: its `.confine-memory/` mirror.
    fn with_files(files: bool) -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("repo");
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
        let config = tmp.path().join("confine.toml");
        let toml = format!(
            "[store]\npath = {:?}\n\n[[repos]]\nid = \"demo\"\nroot = {:?}\nmemory_files = {files}\n",
            tmp.path().join("db").display().to_string(),
            root.display().to_string()
        );
        std::fs::write(&config, toml).unwrap();
        Env { tmp, config }
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("repo")
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_confine"))
            .arg("--config")
            .arg(&self.config)
            .arg("memory")
            .args(args)
            .env_remove("CONFINE_CONFIG")
            .output()
            .unwrap()
    }

    /// Run, expect exit 0, and parse stdout as JSON.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

fn set_mtime(path: &Path, ahead: Duration) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(SystemTime::now() + ahead).unwrap();
}

#[test]
fn store_query_surface_remove_and_the_log() {
    let env = Env::new();
    let store = [
        "store",
        "--json",
        "--type",
        "bugfix",
        "--title",
        "Race in authenticate()",
        "--content",
        "The token refresh was not awaited.",
        "--file",
        "src/auth.rs",
        "--symbol",
        "auth::refresh",
        "--tag",
        "auth",
        "--confidence",
        "0.9",
    ];
    let first = env.json(&store);
    assert_eq!((first["created"].as_bool(), first["deduplicated"].as_bool()), (Some(true), Some(false)));
    let id = first["memoryId"].as_str().unwrap().to_string();
    let again = env.json(&store);
    assert_eq!((again["memoryId"].as_str(), again["deduplicated"].as_bool()), (Some(id.as_str()), Some(true)));
    assert!(env.root().join(format!(".confine-memory/{id}.md")).is_file());

    let q = env.json(&["query", "--json", "token refresh"]);
    assert_eq!(q["total"], 1);
    assert_eq!(q["memories"][0]["memoryId"].as_str(), Some(id.as_str()));

    // Upsert: same id, new content.
    let up = env.json(&[
        "store",
        "--json",
        "--memory-id",
        &id,
        "--type",
        "bugfix",
        "--title",
        "Race in authenticate()",
        "--content",
        "Awaiting the refresh fixed it.",
        "--file",
        "src/auth.rs",
    ]);
    assert_eq!((up["memoryId"].as_str(), up["created"].as_bool()), (Some(id.as_str()), Some(false)));
    assert_eq!(env.json(&["query", "--json", "awaiting"])["total"], 1);
    assert_eq!(env.json(&["query", "--json", "token"])["total"], 0);

    let s = env.json(&["surface", "--json", "--file", "src/auth.rs"]);
    assert_eq!(s["memories"][0]["matchedFiles"][0], "src/auth.rs");

    let human = env.run(&["query", "--repo", env.root().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(text.contains(&id) && text.contains("1 of 1 shown"), "{text}");

    let rm = env.json(&["rm", "--json", &id]);
    assert_eq!(rm["fileDeleted"], false);
    assert_eq!(env.json(&["query", "--json"])["total"], 0, "removed memories are hidden");
    let log = env.run(&["log", "--json", "--memory-id", &id]);
    let ops: Vec<String> = String::from_utf8_lossy(&log.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops, ["remove", "update", "deduplicate", "store"], "the log keeps the removed memory");
}

#[test]
fn check_flags_stale_memories_and_sync_reads_hand_edits() {
    let env = Env::new();
    let id = env.json(&[
        "store",
        "--json",
        "--type",
        "decision",
        "--title",
        "Auth retries",
        "--content",
        "Three retries.",
        "--file",
        "src/auth.rs",
    ])["memoryId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(env.run(&["check", "--strict"]).status.code(), Some(0));
    std::fs::write(env.root().join("src/auth.rs"), "fn authenticate() { retry(3) }\n").unwrap();
    let out = env.run(&["check", "--strict"]);
    assert_eq!(out.status.code(), Some(1), "--strict fails on stale memories");
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 stale"), "{}", String::from_utf8_lossy(&out.stdout));
    let stale = env.json(&["query", "--json", "--stale-only"]);
    assert_eq!(stale["memories"][0]["staleFiles"][0], "src/auth.rs");

    let md = env.root().join(format!(".confine-memory/{id}.md"));
    let text = std::fs::read_to_string(&md).unwrap().replace("Three retries.", "Five retries, with jitter.");
    std::fs::write(&md, text).unwrap();
    set_mtime(&md, Duration::from_secs(2));
    let report = env.json(&["sync", "--json"]);
    assert_eq!(report["updated"][0].as_str(), Some(id.as_str()), "{report}");
    assert_eq!(env.json(&["query", "--json", "jitter"])["total"], 1);
}

#[test]
fn bad_input_exits_1_with_a_clear_message_and_writes_nothing() {
    let env = Env::new();
    let long = "t".repeat(121);
    let base = ["store", "--type", "bugfix", "--content", "c"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--title", &long], "title is 121 characters; at most 120"),
        (
            vec![
                "--title", "t", "--tag", "1", "--tag", "2", "--tag", "3", "--tag", "4", "--tag", "5", "--tag", "6",
                "--tag", "7", "--tag", "8", "--tag", "9", "--tag", "10", "--tag", "11", "--tag", "12", "--tag", "13",
                "--tag", "14", "--tag", "15", "--tag", "16", "--tag", "17", "--tag", "18", "--tag", "19", "--tag",
                "20", "--tag", "21",
            ],
            "at most 20 tags (got 21)",
        ),
        (vec!["--title", "t", "--confidence", "1.5"], "confidence must be between 0 and 1 (got 1.5)"),
        (vec!["--title", "t", "--file", "../../etc/passwd"], "fileRelPath '../../etc/passwd' contains '..'"),
        (vec!["--title", "t", "--memory-id", "mem_nope"], "unknown memoryId 'mem_nope' in repository 'demo'"),
        (vec!["--title", "t", "--repo-id", "nope"], "unknown repoId 'nope'"),
    ];
    for (extra, want) in cases {
        let args: Vec<&str> = base.iter().copied().chain(extra).collect();
        let out = env.run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: wanted '{want}', got '{err}'");
    }
    let out = env.run(&["rm", "mem_nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!env.root().join(".confine-memory").exists(), "no file written");
    assert_eq!(env.json(&["query", "--json"])["total"], 0, "nothing stored");
    assert_eq!(env.run(&["log"]).stdout.len(), 0, "nothing logged");
}

/// By default (no `memory_files` for the repository) a memory lives in the
/// store only: the repository's git tree stays clean.
#[test]
fn by_default_memories_write_nothing_into_the_repository() {
    let env = Env::with_files(false);
    let stored = env.json(&["store", "--json", "--type", "decision", "--title", "Use sled", "--content", "One store."]);
    let id = stored["memoryId"].as_str().unwrap().to_string();
    assert!(!env.root().join(".confine-memory").exists(), "a mirror was written into the repository");
    assert_eq!(env.json(&["query", "--json", "sled"])["total"], 1);
    assert_eq!(env.json(&["rm", "--json", &id, "--delete-file"])["fileDeleted"], false);
    assert!(!env.root().join(".confine-memory").exists());
}
