//! Group commit on redb: concurrent writers share one redb write transaction and one fsync.
//!
//! Every caller runs its own work on its own thread (closures need neither `Send` nor
//! `'static`); what moves between threads is the write transaction itself, passed as a baton.
//! Who leads, queues and is answered is the protocol of `runtime/group.rs` (one lane: redb has
//! one writer); this file is its redb driver:
//! - Within a batch the transaction visits members in order; each member runs its work (which
//!   re-reads records inside the shared transaction, so two requests for one key in a batch
//!   behave exactly as if serialised), then passes it on. The last member commits and tells
//!   every member the result. Nobody learns success before the commit returned.
//! - A member whose work fails after writing (a retryable abort, a store error, a panic) must
//!   leave nothing behind, and redb cannot roll back part of a dirty transaction. So the
//!   transaction is aborted; the members before it (the prefix) re-run in a fresh
//!   transaction and commit; the members after it (which have not run yet) go back to the head
//!   of the queue for the next batch. No other member fails; a member re-runs once per failure
//!   behind it in its batch.
//! - A failed begin or commit fails every member of the batch (`OutcomeUnknown` after a failed
//!   commit) and latches fail-stop; queued callers then fail fast. No member ever waits without
//!   a thread that will signal it: every member is either queued (signalled by a leader), or in
//!   a batch (signalled by the baton or the committer).

use std::panic::resume_unwind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::WriteTransaction;

use crate::engine::boundary::{Panicked, catch_storage_panic};
use crate::engine::open::Open;
use crate::engine::store::ENGINE;
use crate::engine::store::Store;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::runtime::group;
pub(crate) use crate::runtime::group::GroupConfig;
use crate::runtime::observe::{self, QueueWait, Stopwatch};

/// The protocol's state for redb (one lane: redb has one writer).
pub(crate) type Group = group::Group<Baton, Detached>;
type Member = group::Member<Baton, Detached>;
type Signal = group::Signal<Baton>;

/// A member's work that any thread holding the batch's transaction may run (`Store::write_detached`:
/// the work is `Send + 'static`): the thread that finishes the member before it runs it at
/// once, instead of waking the member's own thread to run it (a hand-off between threads per
/// member is most of what a batch costs beyond its fsync).
type DetachedWork = Box<dyn FnMut(&mut Open<'_>, Timestamp) -> Step<()> + Send>;

/// A member's detached work, if it has one (`None`: the member runs its work on its own
/// thread). Taken out while it runs, put back for a re-run.
pub(crate) struct Detached(parking_lot::Mutex<Option<DetachedWork>>);

impl Detached {
    fn none() -> Self {
        Detached(parking_lot::Mutex::new(None))
    }

    fn of(work: DetachedWork) -> Self {
        Detached(parking_lot::Mutex::new(Some(work)))
    }

    fn take(&self) -> Option<DetachedWork> {
        self.0.lock().take()
    }

    fn put_back(&self, work: DetachedWork) {
        *self.0.lock() = Some(work);
    }
}

/// The members of `batch` other than `me`: those waiting while `me` runs a protocol step.
fn others_than(batch: &[Arc<Member>], me: &Arc<Member>) -> Vec<Arc<Member>> {
    batch
        .iter()
        .filter(|m| !Arc::ptr_eq(m, me))
        .cloned()
        .collect()
}

/// What a member's work reports.
pub(crate) enum Step<T> {
    /// Keep my writes in the batch; give me `T` once the batch has committed.
    Done(T),
    /// I wrote nothing; give me `T` once the batch has ended. A batch in which every member
    /// answered `Clean` is aborted instead of committed: no fsync for pure reads.
    Clean(T),
    /// Roll back my writes (the batch re-runs without me) and give me this error now.
    Abort(Error),
}

/// How durable the commit of a write call must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// In the store's durability mode: fsynced before the answer with
    /// [`crate::Durability::Immediate`], by the flusher with [`crate::Durability::Periodic`].
    AsConfigured,
    /// Fsynced before the answer whatever the mode, and never turned away by a full queue: the
    /// flusher's commit, which bounds the loss window of `Durability::Periodic`.
    Forced,
}

