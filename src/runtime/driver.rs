//! The group-commit driver for an engine with one writer and no partial rollback: it opens,
//! runs, commits, aborts and re-runs the batches of the protocol of `group.rs`, over a
//! transaction the engine supplies ([`BatchEngine`]; engine/commit.rs implements it for the file
//! engine). The model checker (`model_check.rs`) runs this same code over a fake transaction.
//!
//! - Within a batch the transaction visits members in order; each member runs its work (which
//!   re-reads records inside the shared transaction, so two requests for one key in a batch
//!   behave exactly as if serialised), then passes it on. The last member commits and tells
//!   every member the result. Nobody learns success before the commit returned.
//! - A member whose work fails after writing (a retryable abort, a store error, a panic) must
//!   leave nothing behind, and the engine cannot roll back part of a dirty transaction. So the
//!   transaction is aborted; the members before it (the prefix) re-run in a fresh
//!   transaction and commit; the members after it (which have not run yet) go back to the head
//!   of the queue for the next batch. No other member fails; a member re-runs once per failure
//!   behind it in its batch.
//! - A failed begin or commit fails every member of the batch (`OutcomeUnknown` after a failed
//!   commit) and latches fail-stop; queued callers then fail fast. Nothing commits after the
//!   latch: a member whose work failed with an I/O error latches before its prefix would re-run,
//!   and a batch in which a member's work latched is aborted, its members answered
//!   `FailStopped`.
//! - Pipelined engines (journal mode) return from the commit before it is durable: the batch
//!   hands leadership on, then waits for durability, then answers; a failed wait is
//!   `OutcomeUnknown` for the batch. A failed sync may latch while the next batch is already
//!   committing: that batch's wait fails too, so it is never answered `Committed`.
//! - No member ever waits without a thread that will signal it: every member is either queued
//!   (signalled by a leader), or in a batch (signalled by the baton or the committer).

use std::any::Any;
use std::fmt::Display;
use std::panic::resume_unwind;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::Error;
use crate::runtime::group::{self, Signal};
use crate::runtime::observe::{self, QueueWait, Stopwatch};
use crate::runtime::sync::Mutex;

/// The protocol's state for the engine `E`.
pub(crate) type Group<E> = group::Group<Baton<E>, Detached<<E as BatchEngine>::Work>>;
type Member<E> = group::Member<Baton<E>, Detached<<E as BatchEngine>::Work>>;

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

