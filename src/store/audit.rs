//! The audit trail: one record per request, allowed or denied, in a sled
//! tree, hash-chained so that `confine audit verify` finds the first record
//! that was edited, removed or reordered.
//!
//! Each record holds the policy's `auditHash` and its own `recordHash`:
//! SHA-256 of the record's canonical JSON (without `recordHash`), which
//! includes `prevHash`, the previous record's `recordHash`. Appends are one
//! sled transaction (records, id index and chain head together), so
//! concurrent callers can't fork the chain, and are flushed before
//! [`AuditSink::append`] returns. Records are never rewritten here.
//!
//! Old records are sealed: once 2 × [`SEAL_BLOCK`] records are live, the
//! oldest [`SEAL_BLOCK`] move, byte for byte, into one gzip block of their
//! JSON lines, and their ids leave the id index, in one transaction. A
//! store is then a few pages bigger per thousand records instead of about
//! seventy, and every start of sled reads, loads and writes back a table
//! of its pages: without sealing, each `confine exec` paid for the whole
//! history. `verify`, `export`, `list` and `get` read blocks and live
//! records as one chain; an edit inside a block breaks it as before.
//!
//! No record, no job: before a job is let run, its entry is written, and
//! flushed, to the pending tree ([`AuditLog::begin`]); its record's append
//! takes it out, in the same transaction. Whatever stops that record (the
//! supervisor killed, a job that filled the disk the store is on), the
//! next open of the store turns each pending entry into a record of its
//! own, marked unfinished ([`AuditLog::open`]): a job that ran is never
//! missing from the trail.

use super::{Store, StoreError};
use crate::job::{Outcome, Status};
use crate::policy::input::{canonical_json, sha256_hex, PolicyInput};
use crate::policy::Decision;
use serde::{Deserialize, Serialize};
use sled::transaction::{ConflictableTransactionError, TransactionError, Transactional};

/// Records, keyed by big-endian sequence number.
pub const RECORDS_TREE: &str = "audit";
/// Job id → sequence number.
pub const IDS_TREE: &str = "audit_ids";
/// The chain head: the last sequence number and record hash.
pub const META_TREE: &str = "audit_meta";
const HEAD_KEY: &[u8] = b"head";
/// Sealed records: the block's first sequence number (big-endian) → gzip
/// of its records' stored JSON, one per line, oldest first.
pub const BLOCKS_TREE: &str = "audit_blocks";
/// Records per sealed block.
pub const SEAL_BLOCK: u64 = 1024;
/// Job id → the entry of a job let run whose record is not appended yet.
pub const PENDING_TREE: &str = "audit_pending";
/// [`AuditEntry::note`] of a record made from a pending entry (its start
/// time follows).
pub const UNFINISHED_NOTE: &str =
    "unfinished: the job was let run, and the supervisor stopped (or could not write) before its end was recorded";
/// [`AuditEntry::note`] of a record written after its job was answered
/// (the disk was full then: the answer said the record was not written).
pub const RECORDED_LATE_NOTE: &str = "recorded late: the job's answer said its record could not be written";

/// `prevHash` of the first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Errors of the audit trail.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("audit record {seq} is unreadable: {message} (run `confine audit verify`)")]
    Corrupt { seq: u64, message: String },
    #[error("no audit record with id '{0}' (list them with `confine audit ls`)")]
    NotFound(String),
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
}

