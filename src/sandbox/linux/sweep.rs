//! After a job with a read-write idmapped tree: the repositories it made
//! there are handed to its host ids, and a durable record makes sure that
//! happens even when the supervisor dies first.
//!
//! Through the idmap, what the job creates lands as the tree's owner
//! (root, on a CI runner's checkout), and root's git trusts a root-owned
//! repository: a `.git` the job made, with `core.fsmonitor` set, would run
//! the job's command at root's next `git status` there. [`idmap_check`]
//! refused every repository the protection did not reach before the job,
//! so every `.git` (and every bare repository) found outside the protected
//! paths afterwards is one the job made. [`Sweep::disown_new_repositories`]
//! walks the tree from the fd opened before the job, never following a
//! link, with no depth bound: only a bounded number of directory fds is
//! held, and a directory whose fd was let go is reached again through the
//! `..` of its child, checked to be the same inode.
//!
//! The supervisor plans the record ([`plan`]); the outer stage, once its
//! check passed and the tree is idmapped, writes it to [`RECORD_DIR`]
//! ([`write_record`]: synced, root's, 0700) before the job can run, with
//! the trees really idmapped only. After the job the supervisor sweeps the
//! trees the job's own report says were idmapped (a refused tree was never
//! the job's to write, and its repositories are root's own), then removes
//! the record.
//! A supervisor killed before that (`SIGKILL`, a crash, a power cut)
//! leaves it, and the next confine to start a job sweeps it
//! ([`sweep_stale`]) once the dead supervisor's job is certainly gone: its
//! init stage dead and its cgroups removed.
//!
//! [`idmap_check`]: super::idmap_check

use super::cgroup::Owner;
use crate::dirfd::Dir;
use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Where the records of sweeps not yet done are kept (root's, 0700).
pub const RECORD_DIR: &str = "/var/lib/confine/sweeps";

/// How many directory fds a walk holds at most; deeper directories are
/// reached again through `..` when the walk comes back to them.
const HELD_FDS: usize = 32;

/// Records whose sweep is done, waiting to be removed.
const DONE_PREFIX: &str = ".done-";

/// The largest record written and read back (a tree with thousands of
/// protected repositories stays far below it).
const MAX_RECORD: u64 = 16 << 20;

/// Why a sweep's walk stopped (what it handed before stays handed).
/// Directories are shown relative to the tree.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot open the tree to sweep it: {0}")]
    OpenTree(Errno),
    #[error("lost the directory {0}")]
    Lost(String),
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: Errno },
    #[error("cannot read {dir}: {source}")]
    Read { dir: String, source: Errno },
    #[error("cannot make {dir} writable by root alone: {source}")]
    Chmod { dir: String, source: Errno },
    #[error("cannot list {dir}: {source}")]
    List { dir: String, source: Errno },
    /// The tree changed under the walk (a concurrent rename).
    #[error("lost the way back to {0} (the tree changed during the sweep)")]
    WayBack(String),
    #[error("cannot reopen {dir}: {source}")]
    Reopen { dir: String, source: Errno },
}

/// Why a sweep's record can't be made or written: the job does not run.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {source}")]
    Tree { path: PathBuf, source: Errno },
    #[error("{0}")]
    Encode(serde_json::Error),
    #[error(
        "the record of the sweep this job's read-write workspace needs would be {len} bytes, more than the \
         {max} a later sweep reads (too many protected paths): bind it read-only",
        max = MAX_RECORD
    )]
    TooLarge { len: usize },
    #[error(
        "cannot record the sweep this job's read-write workspace needs in {dir}: {0} (make {dir} \
         writable by root, or bind the workspace read-only)",
        dir = RECORD_DIR
    )]
    Write(std::io::Error),
}

