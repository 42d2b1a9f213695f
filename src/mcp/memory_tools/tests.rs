//! The memory tools in memory: an rmcp client and a `ConfineServer` with a
//! memory service over `tokio::io::duplex` (schemas, results, tool errors).

use crate::config::RepoConfig;
use crate::mcp::{ConfineServer, FakeService, RuntimeService};
use crate::store::memory::MemoryService;
use crate::store::Store;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::sync::Arc;

struct Harness {
    client: RunningService<RoleClient, ()>,
    tmp: tempfile::TempDir,
}

async fn connect(with_memory: bool) -> Harness {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/auth.rs"), "fn authenticate() {}\n").unwrap();
    let store = Store::open(&tmp.path().join("db")).unwrap();
    let repos = [RepoConfig { id: "demo".into(), root, memory_files: true, workspace_at: Default::default() }];
    let service: Arc<dyn RuntimeService> = Arc::new(FakeService::new());
    let mut server = ConfineServer::new(service);
    if with_memory {
        server = server.with_memory(Arc::new(MemoryService::open(&store, &repos).unwrap()));
    }
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    Harness { client: ().serve(client_io).await.unwrap(), tmp }
}

async fn call(h: &Harness, tool: &str, v: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(v.as_object().cloned().unwrap());
    h.client.call_tool(params).await.unwrap()
}

fn ok(r: &CallToolResult) -> &Value {
    assert_eq!(r.is_error, Some(false), "{:?}", r.content);
    r.structured_content.as_ref().unwrap()
}

fn error_text(r: &CallToolResult) -> String {
    assert_eq!(r.is_error, Some(true), "{:?}", r.structured_content);
    r.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.clone()).collect()
}

const MEMORY_TOOLS: [&str; 6] =
    ["agent_feedback", "agent_feedback_query", "memory_query", "memory_remove", "memory_store", "memory_surface"];

#[tokio::test]
async fn memory_tools_are_listed_only_with_a_memory_service() {
    let without = connect(false).await;
    let names: Vec<String> =
        without.client.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
    assert!(!names.iter().any(|n| MEMORY_TOOLS.contains(&n.as_str())), "{names:?}");
    let h = connect(true).await;
    let tools = h.client.list_all_tools().await.unwrap();
    for name in MEMORY_TOOLS {
        let t = tools.iter().find(|t| t.name == name).unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{name}");
        // Lean (`mcp/schema.rs`): no output schema, a short description.
        assert!(t.output_schema.is_none(), "{name}");
        assert!(t.description.as_ref().is_some_and(|d| (40..=300).contains(&d.len())), "{name}");
    }
    let store = tools.iter().find(|t| t.name == "memory_store").unwrap();
    let props = store.input_schema["properties"].as_object().unwrap();
    for p in ["repoId", "type", "title", "content", "tags", "confidence", "symbolIds", "fileRelPaths", "memoryId"] {
        assert!(props.contains_key(p), "memory_store lacks {p}");
    }
    let fb = tools.iter().find(|t| t.name == "agent_feedback").unwrap();
    let required = fb.input_schema["required"].as_array().unwrap();
    assert_eq!(required, &vec![json!("repoId"), json!("usefulHandles")], "agent_feedback requires");
}

