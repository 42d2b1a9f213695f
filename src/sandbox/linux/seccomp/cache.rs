//! The on-disk cache of compiled seccomp programs, so that a `confine run`
//! (each one its own supervisor) does not spend CPU in libseccomp compiling
//! the same profile again (docs/benchmarks.md, "Figures once in the code").
//!
//! An entry is keyed by everything the program depends on: the profile's
//! name and text, the host facts it was evaluated against (architecture,
//! kernel version, capabilities), the libseccomp version and API level, and
//! the identity of this very binary (device, inode, size and mtime of
//! `/proc/self/exe`), so a rebuilt or upgraded confine never loads an
//! older compiler's output. The file holds a magic line, the SHA-256 of
//! the key and the program, and the program: a torn or altered file fails
//! the check, and so does a valid entry of another profile renamed or
//! linked into this one's place; either is compiled again and replaced.
//!
//! Who may have written the file decides whether it is trusted, because a
//! weakened program would silently weaken every later job:
//! - The cache is used only when the supervisor runs as root. Jobs never
//!   run as host root (they get the workspace owner's uid or 65534), so
//!   nothing a job writes can be owned by root or be placed in a 0700
//!   root directory.
//! - The directory and the entry must be owned by root and writable by no
//!   one else; the entry is opened with `O_NOFOLLOW`.
//! - Rootless supervisors compile every time: a job runs as the same host
//!   uid as its supervisor, and a writable bind of the cache directory
//!   would let one job choose the filter of the next.
//!
//! `/var/cache/confine/seccomp` by default; `CONFINE_CACHE_DIR` moves the
//! base directory, and `CONFINE_SECCOMP_CACHE=0` turns the cache off.

use sha2::{Digest, Sha256};
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"confine-seccomp-bpf 1\n";
/// Bumped when the key or the file layout changes.
const KEY_VERSION: &str = "confine seccomp cache key v1";
/// Entries kept; the oldest beyond this are removed when one is added.
const MAX_ENTRIES: usize = 64;
/// The largest program the kernel accepts (BPF_MAXINSNS × 8 bytes).
const MAX_PROGRAM: usize = 4096 * 8;
const DEFAULT_BASE: &str = "/var/cache/confine";

/// What an entry's checksum covers: its key and its program.
fn digest(key: &str, program: &[u8]) -> Vec<u8> {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update(program);
    h.finalize().to_vec()
}

/// A trusted cache directory.
#[derive(Debug)]
pub struct Cache {
    dir: PathBuf,
    owner: u32,
}

/// Why a cache directory is not used (every job then compiles).
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cannot create {dir}: {source}")]
    Create { dir: PathBuf, source: std::io::Error },
    #[error("cannot inspect {dir}: {source}")]
    Inspect { dir: PathBuf, source: std::io::Error },
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    /// Someone else could plant programs in it.
    #[error(
        "{dir} must be owned by uid {owner} and writable only by it (it is uid {uid}, mode {mode:o}); \
         fix with: chown {owner} {dir} && chmod 700 {dir}"
    )]
    Untrusted { dir: PathBuf, owner: u32, uid: u32, mode: u32 },
}

impl Cache {
    /// The cache this process may use, or `None` (not root, turned off, or
    /// the directory is not safe to trust: then every job compiles).
    pub fn open() -> Option<Cache> {
        if std::env::var_os("CONFINE_SECCOMP_CACHE").is_some_and(|v| v == "0" || v == "off") {
            return None;
        }
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let base = std::env::var_os("CONFINE_CACHE_DIR").map_or_else(|| PathBuf::from(DEFAULT_BASE), PathBuf::from);
        match Cache::at(&base.join("seccomp"), 0) {
            Ok(cache) => Some(cache),
            Err(reason) => {
                tracing::warn!("seccomp cache not used: {reason}");
                None
            }
        }
    }