/// A read-write tree to sweep once its job is over.
pub struct Sweep {
    /// The source, opened before the job started.
    pub dir: OwnedFd,
    /// Its path on the host (for the record: a later supervisor opens it
    /// again, and checks it is the same directory).
    pub src: PathBuf,
    /// Where the job sees it (the bind's destination).
    pub dst: PathBuf,
    /// The tree's owner uid: its directories, the job's through the
    /// idmap, are made writable by their owner alone after the job.
    pub owner: u32,
    /// Protected paths (mounted read-only: the job made nothing there).
    pub skip: Vec<PathBuf>,
}

/// One directory on the walk's way down.
struct Frame {
    /// Let go of when the walk is more than [`HELD_FDS`] deeper.
    dir: Option<nix::dir::Dir>,
    dev: u64,
    ino: u64,
    /// Its subdirectories not walked yet.
    pending: Vec<OsString>,
}

impl Sweep {
    /// Give every repository the job made to `job` (its host uid and
    /// gid), never following a link. Returns the paths handed over, or
    /// why the walk could not finish (what it handed before stays handed).
    pub fn disown_new_repositories(&self, job: (u32, u32)) -> Result<Vec<PathBuf>, SweepError> {
        let top = openat(&self.dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(SweepError::OpenTree)?;
        let mut rel = PathBuf::new();
        let mut handed = Vec::new();
        // The tree itself made a repository (a HEAD at its top).
        if super::idmap_check::is_repository(&top) {
            let _ = nix::unistd::fchown(&top, Some(job.0.into()), Some(job.1.into()));
            handed.push(PathBuf::from("."));
        }
        let mut stack = vec![self.enter(top, &rel, job, &mut handed)?];
        while let Some(frame) = stack.last_mut() {
            let Some(name) = frame.pending.pop() else {
                let done = stack.pop();
                rel.pop();
                if let (Some(done), Some(parent)) = (done, stack.last_mut()) {
                    if parent.dir.is_none() {
                        parent.dir = Some(parent_of(&done, parent, &rel)?);
                    }
                }
                continue;
            };
            let Some(at) = frame.dir.as_ref() else {
                return Err(SweepError::Lost(shown(&rel)));
            };
            let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let sub = match openat(at, name.as_os_str(), flags, Mode::empty()) {
                Ok(sub) => sub,
                // Gone, or no longer a directory: nothing to walk there.
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) => continue,
                Err(source) => return Err(SweepError::Open { path: rel.join(&name), source }),
            };
            rel.push(&name);
            // A bare repository (no `.git` name: git finds it by its
            // contents from below) is the job's too: its directory goes
            // to the job's ids, as a `.git` does.
            if !name.as_bytes().eq_ignore_ascii_case(b".git") && super::idmap_check::is_repository(&sub) {
                let _ = nix::unistd::fchown(&sub, Some(job.0.into()), Some(job.1.into()));
                handed.push(rel.clone());
            }
            let child = self.enter(sub, &rel, job, &mut handed)?;
            stack.push(child);
            // The top frame (the tree itself) is never let go of: the
            // walk's way back up ends there.
            if stack.len() > HELD_FDS + 1 {
                let i = stack.len() - 1 - HELD_FDS;
                if i > 0 {
                    stack[i].dir = None;
                }
            }
        }
        Ok(handed)
    }

