//! Group commit on redb: concurrent writers share one redb write transaction and one fsync.
//!
//! Every caller runs its own work on its own thread (closures need neither `Send` nor
//! `'static`); what moves between threads is the write transaction itself, passed as a baton.
//! Who leads, queues and is answered is the protocol of `runtime/group.rs` (one lane: redb has
//! one writer); how a batch runs, commits, aborts and re-runs its prefix is the driver of
//! `runtime/driver.rs`. This file is redb's side of it ([`BatchEngine`] for [`Store`]): the
//! transaction, its begin, commit and abort, the tables opened once per run of detached members,
//! the storage boundary and the fail-stop latch.

use std::cell::RefCell;
use std::fmt::Display;
use std::sync::Arc;

use redb::WriteTransaction;

use crate::engine::journal::applier::Hold;
use crate::engine::journal::{Capture, View, Wtx};

use crate::engine::boundary::{Panicked, catch_storage_panic, damaged};
use crate::engine::open::Open;
use crate::engine::store::ENGINE;
use crate::engine::store::Store;
use crate::error::Error;
use crate::model::clock::Timestamp;
pub(crate) use crate::runtime::driver::Step;
use crate::runtime::driver::{self, BatchEngine, Detached, Fault};
pub(crate) use crate::runtime::group::GroupConfig;
use crate::runtime::observe;

/// The protocol's state for redb (one lane: redb has one writer).
pub(crate) type Group = driver::Group<Store>;

/// A member's work that any thread holding the batch's transaction may run (`Store::write_detached`:
/// the work is `Send + 'static`): the thread that finishes the member before it runs it at
/// once, instead of waking the member's own thread to run it (a hand-off between threads per
/// member is most of what a batch costs beyond its fsync).
type DetachedWork = Box<dyn FnMut(&mut Open<'_>, Timestamp) -> Step<()> + Send>;

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

/// What a batch runs on: redb's write transaction, or (journal mode) a view.
#[allow(
    clippy::large_enum_variant,
    reason = "one per batch, moved with it: boxing would add an allocation per batch"
)]
enum Source {
    Redb(WriteTransaction),
    View(View),
}

/// A batch's source and, in journal mode, the entry its writes make.
pub(crate) struct Batch {
    source: Source,
    capture: Option<Capture>,
    /// Journal mode, a batch on redb's own write transaction: the applier makes no rounds
    /// while it lives.
    hold: Option<Hold>,
}

/// A member's failure that means "run me on redb's own write transaction": its closure opened,
/// on a view, a table the journal cannot replay. It never reaches a caller: the member runs
/// again ([`Store::run_member`]).
const ON_REDB: &str = "a closure needs redb's own write transaction";

/// `step`, or the failure that re-runs the member on redb's own transaction when its run
/// asked for it (a view's capture is fresh for every run: `shrink` begins a new batch).
fn on_redb_if_asked(wtx: Wtx<'_>, step: Step<()>) -> Step<()> {
    if wtx.wants_redb() {
        Step::Abort(Error::Internal { what: ON_REDB })
    } else {
        step
    }
}

impl Batch {
    /// The handle members write through.
    pub(crate) fn wtx(&self) -> Wtx<'_> {
        match (&self.source, &self.capture) {
            (Source::View(view), Some(capture)) => Wtx::view(view, capture),
            (Source::Redb(txn), capture) => Wtx::new(txn, capture.as_ref()),
            // Invariant: `begin_txn` gives every view a capture.
            (Source::View(view), None) => {
                unreachable!("a view without a capture ({} sealed)", view.through)
            }
        }
    }
}

