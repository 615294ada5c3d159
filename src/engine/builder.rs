//! Opening a store: the settings and their documented defaults ([`StoreBuilder`]; the ones
//! every engine shares are `model/settings.rs`), the durability modes ([`Durability`]), the three ways to open a file,
//! and the checks an open makes (idem's format marker, an empty file, redb's open errors).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use redb::{ReadableDatabase, ReadableTable, StorageBackend};

use crate::engine::boundary::{catch_storage_panic, unlatched};
use crate::engine::commit::GroupConfig;
use crate::engine::create::{self, Fresh};
use crate::engine::journal::applier::{Applier, Snap};
use crate::engine::journal::{
    self,
    apply::Registry,
    journal_path,
    recover::{self, Place},
};
use crate::engine::probe::{self, ReadOnlyLook, SharedBackend, Shutdown};
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::repair::{Mode, RepairHook, RepairProgress, Watch};
use crate::engine::store::{FileModes, Store};
use crate::engine::tables::{EXPIRY, META, META_FORMAT, RECORDS};
use crate::error::Error;
use crate::model::clock::{Clock, SystemClock};
use crate::model::record::FORMAT_VERSION;
#[cfg(doc)]
use crate::model::response::ExecuteAnswer;
use crate::model::settings::{Config, common_settings};
use crate::runtime::observe;

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
/// | [`cache_size`](Self::cache_size) | 64 MiB ([`DEFAULT_CACHE_SIZE`]; redb's own default is 1 GiB) |
/// | [`durability`](Self::durability) | [`Durability::Immediate`]: fsync before every answer |
/// | [`max_batch`](Self::max_batch) | 1,024 requests per shared commit |
/// | [`max_queue`](Self::max_queue) | 4,096 requests waiting for the next commit |
/// | [`queue_timeout`](Self::queue_timeout) | 5 s, then [`Error::Busy`] |
/// | [`multi_process`](Self::multi_process) | off: one process opens the file |
/// | [`journal`](Self::journal) | on for one process (not with `multi_process` or [`open_with_backend`](Self::open_with_backend)): `<file>.journal` beside the file, a background applier thread |
/// | [`journal_capacity`](Self::journal_capacity) | 16 MiB on disk, written when the journal is created ([`DEFAULT_JOURNAL_CAPACITY`](crate::store::DEFAULT_JOURNAL_CAPACITY)) |
/// | [`checkpoint_bytes`](Self::checkpoint_bytes) | 8 MiB of journal between two durable commits of the store file |
/// | [`journal_pending_bytes`](Self::journal_pending_bytes) | 32 MiB of memory for journaled writes not yet in the store file |
/// | [`journal_table`](Self::journal_table) | none: tables of common leaf types need none (see [`journal`](Self::journal)) |
/// | [`quick_repair`](Self::quick_repair) | off: a reopen after a crash rebuilds the allocator state (seconds per GB of file) |
/// | [`on_repair`](Self::on_repair) | none: that rebuild's progress is not shown to the caller (a `tracing` warning with feature `tracing`) |
/// | [`prefetch_on_repair`](Self::prefetch_on_repair) | on: the file is read through once before that rebuild |
/// | [`verify_on_open`](Self::verify_on_open) | on: an open for writing checks every page's checksum first (not in `multi_process` mode) |
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
///
/// # Example
///
/// Retention stated as the windows in which a duplicate can still arrive
/// ([`RetentionPolicy`](crate::RetentionPolicy)): within the longest one a retry is replayed in
/// full; after it, until the tombstone horizon, it gets [`ExecuteAnswer::Expired`] (status and
/// resource pointer, no body) and still never runs again; after the horizon the key is free.
///
/// ```
/// use std::time::Duration;
/// use idem::clock::ManualClock;
/// use idem::{ExecuteAnswer, Request, Response, RetentionPolicy, Scope, Store, Timestamp};
///
/// const HOUR: Duration = Duration::from_secs(3600);
/// const DAY: Duration = Duration::from_secs(24 * 3600);
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let clock = ManualClock::new(Timestamp(1_700_000_000_000));
/// let store = Store::builder()
///     .retention_policy(
///         RetentionPolicy::new()
///             .client_retry(HOUR)           // apps retry for an hour
///             .webhook_replay(3 * DAY)      // providers redeliver for 3 days: the retention
///             .tombstone_horizon(30 * DAY), // then a tombstone keeps the key bound
///     )
///     .clock(clock.clone())
///     .open(dir.path().join("idem.redb"))?;
///
/// let refund = || -> Result<ExecuteAnswer, idem::Error> {
///     let request = Request::new(Scope::new("tenant-42", "refund"), "refund-1", &500u32)?;
///     store.execute(request, |_tx| Ok(Response::new(201, "refunded").with_resource("refund", "rf_1")))
/// };
/// assert!(matches!(refund()?, ExecuteAnswer::Ran(_)));
///
/// clock.advance(2 * DAY); // within the retention: the full answer
/// assert_eq!(refund()?.response().map(|r| r.body()), Some(&b"refunded"[..]));
///
/// clock.advance(2 * DAY); // past it: the tombstone, and the refund does not run again
/// let ExecuteAnswer::Expired(tombstone) = refund()? else { unreachable!() };
/// assert_eq!(tombstone.status(), 201);
/// assert_eq!(tombstone.resource().map(|r| r.id.as_str()), Some("rf_1"));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct StoreBuilder {
    config: Config,
    clock: Arc<dyn Clock>,
    cache_size: usize,
    durability: Durability,
    group: GroupConfig,
    multi_process: bool,
    quick_repair: bool,
    on_repair: Option<RepairHook>,
    prefetch_on_repair: bool,
    verify_on_open: bool,
    journal: journal::recover::Settings,
    /// [`journal`](Self::journal) as the caller set it; `None`: the default (on where the open
    /// has a path and one process opens the file).
    journal_choice: Option<bool>,
    /// The tables a journal's entries may write: idem's and those of `journal_table`.
    registry: Registry,
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