    /// List the directory `dir` (at `rel`): hand its `.git` over, and
    /// collect its subdirectories, skipping protected paths.
    fn enter(&self, dir: OwnedFd, rel: &Path, job: (u32, u32), handed: &mut Vec<PathBuf>) -> Result<Frame, SweepError> {
        let st = fstat(&dir).map_err(|source| SweepError::Read { dir: shown(rel), source })?;
        // A directory of the owner's that the job made writable to others
        // would let any local user finish a repository there that the
        // owner's git trusts (git checks the directory's owner only):
        // writable by its owner alone.
        let shared = libc::S_IWGRP | libc::S_IWOTH;
        if st.st_uid == self.owner && st.st_mode & shared != 0 {
            let mode = Mode::from_bits_truncate((st.st_mode & 0o7777 & !shared) as _);
            match nix::sys::stat::fchmod(&dir, mode) {
                Ok(()) => {
                    tracing::info!(dir = %shown(rel), "a root-owned directory writable by others was made root's alone")
                }
                Err(source) => return Err(SweepError::Chmod { dir: shown(rel), source }),
            }
        }
        let list_failed = |source| SweepError::List { dir: shown(rel), source };
        let mut listing = nix::dir::Dir::from_fd(dir).map_err(list_failed)?;
        let fd = listing.as_raw_fd();
        let mut pending = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(list_failed)?;
            let name = entry.file_name();
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let os = OsStr::from_bytes(bytes);
            if !self.skip.is_empty() && self.skip.iter().any(|s| s == &rel.join(os)) {
                continue;
            }
            // SAFETY: `fd` is `listing`'s open directory, alive here.
            let dirfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            // Compared without case: on a case-folding file system git's
            // `.git` is `.GIT` too.
            if bytes.eq_ignore_ascii_case(b".git") {
                let _ = nix::unistd::fchownat(
                    dirfd,
                    name,
                    Some(job.0.into()),
                    Some(job.1.into()),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                );
                handed.push(rel.join(os));
            }
            let is_dir = match entry.file_type() {
                Some(nix::dir::Type::Directory) => true,
                Some(_) => false,
                None => fstatat(dirfd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| st.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFDIR.bits()),
            };
            if is_dir {
                pending.push(os.to_os_string());
            }
        }
        // Walked in name order (popped from the end).
        pending.sort_unstable_by(|a, b| b.cmp(a));
        Ok(Frame { dir: Some(listing), dev: st.st_dev, ino: st.st_ino, pending })
    }
}

/// The directory of `parent` again, as `..` of its child `done`: it must
/// be the same inode, or the tree changed under the walk (a concurrent
/// rename), and the walk stops rather than go on somewhere else.
fn parent_of(done: &Frame, parent: &Frame, rel: &Path) -> Result<nix::dir::Dir, SweepError> {
    let lost = || SweepError::WayBack(shown(rel));
    let failed = |source| SweepError::Reopen { dir: shown(rel), source };
    let child = done.dir.as_ref().ok_or_else(lost)?;
    let up =
        openat(child, "..", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).map_err(failed)?;
    let st = fstat(&up).map_err(failed)?;
    if (st.st_dev, st.st_ino) != (parent.dev, parent.ino) {
        return Err(lost());
    }
    nix::dir::Dir::from_fd(up).map_err(failed)
}

fn shown(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "the tree's top".into()
    } else {
        rel.display().to_string()
    }
}

/// What a record keeps of a process: enough to tell it from a later one
/// with the same pid.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Proc {
    pid: u32,
    start: u64,
}

impl Proc {
    fn alive(&self) -> bool {
        Owner { pid: self.pid, start: self.start }.alive()
    }
}

/// One tree of a record. Paths are bytes: a host path need not be UTF-8.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Tree {
    src: Vec<u8>,
    /// The bind's destination: the outer stage keeps the trees it idmapped.
    dst: Vec<u8>,
    pub dev: u64,
    pub ino: u64,
    /// The tree's owner uid ([`Sweep::owner`]).
    #[serde(default)]
    owner: u32,
    /// Birth time (s, ns), where the file system keeps one: an inode
    /// number reused by a new directory at the same path is not the tree.
    #[serde(default)]
    btime: Option<(i64, u32)>,
    skip: Vec<Vec<u8>>,
}

/// A sweep still owed, as written before the job ran.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepRecord {
    /// The supervisor, and the job's init stage (the job dies with it).
    owner: Proc,
    stage: Proc,
    /// The job's cgroup directories: a crashed supervisor's are killed
    /// and removed by the next one to start; until then, the job may run.
    cgroups: Vec<Vec<u8>>,
    uid: u32,
    gid: u32,
    trees: Vec<Tree>,
}

