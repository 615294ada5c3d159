//! The applier (docs/design.md, "How entries reach redb: the applier and checkpoints"): a
//! batch decides against a redb snapshot `S(a)` plus the pending set P (entries sealed but not
//! yet in redb) and seals its entry into P and the journal; one thread, the applier, copies
//! durable entries into redb in LSN order with non-durable commits, and makes the checkpoints.
//! No claim waits for redb's writer.
//!
//! Invariants:
//! - the applier applies entry n only once it is durable (`n ≤ d`), in LSN order, each round's
//!   redb commit holding the row of its last entry: every redb state, durable or not, is the
//!   state after exactly the entries up to its row's LSN, so recovery replays exactly the
//!   entries after it;
//! - [`Applier::publish`] replaces the published snapshot and drops from P, under P's write
//!   lock, only the versions at or below the oldest snapshot still held by a view: a view of
//!   `S(a)` finds every version of `(a, j]` in P for as long as it lives;
//! - a reader takes the published snapshot and reads P under one read lock, so the pair it
//!   uses is one the applier published.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64 as Counter, Ordering};
use std::thread::JoinHandle;

use parking_lot::Mutex as Plain;
use redb::{Database, ReadOnlyTable, ReadTransaction, ReadableDatabase};

use crate::runtime::sync::atomic::{AtomicBool, AtomicU64};
use crate::runtime::sync::{Condvar, Mutex, RwLock};

use crate::engine::journal::apply::Registry;
use crate::engine::journal::format::{Row, decode_body};
use crate::engine::journal::log::Journal;
use crate::engine::journal::pending::{Compare, PendingSet, Write};
use crate::engine::journal::recover::META_JOURNAL;
use crate::engine::tables::{META, RECORDS};

/// The records table's rows as the read path reads them.
pub(crate) type RecordsRead = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// A published redb snapshot: the state after exactly the entries up to `lsn`.
pub(crate) struct Snap {
    pub(crate) lsn: u64,
    /// `None` only while the applier is suspended ([`Applier::suspend`]: compaction and the
    /// integrity check, which need the store to themselves, so no batch or reader runs).
    pub(crate) txn: Option<ReadTransaction>,
    /// idem's records table in it (`None` before the table exists), opened once for the read
    /// path.
    pub(crate) records: Option<RecordsRead>,
}

impl Snap {
    /// redb's current state, as the state after entry `lsn`.
    pub(crate) fn of(db: &Database, lsn: u64) -> Result<Snap, redb::Error> {
        let txn = db.begin_read()?;
        let records = match txn.open_table(RECORDS) {
            Ok(t) => Some(t),
            Err(redb::TableError::TableDoesNotExist(_)) => None,
            Err(e) => return Err(e.into()),
        };
        Ok(Snap {
            lsn,
            txn: Some(txn),
            records,
        })
    }
}

/// An entry sealed and not yet applied.
struct Queued {
    lsn: u64,
    body: Vec<u8>,
    /// The row a redb state holding this entry (and no later one) carries.
    row: Row,
}

/// P with the snapshot it sits on.
struct State {
    set: PendingSet,
    published: Arc<Snap>,
    /// Snapshots published before `published` that a view may still hold.
    older: Vec<Arc<Snap>>,
}

/// The applier's shared state (one per store in journal mode).
pub(crate) struct Applier {
    state: RwLock<State>,
    queue: Mutex<VecDeque<Queued>>,
    /// The row of the last applied entry (what a checkpoint with nothing new writes).
    last_row: Plain<Row>,
    /// The last applied entry (a), with its condition for [`Applier::wait_applied`].
    applied: Mutex<u64>,
    applied_cv: Condvar,
    /// P's byte bound: a seal waits while P holds more.
    limit: usize,
    /// Seals that waited for the applier because P was over its bound.
    pending_waits: Counter,
    /// A batch runs on redb's own write transaction ([`Hold`]): the thread makes no rounds.
    held: AtomicBool,
    /// The LSN of the row of the last checkpoint (a durable commit), made by a round or a held
    /// batch: a checkpoint with nothing applied since would free no journal space.
    checkpointed: AtomicU64,
    /// Taken by every round for its length: [`Applier::hold`] waits on it for a round that
    /// began before the hold.
    round_lock: Mutex<()>,
    /// How many of the next batches run on redb's own write transaction (a closure needed it:
    /// a table the journal cannot replay; [`Applier::want_redb`]).
    redb_batches: AtomicU32,
    stop: AtomicBool,
    failed: Plain<Option<String>>,
    /// White-box tests only (`BrokenJournal::ApplierRowAhead`): checkpoints write the row of
    /// the last sealed entry.
    #[cfg(any(test, feature = "__internal_whitebox"))]
    row_ahead: bool,
    /// The key and value type names of every table a sealed entry wrote (a table P creates
    /// before redb has it is opened with these types only).
    types: Plain<HashMap<String, (String, String)>>,
    thread: Plain<Option<JoinHandle<()>>>,
}