/// The page cache a store gets unless [`StoreBuilder::cache_size`] says otherwise: 64 MiB.
pub const DEFAULT_CACHE_SIZE: usize = 64 << 20;

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            config: Config::default(),
            clock: Arc::new(SystemClock),
            cache_size: DEFAULT_CACHE_SIZE,
            durability: Durability::Immediate,
            group: GroupConfig {
                max_batch: 1024,
                max_queue: 4096,
                queue_timeout: Duration::from_secs(5),
                // redb has one writer: one batch at a time.
                lanes: 1,
            },
            multi_process: false,
            quick_repair: false,
            on_repair: None,
            prefetch_on_repair: true,
            verify_on_open: true,
            journal: journal::recover::Settings {
                capacity: journal::DEFAULT_CAPACITY,
                checkpoint_bytes: journal::DEFAULT_CHECKPOINT_BYTES,
                #[cfg(any(test, feature = "__internal_whitebox"))]
                broken: journal::BrokenJournal::No,
                pending_bytes: journal::DEFAULT_PENDING_BYTES,
            },
            journal_choice: None,
            registry: Registry::with_idem_tables(),
        }
    }
}

impl StoreBuilder {
    /// A builder with the defaults above.
    pub fn new() -> Self {
        Self::default()
    }

    common_settings!();