/// The sweeps a job owes, and the name of its record (which the outer
/// stage wrote if it idmapped any of them).
pub struct Pending {
    sweeps: Vec<Sweep>,
    job: (u32, u32),
    record: Option<OsString>,
}

impl Pending {
    pub fn new(sweeps: Vec<Sweep>, job: (u32, u32), job_id: &str) -> Pending {
        let record = (!sweeps.is_empty()).then(|| record_name(job_id));
        Pending { sweeps, job, record }
    }

    /// Sweep now (every process of the job is gone) the trees the job's
    /// report says were idmapped (`idmapped`: their destinations), then
    /// drop the record if every one was swept whole. A tree that was not
    /// idmapped was never the job's to write: it is left as it is.
    pub fn finish(&mut self, idmapped: &[String]) {
        let mut whole = true;
        for s in std::mem::take(&mut self.sweeps) {
            if !idmapped.iter().any(|d| Path::new(d) == s.dst) {
                continue;
            }
            match s.disown_new_repositories(self.job) {
                Ok(handed) => {
                    for repo in handed {
                        tracing::info!(repo = %repo.display(), "a repository the job made was handed to its host ids");
                    }
                }
                Err(e) => {
                    whole = false;
                    tracing::warn!(tree = %s.src.display(), error = %e, "the sweep for the job's repositories stopped");
                }
            }
        }
        if let (Some(name), true) = (self.record.take(), whole) {
            // Renamed out of the way (a rename is a tenth of what removing a
            // file just synced costs); [`sweep_stale`] removes it later, off
            // any job's path. Not synced: a power cut that undoes it leaves
            // a record whose sweep is done again, which hands over nothing
            // new.
            if let Ok(Some(dir)) = record_dir(false) {
                let mut done = OsString::from(DONE_PREFIX);
                done.push(&name);
                let _ = dir.rename(&name, &done);
            }
        }
    }
}

fn record_name(job_id: &str) -> OsString {
    OsString::from(format!("{job_id}.json"))
}

/// The record of `sweeps`, every tree in it: the outer stage keeps those
/// it idmaps ([`write_record`]). `stage`: the init stage's pid; `cgroups`:
/// the job's cgroup directories. Refused when a later sweep could not read
/// it back.
pub fn plan(sweeps: &[Sweep], job: (u32, u32), stage: u32, cgroups: &[PathBuf]) -> Result<SweepRecord, RecordError> {
    let mut trees = Vec::new();
    for s in sweeps {
        let st = fstat(s.dir.as_fd()).map_err(|source| RecordError::Tree { path: s.src.clone(), source })?;
        trees.push(Tree {
            src: s.src.as_os_str().as_bytes().to_vec(),
            dst: s.dst.as_os_str().as_bytes().to_vec(),
            dev: st.st_dev,
            ino: st.st_ino,
            owner: s.owner,
            btime: birth_time(&s.dir),
            skip: s.skip.iter().map(|p| p.as_os_str().as_bytes().to_vec()).collect(),
        });
    }
    let me = Owner::current();
    let stage = Owner::of(stage);
    let rec = SweepRecord {
        owner: Proc { pid: me.pid, start: me.start },
        stage: Proc { pid: stage.pid, start: stage.start },
        cgroups: cgroups.iter().map(|p| p.as_os_str().as_bytes().to_vec()).collect(),
        uid: job.0,
        gid: job.1,
        trees,
    };
    let len = serde_json::to_vec(&rec).map_err(RecordError::Encode)?.len();
    if len as u64 > MAX_RECORD {
        return Err(RecordError::TooLarge { len });
    }
    Ok(rec)
}

impl SweepRecord {
    /// The (device, inode) of the tree bound at `dst`, if it is one.
    pub fn inode_of(&self, dst: &Path) -> Option<(u64, u64)> {
        self.trees.iter().find(|t| Path::new(OsStr::from_bytes(&t.dst)) == dst).map(|t| (t.dev, t.ino))
    }
}

