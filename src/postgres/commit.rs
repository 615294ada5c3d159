//! Group commit on PostgreSQL: concurrent writers of one process share a transaction, one
//! round trip to lock their rows and one to write them and commit, while every caller still
//! runs its own closure on its own thread (the connection is the baton). It drives the
//! protocol of `runtime/group.rs` with several lanes (batches in flight at once, each on its
//! own connection: the server runs them in parallel).
//!
//! A batch, on one pooled connection:
//! 1. **Open**, one round trip: `BEGIN`, the server's time, and the record and mark rows its
//!    members named ([`Locks`]): read plainly for claims (most find no row; a finished intent
//!    is answered from this read, no lock taken, nothing written), `SELECT … FOR UPDATE` in key
//!    order for the members that will rewrite the row they find (a lease's heartbeat, finish
//!    or release, a purge; every batch of every process locks in the same order). A row that
//!    does not exist is not locked: its first writer inserts it, and the unique key makes a
//!    second inserter fail (below).
//! 2. **Turns**: each member, in order, decides from the locked rows and what earlier members
//!    of the batch wrote (two requests for one key behave as if serialised), runs its closure
//!    (the caller's SQL runs on the connection at once), and leaves its record or mark write
//!    with the batch.
//! 3. **Commit**, one round trip: the batch's writes as three statements — `INSERT` of the rows
//!    that did not exist, `UPDATE` and `DELETE` of the ones that did, fenced by what the batch
//!    read (`WHERE holder IS NOT DISTINCT FROM <token> AND record = <the bytes read>`: a lease
//!    that was taken over, or a row another process rewrote since a plain read, matches
//!    nothing; the server checks every count and refuses the transaction if one differs) —
//!    and `COMMIT`. Nobody hears "done" before the `COMMIT` returned.
//!
//! Failures:
//! - a member whose closure fails (an error, a panic, a statement error it swallowed) leaves
//!   nothing behind: the transaction is rolled back, the members before it re-run in a fresh
//!   one, the members after it go back to the head of the queue;
//! - a serialization failure, a deadlock, a row another process inserted first, or a fenced
//!   write whose row changed since it was read: the whole batch re-runs after a short jittered
//!   pause (up to [`MAX_RUNS`] times; every member decides again from the rows as they are now, so the
//!   loser of an insert race replays the winner's answer);
//! - a commit that fails: a member whose answer does not depend on it gets its answer — one
//!   that wrote nothing ([`Step::Clean`]: a replay, a mismatch, an in-flight answer, a lease
//!   call that found its lease lost) and read only rows as they were committed before the batch
//!   opened (not a row an earlier member of the batch wrote). Every other member gets
//!   [`Error::OutcomeUnknown`] if the connection failed at the commit (a retry with the same key
//!   finds the commit if it landed), or [`Error::Storage`] if the server refused it (nothing
//!   landed). A connection that fails anywhere else certainly did not commit, and members get
//!   [`Error::Storage`]. The broken connection is dropped; the pool connects anew, so a server
//!   restart costs the batches in flight, not the store.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use postgres::SimpleQueryMessage;

use crate::error::{Error, StorageError};
use crate::model::clock::Timestamp;
use crate::model::marks::Mark;
use crate::model::record::{Record, State};
use crate::model::rules::sweep_due;
use crate::postgres::conn::{Conn, FENCE_MARK, Failure, NOW_MS, at_commit, bytea, classify, unhex};
use crate::postgres::store::ENGINE;
use crate::postgres::store::PgStore;
use crate::runtime::group;
use crate::runtime::observe::{self, QueueWait, Stopwatch};

/// How many times a batch runs before a retryable refusal (serialization failure, deadlock,
/// insert race) is reported to its members as [`Error::Storage`].
pub(crate) const MAX_RUNS: u32 = 8;

/// The protocol's state for PostgreSQL.
pub(crate) type Group = group::Group<Baton, Locks>;
type Member = group::Member<Baton, Locks>;
type Signal = group::Signal<Baton>;

