//! The store: opening, configuration, flow A (`execute`) and the claim half of flow B (`begin`).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use redb::{ReadableDatabase, ReadableTable, StorageBackend, WriteTransaction};

use crate::engine::background::Background;
use crate::engine::commit::{Durable, Group, GroupConfig, Step};
use crate::engine::expiry::{put_in, remove_in};
use crate::engine::lease::Begin;
use crate::engine::lease::Lease;
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::signal::Signal;
use crate::engine::sweep::{SweepReport, SweepTotals};
use crate::engine::tables::{EXPIRY, META, META_FORMAT, RECORDS};
use crate::engine::tx::{Origin, Tx};
use crate::error::{Abort, Error};
use crate::model::clock::{Clock, SystemClock, Timestamp};
use crate::model::record::{FORMAT_VERSION, HolderToken, Record, State};
use crate::model::response::{Outcome, Response, Tombstone};
use crate::model::retention::{Retention, RetentionPolicy, Windows};
use crate::model::rules::{Decision, decide};
use crate::model::scope::{Limits, Request, Scope, record_key};

/// Settings, fixed when the store opens. See [`StoreBuilder`] for defaults.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub retention: Retention,
    pub retention_overrides: HashMap<String, Retention>,
    pub tombstone_horizon: Duration,
    pub lease_duration: Duration,
    pub retry_after_cap: Duration,
    pub limits: Limits,
    pub max_response_bytes: usize,
    pub sweep_interval: Option<Duration>,
    pub sweep_batch: usize,
    pub inbox_retention: Duration,
}

impl Config {
    /// The response window and the forget horizon of `operation`'s records, counted from the
    /// moment an intent finishes. The horizon is never shorter than the response window.
    pub(crate) fn windows_for(&self, operation: &str) -> Windows {
        let r = self
            .retention_overrides
            .get(operation)
            .unwrap_or(&self.retention);
        let horizon = r.horizon.unwrap_or(self.tombstone_horizon);
        Windows {
            response: r.response,
            forget: horizon.max(r.response),
        }
    }
}

/// Builds a [`Store`]. Every setting has a documented default:
///
/// | setting | default |
/// |---|---|
/// | [`retention`](Self::retention) / [`retention_policy`](Self::retention_policy) | 24 h (Stripe keeps keys ≥ 24 h) |
/// | [`retention_for`](Self::retention_for) / [`retention_policy_for`](Self::retention_policy_for) | none (per-operation override) |
/// | [`tombstone_horizon`](Self::tombstone_horizon) | 7 days |
/// | [`sweep_interval`](Self::sweep_interval) | off: no background sweeper (call [`Store::sweep`]) |
/// | [`sweep_batch`](Self::sweep_batch) | 1,000 records per sweep write transaction |
/// | [`lease_duration`](Self::lease_duration) | 30 s |
/// | [`retry_after_cap`](Self::retry_after_cap) | 1 s |
/// | [`limits`](Self::limits) | key ≤ 255 B, tenant ≤ 128 B, operation ≤ 128 B |
/// | [`max_response_bytes`](Self::max_response_bytes) | 64 KiB |
/// | [`clock`](Self::clock) | [`SystemClock`] |
/// | [`cache_size`](Self::cache_size) | redb's default |
/// | [`durability`](Self::durability) | [`Durability::Immediate`]: fsync before every answer |
/// | [`max_batch`](Self::max_batch) | 1,024 requests per shared commit |
/// | [`max_queue`](Self::max_queue) | 4,096 requests waiting for the next commit |
/// | [`queue_timeout`](Self::queue_timeout) | 5 s, then [`Error::Busy`] |
/// | [`multi_process`](Self::multi_process) | off: one process opens the file |
/// | [`inbox_retention`](Self::inbox_retention) | 7 days (inbox marks and webhook receipts) |
///
/// Three ways to open a file:
///
/// | open | missing file | empty (0-byte) file | redb file without idem's marker | writes |
/// |---|---|---|---|---|
/// | [`open`](Self::open) | new store | new store | made an idem store | yes (recovers a crashed file) |
/// | [`open_existing`](Self::open_existing) | [`Error::Storage`] | [`Error::CorruptStore`] | [`Error::CorruptStore`] (the file untouched, unless a crash left it to recover) | yes (recovers a crashed file) |
/// | [`open_read_only`](Self::open_read_only) | [`Error::Storage`] | [`Error::CorruptStore`] | [`Error::CorruptStore`] | never ([`Error::NeedsRecovery`] for a crashed file) |
///
/// An empty file is a new store for [`open`](Self::open) because a service may create the file
/// before the store opens it (`tempfile`, `touch`, a deployment step). A damaged file is
/// [`Error::CorruptStore`] for all three, never a panic: a panic redb raises while reading
/// damaged pages is contained (docs/design.md, "Damaged files").
#[derive(Debug, Clone)]
pub struct StoreBuilder {
    config: Config,
    clock: Arc<dyn Clock>,
    cache_size: Option<usize>,
    durability: Durability,
    group: GroupConfig,
    multi_process: bool,
}

/// When a committed answer is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Every commit is fsynced before any caller in its batch gets an answer. An answer you
    /// received survives any crash. The default.
    Immediate,
    /// Commits are not fsynced; a background thread fsyncs every `interval` (and the store
    /// fsyncs when its last handle is dropped). **Loss window:** if the process or the machine
    /// dies, the answers of the commits made in the last `interval` before the crash (plus the
    /// time one fsync takes) may be lost, together with the caller writes of those same
    /// transactions. What is lost is lost whole: a lost flow-A intent lost its effect too and
    /// runs again on retry (no double effect); a lost flow-B completion is retried and reaches
    /// the provider with the same downstream key. Not available with
    /// [`StoreBuilder::multi_process`].
    Periodic(Duration),
}

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            config: Config {
                retention: Retention::plain(Duration::from_secs(24 * 3600)),
                retention_overrides: HashMap::new(),
                tombstone_horizon: Duration::from_secs(7 * 24 * 3600),
                lease_duration: Duration::from_secs(30),
                retry_after_cap: Duration::from_secs(1),
                limits: Limits::default(),
                max_response_bytes: 64 * 1024,
                sweep_interval: None,
                sweep_batch: 1000,
                inbox_retention: Duration::from_secs(7 * 24 * 3600),
            },
            clock: Arc::new(SystemClock),
            cache_size: None,
            durability: Durability::Immediate,
            group: GroupConfig {
                max_batch: 1024,
                max_queue: 4096,
                queue_timeout: Duration::from_secs(5),
            },
            multi_process: false,
        }
    }
}