/// The baton: the batch's write transaction and where the batch stands.
pub(crate) struct Baton {
    txn: WriteTransaction,
    batch: Vec<Arc<Member>>,
    pos: usize,
    durable: bool,
    /// Some member kept writes in the transaction.
    dirty: bool,
    /// Runs of the batch's members so far: 0, then +1 each time a failed member's prefix runs
    /// again (`shrink`).
    reruns: u32,
}

impl Store {
    /// Runs `work` in a write transaction shared with concurrent callers, and returns its value
    /// only after that transaction committed. `work` may run more than once (when another
    /// member of its batch fails); only the committed run's writes and value count. `durable`
    /// says whether the commit must be fsynced whatever the durability mode.
    pub(crate) fn write<T>(
        &self,
        durable: Durable,
        mut work: impl FnMut(&WriteTransaction, Timestamp) -> Step<T>,
    ) -> Result<T, Error> {
        let value = std::cell::RefCell::new(None);
        self.run_member(durable, Detached::none(), |txn, now| {
            work(txn, now).keep(|v| *value.borrow_mut() = Some(v))
        })?;
        // Invariant: run_member returns Ok only after a committed run, and each run keeps its
        // value.
        value.into_inner().ok_or(Error::Internal {
            what: "a batch member was told of a commit it did not take part in",
        })
    }

    /// [`Store::write`] for `Send + 'static` work, which whichever thread holds the batch's
    /// transaction may run (without waking this caller's thread for its turn): the same
    /// protocol, answers and failures, with one thread hand-off per batch member fewer. A panic
    /// of `work` unwinds on this caller's thread, as with `write`.
    pub(crate) fn write_detached<T: Send + 'static>(
        &self,
        durable: Durable,
        mut work: impl FnMut(&mut Open<'_>, Timestamp) -> Step<T> + Send + 'static,
    ) -> Result<T, Error> {
        let slot: Arc<parking_lot::Mutex<Option<T>>> = Arc::default();
        let kept = Arc::clone(&slot);
        let detached: DetachedWork =
            Box::new(move |txn, now| work(txn, now).keep(|v| *kept.lock() = Some(v)));
        // Its own turn runs the detached work too (`run_member` takes it from the member).
        self.run_member(durable, Detached::of(detached), |_, _| Step::Clean(()))?;
        let value = slot.lock().take();
        value.ok_or(Error::Internal {
            what: "a batch member was told of a commit it did not take part in",
        })
    }