/// What the supervisor knows about one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEntry {
    /// The job id the response names.
    pub id: String,
    pub repo_id: Option<String>,
    pub runtime: String,
    pub operation: String,
    pub executable: String,
    /// SHA-256 of the canonical JSON array of args (args may hold secrets).
    pub args_sha256: String,
    pub cwd: String,
    pub allowed: bool,
    pub deny_reasons: Vec<String>,
    pub policy_digest: String,
    pub audit_hash: String,
    pub status: Status,
    pub duration_ms: u64,
    pub queued_ms: u64,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// An allowlisted job's connections through its proxy, allowed or denied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::job::NetworkReport>,
    /// Why the record is not the job's whole story ([`UNFINISHED_NOTE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl AuditEntry {
    /// The entry of a decided request; a denied one is complete as it is.
    pub fn decided(id: &str, input: &PolicyInput, decision: &Decision) -> AuditEntry {
        let args = serde_json::Value::from(input.args.clone());
        AuditEntry {
            repo_id: input.repo_id.clone(),
            runtime: input.runtime.clone(),
            operation: input.operation.clone(),
            executable: input.command.clone(),
            args_sha256: sha256_hex(canonical_json(&args).as_bytes()),
            cwd: input.cwd.clone(),
            allowed: decision.allowed,
            deny_reasons: decision.deny_reasons.clone(),
            policy_digest: decision.policy_digest.clone(),
            audit_hash: decision.audit_hash.clone(),
            status: Status::Denied,
            ..AuditEntry::bare(id)
        }
    }

    /// An allowed entry that knows nothing but its id.
    pub fn bare(id: &str) -> AuditEntry {
        AuditEntry {
            id: id.to_string(),
            repo_id: None,
            runtime: String::new(),
            operation: String::new(),
            executable: String::new(),
            args_sha256: String::new(),
            cwd: String::new(),
            allowed: true,
            deny_reasons: Vec::new(),
            policy_digest: String::new(),
            audit_hash: String::new(),
            status: Status::Failure,
            duration_ms: 0,
            queued_ms: 0,
            exit_code: None,
            signal: None,
            stdout_bytes: 0,
            stderr_bytes: 0,
            network: None,
            note: None,
        }
    }

    /// Fill in how the job ended.
    pub fn finished(mut self, outcome: &Outcome, stdout_bytes: u64, stderr_bytes: u64) -> AuditEntry {
        self.status = outcome.status;
        self.duration_ms = outcome.duration_ms;
        self.queued_ms = outcome.queued_ms;
        self.exit_code = outcome.exit_code;
        self.signal = outcome.signal;
        self.stdout_bytes = stdout_bytes;
        self.stderr_bytes = stderr_bytes;
        self.network = outcome.network.clone();
        self
    }
}

/// A stored record: the entry, its place in the chain and its hashes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditRecord {
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds.
    pub timestamp: String,
    #[serde(flatten)]
    pub entry: AuditEntry,
    pub prev_hash: String,
    pub record_hash: String,
}

impl AuditRecord {
    /// SHA-256 of the canonical JSON of this record without `recordHash`.
    pub fn compute_hash(&self) -> String {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        if let Some(obj) = v.as_object_mut() {
            obj.remove("recordHash");
        }
        sha256_hex(canonical_json(&v).as_bytes())
    }
}

/// Where audit records go. Today a sled chain; a SIEM forwarder or a
/// central log can implement this without the supervisor noticing.
pub trait AuditSink: Send + Sync {
    /// Store the record durably (flushed) and return it as stored.
    fn append(&self, entry: AuditEntry) -> Result<AuditRecord, AuditError>;
}

/// The first broken link `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BrokenLink {
    pub seq: u64,
    pub id: Option<String>,
    pub reason: String,
}

/// The result of walking the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    /// Records checked before the walk stopped.
    pub records: u64,
    pub first_broken: Option<BrokenLink>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.first_broken.is_none()
    }
}

/// The sled-backed audit trail.
#[derive(Clone)]
pub struct AuditLog {
    store: Store,
    records: sled::Tree,
    ids: sled::Tree,
    meta: sled::Tree,
    blocks: sled::Tree,
    pending: sled::Tree,
    /// Records per sealed block: [`SEAL_BLOCK`], smaller in tests.
    block_len: u64,
}

#[derive(Serialize, Deserialize)]
struct Head {
    seq: u64,
    hash: String,
    /// Records `1..=sealed` are in blocks (absent before sealing existed).
    #[serde(default)]
    sealed: u64,
}

/// One stored record, in chain order: where it was found and its JSON.
enum Stored {
    Record {
        seq: u64,
        json: Vec<u8>,
    },
    /// A block that did not decompress: the records from `seq` on are lost.
    BadBlock {
        seq: u64,
        message: String,
    },
}