/// Write the record of job `job_id` (durably: synced file and directory),
/// keeping the trees bound at `idmapped` only; none: nothing is written.
/// The outer stage calls this before the job can run.
pub fn write_record(job_id: &str, rec: &SweepRecord, idmapped: &[PathBuf]) -> Result<(), RecordError> {
    let mut rec = rec.clone();
    rec.trees.retain(|t| idmapped.iter().any(|d| d.as_os_str().as_bytes() == t.dst.as_slice()));
    if rec.trees.is_empty() {
        return Ok(());
    }
    let fail = RecordError::Write;
    let dir = record_dir(true)
        .map_err(fail)?
        .ok_or_else(|| fail(std::io::Error::other(format!("{RECORD_DIR}: No such file or directory"))))?;
    let bytes = serde_json::to_vec(&rec).map_err(|e| fail(std::io::Error::other(e)))?;
    let name = record_name(job_id);
    let tmp = OsString::from(format!(".{job_id}.tmp"));
    let written = (|| {
        use std::io::Write;
        let mut f = dir.create_new(&tmp, 0o600)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        dir.rename(&tmp, &name)?;
        dir.sync()
    })();
    if let Err(e) = written {
        let _ = dir.unlink(&tmp);
        return Err(fail(e));
    }
    Ok(())
}

/// [`RECORD_DIR`], made (0700) when `create`; `None` when it is not there.
fn record_dir(create: bool) -> std::io::Result<Option<Dir>> {
    let mut dir = Dir::open(Path::new("/var/lib"))?;
    for part in ["confine", "sweeps"] {
        if create {
            dir.mkdir(OsStr::new(part), 0o700)?;
        }
        dir = match dir.dir(Path::new(part)) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
    }
    let st = dir.stat()?;
    if st.uid != 0 || st.mode & 0o022 != 0 {
        return Err(std::io::Error::other(format!("{RECORD_DIR} is not root's alone")));
    }
    Ok(Some(dir))
}

/// What [`RECORD_DIR`] holds now (a listing, cheap enough for a job's
/// start): the records of sweeps owed (by running jobs, or by crashed
/// supervisors'), and the finished ones that wait for their removal,
/// which starts on a thread of its own, off the job's path (removing a
/// file just synced costs more than the job's own record did; whatever
/// this process leaves, a later one removes).
pub fn owed() -> Vec<OsString> {
    let dir = match record_dir(false) {
        Ok(Some(dir)) => dir,
        Ok(None) => return Vec::new(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the records of sweeps owed");
            return Vec::new();
        }
    };
    let Ok(names) = dir.names() else { return Vec::new() };
    let (finished, owed): (Vec<OsString>, Vec<OsString>) =
        names.into_iter().partition(|n| n.as_bytes().starts_with(DONE_PREFIX.as_bytes()));
    if !finished.is_empty() {
        std::thread::spawn(move || {
            for name in finished {
                let _ = dir.unlink(&name);
            }
        });
    }
    owed.into_iter().filter(|n| !n.as_bytes().starts_with(b".") && n.as_bytes().ends_with(b".json")).collect()
}

