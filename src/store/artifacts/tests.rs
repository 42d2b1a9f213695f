use super::chunks::ChunkEncoder;
use super::*;

fn open(dir: &std::path::Path) -> Artifacts {
    // sled's flusher thread lets go of the directory lock shortly after the
    // last handle drops; a reopen in the same test waits for it.
    for _ in 0..100 {
        if let Ok(s) = Store::open(dir) {
            return Artifacts::open(&s).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Artifacts::open(&Store::open(dir).unwrap()).unwrap()
}

/// Store `chunks` in stdout of a new artifact and finish it.
fn store(a: &Artifacts, ttl_ms: u64, chunks: &[&[u8]]) -> ArtifactMeta {
    let w = a.begin("repo/x y", ttl_ms).unwrap();
    let mut sink = w.chunk_sink(StreamName::Stdout);
    for c in chunks {
        sink.write_chunk(c).unwrap();
    }
    let StoredStream { chunks, compressed_bytes, blob } = sink.finish().unwrap();
    let stdout = StreamMeta { compressed_bytes, chunks, blob, ..Default::default() };
    w.finish(JobInfo::default(), stdout, StreamMeta::default()).unwrap()
}

fn noise(n: usize, seed: u64) -> Vec<u8> {
    // xorshift: incompressible, so chunks are stored raw at a known size.
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn handle_has_the_documented_shape() {
    let h = new_handle("my repo/ü", 1774356909696);
    let parts: Vec<&str> = h.splitn(3, '-').collect();
    assert_eq!(parts[0], "run");
    assert!(h.starts_with("run-my_repo__-1774356909696-"), "{h}");
    assert_eq!(h.rsplit('-').next().unwrap().len(), 16);
    assert!(new_handle("", 1).starts_with("run-local-1-"));
    assert_ne!(new_handle("a", 1), new_handle("a", 1));
}

#[test]
fn chunks_round_trip_gzip_and_raw() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let text = b"hello world\n".repeat(10_000);
    let rand = noise(200_000, 7);
    let meta = store(&a, DEFAULT_TTL_MS, &[&text, &rand]);
    let c = &meta.stdout.chunks;
    assert_eq!(c[0].encoding, Encoding::Gzip);
    assert!(c[0].stored_len < c[0].raw_len / 10);
    assert_eq!(c[1].encoding, Encoding::Raw);
    assert_eq!((c[0].first_line, c[0].newlines, c[1].first_line), (0, 10_000, 10_000));
    let mut out = Vec::new();
    a.copy_stream(&a.get(&meta.handle).unwrap(), StreamName::Stdout, &mut out).unwrap();
    assert_eq!(out, [&text[..], &rand[..]].concat());
}

#[test]
fn unknown_and_expired_handles_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let err = a.get("run-nope-1-00").unwrap_err();
    assert_eq!(err.to_string(), "artifact 'run-nope-1-00' not found (expired or never stored)");
    let m = store(&a, 0, &[b"x\n"]);
    assert!(matches!(a.get(&m.handle), Err(ArtifactError::NotFound(_))));
}

#[test]
fn gc_removes_expired_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let old = store(&a, 0, &[b"old\n"]);
    let live = store(&a, DEFAULT_TTL_MS, &[b"live\n"]);
    let r = a.gc(DEFAULT_MAX_TOTAL_BYTES).unwrap();
    assert_eq!((r.expired, r.evicted, r.kept), (1, 0, 1));
    assert!(a.list().unwrap().iter().all(|m| m.handle != old.handle));
    assert!(a.backend.get_chunk(&old.handle, StreamName::Stdout, 0).unwrap().is_none());
    a.get(&live.handle).unwrap();
}

#[test]
fn gc_evicts_oldest_first_to_fit_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let mut metas = Vec::new();
    for i in 0..3 {
        metas.push(store(&a, DEFAULT_TTL_MS, &[&noise(100_000, i + 1)]));
        std::thread::sleep(std::time::Duration::from_millis(3));
    }
    assert_eq!(metas[0].compressed_bytes(), 100_000);
    let r = a.gc(250_000).unwrap();
    assert_eq!((r.evicted, r.kept, r.kept_bytes, r.freed_bytes), (1, 2, 200_000, 100_000));
    assert!(a.get(&metas[0].handle).is_err());
    a.get(&metas[1].handle).unwrap();
    a.get(&metas[2].handle).unwrap();
}

#[test]
fn gc_spares_artifacts_being_written() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let w = a.begin("r", DEFAULT_TTL_MS).unwrap();
    w.chunk_sink(StreamName::Stdout).write_chunk(b"partial\n").unwrap();
    assert_eq!(a.gc(0).unwrap().incomplete, 0);
    assert!(matches!(a.get(w.handle()), Err(ArtifactError::Incomplete(_))));
    drop(w);
    assert_eq!(a.gc(0).unwrap().incomplete, 1);
}

