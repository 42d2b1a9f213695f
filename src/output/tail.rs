//! The tail of a stream past its head: a ring of the last bytes, in a
//! scratch file of the store (page cache, not the supervisor's memory). At
//! the end of the stream it is read back in order, to be stored after the
//! head and a marker line.

use crate::store::artifacts::Scratch;

pub(crate) struct TailRing {
    cap: u64,
    /// Bytes pushed in all.
    pushed: u64,
    /// Newlines pushed in all.
    pub(crate) newlines: u64,
    file: Scratch,
}

/// Bytes read back at a time.
const PIECE: usize = 1 << 20;

impl TailRing {
    pub(crate) fn new(cap: u64, file: Scratch) -> TailRing {
        TailRing { cap: cap.max(1), pushed: 0, newlines: 0, file }
    }

    /// Keep `bytes` as the newest; what falls out of the ring is dropped.
    pub(crate) fn push(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        self.newlines += memchr::memchr_iter(b'\n', bytes).count() as u64;
        self.pushed += bytes.len() as u64;
        if bytes.len() as u64 > self.cap {
            // Only the last `cap` bytes can stay: write them where they
            // would have landed.
            bytes = &bytes[bytes.len() - self.cap as usize..];
        }
        let mut at = (self.pushed - bytes.len() as u64) % self.cap;
        while !bytes.is_empty() {
            let n = bytes.len().min((self.cap - at) as usize);
            self.file.write_at(&bytes[..n], at)?;
            bytes = &bytes[n..];
            at = (at + n as u64) % self.cap;
        }
        Ok(())
    }

    /// Bytes pushed that the ring no longer holds.
    pub(crate) fn overwritten(&self) -> u64 {
        self.pushed.saturating_sub(self.cap)
    }

    /// The bytes held, oldest first, in pieces.
    pub(crate) fn read_in_order(&self, f: &mut dyn FnMut(&[u8])) -> std::io::Result<()> {
        let held = self.pushed.min(self.cap);
        let start = if self.pushed > self.cap { self.pushed % self.cap } else { 0 };
        let mut buf = vec![0u8; PIECE.min(held as usize)];
        let mut done = 0u64;
        while done < held {
            let at = (start + done) % self.cap;
            let n = (held - done).min(self.cap - at).min(PIECE as u64) as usize;
            self.file.read_at(&mut buf[..n], at)?;
            f(&buf[..n]);
            done += n as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(r: &TailRing) -> Vec<u8> {
        let mut out = Vec::new();
        r.read_in_order(&mut |b| out.extend_from_slice(b)).unwrap();
        out
    }

    #[test]
    fn the_ring_keeps_the_last_bytes_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for cap in [1u64, 7, 4096, 9_999, 10_000, 20_000] {
            for step in [1usize, 3, 1000, 10_000] {
                let mut r = TailRing::new(cap, store.blobs().scratch().unwrap());
                for piece in data.chunks(step) {
                    r.push(piece).unwrap();
                }
                let keep = (cap as usize).min(data.len());
                assert_eq!(held(&r), data[data.len() - keep..], "cap {cap}, step {step}");
                assert_eq!(r.overwritten(), (data.len() as u64).saturating_sub(cap));
            }
        }
    }

    #[test]
    fn a_ring_larger_than_a_piece_wraps_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path()).unwrap();
        let mut r = TailRing::new(3 << 20, store.blobs().scratch().unwrap());
        let data: Vec<u8> = (0..8_000_000u32).map(|i| (i * 7 % 253) as u8).collect();
        for piece in data.chunks(131_072) {
            r.push(piece).unwrap();
        }
        assert_eq!(held(&r), data[data.len() - (3 << 20)..]);
        assert!(store.blobs().list().unwrap().0.is_empty() && store.blobs().list().unwrap().1.is_empty());
    }
}