#[tokio::test]
async fn store_query_surface_remove_round_trip() {
    let h = connect(true).await;
    let stored = call(
        &h,
        "memory_store",
        json!({
            "repoId": "demo", "type": "bugfix", "title": "Race in authenticate()",
            "content": "The token refresh promise was not awaited.", "tags": ["auth"], "confidence": 0.9,
            "symbolIds": ["sym:auth"], "fileRelPaths": ["src/auth.rs"]
        }),
    )
    .await;
    let out = ok(&stored).clone();
    assert_eq!((out["created"].clone(), out["deduplicated"].clone()), (json!(true), json!(false)));
    let id = out["memoryId"].as_str().unwrap().to_string();
    assert!(h.tmp.path().join(format!("repo/.confine-memory/{id}.md")).is_file());

    let q = call(&h, "memory_query", json!({"repoId": "demo", "query": "token refresh", "limit": 5})).await;
    assert_eq!(ok(&q)["total"], 1);
    assert_eq!(ok(&q)["memories"][0]["memoryId"], json!(id));
    assert_eq!(ok(&q)["memories"][0]["type"], "bugfix");

    let s = call(&h, "memory_surface", json!({"repoId": "demo", "symbolIds": ["sym:auth", "other"]})).await;
    let first = &ok(&s)["memories"][0];
    assert_eq!(first["memoryId"], json!(id));
    assert_eq!(first["matchedSymbols"], json!(["sym:auth"]));
    assert!(first["score"].as_f64().unwrap() > 0.0);

    let info = call(&h, "info", json!({"repoId": "demo"})).await;
    assert_eq!(ok(&info)["staleMemories"], 0);
    std::fs::write(h.tmp.path().join("repo/src/auth.rs"), "changed").unwrap();
    let info = call(&h, "info", json!({"repoId": "demo"})).await;
    assert_eq!(ok(&info)["staleMemories"], 1);
    assert!(ok(&call(&h, "info", json!({})).await).get("staleMemories").is_none());

    let rm = call(&h, "memory_remove", json!({"repoId": "demo", "memoryId": id, "deleteFile": true})).await;
    assert_eq!(ok(&rm)["fileDeleted"], true);
    let q = call(&h, "memory_query", json!({"repoId": "demo", "query": "token"})).await;
    assert_eq!(ok(&q)["total"], 0);
}

#[tokio::test]
async fn feedback_round_trip() {
    let h = connect(true).await;
    let r = call(
        &h,
        "agent_feedback",
        json!({
            "repoId": "demo", "usefulHandles": ["run-demo-1-ab", "job-1-cd"], "missing": ["c"],
            "ids": ["v1"], "taskType": "debug"
        }),
    )
    .await;
    assert_eq!(ok(&r)["recorded"], 3);
    let q = call(&h, "agent_feedback_query", json!({"repoId": "demo", "limit": 10})).await;
    let out = ok(&q);
    assert_eq!(out["aggregatedStats"]["totalFeedback"], 1);
    assert_eq!(out["aggregatedStats"]["topMissing"][0], json!({"name": "c", "count": 1}));
    assert_eq!(out["hasMore"], false);
    assert_eq!(out["feedback"][0]["taskType"], "debug");
}

#[tokio::test]
async fn bad_input_is_a_one_line_tool_error() {
    let h = connect(true).await;
    let base = json!({"repoId": "demo", "type": "decision", "title": "t", "content": "c"});
    let with = |k: &str, v: Value| {
        let mut o = base.clone();
        o[k] = v;
        o
    };
    let cases = [
        ("memory_store", with("title", json!("x".repeat(121))), "invalid: title is 121 characters; at most 120"),
        ("memory_store", with("tags", json!(vec!["t"; 21])), "invalid: at most 20 tags (got 21)"),
        ("memory_store", with("confidence", json!(1.5)), "invalid: confidence must be between 0 and 1 (got 1.5)"),
        (
            "memory_store",
            with("fileRelPaths", json!(["../../etc/passwd"])),
            "invalid: fileRelPath '../../etc/passwd' contains '..'",
        ),
        ("memory_store", with("memoryId", json!("mem_nope")), "not_found: unknown memoryId 'mem_nope'"),
        ("memory_store", with("repoId", json!("elsewhere")), "not_found: unknown repoId 'elsewhere'"),
        ("memory_store", with("type", json!("opinion")), "invalid: type: unknown variant `opinion`"),
        ("memory_store", with("colour", json!("red")), "invalid: unknown field `colour`"),
        ("memory_remove", json!({"repoId": "demo", "memoryId": "mem_nope"}), "not_found: unknown memoryId"),
        ("memory_query", json!({"repoId": "demo", "limit": 0}), "invalid: limit must be 1–100 (got 0)"),
        ("memory_surface", json!({"repoId": "demo"}), "invalid: give symbolIds and/or fileRelPaths"),
        ("agent_feedback", json!({"repoId": "demo", "usefulHandles": []}), "invalid: usefulHandles needs at least 1"),
        ("agent_feedback_query", json!({"repoId": "demo", "limit": 1001}), "invalid: limit must be 1–1000"),
    ];
    for (tool, args, want) in cases {
        let text = error_text(&call(&h, tool, args).await);
        assert!(text.starts_with(want), "{tool}: wanted '{want}', got '{text}'");
        assert!(!text.contains('\n'));
    }
    assert!(!h.tmp.path().join("repo/.confine-memory").exists(), "nothing written");
}
