//! The store: one directory that holds
//! - `FORMAT`, the layout's version: a store of another version is refused,
//!   never misread;
//! - `LOCK`, locked (`flock`) by the one process that has the store open,
//!   and holding its pid, so a second one can say who has it;
//! - `sled/`, the sled database: artifacts' metadata, audit, memories and
//!   feedback, each in its own tree;
//! - `blobs/`, the bytes of artifacts' larger streams ([`blobs`]).
//!
//! Callers get typed handles; nobody else opens sled.
//!
//! Durability rule: anything a response refers to (an audit record, an
//! artifact) is made durable by [`Store::flush`] before the response is
//! returned. sled's own flush only starts the writes back
//! (`sync_file_range`): it neither waits for the device's cache nor makes a
//! grown file's size durable. So `flush` is sled's flush, then `fdatasync`
//! of sled's data file, then `fsync` of sled's directory (where sled
//! creates and renames its snapshot files). Blobs are synced, renamed and
//! their directory synced before the metadata that names them is written.
//! What survives what is stated in `docs/storage.md`.

pub mod artifacts;
pub mod audit;
pub mod blobs;
pub mod feedback;
pub mod memory;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The layout this build reads and writes. Bumped whenever an older
/// build's store would be misread.
pub const FORMAT_VERSION: u32 = 2;
const FORMAT_FILE: &str = "FORMAT";
const LOCK_FILE: &str = "LOCK";
const SLED_DIR: &str = "sled";
pub(crate) const BLOBS_DIR: &str = "blobs";

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database could not be opened (sled writes as it opens).
    #[error("store {path}: {source} (check that the directory is writable and its disk not full)")]
    Open { path: PathBuf, source: sled::Error },
    /// The directory or one of its files could not be made or opened.
    #[error("store {path}: {source} (check that the directory is writable)")]
    Io { path: PathBuf, source: std::io::Error },
    /// Another process has the store open.
    #[error("store {path} is in use by {holder}; stop it, or point this command at another store (`store.path` in the config)")]
    Busy { path: PathBuf, holder: String },
    /// The store was written by a build with another layout.
    #[error("store {path} was made by {made_by} (format {found}; this build reads format {FORMAT_VERSION}): move it aside (`mv {path} {path}.old`) and run again, which starts an empty store")]
    Format { path: PathBuf, found: String, made_by: &'static str },
    /// A read or write failed.
    #[error("store: {0}")]
    Db(#[from] sled::Error),
    /// The store's file system has less room than `store.min_free_bytes`
    /// keeps free: what was refused did not run or was not written. The
    /// message leaves the path out (it reaches MCP clients); the log has it.
    #[error(
        "the store's disk is nearly full: {free} bytes free, under the {reserve} bytes confine keeps free there \
         (store.min_free_bytes); free some space on the store's file system (store.path in the configuration, \
         and the server's log, name it), or move the store"
    )]
    Full { path: PathBuf, free: u64, reserve: u64 },
    /// A write or sync of the store failed earlier in this process: sled
    /// refuses every later write until the store is opened again, so no
    /// job starts (it could not be recorded) until confine restarts.
    #[error(
        "the store failed writing earlier ({0}) and takes no more records: nothing runs until confine is \
         restarted (free space on the store's disk first, if it is full)"
    )]
    Failed(String),
    /// Making written data durable failed (`fdatasync`/`fsync`): what was
    /// written may not survive a crash.
    #[error("store: syncing {what} to disk failed: {source} (is the disk full or failing?)")]
    Sync { what: &'static str, source: std::io::Error },
    /// A record could not be (de)serialised.
    #[error("store: corrupt record: {0}")]
    Corrupt(String),
}

/// The tables of small values kept beside the store's records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// The supervisor's own state (the automatic GC's last run).
    Supervisor,
    /// The MCP server's usage snapshots, one per server run.
    Usage,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Supervisor => "supervisor",
            Table::Usage => "usage",
        }
    }
}