/// Batches that run on redb's own write transaction after a closure needed it: the caller
/// that needed it retries into one of them, and a run of such closures does not drain the
/// applier once per batch.
const REDB_BURST: u32 = 16;

/// Entries applied in one redb transaction at most.
const MAX_ROUND: usize = 1024;

impl Applier {
    /// The applier of a store whose redb holds exactly the entries up to `row`'s, `snap` its
    /// state.
    pub(crate) fn new(snap: Snap, row: Row, limit: usize) -> Arc<Applier> {
        Arc::new(Applier {
            state: RwLock::new(State {
                set: PendingSet::new(),
                published: Arc::new(snap),
                older: Vec::new(),
            }),
            queue: Mutex::new(VecDeque::new()),
            last_row: Plain::new(row),
            applied: Mutex::new(row.lsn),
            applied_cv: Condvar::new(),
            limit,
            pending_waits: Counter::new(0),
            held: AtomicBool::new(false),
            checkpointed: AtomicU64::new(row.lsn),
            round_lock: Mutex::new(()),
            redb_batches: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            failed: Plain::new(None),
            #[cfg(any(test, feature = "__internal_whitebox"))]
            row_ahead: false,
            types: Plain::new(HashMap::new()),
            thread: Plain::new(None),
        })
    }

    /// White-box tests only: an applier whose checkpoints write the row of the last sealed
    /// entry instead of their last applied one (`BrokenJournal::ApplierRowAhead`), when `on`.
    #[cfg(any(test, feature = "__internal_whitebox"))]
    pub(crate) fn with_row_ahead(mut self: Arc<Self>, on: bool) -> Arc<Self> {
        // A new applier has no other handle yet, so `get_mut` finds it.
        if let Some(applier) = Arc::get_mut(&mut self) {
            applier.row_ahead = on;
        }
        self
    }

    /// The published snapshot, for a batch's view: P's versions above its LSN stay while the
    /// returned handle lives.
    pub(crate) fn snapshot(&self) -> Arc<Snap> {
        Arc::clone(&self.state.read().published)
    }

    /// Runs `f` on P and the published snapshot, under one read lock (a reader's pair).
    pub(crate) fn read<T>(&self, f: impl FnOnce(&PendingSet, &Arc<Snap>) -> T) -> T {
        let state = self.state.read();
        f(&state.set, &state.published)
    }

    /// Runs `f` on P (a batch's view reads its versions above the view's snapshot).
    pub(crate) fn pending<T>(&self, f: impl FnOnce(&PendingSet) -> T) -> T {
        f(&self.state.read().set)
    }

    /// The key and value type names a sealed entry wrote table `name` with, if one did.
    pub(crate) fn types_of(&self, name: &str) -> Option<(String, String)> {
        self.types.lock().get(name).cloned()
    }

    /// Whether P holds more than its bound while entries wait to be applied (the sealing batch
    /// then waits for the applier; with nothing queued, the next publish prunes P).
    pub(crate) fn over_limit(&self) -> bool {
        self.state.read().set.bytes() > self.limit && !self.queue.lock().is_empty()
    }