impl AuditLog {
    /// Open the trail, and append a record, marked unfinished, for each
    /// job that was let run and never recorded. The store's lock makes
    /// this process its only writer: what is pending now is a dead one's.
    pub fn open(store: &Store) -> Result<AuditLog, AuditError> {
        let log = AuditLog {
            store: store.clone(),
            records: store.tree(RECORDS_TREE)?,
            ids: store.tree(IDS_TREE)?,
            meta: store.tree(META_TREE)?,
            blocks: store.tree(BLOCKS_TREE)?,
            pending: store.tree(PENDING_TREE)?,
            block_len: SEAL_BLOCK,
        };
        // Best effort: on a full disk the trail still reads (the entries
        // stay pending, and no job is admitted without room anyway).
        match log.record_unfinished() {
            Ok(0) => {}
            Ok(n) => tracing::warn!(recovered = n, "jobs let run and never recorded: recorded as unfinished"),
            Err(e) => tracing::warn!(error = %e, "jobs let run and never recorded stay pending"),
        }
        Ok(log)
    }

    /// Write `entry` (its job about to be let run) as pending, flushed:
    /// when this fails, the job must not run. The pending entry carries
    /// the unfinished note with the start time, for the record it becomes
    /// if nothing else does.
    pub fn begin(&self, entry: &AuditEntry) -> Result<(), AuditError> {
        let mut pending = entry.clone();
        pending.note = Some(format!("{UNFINISHED_NOTE} (let run at {})", rfc3339_utc(std::time::SystemTime::now())));
        let json = serde_json::to_vec(&pending).map_err(|e| AuditError::Corrupt { seq: 0, message: e.to_string() })?;
        self.store.check_room_for_records()?;
        self.pending.insert(entry.id.as_bytes(), json).map_err(|e| self.store.failed_with(e.into()))?;
        self.store.flush()?;
        Ok(())
    }

    /// Jobs let run and not yet recorded.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Append a record for each pending entry, marked unfinished; returns
    /// how many. An entry that does not decode still leaves its job id.
    fn record_unfinished(&self) -> Result<usize, AuditError> {
        let mut n = 0;
        for kv in self.pending.iter() {
            let (k, v) = kv.map_err(StoreError::Db)?;
            let id = String::from_utf8_lossy(&k).into_owned();
            let mut entry = serde_json::from_slice::<AuditEntry>(&v).unwrap_or_else(|_| AuditEntry::bare(&id));
            entry.id = id;
            entry.status = Status::Failure;
            if !entry.note.as_deref().is_some_and(|n| n.starts_with(UNFINISHED_NOTE)) {
                entry.note = Some(UNFINISHED_NOTE.to_string());
            }
            self.append(entry)?;
            n += 1;
        }
        Ok(n)
    }

    /// The same log, sealing blocks of `block_len` records (tests).
    #[doc(hidden)]
    pub fn with_block_len(mut self, block_len: u64) -> AuditLog {
        self.block_len = block_len.max(1);
        self
    }

    /// The head stored as `bytes`, or the empty chain's.
    fn parse_head(bytes: Option<sled::IVec>) -> Result<Head, AuditError> {
        match bytes {
            Some(b) => serde_json::from_slice(&b)
                .map_err(|e| AuditError::Corrupt { seq: 0, message: format!("chain head: {e}") }),
            None => Ok(Head { seq: 0, hash: GENESIS.to_string(), sealed: 0 }),
        }
    }

    /// The chain head as a transaction on the meta tree sees it.
    fn head_in(meta: &sled::transaction::TransactionalTree) -> Result<Head, ConflictableTransactionError<AuditError>> {
        Self::parse_head(meta.get(HEAD_KEY)?).map_err(ConflictableTransactionError::Abort)
    }

    fn head(&self) -> Result<Head, AuditError> {
        Self::parse_head(self.meta.get(HEAD_KEY).map_err(StoreError::from)?)
    }