/// Where the store lives when the config names no `store.path`:
/// `$XDG_DATA_HOME/confine`, else `~/.local/share/confine`.
pub fn default_path() -> PathBuf {
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(xdg).join("confine");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/tmp"));
    home.join(".local/share/confine")
}

/// The store of a confine installation.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    // Declared first, so it is dropped (and sled closed) before the lock.
    db: sled::Db,
    root: PathBuf,
    /// sled's data file, opened once: `fdatasync` works on the inode.
    data: File,
    /// sled's directory.
    sled_dir: Option<File>,
    blobs: blobs::Blobs,
    /// `fdatasync`s of the data file by [`Store::flush`].
    syncs: AtomicU64,
    /// sled's own blob files (`sled/blobs/`, large page fragments) that
    /// were synced: sled writes them without a sync.
    sled_blobs: std::sync::Mutex<std::collections::BTreeSet<std::ffi::OsString>>,
    /// `store.min_free_bytes`: 0 until the supervisor sets it.
    min_free: AtomicU64,
    /// The first write or sync that failed ([`StoreError::Failed`]).
    failed: std::sync::OnceLock<String>,
    _lock: File,
}

/// Free bytes an append may count on, at most: below this (or below
/// `store.min_free_bytes`, if smaller) no record is appended. sled turns
/// a failed write into an error that every later write returns, until
/// the store is opened again: a record refused here keeps the store
/// writable for when space comes back.
const RECORD_FLOOR: u64 = 2 << 20;

/// Bytes free on `file`'s file system for this process: the blocks root
/// may use too when we are root, else the unprivileged ones. `None` where
/// it can't be known (not Unix, or the call failed): nothing is refused.
pub(crate) fn free_bytes(file: &File) -> Option<u64> {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
        // SAFETY: fstatvfs(2) fills `st` for an fd we hold open; it is
        // read only when the call succeeded.
        let st = unsafe {
            if libc::fstatvfs(file.as_raw_fd(), st.as_mut_ptr()) != 0 {
                return None;
            }
            st.assume_init()
        };
        // SAFETY: geteuid(2) has no preconditions.
        let blocks = if unsafe { libc::geteuid() } == 0 { st.f_bfree } else { st.f_bavail };
        Some((blocks as u64).saturating_mul(st.f_frsize as u64))
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        None
    }
}

/// Let go of what sled retired on this thread. sled frees what a write
/// replaces (among it every 512 KiB log buffer it seals, at each flush and
/// whenever one fills) through crossbeam's epoch collector, which keeps it
/// in the retiring thread's own bag until 64 retirements pile up there. A
/// thread that writes now and then (a read can write too: sled splits a
/// full node on the way) holds its last log buffers for as long as it
/// lives, and a server has many such threads. Handing the bag to the
/// collector frees them as soon as no other thread can see them.
///
/// Call it on a thread that used the store and may now idle: after a flush
/// ([`Store::flush`] does), at the end of a blocking task ([`releasing`]).
pub fn release_garbage() {
    crossbeam_epoch::pin().flush();
}

/// At most this many rounds of [`collect_garbage`]. In crossbeam-epoch
/// 0.9 a round advances the epoch by at most one (the collecting thread is
/// pinned in the old one) and frees at most a few of the oldest bags
/// handed over (`COLLECT_STEPS`, private to the crate); a bag is freed
/// once the epoch is two past its own.
const MAX_COLLECT_ROUNDS: usize = 64;

/// Free what threads handed to the collector and no thread can still see.
/// The collector frees handed-over bags only a few at a time, when some
/// thread pins often enough (every 128th pin) or flushes; an idle server
/// does neither, so what the last jobs retired (sealed 512 KiB log
/// buffers, pages sled evicted from its cache) stayed allocated until the
/// next burst, and an idle server's RSS moved with it from one idle spell
/// to the next (docs/reliability.md). Run it when the server goes idle,
/// before the allocator's trim.
///
/// It hands over a marker of its own behind what is already queued and
/// collects until the marker is freed: the queue is first in, first out,
/// so everything before it was freed too. Returns whether that happened
/// within [`MAX_COLLECT_ROUNDS`]; a thread pinned in an older epoch all
/// that time (a long store operation) holds the collector back.
pub fn collect_garbage() -> bool {
    collect_with(crossbeam_epoch::pin)
}