/// Sweep the trees of the records `names` ([`owed`]) whose supervisors
/// died before their sweep, once their jobs are gone. Call after the
/// crashed supervisors' cgroups were killed and removed
/// ([`super::cgroup::supervisor`]). Returns how many records were done.
pub fn sweep_stale(names: Vec<OsString>) -> usize {
    let Ok(Some(dir)) = record_dir(false) else { return 0 };
    let mut done = 0;
    for name in names {
        let shown = Path::new(&name).display();
        let rec = match dir.read_regular(Path::new(&name), MAX_RECORD) {
            Ok(Some(read)) => match serde_json::from_slice::<SweepRecord>(&read.bytes) {
                Ok(rec) => rec,
                Err(e) => {
                    tracing::warn!(record = %shown, error = %e, "a sweep record can't be read: its tree is not swept");
                    continue;
                }
            },
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(record = %shown, error = %e, "a sweep record can't be read: its tree is not swept");
                continue;
            }
        };
        if rec.owner.alive()
            || rec.stage.alive()
            || rec.cgroups.iter().any(|c| populated(Path::new(OsStr::from_bytes(c))))
        {
            continue;
        }
        let mut whole = true;
        for tree in &rec.trees {
            match reopen(tree) {
                Ok(Some(sweep)) => match sweep.disown_new_repositories((rec.uid, rec.gid)) {
                    Ok(handed) => {
                        for repo in handed {
                            tracing::info!(
                                tree = %sweep.src.display(), repo = %repo.display(),
                                "a repository a crashed supervisor's job made was handed to its host ids"
                            );
                        }
                    }
                    Err(e) => {
                        whole = false;
                        tracing::warn!(tree = %sweep.src.display(), error = %e, "the sweep of a crashed job's tree stopped");
                    }
                },
                // The tree is gone, or another is at its path now.
                Ok(None) => {}
                Err(e) => {
                    whole = false;
                    tracing::warn!(error = %e, "cannot sweep a crashed job's tree");
                }
            }
        }
        if whole && dir.unlink(&name).and_then(|()| dir.sync()).is_ok() {
            done += 1;
        }
    }
    done
}

/// Whether a dead supervisor's job cgroup still holds a process. Its
/// processes die with their init stage; a cgroup a later supervisor can't
/// remove (it ran under another parent) is gone enough once empty, and
/// one that is not is killed (`cgroup.kill`, where the kernel has it).
fn populated(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) else {
        return false;
    };
    if procs.trim().is_empty() {
        return false;
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    true
}

/// The directory's birth time, where the file system keeps one.
fn birth_time(dir: &OwnedFd) -> Option<(i64, u32)> {
    // SAFETY: an all-zero statx is a valid value for statx to overwrite.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open fd, the path is an empty NUL-terminated
    // string (AT_EMPTY_PATH: the fd itself), and `stx` is writable.
    let r = unsafe { libc::statx(dir.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BTIME, &mut stx) };
    (r == 0 && stx.stx_mask & libc::STATX_BTIME != 0).then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec))
}

/// Why a record's tree could not be opened again.
#[derive(Debug, thiserror::Error)]
enum ReopenError {
    #[error("{0}")]
    Root(Errno),
    #[error("{path}: {source}")]
    Tree { path: PathBuf, source: Errno },
}

