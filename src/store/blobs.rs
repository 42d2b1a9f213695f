//! Blobs: the bytes of artifacts' larger streams, one file per stream in
//! the store's `blobs/` directory, named by a SHA-256 of its content.
//!
//! A blob is written under a temporary name (`tmp.<tag>`), synced, renamed
//! to its name, and the directory synced: a crash leaves a temporary file
//! (which garbage collection removes) or the whole blob, never a
//! half-written one under a blob's name. Blob names are made here, from
//! hashes, and files are opened without following links; nothing a job
//! writes can choose a name.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const TMP_PREFIX: &str = "tmp.";

/// The `blobs/` directory of a store.
#[derive(Clone)]
pub struct Blobs {
    inner: Arc<BlobsInner>,
}

struct BlobsInner {
    dir: PathBuf,
    /// The directory, opened once, synced after each rename and removal.
    dir_file: Option<File>,
    /// Blobs written by this process whose metadata is not yet written:
    /// garbage collection must not take them for orphans.
    pinned: Mutex<Pins>,
    /// Bytes a writer leaves free on the file system (0: none).
    min_free: std::sync::atomic::AtomicU64,
}

/// The pinned blobs. While a collection runs, pins are not let go (only
/// marked), so that a blob pinned at any moment of it counts as pinned
/// when the collection decides: a writer may name its blob in metadata
/// after the collection listed the metadata, and let go of the pin before
/// the collection looks at the blob.
#[derive(Default)]
struct Pins {
    count: std::collections::BTreeMap<String, usize>,
    /// Collections running, by number (numbers only grow).
    running: std::collections::BTreeSet<u64>,
    next_collection: u64,
    /// Pins let go while collections ran: each is held until every
    /// collection running when it was let go (numbers up to the one
    /// kept with it) has ended.
    released: Vec<(String, u64)>,
}