    /// The clock every expiry and lease decision reads (inject a [`crate::clock::ManualClock`] in
    /// tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// redb's page cache size in bytes. Default [`DEFAULT_CACHE_SIZE`] (64 MiB), not redb's
    /// 1 GiB, which a busy store fills, so the process's memory grows with the file. A cache
    /// smaller than the store's hot set makes replays of cold keys read from the OS page cache
    /// instead; size it to the hot set when the machine has the memory (`cargo bench -p
    /// idem-benches --bench scale` measures memory and rates for several cache sizes).
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = bytes;
        self
    }

    /// redb's quick-repair: every commit also saves the allocator state (and commits in two
    /// phases), so reopening a file after a crash loads that state instead of walking the whole
    /// file to rebuild it — seconds to tens of seconds for a multi-GB store, near-instant with
    /// this. The price is paid per commit, so per *batch* of grouped callers, and is largest
    /// with one caller (`cargo bench -p idem-benches --bench scale` and `--bench commit_modes`
    /// measure it).
    /// Default off; the default path shortens the repair instead
    /// ([`prefetch_on_repair`](Self::prefetch_on_repair)).
    /// (In `multi_process` mode every commit saves the state anyway.) With
    /// [`verify_on_open`](Self::verify_on_open) (on by default) every open walks the file
    /// anyway, crash or not: the near-instant reopen needs both.
    pub fn quick_repair(mut self, enabled: bool) -> Self {
        self.quick_repair = enabled;
        self
    }

    /// Called while an open repairs a file that was not closed cleanly (the process died with
    /// the store open and [`quick_repair`](Self::quick_repair) was off): redb then walks the
    /// whole file to rebuild its allocator state, seconds per GB of file, and calls `f` before
    /// each pass with its [`RepairProgress`]. A service logs it or reports it on its health
    /// endpoint instead of looking hung, and may [`abort`](RepairProgress::abort) a repair that
    /// outlasts its deadline (the open is then [`Error::RepairAborted`] and the file is left
    /// for the next open to repair). Never called for a file that was closed cleanly, a new
    /// file, or a file whose last commit saved the allocator state (quick-repair).
    ///
    /// `f` runs on the opening thread, between redb's passes (its first call is when the repair
    /// begins); a panic in `f` abandons the repair and continues unwinding from the open.
    /// Default: none (with feature `tracing` a repair still logs a warning when it begins).
    /// Afterwards [`Store::repair_time`] says how long the repair took.
    ///
    /// ```
    /// # fn main() -> Result<(), idem::Error> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// use std::time::Duration;
    /// let store = idem::Store::builder()
    ///     .on_repair(|progress| {
    ///         eprintln!("repairing the store: {:.0} %", progress.fraction() * 100.0);
    ///         if progress.elapsed() > Duration::from_secs(120) {
    ///             progress.abort(); // fail the start rather than stay down longer
    ///         }
    ///     })
    ///     .open(dir.path().join("idem.redb"))?;
    /// assert_eq!(store.repair_time(), None); // a new file needs no repair
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_repair(mut self, f: impl Fn(&mut RepairProgress) + Send + Sync + 'static) -> Self {
        self.on_repair = Some(RepairHook::new(f));
        self
    }

    /// Before a repair's walk (see [`on_repair`](Self::on_repair)), read the store file once
    /// front to back, so that the walk's scattered page reads come from the OS page cache
    /// instead of the disk: with a cold cache the walk then takes a fraction of its time
    /// (`scripts/reopen-after-crash` measures both). The read fills the OS page cache, not the
    /// process. Skipped for a file
    /// larger than the memory the OS reports available (Linux), and for
    /// [`open_with_backend`](Self::open_with_backend) (no file). Default on.
    pub fn prefetch_on_repair(mut self, enabled: bool) -> Self {
        self.prefetch_on_repair = enabled;
        self
    }

    /// Before an open for writing uses a file, check the checksum of every page of its committed
    /// trees (redb's `check_integrity_on_open`). redb trusts the pages of a cleanly closed file,
    /// and a page damaged at rest (a bad sector, a stray write, a bit flip) can make it panic —
    /// contained by idem as [`Error::CorruptStore`] — or, where redb panics again while
    /// unwinding from the first panic (freeing pages at a commit), **abort the process**, which
    /// no library can contain. That includes the commit redb makes when the last handle to the
    /// store is dropped (it saves its allocator state), even after reads only. With the check, such a file is [`Error::CorruptStore`] at the
    /// open, before any of it is used; a new file, and an open that finds nothing to check, cost
    /// nothing.
    ///
    /// The check never drops an acknowledged commit: a file closed cleanly ends with a
    /// two-phase commit, and when that commit fails its checksums redb refuses the file rather
    /// than fall back to the commit before it (it falls back only for a file a crash left,
    /// whose latest commit may be half-written and was then never acknowledged).
    ///
    /// The price is one read of the file per open, proportional to its size: the walk of a
    /// crash's repair, which [`prefetch_on_repair`](Self::prefetch_on_repair) speeds up the same
    /// way (`scripts/reopen-after-crash` times both on a store of a given size); it also makes a
    /// reopen after a crash walk the file even with [`quick_repair`](Self::quick_repair). Not done in
    /// [`multi_process`](Self::multi_process) mode, where other processes may be using the
    /// file: check a copy with `idem check` instead. Read-only opens never check (a check
    /// writes), and contain redb's panics on the pages they read. With the check off, an open
    /// never makes an existing file a new store: a file without idem's tables is
    /// [`Error::CorruptStore`] (a damaged table tree can hide every table of a store). Default
    /// on.
    pub fn verify_on_open(mut self, enabled: bool) -> Self {
        self.verify_on_open = enabled;
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

    /// Journal mode, **the default** for a store one process opens ([`open`](Self::open),
    /// [`open_existing`](Self::open_existing), [`open_with_backends`](Self::open_with_backends));
    /// `journal(false)` chooses direct mode, in which every batch is a durable redb commit, and
    /// so do [`multi_process`](Self::multi_process) and
    /// [`open_with_backend`](Self::open_with_backend), which have no journal (`journal(true)` with
    /// either is [`Error::Config`]).
    ///
    /// A batch's writes are appended to a write-ahead journal beside the store file (its path
    /// with `.journal` appended, [`crate::store::journal_path`]), and its members are answered
    /// after one `fdatasync` of it, which concurrent batches share. A batch decides against
    /// redb's last applied state plus the journaled writes not yet in it (held in memory, at most
    /// [`journal_pending_bytes`](Self::journal_pending_bytes)); one background thread applies
    /// durable entries to redb with commits that do not fsync, and makes a durable redb commit (a
    /// checkpoint) every [`checkpoint_bytes`](Self::checkpoint_bytes) of journal. An open after a
    /// crash replays the journal's entries after the last one redb holds. Every promise of
    /// [`Durability::Immediate`] holds: no answer before its writes are on disk. Its costs: the
    /// journal file ([`journal_capacity`](Self::journal_capacity), 16 MiB by default, written
    /// when it is created), the pending writes' memory, one thread per store.
    ///
    /// A closure may write any table. Tables whose key and value types are a common pair of
    /// redb's leaf types (`&str`, `&[u8]` or `u64` keys with `&str`, `&[u8]`, `String`,
    /// `Vec<u8>`, `u64`, `u32`, `i64`, `u8`, `bool` or `()` values; the list is in
    /// `engine/journal/apply.rs`) are journaled as they are. A batch that writes another table
    /// (a multimap, or a table of other types not registered with
    /// [`journal_table`](Self::journal_table)), or whose entry is larger than a quarter of the
    /// journal, is committed to redb durably instead, after every earlier entry (its closure may
    /// run once more for that: a closure may always run more than once, only the committed run
    /// counts): correct, at the price of an fsync of the store file, counted in
    /// [`JournalMetrics::unjournaled`](crate::store::JournalMetrics::unjournaled). With
    /// [`Durability::Periodic`] answers do not wait for the journal's sync, and the flusher's
    /// sync bounds the loss window as without the journal. Reads of redb itself
    /// ([`Store::read_transaction`](crate::Store::read_transaction)) wait until every entry
    /// answered before them is applied.
    ///
    /// A file opens in either mode whichever wrote it: a store opened in direct mode first
    /// replays what its journal holds; a `multi_process` open of a file whose journal holds
    /// answers the file lacks refuses with [`Error::JournalNeedsReplay`].
    pub fn journal(mut self, enabled: bool) -> Self {
        self.journal_choice = Some(enabled);
        self
    }

    /// The journal file's size in bytes, fixed when it is created (written with zeros, so a
    /// sync never changes the file's metadata). Default [`crate::store::DEFAULT_JOURNAL_CAPACITY`]
    /// (16 MiB); at least 64 KiB, a multiple of 4 KiB. An entry larger than a quarter of it is
    /// committed to redb durably instead of journaled.
    pub fn journal_capacity(mut self, bytes: u64) -> Self {
        self.journal.capacity = bytes;
        self
    }

    /// Journal bytes between two checkpoints (durable redb commits with quick-repair, made by
    /// the applier once it has applied what they cover): about what an open after a crash
    /// replays (more while the applier lags behind the batches, never more than the
    /// journal's capacity), and what `Store` applies to redb's file in one fsync. Default
    /// [`crate::store::DEFAULT_CHECKPOINT_BYTES`] (8 MiB); at most half the journal's
    /// capacity (raise [`journal_capacity`](Self::journal_capacity) with it). Rarer checkpoints
    /// buy a few percent of claims/s under load for a longer open after a crash (measured in
    /// benches/results/2026-12-07-2c50fcb-worst-case-replay-and-checkpoint-bytes.md).
    pub fn checkpoint_bytes(mut self, bytes: u64) -> Self {
        self.journal.checkpoint_bytes = bytes;
        self
    }

    /// Registers one of the caller's tables for journal mode: an open after a crash applies the
    /// journal's writes to it with these types, so batches writing it are journaled instead of
    /// committed durably (see [`journal`](Self::journal)). Tables of common pairs of redb's leaf
    /// types need no registration. Register the same tables in every program that opens the
    /// store: an open whose live journal holds writes to a table it does not know refuses with
    /// [`Error::Config`] naming the table, its types and this call (the `idem` CLI registers
    /// none: open such a store once with the program that does).
    pub fn journal_table<K: redb::Key + 'static, V: redb::Value + 'static>(
        mut self,
        definition: redb::TableDefinition<'static, K, V>,
    ) -> Self {
        self.registry.add(definition);
        self
    }

    /// NOT PUBLIC API (feature `__internal_whitebox`): breaks one journal step on purpose, for
    /// the tests that prove the crash tests catch it.
    #[cfg(feature = "__internal_whitebox")]
    #[doc(hidden)]
    pub fn __break_journal(mut self, broken: journal::BrokenJournal) -> Self {
        self.journal.broken = broken;
        self
    }

    /// The most bytes of journaled writes held in memory until the applier has them in redb's
    /// file (journal mode). Batches read them there in the meantime; a batch that finds more
    /// waits for the applier before it seals its entry, so a burst of writes faster than redb
    /// takes them slows to redb's pace instead of growing memory. Default
    /// [`crate::store::DEFAULT_PENDING_BYTES`] (32 MiB); above 0.
    pub fn journal_pending_bytes(mut self, bytes: usize) -> Self {
        self.journal.pending_bytes = bytes;
        self
    }

    /// Whether an open with a path (`with_path`) runs in journal mode: as the caller chose,
    /// else on unless several processes share the file or the open has no path.
    fn journal_on(&self, with_path: bool) -> bool {
        self.journal_choice
            .unwrap_or(with_path && !self.multi_process)
    }

    fn validate(&self) -> Result<(), Error> {
        if self.journal_choice == Some(true) && self.multi_process {
            return Err(Error::Config {
                reason: "journal(true) is not available with multi_process: the journal belongs to one process; drop journal(true) (multi_process commits every batch to the store file durably)".to_owned(),
            });
        }
        if self.journal_on(true) {
            let j = &self.journal;
            let reason = if j.capacity < (64 << 10) || !j.capacity.is_multiple_of(4096) {
                Some(format!(
                    "journal_capacity({}) must be at least 64 KiB and a multiple of 4 KiB",
                    j.capacity
                ))
            } else if j.pending_bytes == 0 {
                Some("journal_pending_bytes(0): the bound must be above 0".to_owned())
            } else if j.checkpoint_bytes == 0 || j.checkpoint_bytes > j.capacity / 2 {
                Some(format!(
                    "checkpoint_bytes({}) must be above 0 and at most half the journal capacity ({})",
                    j.checkpoint_bytes, j.capacity
                ))
            } else {
                None
            };
            if let Some(reason) = reason {
                return Err(Error::Config { reason });
            }
        }
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
        self.config.validate()
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Database::builder();
        b.set_cache_size(self.cache_size);
        if self.multi_process {
            b.set_concurrency_mode(redb::ConcurrencyMode::MultiWriter);
        }
        b
    }

    /// Whether an open for writing checks the file first (a file left as `shutdown` says).
    fn verifies(&self, shutdown: Shutdown) -> bool {
        self.verify_on_open && !self.multi_process && shutdown != Shutdown::New
    }

    /// How the file at `path` was left, if the open checks it (else unknown: nothing asks).
    fn probe_path(&self, path: &Path) -> Shutdown {
        if self.verify_on_open && !self.multi_process {
            probe::path(&self.redb_builder(), path)
        } else {
            Shutdown::Unknown
        }
    }

    /// A redb builder for the open for writing of a file left as `shutdown` says, whose repair
    /// callbacks `watch` sees, and the watch (which reads the file at `path` through before
    /// redb's walk, if asked to).
    fn watched_builder(&self, path: Option<&Path>, shutdown: Shutdown) -> (redb::Builder, Watch) {
        let mut b = self.redb_builder();
        let verify = self.verifies(shutdown);
        b.set_check_integrity_on_open(verify);
        // redb reports its check through the repair callbacks: only a file a crash left is
        // being repaired.
        let mode = if verify && shutdown != Shutdown::Crashed {
            Mode::Verify
        } else {
            Mode::Repair
        };
        let prefetch = path
            .filter(|_| self.prefetch_on_repair)
            .map(Path::to_path_buf);
        let watch = Watch::new(mode, self.on_repair.clone(), prefetch);
        watch.install(&mut b);
        (b, watch)
    }

    /// Opens (or creates) the store file at `path`.
    ///
    /// A missing file and an **empty (0-byte) file** are both a new store: a service may create
    /// the file before the store opens it (with `tempfile`, `touch`, or a deployment step), and
    /// idem initialises it. Any other file must be an idem store: a file that is not a redb
    /// database, or that redb finds damaged, is [`Error::CorruptStore`] (and left as it was).
    /// Use [`open_existing`](Self::open_existing) to refuse to create a store, and
    /// [`open_read_only`](Self::open_read_only) to read a file without writing it.
    ///
    /// A new store is written beside the path (`<path>.new.<pid>-<n>`) and linked into place
    /// only once it is durable, so a crash, a power cut or an I/O error during a first start
    /// never leaves a half-written file at the path; the next open removes what such a start
    /// left beside it and starts afresh (not in [`multi_process`](Self::multi_process) mode,
    /// where another process may be writing it). An empty file at the path is replaced, its
    /// permission bits kept. An open that fails after it created the store (a full disk while
    /// the journal is written) removes it again, or empties the file it found empty (not in
    /// `multi_process` mode, where another process may have opened it meanwhile).
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store, Error> {
        self.validate()?;
        let path = path.as_ref();
        let shutdown = self.probe_path(path);
        let (redb, watch) = self.watched_builder(Some(path), shutdown);
        let mut fresh = Fresh::NotOurs;
        let opened = contain_open(|| {
            recover::precheck(&journal_path(path))?;
            fresh = create::create_at(path, &self.redb_builder(), self.multi_process)?;
            let create = self.create(std::fs::metadata(path).map_or(true, |m| m.len() == 0));
            if create == Create::Unchecked {
                refuse_unchecked(self.redb_builder().open_read_only(path))?;
            }
            let (db, repair_time) = watched(&watch, redb.create(path), &path.display())?;
            Store::init(
                db,
                self,
                create,
                repair_time,
                Some(Place::Beside(journal_path(path))),
            )
        });
        if let Err(e) = &opened {
            fresh.undo(path, e);
        }
        watch.resume_caller_panic();
        opened
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
        let shutdown = self.probe_path(path);
        let (redb, watch) = self.watched_builder(Some(path), shutdown);
        let opened = contain_open(|| {
            refuse_empty(path)?;
            recover::precheck(&journal_path(path))?;
            // Any failure of the read-only open (a crashed file, another process holding it) is
            // left to the open for writing to handle or report, as before.
            if let Ok(db) = self.redb_builder().open_read_only(path) {
                check_marker(&db.begin_read().map_err(unlatched)?)?;
            }
            let (db, repair_time) = watched(&watch, redb.open(path), &path.display())?;
            Store::init(
                db,
                self,
                Create::No,
                repair_time,
                Some(Place::Beside(journal_path(path))),
            )
        });
        watch.resume_caller_panic();
        opened
    }

    /// Opens an existing store for reading only: nothing is ever written to the file (no
    /// open-time commit, no recovery), and redb's shared lock is taken instead of the exclusive
    /// one, so several readers may open the file at once — but not while a process has it open
    /// for writing (that open fails with [`Error::AlreadyOpen`]), except in
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
    /// No page checksum is verified (redb's check writes): on a file damaged at rest a read may
    /// return an older version of a page without an error. `idem check` (on a copy), or an open
    /// for writing with [`verify_on_open`](Self::verify_on_open), finds such damage.
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
                .map_err(|e| open_error(e, &path.display()))?;
            check_marker(&db.begin_read().map_err(unlatched)?)?;
            // A damaged table tree may hide one of idem's tables: say so at the open, not as
            // a missing table at the first read of it.
            match tables_present(&db.begin_read().map_err(unlatched)?)? {
                Present::Some { missing } => return Err(partial(missing)),
                Present::All | Present::None => {}
            }
            recover::check_read_only(&db.begin_read().map_err(unlatched)?)?;
            Ok(ReadOnlyStore::new(db, self.clock, self.config.limits))
        })
    }

    /// Opens (or creates) a store on a custom redb storage backend (an in-memory or
    /// fault-injecting backend in tests), in direct mode: there is no place for a journal (see
    /// [`open_with_backends`](Self::open_with_backends)).
    pub fn open_with_backend(self, backend: impl StorageBackend) -> Result<Store, Error> {
        self.open_on_backends(backend, None)
    }

    /// [`open_with_backend`](Self::open_with_backend) with the journal on a second backend:
    /// how journal mode runs on simulated and fault-injecting disks. An empty journal backend
    /// gets a new journal.
    pub fn open_with_backends(
        self,
        store: impl StorageBackend,
        journal: impl StorageBackend,
    ) -> Result<Store, Error> {
        self.open_on_backends(store, Some(Place::Backend(Box::new(journal))))
    }

    fn open_on_backends(
        self,
        backend: impl StorageBackend,
        journal: Option<Place>,
    ) -> Result<Store, Error> {
        self.validate()?;
        let backend = Arc::new(backend);
        let shutdown = if self.verify_on_open && !self.multi_process {
            probe::backend(&self.redb_builder(), &backend)
        } else {
            Shutdown::Unknown
        };
        let (redb, watch) = self.watched_builder(None, shutdown);
        let create = self.create(backend.len().is_ok_and(|len| len == 0));
        let opened = contain_open(|| {
            if create == Create::Unchecked {
                let look = ReadOnlyLook(backend.clone());
                refuse_unchecked(self.redb_builder().open_read_only_with_backend(look))?;
            }
            let (db, repair_time) = watched(
                &watch,
                redb.create_with_backend(SharedBackend(backend)),
                &"the storage backend",
            )?;
            Store::init(db, self, create, repair_time, journal)
        });
        watch.resume_caller_panic();
        opened
    }
}
/// Whether opening may write idem's tables and format marker into a redb file without them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Create {
    /// Yes: the file is new, or this open checked its pages (or is in `multi_process` mode,
    /// where processes starting together may all find a new file).
    Yes,
    /// No: the caller opens an existing store.
    No,
    /// Not into an existing file this open did not check (`verify_on_open(false)`): a damaged
    /// table tree can hide every table of a store, and creating them would start an empty
    /// store, forgetting every key, or commit onto damaged pages.
    Unchecked,
}