/// A pooled connection.
pub(crate) type Pooled = r2d2::PooledConnection<crate::postgres::conn::Manager>;

/// The rows a member reads (and may write), read when its batch opens: plainly for a claim
/// (most claims find no row, and a finished intent is answered from the read), `FOR UPDATE`
/// for a member that will write the row it finds (a lease's finish, a purge).
#[derive(Debug, Default, Clone)]
pub(crate) struct Locks {
    /// Record keys.
    pub records: Vec<Vec<u8>>,
    /// Mark keys.
    pub marks: Vec<Vec<u8>>,
    /// Read them `FOR UPDATE`.
    pub lock: bool,
}

impl Locks {
    /// Reads the record under `key` (a claim: `execute`, `begin`).
    pub(crate) fn record(key: &[u8]) -> Self {
        Locks {
            records: vec![key.to_vec()],
            marks: Vec::new(),
            lock: false,
        }
    }

    /// Locks the record under `key` (a lease's heartbeat, finish or release; a purge).
    pub(crate) fn locked_record(key: &[u8]) -> Self {
        Locks {
            lock: true,
            ..Locks::record(key)
        }
    }

    /// Reads the mark under `key` (`process`, `receive`).
    pub(crate) fn mark(key: &[u8]) -> Self {
        Locks {
            records: Vec::new(),
            marks: vec![key.to_vec()],
            lock: false,
        }
    }

    /// Locks the mark under `key` (a purge).
    pub(crate) fn locked_mark(key: &[u8]) -> Self {
        Locks {
            lock: true,
            ..Locks::mark(key)
        }
    }
}

/// What a member's work reports.
pub(crate) enum Step<T> {
    /// Keep my writes in the batch; give me `T` once the batch has committed.
    Done(T),
    /// I wrote nothing; give me `T` once the batch has ended (a batch in which nobody wrote is
    /// rolled back, not committed). If I read nothing an earlier member of the batch wrote, `T`
    /// does not depend on the batch's commit, and I get it even if the commit fails.
    Clean(T),
    /// Roll back my writes (the batch re-runs without me) and give me this error now; a
    /// retryable refusal of the server re-runs the whole batch, me included.
    Abort(Error),
}

/// Which of idem's tables a row is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Table {
    Records,
    Marks,
}

/// A locked row as the batch found it.
#[derive(Debug, Clone)]
struct Found {
    value: Vec<u8>,
    holder: Option<Vec<u8>>,
}

/// A row as a member of the batch wrote it.
#[derive(Debug, Clone)]
struct Written {
    value: Vec<u8>,
    state: i16,
    due: u64,
    holder: Option<Vec<u8>>,
}

/// The baton: the batch's connection, its open transaction, and where the batch stands.
pub(crate) struct Baton {
    conn: Pooled,
    batch: Vec<Arc<Member>>,
    pos: usize,
    now: Timestamp,
    /// The rows locked when the transaction opened (`None`: the row did not exist).
    found: HashMap<(Table, Vec<u8>), Option<Found>>,
    /// The rows the members wrote so far (`None`: deleted), applied at the commit.
    written: BTreeMap<(Table, Vec<u8>), Option<Written>>,
    /// Some member kept writes.
    dirty: bool,
    /// The current member read a row from `written` (what an earlier member wrote): its answer
    /// holds only if the batch commits.
    read_written: Cell<bool>,
    /// Per member (by position): its answer stands whether or not the batch commits — it wrote
    /// nothing, and read only rows as they were committed before the batch opened.
    settled: Vec<bool>,
    /// Runs of this batch so far (1 for the first).
    runs: u32,
}

/// A member's view of the batch during its turn.
pub(crate) struct Batch<'b> {
    baton: &'b mut Baton,
}

