//! Lines of a stored artifact, read one chunk at a time through the
//! per-chunk line index (`firstLine`, `newlines`), so a line range touches
//! only its chunks and a long line's middle chunks are skipped undecoded.
//!
//! A term search decodes the chunks on all cores (each chunk is its own
//! gzip member), lowercases them in place, and finds every term in one
//! SIMD pass (Teddy). Memory stays at one chunk per worker plus the
//! matching line numbers of the windows kept.

use super::lines::{Line, LineSource, MatchCollector, Matches, Terms, LINE_VIEW_BYTES};
use super::OutputError;
use crate::store::artifacts::{ArtifactMeta, Artifacts, ChunkInfo, StreamMeta, StreamName};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One stream of a stored artifact, as lines.
pub struct ArtifactLines<'a> {
    artifacts: &'a Artifacts,
    meta: &'a ArtifactMeta,
    stream: StreamName,
    /// The last chunk a line read decoded: excerpt windows close together
    /// decode it once.
    cache: Mutex<Option<(usize, Vec<u8>)>>,
}

impl<'a> ArtifactLines<'a> {
    pub fn new(artifacts: &'a Artifacts, meta: &'a ArtifactMeta, stream: StreamName) -> Self {
        ArtifactLines { artifacts, meta, stream, cache: Mutex::new(None) }
    }

    fn read_cached(&self, index: usize, buf: &mut Vec<u8>) -> Result<(), OutputError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.as_ref() {
            Some((i, b)) if *i == index => {
                buf.clear();
                buf.extend_from_slice(b);
            }
            _ => {
                self.read(index, buf)?;
                *cache = Some((index, buf.clone()));
            }
        }
        Ok(())
    }

    fn chunks(&self) -> &'a [ChunkInfo] {
        &self.meta.stream(self.stream).chunks
    }

    fn read(&self, index: usize, buf: &mut Vec<u8>) -> Result<(), OutputError> {
        Ok(self.artifacts.read_chunk(self.meta, self.stream, index, buf)?)
    }

    /// Call `f` for each line from `first` on, until it returns false.
    fn walk(&self, first: u64, f: &mut dyn FnMut(&Line) -> bool) -> Result<(), OutputError> {
        let chunks = self.chunks();
        if chunks.is_empty() || first == 0 || first > self.total_lines() {
            return Ok(());
        }
        let mut ci = locate(chunks, first - 1);
        let mut buf = Vec::new();
        self.read_cached(ci, &mut buf)?;
        let skip = (first - 1 - chunks[ci].first_line) as usize;
        let mut pos =
            if skip == 0 { 0 } else { memchr::memchr_iter(b'\n', &buf).nth(skip - 1).map_or(buf.len(), |i| i + 1) };
        let mut line = Line { no: first, text: Vec::new(), cut: false };
        let append = |line: &mut Line, part: &[u8]| {
            let room = LINE_VIEW_BYTES - line.text.len();
            line.cut |= part.len() > room;
            line.text.extend_from_slice(&part[..part.len().min(room)]);
        };
        loop {
            match memchr::memchr(b'\n', &buf[pos..]) {
                Some(i) => {
                    append(&mut line, &buf[pos..pos + i]);
                    if !f(&line) {
                        return Ok(());
                    }
                    line.no += 1;
                    line.text.clear();
                    line.cut = false;
                    pos += i + 1;
                }
                None => {
                    append(&mut line, &buf[pos..]);
                    ci += 1;
                    // The middle of a long line: skip what can't be shown.
                    while ci < chunks.len() && chunks[ci].newlines == 0 && line.cut {
                        ci += 1;
                    }
                    if ci == chunks.len() {
                        if !line.text.is_empty() || line.cut {
                            line.cut |= self.meta.stream(self.stream).truncated;
                            f(&line);
                        }
                        return Ok(());
                    }
                    self.read_cached(ci, &mut buf)?;
                    pos = 0;
                    // At a line's start, the chunk's own number wins: after
                    // a dropped middle, the tail's lines keep theirs.
                    if line.text.is_empty() && !line.cut {
                        line.no = line.no.max(chunks[ci].first_line + 1);
                    }
                }
            }
        }
    }
}

/// The chunk in which 0-based line `l0` starts.
fn locate(chunks: &[ChunkInfo], l0: u64) -> usize {
    let mut c = chunks.partition_point(|ch| ch.first_line <= l0).saturating_sub(1);
    while c > 0 && chunks[c].first_line == l0 && !chunks[c - 1].ends_with_newline {
        c -= 1;
    }
    c
}

/// What one worker found in one chunk.
struct ChunkHits {
    index: usize,
    matches: Matches,
    first: Option<u64>,
    last: Option<u64>,
    /// Lowercased start and end of the chunk, for terms cut by a chunk
    /// boundary inside a long line.
    head: Vec<u8>,
    tail: Vec<u8>,
}

