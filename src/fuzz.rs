//! The fuzz targets' entry points (`fuzz/fuzz_targets/`), and the replay
//! of what they found (`fuzz/regressions/`, run by the unit tests). Each
//! takes the fuzzer's bytes, feeds them through the real decoder or parser
//! that hostile input reaches, and panics when an invariant fails: no
//! panic, no hang, and answers that agree with a second reading.
//!
//! Built only for the unit tests and for `cargo fuzz` (`cfg(fuzzing)`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Where this process's targets keep their stores and repositories:
/// `confine-fuzz-<pid>` in /dev/shm (a store syncs every artifact, which
/// costs nothing on tmpfs), else in the temporary directory. The fuzzers'
/// statics are never dropped (libFuzzer ends with exit), so `fuzz/run.sh`
/// and the replay test remove it.
pub fn scratch_root() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
    base.join(format!("confine-fuzz-{}", std::process::id()))
}

fn scratch(what: &str) -> PathBuf {
    let dir = scratch_root().join(what);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A target: the fuzzer's bytes in, a panic when an invariant fails.
pub type FuzzTarget = fn(&[u8]);

/// The targets, by name (the file names under `fuzz/fuzz_targets/`).
pub const TARGETS: &[(&str, FuzzTarget)] = &[
    ("init_spec", init_spec),
    ("seccomp", seccomp),
    ("config", config),
    ("policy", policy),
    ("opa_answer", opa_answer),
    ("artifact_query", artifact_query),
    ("memory_file", memory_file),
    ("mcp_stdio", mcp_stdio),
    ("mcp_tool_args", mcp_tool_args),
];

/// What the supervisor sends across the privilege boundary to the init
/// stage (`protocol::read_spec`), and the reports it reads back: whatever
/// decodes must encode to the same thing.
pub fn init_spec(data: &[u8]) {
    use crate::sandbox::linux::protocol::{encode_report, read_spec, write_spec, InitReport, InitSpec, RequestPart};
    if let Ok(spec) = read_spec::<InitSpec>(&mut &data[..]) {
        let mut again = Vec::new();
        write_spec(&mut again, &spec).unwrap();
        let back: InitSpec = read_spec(&mut again.as_slice()).expect("a spec we wrote must read back");
        assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&spec).unwrap());
        // A warm sandbox's base and its request's part make the whole again.
        let (mut base, part) = spec.clone().split();
        assert!(base.mounts.iter().all(|m| !m.is_request()));
        base.join(part);
        let mut whole = spec.clone();
        whole.mounts.sort_by_key(|m| m.is_request());
        assert_eq!(serde_json::to_value(&base).unwrap(), serde_json::to_value(&whole).unwrap());
    }
    // The request's part, which a warm sandbox's outer stage reads.
    if let Ok(part) = read_spec::<RequestPart>(&mut &data[..]) {
        let mut again = Vec::new();
        write_spec(&mut again, &part).unwrap();
        let back: RequestPart = read_spec(&mut again.as_slice()).expect("a part we wrote must read back");
        assert_eq!(serde_json::to_value(&back).unwrap(), serde_json::to_value(&part).unwrap());
    }
    for line in data.split(|&b| b == b'\n') {
        if let Ok(report) = serde_json::from_slice::<InitReport>(line) {
            let again = encode_report(&report);
            assert_eq!(serde_json::from_slice::<InitReport>(&again).unwrap(), report);
        }
    }
}