impl Batch<'_> {
    /// The time of this batch: the server's clock when it opened (or the injected clock's).
    pub(crate) fn now(&self) -> Timestamp {
        self.baton.now
    }

    /// The connection, in the batch's open transaction (for the caller's closure and the
    /// outbox).
    pub(crate) fn conn(&mut self) -> &mut Conn {
        &mut self.baton.conn
    }

    fn current(&self, table: Table, key: &[u8]) -> Result<Option<&[u8]>, Error> {
        let id = (table, key.to_vec());
        if let Some(w) = self.baton.written.get(&id) {
            self.baton.read_written.set(true);
            return Ok(w.as_ref().map(|w| w.value.as_slice()));
        }
        match self.baton.found.get(&id) {
            Some(f) => Ok(f.as_ref().map(|f| f.value.as_slice())),
            // Invariant: work reads only the rows its member declared in its Locks.
            None => Err(Error::Internal {
                what: "a PostgreSQL batch member read a row it did not lock",
            }),
        }
    }

    /// The record under `key` as this member sees it (locked, or written earlier in the batch).
    pub(crate) fn record(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        self.current(Table::Records, key)?
            .map(Record::decode)
            .transpose()
    }

    /// The mark under `key` as this member sees it.
    pub(crate) fn mark(&self, key: &[u8]) -> Result<Option<Mark>, Error> {
        self.current(Table::Marks, key)?
            .map(Mark::decode)
            .transpose()
    }

    /// Writes `record` under `key` at the commit, with its derived columns.
    pub(crate) fn put_record(&mut self, key: &[u8], record: &Record) -> Result<(), Error> {
        let value = record.encode();
        let (state, holder) = match &record.state {
            State::Pending { holder, .. } => (0, Some(holder.0.to_vec())),
            State::Completed(_) => (1, None),
            State::Failed(_) => (2, None),
            State::Tombstone(_) => (3, None),
        };
        self.baton.written.insert(
            (Table::Records, key.to_vec()),
            Some(Written {
                value,
                state,
                due: sweep_due(record).0,
                holder,
            }),
        );
        Ok(())
    }

    /// Deletes the record under `key` at the commit.
    pub(crate) fn remove_record(&mut self, key: &[u8]) {
        self.baton
            .written
            .insert((Table::Records, key.to_vec()), None);
    }

    /// Writes `mark` under `key` at the commit.
    pub(crate) fn put_mark(&mut self, key: &[u8], mark: &Mark) {
        self.baton.written.insert(
            (Table::Marks, key.to_vec()),
            Some(Written {
                value: mark.encode(),
                state: 0,
                due: mark.forget_at.0,
                holder: None,
            }),
        );
    }

    /// Deletes the mark under `key` at the commit.
    pub(crate) fn remove_mark(&mut self, key: &[u8]) {
        self.baton
            .written
            .insert((Table::Marks, key.to_vec()), None);
    }
}

/// Waits before the re-run that follows the `runs`-th run's retryable refusal: a few
/// milliseconds, doubling per run (capped at [`RERUN_PAUSE_MAX`]), with equal jitter. A deadlock
/// victim that re-ran at once could take its first row again before the winner, woken by the
/// abort, took it, and deadlock once more (seen on a 2-core machine); the pause lets the winner
/// finish, and the jitter keeps two processes' victims from re-running in step.
fn rerun_pause(runs: u32) {
    std::thread::sleep(crate::model::outbox::backoff(
        runs,
        RERUN_PAUSE_BASE,
        RERUN_PAUSE_MAX,
        crate::runtime::publish::Jitter::next_on_this_thread(),
    ));
}

/// The first re-run's pause ceiling (the delay is uniform in its upper half).
const RERUN_PAUSE_BASE: Duration = Duration::from_millis(2);
/// The longest pause before a re-run.
const RERUN_PAUSE_MAX: Duration = Duration::from_millis(50);

/// Whether an error a member's work reported is a refusal of the server that a re-run fixes.
pub(crate) fn retryable(e: &Error) -> bool {
    match e {
        Error::Storage { source } => {
            source
                .downcast_ref::<postgres::Error>()
                .is_some_and(|e| classify(e) == Failure::Retry)
                || source
                    .downcast_ref::<crate::postgres::tx::StatementFailed>()
                    .is_some_and(|s| s.retry)
        }
        _ => false,
    }
}