    /// One caller's part in the protocol: joins the group, and on each of its turns runs its
    /// work — the detached work in `detached`, or else `own` — then passes the transaction on;
    /// returns once the batch that ran its work last committed (or with the failure).
    fn run_member(
        &self,
        durable: Durable,
        detached: Detached,
        mut own: impl FnMut(&WriteTransaction, Timestamp) -> Step<()>,
    ) -> Result<(), Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        self.check_writable()?;
        let group = &self.group();
        let me = Member::new(durable == Durable::Forced, detached);
        let mut queued = QueueWait::start();
        let mut signal = group.join(&me)?;
        loop {
            signal = match signal {
                Signal::Wait => me.wait(),
                Signal::Lead => {
                    let batch = group.form_batch(&me);
                    // Everyone but me (first in the batch) waits for a turn.
                    let others = batch[1..].to_vec();
                    match self.guarded(&others, "beginning a write transaction", || {
                        self.open_batch(batch)
                    }) {
                        // `me` is first in the batch it formed.
                        Ok(Some(baton)) => Signal::Turn(baton),
                        Ok(None) => me.wait(),
                        Err(e) => Signal::Failed(e),
                    }
                }
                Signal::Turn(mut baton) => {
                    queued.ended();
                    // The storage boundary (store.rs): a panic in the caller's closure or clock
                    // (marked as caller code) is that member's failure and is resumed on its
                    // thread; a panic of redb on damaged data is `CorruptStore`, and fail-stop.
                    let step = match me.meta.take() {
                        Some(mut work) => {
                            let step = catch_storage_panic(|| {
                                work(&mut Open::new(&baton.txn), self.now_in_section())
                            });
                            me.meta.put_back(work);
                            step
                        }
                        None => catch_storage_panic(|| own(&baton.txn, self.now_in_section())),
                    };
                    match step {
                        Ok(Step::Done(())) => baton.dirty = true,
                        Ok(Step::Clean(())) => {}
                        Ok(Step::Abort(e)) => {
                            let prefix = baton.batch[..baton.pos].to_vec();
                            // A failed shrink has latched and answered the prefix itself.
                            let _ = self.guarded(&prefix, "rolling back", || self.shrink(baton));
                            return Err(self.observe(e));
                        }
                        Err(Panicked::Caller(panic)) => {
                            let prefix = baton.batch[..baton.pos].to_vec();
                            let _ = self.guarded(&prefix, "rolling back", || self.shrink(baton));
                            resume_unwind(panic);
                        }
                        Err(storage @ Panicked::Storage(_)) => {
                            // redb's state after it stopped mid-write is unknown: latch first,
                            // so the prefix is answered FailStopped instead of re-run.
                            let e = self.latch_damage(storage.into_error("writing a batch"));
                            let prefix = baton.batch[..baton.pos].to_vec();
                            let _ = self.guarded(&prefix, "rolling back", || self.shrink(baton));
                            return Err(e);
                        }
                    };
                    baton.durable |= me.durable;
                    self.pass_on(baton, &me)
                }
                Signal::Committed => return Ok(()),
                Signal::Failed(e) => return Err(e),
                Signal::Panicked(panic) => resume_unwind(panic),
            };
        }
    }

    /// After the member at `baton.pos` ran (on the thread of `me`): runs the detached members
    /// that follow, here, then gives the transaction to the next member that runs its own work,
    /// or commits after the last. Returns what `me` is told next.
    ///
    /// Before committing, the batch admits the callers that queued meanwhile, in queue order
    /// (`Group::join_late`): a detached one runs here without a wake-up, one that runs its own
    /// closure gets the transaction on its thread, and both are spared a wait for the next
    /// commit. The batch cannot grow without bound: its members wait for its commit, so only
    /// callers outside it can queue, up to `max_batch`. A re-run batch admits no one.
    fn pass_on(&self, mut baton: Box<Baton>, me: &Arc<Member>) -> Signal {
        // The detached members run one after another on one `Open` (engine/open.rs): the
        // record tables are opened once for the run, not once per member.
        let mut open = Open::new(&baton.txn);
        let failed = loop {
            // A batch re-run after a failure admits no one: it re-runs its prefix and commits,
            // and the members after the failure lead the next batch (design.md).
            if baton.pos + 1 >= baton.batch.len()
                && !(baton.reruns == 0 && self.group().join_late(&mut baton.batch))
            {
                break None;
            }
            let Some(next) = baton.batch.get(baton.pos + 1).cloned() else {
                break None;
            };
            let Some(mut work) = next.meta.take() else {
                break None;
            };
            baton.pos += 1;
            let step = catch_storage_panic(|| work(&mut open, self.now_in_section()));
            next.meta.put_back(work);
            match step {
                Ok(Step::Done(())) => {
                    baton.dirty = true;
                    baton.durable |= next.durable;
                }
                Ok(Step::Clean(())) => baton.durable |= next.durable,
                Ok(Step::Abort(e)) => break Some((next, Signal::Failed(self.observe(e)))),
                Err(Panicked::Caller(panic)) => break Some((next, Signal::Panicked(panic))),
                Err(storage @ Panicked::Storage(_)) => {
                    let e = self.latch_damage(storage.into_error("writing a batch"));
                    break Some((next, Signal::Failed(e)));
                }
            }
        };
        // Closed before the transaction moves on. Closing is redb code: were it to panic, the
        // members waiting on this thread are answered (`guarded_with`; the list of them is
        // only built then, not on every hand-off).
        let closed = self.guarded_with(
            || others_than(&baton.batch, me),
            "closing the record tables",
            || drop(open),
        );
        if let Err(e) = closed {
            return Signal::Failed(e);
        }
        match failed {
            // The member's work failed: the batch goes on without it (its prefix, me included,
            // re-runs; the members after it queue again), and it hears why on its own thread.
            Some((next, signal)) => {
                let prefix = baton.batch[..baton.pos].to_vec();
                let _ = self.guarded(&prefix, "rolling back", || self.shrink(baton));
                next.send(signal);
                me.wait()
            }
            // Everyone but me waits for this commit.
            None if baton.pos + 1 >= baton.batch.len() => {
                let waiting = others_than(&baton.batch, me);
                self.guarded(&waiting, "committing a batch", || {
                    self.commit_batch(baton, me)
                })
                .unwrap_or_else(Signal::Failed)
            }
            None => {
                baton.pos += 1;
                let next = baton.batch[baton.pos].clone();
                next.send(Signal::Turn(baton));
                me.wait()
            }
        }
    }

    /// Opens the transaction for a new batch and passes it to the first member. Returns the
    /// baton if the first member is the caller (always the case for a new leader).
    fn open_batch(&self, batch: Vec<Arc<Member>>) -> Option<Box<Baton>> {
        let txn = self.check_writable().and_then(|()| self.begin_batch_txn());
        match txn {
            Ok(txn) => Some(Box::new(Baton {
                txn,
                batch,
                pos: 0,
                durable: false,
                dirty: false,
                reruns: 0,
            })),
            Err(e) => {
                self.fail_all(&batch, &e);
                self.group().hand_off();
                None
            }
        }
    }

    /// Commits the batch (called on `me`'s thread, which ran its last member) and answers every
    /// other member; returns `me`'s answer.
    fn commit_batch(&self, baton: Box<Baton>, me: &Arc<Member>) -> Signal {
        let Baton {
            mut txn,
            batch,
            durable,
            dirty,
            reruns,
            ..
        } = *baton;
        let n = batch.len() as u64;
        let mut committed = None;
        let result = if !dirty && !durable {
            // Nobody wrote: nothing to make durable, and every answer is already final.
            self.abort(txn);
            match self.failure() {
                None => Ok(()),
                Some(cause) => Err(Error::FailStopped { cause }),
            }
        } else {
            let relaxed = !durable && self.relaxed_durability();
            if durable {
                self.force_durable(&mut txn);
            }
            let timer = Stopwatch::start();
            let result = self.commit(txn);
            committed = Some(timer.elapsed());
            if result.is_ok() {
                // Batches commit one at a time, so this ordering is exact: a durable commit
                // persists every earlier one, a relaxed one leaves work for the flusher.
                self.set_unflushed(relaxed);
            }
            result
        };
        let counters = &self.group().counters;
        match result {
            Ok(()) => {
                observe::batch(ENGINE, batch.len(), reruns, committed);
                counters.commits.fetch_add(1, Ordering::Relaxed);
                counters.committed_ops.fetch_add(n, Ordering::Relaxed);
                self.group().hand_off_around(batch.len(), || {
                    for m in batch.iter().filter(|m| !Arc::ptr_eq(m, me)) {
                        m.send(Signal::Committed);
                    }
                });
                Signal::Committed
            }
            Err(e) => {
                self.fail_all(&others_than(&batch, me), &e);
                self.group().hand_off();
                Signal::Failed(e)
            }
        }
    }

    /// Removes the member at `baton.pos` (whose work failed) from its batch: aborts the shared
    /// transaction, re-runs the members before it in a fresh one, and queues the ones after it
    /// at the head of the queue.
    fn shrink(&self, baton: Box<Baton>) {
        let Baton {
            txn,
            batch,
            pos,
            reruns,
            ..
        } = *baton;
        let group = &self.group();
        // Requeue first (it cannot panic), so a panic in abort or begin strands nobody.
        group.requeue_front(&batch[pos + 1..]);
        self.abort(txn);
        let prefix = &batch[..pos];
        if prefix.is_empty() {
            group.hand_off();
            return;
        }
        group.counters.reruns.fetch_add(1, Ordering::Relaxed);
        match self.check_writable().and_then(|()| self.begin_batch_txn()) {
            Ok(txn) => {
                let first = prefix[0].clone();
                first.send(Signal::Turn(Box::new(Baton {
                    txn,
                    batch: prefix.to_vec(),
                    pos: 0,
                    durable: false,
                    dirty: false,
                    reruns: reruns.saturating_add(1),
                })));
            }
            Err(e) => {
                self.fail_all(prefix, &e);
                group.hand_off();
            }
        }
    }

    /// Runs a step of the protocol itself (begin, commit, abort: redb, the storage backend)
    /// while this thread holds the writer. If it panics, nobody would ever signal `waiting` (the
    /// members that wait on this step and are in no queue): so latch fail-stop, fail them, hand
    /// leadership on, and return the failure to this thread's own caller as
    /// [`Error::CorruptStore`] (redb failing on a damaged page is what makes these steps panic;
    /// after a panicking commit, whether it reached the file is unknown, which the fail-stop
    /// covers: a retry after the reopen replays if it did). Queued callers then fail fast on the
    /// latch. No caller code runs in these steps.
    fn guarded<R>(
        &self,
        waiting: &[Arc<Member>],
        step: &str,
        f: impl FnOnce() -> R,
    ) -> Result<R, Error> {
        self.guarded_with(|| waiting.to_vec(), step, f)
    }

    /// [`Store::guarded`], with the waiting members listed by `waiting` only if `f` panics.
    fn guarded_with<R>(
        &self,
        waiting: impl FnOnce() -> Vec<Arc<Member>>,
        step: &str,
        f: impl FnOnce() -> R,
    ) -> Result<R, Error> {
        catch_storage_panic(f).map_err(|panic| {
            let waiting = waiting();
            // Every step signals its members only after its last fallible call, so none of
            // `waiting` has been answered yet: `answer` does it when dropped, also while a
            // caller's panic resumed by `into_error` unwinds (not expected: no caller code runs
            // in these steps, but a caller's panic stays one, and strands nobody).
            let mut answer = AnswerWaiting {
                store: self,
                waiting: &waiting,
                step,
                error: None,
            };
            let e = self.latch_damage(panic.into_error(step));
            answer.error = Some(e.for_another_caller());
            e
        })
    }

    fn fail_all(&self, members: &[Arc<Member>], e: &Error) {
        group::fail_all(members, || e.for_another_caller());
    }
}