/// [`collect_garbage`] through `pin` (a test's own collector).
fn collect_with(pin: impl Fn() -> crossbeam_epoch::Guard) -> bool {
    use std::sync::atomic::AtomicBool;
    let freed = Arc::new(AtomicBool::new(false));
    {
        let guard = pin();
        let marker = freed.clone();
        guard.defer(move || marker.store(true, Ordering::SeqCst));
        guard.flush();
    }
    for _ in 0..MAX_COLLECT_ROUNDS {
        if freed.load(Ordering::SeqCst) {
            return true;
        }
        pin().flush();
    }
    freed.load(Ordering::SeqCst)
}

/// `f`, then [`release_garbage`]: for a blocking task that uses the store.
pub fn releasing<T>(f: impl FnOnce() -> T) -> T {
    let out = f();
    release_garbage();
    out
}

impl Store {
    /// Open (or create) the store at `path`. sled's flusher thread writes
    /// what was written every 500 ms, whether or not anyone flushed it.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, Some(500), None)
    }

    /// Open (or create) the store at `path` for a process that flushes
    /// everything it writes before it exits (`confine exec`): no flusher
    /// thread, which would start while the job's sandbox is built.
    pub fn open_flushed_by_caller(path: &Path) -> Result<Store, StoreError> {
        Store::open_with(path, None, None)
    }

    /// As [`Store::open_flushed_by_caller`], under a lock the caller took
    /// already ([`StoreLock::take`]).
    pub fn open_locked_flushed_by_caller(path: &Path, lock: StoreLock) -> Result<Store, StoreError> {
        Store::open_with(path, None, Some(lock))
    }

    fn open_with(path: &Path, flush_every_ms: Option<u64>, lock: Option<StoreLock>) -> Result<Store, StoreError> {
        let io = |source| StoreError::Io { path: path.to_path_buf(), source };
        let lock = match lock {
            Some(l) => l.0,
            None => StoreLock::take(path)?.0,
        };
        check_format(path)?;
        let sled_path = path.join(SLED_DIR);
        let db = open_sled(&sled_path, flush_every_ms)
            .map_err(|source| StoreError::Open { path: path.to_path_buf(), source })?;
        let data = File::open(sled_path.join("db")).map_err(io)?;
        let sled_dir = open_dir(&sled_path).map_err(io)?;
        let blobs = blobs::Blobs::open(&path.join(BLOBS_DIR)).map_err(io)?;
        Ok(Store {
            inner: Arc::new(Inner {
                db,
                root: path.to_path_buf(),
                data,
                sled_dir,
                blobs,
                syncs: AtomicU64::new(0),
                sled_blobs: Default::default(),
                min_free: AtomicU64::new(0),
                failed: std::sync::OnceLock::new(),
                _lock: lock,
            }),
        })
    }

    /// Keep `bytes` free on the store's file system (`store.min_free_bytes`;
    /// 0: no reserve): [`Store::check_room`] refuses below it, a blob stops
    /// growing below half of it, and records stop below [`RECORD_FLOOR`].
    pub fn set_min_free(&self, bytes: u64) {
        self.inner.min_free.store(bytes, Ordering::Relaxed);
        self.inner.blobs.set_min_free(bytes / 2);
    }

    /// Whether a job may start: the store has not failed, and the file
    /// system has `store.min_free_bytes` free, so that its output and its
    /// record fit.
    pub fn check_room(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        self.check_free(self.inner.min_free.load(Ordering::Relaxed))
    }

    /// Whether anything may be written to sled (see [`RECORD_FLOOR`]):
    /// every write of the store's modules asks first, since one write
    /// that meets a full disk fails the store until it is reopened.
    pub fn check_room_for_records(&self) -> Result<(), StoreError> {
        self.check_failed()?;
        self.check_free(self.inner.min_free.load(Ordering::Relaxed).min(RECORD_FLOOR))
    }

    fn check_failed(&self) -> Result<(), StoreError> {
        match self.inner.failed.get() {
            Some(why) => Err(StoreError::Failed(why.clone())),
            None => Ok(()),
        }
    }

    /// Remember that a write failed: sled keeps the error, so the store
    /// takes nothing more until it is opened again ([`StoreError::Failed`]).
    /// Only sled's errors and failed syncs count: a room refusal wrote
    /// nothing, and a file that could not be opened (no fd free) passes.
    pub fn note_failure(&self, e: &StoreError) {
        if !matches!(e, StoreError::Db(_) | StoreError::Sync { .. }) {
            return;
        }
        if self.inner.failed.set(e.to_string()).is_ok() {
            tracing::error!(store = %self.inner.root.display(), error = %e, "the store failed writing; no job runs until confine restarts");
        }
    }

    fn check_free(&self, reserve: u64) -> Result<(), StoreError> {
        match free_bytes(&self.inner.data) {
            Some(free) if reserve > 0 && free < reserve => {
                tracing::debug!(store = %self.inner.root.display(), free, reserve, "the store's disk is nearly full");
                Err(StoreError::Full { path: self.inner.root.clone(), free, reserve })
            }
            _ => Ok(()),
        }
    }

    /// A named tree (table) of the store: for the store's own modules,
    /// and for tests that edit a record behind its back to see it caught.
    /// Everything else goes through the modules' APIs ([`Table`] for
    /// small values).
    #[doc(hidden)]
    pub fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.inner.db.open_tree(name)?)
    }

    /// The value at `key` of `table`.
    pub fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree(table.name())?.get(key)?.map(|v| v.to_vec()))
    }

    /// Set the value at `key` of `table` (durable at the next [`Store::flush`]).
    pub fn put(&self, table: Table, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.check_room_for_records()?;
        let tree = self.tree(table.name())?;
        tree.insert(key, value).map_err(|e| self.failed_with(e.into()))?;
        Ok(())
    }

    /// `e`, noted as the store's failure ([`Store::note_failure`]).
    pub(crate) fn failed_with(&self, e: StoreError) -> StoreError {
        self.note_failure(&e);
        e
    }

    /// Every value of `table`, in key order.
    pub fn values(&self, table: Table) -> Result<Vec<Vec<u8>>, StoreError> {
        self.tree(table.name())?.iter().values().map(|v| Ok(v?.to_vec())).collect()
    }

    /// The store's artifact bytes.
    pub fn blobs(&self) -> &blobs::Blobs {
        &self.inner.blobs
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.inner.root
    }

    /// Make everything written so far durable: sled's flush, then
    /// `fdatasync` of its data file, then `fsync` of its directory.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.flush_inner().map_err(|e| self.failed_with(e))
    }

    fn flush_inner(&self) -> Result<(), StoreError> {
        self.inner.db.flush()?;
        release_garbage();
        self.inner.data.sync_data().map_err(|source| StoreError::Sync { what: "the database", source })?;
        self.inner.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_sled_blobs()?;
        if let Some(dir) = &self.inner.sled_dir {
            dir.sync_all().map_err(|source| StoreError::Sync { what: "the database's directory", source })?;
        }
        Ok(())
    }

    /// Sync the files sled made in `sled/blobs/` since the last flush,
    /// then that directory.
    fn sync_sled_blobs(&self) -> Result<(), StoreError> {
        let dir = self.inner.root.join(SLED_DIR).join("blobs");
        // Opening can fail for want of fds (not sticky); a sync that
        // fails leaves the data's state unknown (sticky).
        let io = |source| StoreError::Io { path: dir.clone(), source };
        let sync = |source| StoreError::Sync { what: "the database's large values", source };
        let mut synced = self.inner.sled_blobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut now = std::collections::BTreeSet::new();
        let mut new = false;
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(e)),
        };
        for entry in entries {
            let name = entry.map_err(io)?.file_name();
            if !synced.contains(&name) {
                match File::open(dir.join(&name)) {
                    Ok(f) => f.sync_all().map_err(sync)?,
                    // Removed by sled meanwhile.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(e)),
                }
                new = true;
            }
            now.insert(name);
        }
        if new {
            if let Some(d) = open_dir(&dir).map_err(io)? {
                d.sync_all().map_err(sync)?;
            }
        }
        // Only now: a flush that failed before the directory's sync must
        // leave these names new for the next one.
        *synced = now;
        Ok(())
    }

    /// How many times [`Store::flush`] synced the data file (tests).
    #[doc(hidden)]
    pub fn file_syncs(&self) -> u64 {
        self.inner.syncs.load(Ordering::Relaxed)
    }

    /// Approximate on-disk size in bytes: sled's and the blobs'.
    pub fn size_on_disk(&self) -> u64 {
        self.inner.db.size_on_disk().unwrap_or(0) + self.inner.blobs.bytes_on_disk()
    }
}