impl PgStore {
    /// Runs `work` in a transaction shared with concurrent callers of this store, with the rows
    /// `locks` names locked, and returns its value only after that transaction committed.
    /// `work` may run more than once (another member failed, or the server asked for a
    /// re-run); only the committed run's writes and value count.
    pub(crate) fn write<T>(
        &self,
        locks: Locks,
        mut work: impl FnMut(&mut Batch<'_>) -> Step<T>,
    ) -> Result<T, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        let group = self.group();
        let me = Member::new(false, locks);
        let mut queued = QueueWait::start();
        let mut signal = group.join(&me)?;
        let mut value: Option<T> = None;
        loop {
            signal = match signal {
                Signal::Wait => me.wait(),
                Signal::Lead => {
                    let batch = group.form_batch(&me);
                    match self.open_batch(None, batch, 1) {
                        // `me` is first in the batch it formed.
                        Some(baton) => Signal::Turn(baton),
                        None => me.wait(),
                    }
                }
                Signal::Turn(mut baton) => {
                    queued.ended();
                    baton.read_written.set(false);
                    let step =
                        catch_unwind(AssertUnwindSafe(|| work(&mut Batch { baton: &mut baton })));
                    match step {
                        Ok(Step::Done(v)) => {
                            baton.dirty = true;
                            value = Some(v);
                        }
                        Ok(Step::Clean(v)) => {
                            let independent = !baton.read_written.get();
                            if let Some(settled) = baton.settled.get_mut(baton.pos) {
                                *settled = independent;
                            }
                            value = Some(v);
                        }
                        Ok(Step::Abort(e)) if retryable(&e) && baton.runs < MAX_RUNS => {
                            self.restart(baton);
                            signal = me.wait();
                            continue;
                        }
                        Ok(Step::Abort(e)) => {
                            self.shrink(baton);
                            return Err(e);
                        }
                        Err(panic) => {
                            self.shrink(baton);
                            resume_unwind(panic);
                        }
                    }
                    if baton.pos + 1 < baton.batch.len() {
                        baton.pos += 1;
                        let next = baton.batch[baton.pos].clone();
                        next.send(Signal::Turn(baton));
                        me.wait()
                    } else {
                        match self.commit_batch(baton) {
                            Some(mine) => mine,
                            // Re-run: my turn comes again.
                            None => me.wait(),
                        }
                    }
                }
                Signal::Committed => {
                    return value.ok_or(Error::Internal {
                        what: "a batch member was told its answer stands before it had one",
                    });
                }
                Signal::Failed(e) => return Err(e),
                // Only the file engine runs a member's work on another thread.
                Signal::Panicked(panic) => resume_unwind(panic),
            };
        }
    }

    /// Opens the transaction of `batch` (on `conn`, or a pooled connection) and locks its
    /// members' rows. Returns the baton for the first member, or answers every member with
    /// the failure, hands the lane on and returns `None`.
    fn open_batch(
        &self,
        conn: Option<Pooled>,
        batch: Vec<Arc<Member>>,
        runs: u32,
    ) -> Option<Box<Baton>> {
        let mut conn = conn;
        let mut runs = runs;
        // Dead pooled connections met so far (each is discarded): a restarted server leaves
        // every idle one dead.
        let mut reconnects = 0;
        loop {
            let c = match conn.take() {
                Some(c) => c,
                None => match self.connection() {
                    Ok(c) => c,
                    Err(e) => {
                        group::fail_all(&batch, || e.clone_for_batch());
                        self.group().hand_off();
                        return None;
                    }
                },
            };
            match self.lock_rows(c, &batch) {
                Ok((c, now, found)) => {
                    let settled = vec![false; batch.len()];
                    return Some(Box::new(Baton {
                        conn: c,
                        batch,
                        pos: 0,
                        now,
                        found,
                        written: BTreeMap::new(),
                        dirty: false,
                        read_written: Cell::new(false),
                        settled,
                        runs,
                    }));
                }
                // A connection that broke before anything was sent in earnest (a restarted
                // server): try again on another one.
                Err((Failure::Connection, _)) if reconnects < self.inner.reconnects => {
                    reconnects += 1;
                }
                // A refusal a re-run fixes.
                Err((Failure::Retry, _)) if runs < MAX_RUNS => {
                    rerun_pause(runs);
                    runs += 1;
                }
                Err((_, e)) => {
                    group::fail_all(&batch, || e.clone_for_batch());
                    self.group().hand_off();
                    return None;
                }
            }
        }
    }

