//! What a read-write idmapped tree must not hold. Through the idmap the
//! job owns the owner's files, and a write through a shared mapping
//! (`mmap` + store) keeps a file's setuid and setgid bits and its file
//! capabilities, where `write(2)` and `truncate(2)` drop them. So a
//! setuid-root binary in root's checkout (a rootfs, a `make install
//! DESTDIR=` tree) would be the job's to rewrite and the host's to run as
//! root; and a second name of a file (a hard link from `cp -al` or
//! `rsync --link-dest`) would let the job write the file outside.
//!
//! Before such a tree is idmapped, the outer stage, as host root, walks it
//! from the opened source (never by path: `openat` with `O_NOFOLLOW` from
//! each directory's fd) and refuses the idmap if it finds, owned by the
//! mapped owner (or writable by its group):
//!
//! - a setuid or setgid file;
//! - a file with `security.capability`;
//! - a file that is not a directory and has more than one name.
//!
//! The bind is then plain, and a `--rw` run stops with the reason (exit
//! 125).
//!
//! What the job creates lands as the owner's, so a repository it makes
//! (`git init` in a subdirectory, `core.fsmonitor` set) would be root's,
//! and root's git trusts a root-owned repository: its next `git status`
//! there would run the job's command. Git refused the same repository
//! when the job's files were its own uid's. So, with protection on, a
//! repository the protection did not reach refuses the idmap, and after
//! the job, when every process of it is gone, the supervisor hands every
//! `.git` outside the protected paths (one the job made) to the job's
//! host ids ([`super::sweep`]): git refuses it again ("dubious
//! ownership"). Paths that are protected (mounted read-only over the
//! tree) are not walked: nothing is written there. A tree of more than
//! [`MAX_ENTRIES`] entries is refused rather than walked for ever.

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The most entries walked before the tree is refused.
pub const MAX_ENTRIES: u64 = 2_000_000;

/// How deep the walk goes; deeper trees are refused.
const MAX_DEPTH: usize = 256;

/// What the check found, or why it could not finish: the tree is not
/// idmapped, and the outcome says why.
#[derive(Debug, thiserror::Error)]
pub enum IdmapRefusal {
    #[error("cannot read the tree to check it: {0}")]
    ReadTree(Errno),
    #[error(
        "it is a repository itself (it has a HEAD: git finds it from below, and the job could write \
         its hooks and config, which root's git trusts): bind it read-only"
    )]
    Repository,
    #[error("it is nested deeper than {max} directories ({0})", max = MAX_DEPTH)]
    TooDeep(PathBuf),
    /// `dir`: relative to the tree.
    #[error("cannot list {dir}: {source}")]
    List { dir: String, source: Errno },
    #[error("it holds more than {max} entries, too many to check", max = MAX_ENTRIES)]
    TooMany,
    #[error(
        "it holds a repository, {0}, that is not protected (its hooks and config would be the job's to \
         write, and root's git trusts them): in the workspace, add --protect {0} (or --no-protect); \
         a bind has no protection: bind it read-only"
    )]
    Unprotected(PathBuf),
    #[error("cannot check {path}: {source}")]
    Check { path: PathBuf, source: Errno },
    #[error("it holds a setuid or setgid file, {path} (mode {mode:o}), which the job could rewrite and keep set-id")]
    SetId { path: PathBuf, mode: libc::mode_t },
    #[error(
        "it holds a file with {names} names, {path}: through a second name outside, the job could write a file \
         that is not in the tree"
    )]
    HardLinks { path: PathBuf, names: libc::nlink_t },
    #[error("it holds a file with file capabilities, {0}, which the job could rewrite and keep them")]
    Capabilities(PathBuf),
    #[error(
        "it holds a bare repository, {0} (a directory with a HEAD: git finds it from below; the job could \
         write its hooks and config, and root's git trusts them): move it out, or bind the tree read-only"
    )]
    BareRepository(PathBuf),
    #[error("cannot read the capabilities of {name}: {source}")]
    CapabilitiesUnreadable { name: String, source: std::io::Error },
}

/// Check the tree at `dir` (any fd of the directory, `O_PATH` will do)
/// for what the module refuses, skipping `skip` (paths relative to the
/// tree). `Err` says what was found, as `why` for the outcome.
/// `guard_repos`: the tree's repositories are protected (`skip` has them),
/// so one that is not is refused.
pub fn check(dir: &OwnedFd, owner: (u32, u32), skip: &[PathBuf], guard_repos: bool) -> Result<(), IdmapRefusal> {
    let top = openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(IdmapRefusal::ReadTree)?;
    if guard_repos && is_repository(&top) {
        return Err(IdmapRefusal::Repository);
    }
    let mut seen = 0u64;
    walk(top, Path::new(""), owner, skip, guard_repos, 0, &mut seen)
}