/// Open sled. We hold the store's lock, so sled's own lock can only be
/// held by this process's last use of the store: sled's flusher thread
/// lets go of it up to one round after the store is dropped, later on a
/// loaded host (a CI run's unit tests saw more than 2 s).
fn open_sled(path: &Path, flush_every_ms: Option<u64>) -> Result<sled::Db, sled::Error> {
    remove_unfinished_snapshots(path);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let opened = sled::Config::new()
            .path(path)
            // sled's default cache (1 GiB) would let a long-running
            // supervisor keep much of what it ever wrote resident. A small
            // one fills within a server's first thousand jobs and then
            // holds; the memory, audit and artifact reads measured no
            // slower for it (docs/benchmarks.md).
            .cache_capacity(4 << 20)
            .flush_every_ms(flush_every_ms)
            .open();
        match opened {
            Err(sled::Error::Io(e))
                if e.kind() == std::io::ErrorKind::WouldBlock && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Remove what an interrupted snapshot left in sled's directory. sled
/// writes its snapshot at every open to `snap.<lsn>.generating`, then
/// renames it; a write that fails (a full disk) or is killed leaves the
/// file, and sled 0.34 takes the highest name as its snapshot, so every
/// later open fails as corrupt (spacejam/sled#1527). A `.generating` file
/// is never a whole snapshot: without it sled reads the last whole one and
/// replays its log from there. The store's lock makes this process the
/// only one in the directory.
fn remove_unfinished_snapshots(sled_dir: &Path) {
    // Where the store has no lock (not Unix), another process may be
    // writing that file.
    if !cfg!(unix) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(sled_dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let unfinished =
            name.strip_prefix("snap.").and_then(|rest| rest.strip_suffix(".generating")).is_some_and(|lsn| {
                lsn.len() == 16 && lsn.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b))
            });
        if unfinished {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::warn!(
                    file = name,
                    "removed an unfinished snapshot of the store (an open that failed or was killed)"
                ),
                Err(e) => {
                    tracing::warn!(file = name, error = %e, "could not remove an unfinished snapshot of the store")
                }
            }
        }
    }
}