    /// `BEGIN`, the time and the row locks of `batch`, in one round trip.
    #[allow(clippy::type_complexity)]
    fn lock_rows(
        &self,
        mut conn: Pooled,
        batch: &[Arc<Member>],
    ) -> Result<(Pooled, Timestamp, HashMap<(Table, Vec<u8>), Option<Found>>), (Failure, Error)>
    {
        let sql = self.sql();
        // Per table: the keys some member locks, and the others (read plainly).
        let keys = |of: fn(&Locks) -> &Vec<Vec<u8>>, locked: bool| {
            let mut keys: Vec<&[u8]> = batch
                .iter()
                .filter(|m| m.meta.lock == locked)
                .flat_map(|m| of(&m.meta).iter().map(Vec::as_slice))
                .collect();
            keys.sort_unstable();
            keys.dedup();
            keys
        };
        let locked_records = keys(|l| &l.records, true);
        let locked_marks = keys(|l| &l.marks, true);
        let mut read_records = keys(|l| &l.records, false);
        let mut read_marks = keys(|l| &l.marks, false);
        read_records.retain(|k| locked_records.binary_search(k).is_err());
        read_marks.retain(|k| locked_marks.binary_search(k).is_err());
        let mut q = format!("BEGIN; SELECT {NOW_MS};");
        for (tag, table, key_col, value_col, holder, keys, lock) in [
            (
                "r",
                &sql.records,
                "record_key",
                "record",
                "holder",
                &read_records,
                false,
            ),
            (
                "r",
                &sql.records,
                "record_key",
                "record",
                "holder",
                &locked_records,
                true,
            ),
            (
                "m",
                &sql.marks,
                "mark_key",
                "mark",
                "NULL::bytea",
                &read_marks,
                false,
            ),
            (
                "m",
                &sql.marks,
                "mark_key",
                "mark",
                "NULL::bytea",
                &locked_marks,
                true,
            ),
        ] {
            if keys.is_empty() {
                continue;
            }
            let _ = write!(
                q,
                " SELECT '{tag}', {key_col}, {value_col}, {holder} FROM {table} WHERE {key_col} IN ("
            );
            in_list(&mut q, keys);
            if lock {
                // Key order: every batch of every process locks in the same order.
                let _ = write!(q, ") ORDER BY {key_col} FOR UPDATE;");
            } else {
                q.push_str(");");
            }
        }
        let records: Vec<&[u8]> = read_records
            .iter()
            .chain(&locked_records)
            .copied()
            .collect();
        let marks: Vec<&[u8]> = read_marks.iter().chain(&locked_marks).copied().collect();
        let messages = match conn.client.simple_query(&q) {
            Ok(m) => m,
            Err(e) => {
                conn.saw(&e);
                let failure = classify(&e);
                rollback(&mut conn);
                return Err((failure, crate::postgres::conn::storage(e)));
            }
        };
        let mut found: HashMap<(Table, Vec<u8>), Option<Found>> = HashMap::new();
        for key in &records {
            found.insert((Table::Records, key.to_vec()), None);
        }
        for key in &marks {
            found.insert((Table::Marks, key.to_vec()), None);
        }
        let mut server_now = None;
        let malformed = || {
            (
                Failure::Refused,
                Error::Internal {
                    what: "the PostgreSQL server answered the row locks in an unexpected shape",
                },
            )
        };
        for m in messages {
            let SimpleQueryMessage::Row(row) = m else {
                continue;
            };
            if row.len() == 1 {
                server_now = row.get(0).and_then(|t| t.parse::<i64>().ok());
                continue;
            }
            let table = match row.get(0) {
                Some("r") => Table::Records,
                Some("m") => Table::Marks,
                _ => return Err(malformed()),
            };
            let key = row.get(1).and_then(unhex).ok_or_else(malformed)?;
            let value = row.get(2).and_then(unhex).ok_or_else(malformed)?;
            let holder = match row.get(3) {
                Some(h) => Some(unhex(h).ok_or_else(malformed)?),
                None => None,
            };
            found.insert((table, key), Some(Found { value, holder }));
        }
        let server_now = server_now.ok_or_else(malformed)?;
        let now = self.batch_time(server_now);
        Ok((conn, now, found))
    }