/// A record's tree opened again from `/`, with no link on the way; `None`
/// when nothing, or another directory, is at its path now.
fn reopen(tree: &Tree) -> Result<Option<Sweep>, ReopenError> {
    let src = PathBuf::from(OsStr::from_bytes(&tree.src));
    let root = nix::fcntl::open("/", OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty()).map_err(ReopenError::Root)?;
    let rel = src.strip_prefix("/").unwrap_or(&src);
    let resolve = libc::RESOLVE_NO_MAGICLINKS | libc::RESOLVE_NO_SYMLINKS;
    let dir = match super::sys::openat2(&root, rel, libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC, resolve) {
        Ok(dir) => dir,
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR | nix::errno::Errno::ELOOP) => return Ok(None),
        Err(source) => return Err(ReopenError::Tree { path: src, source }),
    };
    let st = fstat(dir.as_fd()).map_err(|source| ReopenError::Tree { path: src.clone(), source })?;
    let born = birth_time(&dir);
    if (st.st_dev, st.st_ino) != (tree.dev, tree.ino) || (tree.btime.is_some() && born != tree.btime) {
        return Ok(None);
    }
    let skip = tree.skip.iter().map(|p| PathBuf::from(OsStr::from_bytes(p))).collect();
    let dst = PathBuf::from(OsStr::from_bytes(&tree.dst));
    Ok(Some(Sweep { dir, src, dst, owner: tree.owner, skip }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn open_dir(p: &Path) -> OwnedFd {
        nix::fcntl::open(p, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).unwrap()
    }

    fn frame(p: &Path) -> Frame {
        let fd = open_dir(p);
        let st = fstat(&fd).unwrap();
        Frame { dir: Some(nix::dir::Dir::from_fd(fd).unwrap()), dev: st.st_dev, ino: st.st_ino, pending: Vec::new() }
    }

    /// A directory moved out from under the walk (a rename while it was
    /// deeper than the fds it holds) stops it: `..` now leads elsewhere.
    #[test]
    fn the_way_back_up_must_be_the_same_directory() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("a/b")).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        let mut parent = frame(&t.path().join("a"));
        let child = frame(&t.path().join("a/b"));
        parent.dir = None;
        assert!(parent_of(&child, &parent, Path::new("a")).is_ok());
        std::fs::rename(t.path().join("a/b"), t.path().join("elsewhere/b")).unwrap();
        let e = parent_of(&child, &parent, Path::new("a")).err().unwrap();
        assert!(matches!(e, SweepError::WayBack(_)), "{e}");
        assert!(e.to_string().contains("the tree changed during the sweep"), "{e}");
    }

    /// Deeper than the fds the walk holds, with `.git`s on the way down,
    /// at the bottom and after it; a protected one is left alone.
    #[test]
    fn the_walk_reaches_every_depth_and_skips_protected_paths() {
        let t = tempfile::tempdir().unwrap();
        let deep: PathBuf = std::iter::repeat_n("d", HELD_FDS * 3).collect();
        std::fs::create_dir_all(t.path().join(&deep).join(".git")).unwrap();
        std::fs::create_dir_all(t.path().join("d/d/.git")).unwrap();
        std::fs::create_dir_all(t.path().join("z/.git")).unwrap();
        std::fs::create_dir_all(t.path().join(".git")).unwrap();
        let me = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let sweep = Sweep {
            dir: open_dir(t.path()),
            src: t.path().into(),
            dst: "/workspace".into(),
            owner: 0,
            skip: vec![PathBuf::from(".git")],
        };
        let mut handed = sweep.disown_new_repositories(me).unwrap();
        handed.sort();
        let mut want = vec![deep.join(".git"), PathBuf::from("d/d/.git"), PathBuf::from("z/.git")];
        want.sort();
        assert_eq!(handed, want);
    }

    /// A dead supervisor's job cgroup counts while it holds a process,
    /// not while its directory merely exists (F5: one under another
    /// parent is never removed by a later supervisor).
    #[test]
    fn an_empty_cgroup_left_behind_does_not_hold_the_sweep() {
        let t = tempfile::tempdir().unwrap();
        assert!(!populated(&t.path().join("gone")));
        std::fs::write(t.path().join("cgroup.procs"), "").unwrap();
        assert!(!populated(t.path()));
        std::fs::write(t.path().join("cgroup.procs"), "4242\n").unwrap();
        assert!(populated(t.path()));
    }

    /// A record a later sweep could not read is refused before the job
    /// runs (F4), not written and then skipped for ever.
    #[test]
    fn a_record_too_large_to_read_back_stops_the_job() {
        let t = tempfile::tempdir().unwrap();
        let name: String = "v".repeat(250);
        let skip = (0..20_000).map(|i| PathBuf::from(format!("{name}{i}/.git"))).collect();
        let sweep = Sweep { dir: open_dir(t.path()), src: t.path().into(), dst: "/workspace".into(), owner: 0, skip };
        let e = plan(&[sweep], (65534, 65534), 0, &[]).err().unwrap();
        assert!(matches!(e, RecordError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("more than the 16777216 a later sweep reads"), "{e}");
    }
}