/// A seccomp profile: parsed, planned for this host and compiled by our
/// range compiler; when libseccomp compiles it too, both programs give the
/// same verdict on every syscall number and on the argument values the
/// fuzzer picks (the bytes after the first NUL, 56 per call).
pub fn seccomp(data: &[u8]) {
    use crate::sandbox::linux::seccomp::{interp, profile};
    static HOST: OnceLock<profile::HostFacts> = OnceLock::new();
    let host = HOST.get_or_init(|| profile::HostFacts::current().expect("host facts"));
    let (text, picks) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(text) = std::str::from_utf8(text) else { return };
    let Ok(parsed) = profile::parse("fuzz.json", text) else { return };
    let Ok(plan) = profile::plan("fuzz.json", &parsed, host) else { return };
    let Ok(ours) = interp::ours(&plan) else { return };
    assert!(!ours.is_empty() && ours.len() <= 4096, "{} instructions", ours.len());
    let Ok(theirs) = interp::libseccomp_program(&plan) else { return };
    let extra: Vec<interp::Data> = picks
        .chunks_exact(56)
        .map(|c| {
            let word = |i: usize| u64::from_le_bytes(c[i..i + 8].try_into().unwrap());
            interp::Data {
                nr: word(0) as u32 % 1200,
                arch: (word(0) >> 32) as u32,
                args: [word(8), word(16), word(24), word(32), word(40), word(48) ^ word(8)],
            }
        })
        .collect();
    let mut values = interp::interesting_args(&plan);
    values.truncate(64);
    if let Err(diff) = interp::compare(&plan, &ours, &theirs, &values, &extra) {
        panic!("the range compiler and libseccomp disagree: {diff}\nprofile: {text}");
    }
}

/// confine.toml: parsed and validated; what validates gives limits and a
/// network section that the supervisor can use without a panic.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(cfg) = crate::config::Config::parse(text, Path::new("/fuzz/confine.toml")) else { return };
    if cfg.validate().is_err() {
        return;
    }
    let _ = cfg.resolve_limits(&crate::config::LimitRequest::default());
    let _ = cfg.network.limits();
    let _ = cfg.network.allowlisted();
    let _ = cfg.max_concurrent_jobs();
    for repo in &cfg.repos {
        let _ = cfg.repo(&repo.id);
    }
}

/// The policy's input document: a request (JSON, as `confine exec` and the
/// MCP adapter build it) through the input checks, into the document, its
/// canonical form (which must read back as the same document), and the
/// built-in Rego policy's decision.
pub fn policy(data: &[u8]) {
    use crate::supervisor::exec::JobRequest;
    static CHAIN: OnceLock<(crate::config::Config, crate::policy::PolicyChain)> = OnceLock::new();
    let (cfg, chain) = CHAIN.get_or_init(|| {
        let cfg = crate::config::Config::parse(
            "[network.allow]\npypi = [\"pypi.org\", \"files.pythonhosted.org\"]\n",
            Path::new("/fuzz/confine.toml"),
        )
        .unwrap();
        let chain = crate::policy::PolicyChain::from_config(&cfg.policy).unwrap();
        (cfg, chain)
    });
    let Ok(req) = serde_json::from_slice::<JobRequest>(data) else { return };
    let preq = crate::supervisor::plan::policy_request(&req, &cfg.network);
    if preq.check(&cfg.limits).is_err() {
        return;
    }
    let limits = cfg.resolve_limits(&preq.limits);
    let command = req.executable.clone().unwrap_or_else(|| req.runtime.clone());
    let input = preq.to_input(&command, limits);
    let canonical = input.canonical();
    let back: serde_json::Value = serde_json::from_str(&canonical).expect("the canonical input is JSON");
    assert_eq!(back, input.to_value(), "the canonical form changed the document");
    assert_eq!(crate::policy::input::canonical_json(&back), canonical, "canonical form is not stable");
    let decision = chain.decide(&input);
    assert!(decision.allowed || !decision.deny_reasons.is_empty(), "a denial without a reason: {decision:?}");
}

/// A remote OPA server's answer, whatever it is: a verdict or an error.
/// The first two bytes are the HTTP status when the first has its high
/// bit set, else the status is 200.
pub fn opa_answer(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let status = if data[0] & 0x80 != 0 { u16::from_le_bytes([data[0], data[1]]) } else { 200 };
    let text = String::from_utf8_lossy(&data[2..]);
    let _ = crate::policy::remote::read_answer("opa fuzz", status, &text);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&data[2..]) {
        let _ = crate::policy::Verdict::from_json("fuzz", &v);
    }
}

struct ArtifactStore {
    artifacts: crate::store::artifacts::Artifacts,
}

