//! The MCP server in memory: an rmcp client and `ConfineServer` over
//! `tokio::io::duplex`, against the fake service. Protocol behaviour only:
//! tool listing and schemas, results, tool errors, cancellation, progress.

use confine::mcp::types::{ExecStatus, JobsRequest};
use confine::mcp::{ConfineServer, FakeService, RuntimeService};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientRequest, JsonObject, ProgressNotificationParam, Request,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const TOOLS: [&str; 6] =
    ["info", "runtime_execute", "runtime_jobs", "runtime_kill", "runtime_query_output", "usage_stats"];

struct TestClient {
    progress: mpsc::UnboundedSender<ProgressNotificationParam>,
}

impl ClientHandler for TestClient {
    async fn on_progress(&self, params: ProgressNotificationParam, _ctx: NotificationContext<RoleClient>) {
        let _ = self.progress.send(params);
    }
}

struct Harness {
    client: RunningService<RoleClient, TestClient>,
    progress: mpsc::UnboundedReceiver<ProgressNotificationParam>,
}

async fn connect() -> Harness {
    let service: Arc<dyn RuntimeService> = Arc::new(FakeService::new());
    let server = ConfineServer::new(service);
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (tx, progress) = mpsc::unbounded_channel();
    let client = TestClient { progress: tx }.serve(client_io).await.expect("handshake");
    Harness { client, progress }
}

fn args(v: Value) -> JsonObject {
    v.as_object().cloned().expect("object")
}

async fn call(h: &Harness, tool: &str, v: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(args(v));
    tokio::time::timeout(Duration::from_secs(20), h.client.call_tool(params)).await.expect("no hang").expect("call")
}

fn structured(r: &CallToolResult) -> &Value {
    r.structured_content.as_ref().expect("structured content")
}

fn text(r: &CallToolResult) -> String {
    r.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.clone()).collect::<Vec<_>>().join("\n")
}