    /// Re-runs the whole batch (a retryable refusal): rolls back and opens a fresh transaction
    /// for every member, from the first.
    fn restart(&self, baton: Box<Baton>) {
        let Baton {
            mut conn,
            batch,
            runs,
            ..
        } = *baton;
        rollback(&mut conn);
        self.group().counters.reruns.fetch_add(1, Ordering::Relaxed);
        let conn = (!conn_broken(&mut conn)).then_some(conn);
        rerun_pause(runs);
        if let Some(baton) = self.open_batch(conn, batch, runs + 1) {
            let first = baton.batch[0].clone();
            first.send(Signal::Turn(baton));
        }
    }

    /// Removes the member at `baton.pos` (whose work failed) from its batch: rolls back, re-runs
    /// the members before it in a fresh transaction, and queues the ones after it at the head
    /// of the queue.
    fn shrink(&self, baton: Box<Baton>) {
        let Baton {
            mut conn,
            batch,
            pos,
            runs,
            ..
        } = *baton;
        let group = self.group();
        group.requeue_front(&batch[pos + 1..]);
        rollback(&mut conn);
        let prefix = batch[..pos].to_vec();
        if prefix.is_empty() {
            drop(conn);
            group.hand_off();
            return;
        }
        group.counters.reruns.fetch_add(1, Ordering::Relaxed);
        let conn = (!conn_broken(&mut conn)).then_some(conn);
        if let Some(baton) = self.open_batch(conn, prefix, runs) {
            let first = baton.batch[0].clone();
            first.send(Signal::Turn(baton));
        }
    }

    /// Commits the batch (called by its last member) and answers every member; `None` when the
    /// batch re-runs instead (the last member's turn comes again).
    fn commit_batch(&self, baton: Box<Baton>) -> Option<Signal> {
        let mut baton = baton;
        let n = baton.batch.len();
        let group = self.group();
        if !baton.dirty {
            // Nobody wrote: every answer is final; nothing to commit.
            rollback(&mut baton.conn);
            observe::batch(ENGINE, n, baton.runs.saturating_sub(1), None);
            for m in &baton.batch[..n - 1] {
                m.send(Signal::Committed);
            }
            drop(baton);
            group.hand_off();
            return Some(Signal::Committed);
        }
        let statement = commit_sql(self, &baton);
        let timer = Stopwatch::start();
        match self.run_commit(&mut baton.conn, &statement, n) {
            Ok(()) => {
                observe::batch(
                    ENGINE,
                    n,
                    baton.runs.saturating_sub(1),
                    Some(timer.elapsed()),
                );
                group.counters.commits.fetch_add(1, Ordering::Relaxed);
                group
                    .counters
                    .committed_ops
                    .fetch_add(n as u64, Ordering::Relaxed);
                for m in &baton.batch[..n - 1] {
                    m.send(Signal::Committed);
                }
                drop(baton);
                group.hand_off();
                Some(Signal::Committed)
            }
            Err(e) => {
                baton.conn.saw(&e);
                let failure = classify(&e);
                if failure == Failure::Retry && baton.runs < MAX_RUNS {
                    self.restart(baton);
                    return None;
                }
                if failure != Failure::Connection {
                    rollback(&mut baton.conn);
                }
                // The members that wrote, or read what an earlier member wrote, learn the
                // failure (`OutcomeUnknown` when the connection failed: the commit may have
                // landed); the others' answers came from committed rows and stand.
                let error = at_commit(e);
                let answer = |settled: bool| {
                    if settled {
                        Signal::Committed
                    } else {
                        Signal::Failed(error.clone_for_batch())
                    }
                };
                for (m, settled) in baton.batch[..n - 1].iter().zip(&baton.settled) {
                    m.send(answer(*settled));
                }
                let mine = answer(baton.settled.get(n - 1).copied().unwrap_or(false));
                drop(baton);
                group.hand_off();
                Some(mine)
            }
        }
    }
}