fn scan_chunk(buf: &[u8], info: &ChunkInfo, terms: &Terms, lo: u64, hi: u64, ctx: u64, max: usize) -> ChunkHits {
    let mut c = MatchCollector::new(ctx, max);
    let (mut first, mut last) = (None, None);
    let (mut at, mut line) = (0usize, info.first_line);
    let mut from = 0;
    while let Some(hit) = terms.find_any(buf, from) {
        line += memchr::memchr_iter(b'\n', &buf[at..hit]).count() as u64;
        at = hit;
        if line > hi {
            break;
        }
        if line >= lo {
            c.push(line + 1);
            first = first.or(Some(line + 1));
            last = Some(line + 1);
        }
        // One hit a line is enough: go on at the next line.
        match memchr::memchr(b'\n', &buf[hit..]) {
            Some(i) => from = hit + i + 1,
            None => break,
        }
    }
    let edge = terms.max_len().saturating_sub(1).min(buf.len());
    ChunkHits {
        index: 0,
        matches: c.finish(),
        first,
        last,
        head: buf[..edge].to_vec(),
        tail: buf[buf.len() - edge..].to_vec(),
    }
}

impl LineSource for ArtifactLines<'_> {
    fn stream(&self) -> StreamName {
        self.stream
    }
    fn meta(&self) -> &StreamMeta {
        self.meta.stream(self.stream)
    }
    // The lines that can be read back are the stored ones, not the total
    // seen; after a dropped middle they keep their numbers in the whole.
    fn total_lines(&self) -> u64 {
        self.meta().last_line()
    }
    fn complete(&self) -> bool {
        true
    }
    fn lines(&self, first: u64, last: u64) -> Result<Vec<Line>, OutputError> {
        let mut out = Vec::new();
        if first <= last {
            self.walk(first.max(1), &mut |l| {
                // After a dropped middle, the next line may be past `last`.
                if l.no > last {
                    return false;
                }
                out.push(l.clone());
                l.no < last
            })?;
        }
        Ok(out)
    }
    fn scan(&self, f: &mut dyn FnMut(&Line) -> bool) -> Result<(), OutputError> {
        self.walk(1, f)
    }
    fn find(&self, terms: &Terms, first: u64, last: u64, ctx: u64, max_windows: usize) -> Result<Matches, OutputError> {
        let chunks = self.chunks();
        let last = last.min(self.total_lines());
        if terms.is_empty() || chunks.is_empty() || first == 0 || first > last {
            return Ok(Matches::default());
        }
        let (lo, hi) = (first - 1, last - 1);
        let (c0, c1) = (locate(chunks, lo), chunks.partition_point(|ch| ch.first_line <= hi) - 1);
        let next = AtomicUsize::new(c0);
        let found: Mutex<Vec<ChunkHits>> = Mutex::new(Vec::new());
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8).min(c1 - c0 + 1);
        let scan = || -> Result<(), OutputError> {
            let mut buf = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index > c1 {
                    return Ok(());
                }
                self.read(index, &mut buf)?;
                buf.make_ascii_lowercase();
                let hits = ChunkHits { index, ..scan_chunk(&buf, &chunks[index], terms, lo, hi, ctx, max_windows) };
                found.lock().unwrap_or_else(|p| p.into_inner()).push(hits);
            }
        };
        std::thread::scope(|s| {
            let handles: Vec<_> = (1..workers).map(|_| s.spawn(scan)).collect();
            let mine = scan();
            handles.into_iter().map(|h| h.join().unwrap_or(Ok(()))).chain([mine]).collect::<Result<(), _>>()
        })?;
        let mut found = found.into_inner().unwrap_or_else(|p| p.into_inner());
        found.sort_by_key(|h| h.index);
        Ok(merge(&found, chunks, terms, lo, hi, ctx, max_windows))
    }
}

/// Join the chunks' findings in order, with the hits that straddle a chunk
/// boundary (only possible inside a line longer than a chunk).
fn merge(found: &[ChunkHits], chunks: &[ChunkInfo], terms: &Terms, lo: u64, hi: u64, ctx: u64, max: usize) -> Matches {
    let mut c = MatchCollector::new(ctx, max);
    let mut total = 0u64;
    let mut prev_last: Option<u64> = None;
    let mut segment = |c: &mut MatchCollector, m: &Matches, first: Option<u64>, last: Option<u64>| {
        for &l in &m.lines {
            c.push(l);
        }
        total += m.total;
        if first.is_some() && first == prev_last {
            total -= 1;
        }
        prev_last = last.or(prev_last);
    };
    for (i, h) in found.iter().enumerate() {
        segment(&mut c, &h.matches, h.first, h.last);
        if h.matches.more {
            // This chunk alone has more windows than asked for, so the
            // first ones are all known: later chunks only count.
            c.mark_more();
        }
        let Some(next) = found.get(i + 1) else { continue };
        if chunks[h.index].ends_with_newline || next.index != h.index + 1 {
            continue;
        }
        let seam = [&h.tail[..], &next.head[..]].concat();
        let line = chunks[h.index].first_line + u64::from(chunks[h.index].newlines);
        let crosses = terms.find_any(&seam, 0).is_some_and(|at| at < h.tail.len());
        if crosses && (lo..=hi).contains(&line) {
            let m = Matches { lines: vec![line + 1], total: 1, more: false };
            segment(&mut c, &m, Some(line + 1), Some(line + 1));
        }
    }
    let mut m = c.finish();
    m.total = total;
    m
}

#[cfg(test)]
mod tests;