impl StoreBuilder {
    /// A builder with the defaults above.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a finished record is replayed in full after it finished (its response
    /// window); then it is a tombstone until the [`tombstone_horizon`](Self::tombstone_horizon).
    /// Choose the longest of your client-retry, queue-redrive, webhook-replay, operator-replay
    /// and settlement windows, or state them with [`retention_policy`](Self::retention_policy).
    /// Must be at least the lease duration.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = Retention::plain(retention);
        self
    }

    /// A retention for one operation, overriding [`retention`](Self::retention). Its tombstone
    /// horizon is the store's.
    pub fn retention_for(mut self, operation: impl Into<String>, retention: Duration) -> Self {
        self.config
            .retention_overrides
            .insert(operation.into(), Retention::plain(retention));
        self
    }

    /// The default retention as named windows: the longest one is the retention. A horizon set
    /// on the policy replaces the store's [`tombstone_horizon`](Self::tombstone_horizon) for
    /// operations without an override.
    pub fn retention_policy(mut self, policy: RetentionPolicy) -> Self {
        self.config.retention = Retention::of(&policy);
        self
    }

    /// The retention of one operation as named windows, overriding the default.
    pub fn retention_policy_for(
        mut self,
        operation: impl Into<String>,
        policy: RetentionPolicy,
    ) -> Self {
        self.config
            .retention_overrides
            .insert(operation.into(), Retention::of(&policy));
        self
    }

    /// How long after an intent finished its key stays bound, counted like the retention. After
    /// the response window the record is a tombstone (fingerprint, status, resource pointer, no
    /// body) until this horizon: a late retry gets [`Outcome::Expired`] instead of running
    /// again, and a different payload is still [`Error::PayloadMismatch`]. After it the key is
    /// free. A horizon not longer than an operation's retention means no tombstone phase for
    /// it. Default 7 days.
    pub fn tombstone_horizon(mut self, horizon: Duration) -> Self {
        self.config.tombstone_horizon = horizon;
        self
    }

    /// Runs a sweep pass ([`Store::sweep`]) every `interval` on a background thread, which
    /// stops when the last handle to the store is dropped. Default: no background sweeper.
    pub fn sweep_interval(mut self, interval: Duration) -> Self {
        self.config.sweep_interval = Some(interval);
        self
    }

    /// The most records one sweep write transaction shrinks or deletes (a claim waits behind at
    /// most one such batch). Default 1,000.
    pub fn sweep_batch(mut self, records: usize) -> Self {
        self.config.sweep_batch = records;
        self
    }

    /// How long a flow-B lease lives without a heartbeat.
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.config.lease_duration = lease;
        self
    }

    /// The longest `retry_after` hint given with an in-flight answer (the hint is the lease's
    /// remaining time, capped by this).
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.config.retry_after_cap = cap;
        self
    }

    /// Size limits on tenant, operation and key.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// The largest stored response (body plus resource pointer), in bytes.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.config.max_response_bytes = bytes;
        self
    }

    /// The clock every expiry and lease decision reads (inject a [`crate::ManualClock`] in
    /// tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// redb's page cache size in bytes.
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = Some(bytes);
        self
    }

    /// When a committed answer reaches the disk (see [`Durability`] for the exact loss window
    /// of the relaxed mode).
    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// The most requests that share one write transaction and one fsync.
    pub fn max_batch(mut self, requests: usize) -> Self {
        self.group.max_batch = requests;
        self
    }

    /// The most requests that may wait for the next commit; beyond it callers block up to
    /// [`queue_timeout`](Self::queue_timeout), then get [`Error::Busy`].
    pub fn max_queue(mut self, requests: usize) -> Self {
        self.group.max_queue = requests;
        self
    }

    /// How long a caller waits for room in a full queue before [`Error::Busy`].
    pub fn queue_timeout(mut self, wait: Duration) -> Self {
        self.group.queue_timeout = wait;
        self
    }

    /// Lets several processes open the same file at once (redb's `MultiWriter` mode, Linux,
    /// macOS and Windows). Each process batches its own callers; processes take turns for the
    /// writer. Requires [`Durability::Immediate`].
    pub fn multi_process(mut self, enabled: bool) -> Self {
        self.multi_process = enabled;
        self
    }

    /// How long an inbox mark ([`Store::process`]) or a webhook receipt ([`Store::receive`])
    /// keeps answering `Duplicate` after the message was processed; then [`Store::sweep`]
    /// removes it and a redelivery would be processed again. Choose it longer than the
    /// longest redelivery window of the broker or webhook sender (GitHub: 3 days). Default
    /// 7 days.
    pub fn inbox_retention(mut self, retention: Duration) -> Self {
        self.config.inbox_retention = retention;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.group.max_batch == 0 || self.group.max_queue == 0 {
            return Err(Error::Config {
                reason: "max_batch and max_queue must be at least 1".into(),
            });
        }
        if let Durability::Periodic(interval) = self.durability {
            if interval.is_zero() {
                return Err(Error::Config {
                    reason: "Durability::Periodic needs a non-zero interval; use Durability::Immediate to fsync every commit".into(),
                });
            }
            if self.multi_process {
                return Err(Error::Config {
                    reason: "Durability::Periodic is not available with multi_process: redb refuses non-durable commits when several processes share a file".into(),
                });
            }
        }
        let c = &self.config;
        c.limits.validate()?;
        if c.lease_duration.is_zero() {
            return Err(Error::Config {
                reason: "lease_duration is zero; give leases time to finish (default 30 s)".into(),
            });
        }
        let retentions = std::iter::once((None, &c.retention)).chain(
            c.retention_overrides
                .iter()
                .map(|(op, r)| (Some(op.as_str()), r)),
        );
        for (operation, r) in retentions {
            if r.response < c.lease_duration {
                let whose = match operation {
                    None => "the default retention".to_owned(),
                    Some(op) => format!("the retention of operation {op:?}"),
                };
                let window = match r.window {
                    Some(_) if r.response.is_zero() => " (its policy sets no window)".to_owned(),
                    Some(w) => format!(" (its longest window is {w})"),
                    None => String::new(),
                };
                return Err(Error::Config {
                    reason: format!(
                        "{whose} is {:?}{window}, shorter than the lease duration ({:?}): a record must outlive its lease; lengthen the retention or shorten the lease",
                        r.response, c.lease_duration
                    ),
                });
            }
        }
        if c.inbox_retention.is_zero() {
            return Err(Error::Config {
                reason: "inbox_retention is zero; inbox marks must outlive the broker's redelivery window (default 7 days)".into(),
            });
        }
        if c.sweep_batch == 0 {
            return Err(Error::Config {
                reason: "sweep_batch is 0; a sweep must be allowed at least one record per transaction (default 1,000)".into(),
            });
        }
        if c.sweep_interval.is_some_and(|i| i.is_zero()) {
            return Err(Error::Config {
                reason: "sweep_interval is zero; give the background sweeper a period (e.g. one minute), or leave it unset and call Store::sweep".into(),
            });
        }
        if c.max_response_bytes > MAX_RESPONSE_CEILING {
            return Err(Error::Config {
                reason: format!(
                    "max_response_bytes is {}; the ceiling is {MAX_RESPONSE_CEILING}: store a pointer instead of a large body",
                    c.max_response_bytes
                ),
            });
        }
        Ok(())
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Database::builder();
        if let Some(bytes) = self.cache_size {
            b.set_cache_size(bytes);
        }
        if self.multi_process {
            b.set_concurrency_mode(redb::ConcurrencyMode::MultiWriter);
        }
        b
    }

    /// Opens (or creates) the store file at `path`.
    ///
    /// A missing file and an **empty (0-byte) file** are both a new store: a service may create
    /// the file before the store opens it (with `tempfile`, `touch`, or a deployment step), and
    /// idem initialises it. Any other file must be an idem store: a file that is not a redb
    /// database, or that redb finds damaged, is [`Error::CorruptStore`] (and left as it was).
    /// Use [`open_existing`](Self::open_existing) to refuse to create a store, and
    /// [`open_read_only`](Self::open_read_only) to read a file without writing it.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store, Error> {
        self.validate()?;
        let path = path.as_ref();
        contain_open(|| {
            let db = self.redb_builder().create(path).map_err(open_error)?;
            Store::init(db, self, Create::Yes)
        })
    }

    /// Opens an existing store for writing, like [`open`](Self::open), but never creates one:
    /// a missing file is [`Error::Storage`] (not found), and an empty file or a redb database
    /// without idem's format marker is [`Error::CorruptStore`] ("not an idem store"), each left
    /// as it was: the marker is checked through a read-only open before the file is opened for
    /// writing (which rewrites redb's header). Only a file left by a crash, which does not open
    /// read-only, is recovered first — redb's recovery writes — and its marker checked after.
    /// For operators' tools (the `idem` CLI), which must not turn a wrong path into a new store.
    pub fn open_existing(self, path: impl AsRef<Path>) -> Result<Store, Error> {
        self.validate()?;
        let path = path.as_ref();
        contain_open(|| {
            refuse_empty(path)?;
            // Any failure of the read-only open (a crashed file, another process holding it) is
            // left to the open for writing to handle or report, as before.
            if let Ok(db) = self.redb_builder().open_read_only(path) {
                check_marker(&db.begin_read().map_err(unlatched)?)?;
            }
            let db = self.redb_builder().open(path).map_err(open_error)?;
            Store::init(db, self, Create::No)
        })
    }

    /// Opens an existing store for reading only: nothing is ever written to the file (no
    /// open-time commit, no recovery), and redb's shared lock is taken instead of the exclusive
    /// one, so several readers may open the file at once — but not while a process has it open
    /// for writing (that open fails with [`Error::Storage`], "already open"), except in
    /// [`multi_process`](Self::multi_process) mode, where the reader shares the file with the
    /// writers and sees their commits.
    ///
    /// Refused, each with the file left as it was:
    /// - a missing file ([`Error::Storage`], not found);
    /// - an empty file, a file that is not a redb database, or a redb database without idem's
    ///   format marker ([`Error::CorruptStore`]: not an idem store);
    /// - a file that was not closed cleanly ([`Error::NeedsRecovery`]): redb must recover it,
    ///   which writes; open it for writing once (the service, [`StoreBuilder::open`]) or check a
    ///   copy (`idem check`).
    ///
    /// Settings that only concern writes (retention, leases, durability, sweeps, group commit)
    /// are ignored; the clock, the limits and the cache size apply.
    pub fn open_read_only(self, path: impl AsRef<Path>) -> Result<ReadOnlyStore, Error> {
        let path = path.as_ref();
        contain_open(|| {
            refuse_empty(path)?;
            let db = self
                .redb_builder()
                .open_read_only(path)
                .map_err(open_error)?;
            check_marker(&db.begin_read().map_err(unlatched)?)?;
            Ok(ReadOnlyStore::new(db, self.clock, self.config.limits))
        })
    }

    /// Opens (or creates) a store on a custom redb storage backend (an in-memory or
    /// fault-injecting backend in tests).
    pub fn open_with_backend(self, backend: impl StorageBackend) -> Result<Store, Error> {
        self.validate()?;
        contain_open(|| {
            let db = self
                .redb_builder()
                .create_with_backend(backend)
                .map_err(open_error)?;
            Store::init(db, self, Create::Yes)
        })
    }
}

