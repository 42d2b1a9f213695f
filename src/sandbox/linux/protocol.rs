//! The wire between the supervisor and its re-exec'd `__init` stage.
//!
//! The supervisor sends one [`InitSpec`] (length-prefixed JSON) over the
//! control socket at fd 3; the init stages answer with newline-delimited
//! [`InitReport`]s on the same socket. Everything the init stage does is decided
//! here, by the supervisor, as data: the init stage only carries it out.

use crate::job::LandlockLayer;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};
use std::path::PathBuf;

/// The control socket's fd number in the `__init` process.
pub const CONTROL_FD: i32 = 3;
/// The sealed memfd holding the compiled seccomp BPF program, when any.
pub const SECCOMP_FD: i32 = 4;
/// Largest spec the init stage accepts.
const MAX_SPEC: usize = 16 * 1024 * 1024;

/// One line of `/proc/PID/uid_map` or `gid_map`: a single id.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdMap {
    pub inside: u32,
    pub outside: u32,
}

/// One step of building the new root, run in order by `mounts::apply`.
/// Paths of `dst` are relative to the new root.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum MountOp {
    /// Bind a host path (file or directory). Read-only unless `rw`.
    Bind {
        src: PathBuf,
        dst: PathBuf,
        rw: bool,
        /// Device nodes keep their dev semantics; everything else is nodev.
        dev: bool,
        /// Skip silently when `src` does not exist (e.g. /lib64 on some distros).
        optional: bool,
        /// `src` is canonical (the CLI resolved it, or it is a toolchain's
        /// real path): any symlink met on the way means it changed since,
        /// and the bind is refused rather than followed.
        #[serde(default)]
        exact: bool,
        /// The source's owner (uid, gid), when those are not the job's
        /// host ids and the source may be idmapped (the workspace, the user's
        /// binds): the outer stage then tries an idmapped mount that shows
        /// the owner's files as the job's own (`namespaces::idmap_userns`),
        /// so what the job creates lands as that owner. None: a plain bind.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idmap: Option<(u32, u32)>,
        /// This bind is the workspace, wherever it is mounted: without
        /// paths to protect in it (`--no-protect`) its repositories are
        /// the job's to change, and are neither checked nor swept.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        workspace: bool,
    },
    /// Recreate a host symlink such as `/bin -> usr/bin`.
    Symlink {
        target: PathBuf,
        dst: PathBuf,
    },
    /// A tmpfs of `size` bytes and at most `inodes` files (0: the kernel's
    /// default, half the RAM's pages).
    Tmpfs {
        dst: PathBuf,
        size: u64,
        mode: u32,
        #[serde(default)]
        inodes: u64,
    },
    Dir {
        dst: PathBuf,
        mode: u32,
    },
    /// A fresh procfs for the new pid namespace.
    Proc {
        dst: PathBuf,
    },
    /// Hide a file by binding /dev/null over it (runc's masked paths).
    MaskFile {
        dst: PathBuf,
    },
    /// Hide a directory under an empty read-only tmpfs.
    MaskDir {
        dst: PathBuf,
    },
    /// Make an existing path of the new root read-only (e.g. /proc/sys).
    ReadOnly {
        dst: PathBuf,
    },
    /// The job's own terminal (`--tty`): the pty that pid 1 has at fd 0 (a
    /// pty of the host's, relayed by the supervisor) is bound alone at
    /// `/dev/console`, where `ttyname` finds it (as runc binds a
    /// container's). `/dev/pts` is the job's own instance ([`MountOp::Devpts`]):
    /// no other terminal of the host is there.
    Terminal,
    /// A private devpts instance (`newinstance`), its `ptmx` open to all
    /// (`ptmxmode=0666`) and at most `max` ptys: the job opens ptys of its
    /// own, and none of the host's.
    Devpts {
        dst: PathBuf,
        max: u32,
    },
    /// Keep a path inside a read-write bind read-only (`.git/hooks` of a
    /// workspace): `path`, relative to the bind at `base`, is reached
    /// without following any symlink and bound read-only onto itself. A
    /// path that does not exist, or is reached only through a symlink, is
    /// left alone (and not reported as protected).
    Protect {
        base: PathBuf,
        path: PathBuf,
    },
}