    /// Backpressure, before a seal: while P is over its bound, waits for the applier to apply
    /// the next entry. The entry waited for is one already sealed: the applier may apply
    /// everything between the bound's check and the read of `a`, and a wait for an unsealed
    /// entry would never end (no sync covers it, and this batch is the only sealer).
    pub(crate) fn wait_for_room(&self, journal: &Journal) -> Result<(), String> {
        let mut counted = false;
        while self.over_limit() {
            let next = self.applied() + 1;
            if next > journal.sealed() {
                // Everything sealed is applied: the next check finds the queue empty.
                continue;
            }
            if !counted {
                self.pending_waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            journal.wait_durable(next)?;
            self.wait_applied(next)?;
        }
        Ok(())
    }

    /// Seals that waited for the applier because P was over its bound.
    pub(crate) fn pending_waits(&self) -> u64 {
        self.pending_waits.load(Ordering::Relaxed)
    }

    /// A closure needed redb's own write transaction: the next [`REDB_BURST`] batches run on
    /// it.
    pub(crate) fn want_redb(&self) {
        self.redb_batches.store(REDB_BURST, Ordering::Release);
    }

    /// Whether the batch beginning now runs on redb's own write transaction (and counts it).
    pub(crate) fn take_redb_batch(&self) -> bool {
        self.redb_batches
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// For a batch on redb's own write transaction (the only sealer while it runs): waits
    /// until every entry up to `sealed` is durable and applied, then keeps the thread from
    /// making rounds until the returned [`Hold`] is dropped. Redb then holds exactly the entries
    /// up to `sealed`, the queue is empty, and the batch's commit is the next state of redb.
    pub(crate) fn hold(self: &Arc<Self>, journal: &Arc<Journal>) -> Result<Hold, String> {
        let sealed = journal.sealed();
        journal.wait_durable(sealed)?;
        self.wait_applied(sealed)?;
        self.held.store(true, Ordering::SeqCst);
        let hold = Hold {
            applier: Arc::clone(self),
            journal: Arc::clone(journal),
        };
        // A round that began before the hold ends first; a later one sees `held` (it checks
        // it under this lock) and does nothing.
        drop(self.round_lock.lock());
        if !self.queue.lock().is_empty() {
            return Err(
                "the applier holds entries while a batch on redb's own transaction begins (a bug)"
                    .into(),
            );
        }
        Ok(hold)
    }

    /// Adds sealed entry `lsn` (`body`, its decoded writes ordered by `compares`) to P and to
    /// the applier's queue. Called by the sealing batch, before the next batch begins.
    pub(crate) fn add(
        &self,
        lsn: u64,
        body: Vec<u8>,
        row: Row,
        compares: &HashMap<String, Compare>,
    ) -> Result<(), String> {
        let entry = decode_body(&body).map_err(|e| format!("a sealed entry: {e:?}"))?;
        {
            let mut types = self.types.lock();
            for t in &entry.tables {
                if !types.contains_key(&t.name) {
                    types.insert(t.name.clone(), (t.key_type.clone(), t.value_type.clone()));
                }
            }
        }
        let mut writes = Vec::with_capacity(entry.records.len());
        for r in &entry.records {
            // Invariant: every table an entry writes was opened by the batch (which noted its
            // key order), and `decode_body` checked every range against the body.
            let (Some(t), Some(key)) = (
                entry.tables.get(usize::from(r.table)),
                body.get(r.key.clone()),
            ) else {
                return Err("a sealed entry does not match its body".into());
            };
            let Some(&compare) = compares.get(&t.name) else {
                return Err(format!(
                    "a sealed entry writes the table `{}`, which its batch did not open",
                    t.name
                ));
            };
            let value = match &r.value {
                Some(v) => Some(
                    body.get(v.clone())
                        .ok_or("a sealed entry does not match its body")?,
                ),
                None => None,
            };
            writes.push(Write {
                table: &t.name,
                compare,
                key,
                value,
            });
        }
        self.state
            .write()
            .set
            .insert_entry(lsn, writes)
            .map_err(|e| e.to_string())?;
        self.queue.lock().push_back(Queued { lsn, body, row });
        Ok(())
    }

    /// Waits until entry `lsn` is in redb (a ≥ lsn); `Err` once the applier failed.
    pub(crate) fn wait_applied(&self, lsn: u64) -> Result<(), String> {
        let mut a = self.applied.lock();
        loop {
            if *a >= lsn {
                return Ok(());
            }
            if let Some(f) = &*self.failed.lock() {
                return Err(f.clone());
            }
            self.applied_cv.wait(&mut a);
        }
    }

    /// The last applied entry (a).
    pub(crate) fn applied(&self) -> u64 {
        *self.applied.lock()
    }

    fn fail(&self, cause: &str) {
        self.failed.lock().get_or_insert_with(|| cause.to_owned());
        let _a = self.applied.lock();
        self.applied_cv.notify_all();
    }

    /// Whether the applier has something to do now: a durable queued entry, or a checkpoint
    /// due with something applied since the last one.
    fn ready(&self, journal: &Journal) -> bool {
        if self.stop.load(Ordering::Acquire) {
            return true;
        }
        if self.held.load(Ordering::Acquire) {
            return false;
        }
        let front = self.queue.lock().front().map(|q| q.lsn);
        front.is_some_and(|n| n <= journal.durable())
            || (journal.checkpoint_due() && self.applied_since_checkpoint())
    }

    /// Whether entries were applied since the last checkpoint (one now would move the live
    /// journal's start).
    fn applied_since_checkpoint(&self) -> bool {
        self.applied() > self.checkpointed.load(Ordering::Acquire)
    }

    /// One round: the durable queued entries (at most [`MAX_ROUND`]) applied in one redb
    /// transaction with the row of the last, committed durably when a checkpoint is due (or
    /// `force_checkpoint`), then published. `Ok(false)` when there was nothing to do.
    pub(crate) fn round(
        &self,
        target: &dyn Target,
        journal: &Journal,
        force_checkpoint: bool,
    ) -> Result<bool, String> {
        let _round = self.round_lock.lock();
        if self.held.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let durable = journal.durable();
        let entries: Vec<Queued> = {
            let mut q = self.queue.lock();
            let n = q
                .iter()
                .take(MAX_ROUND)
                .take_while(|e| e.lsn <= durable)
                .count();
            q.drain(..n).collect()
        };
        let checkpoint = force_checkpoint
            || (journal.checkpoint_due()
                && (!entries.is_empty() || self.applied_since_checkpoint()));
        if entries.is_empty() && !checkpoint {
            return Ok(false);
        }
        let row = match entries.last() {
            Some(e) => e.row,
            None => *self.last_row.lock(),
        };
        let written = row;
        // White-box only: a checkpoint that records the last sealed entry instead.
        #[cfg(any(test, feature = "__internal_whitebox"))]
        let written = match self.row_ahead && checkpoint {
            true => journal.current_row(false),
            false => written,
        };
        let bodies: Vec<&[u8]> = entries.iter().map(|e| e.body.as_slice()).collect();
        // Only a checkpoint is timed (JournalMetrics::checkpoint_time).
        let started = checkpoint.then(std::time::Instant::now);
        if let Err(e) = target.apply(&bodies, &written, checkpoint) {
            let cause = format!("applying journal entries to the store file failed: {e}");
            self.fail(&cause);
            return Err(cause);
        }
        if let Some(started) = started {
            journal.checkpointed(&row, started.elapsed());
            self.checkpointed.store(row.lsn, Ordering::Release);
        }
        *self.last_row.lock() = row;
        self.publish(target, row.lsn).map_err(|e| {
            let cause = format!("reading the store file after applying: {e}");
            self.fail(&cause);
            cause
        })?;
        Ok(true)
    }

    /// Publishes redb's state after entry `lsn` and drops from P what no view needs.
    /// Called by rounds, and under a [`Hold`] (no round runs).
    fn publish(&self, target: &dyn Target, lsn: u64) -> Result<(), redb::Error> {
        let snap = Arc::new(target.snapshot(lsn)?);
        {
            let mut state = self.state.write();
            let old = std::mem::replace(&mut state.published, snap);
            state.older.push(old);
            // Only `older` holds a snapshot no view uses any more.
            state.older.retain(|s| Arc::strong_count(s) > 1);
            let oldest = state.older.iter().map(|s| s.lsn).min().unwrap_or(lsn);
            state.set.drop_through(oldest.min(lsn));
        }
        *self.applied.lock() = lsn;
        self.applied_cv.notify_all();
        Ok(())
    }

    /// Starts the applier thread: it waits on the journal for work, and takes the store (a
    /// strong handle, through `run`) for each round only.
    pub(crate) fn start(
        self: &Arc<Self>,
        journal: Arc<Journal>,
        run: impl FnMut(&Applier, &Journal) -> Result<bool, String> + Send + 'static,
    ) -> std::io::Result<()> {
        let me = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("idem-applier".into())
            .spawn(move || me.run(&journal, run))?;
        *self.thread.lock() = Some(handle);
        Ok(())
    }

    /// The applier thread's loop: waits until there is work, runs a round through `run`, until
    /// it is stopped or a round or the journal fails.
    pub(crate) fn run(
        &self,
        journal: &Journal,
        mut run: impl FnMut(&Applier, &Journal) -> Result<bool, String>,
    ) {
        loop {
            if journal.wait_until(|| self.ready(journal)).is_err() {
                // The journal failed: nothing more becomes durable.
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if run(self, journal).is_err() {
                return;
            }
        }
    }

    /// For compaction and the integrity check (no batch or reader runs): stops the thread,
    /// applies every queued entry, makes a checkpoint, and lets go of the published snapshot,
    /// whose read transaction would keep redb from compacting.
    pub(crate) fn suspend(&self, target: &dyn Target, journal: &Journal) -> Result<(), String> {
        self.stop(journal);
        self.drain(target, journal)?;
        self.round(target, journal, true)?;
        let mut state = self.state.write();
        let lsn = state.published.lsn;
        state.published = Arc::new(Snap {
            lsn,
            txn: None,
            records: None,
        });
        state.older.clear();
        Ok(())
    }

    /// After [`Applier::suspend`]: publishes redb's state again, ready for [`Applier::start`].
    pub(crate) fn resume(&self, target: &dyn Target) -> Result<(), redb::Error> {
        self.stop.store(false, Ordering::Release);
        let lsn = self.applied();
        self.publish(target, lsn)
    }

    /// Whether the thread runs.
    pub(crate) fn running(&self) -> bool {
        self.thread.lock().is_some()
    }

    /// Stops the applier thread and waits for it (unless this is that thread).
    pub(crate) fn stop(&self, journal: &Journal) {
        self.stop.store(true, Ordering::Release);
        journal.wake();
        let handle = self.thread.lock().take();
        if let Some(t) = handle
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }

    /// Applies everything still queued (no batch runs: the store closes, or compacts). The
    /// journal is synced first: under `Durability::Periodic` entries may be answered before
    /// they are durable.
    pub(crate) fn drain(&self, target: &dyn Target, journal: &Journal) -> Result<(), String> {
        journal.wait_durable(journal.sealed())?;
        while !self.queue.lock().is_empty() {
            let before = self.queue.lock().len();
            self.round(target, journal, false)?;
            if self.queue.lock().len() == before {
                return Err("entries left that are not durable".into());
            }
        }
        Ok(())
    }
}

/// Where the applier puts entries: redb's file ([`Redb`]), or a model checker's fake.
pub(crate) trait Target {
    /// Applies entry `bodies` (in LSN order) in one transaction holding `row`, committed
    /// durably with quick-repair when `checkpoint`, else with `Durability::None`.
    fn apply(&self, bodies: &[&[u8]], row: &Row, checkpoint: bool) -> Result<(), redb::Error>;
    /// The state now, as the state after entry `lsn`, for views and readers.
    fn snapshot(&self, lsn: u64) -> Result<Snap, redb::Error>;
}

/// The store of record: redb's file, with the tables entries may write.
pub(crate) struct Redb<'a> {
    pub(crate) db: &'a Database,
    pub(crate) registry: &'a Registry,
}

impl Target for Redb<'_> {
    fn apply(&self, bodies: &[&[u8]], row: &Row, checkpoint: bool) -> Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        if checkpoint {
            txn.set_quick_repair(true);
            txn.set_durability(redb::Durability::Immediate)?;
        } else {
            txn.set_durability(redb::Durability::None)?;
        }
        {
            let mut open = HashMap::new();
            for body in bodies {
                let entry = decode_body(body).map_err(|err| {
                    redb::Error::Corrupted(format!("a sealed entry does not decode: {err:?}"))
                })?;
                self.registry
                    .apply(&txn, &mut open, &entry.tables, &entry.records, body)?;
            }
        }
        txn.open_table(META)?
            .insert(META_JOURNAL, row.encode().as_slice())?;
        txn.commit()?;
        Ok(())
    }

    fn snapshot(&self, lsn: u64) -> Result<Snap, redb::Error> {
        Snap::of(self.db, lsn)
    }
}

/// The applier held for a batch on redb's own write transaction ([`Applier::hold`]): dropping
/// it lets the thread make rounds again.
pub(crate) struct Hold {
    applier: Arc<Applier>,
    journal: Arc<Journal>,
}

impl Hold {
    /// After the held batch's durable commit of entry `row.lsn` returned Ok: that state is
    /// the applied one, and the published snapshot.
    pub(crate) fn committed(&self, target: &dyn Target, row: Row) -> Result<(), String> {
        *self.applier.last_row.lock() = row;
        self.applier.checkpointed.store(row.lsn, Ordering::Release);
        self.applier.publish(target, row.lsn).map_err(|e| {
            let cause = format!("reading the store file after a commit: {e}");
            self.applier.fail(&cause);
            cause
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.applier.held.store(false, Ordering::SeqCst);
        self.journal.wake();
    }
}