/// Whether opening may write idem's tables and format marker into a redb file without them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Create {
    Yes,
    No,
}

/// An empty file is not a store (for the opens that never create one). redb would say so too,
/// but in its own words; this names the case.
fn refuse_empty(path: &Path) -> Result<(), Error> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == 0 => Err(Error::CorruptStore {
            reason: "the file is empty (0 bytes): not an idem store".into(),
        }),
        // Anything else (a missing file, a directory, no permission) is redb's open to report.
        _ => Ok(()),
    }
}

/// Opening a file: a panic raised by redb while it reads a damaged file (its header, its
/// allocator state, idem's metadata table) is [`Error::CorruptStore`], never a panic of the
/// caller. Nothing of the caller runs inside.
fn contain_open<T>(open: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_storage_panic(open).unwrap_or_else(|p| Err(p.into_error("opening the file")))
}

/// What opening the file failed with. A file that is not a redb database, is shorter than its
/// own header says, or that redb's recovery found damaged is [`Error::CorruptStore`]: retrying
/// never helps, and the message says what to do. A read-only open of a file that needs
/// recovery is [`Error::NeedsRecovery`]. Anything else (permissions, a missing directory, the
/// file already open, a failing disk) stays [`Error::Storage`].
fn open_error(e: redb::DatabaseError) -> Error {
    use std::io::ErrorKind;
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if matches!(io.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) =>
        {
            Error::CorruptStore {
                reason: format!("the file is not a readable redb database: {io}"),
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => Error::CorruptStore {
            reason: format!("redb found the file damaged: {what}"),
        },
        redb::DatabaseError::RepairAborted => Error::NeedsRecovery,
        redb::DatabaseError::UpgradeRequired(version) => Error::CorruptStore {
            reason: format!(
                "the file is in redb's file format {version}, which this redb (4.x) does not read; upgrade it with the redb release that wrote it"
            ),
        },
        other => unlatched(other),
    }
}

/// Ceiling for `max_response_bytes`: records are meant to be small.
const MAX_RESPONSE_CEILING: usize = 16 * 1024 * 1024;

/// Granularity of `begin_wait`'s polling (it is also woken at once by local completions).
const WAIT_POLL: Duration = Duration::from_millis(20);

/// The state every clone of a [`Store`] shares. Its fields are private to this file: the rest of
/// the crate reaches them through the small accessors on [`Store`].
pub(crate) struct Inner {
    db: redb::Database,
    config: Config,
    clock: Arc<dyn Clock>,
    /// The first I/O or commit failure; once set, every write is refused (fail-stop).
    failure: Mutex<Option<String>>,
    /// Random per-instance prefix of holder tokens.
    instance: [u8; 8],
    next_token: AtomicU64,
    /// Lease events so far: bumped and broadcast (`lease_changed`) after every commit that
    /// finished, released or removed a lease (`lease_event`), so `begin_wait` wakes at once.
    lease_events: Mutex<u64>,
    lease_changed: Condvar,
    /// The group-commit state.
    group: Group,
    durability: Durability,
    /// A non-durable commit happened since the flusher last looked.
    unflushed: AtomicBool,
    /// The flusher and sweeper threads.
    background: Background,
    /// Held for the length of a sweep pass: one pass at a time.
    sweep_lock: Mutex<()>,
    /// Sweep figures for [`Metrics`].
    sweeps: Mutex<SweepTotals>,
    /// Notified after a commit whose closure announced work ([`Tx::announce`]): the hook the
    /// layers above wait on (the outbox dispatcher).
    work: Arc<Signal>,
    /// The layers' own state, one value per type ([`Store::extension`]).
    extensions: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// Checks idem's format marker from a read transaction: a redb file without it is not an idem
/// store.
pub(crate) fn check_marker(read: &redb::ReadTransaction) -> Result<(), Error> {
    let not_a_store = || Error::CorruptStore {
        reason: "the file is a redb database without idem's format marker: not an idem store"
            .into(),
    };
    let meta = match read.open_table(META) {
        Ok(meta) => meta,
        Err(redb::TableError::TableDoesNotExist(_)) => return Err(not_a_store()),
        Err(e) => return Err(unlatched(e)),
    };
    match meta.get(META_FORMAT).map_err(unlatched)? {
        Some(marker) => format_marker(marker.value()),
        None => Err(not_a_store()),
    }
}

/// The stored format marker must be this build's format version.
fn format_marker(marker: &[u8]) -> Result<(), Error> {
    match marker {
        [v] if *v == FORMAT_VERSION => Ok(()),
        [v] => Err(Error::UnsupportedFormat {
            found: *v,
            supported: FORMAT_VERSION,
        }),
        other => Err(Error::CorruptStore {
            reason: format!("format marker is {} bytes, expected 1", other.len()),
        }),
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.background.stop();
        // Relaxed durability: make every acknowledged commit durable on close. No other handle
        // exists any more, so this is the only writer.
        if self.unflushed.load(Ordering::Acquire) && self.failure.lock().is_none() {
            let db = &self.db;
            // A drop must not panic: redb failing on a damaged file here loses nothing that
            // was acknowledged as durable (this commit only raises durability).
            let _ = catch_unwind(AssertUnwindSafe(|| {
                if let Ok(mut txn) = db.begin_write() {
                    let _ = txn.set_durability(redb::Durability::Immediate);
                    let _ = txn.commit();
                }
            }));
        }
    }
}

// ---- The storage boundary: panics from redb on damaged data ----
//
// redb 4.6 trusts the bytes of its pages: a damaged length or offset in a page can make it index
// out of bounds or unwrap a decoding error (e.g. a table name that is not UTF-8) instead of
// returning `StorageError::Corrupted`. idem runs every redb call on stored data — the open, every
// read path, the work of every write batch, the commit protocol's steps, the integrity check,
// compaction — inside `catch_unwind`, and turns such a panic into `Error::CorruptStore`
// (latching fail-stop when it happened inside a write). Caller code that runs inside those
// sections (a closure, the `Clock`, a progress callback) runs through `caller_code`, which wraps
// a panic unwinding out of it in `CallerPanic`; the boundary unwraps it and resumes the caller's
// own payload, exactly as it was. The mark travels with the panic itself, so a panic the caller
// caught inside its own code leaves nothing behind that could misclassify a later one.

/// The payload of a panic that unwound out of caller code inside a storage section: the caller's
/// own payload, carried to the boundary, which resumes it unchanged.
struct CallerPanic(Box<dyn Any + Send>);

/// Runs caller-supplied code (a closure, the clock, a callback) inside a storage section: a panic
/// from it is marked as the caller's, so the boundary lets it continue. Only ever called inside a
/// storage section (`catch_storage_panic`), which unwraps the mark: outside one, the caller would
/// see the wrapper instead of its own payload.
pub(crate) fn caller_code<T>(f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        if payload.is::<CallerPanic>() {
            // Already marked (caller code nested in caller code): one mark is enough.
            std::panic::resume_unwind(payload)
        }
        std::panic::resume_unwind(Box::new(CallerPanic(payload)))
    })
}

/// A panic caught at the storage boundary.
pub(crate) enum Panicked {
    /// It unwound out of caller code: the caller's own payload, to be resumed as it is.
    Caller(Box<dyn Any + Send>),
    /// It came from redb (or the storage backend, or idem's own code) reading the file: its
    /// message.
    Storage(String),
}

impl Panicked {
    /// What the caller gets: a storage panic is [`Error::CorruptStore`] (`while` says what idem
    /// was doing); a caller's panic continues unwinding.
    pub(crate) fn into_error(self, while_: &str) -> Error {
        match self {
            Panicked::Caller(payload) => std::panic::resume_unwind(payload),
            Panicked::Storage(message) => damaged(while_, &message),
        }
    }
}