/// A resource limit applied with setrlimit in the job process.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Rlimit {
    /// `RLIMIT_*` number.
    pub resource: i32,
    pub soft: u64,
    pub hard: u64,
}

/// Landlock rules, as paths inside the new root.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LandlockPlan {
    /// Readable (and executable) trees.
    pub read: Vec<PathBuf>,
    /// Readable and writable trees.
    pub write: Vec<PathBuf>,
    /// Scope abstract unix sockets and signals to the sandbox (ABI >= 6).
    pub scope: bool,
    /// The job has a terminal of its own: `/dev/console` is writable.
    #[serde(default)]
    pub tty: bool,
}

/// Everything the `__init` stage needs, decided by the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub hostname: String,
    /// Create a new network namespace (only `lo`).
    pub new_netns: bool,
    /// The network allowlist's proxy: pid 1 listens on this port of its
    /// loopback (IPv4 and IPv6) and hands the listening sockets to the
    /// supervisor, over the socket that follows the spec on the control
    /// socket (one byte, SCM_RIGHTS), before the job runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_port: Option<u16>,
    pub uid: IdMap,
    pub gid: IdMap,
    /// We are not root on the host: write `deny` to setgroups, map only our ids.
    pub rootless: bool,
    /// Binds an idmap was refused for before the stage ran, `dst: why`
    /// (their source was reached through a symlink).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idmap_refused: Vec<String>,
    /// The job's id and the record of the trees the supervisor opened to
    /// sweep after the job (`sweep`): a read-write idmapped tree must be
    /// the very directory that will be swept, or it is not idmapped (its
    /// path was swapped in between); the outer stage writes the record of
    /// those it idmapped before the job can run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sweep_record: Option<(String, super::sweep::SweepRecord)>,
    pub mounts: Vec<MountOp>,
    /// Files pid 1 writes into the new root (under /tmp) before the job starts.
    #[serde(default)]
    pub files: Vec<crate::job::JobFile>,
    /// `cgroup.procs` files the init stage joins before it creates the sandbox.
    pub cgroup_procs: Vec<PathBuf>,
    pub rlimits: Vec<Rlimit>,
    pub landlock: Option<LandlockPlan>,
    /// Name of the seccomp profile whose BPF is at [`SECCOMP_FD`].
    pub seccomp: Option<String>,
    pub allow_degraded: bool,
    /// The job process waits for [`RELEASE`] on the control socket before
    /// its execve (after landlock and seccomp are in force).
    #[serde(default)]
    pub hold: bool,
    /// The host uid that creates (and owns) the job's user namespace: a
    /// dedicated one, so that what the job allocates there is charged to
    /// it and not to root (`namespaces::AsOwner`). None: the supervisor's
    /// own uid (rootless).
    #[serde(default)]
    pub userns_owner: Option<u32>,
    /// The job's stdin is a terminal of its own (a pty the supervisor
    /// relays): it becomes the controlling terminal of the job's session,
    /// at `/dev/console`. Otherwise the job has no terminal but the ptys
    /// it opens in its own `/dev/pts`.
    #[serde(default)]
    pub tty: bool,
    /// A warm sandbox's spec: only its base ([`InitSpec::split`]). The
    /// stages build it and wait, before the pivot, for the request's
    /// [`RequestPart`] on the control socket; it never runs anything
    /// before then.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warm: bool,
    /// A warm sandbox's outer stage makes the idmap namespaces of these
    /// owners (uid, gid) while it waits: the owners whose trees the last
    /// request of its shape had idmapped, likely the next one's too. Not
    /// part of the shape ([`InitSpec::base_key`]); a request of another
    /// owner has its namespace made on its path, as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub idmap_owners: Vec<(u32, u32)>,
}