impl StoreBuilder {
    /// Whether this open may create idem's tables, for a file that is `new` (missing or empty).
    fn create(&self, new: bool) -> Create {
        if new || self.verify_on_open || self.multi_process {
            Create::Yes
        } else {
            Create::Unchecked
        }
    }
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

/// What a watched open of redb returned: the database and how long its repair took, or the
/// error (a repair the caller's callback abandoned is [`Error::RepairAborted`]).
fn watched(
    watch: &Watch,
    opened: Result<redb::Database, redb::DatabaseError>,
    what: &dyn std::fmt::Display,
) -> Result<(redb::Database, Option<Duration>), Error> {
    let seen = watch.finish();
    match opened {
        Ok(db) => {
            if let Some(took) = seen.repair_time {
                observe::repaired(took);
            }
            Ok((db, seen.repair_time))
        }
        Err(redb::DatabaseError::RepairAborted) if seen.aborted => Err(Error::RepairAborted),
        Err(e) => Err(open_error(e, what)),
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
/// recovery is [`Error::NeedsRecovery`]; a file another handle holds is [`Error::AlreadyOpen`],
/// naming `what` (the path). Anything else (permissions, a missing directory, a failing disk)
/// stays [`Error::Storage`], an I/O failure of its kind whose message names `what`.
fn open_error(e: redb::DatabaseError, what: &dyn std::fmt::Display) -> Error {
    use std::io::ErrorKind;
    match e {
        redb::DatabaseError::DatabaseAlreadyOpen => Error::AlreadyOpen {
            what: what.to_string(),
        },
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if matches!(io.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof) =>
        {
            Error::CorruptStore {
                reason: format!("the file is not a readable redb database: {io}"),
            }
        }
        // Any other I/O failure keeps its kind and names the file, with what to check.
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => {
            let hint = match io.kind() {
                ErrorKind::NotFound => " (check that the file's directory exists)",
                ErrorKind::PermissionDenied => {
                    " (check the permissions of the file and of its directory)"
                }
                _ => "",
            };
            unlatched(redb::StorageError::Io(std::io::Error::new(
                io.kind(),
                format!("opening {what}: {io}{hint}"),
            )))
        }
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => Error::CorruptStore {
            reason: format!("redb found the file damaged: {what}"),
        },
        redb::DatabaseError::RepairAborted => Error::NeedsRecovery,
        redb::DatabaseError::UpgradeRequired(version) => Error::CorruptStore {
            reason: format!(
                "the file is in redb's file format {version}, which this redb (5.x) does not read; upgrade it with the redb release that wrote it"
            ),
        },
        other => unlatched(other),
    }
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

/// Which of idem's tables a file holds.
enum Present {
    /// All three, with a format marker this build reads (a marker of another version is an
    /// error).
    All,
    /// None: a new store (or a redb file idem has not used yet).
    None,
    /// Some, not all: `missing` names one that is not there (or the marker).
    Some { missing: &'static str },
}

/// Which of idem's tables `read` sees. Reads only.
fn tables_present(read: &redb::ReadTransaction) -> Result<Present, Error> {
    let exists = |r: Result<(), redb::TableError>| match r {
        Ok(()) => Ok(true),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
        Err(e) => Err(unlatched(e)),
    };
    let records = exists(read.open_table(RECORDS).map(drop))?;
    let expiry = exists(read.open_table(EXPIRY).map(drop))?;
    let meta = match read.open_table(META) {
        Ok(meta) => Some(meta),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(unlatched(e)),
    };
    let marker = match &meta {
        Some(meta) => match meta.get(META_FORMAT).map_err(unlatched)? {
            Some(marker) => format_marker(marker.value()).map(|()| true)?,
            None => false,
        },
        None => false,
    };
    Ok(match (records, expiry, meta.is_some(), marker) {
        (true, true, true, true) => Present::All,
        (false, false, false, _) => Present::None,
        (false, ..) => Present::Some {
            missing: "records table",
        },
        (_, false, ..) => Present::Some {
            missing: "expiry table",
        },
        (_, _, false, _) => Present::Some {
            missing: "meta table",
        },
        (_, _, true, false) => Present::Some {
            missing: "format marker",
        },
    })
}

/// idem's three tables are created in one transaction: a file with some of them lost the others
/// to damage (a damaged table tree), which no write may touch.
fn partial(missing: &str) -> Error {
    Error::CorruptStore {
        reason: format!(
            "idem's {missing} is missing while its other tables exist: the table tree is damaged"
        ),
    }
}

/// An open that did not check the file's pages found none of idem's tables in an existing file.
fn unchecked_new() -> Error {
    Error::CorruptStore {
        reason: "the file holds none of idem's tables, and this open did not check its pages (verify_on_open(false)), so it may be a store whose table tree is damaged: open it once with verify_on_open on to check it and make it a store".into(),
    }
}

/// For an open that does not check pages, the tables of the file's read-only view, before the
/// open for writing: that open's handle, dropped on a refusal, commits (redb saves its allocator
/// state at close), and a commit on damaged pages can abort the process. A file that does not
/// open read-only (one a crash left) is left to the open for writing.
fn refuse_unchecked(db: Result<redb::ReadOnlyDatabase, redb::DatabaseError>) -> Result<(), Error> {
    let Ok(db) = db else { return Ok(()) };
    match tables_present(&db.begin_read().map_err(unlatched)?)? {
        Present::All => Ok(()),
        Present::None => Err(unchecked_new()),
        Present::Some { missing } => Err(partial(missing)),
    }
}

/// The stored format marker must be this build's format version.
pub(crate) fn format_marker(marker: &[u8]) -> Result<(), Error> {
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

    fn init(
        db: redb::Database,
        b: StoreBuilder,
        create: Create,
        repair_time: Option<Duration>,
        journal: Option<Place>,
    ) -> Result<Store, Error> {
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        if create == Create::No {
            // Before any write: a redb file without idem's tables is not turned into a store.
            check_marker(&db.begin_read().map_err(unlatched)?)?;
        }
        // A store that has its tables and marker is opened without a write: an open writes
        // only what a new store lacks.
        match tables_present(&db.begin_read().map_err(unlatched)?)? {
            Present::All => return Self::started(db, b, instance, repair_time, journal),
            Present::None if create == Create::Unchecked => return Err(unchecked_new()),
            Present::None => {}
            Present::Some { missing } => return Err(partial(missing)),
        }
        // Create the tables and check (or write) the format marker. Nothing was acknowledged
        // yet and no store exists to latch: a failure here is a plain storage error (open
        // again).
        create::write_tables(&db)?;
        Self::started(db, b, instance, repair_time, journal)
    }

    /// The store on an initialised file, with its background threads started.
    fn started(
        db: redb::Database,
        b: StoreBuilder,
        instance: [u8; 8],
        repair_time: Option<Duration>,
        journal_at: Option<Place>,
    ) -> Result<Store, Error> {
        let on = b.journal_on(journal_at.is_some());
        let journal = match journal_at {
            Some(place) if on => Some(recover::attach(&db, place, b.journal, &b.registry)?),
            None if on => {
                return Err(Error::Config {
                    reason: "journal(true) needs the store's path (StoreBuilder::open), or a journal backend (open_with_backends); open_with_backend has neither: drop journal(true)".into(),
                });
            }
            Some(place) if !b.multi_process => {
                recover::detach(&db, place, b.journal, &b.registry)?;
                None
            }
            // A multi-process open never replays a journal: it belongs to one process, and
            // another may be writing it.
            _ if b.multi_process => {
                if recover::journal_live(&db.begin_read().map_err(unlatched)?)? {
                    return Err(Error::JournalNeedsReplay);
                }
                None
            }
            // open_with_backend: no journal to replay.
            _ => {
                recover::check_read_only(&db.begin_read().map_err(unlatched)?)?;
                None
            }
        };
        let applier = match &journal {
            Some(j) => {
                let row = j.current_row(false);
                let snap = Snap::of(&db, row.lsn).map_err(unlatched)?;
                let applier = Applier::new(snap, row, b.journal.pending_bytes);
                #[cfg(any(test, feature = "__internal_whitebox"))]
                let applier = applier
                    .with_row_ahead(b.journal.broken == journal::BrokenJournal::ApplierRowAhead);
                Some(applier)
            }
            None => None,
        };
        let store = Store::new(
            db,
            b.config,
            b.clock,
            b.durability,
            b.group,
            instance,
            FileModes {
                quick_repair: b.quick_repair,
                multi_process: b.multi_process,
                repair_time,
            },
            journal,
            b.registry,
            applier,
        );
        store.start_background()?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::{DEFAULT_CACHE_SIZE, StoreBuilder};

    #[test]
    fn the_page_cache_defaults_to_64_mib_not_redbs_1_gib() {
        assert_eq!(DEFAULT_CACHE_SIZE, 64 * 1024 * 1024);
        assert_eq!(StoreBuilder::default().cache_size, DEFAULT_CACHE_SIZE);
        assert_eq!(
            StoreBuilder::default().cache_size(1 << 30).cache_size,
            1 << 30
        );
    }
}