/// Answers the members that wait on a protocol step that panicked, and hands leadership on, when
/// dropped.
struct AnswerWaiting<'a> {
    store: &'a Store,
    waiting: &'a [Arc<Member>],
    step: &'a str,
    /// Their answer; `None` while a caller's panic unwinds.
    error: Option<Error>,
}

impl Drop for AnswerWaiting<'_> {
    fn drop(&mut self) {
        let e = self.error.take().unwrap_or_else(|| {
            let cause = format!("a panic in caller code while {}", self.step);
            self.store.latch(&cause);
            Error::FailStopped { cause }
        });
        self.store.fail_all(self.waiting, &e);
        self.store.group().hand_off();
    }
}

impl Error {
    /// The same failure, as reported to another member of the batch it hit: an unknown outcome
    /// stays one, anything else says the store is fail-stopped (a failed begin or commit latched
    /// it).
    pub(crate) fn for_another_caller(&self) -> Error {
        match self {
            Error::OutcomeUnknown { source } => Error::OutcomeUnknown {
                source: source.clone(),
            },
            Error::FailStopped { cause } => Error::FailStopped {
                cause: cause.clone(),
            },
            other => Error::FailStopped {
                cause: other.to_string(),
            },
        }
    }
}

impl<T> Step<T> {
    /// Hands a run's value to `put` (the committed run's is the last one put) and reports the
    /// step without it.
    fn keep(self, put: impl FnOnce(T)) -> Step<()> {
        match self {
            Step::Done(v) => {
                put(v);
                Step::Done(())
            }
            Step::Clean(v) => {
                put(v);
                Step::Clean(())
            }
            Step::Abort(e) => Step::Abort(e),
        }
    }
}