/// The [`Error::CorruptStore`] of a storage panic. The boundary cannot tell a damaged page from
/// a bug in redb or idem, so the message names both, and the way to tell them apart. It warns
/// against the usual remedy for a damaged file: an older copy of an idempotency store re-opens
/// every key completed since it was taken.
pub(crate) fn damaged(while_: &str, message: &str) -> Error {
    Error::CorruptStore {
        reason: format!(
            "redb or idem panicked while {while_} (a damaged page, or a bug): {message}; run `idem check` on a copy: if it passes, this is a bug — report it, and do not restore an older copy of the store (every intent completed since then would run again)"
        ),
    }
}

/// A read path at the storage boundary: a panic redb raises on damaged data while `f` runs is
/// [`Error::CorruptStore`] (reads change nothing, so no fail-stop); a panic in caller code inside
/// `f` (run through [`caller_code`]) continues unwinding.
pub(crate) fn contained<T>(while_: &str, f: impl FnOnce() -> Result<T, Error>) -> Result<T, Error> {
    catch_storage_panic(f).unwrap_or_else(|p| Err(p.into_error(while_)))
}

/// Runs `f` (idem code calling redb) and catches a panic, telling the caller's apart: it is the
/// caller's exactly when it unwound out of [`caller_code`].
pub(crate) fn catch_storage_panic<T>(f: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| match payload.downcast::<CallerPanic>() {
        Ok(caller) => Panicked::Caller(caller.0),
        Err(payload) => Panicked::Storage(panic_message(payload.as_ref())),
    })
}

/// The text of a panic payload (`panic!` gives a `&str` or a `String`).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    match (
        payload.downcast_ref::<&str>(),
        payload.downcast_ref::<String>(),
    ) {
        (Some(s), _) => (*s).to_owned(),
        (_, Some(s)) => s.clone(),
        _ => "no message".to_owned(),
    }
}

/// Performance counters since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Metrics {
    /// Write transactions committed by the group-commit path.
    pub commits: u64,
    /// Requests answered by those commits (claims, completions, heartbeats, releases, …).
    pub committed_requests: u64,
    /// Batches re-run because one member's closure failed after writing.
    pub reruns: u64,
    /// Callers turned away with [`Error::Busy`].
    pub busy: u64,
    /// Callers waiting for the next commit at the moment of the snapshot.
    pub queued: usize,
    /// Sweep passes run (by [`Store::sweep`] or the background sweeper), failed ones included.
    pub sweep_passes: u64,
    /// Records deleted or shrunk to tombstones by all passes.
    pub swept_records: u64,
    /// Sweep passes that returned an error.
    pub sweep_failures: u64,
    /// The last pass: records swept by it, its batches and its duration.
    pub last_sweep: SweepReport,
}

impl Metrics {
    /// Average requests per commit (0 before the first commit).
    pub fn average_batch(&self) -> f64 {
        if self.commits == 0 {
            0.0
        } else {
            self.committed_requests as f64 / self.commits as f64
        }
    }
}

/// An embedded idempotency store on one redb file. Cheap to clone (clones share the file);
/// `Send + Sync`.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

/// A handle that does not keep the store open: a background thread holds one between ticks,
/// so dropping the last [`Store`] clone closes the file.
#[derive(Clone)]
pub(crate) struct WeakStore(Weak<Inner>);