/// A name made by [`BlobWriter::commit`]: 64 lowercase hex digits.
pub fn is_blob_name(name: &str) -> bool {
    name.len() == 64 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn open_options(write: bool) -> std::fs::OpenOptions {
    let mut o = std::fs::OpenOptions::new();
    if write {
        o.write(true).create_new(true);
    } else {
        o.read(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
    }
    o
}

/// Write `bytes` to `dir/name` durably: a temporary file, synced, renamed
/// over the name, and the directory synced.
pub(crate) fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let mut f = open_options(true).open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    if let Some(d) = super::open_dir(dir)? {
        d.sync_all()?;
    }
    Ok(())
}

impl Blobs {
    pub(crate) fn open(dir: &Path) -> std::io::Result<Blobs> {
        #[cfg_attr(not(unix), allow(unused_mut))]
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(dir) {
            Ok(()) => {
                if let Some(parent) = dir.parent().map(super::open_dir).transpose()?.flatten() {
                    parent.sync_all()?;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        if !std::fs::symlink_metadata(dir)?.is_dir() {
            return Err(std::io::Error::other(format!("{} is not a directory", dir.display())));
        }
        Ok(Blobs {
            inner: Arc::new(BlobsInner {
                dir: dir.to_path_buf(),
                dir_file: super::open_dir(dir)?,
                pinned: Mutex::new(Default::default()),
                min_free: Default::default(),
            }),
        })
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        match &self.inner.dir_file {
            Some(d) => d.sync_all(),
            None => Ok(()),
        }
    }

    fn pinned(&self) -> std::sync::MutexGuard<'_, Pins> {
        self.inner.pinned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start a collection: from now until the returned guard is dropped,
    /// every blob pinned stays pinned. Take it before listing metadata.
    pub fn collection(&self) -> Collection {
        let mut pins = self.pinned();
        let id = pins.next_collection;
        pins.next_collection += 1;
        pins.running.insert(id);
        Collection { blobs: self.clone(), id }
    }

    /// Start a blob. `tag` names the temporary file (a handle and a
    /// stream), so garbage collection can tell whose it is.
    /// Leave `bytes` free: an append past it fails (see [`BlobWriter::append`]).
    pub(crate) fn set_min_free(&self, bytes: u64) {
        self.inner.min_free.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    fn min_free(&self) -> u64 {
        self.inner.min_free.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn writer(&self, tag: &str) -> std::io::Result<BlobWriter> {
        let tmp = format!("{TMP_PREFIX}{tag}");
        let path = self.inner.dir.join(&tmp);
        // A leftover of a crashed writer of the same tag.
        let _ = std::fs::remove_file(&path);
        let file = open_options(true).open(&path)?;
        Ok(BlobWriter { blobs: self.clone(), file, tmp, hasher: Sha256::new(), len: 0 })
    }

    /// A file for scratch data of a writer (a stream's tail ring), in the
    /// store's file system but never under a name: on Linux an
    /// `O_TMPFILE`, elsewhere a file removed as soon as it is open. A
    /// crash leaves nothing behind.
    pub fn scratch(&self) -> std::io::Result<Scratch> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
                .open(&self.inner.dir);
            if let Ok(f) = f {
                return Ok(Scratch::new(f, self.min_free()));
            }
        }
        #[cfg(unix)]
        {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let path = self.inner.dir.join(format!(".scratch.{}.{n}", std::process::id()));
            let f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path);
            let _ = std::fs::remove_file(&path);
            return f.map(|f| Scratch::new(f, self.min_free()));
        }
        #[allow(unreachable_code)]
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "no scratch files on this platform"))
    }

    /// `len` bytes at `offset` of blob `name`. A missing blob or a short
    /// one is an error; the caller checks the bytes against their hash.
    pub fn read_at(&self, name: &str, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut f = self.open_blob(name)?;
        f.seek(SeekFrom::Start(offset))?;
        let mut out = vec![0u8; len];
        f.read_exact(&mut out)?;
        Ok(out)
    }

    fn open_blob(&self, name: &str) -> std::io::Result<File> {
        if !is_blob_name(name) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("'{name}' is not a blob name")));
        }
        let f = open_options(false).open(self.inner.dir.join(name))?;
        if !f.metadata()?.is_file() {
            return Err(std::io::Error::other(format!("blob {name} is not a regular file")));
        }
        Ok(f)
    }

    /// Remove blob `name` unless it is pinned, deciding and removing under
    /// the pins' lock: a writer pins before it renames its file onto the
    /// name, so a blob committed again meanwhile is never removed.
    /// Returns whether it was removed.
    pub fn remove_unpinned(&self, name: &str) -> std::io::Result<bool> {
        let pins = self.pinned();
        if pins.count.contains_key(name) {
            return Ok(false);
        }
        let removed = self.remove(name);
        drop(pins);
        removed.map(|()| true)
    }

    /// Remove blob `name` (no error when it is already gone).
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        if !is_blob_name(name) && !name.starts_with(TMP_PREFIX) {
            return Ok(());
        }
        match std::fs::remove_file(self.inner.dir.join(name)) {
            Ok(()) => self.sync_dir(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Every file of the directory: blobs, and the tags of temporary files.
    pub fn list(&self) -> std::io::Result<(Vec<String>, Vec<String>)> {
        let (mut blobs, mut tmps) = (Vec::new(), Vec::new());
        for entry in std::fs::read_dir(&self.inner.dir)? {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if is_blob_name(&name) {
                blobs.push(name);
            } else if let Some(tag) = name.strip_prefix(TMP_PREFIX) {
                tmps.push(tag.to_string());
            }
        }
        Ok((blobs, tmps))
    }

    /// Remove temporary file `tag` (a writer's leftover).
    pub fn remove_tmp(&self, tag: &str) -> std::io::Result<()> {
        self.remove(&format!("{TMP_PREFIX}{tag}"))
    }

    /// Bytes the blobs take.
    pub fn bytes_on_disk(&self) -> u64 {
        std::fs::read_dir(&self.inner.dir)
            .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    }

    /// The path of blob `name` (tests damage blobs through it).
    #[doc(hidden)]
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.inner.dir.join(name)
    }
}

/// A scratch file ([`Blobs::scratch`]): read and written at offsets.
/// Refuse to write `more` bytes to `file` when that would leave less than
/// `keep` bytes free on its file system (`keep` 0: never refused): the
/// rest is for the records that say what happened.
fn leave_free(file: &File, keep: u64, more: u64) -> std::io::Result<()> {
    match super::free_bytes(file) {
        Some(free) if keep > 0 && free < keep.saturating_add(more) => Err(std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!(
                "the store's disk is nearly full ({free} bytes free; half of store.min_free_bytes, {keep}, \
                 stays free for records): the rest of the output was not stored"
            ),
        )),
        _ => Ok(()),
    }
}