/// Store `stdout` and `stderr` as one artifact, in chunks of 4 KiB, as the
/// output capture does.
pub(crate) fn store_texts(
    a: &crate::store::artifacts::Artifacts,
    stdout: &[u8],
    stderr: &[u8],
) -> crate::store::artifacts::ArtifactMeta {
    use crate::store::artifacts::{JobInfo, StoredStream, StreamMeta, StreamName, DEFAULT_TTL_MS};
    let w = a.begin("fuzz", DEFAULT_TTL_MS).unwrap();
    let mut metas = Vec::new();
    for (s, text) in [(StreamName::Stdout, stdout), (StreamName::Stderr, stderr)] {
        let mut sink = w.chunk_sink(s);
        for c in text.chunks(4096) {
            sink.write_chunk(c).unwrap();
        }
        let StoredStream { chunks, compressed_bytes, blob } = sink.finish().unwrap();
        let lines = line_count(text);
        metas.push(StreamMeta {
            total_bytes: text.len() as u64,
            total_lines: lines,
            stored_bytes: text.len() as u64,
            stored_lines: lines,
            compressed_bytes,
            chunks,
            blob,
            ..Default::default()
        });
    }
    let err = metas.pop().unwrap();
    let out = metas.pop().unwrap();
    w.finish(JobInfo::default(), out, err).unwrap()
}

fn line_count(text: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', text).count() as u64 + u64::from(text.last().is_some_and(|&b| b != b'\n'))
}

/// The artifact query (terms, ranges, context) over an artifact of the
/// fuzzer's text. Layout: context, excerpts, stream, then two u16 line
/// numbers (0: none); the terms, one per line, up to a 0xFF byte; then
/// stdout, up to a 0xFE byte, then stderr.
pub fn artifact_query(data: &[u8]) {
    use crate::output::query::{query_output, ArtifactQuery, QueryStreams, MAX_RANGE_LINES};
    static STORE: OnceLock<ArtifactStore> = OnceLock::new();
    if data.len() < 7 {
        return;
    }
    let store = STORE.get_or_init(|| {
        let store = crate::store::Store::open(&scratch("artifacts")).unwrap();
        ArtifactStore { artifacts: crate::store::artifacts::Artifacts::open(&store).unwrap() }
    });
    let num = |i: usize| u64::from(u16::from_le_bytes([data[i], data[i + 1]]));
    let (start, end) = (num(3), num(5));
    let rest = &data[7..];
    let (terms, texts) = match rest.iter().position(|&b| b == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (&[][..], rest),
    };
    let (stdout, stderr) = match texts.iter().position(|&b| b == 0xfe) {
        Some(i) => (&texts[..i], &texts[i + 1..]),
        None => (texts, &[][..]),
    };
    let meta = store_texts(&store.artifacts, stdout, stderr);
    let req = ArtifactQuery {
        artifact_handle: meta.handle.clone(),
        query_terms: String::from_utf8_lossy(terms).split('\n').map(str::to_string).collect(),
        context_lines: Some(u32::from(data[0])),
        max_excerpts: Some(u32::from(data[1])),
        stream: [QueryStreams::Stdout, QueryStreams::Stderr, QueryStreams::Both][usize::from(data[2] % 3)],
        line_start: (start > 0).then_some(start),
        line_end: (end > 0).then_some(end),
    };
    let answer = query_output(&store.artifacts, &req);
    store.artifacts.remove(&meta.handle).unwrap();
    let Ok(r) = answer else { return };
    let lines = [line_count(stdout), line_count(stderr)];
    let searched: Vec<u64> = req.stream.streams().iter().map(|s| lines[*s as usize]).collect();
    assert_eq!(r.total_lines, searched.iter().sum::<u64>(), "{r:?}");
    let ranged = req.line_start.is_some() || req.line_end.is_some();
    let mut returned = 0;
    for e in &r.excerpts {
        let total = lines[e.source as usize];
        assert!(1 <= e.line_start && e.line_start <= e.line_end && e.line_end <= total, "{e:?} of {total} lines");
        returned += e.line_end - e.line_start + 1;
    }
    if ranged {
        assert!(returned <= MAX_RANGE_LINES * searched.len() as u64, "{returned} lines returned");
    }
}