impl WeakStore {
    /// The store, if a [`Store`] clone still keeps it open.
    pub(crate) fn upgrade(&self) -> Option<Store> {
        self.0.upgrade().map(|inner| Store { inner })
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.inner.config)
            .field("failure", &*self.inner.failure.lock())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) a store at `path` with the default settings. A missing or empty
    /// file becomes a new store; see [`StoreBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<Store, Error> {
        StoreBuilder::new().open(path)
    }

    /// A builder for non-default settings.
    pub fn builder() -> StoreBuilder {
        StoreBuilder::new()
    }

    fn init(db: redb::Database, b: StoreBuilder, create: Create) -> Result<Store, Error> {
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        if create == Create::No {
            // Before any write: a redb file without idem's tables is not turned into a store.
            check_marker(&db.begin_read().map_err(unlatched)?)?;
        }
        // Create the tables and check (or write) the format marker. Nothing was acknowledged
        // yet and no store exists to latch: a failure here is a plain storage error (open
        // again).
        let txn = db.begin_write().map_err(unlatched)?;
        {
            let mut meta = txn.open_table(META).map_err(unlatched)?;
            let found = meta
                .get(META_FORMAT)
                .map_err(unlatched)?
                .map(|v| v.value().to_vec());
            match found.as_deref() {
                None => {
                    meta.insert(META_FORMAT, [FORMAT_VERSION].as_slice())
                        .map_err(unlatched)?;
                }
                Some(marker) => format_marker(marker)?,
            }
            txn.open_table(RECORDS).map_err(unlatched)?;
            txn.open_table(EXPIRY).map_err(unlatched)?;
        }
        txn.commit().map_err(unlatched)?;
        let store = Store::new(db, b.config, b.clock, b.durability, b.group, instance);
        store.start_background()?;
        Ok(store)
    }

    /// Counters since open: the commit path (commits, requests per commit, re-runs, callers
    /// turned away, queue length) and the sweeps (passes, records swept, failures, the last
    /// pass's figures and duration). Reads in-memory counters only, no I/O. For record counts by
    /// state see [`Store::stats`].
    pub fn metrics(&self) -> Metrics {
        let c = &self.group().counters;
        let sweeps = self.sweep_totals();
        Metrics {
            commits: c.commits.load(Ordering::Relaxed),
            committed_requests: c.committed_ops.load(Ordering::Relaxed),
            reruns: c.reruns.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            queued: self.group().queued(),
            sweep_passes: sweeps.passes,
            swept_records: sweeps.swept,
            sweep_failures: sweeps.failures,
            last_sweep: sweeps.last,
        }
    }

    /// Compacts the file: redb moves live pages to the front and truncates the free space at
    /// the end. Returns whether anything was moved.
    ///
    /// **When it is worth it.** Rarely. redb reuses freed pages, so under a steady load with
    /// sweeps running the file stops growing by itself and compaction gains little. Call it
    /// after the file held far more records than it does now — a traffic spike, a backlog that
    /// a first sweep cleared, a retention you shortened — and you want the disk space back:
    /// run [`Store::sweep`] first, then compact (compare the file's size before and after).
    /// It rewrites much of the file with durable commits, and nothing else can use the store
    /// meanwhile, so do it at a quiet moment (e.g. at startup, before handing out clones).
    ///
    /// It needs the store to itself: `&mut self`, no other clone of this `Store`, no live
    /// [`Lease`], and no read transaction from [`Store::begin_read`]; otherwise it does nothing
    /// and returns [`Error::InUse`]. Background threads are stopped for its duration and
    /// restarted after. A fail-stopped store must be reopened first.
    pub fn compact(&mut self) -> Result<bool, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        self.check_writable()?;
        // Background threads hold `Weak`s, which `Arc::get_mut` refuses too.
        self.stop_background();
        let compacted = self.compact_exclusive();
        let restarted = self.start_background();
        let compacted = compacted?;
        restarted?;
        Ok(compacted)
    }

    /// Runs redb's full integrity check of the file (and repairs it if it can), plus idem's own
    /// check that the expiry index matches the records. Returns `Ok(true)` if the file passed,
    /// `Ok(false)` if redb found damage and repaired it, and [`Error::ExpiryIndexMismatch`] if
    /// redb's pages passed (or were repaired) but the expiry index disagrees with the records
    /// (no fail-stop; a damage or a panic while reading them is [`Error::CorruptStore`]). Slow:
    /// for operators who suspect the file was modified outside idem, not for normal operation
    /// (crash recovery is automatic). Like [`Store::compact`], it needs the only handle
    /// ([`Error::InUse`] otherwise), and a fail-stopped store must be reopened first
    /// ([`Error::FailStopped`]).
    ///
    /// **Run it on a copy when you suspect damage.** If redb cannot repair the file, this returns
    /// [`Error::CorruptStore`] and the store is fail-stopped; redb has then marked the file for
    /// repair, so it **will not open again** — even when the damage was one page and every other
    /// record still read correctly before the check. (The next unclean shutdown of such a file
    /// has the same effect: redb verifies page checksums only when it repairs.) `idem check`
    /// checks a copy and leaves the file untouched unless given `--in-place`. A record value that
    /// no longer matches its own checksum is found without this check: reading it gives
    /// [`Error::CorruptRecord`].
    pub fn check_integrity(&mut self) -> Result<bool, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        // After an I/O failure redb's in-memory state is stale: only a reopen rebuilds it.
        self.check_writable()?;
        self.stop_background();
        let checked = self.check_integrity_exclusive();
        let restarted = self.start_background();
        let passed = checked?;
        restarted?;
        match self.expiry_index_verdict()? {
            Ok(()) => Ok(passed),
            Err(reason) => Err(Error::ExpiryIndexMismatch {
                reason,
                repaired: !passed,
            }),
        }
    }

    fn check_integrity_exclusive(&mut self) -> Result<bool, Error> {
        let db = self.exclusive_db("check_integrity")?;
        let checked = match catch_storage_panic(|| db.check_integrity()) {
            Ok(checked) => checked,
            Err(p) => {
                // redb may have discarded its allocator state before it stopped.
                return Err(self.latch_damage(p.into_error("running the integrity check")));
            }
        };
        checked.map_err(|e| match e {
            redb::DatabaseError::TransactionInProgress => Error::InUse {
                operation: "check_integrity",
                reason: "a read transaction (Store::begin_read) is still open".into(),
            },
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => {
                // redb discarded its allocator state: no write may follow on this handle.
                self.latch(&what);
                Error::CorruptStore {
                    reason: format!(
                        "redb's integrity check failed and could not repair the file ({what}); the file is now marked for repair and will not open again"
                    ),
                }
            }
            other => self.storage(other),
        })
    }

    fn compact_exclusive(&mut self) -> Result<bool, Error> {
        let db = self.exclusive_db("compact")?;
        let result = match catch_storage_panic(|| db.compact()) {
            Ok(result) => result,
            Err(p) => {
                // Compaction moves pages with durable commits: stop writing after a failure.
                return Err(self.latch_damage(p.into_error("compacting the file")));
            }
        };
        if result.is_ok() {
            // Compaction commits durably, which makes every earlier commit durable too.
            self.set_unflushed(false);
        }
        result.map_err(|e| match e {
            redb::CompactionError::TransactionInProgress => Error::InUse {
                operation: "compact",
                reason: "a read transaction (Store::begin_read) is still open".into(),
            },
            redb::CompactionError::Storage(e) => self.storage(e),
            other => self.storage(other),
        })
    }

    /// Flow A: runs `f` at most once per intent, in the same write transaction that records the
    /// result.
    ///
    /// - a finished intent is replayed from a read transaction: `f` does not run, no write
    ///   transaction is opened, the stored status and body come back byte for byte;
    /// - otherwise `f` runs inside the write transaction, after the record was re-read under
    ///   redb's writer lock (no check-then-act gap), and its result decides what commits:
    ///   `Ok(response)` → Completed; [`Abort::Terminal`] → Failed (replayed later);
    ///   [`Abort::Retryable`] / [`Abort::Store`] → nothing, not even `f`'s own writes;
    /// - an intent that finished longer ago than its retention, within the tombstone horizon →
    ///   [`Outcome::Expired`]: `f` does not run (the intent already happened);
    /// - another attempt's live lease → [`Outcome::InFlight`];
    /// - the key used with a different payload → [`Error::PayloadMismatch`].
    ///
    /// `f` may be called more than once per call: concurrent calls share one write transaction
    /// (group commit), and when another caller's closure in that transaction fails, the
    /// transaction is rolled back and `f` runs again in a fresh one. It must therefore only have
    /// effects through the [`Tx`]: only the committed run's writes persist, and only its
    /// result is returned.
    ///
    /// A replay normally comes from a read transaction. If the intent finishes while this call
    /// waits for redb's writer lock, the replay is read inside that write transaction, which
    /// writes nothing (if no other caller in it wrote, it is aborted: no fsync).
    pub fn execute<F>(&self, request: Request, mut f: F) -> Result<Outcome, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &key)? {
            return early.into_outcome();
        }
        let windows = self.inner.config.windows_for(request.scope().operation());
        let mut took_over = false;
        let mut announced = false;
        let outcome = self.write(Durable::AsConfigured, |txn, now| {
            let created_at = match self.decide_in(txn, &request, &key, now) {
                Ok(Claimed::Free {
                    created_at,
                    attempt,
                }) => {
                    took_over = attempt > 1;
                    created_at
                }
                Ok(Claimed::Early(early)) => return Step::Clean(early.into_outcome()),
                Err(e) => return Step::Clean(Err(e)),
            };
            let origin = Origin::record(&key, created_at);
            let (result, pushed) = self.run_on_tx(txn, now, origin, &mut f);
            announced = pushed;
            let (state, response) = match self.settle(result) {
                Ok(settled) => settled,
                Err(e) => return Step::Abort(e),
            };
            let record = Record {
                fingerprint: *request.fingerprint(),
                created_at,
                expires_at: now.saturating_add(windows.response),
                forget_at: now.saturating_add(windows.forget),
                state,
            };
            match self.put(txn, &key, &record) {
                Ok(()) => Step::Done(Ok(Outcome::Executed(response))),
                Err(e) => Step::Abort(e),
            }
        });
        if announced && outcome.is_ok() {
            self.announce_work();
        }
        let outcome = outcome?;
        if took_over && outcome.is_ok() {
            // This finished a lapsed flow-B lease: wake its waiters.
            self.lease_event();
        }
        outcome
    }

    /// Flow B: claims the key with a lease for work that calls the outside world. Returns
    /// [`Begin::Acquired`] with a [`Lease`] (the attempt may now make the external call, using
    /// [`Lease::downstream_key`]), or the stored result ([`Begin::Replayed`], or
    /// [`Begin::Expired`] past the retention), or [`Begin::InFlight`]; a different
    /// payload is [`Error::PayloadMismatch`]. Fails fast; see [`Store::begin_wait`] to wait.
    pub fn begin(&self, request: Request) -> Result<Begin, Error> {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &key)? {
            return early.into_begin();
        }
        let config = &self.inner.config;
        let retention = config.windows_for(request.scope().operation()).response;
        let claimed = self.write(Durable::AsConfigured, |txn, now| {
            let (created_at, attempt) = match self.decide_in(txn, &request, &key, now) {
                Ok(Claimed::Free {
                    created_at,
                    attempt,
                }) => (created_at, attempt),
                Ok(Claimed::Early(early)) => return Step::Clean(Err(early)),
                Err(e) => return Step::Clean(Err(Early::Error(e))),
            };
            let holder = self.new_token();
            let lease_deadline = now.saturating_add(config.lease_duration);
            // A lease that never finishes leaves no tombstone: forget_at = expires_at, never
            // before the lease deadline (so a live lease is never absent, nor swept).
            let expires_at = now.saturating_add(retention).max(lease_deadline);
            let record = Record {
                fingerprint: *request.fingerprint(),
                created_at,
                expires_at,
                forget_at: expires_at,
                state: State::Pending {
                    holder,
                    lease_deadline,
                    attempt,
                },
            };
            match self.put(txn, &key, &record) {
                Ok(()) => Step::Done(Ok((holder, lease_deadline, attempt))),
                Err(e) => Step::Abort(e),
            }
        })?;
        // The Lease is built only after the commit: a Lease releases its key on drop, so one
        // must never exist for a claim that did not commit.
        match claimed {
            Ok((holder, deadline, attempt)) => Ok(Begin::Acquired(Lease::new(
                self.clone(),
                request,
                key,
                holder,
                deadline,
                attempt,
            ))),
            Err(early) => early.into_begin(),
        }
    }

    /// Like [`Store::begin`], but when another attempt is in flight, waits up to `max_wait` for
    /// it to finish (returning its result), release (acquiring the key) or lapse (taking it
    /// over). Returns [`Begin::InFlight`] if it is still in flight after `max_wait`. Woken at
    /// once when a lease of this store is finished, released or purged; re-checks every 20 ms
    /// to notice a lapsing lease or another process's commit. `Duration::MAX` waits without a
    /// deadline. Refused with [`Error::Reentrant`] inside a closure of the same store (the
    /// holder could never finish while this thread holds the writer).
    pub fn begin_wait(&self, request: Request, max_wait: Duration) -> Result<Begin, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        // `None`: a wait so long that the deadline is not representable, i.e. no deadline.
        let give_up = Instant::now().checked_add(max_wait);
        loop {
            let seen = self.lease_events_seen();
            match self.begin(request.clone())? {
                Begin::InFlight { retry_after } => {
                    let now = Instant::now();
                    let slice = match give_up {
                        Some(t) if now >= t => return Ok(Begin::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL),
                        None => WAIT_POLL,
                    };
                    self.wait_for_lease_event(seen, slice);
                }
                other => return Ok(other),
            }
        }
    }

    /// The stored record for `key` in `scope`, exactly as stored (it may be past its
    /// `expires_at` or `forget_at` if no sweep has run since; see [`crate::is_expired`] and
    /// [`crate::is_forgotten`]). For inspection and tests; never needed to
    /// use the store correctly.
    pub fn get(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Option<Record>, Error> {
        let key = self.admit_key(scope, key)?;
        self.read_record(&key)
    }

    /// Calls `f` with every stored record, in record-key order, from one read transaction (a
    /// consistent snapshot; writers are not blocked), until `f` returns
    /// [`ControlFlow::Break`]. For operators' tools (`idem export`, `idem check`): `f` gets the
    /// record key as stored (docs/FORMAT.md, "Record key": tenant, operation and key, each
    /// length-prefixed) and the decoded record, or the error that reading it gives
    /// ([`Error::CorruptRecord`], [`Error::UnsupportedFormat`]), so one damaged record does not
    /// stop the walk. A damaged page does: the walk returns [`Error::CorruptStore`].
    pub fn for_each_record(
        &self,
        f: impl FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        self.read("reading the records", |read| for_each_record_in(read, f))
    }

    /// A read transaction on the store's file, for reading your own tables (e.g. to serve a
    /// `GET` of a resource a flow-A closure created). It sees a consistent snapshot. What you
    /// read through it is outside idem's storage boundary: on a damaged page, redb may panic in
    /// your code (idem's own reads return [`Error::CorruptStore`] instead).
    pub fn begin_read(&self) -> Result<redb::ReadTransaction, Error> {
        self.inner.db.begin_read().map_err(|e| self.storage(e))
    }

    /// Removes the record for `key` in `scope`, whatever its state, and returns whether one
    /// existed. An operator's tool for a record that fails to decode ([`Error::CorruptRecord`])
    /// or must be forgotten: the key becomes free, so a retry of the intent **runs again**, and a
    /// live lease on it is fenced out ([`Error::LeaseLost`]).
    pub fn purge(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = self.admit_key(scope, key)?;
        let existed = self.write(Durable::AsConfigured, |txn, _| {
            match self.remove(txn, &key) {
                Ok(existed) => Step::Done(existed),
                Err(e) => Step::Abort(e),
            }
        })?;
        self.lease_event();
        Ok(existed)
    }

    /// The store's current time.
    pub fn now(&self) -> Timestamp {
        // Outside every storage section: a panic of the (caller-supplied) clock is the caller's
        // as it is. Inside a section idem reads it with `now_in_section`.
        self.inner.clock.now()
    }

    /// The store's time, read by idem inside a storage section: a panic of the clock is the
    /// caller's, not damage.
    pub(crate) fn now_in_section(&self) -> Timestamp {
        caller_code(|| self.inner.clock.now())
    }

    /// The name-length limits every request is checked against ([`StoreBuilder::limits`]).
    pub fn limits(&self) -> Limits {
        self.inner.config.limits
    }

    /// The largest response body the store records ([`StoreBuilder::max_response_bytes`]):
    /// a face that must record *something* for an answer can check this first.
    pub fn max_response_bytes(&self) -> usize {
        self.inner.config.max_response_bytes
    }

    /// How long a lease lasts without a heartbeat ([`StoreBuilder::lease_duration`]).
    pub fn lease_duration(&self) -> Duration {
        self.inner.config.lease_duration
    }

    /// How many requests may wait for the next commit ([`StoreBuilder::max_queue`]): the
    /// natural bound for a face's in-flight store calls.
    pub fn max_queue(&self) -> usize {
        self.inner.group.config.max_queue
    }

    /// The first I/O or commit failure, if the store is fail-stopped.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    // ---- the shared state, for the rest of the crate ----

    /// The store on an opened and checked `db` (see `StoreBuilder::open`): its shared state,
    /// with no background thread yet.
    pub(crate) fn new(
        db: redb::Database,
        config: Config,
        clock: Arc<dyn Clock>,
        durability: Durability,
        group: GroupConfig,
        instance: [u8; 8],
    ) -> Store {
        let inner = Inner {
            db,
            config,
            clock,
            failure: Mutex::new(None),
            instance,
            next_token: AtomicU64::new(0),
            lease_events: Mutex::new(0),
            lease_changed: Condvar::new(),
            group: Group::new(group),
            durability,
            unflushed: AtomicBool::new(false),
            background: Background::default(),
            sweep_lock: Mutex::new(()),
            sweeps: Mutex::new(SweepTotals::default()),
            work: Arc::new(Signal::default()),
            extensions: Mutex::new(HashMap::new()),
        };
        Store {
            inner: Arc::new(inner),
        }
    }

    /// The settings fixed at open.
    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The group-commit state.
    pub(crate) fn group(&self) -> &Group {
        &self.inner.group
    }

    /// The durability mode.
    pub(crate) fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// The flusher and sweeper threads.
    pub(crate) fn background(&self) -> &Background {
        &self.inner.background
    }

    /// Whether a commit was made without an fsync since the last durable one.
    pub(crate) fn unflushed(&self) -> bool {
        self.inner.unflushed.load(Ordering::Acquire)
    }

    /// Records whether the last commit left work for the flusher (`false` after a durable one).
    pub(crate) fn set_unflushed(&self, unflushed: bool) {
        self.inner.unflushed.store(unflushed, Ordering::Release);
    }

    /// Held for the length of a sweep pass: one pass at a time.
    pub(crate) fn one_sweep_at_a_time(&self) -> MutexGuard<'_, ()> {
        self.inner.sweep_lock.lock()
    }

    /// The sweep figures for [`Metrics`].
    pub(crate) fn sweep_totals(&self) -> MutexGuard<'_, SweepTotals> {
        self.inner.sweeps.lock()
    }

    /// The redb database, when this handle is the only one (no other clone, no live
    /// [`Lease`], no background thread between ticks): what `compact` and `check_integrity`
    /// need. Otherwise [`Error::InUse`] for `operation`.
    pub(crate) fn exclusive_db(
        &mut self,
        operation: &'static str,
    ) -> Result<&mut redb::Database, Error> {
        let others = Arc::strong_count(&self.inner).saturating_sub(1);
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => Ok(&mut inner.db),
            None => Err(Error::InUse {
                operation,
                reason: format!("{others} other Store clone(s) or Lease(s) are alive"),
            }),
        }
    }

    // ---- shared plumbing (also used by Lease) ----

    /// The record key of `key` in `scope`, validated like a request's (no payload involved).
    fn admit_key(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Vec<u8>, Error> {
        admit_key(&self.inner.config.limits, scope, key)
    }

    fn admit(&self, request: &Request) -> Result<Vec<u8>, Error> {
        self.inner.config.limits.check(request)?;
        Ok(record_key(request))
    }

    /// The lock-free path: a read transaction answers replays, mismatches and in-flight keys.
    fn read_path(&self, request: &Request, key: &[u8]) -> Result<Option<Early>, Error> {
        let stored = self.read_record(key)?;
        let now = self.now();
        Ok(self.early(
            decide(stored.as_ref(), request.fingerprint(), now),
            request,
            now,
        ))
    }

    fn decide_in(
        &self,
        txn: &WriteTransaction,
        request: &Request,
        key: &[u8],
        now: Timestamp,
    ) -> Result<Claimed, Error> {
        let stored = self.load(txn, key)?;
        let decision = decide(stored.as_ref(), request.fingerprint(), now);
        if let Some(early) = self.early(decision.clone(), request, now) {
            return Ok(Claimed::Early(early));
        }
        Ok(match (decision, &stored) {
            // A takeover keeps the intent's original creation time.
            (Decision::Takeover { attempt }, Some(r)) => Claimed::Free {
                created_at: r.created_at,
                attempt,
            },
            _ => Claimed::Free {
                created_at: now,
                attempt: 1,
            },
        })
    }

    /// The answer that needs no claim, if any; `now` is the time the decision was made at.
    fn early(&self, decision: Decision<'_>, request: &Request, now: Timestamp) -> Option<Early> {
        match decision {
            Decision::Claim | Decision::Takeover { .. } => None,
            Decision::Replay(r) => Some(Early::Replay(r.clone())),
            expired @ Decision::Expired { .. } => expired.tombstone().map(Early::Expired),
            Decision::Mismatch => Some(Early::Error(Error::PayloadMismatch {
                tenant: request.scope().tenant().to_owned(),
                operation: request.scope().operation().to_owned(),
                key: request.key_display(),
            })),
            Decision::InFlight { lease_deadline } => Some(Early::InFlight {
                retry_after: lease_deadline
                    .saturating_since(now)
                    .min(self.inner.config.retry_after_cap)
                    .max(Duration::from_millis(1)),
            }),
        }
    }

    /// The read path, mirroring [`Store::write`]: runs `f` on a fresh read transaction at the
    /// storage boundary. Every error `f` returns is observed (an I/O failure latches
    /// fail-stop), so no read of stored data can skip the latch; a panic redb raises on a
    /// damaged page while `f` runs is [`Error::CorruptStore`] (`while_` says what idem was
    /// doing; reads change nothing, so no fail-stop), and a panic in caller code inside `f` (run
    /// through [`caller_code`]) continues unwinding. Inside `f`, convert redb errors with
    /// [`unlatched`]: this function latches them.
    pub(crate) fn read<T>(
        &self,
        while_: &str,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        contained(while_, || {
            let read = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
            f(&read).map_err(|e| self.observe(e))
        })
    }

    pub(crate) fn read_record(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        self.read("reading a record", |read| read_record_in(read, key))
    }

    pub(crate) fn load(&self, txn: &WriteTransaction, key: &[u8]) -> Result<Option<Record>, Error> {
        let table = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Record::decode(v.value())).transpose()
    }

    /// Writes a record, moving its expiry-index entry in the same transaction.
    pub(crate) fn put(
        &self,
        txn: &WriteTransaction,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Error> {
        self.with_latch(|| {
            let mut records = txn.open_table(RECORDS)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            Ok(put_in(&mut records, &mut expiry, key, record)?)
        })
    }

    /// Removes a record and its expiry-index entry; returns whether one existed.
    pub(crate) fn remove(&self, txn: &WriteTransaction, key: &[u8]) -> Result<bool, Error> {
        self.with_latch(|| {
            let mut records = txn.open_table(RECORDS)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            Ok(remove_in(&mut records, &mut expiry, key)?)
        })
    }

    /// What a closure's result records (flow A and lease completion share the rule): `Ok` →
    /// Completed, [`Abort::Terminal`] → Failed, both within the response cap; anything else is
    /// the error that rolls the caller's writes back.
    pub(crate) fn settle(
        &self,
        result: Result<Response, Abort>,
    ) -> Result<(State, Response), Error> {
        let (state, response) = match result {
            Ok(response) => {
                let response = response.mark_succeeded();
                (State::Completed(response.clone()), response)
            }
            Err(Abort::Terminal(response)) => {
                let response = response.mark_failed();
                (State::Failed(response.clone()), response)
            }
            Err(Abort::Retryable(source)) => return Err(Error::Aborted { source }),
            Err(Abort::Store(e)) => return Err(e),
        };
        self.check_response(&response)?;
        Ok((state, response))
    }

    pub(crate) fn check_response(&self, response: &Response) -> Result<(), Error> {
        let len = response.stored_len();
        let max = self.inner.config.max_response_bytes;
        if len > max {
            return Err(Error::ResponseTooLarge { len, max });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), Error> {
        match &*self.inner.failure.lock() {
            Some(cause) => Err(Error::FailStopped {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Begins the write transaction of a batch, in the store's durability mode.
    /// Failing to begin is a storage-level failure: it latches, so every member of the batch
    /// can truthfully be told the store is fail-stopped.
    pub(crate) fn begin_batch_txn(&self) -> Result<WriteTransaction, Error> {
        let latched = |e: redb::Error| {
            self.latch(&e);
            Error::Storage { source: e }
        };
        let mut txn = self.inner.db.begin_write().map_err(|e| latched(e.into()))?;
        if self.relaxed_durability() {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| latched(e.into()))?;
        }
        Ok(txn)
    }

    /// True in [`Durability::Periodic`]: batches commit without an fsync.
    pub(crate) fn relaxed_durability(&self) -> bool {
        matches!(self.inner.durability, Durability::Periodic(_))
    }

    /// Makes this batch's commit durable (fsync) whatever the durability mode.
    pub(crate) fn force_durable(&self, txn: &mut WriteTransaction) {
        if let Durability::Periodic(_) = self.inner.durability {
            // Raising durability cannot conflict with a savepoint (idem takes none); if redb
            // refuses anyway, the commit stays non-durable and the flusher covers it.
            let _ = txn.set_durability(redb::Durability::Immediate);
        }
    }

    /// Runs the caller's closure, marking this thread as inside this store's write
    /// transaction so a nested write call fails fast with [`Error::Reentrant`] instead of
    /// waiting forever on redb's writer lock.
    pub(crate) fn run_closure<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Unmark(usize);
        impl Drop for Unmark {
            fn drop(&mut self) {
                let _ = IN_CLOSURE.try_with(|v| {
                    let mut v = v.borrow_mut();
                    if let Some(i) = v.iter().rposition(|&p| p == self.0) {
                        v.remove(i);
                    }
                });
            }
        }
        let id = self.id();
        // `try_with`: during thread teardown the thread-local may be gone; then there is
        // nothing to mark (no closure can be running on a thread that is being destroyed).
        let _ = IN_CLOSURE.try_with(|v| v.borrow_mut().push(id));
        let _unmark = Unmark(id);
        caller_code(f)
    }

    /// Runs the caller's closure (see `run_closure`) on a [`Tx`] over `txn`, and says whether
    /// it announced work: the write call that ran it calls [`Store::announce_work`] once it
    /// committed.
    pub(crate) fn run_on_tx<R>(
        &self,
        txn: &WriteTransaction,
        now: Timestamp,
        origin: Origin<'_>,
        f: impl FnOnce(&Tx<'_>) -> R,
    ) -> (R, bool) {
        let tx = Tx::new(self, txn, now, origin);
        let result = self.run_closure(|| f(&tx));
        (result, tx.announced())
    }

    /// Wakes whoever waits for announced work (the outbox dispatcher): called after a commit
    /// whose closure announced work, and by the layers above when they make work available
    /// outside a closure (a requeued dead letter). A wake-up with nothing to do is harmless.
    pub(crate) fn announce_work(&self) {
        self.inner.work.notify();
    }

    /// The work-announced signal, for a worker to wait on ([`crate::engine::signal`]).
    pub(crate) fn work_signal(&self) -> Arc<Signal> {
        self.inner.work.clone()
    }

    /// The store's value of type `T`, created with `T::default()` on first use: a typed slot for
    /// the state the layers above keep per store (the outbox's counters and its one-dispatcher
    /// guard), so the engine needs to know nothing of it. Every clone of the store sees the same
    /// value; it lives as long as the store.
    pub(crate) fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut slots = self.inner.extensions.lock();
        let slot = slots
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(slot).downcast::<T>() {
            Ok(value) => value,
            // Unreachable: the slot of `TypeId::of::<T>()` only ever holds a `T`. Should it not,
            // a fresh value replaces it rather than a panic.
            Err(_) => {
                let value = Arc::new(T::default());
                *slot = value.clone();
                value
            }
        }
    }

    pub(crate) fn in_closure(&self) -> bool {
        let id = self.id();
        IN_CLOSURE
            .try_with(|v| v.borrow().contains(&id))
            .unwrap_or(false)
    }

    /// Wakes `begin_wait` callers: a lease was finished, released or removed, which can change
    /// an in-flight answer. (Lapses are noticed by polling.)
    pub(crate) fn lease_event(&self) {
        let mut events = self.inner.lease_events.lock();
        *events = events.wrapping_add(1);
        self.inner.lease_changed.notify_all();
    }

    /// The lease events so far, to pass to [`Store::wait_for_lease_event`].
    fn lease_events_seen(&self) -> u64 {
        *self.inner.lease_events.lock()
    }

    /// Waits up to `timeout` for a lease event after `seen` (at once if one came already).
    fn wait_for_lease_event(&self, seen: u64, timeout: Duration) {
        let mut events = self.inner.lease_events.lock();
        if *events == seen {
            let _ = self.inner.lease_changed.wait_for(&mut events, timeout);
        }
    }

    /// A handle that does not keep the store open.
    pub(crate) fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    /// Identity of the shared store state (clones of a Store share it).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Commits; any failure latches fail-stop and reports an unknown outcome.
    pub(crate) fn commit(&self, txn: WriteTransaction) -> Result<(), Error> {
        if let Err(e) = txn.commit() {
            let source: redb::Error = e.into();
            self.latch(&source);
            return Err(Error::OutcomeUnknown {
                source: Arc::new(source),
            });
        }
        Ok(())
    }

    /// Aborts a transaction; a failure to abort is an I/O failure and latches.
    pub(crate) fn abort(&self, txn: WriteTransaction) {
        if let Err(e) = txn.abort() {
            self.latch(&e);
        }
    }

    /// Runs redb calls whose every error goes through the latch ([`Store::storage`]): for a
    /// write's work, where `?` gives a `redb::Error`.
    pub(crate) fn with_latch<T>(
        &self,
        f: impl FnOnce() -> Result<T, redb::Error>,
    ) -> Result<T, Error> {
        f().map_err(|e| self.storage(e))
    }

    /// Wraps a redb error, latching fail-stop when it is an I/O-level failure.
    pub(crate) fn storage(&self, e: impl Into<redb::Error>) -> Error {
        self.observe(Error::Storage { source: e.into() })
    }

    /// Latches fail-stop if `e` reports an I/O-level failure; returns `e`.
    pub(crate) fn observe(&self, e: Error) -> Error {
        match &e {
            Error::Storage { source } if is_io_failure(source) => self.latch(source),
            Error::OutcomeUnknown { source } => self.latch(source),
            _ => {}
        }
        e
    }

    /// Latches fail-stop for damage found inside a write (its reason is the cause), and returns
    /// the error.
    pub(crate) fn latch_damage(&self, e: Error) -> Error {
        match &e {
            Error::CorruptStore { reason } => self.latch(reason),
            other => self.latch(other),
        }
        e
    }

    pub(crate) fn latch(&self, cause: &dyn std::fmt::Display) {
        let mut failure = self.inner.failure.lock();
        if failure.is_none() {
            *failure = Some(cause.to_string());
        }
    }

    fn new_token(&self) -> HolderToken {
        let n = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.inner.instance);
        t[8..].copy_from_slice(&n.to_be_bytes());
        HolderToken(t)
    }
}

thread_local! {
    /// Stores whose write transaction is running a caller closure on this thread.
    static IN_CLOSURE: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A redb error as [`Error::Storage`], **without** latching fail-stop here. For the three
/// places where nothing latches at the conversion: opening a file (no store exists yet, nothing
/// was acknowledged), the [`ReadOnlyStore`] (it never writes), and the read functions run by
/// [`Store::read`] (shared with the read-only store), whose every error `Store::read` observes.
/// Anywhere else — a write's work above all, whose errors may be answered without reaching
/// the write's own `observe` — use [`Store::storage`].
pub(crate) fn unlatched(e: impl Into<redb::Error>) -> Error {
    Error::Storage { source: e.into() }
}

/// redb errors that mean the file or the disk misbehaved (as opposed to misuse).
fn is_io_failure(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Io(_)
            | redb::Error::PreviousIo
            | redb::Error::Corrupted(_)
            | redb::Error::LockPoisoned(_)
            | redb::Error::DatabaseClosed
            | redb::Error::TransactionPoisoned
    )
}

/// The record stored under `key`, from a read transaction (a [`Store`] or a [`ReadOnlyStore`]).
pub(crate) fn read_record_in(
    read: &redb::ReadTransaction,
    key: &[u8],
) -> Result<Option<Record>, Error> {
    let table = read.open_table(RECORDS).map_err(unlatched)?;
    let value = table.get(key).map_err(unlatched)?;
    value.map(|v| Record::decode(v.value())).transpose()
}

/// Calls `f` with every record key and its decoded record (or why it does not decode), in key
/// order, until `f` breaks. `f` is caller code: its panic is the caller's.
pub(crate) fn for_each_record_in(
    read: &redb::ReadTransaction,
    mut f: impl FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
) -> Result<(), Error> {
    let table = match read.open_table(RECORDS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(unlatched(e)),
    };
    for row in table.iter().map_err(unlatched)? {
        let (key, value) = row.map_err(unlatched)?;
        let record = Record::decode(value.value());
        if caller_code(|| f(key.value(), record)).is_break() {
            break;
        }
    }
    Ok(())
}

/// The record key of `key` in `scope`, validated against `limits` like a request's (no payload
/// involved).
pub(crate) fn admit_key(
    limits: &Limits,
    scope: &Scope,
    key: impl AsRef<[u8]>,
) -> Result<Vec<u8>, Error> {
    let request = Request::with_fingerprint(scope.clone(), key, crate::Fingerprint([0; 32]));
    limits.check(&request)?;
    Ok(record_key(&request))
}

/// An answer reached without running anything.
enum Early {
    Replay(Response),
    Expired(Tombstone),
    Error(Error),
    InFlight { retry_after: Duration },
}

impl Early {
    fn into_outcome(self) -> Result<Outcome, Error> {
        match self {
            Early::Replay(r) => Ok(Outcome::Replayed(r)),
            Early::Expired(t) => Ok(Outcome::Expired(t)),
            Early::Error(e) => Err(e),
            Early::InFlight { retry_after } => Ok(Outcome::InFlight { retry_after }),
        }
    }

    fn into_begin(self) -> Result<Begin, Error> {
        match self {
            Early::Replay(r) => Ok(Begin::Replayed(r)),
            Early::Expired(t) => Ok(Begin::Expired(t)),
            Early::Error(e) => Err(e),
            Early::InFlight { retry_after } => Ok(Begin::InFlight { retry_after }),
        }
    }
}

enum Claimed {
    Early(Early),
    Free { created_at: Timestamp, attempt: u32 },
}

#[cfg(test)]
mod tests {
    use std::panic::{AssertUnwindSafe, catch_unwind, panic_any};

    use super::*;

    /// The text of a caller's panic as the boundary hands it back (`None`: a storage panic).
    fn caller_payload<T>(r: Result<T, Panicked>) -> Option<String> {
        match r {
            Ok(_) => panic!("nothing panicked"),
            Err(Panicked::Caller(payload)) => Some(panic_message(payload.as_ref())),
            Err(Panicked::Storage(_)) => None,
        }
    }

    #[test]
    fn a_panic_out_of_caller_code_is_the_callers_with_its_own_payload() {
        let r = catch_storage_panic(|| caller_code(|| panic_any("mine")));
        assert_eq!(caller_payload(r).as_deref(), Some("mine"));
    }

    #[test]
    fn a_panic_outside_caller_code_is_a_storage_panic() {
        let r = catch_storage_panic(|| {
            caller_code(|| 1);
            panic_any("redb")
        });
        assert_eq!(caller_payload(r), None);
    }

    /// The case a thread-local flag got wrong: caller code whose panic the caller caught itself,
    /// then a storage panic in the same section.
    #[test]
    fn a_storage_panic_after_a_caller_panic_the_caller_caught_is_a_storage_panic() {
        let r = catch_storage_panic(|| {
            caller_code(|| {
                let caught = catch_unwind(|| caller_code(|| panic_any("caught by the caller")));
                assert!(caught.is_err());
            });
            let caught = catch_unwind(|| caller_code(|| panic_any("caught by idem's caller")));
            assert!(caught.is_err());
            panic_any("redb")
        });
        assert!(
            matches!(&r, Err(Panicked::Storage(m)) if m == "redb"),
            "{:?}",
            caller_payload(r)
        );
    }

    /// Caller code → a store call (its own section) → caller code: the innermost panic reaches
    /// the outer caller's code as it was, and from there the outer caller.
    #[test]
    fn a_caller_panic_crosses_nested_sections_unchanged() {
        let mut seen_inside = None;
        let r = catch_storage_panic(|| {
            caller_code(|| {
                let inner = catch_unwind(AssertUnwindSafe(|| {
                    contained("reading", || -> Result<(), Error> {
                        caller_code(|| panic_any("deep"))
                    })
                }));
                let payload = inner.expect_err("the inner caller panic continues");
                seen_inside = Some(panic_message(payload.as_ref()));
                std::panic::resume_unwind(payload)
            })
        });
        assert_eq!(seen_inside.as_deref(), Some("deep"));
        assert_eq!(caller_payload(r).as_deref(), Some("deep"));
        // A storage panic in the nested section is its CorruptStore, inside the caller's code.
        let r = catch_storage_panic(|| {
            caller_code(|| contained("reading", || -> Result<(), Error> { panic_any("redb") }))
        });
        assert!(matches!(r, Ok(Err(Error::CorruptStore { .. }))));
    }
}