/// What a warm sandbox learns when its request arrives: everything of
/// the [`InitSpec`] that is the request's and not the sandbox's.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPart {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// The workspace, the user's binds and the paths to protect in them,
    /// mounted after the base, in this order.
    pub mounts: Vec<MountOp>,
    pub files: Vec<crate::job::JobFile>,
    pub rlimits: Vec<Rlimit>,
    pub landlock: Option<LandlockPlan>,
    pub hold: bool,
    pub idmap_refused: Vec<String>,
    pub sweep_record: Option<(String, super::sweep::SweepRecord)>,
    /// The nice value the job starts with: the sandbox was built at a
    /// lower priority, so as not to slow the jobs running meanwhile. The
    /// outer stage, host root, gives pid 1 this one (never below 0).
    pub nice: i32,
    /// The job's standard streams follow the part on the control socket
    /// (one byte, [`STREAMS`], carrying stdin, stdout and stderr): a
    /// `confine run` through a server gives the job its caller's pipes,
    /// not the ones the sandbox was built with.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streams: bool,
}

/// The byte that carries a warm sandbox's job's streams
/// ([`RequestPart::streams`]).
pub const STREAMS: u8 = b's';

impl MountOp {
    /// Whether this step is the request's (the workspace, the user's and
    /// the runtime's binds, all resolved for it, and the paths to protect
    /// in them) rather than the sandbox's own.
    pub fn is_request(&self) -> bool {
        matches!(self, MountOp::Bind { exact: true, .. } | MountOp::Protect { .. })
    }
}

impl InitSpec {
    /// Split into the sandbox's base, which does not depend on the
    /// request, and the request's part. The request's mounts keep their
    /// order and come after the base's: none of them is under a mount of
    /// the base but where the plan already puts it after that mount (a
    /// bind under /tmp), so the root is the same as the whole spec's.
    pub fn split(mut self) -> (InitSpec, RequestPart) {
        let (request, base): (Vec<MountOp>, Vec<MountOp>) = self.mounts.drain(..).partition(MountOp::is_request);
        self.mounts = base;
        let part = RequestPart {
            argv: std::mem::take(&mut self.argv),
            env: std::mem::take(&mut self.env),
            cwd: std::mem::take(&mut self.cwd),
            mounts: request,
            files: std::mem::take(&mut self.files),
            rlimits: std::mem::take(&mut self.rlimits),
            landlock: self.landlock.take(),
            hold: std::mem::take(&mut self.hold),
            idmap_refused: std::mem::take(&mut self.idmap_refused),
            sweep_record: self.sweep_record.take(),
            nice: 0,
            streams: false,
        };
        (self, part)
    }

    /// The whole spec again: the base this is, with `part` in.
    pub fn join(&mut self, part: RequestPart) {
        self.argv = part.argv;
        self.env = part.env;
        self.cwd = part.cwd;
        self.mounts.extend(part.mounts);
        self.files = part.files;
        self.rlimits = part.rlimits;
        self.landlock = part.landlock;
        self.hold = part.hold;
        self.idmap_refused = part.idmap_refused;
        self.sweep_record = part.sweep_record;
    }

    /// What two bases must share for one's sandbox to serve the other's
    /// request: all of it but the cgroups it joins and the owner of its
    /// user namespace (each sandbox has its own) and the flag that makes
    /// it warm.
    pub fn base_key(&self) -> Vec<u8> {
        let mut key = self.clone();
        key.cgroup_procs.clear();
        key.warm = false;
        key.idmap_owners.clear();
        // Each job's user namespace has a dedicated owner of its own,
        // drawn at random (`namespaces::AsOwner`).
        key.userns_owner = key.userns_owner.map(|_| 0);
        serde_json::to_vec(&key).unwrap_or_default()
    }
}

/// The byte the supervisor sends to let a held job execve.
pub const RELEASE: u8 = b'g';

