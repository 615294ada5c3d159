//! The store: [`Store`] and the state every clone shares. Its fields are private to this folder:
//! the rest of the crate reaches them through the small accessors here and the methods of the
//! files below, each an `impl Store` block of its own. Opening is in `engine/builder.rs`,
//! maintenance in `engine/maintenance.rs`, the background threads in `engine/background.rs`,
//! the storage boundary's panic handling in `engine/boundary.rs`.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the [`Store`] and its shared state (private fields, `new`, small accessors, the settings it reports), closing the file on the last drop, [`WeakStore`], the extension slot |
//! | `flow_a.rs` | flow A: `execute`, `execute_on_writer`, the step each runs inside a batch's write transaction |
//! | `claim.rs` | the claim half of flow B: `begin`, `begin_claim`, `begin_wait`, and the lease events that wake a waiter |
//! | `decide.rs` | admitting a request and deciding it: on the lock-free read path, and again under the writer |
//! | `records.rs` | record I/O: `get`, `for_each_record`, `read_transaction`, `purge`; the read path (`Store::read`, `read_record`), the record's load/put/remove |
//! | `latch.rs` | the fail-stop latch: `fail_stop_cause`, `storage`, `observe`, `latch`, which redb errors are I/O failures |
//! | `txn.rs` | a batch's write transaction: begun in the store's durability mode, committed or aborted, any failure latched |
//! | `journaled.rs` | journal mode's commit: sealing a batch's entry, the row, a non-durable or checkpoint commit, waiting for durability; the closing checkpoint |
//! | `closure.rs` | the closure boundary: running the caller's closure (`run_closure`, reentrancy), on a `Tx`, settling its result, the work it announces |

mod claim;
mod closure;
mod decide;
mod flow_a;
mod journaled;
mod latch;
mod records;
mod txn;

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::engine::background::Background;
use crate::engine::boundary::{caller_code, unlatched};
use crate::engine::builder::Durability;
#[cfg(doc)]
use crate::engine::builder::StoreBuilder;
use crate::engine::commit::{Group, GroupConfig};
use crate::engine::journal::applier::Applier;
use crate::engine::journal::apply::Registry;
use crate::engine::journal::log::Journal;
#[cfg(doc)]
use crate::engine::lease::Lease;
#[cfg(doc)]
use crate::engine::maintenance::Metrics;
use crate::engine::snapshot::Snapshot;
use crate::engine::sweep::SweepTotals;
#[cfg(doc)]
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::clock::{Clock, Timestamp};
use crate::model::record::HolderToken;
use crate::model::rules::Holders;
use crate::model::scope::Limits;
use crate::model::settings::Config;
use crate::runtime::observe::{self, Engine};
use crate::runtime::signal::Signal;

pub(crate) use records::{for_each_record_in, read_record_in};

/// How the file is shared and committed, fixed at open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FileModes {
    /// Every batch commit saves redb's allocator state (`StoreBuilder::quick_repair`).
    pub(crate) quick_repair: bool,
    /// Other processes may write the file (`StoreBuilder::multi_process`).
    pub(crate) multi_process: bool,
    /// How long the open spent repairing a file that was not closed cleanly.
    pub(crate) repair_time: Option<Duration>,
}

/// The store's redb database, closed at the storage boundary. redb's own close commits (it
/// saves its allocator state and returns the freed pages), and on a file damaged since the open
/// (or opened without [`StoreBuilder::verify_on_open`]) that commit can panic; [`Inner`]'s drop
/// takes the database out and drops it inside `catch_unwind`, so a panic there does not leave
/// the drop. (A second panic while redb unwinds from the first aborts the process, which nothing
/// can catch: [`StoreBuilder::verify_on_open`] keeps such files from being opened.)
/// `None` only from then on, when no call can reach it.
/// Shared with the applier thread in journal mode, which [`Inner`]'s drop stops first, so
/// the drop releases the last reference and closes the file.
struct Db(Option<Arc<redb::Database>>);

impl Db {
    fn get(&self) -> Result<&redb::Database, redb::Error> {
        self.0.as_deref().ok_or(redb::Error::DatabaseClosed)
    }

    /// `Err` also while another reference exists (the applier's, in journal mode).
    fn get_mut(&mut self) -> Result<&mut redb::Database, redb::Error> {
        self.0
            .as_mut()
            .and_then(Arc::get_mut)
            .ok_or(redb::Error::DatabaseClosed)
    }
}