    /// The lines of the block stored under `key`, oldest first.
    fn block_lines(key: &[u8], body: &[u8]) -> Result<Vec<Vec<u8>>, AuditError> {
        use std::io::Read;
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(body)
            .read_to_end(&mut text)
            .map_err(|e| AuditError::Corrupt { seq: Self::seq_of(key), message: format!("sealed block: {e}") })?;
        Ok(text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect())
    }

    /// Every stored record, oldest first: the sealed blocks', then the
    /// live ones. A block's records are numbered from its key on.
    fn stored_in_order(&self) -> impl Iterator<Item = Result<Stored, AuditError>> + '_ {
        let sealed = self.blocks.iter().flat_map(|kv| -> Vec<Result<Stored, AuditError>> {
            let (k, v) = match kv {
                Ok(kv) => kv,
                Err(e) => return vec![Err(StoreError::from(e).into())],
            };
            let first = Self::seq_of(&k);
            match Self::block_lines(&k, &v) {
                Ok(lines) => {
                    lines.into_iter().zip(first..).map(|(json, seq)| Ok(Stored::Record { seq, json })).collect()
                }
                Err(e) => vec![Ok(Stored::BadBlock { seq: first, message: e.to_string() })],
            }
        });
        let live = self.records.iter().map(|kv| {
            let (k, v) = kv.map_err(StoreError::from)?;
            Ok(Stored::Record { seq: Self::seq_of(&k), json: v.to_vec() })
        });
        sealed.chain(live)
    }

    /// Whether enough records are live for [`AuditLog::seal`] to seal a
    /// block (a read of the chain head).
    pub fn seal_due(&self) -> Result<bool, AuditError> {
        let head = self.head()?;
        Ok(head.seq.saturating_sub(head.sealed) >= 2 * self.block_len)
    }

    /// Seal the oldest live records into blocks while 2 × the block length
    /// are live, and flush. Returns how many records were sealed. A gap in
    /// the live records stops it: a broken chain is left as it is, for
    /// `verify` to report.
    pub fn seal(&self) -> Result<u64, AuditError> {
        let mut sealed = 0;
        let result = self.seal_blocks(&mut sealed);
        if sealed > 0 {
            self.store.flush()?;
        }
        result.map(|()| sealed)
    }

    /// [`AuditLog::seal`]'s blocks, counted in `sealed` as they commit.
    fn seal_blocks(&self, sealed: &mut u64) -> Result<(), AuditError> {
        loop {
            self.store.check_room_for_records()?;
            let head = self.head()?;
            if head.seq.saturating_sub(head.sealed) < 2 * self.block_len {
                return Ok(());
            }
            let (first, last) = (head.sealed + 1, head.sealed + self.block_len);
            let mut body = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            let mut ids = Vec::new();
            let mut expected = first;
            for kv in self.records.range(first.to_be_bytes()..=last.to_be_bytes()) {
                let (k, v) = kv.map_err(StoreError::from)?;
                let seq = Self::seq_of(&k);
                if seq != expected {
                    break;
                }
                let record = Self::decode(seq, &v)?;
                ids.push(record.entry.id);
                std::io::Write::write_all(&mut body, &v)?;
                std::io::Write::write_all(&mut body, b"\n")?;
                expected += 1;
            }
            if expected != last + 1 {
                tracing::warn!(seq = expected, "audit record missing: not sealing (run `confine audit verify`)");
                return Ok(());
            }
            let body = body.finish()?;
            let moved =
                (&self.records, &self.ids, &self.meta, &self.blocks).transaction(|(records, id_tree, meta, blocks)| {
                    let now = Self::head_in(meta)?;
                    if now.sealed != head.sealed || now.seq < last {
                        // Another sealer took this block: look again.
                        return Ok(false);
                    }
                    for seq in first..=last {
                        records.remove(&seq.to_be_bytes())?;
                    }
                    for id in &ids {
                        id_tree.remove(id.as_bytes())?;
                    }
                    blocks.insert(&first.to_be_bytes(), body.as_slice())?;
                    let new_head = Head { sealed: last, ..now };
                    let json = serde_json::to_vec(&new_head).map_err(|e| {
                        ConflictableTransactionError::Abort(AuditError::Corrupt { seq: 0, message: e.to_string() })
                    })?;
                    meta.insert(HEAD_KEY, json)?;
                    Ok(true)
                });
            match moved {
                Ok(true) => *sealed += self.block_len,
                Ok(false) => {}
                Err(TransactionError::Abort(e)) => return Err(e),
                Err(TransactionError::Storage(e)) => return Err(self.store.failed_with(StoreError::Db(e)).into()),
            }
        }
    }

    fn decode(seq: u64, bytes: &[u8]) -> Result<AuditRecord, AuditError> {
        serde_json::from_slice(bytes).map_err(|e| AuditError::Corrupt { seq, message: e.to_string() })
    }

    fn seq_of(key: &[u8]) -> u64 {
        key.try_into().map(u64::from_be_bytes).unwrap_or(u64::MAX)
    }

    /// The newest `limit` records, newest first.
    pub fn list(&self, limit: usize) -> Result<Vec<AuditRecord>, AuditError> {
        let mut out = Vec::new();
        for kv in self.records.iter().rev().take(limit) {
            let (k, v) = kv.map_err(StoreError::from)?;
            out.push(Self::decode(Self::seq_of(&k), &v)?);
        }
        for kv in self.blocks.iter().rev() {
            if out.len() >= limit {
                break;
            }
            let (k, v) = kv.map_err(StoreError::from)?;
            let first = Self::seq_of(&k);
            for (i, json) in Self::block_lines(&k, &v)?.iter().enumerate().rev() {
                if out.len() >= limit {
                    break;
                }
                out.push(Self::decode(first + i as u64, json)?);
            }
        }
        Ok(out)
    }

    /// The record of job `id`: from the id index while it is live, else
    /// by looking through the sealed blocks, newest first.
    pub fn get(&self, id: &str) -> Result<AuditRecord, AuditError> {
        if let Some(seq) = self.ids.get(id).map_err(StoreError::from)? {
            if let Some(bytes) = self.records.get(&seq).map_err(StoreError::from)? {
                return Self::decode(Self::seq_of(&seq), &bytes);
            }
        }
        let needle = serde_json::to_string(id).map(|q| format!("\"id\":{q}")).unwrap_or_default();
        for kv in self.blocks.iter().rev() {
            let (k, v) = kv.map_err(StoreError::from)?;
            let first = Self::seq_of(&k);
            for (seq, json) in (first..).zip(Self::block_lines(&k, &v)?) {
                if !json.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    continue;
                }
                let record = Self::decode(seq, &json)?;
                if record.entry.id == id {
                    return Ok(record);
                }
            }
        }
        Err(AuditError::NotFound(id.into()))
    }

    /// Number of records, sealed and live.
    pub fn len(&self) -> usize {
        let sealed = self.head().map_or(0, |h| h.sealed);
        sealed as usize + self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty() && self.head().map_or(0, |h| h.sealed) == 0
    }

    /// Walk the chain from the first record and report the first broken
    /// link: an unreadable or edited record, a gap, a wrong `prevHash`, or a
    /// head that doesn't match the last record (records removed at the end).
    pub fn verify(&self) -> Result<VerifyReport, AuditError> {
        let mut prev_hash = GENESIS.to_string();
        let mut expected_seq = 1u64;
        let mut checked = 0u64;
        let broken = |seq, id, reason: String, checked| {
            Ok(VerifyReport { records: checked, first_broken: Some(BrokenLink { seq, id, reason }) })
        };
        for stored in self.stored_in_order() {
            let (seq, v) = match stored? {
                Stored::Record { seq, json } => (seq, json),
                Stored::BadBlock { seq, message } => {
                    return broken(seq, None, format!("unreadable: {message}"), checked)
                }
            };
            let record = match Self::decode(seq, &v) {
                Ok(r) => r,
                Err(e) => return broken(seq, None, format!("unreadable: {e}"), checked),
            };
            let id = Some(record.entry.id.clone());
            if seq != expected_seq || record.seq != seq {
                return broken(
                    seq,
                    id,
                    format!("expected record {expected_seq} here (records removed or moved)"),
                    checked,
                );
            }
            if record.prev_hash != prev_hash {
                return broken(seq, id, "prevHash does not match the previous record".into(), checked);
            }
            if record.compute_hash() != record.record_hash {
                return broken(seq, id, "recordHash does not match the record's contents (edited)".into(), checked);
            }
            checked += 1;
            prev_hash = record.record_hash;
            expected_seq += 1;
        }
        let head: Option<Head> = match self.meta.get(HEAD_KEY).map_err(StoreError::from)? {
            Some(b) => serde_json::from_slice(&b).ok(),
            None => None,
        };
        let last = expected_seq - 1;
        match head {
            None if last == 0 => {}
            Some(h) if h.seq == last && h.hash == prev_hash => {}
            _ => {
                return broken(
                    last + 1,
                    None,
                    "the chain head does not match the last record (records removed at the end)".into(),
                    checked,
                )
            }
        }
        Ok(VerifyReport { records: checked, first_broken: None })
    }

    /// Write every record as one JSON line, oldest first (for SIEM ingestion).
    pub fn export_jsonl(&self, out: &mut dyn std::io::Write) -> Result<u64, AuditError> {
        let mut n = 0;
        for stored in self.stored_in_order() {
            let record = match stored? {
                Stored::Record { seq, json } => Self::decode(seq, &json)?,
                Stored::BadBlock { seq, message } => return Err(AuditError::Corrupt { seq, message }),
            };
            let line = serde_json::to_string(&record)
                .map_err(|e| AuditError::Corrupt { seq: record.seq, message: e.to_string() })?;
            writeln!(out, "{line}")?;
            n += 1;
        }
        out.flush()?;
        Ok(n)
    }
}