impl Store {
    /// Runs `work` in a write transaction shared with concurrent callers, and returns its value
    /// only after that transaction committed. `work` may run more than once (when another
    /// member of its batch fails); only the committed run's writes and value count. `durable`
    /// says whether the commit must be fsynced whatever the durability mode.
    pub(crate) fn write<T>(
        &self,
        durable: Durable,
        mut work: impl FnMut(&Wtx<'_>, Timestamp) -> Step<T>,
    ) -> Result<T, Error> {
        let value = RefCell::new(None);
        self.run_member(durable, Detached::none(), &mut |txn, now| {
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
        self.run_member(durable, Detached::of(detached), &mut |_, _| Step::Clean(()))?;
        let value = slot.lock().take();
        value.ok_or(Error::Internal {
            what: "a batch member was told of a commit it did not take part in",
        })
    }

    /// One caller's part in the protocol (`runtime/driver.rs`), its work run either as
    /// `detached` or as `own` (a trait object: compiled once, not once per caller's closure).
    fn run_member(
        &self,
        durable: Durable,
        mut detached: Detached<DetachedWork>,
        own: &mut dyn FnMut(&Wtx<'_>, Timestamp) -> Step<()>,
    ) -> Result<(), Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        loop {
            let result = driver::run_member_keeping(
                self,
                durable == Durable::Forced,
                detached,
                &mut |batch| {
                    let wtx = batch.wtx();
                    on_redb_if_asked(wtx, own(&wtx, self.now_in_section()))
                },
            );
            match result {
                Ok(()) => return Ok(()),
                Err((Error::Internal { what }, work)) if what == ON_REDB => {
                    // Journal mode: the next batches run on redb's own transaction, and
                    // this member joins one of them.
                    if let Some(applier) = self.applier() {
                        applier.want_redb();
                    }
                    detached = work.map_or_else(Detached::none, Detached::of);
                }
                Err((e, _)) => {
                    // Journal mode: a member's own error (a payload mismatch, a key in
                    // progress) may rest on an entry not yet durable; like an answer, it waits
                    // for what it read.
                    let _ = self.read_durable();
                    return Err(e);
                }
            }
        }
    }
}

/// redb's steps of the driver: every storage-level failure latches (engine/store/txn.rs).
impl BatchEngine for Store {
    const ENGINE: observe::Engine = ENGINE;
    type Txn = Batch;
    type Run<'t> = Open<'t>;
    type Work = DetachedWork;

    fn group(&self) -> &Group {
        Store::group(self)
    }

    fn check_writable(&self) -> Result<(), Error> {
        Store::check_writable(self)
    }

    fn begin_txn(&self) -> Result<Batch, Error> {
        let (Some(applier), Some(journal)) = (self.applier(), self.journal_arc()) else {
            // Direct mode: redb's transaction, committed durably (or by the flusher).
            let txn = self.begin_batch_txn()?;
            return Ok(Batch {
                source: Source::Redb(txn),
                capture: None,
                hold: None,
            });
        };
        if applier.take_redb_batch() {
            // On redb's own transaction: redb first holds every sealed entry, and the applier
            // makes no rounds until this batch ends.
            let hold = applier.hold(&journal).map_err(|cause| {
                self.latch(&cause);
                Error::FailStopped { cause }
            })?;
            let txn = self.begin_batch_txn()?;
            return Ok(Batch {
                source: Source::Redb(txn),
                capture: Some(Capture::default()),
                hold: Some(hold),
            });
        }
        // The snapshot first: P keeps every version above it while the view lives, and no
        // entry is sealed until this batch seals its own.
        let snap = applier.snapshot();
        let view = View {
            snap,
            applier: Arc::clone(applier),
            through: journal.sealed(),
        };
        Ok(Batch {
            source: Source::View(view),
            capture: Some(Capture::default()),
            hold: None,
        })
    }

    fn open_run<'t>(&self, batch: &'t Batch) -> Open<'t> {
        Open::new(batch.wtx())
    }

    fn run_detached(&self, run: &mut Open<'_>, work: &mut DetachedWork) -> Step<()> {
        let step = work(run, self.now_in_section());
        on_redb_if_asked(run.txn(), step)
    }

    fn commit_txn(&self, batch: Batch, durable: bool) -> Result<u64, Error> {
        let Batch {
            source,
            capture,
            hold,
        } = batch;
        let mut txn = match source {
            Source::Redb(txn) => txn,
            Source::View(view) => {
                // Invariant: `begin_txn` gives every view a capture.
                let capture = capture.unwrap_or_default();
                return self.commit_view(view, capture, durable);
            }
        };
        if let Some(hold) = hold {
            // Invariant: `begin_txn` gives every held batch a capture.
            let capture = capture.unwrap_or_default();
            return self.commit_held(txn, capture, durable, hold);
        }
        let relaxed = !durable && self.relaxed_durability();
        if durable {
            self.force_durable(&mut txn);
        }
        let result = self.commit(txn);
        if result.is_ok() {
            // Batches commit one at a time, so this ordering is exact: a durable commit
            // persists every earlier one, a relaxed one leaves work for the flusher.
            self.set_unflushed(relaxed);
        }
        result.map(|()| 0)
    }

    fn abort_txn(&self, batch: Batch) {
        // A view's writes are its capture's: dropping it is the abort.
        if let Source::Redb(txn) = batch.source {
            self.abort(txn);
        }
    }

    fn pipelined(&self) -> bool {
        self.journal().is_some()
    }

    fn clean_lsn(&self) -> u64 {
        self.journal().map_or(0, |j| j.sealed())
    }

    fn wait_durable(&self, lsn: u64) -> Result<(), Error> {
        self.journal_durable(lsn)
    }

    fn observe(&self, e: Error) -> Error {
        Store::observe(self, e)
    }

    fn latch_damage(&self, e: Error) -> Error {
        Store::latch_damage(self, e)
    }

    fn latch(&self, cause: &dyn Display) {
        Store::latch(self, cause);
    }

    fn contain<R>(&self, while_: &str, f: impl FnOnce() -> R) -> Result<R, Fault> {
        catch_storage_panic(f).map_err(|panic| match panic {
            Panicked::Caller(payload) => Fault::Caller(payload),
            Panicked::Storage(message) => Fault::Damaged(damaged(while_, &message)),
        })
    }
}