    /// Use (creating it 0700 if missing) `dir`, which must be a real
    /// directory owned by `owner` and writable by no one else, as must its
    /// parent when it was just created by us.
    pub fn at(dir: &Path, owner: u32) -> Result<Cache, CacheError> {
        if let Err(source) = fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
            return Err(CacheError::Create { dir: dir.to_path_buf(), source });
        }
        let meta =
            fs::symlink_metadata(dir).map_err(|source| CacheError::Inspect { dir: dir.to_path_buf(), source })?;
        if !meta.file_type().is_dir() {
            return Err(CacheError::NotADirectory(dir.to_path_buf()));
        }
        if meta.uid() != owner || meta.mode() & 0o022 != 0 {
            return Err(CacheError::Untrusted {
                dir: dir.to_path_buf(),
                owner,
                uid: meta.uid(),
                mode: meta.mode() & 0o7777,
            });
        }
        Ok(Cache { dir: dir.to_path_buf(), owner })
    }

    /// The key of a program compiled from `text` (named `name`) under
    /// `host_facts` (their `Debug` form) by this binary and libseccomp.
    pub fn key(name: &str, text: &str, host_facts: &str) -> String {
        let version = libseccomp::ScmpVersion::current().map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro));
        let exe = fs::metadata("/proc/self/exe")
            .map(|m| format!("{}:{}:{}:{}.{}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()));
        // libseccomp's API level is a probe of the kernel (about ten seccomp
        // calls, on every start) and shapes only the programs libseccomp
        // generates. confine's own generator checks the kernel's actions
        // when it compiles, and the kernel version is in `host_facts`.
        let api = if super::bpf::native_arch().is_none() { libseccomp::get_api().to_string() } else { String::new() };
        let mut h = Sha256::new();
        for part in [
            KEY_VERSION,
            env!("CARGO_PKG_VERSION"),
            exe.as_deref().unwrap_or("unknown exe"),
            version.as_deref().unwrap_or("unknown libseccomp"),
            &api,
            host_facts,
            name,
            text,
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        hex::encode(h.finalize())
    }

    fn entry(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.bpf"))
    }

    /// The program stored under `key`, if there is a trusted, intact one.
    pub fn load(&self, key: &str) -> Option<Vec<u8>> {
        let path = self.entry(key);
        let mut file = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(&path).ok()?;
        let meta = file.metadata().ok()?;
        let limit = (MAGIC.len() + 32 + MAX_PROGRAM) as u64;
        if !meta.file_type().is_file() || meta.uid() != self.owner || meta.mode() & 0o022 != 0 || meta.len() > limit {
            tracing::warn!("seccomp cache entry {} is not trusted; compiling instead", path.display());
            return None;
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut bytes).ok()?;
        let rest = bytes.strip_prefix(MAGIC)?;
        let (sum, program) = rest.split_at_checked(32)?;
        if program.is_empty() || program.len() % 8 != 0 || digest(key, program).as_slice() != sum {
            tracing::warn!("seccomp cache entry {} is damaged; compiling again", path.display());
            return None;
        }
        Some(program.to_vec())
    }

    /// Store `program` under `key` (atomically: a reader sees the old entry,
    /// the new one, or none). Failures only cost the next run a compile.
    pub fn store(&self, key: &str, program: &[u8]) {
        if let Err(e) = self.try_store(key, program) {
            tracing::debug!("seccomp cache: cannot store {key}: {e}");
        }
        self.prune();
    }

    fn try_store(&self, key: &str, program: &[u8]) -> std::io::Result<()> {
        let tmp = self.dir.join(format!(".{key}.{}.tmp", std::process::id()));
        let mut file =
            OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&tmp)?;
        let written = file
            .write_all(MAGIC)
            .and_then(|()| file.write_all(&digest(key, program)))
            .and_then(|()| file.write_all(program))
            .and_then(|()| fs::rename(&tmp, self.entry(key)));
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written
    }

    /// Keep at most [`MAX_ENTRIES`] entries, removing the least recently
    /// written (new kernels and rebuilt binaries leave old keys behind).
    fn prune(&self) {
        let Ok(dir) = fs::read_dir(&self.dir) else { return };
        let mut entries: Vec<(i64, PathBuf)> = dir
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "bpf"))
            .filter_map(|e| Some((e.metadata().ok()?.mtime(), e.path())))
            .collect();
        if entries.len() <= MAX_ENTRIES {
            return;
        }
        entries.sort();
        for (_, path) in &entries[..entries.len() - MAX_ENTRIES] {
            let _ = fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests;