/// The state every clone of a [`Store`] shares. Its fields are private to `engine/store/`: the
/// rest of the crate reaches them through the small accessors and methods on [`Store`].
pub(crate) struct Inner {
    db: Db,
    config: Config,
    clock: Arc<dyn Clock>,
    /// The first I/O or commit failure; once set, every write is refused (fail-stop).
    failure: Mutex<Option<String>>,
    /// Random per-instance prefix of holder tokens.
    instance: [u8; 8],
    /// Which lease holders may still be running (fixed at open: outside `multi_process` mode
    /// only this instance's).
    holders: Holders,
    next_token: AtomicU64,
    /// Lease events so far: bumped and broadcast (`lease_changed`) after every commit that
    /// finished, released or removed a lease (`lease_event`), so `begin_wait` wakes at once.
    lease_events: Mutex<u64>,
    lease_changed: Condvar,
    /// The group-commit state.
    group: Group,
    durability: Durability,
    /// Every batch commit saves redb's allocator state (`StoreBuilder::quick_repair`).
    quick_repair: bool,
    /// How long the open spent repairing the file (`Store::repair_time`).
    repair_time: Option<Duration>,
    /// The records table as of the latest commit, for the read path (engine/snapshot.rs).
    snapshot: Snapshot,
    /// A non-durable commit happened since the flusher last looked.
    unflushed: AtomicBool,
    /// The warning that a batch wrote a table the journal cannot replay was logged.
    unjournaled_warned: AtomicBool,
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
    /// The write-ahead journal, in journal mode (`engine/journal/`).
    journal: Option<Arc<Journal>>,
    /// The tables a journal's entries may write, with their types.
    registry: Registry,
    /// Journal mode: the thread that applies durable entries to redb, with P and the
    /// published snapshot (`engine/journal/applier.rs`).
    applier: Option<Arc<Applier>>,
}
impl Drop for Inner {
    fn drop(&mut self) {
        self.background.stop();
        // Its read transaction ends before the file closes.
        self.snapshot.release();
        self.stop_applier();
        self.close_journal();
        // Relaxed durability: make every acknowledged commit durable on close. No other handle
        // exists any more, so this is the only writer.
        if self.unflushed.load(Ordering::Acquire)
            && self.failure.lock().is_none()
            && let Ok(db) = self.db.get()
        {
            // A drop must not panic: redb failing on a damaged file here loses nothing that
            // was acknowledged as durable (this commit only raises durability).
            let flushed = catch_unwind(AssertUnwindSafe(|| -> Result<(), redb::Error> {
                let mut txn = db.begin_write()?;
                let _ = txn.set_durability(redb::Durability::Immediate);
                Ok(txn.commit()?)
            }));
            match flushed {
                Ok(Ok(())) => {}
                Ok(Err(e)) => observe::warn!(
                    "closing the store: the last commits could not be made durable",
                    error = observe::display(e),
                ),
                Err(_) => observe::warn!(
                    "closing the store: the last commits could not be made durable (redb panicked: a damaged file?)"
                ),
            }
        }
        // redb's close commits too (see `Db`): a panic there leaves the file as a crash would,
        // and the next open recovers it.
        if let Some(db) = self.db.0.take()
            && catch_unwind(AssertUnwindSafe(|| drop(db))).is_err()
        {
            observe::warn!(
                "closing the store: redb panicked while closing the file (a damaged file?); the next open recovers it"
            );
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

    /// How long opening this store spent repairing its file, if the file was not closed
    /// cleanly (the last process died with it open) and quick-repair had not saved the
    /// allocator state: redb's walk of the whole file, progress reported to
    /// [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair). `None` for a file that was
    /// closed cleanly, a new file, or a reopen from quick-repair's saved state. A service may
    /// log it, or count it as an unclean restart.
    pub fn repair_time(&self) -> Option<Duration> {
        self.inner.repair_time
    }

    /// The store on an opened and checked `db` (see `StoreBuilder::open`): its shared state,
    /// with no background thread yet.
    #[allow(
        clippy::too_many_arguments,
        reason = "each is one setting fixed at open, named at the one call site"
    )]
    pub(crate) fn new(
        db: redb::Database,
        config: Config,
        clock: Arc<dyn Clock>,
        durability: Durability,
        group: GroupConfig,
        instance: [u8; 8],
        modes: FileModes,
        journal: Option<Journal>,
        registry: Registry,
        applier: Option<Arc<Applier>>,
    ) -> Store {
        let inner = Inner {
            db: Db(Some(Arc::new(db))),
            config,
            clock,
            failure: Mutex::new(None),
            instance,
            // With the file to itself, only this instance's holders can be running: every
            // other holder died with the instance that granted its lease.
            holders: if modes.multi_process {
                Holders::Any
            } else {
                Holders::Instance(instance)
            },
            next_token: AtomicU64::new(0),
            lease_events: Mutex::new(0),
            lease_changed: Condvar::new(),
            group: Group::new(group),
            durability,
            quick_repair: modes.quick_repair,
            repair_time: modes.repair_time,
            snapshot: Snapshot::new(!modes.multi_process),
            unflushed: AtomicBool::new(false),
            unjournaled_warned: AtomicBool::new(false),
            background: Background::default(),
            sweep_lock: Mutex::new(()),
            sweeps: Mutex::new(SweepTotals::default()),
            work: Arc::new(Signal::default()),
            extensions: Mutex::new(HashMap::new()),
            journal: journal.map(Arc::new),
            registry,
            applier,
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

    /// The journal, in journal mode.
    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.inner.journal.as_deref()
    }

    /// The journal, shared (the applier thread holds it).
    pub(crate) fn journal_arc(&self) -> Option<Arc<Journal>> {
        self.inner.journal.clone()
    }

    /// The applier, in journal mode.
    pub(crate) fn applier(&self) -> Option<&Arc<Applier>> {
        self.inner.applier.as_ref()
    }

    /// The tables a journal's entries may write.
    pub(crate) fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The store's database, shared (the applier thread holds it).
    pub(crate) fn db_arc(&self) -> Option<Arc<redb::Database>> {
        self.inner.db.0.clone()
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
            Some(inner) => {
                // redb's compaction refuses to run beside a read transaction.
                inner.snapshot.release();
                inner.db.get_mut().map_err(unlatched)
            }
            None => Err(Error::InUse {
                operation,
                reason: format!("{others} other Store clone(s) or Lease(s) are alive"),
            }),
        }
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

    /// A handle that does not keep the store open.
    pub(crate) fn downgrade(&self) -> WeakStore {
        WeakStore(Arc::downgrade(&self.inner))
    }

    /// Identity of the shared store state (clones of a Store share it).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    fn new_token(&self) -> HolderToken {
        let n = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.inner.instance);
        t[8..].copy_from_slice(&n.to_be_bytes());
        HolderToken(t)
    }
}

/// This engine's name in what it reports (feature `tracing`: the spans' `engine` field).
pub(crate) const ENGINE: Engine = Engine("redb");