impl<T> Step<T> {
    /// Hands a run's value to `put` (the committed run's is the last one put) and reports the
    /// step without it.
    pub(crate) fn keep(self, put: impl FnOnce(T)) -> Step<()> {
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

/// A panic caught at the engine's storage boundary ([`BatchEngine::contain`]).
pub(crate) enum Fault {
    /// It unwound out of caller code: the caller's own payload, to be resumed on its thread.
    Caller(Box<dyn Any + Send>),
    /// The engine itself panicked (a damaged file, or a bug): the error it makes of that, not
    /// latched yet.
    Damaged(Error),
}

/// An engine's side of group commit: its transaction, and the steps the driver runs on it.
/// Every step that fails at the storage level latches fail-stop itself.
pub(crate) trait BatchEngine: Sized {
    /// The engine's name in traces and metrics.
    const ENGINE: observe::Engine;
    /// A batch's write transaction: it moves between the members' threads.
    type Txn: Send;
    /// What a thread holding the transaction keeps open while it runs detached members one
    /// after another (closed before the transaction moves on, commits or aborts).
    type Run<'t>;
    /// A member's work that any thread holding the transaction may run (`Send`).
    type Work: Send;

    /// The protocol's state.
    fn group(&self) -> &Group<Self>;
    /// `Err(FailStopped)` once the latch is set.
    fn check_writable(&self) -> Result<(), Error>;
    /// Begins a batch's transaction (a failure latches).
    fn begin_txn(&self) -> Result<Self::Txn, Error>;
    /// Opens what detached members run on.
    fn open_run<'t>(&self, txn: &'t Self::Txn) -> Self::Run<'t>;
    /// Runs a member's detached work.
    fn run_detached(&self, run: &mut Self::Run<'_>, work: &mut Self::Work) -> Step<()>;
    /// Commits, made durable whatever the durability mode when `durable` (a failure latches
    /// and is `OutcomeUnknown`). Returns the LSN the members' answers wait for
    /// ([`wait_durable`](Self::wait_durable)); 0 when the commit itself is durable.
    fn commit_txn(&self, txn: Self::Txn, durable: bool) -> Result<u64, Error>;
    /// Whether a commit returns before it is durable: leadership is then handed on before the
    /// members' answers wait for durability, so the next batch runs during the sync.
    fn pipelined(&self) -> bool {
        false
    }
    /// The LSN a batch in which nobody wrote waits for: what its members may have read.
    fn clean_lsn(&self) -> u64 {
        0
    }
    /// Returns once everything up to `lsn` is durable (a failure latches and is
    /// `OutcomeUnknown`).
    fn wait_durable(&self, _lsn: u64) -> Result<(), Error> {
        Ok(())
    }
    /// Aborts (a failure latches).
    fn abort_txn(&self, txn: Self::Txn);
    /// Latches fail-stop if `e` reports a storage-level failure; returns `e`.
    fn observe(&self, e: Error) -> Error;
    /// Latches fail-stop for damage found inside a write; returns `e`.
    fn latch_damage(&self, e: Error) -> Error;
    /// Latches fail-stop with `cause`.
    fn latch(&self, cause: &dyn Display);
    /// Runs `f` (a step of `while_` that calls into the storage) at the storage boundary: a
    /// panic is [`Fault::Caller`] if it unwound out of caller code, else [`Fault::Damaged`].
    fn contain<R>(&self, while_: &str, f: impl FnOnce() -> R) -> Result<R, Fault>;
}

/// A member's detached work, if it has one (`None`: the member runs its work on its own
/// thread). Taken out while it runs, put back for a re-run.
pub(crate) struct Detached<W>(Mutex<Option<W>>);

impl<W> Detached<W> {
    /// A member that runs its work on its own thread.
    pub(crate) fn none() -> Self {
        Detached(Mutex::new(None))
    }

    /// A member whose work the thread holding the batch's transaction runs.
    pub(crate) fn of(work: W) -> Self {
        Detached(Mutex::new(Some(work)))
    }

    fn take(&self) -> Option<W> {
        self.0.lock().take()
    }

    fn put_back(&self, work: W) {
        *self.0.lock() = Some(work);
    }
}

/// The baton: the batch's write transaction and where the batch stands.
pub(crate) struct Baton<E: BatchEngine> {
    txn: E::Txn,
    batch: Vec<Arc<Member<E>>>,
    pos: usize,
    durable: bool,
    /// Some member kept writes in the transaction.
    dirty: bool,
    /// Runs of the batch's members so far: 0, then +1 each time a failed member's prefix runs
    /// again (`shrink`).
    reruns: u32,
}

/// The members of `batch` other than `me`: those waiting while `me` runs a protocol step.
fn others_than<E: BatchEngine>(
    batch: &[Arc<Member<E>>],
    me: &Arc<Member<E>>,
) -> Vec<Arc<Member<E>>> {
    batch
        .iter()
        .filter(|m| !Arc::ptr_eq(m, me))
        .cloned()
        .collect()
}

/// One caller's part in the protocol: joins the group, and on each of its turns runs its
/// work — the detached work in `detached`, or else `own` — then passes the transaction on;
/// returns once the batch that ran its work last committed (or with the failure). `durable`:
/// the commit must be durable whatever the durability mode, and the caller is never turned away
/// by a full queue.
#[cfg(test)]
pub(crate) fn run_member<E: BatchEngine>(
    engine: &E,
    durable: bool,
    detached: Detached<E::Work>,
    mut own: impl FnMut(&E::Txn) -> Step<()>,
) -> Result<(), Error> {
    run_member_keeping(engine, durable, detached, &mut own).map_err(|(e, _)| e)
}

/// [`run_member`], which on a failure also gives back the member's detached work (for a
/// caller that runs it again). `own` is a trait object: the protocol is compiled once per
/// engine, not once per caller's closure.
pub(crate) fn run_member_keeping<E: BatchEngine>(
    engine: &E,
    durable: bool,
    detached: Detached<E::Work>,
    own: &mut dyn FnMut(&E::Txn) -> Step<()>,
) -> Result<(), (Error, Option<E::Work>)> {
    if let Err(e) = engine.check_writable() {
        return Err((e, detached.take()));
    }
    let group = engine.group();
    let me = Member::<E>::new(durable, detached);
    let mut queued = QueueWait::start();
    let mut signal = match group.join(&me) {
        Ok(s) => s,
        Err(e) => return Err((e, me.meta.take())),
    };
    loop {
        signal = match signal {
            Signal::Wait => me.wait(),
            Signal::Lead => {
                let batch = group.form_batch(&me);
                // Everyone but me (first in the batch) waits for a turn.
                let others = batch[1..].to_vec();
                match guarded(engine, &others, "beginning a write transaction", || {
                    open_batch(engine, batch)
                }) {
                    // `me` is first in the batch it formed.
                    Ok(Some(baton)) => Signal::Turn(baton),
                    Ok(None) => me.wait(),
                    Err(e) => Signal::Failed(e),
                }
            }
            Signal::Turn(mut baton) => {
                queued.ended();
                // The storage boundary: a panic in the caller's code (closure, clock) is that
                // member's failure and is resumed on its thread; a panic of the engine on
                // damaged data is `CorruptStore`, and fail-stop.
                let step = match me.meta.take() {
                    Some(mut work) => {
                        let step = engine.contain("writing a batch", || {
                            engine.run_detached(&mut engine.open_run(&baton.txn), &mut work)
                        });
                        me.meta.put_back(work);
                        step
                    }
                    None => engine.contain("writing a batch", || own(&baton.txn)),
                };
                match step {
                    Ok(Step::Done(())) => baton.dirty = true,
                    Ok(Step::Clean(())) => {}
                    Ok(Step::Abort(e)) => {
                        // Latch first (an I/O failure), as for damage: the prefix is then
                        // answered FailStopped instead of re-run and committed after the latch.
                        let e = engine.observe(e);
                        let prefix = baton.batch[..baton.pos].to_vec();
                        // A failed shrink has latched and answered the prefix itself.
                        let _ = guarded(engine, &prefix, "rolling back", || shrink(engine, baton));
                        return Err((e, me.meta.take()));
                    }
                    Err(Fault::Caller(panic)) => {
                        let prefix = baton.batch[..baton.pos].to_vec();
                        let _ = guarded(engine, &prefix, "rolling back", || shrink(engine, baton));
                        resume_unwind(panic);
                    }
                    Err(Fault::Damaged(e)) => {
                        // The engine's state after it stopped mid-write is unknown: latch
                        // first, so the prefix is answered FailStopped instead of re-run.
                        let e = engine.latch_damage(e);
                        let prefix = baton.batch[..baton.pos].to_vec();
                        let _ = guarded(engine, &prefix, "rolling back", || shrink(engine, baton));
                        return Err((e, me.meta.take()));
                    }
                };
                baton.durable |= me.durable;
                pass_on(engine, baton, &me)
            }
            Signal::Committed => return Ok(()),
            // A failed detached run was put back before this member heard of it.
            Signal::Failed(e) => return Err((e, me.meta.take())),
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
fn pass_on<E: BatchEngine>(
    engine: &E,
    mut baton: Box<Baton<E>>,
    me: &Arc<Member<E>>,
) -> Signal<Baton<E>> {
    // The detached members run one after another on one `Run`: what it opens is opened once
    // for the run, not once per member.
    let mut open = engine.open_run(&baton.txn);
    let failed = loop {
        // A batch re-run after a failure admits no one: it re-runs its prefix and commits,
        // and the members after the failure lead the next batch (design.md).
        if baton.pos + 1 >= baton.batch.len()
            && !(baton.reruns == 0 && engine.group().join_late(&mut baton.batch))
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
        let step = engine.contain("writing a batch", || {
            engine.run_detached(&mut open, &mut work)
        });
        next.meta.put_back(work);
        match step {
            Ok(Step::Done(())) => {
                baton.dirty = true;
                baton.durable |= next.durable;
            }
            Ok(Step::Clean(())) => baton.durable |= next.durable,
            Ok(Step::Abort(e)) => break Some((next, Signal::Failed(engine.observe(e)))),
            Err(Fault::Caller(panic)) => break Some((next, Signal::Panicked(panic))),
            Err(Fault::Damaged(e)) => {
                let e = engine.latch_damage(e);
                break Some((next, Signal::Failed(e)));
            }
        }
    };
    // Closed before the transaction moves on. Closing is engine code: were it to panic, the
    // members waiting on this thread are answered (`guarded_with`; the list of them is only
    // built then, not on every hand-off).
    let closed = guarded_with(
        engine,
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
            let _ = guarded(engine, &prefix, "rolling back", || shrink(engine, baton));
            next.send(signal);
            me.wait()
        }
        // Everyone but me waits for this commit.
        None if baton.pos + 1 >= baton.batch.len() => {
            let waiting = others_than(&baton.batch, me);
            guarded(engine, &waiting, "committing a batch", || {
                commit_batch(engine, baton, me)
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

/// Opens the transaction for a new batch and passes it to the first member. Returns the baton
/// if the first member is the caller (always the case for a new leader).
fn open_batch<E: BatchEngine>(engine: &E, batch: Vec<Arc<Member<E>>>) -> Option<Box<Baton<E>>> {
    let txn = engine.check_writable().and_then(|()| engine.begin_txn());
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
            fail_all(&batch, &e);
            engine.group().hand_off();
            None
        }
    }
}

/// Commits the batch (called on `me`'s thread, which ran its last member) and answers every
/// other member; returns `me`'s answer.
#[allow(
    clippy::boxed_local,
    reason = "the baton travels boxed between threads and ends here"
)]
fn commit_batch<E: BatchEngine>(
    engine: &E,
    baton: Box<Baton<E>>,
    me: &Arc<Member<E>>,
) -> Signal<Baton<E>> {
    let Baton {
        txn,
        batch,
        durable,
        dirty,
        reruns,
        ..
    } = *baton;
    let n = batch.len() as u64;
    let mut committed = None;
    let result = if !dirty && !durable {
        // Nobody wrote: nothing to make durable, and every answer is final once what the
        // members read is durable.
        engine.abort_txn(txn);
        engine.check_writable().map(|()| engine.clean_lsn())
    } else if let Err(e) = engine.check_writable() {
        // A member's work latched (a storage failure it met and answered without, e.g. a read
        // whose error became its answer): nothing commits after the latch. One check per
        // batch, not per member.
        engine.abort_txn(txn);
        Err(e)
    } else {
        let timer = Stopwatch::start();
        let result = engine.commit_txn(txn, durable);
        committed = Some(timer.elapsed());
        result
    };
    let counters = &engine.group().counters;
    // Pipelined: the next batch runs while this one's answers wait for durability. Nobody is
    // answered before `wait_durable` returned, and a failure there answers every member with
    // it (`OutcomeUnknown`: the commit may or may not survive).
    let result = match result {
        Ok(lsn) if engine.pipelined() => {
            engine.group().hand_off();
            match engine.wait_durable(lsn) {
                Ok(()) => {
                    observe::batch(E::ENGINE, batch.len(), reruns, committed);
                    counters.commits.fetch_add(1, Ordering::Relaxed);
                    counters.committed_ops.fetch_add(n, Ordering::Relaxed);
                    for m in batch.iter().filter(|m| !Arc::ptr_eq(m, me)) {
                        m.send(Signal::Committed);
                    }
                    return Signal::Committed;
                }
                Err(e) => {
                    fail_all(&others_than(&batch, me), &e);
                    return Signal::Failed(e);
                }
            }
        }
        other => other,
    };
    match result {
        Ok(_) => {
            observe::batch(E::ENGINE, batch.len(), reruns, committed);
            counters.commits.fetch_add(1, Ordering::Relaxed);
            counters.committed_ops.fetch_add(n, Ordering::Relaxed);
            engine.group().hand_off_around(batch.len(), || {
                for m in batch.iter().filter(|m| !Arc::ptr_eq(m, me)) {
                    m.send(Signal::Committed);
                }
            });
            Signal::Committed
        }
        Err(e) => {
            fail_all(&others_than(&batch, me), &e);
            engine.group().hand_off();
            Signal::Failed(e)
        }
    }
}

/// Removes the member at `baton.pos` (whose work failed) from its batch: aborts the shared
/// transaction, re-runs the members before it in a fresh one, and queues the ones after it at
/// the head of the queue.
#[allow(
    clippy::boxed_local,
    reason = "the baton travels boxed between threads and ends here"
)]
fn shrink<E: BatchEngine>(engine: &E, baton: Box<Baton<E>>) {
    let Baton {
        txn,
        batch,
        pos,
        reruns,
        ..
    } = *baton;
    let group = engine.group();
    // Requeue first (it cannot panic), so a panic in abort or begin strands nobody.
    group.requeue_front(&batch[pos + 1..]);
    engine.abort_txn(txn);
    let prefix = &batch[..pos];
    if prefix.is_empty() {
        group.hand_off();
        return;
    }
    group.counters.reruns.fetch_add(1, Ordering::Relaxed);
    match engine.check_writable().and_then(|()| engine.begin_txn()) {
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
            fail_all(prefix, &e);
            group.hand_off();
        }
    }
}

/// Runs a step of the protocol itself (begin, commit, abort: the engine, its storage backend)
/// while this thread holds the writer. If it panics, nobody would ever signal `waiting` (the
/// members that wait on this step and are in no queue): so latch fail-stop, fail them, hand
/// leadership on, and return the failure to this thread's own caller as the engine's damage
/// error (a damaged page is what makes these steps panic; after a panicking commit, whether it
/// reached the file is unknown, which the fail-stop covers: a retry after the reopen replays
/// if it did). Queued callers then fail fast on the latch. No caller code runs in these steps.
fn guarded<E: BatchEngine, R>(
    engine: &E,
    waiting: &[Arc<Member<E>>],
    step: &str,
    f: impl FnOnce() -> R,
) -> Result<R, Error> {
    guarded_with(engine, || waiting.to_vec(), step, f)
}

/// [`guarded`], with the waiting members listed by `waiting` only if `f` panics.
fn guarded_with<E: BatchEngine, R>(
    engine: &E,
    waiting: impl FnOnce() -> Vec<Arc<Member<E>>>,
    step: &str,
    f: impl FnOnce() -> R,
) -> Result<R, Error> {
    engine.contain(step, f).map_err(|fault| {
        let waiting = waiting();
        // Every step signals its members only after its last fallible call, so none of
        // `waiting` has been answered yet: `answer` does it when dropped, also while a
        // caller's panic resumed here unwinds (not expected: no caller code runs in these
        // steps, but a caller's panic stays one, and strands nobody).
        let mut answer = AnswerWaiting {
            engine,
            waiting: &waiting,
            step,
            error: None,
        };
        let e = match fault {
            Fault::Caller(panic) => resume_unwind(panic),
            Fault::Damaged(e) => engine.latch_damage(e),
        };
        answer.error = Some(e.for_another_caller());
        e
    })
}

/// Answers every one of `members` with `e` as another member of its batch hears it.
fn fail_all<E: BatchEngine>(members: &[Arc<Member<E>>], e: &Error) {
    group::fail_all(members, || e.for_another_caller());
}

/// Answers the members that wait on a protocol step that panicked, and hands leadership on, when
/// dropped.
struct AnswerWaiting<'a, E: BatchEngine> {
    engine: &'a E,
    waiting: &'a [Arc<Member<E>>],
    step: &'a str,
    /// Their answer; `None` while a caller's panic unwinds.
    error: Option<Error>,
}

impl<E: BatchEngine> Drop for AnswerWaiting<'_, E> {
    fn drop(&mut self) {
        let e = self.error.take().unwrap_or_else(|| {
            let cause = format!("a panic in caller code while {}", self.step);
            self.engine.latch(&cause);
            Error::FailStopped { cause }
        });
        fail_all(self.waiting, &e);
        self.engine.group().hand_off();
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