impl AuditSink for AuditLog {
    fn append(&self, entry: AuditEntry) -> Result<AuditRecord, AuditError> {
        let timestamp = rfc3339_utc(std::time::SystemTime::now());
        self.append_flushed(entry, timestamp)
    }
}

impl AuditLog {
    /// [`AuditSink::append`]'s transaction and flush.
    fn append_flushed(&self, entry: AuditEntry, timestamp: String) -> Result<AuditRecord, AuditError> {
        self.store.check_room_for_records()?;
        let result =
            (&self.records, &self.ids, &self.meta, &self.pending).transaction(|(records, ids, meta, pending)| {
                let head = Self::head_in(meta)?;
                let mut record = AuditRecord {
                    seq: head.seq + 1,
                    timestamp: timestamp.clone(),
                    entry: entry.clone(),
                    prev_hash: head.hash,
                    record_hash: String::new(),
                };
                record.record_hash = record.compute_hash();
                let abort = |e: serde_json::Error| {
                    ConflictableTransactionError::Abort(AuditError::Corrupt { seq: record.seq, message: e.to_string() })
                };
                let key = record.seq.to_be_bytes();
                records.insert(&key, serde_json::to_vec(&record).map_err(abort)?)?;
                ids.insert(record.entry.id.as_bytes(), &key)?;
                let new_head = Head { seq: record.seq, hash: record.record_hash.clone(), sealed: head.sealed };
                meta.insert(HEAD_KEY, serde_json::to_vec(&new_head).map_err(abort)?)?;
                pending.remove(record.entry.id.as_bytes())?;
                Ok(record)
            });
        let record = match result {
            Ok(r) => r,
            Err(TransactionError::Abort(e)) => return Err(e),
            Err(TransactionError::Storage(e)) => return Err(self.store.failed_with(StoreError::Db(e)).into()),
        };
        crate::crashpoint::reached("audit-committed");
        self.store.flush()?;
        crate::crashpoint::reached("audit-flushed");
        Ok(record)
    }
}

/// `2026-05-20T12:34:56.789Z`.
pub fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let ms = t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let (days, rem) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s, milli) = (rem / 3_600_000, rem / 60_000 % 60, rem / 1000 % 60, rem % 1000);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests;