#[tokio::test]
async fn lists_tools_with_schemas() {
    let h = connect().await;
    let tools = h.client.list_all_tools().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    assert_eq!(names, TOOLS);
    for t in &tools {
        assert!(t.name.len() <= 64 && t.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'));
        assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{}", t.name);
        // Lean (`mcp/schema.rs`): no output schema, a short description.
        assert!(t.output_schema.is_none(), "{}", t.name);
        assert!(t.description.as_ref().is_some_and(|d| (40..=300).contains(&d.len())), "{}", t.name);
    }
    let exec = tools.iter().find(|t| t.name == "runtime_execute").unwrap();
    let props = exec.input_schema["properties"].as_object().unwrap();
    for p in ["repoId", "runtime", "code", "args", "relativeCwd", "timeoutMs", "queryTerms", "outputMode", "background"]
    {
        assert!(props.contains_key(p), "runtime_execute lacks {p}");
    }
    assert_eq!(props["timeoutMs"]["minimum"], 100);
    assert_eq!(props["timeoutMs"]["maximum"], 300_000);
    let required = exec.input_schema["required"].as_array().unwrap();
    // repoId may be left out when one repository is configured.
    assert_eq!(required, &vec![json!("runtime")]);
}

#[tokio::test]
async fn executes_and_queries() {
    let h = connect().await;
    let r = call(&h, "runtime_execute", json!({"repoId": "demo", "runtime": "shell", "code": "echo hi"})).await;
    assert_eq!(r.is_error, Some(false), "{}", text(&r));
    let out = structured(&r);
    assert_eq!(out["status"], "success");
    assert_eq!(out["exitCode"], 0);
    // Lean: an allowing decision is not repeated; the output is inline.
    assert!(out.get("policyDecision").is_none(), "{out}");
    assert_eq!(out["stdout"], "hi", "{out}");
    assert!(text(&r).starts_with("success exit=0 ") && text(&r).ends_with("\nhi"), "{}", text(&r));
    let handle = out["artifactHandle"].as_str().unwrap().to_string();

    let q = call(&h, "runtime_query_output", json!({"artifactHandle": handle, "queryTerms": ["hi"]})).await;
    assert_eq!(q.is_error, Some(false), "{}", text(&q));
    assert_eq!(structured(&q)["excerpts"][0]["content"], "hi");

    let info = call(&h, "info", json!({})).await;
    assert_eq!(structured(&info)["backend"], "fake");
    let usage = call(&h, "usage_stats", json!({"scope": "session"})).await;
    let session = &structured(&usage)["session"];
    assert_eq!(session["tools"]["runtime_execute"]["calls"], 1);
    assert_eq!(session["tools"]["runtime_execute"]["rawOutputBytes"], 3);
    assert_eq!(session["statuses"]["success"], 1);
}

#[tokio::test]
async fn bad_calls_are_one_line_tool_errors() {
    let h = connect().await;
    let cases = [
        (json!({"runtime": "shell", "code": "x"}), "invalid: repoId: name the workspace"),
        (json!({"repoId": "d", "runtime": "shell", "code": "x", "args": ["y"]}), "invalid: give either code or args"),
        (json!({"repoId": "d", "runtime": "shell", "code": "x", "timeoutMs": 5}), "invalid: timeoutMs must be between"),
        (
            json!({"repoId": "d", "runtime": "shell", "code": "x", "timeoutMs": "soon"}),
            "invalid: timeoutMs: expected an integer, 0 or more, got \"soon\"",
        ),
        (json!({"repoId": "d", "runtime": "shell", "code": "x", "timeout": 5}), "invalid: unknown field `timeout`"),
        (json!({"repoId": "d", "runtime": "cobol", "code": "x"}), "invalid: unknown runtime 'cobol'"),
        (json!({"repoId": "d", "runtime": "go", "code": "x"}), "denied: runtime 'go' is not available"),
        (json!({"repoId": "d", "runtime": "shell", "code": "x", "env": {"AWS_SECRET_KEY": "k"}}), "denied: env"),
    ];
    for (v, want) in cases {
        let r = call(&h, "runtime_execute", v.clone()).await;
        assert_eq!(r.is_error, Some(true), "{v}");
        let t = text(&r);
        assert!(t.starts_with(want), "{v}: got {t:?}");
        assert!(!t.contains('\n'), "{t}");
        assert!(r.structured_content.is_none());
    }
    // A policy denial is a tool error that still carries the decision.
    let r = call(&h, "runtime_execute", json!({"repoId": "d", "runtime": "shell", "code": "rm -rf /"})).await;
    assert_eq!(r.is_error, Some(true));
    assert_eq!(structured(&r)["status"], "denied");
    assert_eq!(structured(&r)["policyDecision"]["deniedReasons"][0], "denied by policy: 'rm': destructive command");
    let r = call(&h, "runtime_query_output", json!({"artifactHandle": "run-nope", "queryTerms": ["x"]})).await;
    assert!(text(&r).starts_with("not_found: "), "{}", text(&r));
    let r = call(&h, "runtime_kill", json!({"jobId": ""})).await;
    assert!(text(&r).starts_with("invalid: "));
    let r = call(&h, "usage_stats", json!({"scope": "forever"})).await;
    assert!(text(&r).starts_with("invalid: scope: unknown variant `forever`"), "{}", text(&r));
    // The server survived all of it.
    assert_eq!(h.client.list_all_tools().await.unwrap().len(), TOOLS.len());
}

#[tokio::test]
async fn cancellation_ends_the_call_as_cancelled() {
    let h = connect().await;
    let params = CallToolRequestParams::new("runtime_execute")
        .with_arguments(args(json!({"repoId": "d", "runtime": "shell", "code": "sleep 30"})));
    let handle = h
        .client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    handle.cancel(Some("test gives up".into())).await.unwrap();
    // The response is suppressed (the client said it no longer wants it);
    // the call's end shows in the usage counters and the job table.
    loop {
        let usage = call(&h, "usage_stats", json!({"scope": "session"})).await;
        if structured(&usage)["session"]["statuses"]["cancelled"] == 1 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(3), "not cancelled: {}", text(&usage));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let jobs = call(&h, "runtime_jobs", json!({})).await;
    assert_eq!(structured(&jobs)["jobs"][0]["status"], "cancelled");
}

#[tokio::test]
async fn progress_arrives_for_a_long_call() {
    let mut h = connect().await;
    let started = Instant::now();
    let r =
        call(&h, "runtime_execute", json!({"repoId": "d", "runtime": "shell", "code": "echo start; sleep 3"})).await;
    assert_eq!(structured(&r)["status"], "success");
    assert!(started.elapsed() >= Duration::from_secs(3));
    let mut notes = Vec::new();
    while let Ok(n) = h.progress.try_recv() {
        notes.push(n);
    }
    assert!(notes.len() >= 2, "only {} progress notifications", notes.len());
    assert!(notes.windows(2).all(|w| w[1].progress > w[0].progress), "progress must grow");
    let msg = notes.last().unwrap().message.clone().unwrap();
    assert!(msg.contains("6 bytes of output"), "{msg}");
}

#[tokio::test]
async fn background_job_is_followed_and_killed() {
    let h = connect().await;
    let r = call(
        &h,
        "runtime_execute",
        json!({"repoId": "d", "runtime": "shell", "code": "echo up; sleep 60", "background": true}),
    )
    .await;
    assert_eq!(structured(&r)["status"], "running");
    let id = structured(&r)["jobId"].as_str().unwrap().to_string();
    // The background job outlives its call (the call's token fired when it was answered).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let jobs = call(&h, "runtime_jobs", json!({"jobId": id})).await;
    assert_eq!(structured(&jobs)["jobs"][0]["status"], "running");
    assert_eq!(structured(&jobs)["output"]["text"], "up\n");
    let killed = call(&h, "runtime_kill", json!({"jobId": id})).await;
    assert_eq!(structured(&killed)["status"], "killed");
}

#[tokio::test]
async fn client_disconnect_cancels_the_call() {
    let fake = FakeService::new();
    let server = ConfineServer::new(Arc::new(fake.clone()));
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (tx, _progress) = mpsc::unbounded_channel();
    let client = TestClient { progress: tx }.serve(client_io).await.unwrap();
    let params = CallToolRequestParams::new("runtime_execute")
        .with_arguments(args(json!({"repoId": "d", "runtime": "shell", "code": "sleep 60"})));
    let _pending = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(Request::new(params)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.cancel().await.unwrap();
    // rmcp lets in-flight calls answer for up to 5 s after the transport
    // closes, then cancels them.
    let started = Instant::now();
    loop {
        let jobs = fake.jobs(JobsRequest::default(), &confine::mcp::access::Caller::local()).await.unwrap();
        if jobs.jobs[0].status == ExecStatus::Cancelled {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "still {:?}", jobs.jobs[0].status);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