fn walk(
    dir: OwnedFd,
    rel: &Path,
    owner: (u32, u32),
    skip: &[PathBuf],
    guard_repos: bool,
    depth: usize,
    seen: &mut u64,
) -> Result<(), IdmapRefusal> {
    if depth > MAX_DEPTH {
        return Err(IdmapRefusal::TooDeep(rel.to_path_buf()));
    }
    let list_failed = |source| IdmapRefusal::List { dir: shown(rel), source };
    let mut listing = nix::dir::Dir::from_fd(dir).map_err(list_failed)?;
    let fd = listing.as_raw_fd();
    let mut subdirs = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(list_failed)?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        *seen += 1;
        if *seen > MAX_ENTRIES {
            return Err(IdmapRefusal::TooMany);
        }
        let path = rel.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name.to_bytes()));
        if skip.iter().any(|s| s == &path) {
            continue;
        }
        if name.to_bytes() == b".git" && guard_repos {
            // A repository the protection did not reach (nested deeper
            // than it looks): through the idmap the job could plant its
            // hooks or config, which root's git would then run.
            return Err(IdmapRefusal::Unprotected(path));
        }
        // SAFETY: `fd` is the listing's open directory fd, valid while
        // `listing` lives, which it does for this loop.
        let dirfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let st = match fstatat(dirfd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since it was listed: nothing of it can be written.
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(source) => return Err(IdmapRefusal::Check { path, source }),
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFDIR {
            subdirs.push(path);
            continue;
        }
        let owned = st.st_uid == owner.0;
        let group_writable = st.st_gid == owner.1 && st.st_mode & libc::S_IWGRP != 0;
        if !owned && !group_writable {
            continue;
        }
        if kind == SFlag::S_IFREG && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
            return Err(IdmapRefusal::SetId { path, mode: st.st_mode & 0o7777 });
        }
        if st.st_nlink > 1 {
            return Err(IdmapRefusal::HardLinks { path, names: st.st_nlink });
        }
        if kind == SFlag::S_IFREG && has_capabilities(fd, name)? {
            return Err(IdmapRefusal::Capabilities(path));
        }
    }
    for path in subdirs {
        let name = path.file_name().unwrap_or_default();
        // SAFETY: as above: `listing` still owns `fd`.
        let dirfd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let sub = match openat(
            dirfd,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(sub) => sub,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(source) => return Err(IdmapRefusal::Check { path, source }),
        };
        if guard_repos && is_repository(&sub) {
            return Err(IdmapRefusal::BareRepository(path));
        }
        walk(sub, &path, owner, skip, guard_repos, depth + 1, seen)?;
    }
    Ok(())
}

/// Whether git could take the directory `dir` for a repository by its
/// contents: it has an entry named `HEAD`, of any kind. Git's own test
/// (`is_git_directory`) also wants `objects` and `refs`, following links,
/// or found through a `commondir` file; those can be links, or be made
/// later by whoever can write there, so `HEAD` alone decides.
pub(super) fn is_repository(dir: &OwnedFd) -> bool {
    fstatat(dir, "HEAD", AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
}

/// `getxattrat(2)` (Linux 6.13): the number is the same on every
/// architecture that has the common syscall table.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64"))]
const SYS_GETXATTRAT: libc::c_long = 464;

/// `struct xattr_args` of `getxattrat(2)`.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// Set once `getxattrat` is found missing (ENOSYS): the walk then reads
/// through `/proc/self/fd`.
static NO_GETXATTRAT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `name` in the directory `dir` carries `security.capability`,
/// read without following it: `getxattrat` from the directory's fd, or,
/// on kernels before 6.13, `lgetxattr` through the directory's
/// `/proc/self/fd` link (which names that very directory, but costs a
/// lookup of its own, several times a `getxattrat`).
fn has_capabilities(dir: std::os::fd::RawFd, name: &std::ffi::CStr) -> Result<bool, IdmapRefusal> {
    use std::os::unix::ffi::OsStrExt;
    use std::sync::atomic::Ordering;
    // errno first, before anything else can change it.
    let unreadable = || IdmapRefusal::CapabilitiesUnreadable {
        source: std::io::Error::last_os_error(),
        name: std::ffi::OsStr::from_bytes(name.to_bytes()).to_string_lossy().into_owned(),
    };
    let attr = c"security.capability";
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64"))]
    if !NO_GETXATTRAT.load(Ordering::Relaxed) {
        let mut args = XattrArgs { value: 0, size: 0, flags: 0 };
        // SAFETY: `dir` is an open directory fd, `name` and `attr` are
        // NUL-terminated, and `args` is a valid xattr_args of the size
        // given; a zero-size value asks only for the value's size.
        let n = unsafe {
            libc::syscall(
                SYS_GETXATTRAT,
                dir,
                name.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
                attr.as_ptr(),
                std::ptr::addr_of_mut!(args),
                std::mem::size_of::<XattrArgs>(),
            )
        };
        match (n, std::io::Error::last_os_error().raw_os_error()) {
            (n, _) if n >= 0 => return Ok(true),
            (_, Some(libc::ENOSYS)) => NO_GETXATTRAT.store(true, Ordering::Relaxed),
            (_, Some(libc::ENODATA | libc::ENOTSUP | libc::ENOENT)) => return Ok(false),
            (_, _) => return Err(unreadable()),
        }
    }
    let mut path = format!("/proc/self/fd/{dir}/").into_bytes();
    path.extend_from_slice(name.to_bytes());
    path.push(0);
    // SAFETY: both strings are NUL-terminated; a null buffer of size 0
    // asks only for the value's size.
    let n = unsafe { libc::lgetxattr(path.as_ptr().cast(), attr.as_ptr(), std::ptr::null_mut(), 0) };
    if n >= 0 {
        return Ok(true);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) | Some(libc::ENOENT) => Ok(false),
        _ => Err(unreadable()),
    }
}

fn shown(rel: &Path) -> String {
    if rel.as_os_str().is_empty() {
        "its top".into()
    } else {
        rel.display().to_string()
    }
}