impl PgStore {
    /// Sends the commit of a batch of `members` members on `conn`.
    fn run_commit(
        &self,
        conn: &mut Conn,
        statement: &str,
        members: usize,
    ) -> Result<(), postgres::Error> {
        #[cfg(feature = "__internal_whitebox")]
        {
            use crate::postgres::whitebox::{CommitLoss, terminate};
            let loss = self.commit_loss(members);
            if loss == Some(CommitLoss::BeforeItRuns) {
                let _ = terminate(conn);
            }
            let result = conn.client.simple_query(statement).map(drop);
            if result.is_ok()
                && loss == Some(CommitLoss::AfterItRan)
                && let Some(e) = terminate(conn)
            {
                return Err(e);
            }
            result
        }
        #[cfg(not(feature = "__internal_whitebox"))]
        {
            let _ = (self, members);
            conn.client.simple_query(statement).map(drop)
        }
    }
}

/// The commit of a batch: its writes (inserts of new rows, fenced updates and deletes of the
/// locked ones, the server checking every count) and `COMMIT`, as one simple query: if a
/// statement fails the server skips the rest, `COMMIT` included.
fn commit_sql(store: &PgStore, baton: &Baton) -> String {
    let sql = store.sql();
    let mut out = String::new();
    for table in [Table::Records, Table::Marks] {
        let (name, key_col, value_col) = match table {
            Table::Records => (&sql.records, "record_key", "record"),
            Table::Marks => (&sql.marks, "mark_key", "mark"),
        };
        let mut inserts = Vec::new();
        let mut updates = Vec::new();
        let mut deletes = Vec::new();
        for ((t, key), written) in &baton.written {
            if *t != table {
                continue;
            }
            let found = baton.found.get(&(*t, key.clone())).cloned().flatten();
            match (found, written) {
                (None, Some(w)) => inserts.push((key, w)),
                (Some(f), Some(w)) => updates.push((key, w, f)),
                (Some(f), None) => deletes.push((key, f)),
                (None, None) => {}
            }
        }
        if !inserts.is_empty() {
            match table {
                Table::Records => {
                    let _ = write!(
                        out,
                        "INSERT INTO {name} (record_key, state, due, holder, record) VALUES "
                    );
                }
                Table::Marks => {
                    let _ = write!(out, "INSERT INTO {name} (mark_key, due, mark) VALUES ");
                }
            }
            for (i, (key, w)) in inserts.iter().enumerate() {
                out.push_str(if i == 0 { "(" } else { ", (" });
                bytea(&mut out, key);
                if table == Table::Records {
                    let _ = write!(out, ", {}", w.state);
                }
                let _ = write!(out, ", {}, ", w.due);
                if table == Table::Records {
                    holder(&mut out, w.holder.as_deref());
                    out.push_str(", ");
                }
                bytea(&mut out, &w.value);
                out.push(')');
            }
            out.push_str(";\n");
        }
        if !updates.is_empty() {
            out.push_str("WITH u (k, state, due, holder, v, expected, was) AS (VALUES ");
            for (i, (key, w, found)) in updates.iter().enumerate() {
                out.push_str(if i == 0 { "(" } else { ", (" });
                bytea(&mut out, key);
                let _ = write!(out, ", {}::int2, {}::int8, ", w.state, w.due);
                holder(&mut out, w.holder.as_deref());
                out.push_str(", ");
                bytea(&mut out, &w.value);
                out.push_str(", ");
                holder(&mut out, found.holder.as_deref());
                out.push_str(", ");
                bytea(&mut out, &found.value);
                out.push(')');
            }
            let set = match table {
                Table::Records => "state = u.state, due = u.due, holder = u.holder, record = u.v",
                Table::Marks => "due = u.due, mark = u.v",
            };
            // The fence: the row still holds what this batch read (its holder token, and its
            // exact bytes: a row read without a lock that another transaction rewrote since
            // matches nothing, and the batch re-runs).
            let fence = match table {
                Table::Records => " AND t.holder IS NOT DISTINCT FROM u.expected",
                Table::Marks => "",
            };
            let _ = write!(
                out,
                "), done AS (UPDATE {name} t SET {set} FROM u WHERE t.{key_col} = u.k{fence} AND t.{value_col} = u.was RETURNING 1) "
            );
            check_count(&mut out, updates.len());
        }
        if !deletes.is_empty() {
            out.push_str("WITH d (k, expected, was) AS (VALUES ");
            for (i, (key, found)) in deletes.iter().enumerate() {
                out.push_str(if i == 0 { "(" } else { ", (" });
                bytea(&mut out, key);
                out.push_str(", ");
                holder(&mut out, found.holder.as_deref());
                out.push_str(", ");
                bytea(&mut out, &found.value);
                out.push(')');
            }
            let fence = match table {
                Table::Records => " AND t.holder IS NOT DISTINCT FROM d.expected",
                Table::Marks => "",
            };
            let _ = write!(
                out,
                "), done AS (DELETE FROM {name} t USING d WHERE t.{key_col} = d.k{fence} AND t.{value_col} = d.was RETURNING 1) "
            );
            check_count(&mut out, deletes.len());
        }
    }
    out.push_str("COMMIT;");
    out
}