pub struct Scratch {
    file: File,
    /// As [`BlobsInner::min_free`], when it was made.
    keep: u64,
    /// The file's size: writes below it take no more room.
    size: std::sync::atomic::AtomicU64,
}

impl Scratch {
    // Scratch files exist on Unix only (see Blobs::scratch).
    #[cfg_attr(not(unix), allow(dead_code))]
    fn new(file: File, keep: u64) -> Scratch {
        Scratch { file, keep, size: std::sync::atomic::AtomicU64::new(0) }
    }

    pub fn write_at(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        let end = offset.saturating_add(bytes.len() as u64);
        let size = self.size.load(std::sync::atomic::Ordering::Relaxed);
        if end > size {
            leave_free(&self.file, self.keep, end - size)?;
            self.size.fetch_max(end, std::sync::atomic::Ordering::Relaxed);
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::write_all_at(&self.file, bytes, offset)
        }
        #[cfg(not(unix))]
        {
            let mut f = &self.file;
            f.seek(SeekFrom::Start(offset))?;
            f.write_all(bytes)
        }
    }

    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            std::os::unix::fs::FileExt::read_exact_at(&self.file, buf, offset)
        }
        #[cfg(not(unix))]
        {
            let mut f = &self.file;
            f.seek(SeekFrom::Start(offset))?;
            f.read_exact(buf)
        }
    }
}

/// A blob being written.
pub struct BlobWriter {
    blobs: Blobs,
    file: File,
    tmp: String,
    hasher: Sha256,
    len: u64,
}

impl BlobWriter {
    /// Append `bytes`; `hash_input` is what the blob's name is made from
    /// (the caller passes the chunks' own hashes, so no byte is hashed
    /// twice).
    pub fn append(&mut self, bytes: &[u8], hash_input: &[u8]) -> std::io::Result<()> {
        leave_free(&self.file, self.blobs.min_free(), bytes.len() as u64)?;
        crate::crashpoint::reached("blob-append");
        self.file.write_all(bytes)?;
        self.hasher.update(hash_input);
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Bytes written so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sync the file, rename it to its name, sync the directory. The blob
    /// stays pinned (safe from garbage collection) until the returned
    /// [`BlobPin`] is dropped: after its metadata is written.
    pub fn commit(mut self) -> std::io::Result<BlobPin> {
        self.file.sync_data()?;
        let name = hex::encode(std::mem::take(&mut self.hasher).finalize());
        *self.blobs.pinned().count.entry(name.clone()).or_insert(0) += 1;
        let pin = BlobPin { blobs: self.blobs.clone(), name };
        let dir = &self.blobs.inner.dir;
        std::fs::rename(dir.join(&self.tmp), dir.join(&pin.name))?;
        self.blobs.sync_dir()?;
        Ok(pin)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // Not committed (an error, a failed capture): the temporary file
        // goes. After a commit the rename already took it.
        let _ = std::fs::remove_file(self.blobs.inner.dir.join(&self.tmp));
    }
}

/// A committed blob that garbage collection leaves alone while this lives.
pub struct BlobPin {
    blobs: Blobs,
    name: String,
}

impl BlobPin {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Debug for BlobPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BlobPin").field(&self.name).finish()
    }
}

impl Drop for BlobPin {
    fn drop(&mut self) {
        let mut pins = self.blobs.pinned();
        match pins.running.last().copied() {
            Some(newest) => pins.released.push((std::mem::take(&mut self.name), newest)),
            None => pins.unpin(&self.name),
        }
    }
}

impl Pins {
    fn unpin(&mut self, name: &str) {
        if let Some(n) = self.count.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                self.count.remove(name);
            }
        }
    }
}

/// A collection of blobs in progress ([`Blobs::collection`]).
pub struct Collection {
    blobs: Blobs,
    id: u64,
}

impl Drop for Collection {
    fn drop(&mut self) {
        let mut pins = self.blobs.pinned();
        pins.running.remove(&self.id);
        let oldest = pins.running.first().copied().unwrap_or(u64::MAX);
        // Every collection a released pin waited for has ended once the
        // oldest still running is newer than all of them.
        let (done, waiting): (Vec<_>, Vec<_>) =
            std::mem::take(&mut pins.released).into_iter().partition(|(_, newest)| *newest < oldest);
        pins.released = waiting;
        for (name, _) in done {
            pins.unpin(&name);
        }
    }
}