/// What the init stages tell the supervisor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", tag = "type")]
pub enum InitReport {
    /// Sandbox is built; pid 1 of the new pid namespace has this host pid.
    Started { pid1: i32 },
    /// Sent by the job process right before execve. `protected`: the paths
    /// of [`MountOp::Protect`] that were made read-only.
    Confined {
        landlock: LandlockLayer,
        seccomp: Option<String>,
        missing: Vec<String>,
        /// The job ran in a user namespace of its own, where every mount
        /// of the sandbox is locked (`namespaces::clone_nested`).
        #[serde(default)]
        mounts_locked: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        protected: Vec<String>,
        /// Mount points that were idmapped.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        idmapped: Vec<String>,
        /// Mount points whose idmap was asked for but not made, each as
        /// `path: why`; they were bound plainly.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        not_idmapped: Vec<String>,
    },
    /// The command could not be executed (errno from execve or lookup).
    ExecFailed { errno: i32, command: String },
    /// Building the sandbox failed; `step` names the step.
    SetupFailed { step: String, error: String },
    /// The job's main process ended. `tmp_out`: what its /tmp had run
    /// out of then, as pid 1 measured it (the supervisor measures again
    /// after the tree is dead when it could hold the tmpfs itself, which a
    /// rootless one can't).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tmp_out: Option<TmpOut>,
    },
    /// The outer stage's watchdog reached the job's deadline (`signals`):
    /// the job is sent SIGTERM, and killed a grace later.
    TimedOut,
}

/// What a job's /tmp ran out of ([`super::mounts::tmp_out`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum TmpOut {
    /// No block left.
    Space,
    /// No inode left, of `total`.
    Files { total: u64 },
}

pub fn write_spec(w: &mut impl Write, spec: &impl Serialize) -> io::Result<()> {
    let body = serde_json::to_vec(spec).map_err(io::Error::other)?;
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)
}

/// The byte that carries the proxy's socket after the spec.
pub const PROXY_SOCKET: u8 = b'p';
/// The supervisor's answer on the proxy's socket once it serves the
/// listeners; anything else is why it could not.
pub const PROXY_READY: &[u8] = b"ready";

pub fn read_spec<T: serde::de::DeserializeOwned>(r: &mut impl Read) -> io::Result<T> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_SPEC {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "spec too large"));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Encode one report as a single line (one `write`, so lines never interleave).
pub fn encode_report(report: &InitReport) -> Vec<u8> {
    let mut line = serde_json::to_vec(report).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_round_trips() {
        let spec = InitSpec {
            argv: vec!["true".into()],
            env: vec![("PATH".into(), "/usr/bin".into())],
            cwd: "/tmp".into(),
            hostname: "h".into(),
            new_netns: true,
            proxy_port: None,
            uid: IdMap { inside: 1000, outside: 1000 },
            gid: IdMap { inside: 1000, outside: 1000 },
            rootless: false,
            mounts: vec![MountOp::Proc { dst: "proc".into() }],
            files: vec![],
            cgroup_procs: vec![],
            rlimits: vec![],
            landlock: None,
            seccomp: None,
            allow_degraded: false,
            hold: true,
            tty: false,
            userns_owner: None,
            idmap_refused: Vec::new(),
            sweep_record: None,
            idmap_owners: Vec::new(),
            warm: false,
        };
        let mut buf = Vec::new();
        write_spec(&mut buf, &spec).unwrap();
        let back: InitSpec = read_spec(&mut buf.as_slice()).unwrap();
        assert_eq!(back.argv, spec.argv);
        assert_eq!(back.mounts, spec.mounts);
    }

    #[test]
    fn report_is_one_line() {
        let line = encode_report(&InitReport::Exited { code: Some(3), signal: None, tmp_out: None });
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let r: InitReport = serde_json::from_slice(&line).unwrap();
        assert_eq!(r, InitReport::Exited { code: Some(3), signal: None, tmp_out: None });
    }
}