/// A directory, opened to be synced (not on Windows, where a directory
/// can't be opened as a file and renames are durable by themselves).
pub(crate) fn open_dir(path: &Path) -> std::io::Result<Option<File>> {
    if cfg!(windows) {
        return Ok(None);
    }
    File::open(path).map(Some)
}

/// The store's lock, held: whoever has it may open the store.
#[derive(Debug)]
pub struct StoreLock(File);

impl StoreLock {
    /// Make the store's directory if it is missing, take its lock and
    /// write our pid into it, or say who has it ([`StoreError::Busy`]).
    /// Cheap (no database is opened): a `confine exec` takes it first, to
    /// know at once whether it holds the store or relays to its holder.
    pub fn take(path: &Path) -> Result<StoreLock, StoreError> {
        let io = |source| StoreError::Io { path: path.to_path_buf(), source };
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        // Artifacts hold jobs' output: the store is its owner's alone.
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder.create(path).map_err(io)?;
        lock(path).map(StoreLock)
    }
}

/// Take the store's lock and write our pid into it, or say who has it.
/// The lock is the kernel's (`flock`): it goes with its holder, so a lock
/// left by a dead process is taken over without asking.
fn lock(path: &Path) -> Result<File, StoreError> {
    let lock_path = path.join(LOCK_FILE);
    let io = |source| StoreError::Io { path: path.to_path_buf(), source };
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let mut file = options.open(&lock_path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    #[cfg(unix)]
    let linked = std::os::unix::fs::MetadataExt::nlink(&meta) != 1;
    #[cfg(not(unix))]
    let linked = false;
    if !meta.is_file() || linked {
        return Err(io(std::io::Error::other(format!(
            "{} is not a regular file of its own (a link?): remove it",
            lock_path.display()
        ))));
    }
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // A holder that died may have left the lock for a moment to a child
        // it was starting (posix_spawn: the child has the holder's fds,
        // close-on-exec, until its execve): given up to this long.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            // SAFETY: flock on a descriptor we own; the kernel validates the operation.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io(err));
            }
            let mut text = String::new();
            let _ = std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0));
            let _ = std::io::Read::read_to_string(&mut std::io::Read::take(&file, 64), &mut text);
            let pid = text.trim().parse::<u32>().ok();
            let gone = pid.is_some_and(|pid| {
                // SAFETY: kill with signal 0 only checks that the pid exists.
                let ret = unsafe { libc::kill(pid as libc::pid_t, 0) };
                ret != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
            });
            if gone && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
            let holder = match pid {
                Some(pid) => format!("pid {pid}{}", process_name(pid).map(|n| format!(" ({n})")).unwrap_or_default()),
                None => "another process".to_string(),
            };
            return Err(StoreError::Busy { path: path.to_path_buf(), holder });
        }
    }
    use std::io::{Seek, Write};
    file.set_len(0).map_err(io)?;
    file.seek(std::io::SeekFrom::Start(0)).map_err(io)?;
    writeln!(file, "{}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// The pid the store's `LOCK` names: its holder's while it is held.
pub fn holder_pid(path: &Path) -> Option<u32> {
    read_small(&path.join(LOCK_FILE)).ok()?.trim().parse().ok()
}

/// The command line of `pid`, for the message that names it (Linux).
#[cfg(unix)]
fn process_name(pid: u32) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let words: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// A small file, not through a link, at most 64 bytes of it.
fn read_small(path: &Path) -> std::io::Result<String> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(std::io::Error::other(format!("{} is not a regular file", path.display())));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 64), &mut text)?;
    Ok(text)
}

/// Refuse a store of another layout; mark a new one with ours. A
/// directory that holds sled's files but no `FORMAT` was made before the
/// layout had a version (sled at the store's top, artifact bytes in sled).
fn check_format(path: &Path) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: path.to_path_buf(), source };
    let format_path = path.join(FORMAT_FILE);
    let expected = format!("confine store {FORMAT_VERSION}\n");
    match read_small(&format_path) {
        Ok(text) if text == expected => Ok(()),
        Ok(text) => {
            let found = text.trim().strip_prefix("confine store ").unwrap_or("unknown").to_string();
            let newer = found.parse::<u32>().is_ok_and(|v| v > FORMAT_VERSION);
            Err(StoreError::Format {
                path: path.to_path_buf(),
                found,
                made_by: if newer { "a newer confine" } else { "an older confine" },
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if path.join("db").exists() || path.join("conf").exists() {
                return Err(StoreError::Format {
                    path: path.to_path_buf(),
                    found: "1".into(),
                    made_by: "an older confine",
                });
            }
            blobs::write_durably(path, FORMAT_FILE, expected.as_bytes()).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests;