struct MemoryFixture {
    dir: PathBuf,
    db: crate::store::memory::MemoryDb,
    runs: std::sync::atomic::AtomicU64,
}

/// A `.confine-memory/*.md` file of a repository (a job or a contributor
/// may have written it) read in by a sync; a file it imported reads as
/// unchanged at the next sync. Each input is read as a repository of its
/// own, so no input sees another's memory.
pub fn memory_file(data: &[u8]) {
    static FIXTURE: OnceLock<MemoryFixture> = OnceLock::new();
    let f = FIXTURE.get_or_init(|| {
        let dir = scratch("memory");
        std::fs::create_dir_all(dir.join("repo/.confine-memory")).unwrap();
        let store = crate::store::Store::open(&dir.join("db")).unwrap();
        let db = crate::store::memory::MemoryDb::open(&store).unwrap();
        MemoryFixture { dir, db, runs: std::sync::atomic::AtomicU64::new(0) }
    });
    let run = f.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let root = f.dir.join("repo");
    let repo = crate::store::memory::RepoRef { id: format!("fuzz{run}"), root: root.clone(), files: true };
    let file = root.join(".confine-memory/m-0123456789abcdef.md");
    std::fs::write(&file, data).unwrap();
    let first = f.db.sync_repo(&repo).unwrap();
    let second = f.db.sync_repo(&repo).unwrap();
    let changed = second.imported.len() + second.updated.len() + second.rewritten.len();
    assert_eq!(changed, 0, "a second sync changed what the first read: {first:?} then {second:?}");
    std::fs::remove_file(&file).unwrap();
}

struct Mcp {
    runtime: tokio::runtime::Runtime,
    server: crate::mcp::ConfineServer,
}

/// A service that refuses every job: the MCP targets test the protocol
/// and the arguments, which are decoded and checked before a service runs.
struct Refuse;

#[async_trait::async_trait]
impl crate::mcp::service::RuntimeService for Refuse {
    async fn execute(
        &self,
        _: crate::mcp::types::ExecuteRequest,
        _: crate::mcp::service::ExecControl,
    ) -> Result<crate::mcp::types::ExecuteResponse, crate::mcp::service::ServiceError> {
        Err(crate::mcp::service::ServiceError::Invalid("fuzz: no jobs".into()))
    }
    async fn query_output(
        &self,
        _: crate::mcp::types::QueryOutputRequest,
        _: &crate::mcp::access::Caller,
    ) -> Result<crate::mcp::types::QueryOutputResponse, crate::mcp::service::ServiceError> {
        Err(crate::mcp::service::ServiceError::NotFound("fuzz".into()))
    }
    async fn jobs(
        &self,
        _: crate::mcp::types::JobsRequest,
        _: &crate::mcp::access::Caller,
    ) -> Result<crate::mcp::types::JobsResponse, crate::mcp::service::ServiceError> {
        Err(crate::mcp::service::ServiceError::NotFound("fuzz".into()))
    }
    async fn kill(
        &self,
        _: &str,
        _: &crate::mcp::access::Caller,
    ) -> Result<crate::mcp::types::ExecuteResponse, crate::mcp::service::ServiceError> {
        Err(crate::mcp::service::ServiceError::NotFound("fuzz".into()))
    }
    async fn info(&self, _: Option<&str>) -> Result<crate::mcp::types::Info, crate::mcp::service::ServiceError> {
        Err(crate::mcp::service::ServiceError::Internal("fuzz".into()))
    }
    fn sole_repo(&self) -> Option<String> {
        Some("fuzz".into())
    }
}

fn mcp() -> &'static Mcp {
    static MCP: OnceLock<Mcp> = OnceLock::new();
    MCP.get_or_init(|| {
        let dir = scratch("mcp");
        let root = dir.join("repo");
        std::fs::create_dir_all(&root).unwrap();
        let text = format!("[[repos]]\nid = \"fuzz\"\nroot = \"{}\"\nmemory_files = true\n", root.display());
        let cfg = crate::config::Config::parse(&text, Path::new("/fuzz/confine.toml")).unwrap();
        let store = crate::store::Store::open(&dir.join("db")).unwrap();
        let memory = crate::store::memory::MemoryService::open(&store, &cfg.repos).unwrap();
        let server = crate::mcp::ConfineServer::new(Arc::new(Refuse)).with_memory(Arc::new(memory));
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        Mcp { runtime, server }
    })
}