/// A holder-token literal (`NULL` for none).
fn holder(out: &mut String, token: Option<&[u8]>) {
    match token {
        Some(t) => bytea(out, t),
        None => out.push_str("NULL::bytea"),
    }
}

/// Ends a `WITH … done AS (… RETURNING 1)` with a check that `expected` rows were written:
/// otherwise the server raises an error (a text that is no integer, cast to one) and skips the
/// rest of the query, `COMMIT` included.
fn check_count(out: &mut String, expected: usize) {
    let _ = writeln!(
        out,
        "SELECT CASE WHEN count(*) = {expected} THEN 0 ELSE CAST('{FENCE_MARK} (' || count(*) || ' of {expected})' AS int) END FROM done;"
    );
}

/// Appends `keys` as a comma-separated list of bytea literals.
fn in_list(out: &mut String, keys: &[&[u8]]) {
    for (i, key) in keys.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        bytea(out, key);
    }
}

/// Ends whatever transaction the connection is in; a failure retires the connection.
pub(crate) fn rollback(conn: &mut Conn) {
    if let Err(e) = conn.client.batch_execute("ROLLBACK") {
        conn.saw(&e);
        conn.retire();
    }
}

/// Whether the pool should not get this connection back.
fn conn_broken(conn: &mut Pooled) -> bool {
    conn.is_broken()
}

impl Error {
    /// The same failure, as reported to every member of the batch it hit.
    pub(crate) fn clone_for_batch(&self) -> Error {
        match self {
            Error::OutcomeUnknown { source } => Error::OutcomeUnknown {
                source: source.clone(),
            },
            Error::Storage { source } => Error::Storage {
                source: source.clone(),
            },
            Error::Busy { queued, waited } => Error::Busy {
                queued: *queued,
                waited: *waited,
            },
            other => Error::Storage {
                source: StorageError::new(crate::postgres::conn::PoolError(other.to_string())),
            },
        }
    }
}