#[test]
fn gc_during_writes_removes_nothing_that_is_finished_meanwhile() {
    // GC runs while jobs write: a writer that finishes between GC's listing
    // and its removals, and one that starts and finishes meanwhile, survive.
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let listed = std::cell::RefCell::new(Some(a.begin("r", DEFAULT_TTL_MS).unwrap()));
    let listed_handle = listed.borrow().as_ref().unwrap().handle().to_string();
    let later = std::cell::RefCell::new(None::<String>);
    let is_active = |h: &str| {
        if let Some(w) = listed.borrow_mut().take() {
            let meta = store(&a, DEFAULT_TTL_MS, &[b"started after the listing\n"]);
            *later.borrow_mut() = Some(meta.handle);
            w.finish(JobInfo::default(), StreamMeta::default(), StreamMeta::default()).unwrap();
            return false;
        }
        active_set().contains(h)
    };
    let r = gc::run(a.backend.as_ref(), DEFAULT_MAX_TOTAL_BYTES, now_ms(), &is_active).unwrap();
    assert_eq!((r.incomplete, r.orphans), (0, 0), "{r:?}");
    a.get(&listed_handle).unwrap();
    a.get(later.borrow().as_deref().unwrap()).unwrap();
}

#[test]
fn partial_artifact_after_a_crash_is_incomplete_then_collected() {
    let dir = tempfile::tempdir().unwrap();
    let (partial, orphan);
    {
        let a = open(dir.path());
        let w = a.begin("r", DEFAULT_TTL_MS).unwrap();
        w.chunk_sink(StreamName::Stdout).write_chunk(b"half of the out").unwrap();
        partial = w.handle().to_string();
        // A writer that never got to its metadata: chunks only.
        orphan = "run-r-1-deadbeef".to_string();
        a.backend.put_chunk(&orphan, StreamName::Stderr, 0, b"x").unwrap();
        a.backend.flush().unwrap();
        // The process dies here: no finish. (Drop only leaves the set of
        // handles being written, which a dead process has left too.)
        drop(w);
    }
    let a = open(dir.path());
    let err = a.get(&partial).unwrap_err();
    assert!(matches!(err, ArtifactError::Incomplete(_)), "{err}");
    assert!(matches!(a.get(&orphan), Err(ArtifactError::NotFound(_))));
    let listed = a.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].complete);
    let r = a.gc(DEFAULT_MAX_TOTAL_BYTES).unwrap();
    assert_eq!((r.incomplete, r.orphans), (1, 1));
    assert!(a.backend.chunk_handles().unwrap().is_empty());
    assert!(a.list().unwrap().is_empty());
}

#[test]
fn a_missing_chunk_is_reported_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let m = store(&a, DEFAULT_TTL_MS, &[b"a\n", b"b\n"]);
    let mut meta = m.clone();
    meta.stdout.chunks[1].raw_len = 99;
    let err = a.copy_stream(&meta, StreamName::Stdout, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("damaged"), "{err}");
    a.backend.remove(&m.handle).unwrap();
    let err = a.copy_stream(&m, StreamName::Stdout, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("chunk 0 is missing"), "{err}");
}

#[test]
fn remove_reports_whether_it_existed() {
    let dir = tempfile::tempdir().unwrap();
    let a = open(dir.path());
    let m = store(&a, DEFAULT_TTL_MS, &[b"a\n"]);
    assert!(a.remove(&m.handle).unwrap());
    assert!(!a.remove(&m.handle).unwrap());
    assert!(a.backend.chunk_handles().unwrap().is_empty());
}

#[test]
fn chunks_too_short_to_shrink_are_raw_and_make_no_deflate_state() {
    let mut enc = ChunkEncoder::new();
    for raw in [&b""[..], b"ok\n", &[b'a'; 20]] {
        assert_eq!(enc.encode(raw), Encoding::Raw, "{raw:?}");
    }
    assert!(!enc.has_deflate_state());
    // Past the smallest gzip member, a run of one letter shrinks.
    assert_eq!(enc.encode(&[b'a'; 64]), Encoding::Gzip);
    assert!(enc.has_deflate_state());
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&enc.out[..]).read_to_end(&mut back).unwrap();
    assert_eq!(back, [b'a'; 64]);
}

#[test]
fn gzip_chunks_are_plain_gzip_members() {
    let raw = b"a gzip member that any gunzip reads\n".repeat(3000);
    let mut enc = ChunkEncoder::new();
    assert_eq!(enc.encode(&raw), Encoding::Gzip);
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&enc.out[..]).read_to_end(&mut back).unwrap();
    assert_eq!(back, raw);
    // The reused deflate state starts clean for the next chunk.
    assert_eq!(enc.encode(b"second chunk, short\n"), Encoding::Raw);
    let small = b"x".repeat(100_000);
    assert_eq!(enc.encode(&small), Encoding::Gzip);
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&enc.out[..]).read_to_end(&mut back).unwrap();
    assert_eq!(back, small);
    // The system's gzip agrees, when there is one.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.gz");
    std::fs::write(&f, &enc.out).unwrap();
    if let Ok(out) = std::process::Command::new("gzip").arg("-dc").arg(&f).output() {
        assert!(out.status.success());
        assert_eq!(out.stdout, small);
    }
}