const HANDSHAKE: &str = concat!(
    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","#,
    r#""capabilities":{},"clientInfo":{"name":"fuzz","version":"0"}}}"#,
    "\n",
    r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    "\n"
);

/// Serve one stdio session whose client sends the handshake and then
/// `input`, then closes: every line the server writes is one JSON-RPC
/// message, and the session ends (no hang) once the client is gone.
fn session(input: &[u8]) -> Vec<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let m = mcp();
    m.runtime.block_on(async {
        let (client, server_io) = tokio::io::duplex(1 << 20);
        let (server_read, server_write) = tokio::io::split(server_io);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let server = m.server.clone();
        let serving = tokio::spawn(async move {
            let ct = tokio_util::sync::CancellationToken::new();
            if let Ok(running) = rmcp::ServiceExt::serve_with_ct(server, (server_read, server_write), ct).await {
                let _ = running.waiting().await;
            }
        });
        let mut bytes = HANDSHAKE.as_bytes().to_vec();
        bytes.extend_from_slice(input);
        let writing = async move {
            let _ = client_write.write_all(&bytes).await;
            let _ = client_write.shutdown().await;
        };
        let mut out = Vec::new();
        let reading = client_read.read_to_end(&mut out);
        let all = async { tokio::join!(writing, reading, serving) };
        if tokio::time::timeout(std::time::Duration::from_secs(30), all).await.is_err() {
            panic!("the session did not end within 30 s of the client closing");
        }
        out.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_slice(l)
                    .unwrap_or_else(|e| panic!("not JSON: {e}: {}", String::from_utf8_lossy(l)));
                assert_eq!(v["jsonrpc"], "2.0", "{v}");
                v
            })
            .collect()
    })
}

/// The stdio transport's framing: any bytes after the handshake.
pub fn mcp_stdio(data: &[u8]) {
    session(data);
}

/// Tool arguments: the first byte picks a tool, the rest is its
/// `arguments`. An object always gets a result, an error among them, never
/// a protocol error: bad arguments are the model's to read and fix.
pub fn mcp_tool_args(data: &[u8]) {
    let Some((&pick, args)) = data.split_first() else { return };
    let tools = mcp().server.tools();
    let name = tools[usize::from(pick) % tools.len()].name.to_string();
    let Ok(args) = serde_json::from_slice::<serde_json::Value>(args) else { return };
    let is_object = args.is_object();
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": name, "arguments": args}});
    let mut line = serde_json::to_vec(&call).unwrap();
    line.push(b'\n');
    let answers = session(&line);
    let answer = answers.iter().find(|v| v["id"] == 1).unwrap_or_else(|| panic!("no answer to the call: {answers:?}"));
    if is_object {
        assert!(answer.get("result").is_some(), "{name}: a protocol error for object arguments: {answer}");
    }
}

#[cfg(test)]
mod tests {
    use super::TARGETS;

    /// Every input the fuzzers found a fault with, and every seed: each
    /// target replays its directory under `fuzz/regressions/` and
    /// `fuzz/seeds/`.
    #[test]
    fn every_regression_and_seed_replays_clean() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
        let mut replayed = 0;
        for (name, target) in TARGETS {
            for kind in ["regressions", "seeds"] {
                let Ok(dir) = std::fs::read_dir(root.join(kind).join(name)) else { continue };
                for entry in dir {
                    let path = entry.unwrap().path();
                    let data = std::fs::read(&path).unwrap();
                    eprintln!("{name}: {}", path.display());
                    target(&data);
                    replayed += 1;
                }
            }
        }
        let _ = std::fs::remove_dir_all(super::scratch_root());
        assert!(replayed >= TARGETS.len(), "only {replayed} inputs under fuzz/");
    }
}
