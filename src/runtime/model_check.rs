//! The group-commit protocol, model-checked with loom: the shipped `group.rs` and `driver.rs`
//! (their `Mutex` and `Condvar` are loom's under `--cfg idem_loom`, `sync.rs`) driven by 2–3 callers
//! over a fake engine, in every interleaving loom explores within its preemption bound.
//!
//! ```text
//! RUSTFLAGS="--cfg idem_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib runtime::model_check
//! ```
//!
//! (A target directory of its own: the flag rebuilds every dependency.) Without the flag only
//! `regressions` runs: the schedules the checker found failing, pinned on std threads.
//!
//! The fake engine's transaction is a log of the writes of the members that ran in it: a
//! commit appends it to the committed history, an abort drops it, and a re-run prefix writes
//! again into a fresh one. Around it, ghost state records each member's runs and answer: a std
//! mutex (no scheduling point), except that the log of commits and aborts and the answers'
//! checks against it go through a loom mutex, and the latch is one, so that loom orders a
//! commit and a check, or a latch and a commit, both ways. Properties, and where each is
//! asserted:
//!
//! 1. **Every caller is answered exactly once.** Each caller's thread returns from
//!    `run_member` (an answer, or its own panic resumed); a caller left waiting is a deadlock,
//!    which loom reports (every thread blocked). `Member::send` asserts no signal overwrites
//!    one not yet taken, and `Member`'s drop that none is left untaken (sent after the answer).
//! 2. **No answer before its batch committed.** When a caller returns `Ok`, the transaction its
//!    last run was in has committed, or ended without any writes (a batch of clean members is
//!    aborted instead of committed, its answers final); asserted on the caller's thread at once.
//! 3. **No member's writes in a committed batch that reported it failed.** After every thread
//!    ended: a caller answered with an error or a panic has no write in any committed
//!    transaction (with `OutcomeUnknown`, at most in the one whose commit failed); a caller
//!    answered `Ok` that writes has exactly one write in the committed history, from its last
//!    run; nobody's write is committed twice.
//! 4. **Nothing is committed after the fail-stop latch is set** by the protocol's own steps or
//!    a member's work (a failed begin, commit or abort, damage, an I/O error a member reports
//!    or swallows): the fake's commit asserts the latch is clear. A latch set from outside the
//!    batches (the closing store of `closing_store_latched_from_outside`) races a commit
//!    already decided, so only 1–3 and 5 are checked there; so does a failed sync of an earlier
//!    batch with pipelined commits (property 6 then keeps the later batch from being answered
//!    `Ok`).
//! 5. **Bounded re-runs.** Every run asserts the member's runs are at most the batch size,
//!    and at most one more than the failing members of the case (a member re-runs once per
//!    failure behind it in its batch).
//! 6. **Pipelined commits (journal mode): no answer before durability.** With `pipelined`, a
//!    commit returns before it is durable, leadership passes on, and the members wait for
//!    `wait_durable`: when a caller returns `Ok`, the LSN of its last transaction (or, for a
//!    batch that wrote nothing, the LSN it waited for) is durable; asserted on its thread at
//!    once. A sync that fails (`sync_fails`) latches and fails every later wait: no entry above
//!    the durable one is answered `Ok`, and the members of a committed batch whose sync failed
//!    hear `OutcomeUnknown` (their writes may survive).
//!
//! Timed waits: loom has none. A case with a full queue runs with `queue_timeout` zero (every
//! wait for room times out at once: `Busy`) or an hour (never times out: the waiter must be
//! woken by the room it waits for).
//!
//! Bounds: a case of two threads (two callers) is explored exhaustively; a case of three (three
//! callers, or two and the outside latch) up to `PREEMPTIONS` (3) preemptions per execution
//! (schedules with more are not explored; `LOOM_MAX_PREEMPTIONS` sets the bound for every
//! case). loom counts executions as it explores them; each case prints its count.

// Outside `--cfg idem_loom` only the regression tests run: they use part of the fake.
#![cfg_attr(not(idem_loom), allow(dead_code))]

use std::any::Any;
use std::cell::RefCell;
use std::fmt::Display;
use std::panic::{AssertUnwindSafe, catch_unwind, panic_any};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, StorageError};
use crate::runtime::driver::{BatchEngine, Detached, Fault, Group, Step, run_member};
use crate::runtime::group::GroupConfig;
use crate::runtime::observe;
use crate::runtime::sync::Mutex;

/// Preemptions per execution explored in a case of three threads (`LOOM_MAX_PREEMPTIONS`
/// overrides it); a case of two threads is explored exhaustively.
#[cfg(idem_loom)]
const PREEMPTIONS: usize = 3;

/// What a caller's work does on each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    /// Writes, and keeps its write (`Step::Done`).
    Write,
    /// Writes nothing (`Step::Clean`).
    Read,
    /// Writes, then fails with an error that is no I/O failure (`Step::Abort`).
    Fail,
    /// Writes and keeps it on its first run, fails (as `Fail`) on a re-run: an outcome that
    /// is not repeatable.
    FailOnRerun,
    /// Writes, then its caller code panics.
    Panic,
    /// Writes, then the engine panics under it (a damaged page: `Fault::Damaged`).
    Damage,
    /// Writes, then fails with an I/O error, which the driver's `observe` latches.
    FailIo,
    /// Hits an I/O error (which the engine latches where it happens), swallows it and writes
    /// nothing: a read whose storage error became an answer.
    ReadIo,
    /// Hits an I/O error (latched), swallows it and keeps a write.
    WriteIo,
}

impl Act {
    /// The caller is answered with a failure of its own.
    fn fails(self) -> bool {
        matches!(self, Act::Fail | Act::Panic | Act::Damage | Act::FailIo)
    }

    /// The caller's work may fail.
    fn may_fail(self) -> bool {
        self.fails() || self == Act::FailOnRerun
    }

    /// The work latches fail-stop.
    fn latches(self) -> bool {
        matches!(self, Act::Damage | Act::FailIo | Act::ReadIo | Act::WriteIo)
    }

    /// The work keeps a write when it succeeds.
    fn writes(self) -> bool {
        matches!(self, Act::Write | Act::WriteIo | Act::FailOnRerun)
    }
}

/// One caller of a case.
#[derive(Debug, Clone, Copy)]
struct Caller {
    act: Act,
    /// Its work runs on whichever thread holds the transaction.
    detached: bool,
    /// `durable`: never turned away by a full queue.
    durable: bool,
}

fn own(act: Act) -> Caller {
    Caller {
        act,
        detached: false,
        durable: false,
    }
}

fn detached(act: Act) -> Caller {
    Caller {
        act,
        detached: true,
        durable: false,
    }
}

/// Failures of the engine's own steps, by the 1-based count of the step.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// This begin fails (latching).
    begin_fails: Option<usize>,
    /// This commit fails (latching, `OutcomeUnknown`); `commit_lands`: its writes landed.
    commit_fails: Option<usize>,
    commit_lands: bool,
    /// This commit panics (a damaged page under the protocol's own step).
    commit_panics: Option<usize>,
    /// This abort fails (latching).
    abort_fails: Option<usize>,
    /// A thread outside the batches latches fail-stop at some point.
    outside_latch: bool,
    /// Pipelined commits: this wait for durability runs a sync that fails (latching; every
    /// later wait fails too).
    sync_fails: Option<usize>,
}

/// Waits that pin one schedule, for the regression tests on std threads (none under loom,
/// which explores every schedule itself).
#[derive(Debug, Clone, Copy, Default)]
struct Pins {
    /// On its first run, caller `.0`'s work waits until `.1` callers are queued (its batch then
    /// admits them late).
    first_run_waits_for_queue: Option<(usize, usize)>,
    /// On a re-run, this caller's work waits until the latch is set.
    rerun_waits_for_latch: Option<usize>,
}

/// What a case must have seen in at least one execution (the model is not vacuous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// A batch of this many members.
    BatchOf(usize),
    /// A caller admitted into a batch that began before it called.
    LateAdmission,
    /// A prefix re-run.
    Rerun,
    /// A caller whose work ran this many times.
    RunsOf(usize),
    /// A caller turned away by a full queue.
    Busy,
    /// A detached member's panic, resumed on its own thread.
    PanicCarried,
    /// A caller answered with a failure it did not cause (fail-stop, unknown outcome).
    FailedByOthers,
}

/// What the executions of a case saw, merged.
#[derive(Debug, Default, Clone)]
struct Coverage {
    largest_batch: usize,
    most_runs: usize,
    late: bool,
    rerun: bool,
    busy: bool,
    panic_carried: bool,
    failed_by_others: bool,
}

impl Coverage {
    fn saw(&self, seen: Seen) -> bool {
        match seen {
            Seen::BatchOf(n) => self.largest_batch >= n,
            Seen::LateAdmission => self.late,
            Seen::Rerun => self.rerun,
            Seen::RunsOf(n) => self.most_runs >= n,
            Seen::Busy => self.busy,
            Seen::PanicCarried => self.panic_carried,
            Seen::FailedByOthers => self.failed_by_others,
        }
    }
}

/// A case: its callers, the group's settings, the engine's failures.
#[derive(Debug, Clone)]
struct Case {
    callers: Vec<Caller>,
    max_batch: usize,
    max_queue: usize,
    queue_timeout: Duration,
    faults: Faults,
    pins: Pins,
    /// Commits return before they are durable (journal mode, property 6).
    pipelined: bool,
}

impl Case {
    fn new(callers: Vec<Caller>) -> Case {
        Case {
            max_batch: callers.len(),
            max_queue: callers.len(),
            queue_timeout: Duration::from_secs(3600),
            callers,
            faults: Faults::default(),
            pins: Pins::default(),
            pipelined: false,
        }
    }

    fn faults(mut self, faults: Faults) -> Case {
        self.faults = faults;
        self
    }

    /// Commits return before they are durable, as in journal mode.
    fn pipelined(mut self) -> Case {
        self.pipelined = true;
        self
    }

    /// Anything in the case may fail a caller that does not fail itself (busy aside).
    fn may_fail_others(&self) -> bool {
        let f = &self.faults;
        f.begin_fails.is_some()
            || f.commit_fails.is_some()
            || f.commit_panics.is_some()
            || f.abort_fails.is_some()
            || f.outside_latch
            || f.sync_fails.is_some()
            || self.callers.iter().any(|c| c.act.latches())
    }

    /// A caller may be turned away by a full queue.
    fn may_be_busy(&self) -> bool {
        self.max_queue < self.callers.len() && self.queue_timeout.is_zero()
    }
}

/// A panic of a caller's own code: its payload names the caller.
#[derive(Debug)]
struct CallerPanic(usize);

/// A panic of the engine (a damaged page).
#[derive(Debug)]
struct EnginePanic;

/// The batch's transaction: the members that ran in it and the writes they kept.
struct FakeTxn {
    id: usize,
    /// When it began, on the ghost's clock.
    began: usize,
    /// Members whose work ran in this transaction, in order.
    ran: RefCell<Vec<usize>>,
    /// Members whose writes are in it (a failing member's write stays until the abort).
    writes: RefCell<Vec<usize>>,
}

/// How a caller was answered.
#[derive(Debug, Clone)]
enum Answer {
    Ok,
    Failed(String),
    OutcomeUnknown,
    Busy,
    Panicked,
}

impl Answer {
    fn is_failure(&self) -> bool {
        matches!(self, Answer::Failed(_) | Answer::OutcomeUnknown)
    }
}

/// What the checker sees of the run: the fake's history and each caller's runs.
#[derive(Debug, Default, Clone)]
struct Ghost {
    /// Ticks at every call and begin: orders them.
    clock: usize,
    txns: usize,
    begins: usize,
    commits: usize,
    aborts: usize,
    /// Committed transactions: (id, writes).
    committed: Vec<(usize, Vec<usize>)>,
    /// Transactions whose failed commit may have landed: (id, writes).
    unknown: Vec<(usize, Vec<usize>)>,
    /// Aborted transactions: (id, whether any write was in it).
    aborted: Vec<(usize, bool)>,
    /// Pipelined: each committed transaction's LSN, the last durable LSN, the waits so far,
    /// and whether a sync failed; what each caller's answer waited for when its batch wrote
    /// nothing.
    lsns: Vec<(usize, u64)>,
    durable: u64,
    waits: usize,
    sync_failed: bool,
    /// The latch was set by a step of the protocol or a member's work (not from outside).
    latched_inside: Option<String>,
    runs: Vec<usize>,
    last_txn: Vec<Option<usize>>,
    answers: Vec<Option<Answer>>,
    /// When each caller called, on the clock.
    called: Vec<usize>,
    seen: Coverage,
}

/// The fake engine.
struct Fake {
    group: Group<Fake>,
    latch: Mutex<Option<String>>,
    case: Case,
    /// Held (a loom mutex) while a commit or an abort is logged and while an answer is checked
    /// against the log: loom's reduction of equivalent schedules must see that the two touch
    /// the same state, or it would not order them both ways.
    log: Mutex<()>,
    /// The checker's bookkeeping: a std mutex, no scheduling point (what must be ordered by
    /// loom is read and written under `log` or `latch`). A property that fails panics with
    /// no loom lock held.
    ghost: std::sync::Mutex<Ghost>,
}

type Work = Box<dyn FnMut(&FakeTxn) -> Step<()> + Send>;

impl Fake {
    fn new(case: Case) -> Fake {
        let n = case.callers.len();
        Fake {
            group: Group::<Fake>::new(GroupConfig {
                max_batch: case.max_batch,
                max_queue: case.max_queue,
                queue_timeout: case.queue_timeout,
                lanes: 1,
            }),
            latch: Mutex::new(None),
            log: Mutex::new(()),
            ghost: std::sync::Mutex::new(Ghost {
                runs: vec![0; n],
                last_txn: vec![None; n],
                answers: vec![None; n],
                called: vec![usize::MAX; n],
                ..Ghost::default()
            }),
            case,
        }
    }

    /// Runs `f` on the ghost state.
    fn ghost<R>(&self, f: impl FnOnce(&mut Ghost) -> R) -> R {
        f(&mut self.ghost.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Runs `f` on the ghost state holding `log`.
    fn logged<R>(&self, f: impl FnOnce(&mut Ghost) -> R) -> R {
        let _log = self.log.lock();
        self.ghost(f)
    }

    /// A copy of the ghost state.
    fn snapshot(&self) -> Ghost {
        self.ghost(|g| g.clone())
    }

    fn set_latch(&self, cause: &dyn Display, inside: bool) {
        let mut latch = self.latch.lock();
        if latch.is_none() {
            *latch = Some(cause.to_string());
        }
        self.ghost(|g| {
            if inside && g.latched_inside.is_none() {
                g.latched_inside = Some(cause.to_string());
            }
        });
    }

    /// Caller `m`'s work, run in `txn` (on its own thread or the baton's).
    fn work(&self, m: usize, txn: &FakeTxn) -> Step<()> {
        let act = self.case.callers[m].act;
        let runs = self.ghost(|g| {
            g.runs[m] += 1;
            g.last_txn[m] = Some(txn.id);
            if txn.began < g.called[m] {
                // It called after its batch began: admitted late.
                g.seen.late = true;
            }
            if g.runs[m] > 1 {
                g.seen.rerun = true;
            }
            g.seen.most_runs = g.seen.most_runs.max(g.runs[m]);
            g.runs[m]
        });
        let failing = self
            .case
            .callers
            .iter()
            .filter(|c| c.act.may_fail())
            .count();
        assert!(
            runs <= self.case.max_batch && runs <= 1 + failing,
            "property 5: caller {m} ran {runs} times (batch size {}, {failing} failing)",
            self.case.max_batch
        );
        self.pinned_waits(m, runs);
        txn.ran.borrow_mut().push(m);
        assert!(
            txn.ran.borrow().len() <= self.case.max_batch,
            "a batch grew past max_batch ({})",
            self.case.max_batch
        );
        let io = || Error::Storage {
            source: StorageError::new(std::io::Error::other("model: an I/O failure")),
        };
        if !matches!(act, Act::Read | Act::ReadIo) {
            txn.writes.borrow_mut().push(m);
        }
        let rerun = runs > 1;
        match act {
            Act::Write => Step::Done(()),
            Act::FailOnRerun if !rerun => Step::Done(()),
            Act::Read => Step::Clean(()),
            Act::Fail | Act::FailOnRerun => Step::Abort(Error::Internal {
                what: "model: a member's work failed",
            }),
            Act::Panic => panic_any(CallerPanic(m)),
            Act::Damage => panic_any(EnginePanic),
            Act::FailIo => Step::Abort(io()),
            Act::ReadIo => {
                self.set_latch(&io(), true);
                Step::Clean(())
            }
            Act::WriteIo => {
                self.set_latch(&io(), true);
                Step::Done(())
            }
        }
    }

    /// The regression tests' waits (`Pins`) for caller `m`'s run, bounded.
    fn pinned_waits(&self, m: usize, runs: usize) {
        let pins = self.case.pins;
        let until = |ready: &dyn Fn() -> bool| {
            for _ in 0..50_000 {
                if ready() {
                    return;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        };
        if let Some((who, n)) = pins.first_run_waits_for_queue
            && who == m
            && runs == 1
        {
            until(&|| self.group.queued() >= n);
        }
        if pins.rerun_waits_for_latch == Some(m) && runs > 1 {
            until(&|| self.latch.lock().is_some());
        }
    }

    /// Caller `m`'s thread: one write call, its answer checked (property 2) and recorded.
    fn call(self: &Arc<Self>, m: usize) {
        let caller = self.case.callers[m];
        let detached = if caller.detached {
            let fake = Arc::clone(self);
            let work: Work = Box::new(move |txn: &FakeTxn| fake.work(m, txn));
            Detached::of(work)
        } else {
            Detached::none()
        };
        self.ghost(|g| {
            g.clock += 1;
            g.called[m] = g.clock;
        });
        let result = catch_unwind(AssertUnwindSafe(|| {
            run_member(&**self, caller.durable, detached, |txn| {
                if caller.detached {
                    // A detached member's work runs from `detached`, never here.
                    panic!("model: a detached member's own work ran")
                }
                self.work(m, txn)
            })
        }));
        let answer = match result {
            Ok(Ok(())) => {
                assert!(
                    !caller.act.fails(),
                    "caller {m} fails, yet was told Committed"
                );
                let (last, ended) = self.logged(|g| {
                    let last = g.last_txn[m];
                    let committed = g.committed.iter().any(|(id, _)| Some(*id) == last);
                    let ended_clean = g
                        .aborted
                        .iter()
                        .any(|(id, wrote)| Some(*id) == last && !wrote);
                    (last, committed || ended_clean)
                });
                let last = last.unwrap_or_else(|| {
                    panic!("property 2: caller {m} told Committed but never ran")
                });
                assert!(
                    ended,
                    "property 2: caller {m} told Committed before transaction {last} (its last run) committed"
                );
                if self.case.pipelined {
                    let (lsn, durable, failed) = self.logged(|g| {
                        let lsn = g.lsns.iter().find(|(id, _)| *id == last).map(|(_, l)| *l);
                        (lsn, g.durable, g.sync_failed)
                    });
                    if let Some(lsn) = lsn {
                        assert!(
                            lsn <= durable,
                            "property 6: caller {m} told Committed while its entry {lsn} is not durable (durable: {durable}, a sync failed: {failed})"
                        );
                    }
                }
                Answer::Ok
            }
            Ok(Err(Error::OutcomeUnknown { .. })) => Answer::OutcomeUnknown,
            Ok(Err(Error::Busy { .. })) => Answer::Busy,
            Ok(Err(e)) => Answer::Failed(e.to_string()),
            Err(payload) => {
                let own = payload.downcast_ref::<CallerPanic>().map(|p| p.0);
                assert_eq!(
                    own,
                    Some(m),
                    "caller {m} unwound with a panic that is not its own"
                );
                Answer::Panicked
            }
        };
        let answered_before = self.ghost(|g| {
            if answer.is_failure() && !caller.act.fails() {
                g.seen.failed_by_others = true;
            }
            match answer {
                Answer::Busy => g.seen.busy = true,
                Answer::Panicked if caller.detached => g.seen.panic_carried = true,
                _ => {}
            }
            g.answers[m].replace(answer).is_some()
        });
        assert!(!answered_before, "property 1: caller {m} answered twice");
    }

    /// Properties 1 and 3, once every thread ended.
    fn check_end(&self) {
        let g = self.snapshot();
        assert_eq!(self.group.queued(), 0, "a caller was left in the queue");
        for (m, caller) in self.case.callers.iter().enumerate() {
            let answer = g.answers[m]
                .clone()
                .unwrap_or_else(|| panic!("property 1: caller {m} was never answered"));
            let in_committed = g.committed.iter().filter(|(_, w)| w.contains(&m)).count();
            let in_unknown = g.unknown.iter().filter(|(_, w)| w.contains(&m)).count();
            assert!(
                in_committed + in_unknown <= 1,
                "property 3: caller {m}'s write was committed {} times",
                in_committed + in_unknown
            );
            match answer {
                Answer::Ok => {
                    if caller.act.writes() {
                        let last = g.last_txn[m];
                        assert!(
                            g.committed
                                .iter()
                                .any(|(id, w)| Some(*id) == last && w.contains(&m)),
                            "property 3: caller {m} told Committed, but its last run's write is not committed"
                        );
                    }
                }
                Answer::OutcomeUnknown => {
                    let sync_fails = self.case.faults.sync_fails.is_some();
                    assert!(
                        self.case.faults.commit_fails.is_some() || sync_fails,
                        "caller {m} told OutcomeUnknown, but no commit or sync fails"
                    );
                    // A failed sync leaves its batch's commit in place: unknown, not undone.
                    let by_own_batch = g
                        .committed
                        .iter()
                        .any(|(id, w)| Some(*id) == g.last_txn[m] && w.contains(&m));
                    assert!(
                        in_committed == 0 || (sync_fails && by_own_batch),
                        "property 3: caller {m} told OutcomeUnknown, its write committed by a later batch"
                    );
                }
                Answer::Busy => {
                    assert!(
                        self.case.may_be_busy() && !caller.durable,
                        "caller {m} turned away, but its case turns nobody away"
                    );
                    assert_eq!(g.runs[m], 0, "caller {m} turned away after it ran");
                }
                Answer::Failed(ref e) => {
                    assert_eq!(
                        in_committed + in_unknown,
                        0,
                        "property 3: caller {m} told it failed ({e}), but its write was committed"
                    );
                    assert!(
                        caller.act.may_fail() || self.case.may_fail_others(),
                        "caller {m} failed ({e}) though nothing in its case fails it"
                    );
                }
                Answer::Panicked => assert_eq!(
                    in_committed + in_unknown,
                    0,
                    "property 3: caller {m} panicked, but its write was committed"
                ),
            }
        }
    }
}

impl BatchEngine for Fake {
    const ENGINE: observe::Engine = observe::Engine("model");
    type Txn = FakeTxn;
    type Run<'t> = &'t FakeTxn;
    type Work = Work;

    fn group(&self) -> &Group<Fake> {
        &self.group
    }

    fn check_writable(&self) -> Result<(), Error> {
        match &*self.latch.lock() {
            Some(cause) => Err(Error::FailStopped {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn begin_txn(&self) -> Result<FakeTxn, Error> {
        let (nth, id, began) = self.ghost(|g| {
            g.begins += 1;
            g.txns += 1;
            g.clock += 1;
            (g.begins, g.txns, g.clock)
        });
        if self.case.faults.begin_fails == Some(nth) {
            let e = Error::Storage {
                source: StorageError::new(std::io::Error::other("model: the database is closed")),
            };
            self.set_latch(&e, true);
            return Err(e);
        }
        Ok(FakeTxn {
            id,
            began,
            ran: RefCell::new(Vec::new()),
            writes: RefCell::new(Vec::new()),
        })
    }

    fn open_run<'t>(&self, txn: &'t FakeTxn) -> &'t FakeTxn {
        txn
    }

    fn run_detached(&self, run: &mut &FakeTxn, work: &mut Work) -> Step<()> {
        work(run)
    }

    fn commit_txn(&self, txn: FakeTxn, _durable: bool) -> Result<u64, Error> {
        let (nth, latched) = {
            let _latch = self.latch.lock();
            self.ghost(|g| {
                g.commits += 1;
                g.seen.largest_batch = g.seen.largest_batch.max(txn.ran.borrow().len());
                (g.commits, g.latched_inside.clone())
            })
        };
        if let Some(cause) = latched {
            panic!("property 4: a batch committed after the fail-stop latch was set ({cause})");
        }
        let writes = txn.writes.into_inner();
        if self.case.faults.commit_panics == Some(nth) {
            panic_any(EnginePanic);
        }
        if self.case.faults.commit_fails == Some(nth) {
            let e = std::io::Error::other("model: the commit failed");
            if self.case.faults.commit_lands {
                self.logged(|g| g.unknown.push((txn.id, writes)));
            }
            self.set_latch(&e, true);
            return Err(Error::OutcomeUnknown {
                source: StorageError::new(e),
            });
        }
        let pipelined = self.case.pipelined;
        Ok(self.logged(|g| {
            g.committed.push((txn.id, writes));
            if !pipelined {
                return 0;
            }
            let lsn = g.lsns.len() as u64 + 1;
            g.lsns.push((txn.id, lsn));
            lsn
        }))
    }

    fn pipelined(&self) -> bool {
        self.case.pipelined
    }

    fn clean_lsn(&self) -> u64 {
        self.logged(|g| g.lsns.len() as u64)
    }

    fn wait_durable(&self, lsn: u64) -> Result<(), Error> {
        if !self.case.pipelined {
            return Ok(());
        }
        let nth = self.logged(|g| {
            g.waits += 1;
            g.waits
        });
        let fails = self.case.faults.sync_fails == Some(nth) || self.ghost(|g| g.sync_failed);
        if fails {
            let e = std::io::Error::other("model: the sync failed");
            self.ghost(|g| g.sync_failed = true);
            // Not `inside` for property 4: the sync of an earlier batch runs beside the next
            // batch, which may be committing when it fails (property 6 covers that batch).
            self.set_latch(&e, false);
            return Err(Error::OutcomeUnknown {
                source: StorageError::new(e),
            });
        }
        self.logged(|g| g.durable = g.durable.max(lsn));
        Ok(())
    }

    fn abort_txn(&self, txn: FakeTxn) {
        let nth = self.logged(|g| {
            g.aborts += 1;
            let wrote = !txn.writes.borrow().is_empty();
            g.seen.largest_batch = g.seen.largest_batch.max(txn.ran.borrow().len());
            g.aborted.push((txn.id, wrote));
            g.aborts
        });
        if self.case.faults.abort_fails == Some(nth) {
            self.set_latch(&"model: the abort failed", true);
        }
    }

    fn observe(&self, e: Error) -> Error {
        if matches!(e, Error::Storage { .. } | Error::OutcomeUnknown { .. }) {
            self.set_latch(&e, true);
        }
        e
    }

    fn latch_damage(&self, e: Error) -> Error {
        self.set_latch(&e, true);
        e
    }

    fn latch(&self, cause: &dyn Display) {
        self.set_latch(cause, true);
    }

    fn contain<R>(&self, while_: &str, f: impl FnOnce() -> R) -> Result<R, Fault> {
        catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
            if payload.is::<EnginePanic>() {
                Fault::Damaged(Error::CorruptStore {
                    reason: format!("model: the engine panicked while {while_}"),
                })
            } else {
                Fault::Caller(payload)
            }
        })
    }
}

/// Silences the panics the cases raise on purpose (a caller's, the engine's); any other panic
/// (a property, loom's deadlock report) is printed as usual.
fn quiet_model_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload: &(dyn Any + Send) = info.payload();
            if !(payload.is::<CallerPanic>() || payload.is::<EnginePanic>()) {
                default(info);
            }
        }));
    });
}

/// Runs `case` in every interleaving within the bounds, checking the properties, and checks
/// that some execution saw each of `expect`.
#[cfg(idem_loom)]
fn check(case: Case, expect: &[Seen]) {
    quiet_model_panics();
    let mut builder = loom::model::Builder::new();
    let threads = case.callers.len() + usize::from(case.faults.outside_latch);
    if builder.preemption_bound.is_none() && threads > 2 {
        builder.preemption_bound = Some(PREEMPTIONS);
    }
    builder.max_branches = 100_000;
    let coverage = Arc::new(std::sync::Mutex::new((0usize, Coverage::default())));
    let merged = Arc::clone(&coverage);
    let started = std::time::Instant::now();
    builder.check(move || {
        let fake = Arc::new(Fake::new(case.clone()));
        let mut threads = Vec::new();
        for m in 0..case.callers.len() {
            let fake = Arc::clone(&fake);
            threads.push(loom::thread::spawn(move || fake.call(m)));
        }
        if case.faults.outside_latch {
            let fake = Arc::clone(&fake);
            threads.push(loom::thread::spawn(move || {
                fake.set_latch(&"model: the store is closing", false);
            }));
        }
        for t in threads {
            t.join().expect("a caller's thread ended by its answer");
        }
        fake.check_end();
        let seen = fake.snapshot().seen;
        let mut merged = merged.lock().unwrap_or_else(|p| p.into_inner());
        merged.0 += 1;
        let all = &mut merged.1;
        all.largest_batch = all.largest_batch.max(seen.largest_batch);
        all.most_runs = all.most_runs.max(seen.most_runs);
        all.late |= seen.late;
        all.rerun |= seen.rerun;
        all.busy |= seen.busy;
        all.panic_carried |= seen.panic_carried;
        all.failed_by_others |= seen.failed_by_others;
    });
    let (executions, seen) = &*coverage.lock().unwrap_or_else(|p| p.into_inner());
    eprintln!(
        "{}: {executions} executions in {:.1?}",
        std::thread::current().name().unwrap_or("a case"),
        started.elapsed()
    );
    for e in expect {
        assert!(seen.saw(*e), "no execution of the case saw {e:?}: {seen:?}");
    }
}

/// The cases, each checked in every interleaving (`--cfg idem_loom`).
#[cfg(idem_loom)]
mod cases {
    use super::*;

    #[test]
    fn two_writers_hand_off_or_share_a_batch() {
        check(
            Case::new(vec![own(Act::Write), own(Act::Write)]),
            &[Seen::BatchOf(2), Seen::LateAdmission],
        );
    }

    #[test]
    fn three_callers_with_late_detached_members() {
        check(
            Case::new(vec![
                own(Act::Write),
                detached(Act::Write),
                detached(Act::Read),
            ]),
            &[Seen::BatchOf(3), Seen::LateAdmission],
        );
    }

    #[test]
    fn clean_members_end_their_batch_without_a_commit() {
        check(
            Case::new(vec![own(Act::Read), detached(Act::Read)]),
            &[Seen::BatchOf(2)],
        );
    }

    #[test]
    fn a_failing_member_reruns_its_prefix() {
        check(
            Case::new(vec![own(Act::Write), own(Act::Fail), own(Act::Write)]),
            &[Seen::BatchOf(3), Seen::Rerun],
        );
    }

    #[test]
    fn a_failing_detached_member_reruns_its_prefix() {
        check(
            Case::new(vec![
                own(Act::Write),
                detached(Act::Fail),
                detached(Act::Write),
            ]),
            &[Seen::BatchOf(3), Seen::Rerun],
        );
    }

    #[test]
    fn two_failing_members_bound_the_reruns() {
        check(
            Case::new(vec![
                detached(Act::Write),
                own(Act::Fail),
                detached(Act::Fail),
            ]),
            &[Seen::BatchOf(2), Seen::Rerun],
        );
    }

    #[test]
    fn a_member_reruns_once_per_failure_behind_it() {
        check(
            Case::new(vec![
                own(Act::Write),
                detached(Act::FailOnRerun),
                own(Act::Fail),
            ]),
            &[Seen::BatchOf(3), Seen::RunsOf(3)],
        );
    }

    #[test]
    fn panicking_members_unwind_on_their_own_threads() {
        check(
            Case::new(vec![
                detached(Act::Write),
                own(Act::Panic),
                detached(Act::Panic),
            ]),
            &[Seen::Rerun, Seen::PanicCarried],
        );
    }

    #[test]
    fn damage_latches_and_fails_the_prefix() {
        check(
            Case::new(vec![
                own(Act::Write),
                detached(Act::Damage),
                own(Act::Write),
            ]),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn an_io_error_a_member_reports_latches() {
        check(
            Case::new(vec![own(Act::Write), own(Act::FailIo)]),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn an_io_error_a_detached_member_reports_latches() {
        check(
            Case::new(vec![detached(Act::Write), detached(Act::FailIo)]),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn an_io_error_a_member_swallowed_still_latches() {
        check(
            Case::new(vec![own(Act::Write), detached(Act::ReadIo)]),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn an_io_error_under_a_kept_write_latches() {
        check(
            Case::new(vec![detached(Act::Write), own(Act::WriteIo)]),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn a_failed_commit_is_an_unknown_outcome_for_its_batch() {
        for lands in [false, true] {
            check(
                Case::new(vec![own(Act::Write), detached(Act::Write), own(Act::Write)]).faults(
                    Faults {
                        commit_fails: Some(1),
                        commit_lands: lands,
                        ..Faults::default()
                    },
                ),
                &[Seen::BatchOf(3), Seen::FailedByOthers],
            );
        }
    }

    #[test]
    fn pipelined_answers_wait_for_durability() {
        check(
            Case::new(vec![own(Act::Write), own(Act::Write)]).pipelined(),
            &[Seen::BatchOf(2), Seen::LateAdmission],
        );
    }

    #[test]
    fn pipelined_batches_with_detached_and_clean_members() {
        check(
            Case::new(vec![
                own(Act::Write),
                detached(Act::Write),
                detached(Act::Read),
            ])
            .pipelined(),
            &[Seen::BatchOf(3)],
        );
    }

    #[test]
    fn a_failed_sync_is_an_unknown_outcome_for_every_batch_behind_it() {
        for nth in [1, 2] {
            check(
                Case::new(vec![own(Act::Write), own(Act::Write)])
                    .pipelined()
                    .faults(Faults {
                        sync_fails: Some(nth),
                        ..Faults::default()
                    }),
                &[Seen::FailedByOthers],
            );
        }
    }

    #[test]
    fn a_panicking_commit_fails_its_batch() {
        check(
            Case::new(vec![own(Act::Write), detached(Act::Write)]).faults(Faults {
                commit_panics: Some(1),
                ..Faults::default()
            }),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn a_failed_abort_latches_before_the_prefix_reruns() {
        check(
            Case::new(vec![own(Act::Write), own(Act::Fail), own(Act::Write)]).faults(Faults {
                abort_fails: Some(1),
                ..Faults::default()
            }),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn closing_store_refuses_the_begin() {
        for nth in [1, 2] {
            check(
                Case::new(vec![own(Act::Write), detached(Act::Write), own(Act::Write)]).faults(
                    Faults {
                        begin_fails: Some(nth),
                        ..Faults::default()
                    },
                ),
                &[Seen::FailedByOthers],
            );
        }
    }

    #[test]
    fn closing_store_latched_from_outside() {
        check(
            Case::new(vec![own(Act::Write), detached(Act::Write)]).faults(Faults {
                outside_latch: true,
                ..Faults::default()
            }),
            &[Seen::BatchOf(2), Seen::FailedByOthers],
        );
    }

    #[test]
    fn a_full_queue_turns_callers_away() {
        let case = Case {
            max_queue: 1,
            queue_timeout: Duration::ZERO,
            ..Case::new(vec![own(Act::Write), own(Act::Write), detached(Act::Write)])
        };
        check(case, &[Seen::Busy, Seen::BatchOf(2)]);
    }

    #[test]
    fn a_full_queue_never_turns_a_durable_caller_away() {
        let mut case = Case {
            max_queue: 1,
            queue_timeout: Duration::ZERO,
            ..Case::new(vec![own(Act::Write), own(Act::Write), detached(Act::Write)])
        };
        case.callers[2].durable = true;
        check(case, &[Seen::Busy]);
    }

    #[test]
    fn a_caller_waiting_for_room_is_woken() {
        let case = Case {
            max_queue: 1,
            ..Case::new(vec![own(Act::Write), own(Act::Write), detached(Act::Write)])
        };
        check(case, &[Seen::BatchOf(2), Seen::LateAdmission]);
    }

    #[test]
    fn a_batch_never_grows_past_max_batch() {
        let case = Case {
            max_batch: 2,
            ..Case::new(vec![
                detached(Act::Write),
                own(Act::Write),
                detached(Act::Write),
            ])
        };
        check(case, &[Seen::BatchOf(2), Seen::LateAdmission]);
    }
}

/// Schedules the checker found failing, pinned (`Pins`) and run on std threads in every test
/// build: the fake engine is the same, the schedule is the one loom reported.
#[cfg(not(idem_loom))]
mod regressions {
    use super::*;

    /// Runs caller 0, then caller 1 once caller 0's work runs (caller 0 leads, caller 1 joins
    /// its batch late), and checks the properties once both are answered.
    fn two_callers(case: Case) -> Arc<Fake> {
        quiet_model_panics();
        let fake = Arc::new(Fake::new(case));
        let first = {
            let fake = Arc::clone(&fake);
            std::thread::spawn(move || fake.call(0))
        };
        while fake.snapshot().runs[0] == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        let second = {
            let fake = Arc::clone(&fake);
            std::thread::spawn(move || fake.call(1))
        };
        first.join().expect("caller 0 answered");
        second.join().expect("caller 1 answered");
        fake.check_end();
        fake
    }

    /// Found by `an_io_error_a_member_reports_latches`: a member that ran on its own thread
    /// failed with an I/O error; the driver re-ran its prefix in a fresh transaction and only
    /// then latched (`observe`), so the prefix committed after the latch. The schedule: the
    /// prefix's re-run waits until the latch is set, then commits.
    #[test]
    fn an_io_error_on_its_own_thread_latches_before_its_prefix_reruns() {
        let case = Case {
            pins: Pins {
                first_run_waits_for_queue: Some((0, 1)),
                rerun_waits_for_latch: Some(0),
            },
            ..Case::new(vec![own(Act::Write), own(Act::FailIo)])
        };
        let fake = two_callers(case);
        let g = fake.snapshot();
        assert!(g.seen.late, "caller 1 joined caller 0's batch");
        assert!(
            matches!(&g.answers[0], Some(Answer::Failed(e)) if e.contains("stopped accepting writes")),
            "the prefix is answered FailStopped, not re-run: {:?}",
            g.answers[0]
        );
        assert_eq!(g.runs[0], 1, "the prefix did not re-run");
        assert!(g.committed.is_empty(), "nothing committed");
    }

    /// Found by `an_io_error_a_member_swallowed_still_latches`: a member's work met an I/O
    /// error (latched where it happened) and answered without it; the batch still committed
    /// the other member's write, after the latch.
    #[test]
    fn a_latch_set_inside_a_batch_stops_its_commit() {
        let case = Case {
            pins: Pins {
                first_run_waits_for_queue: Some((0, 1)),
                rerun_waits_for_latch: None,
            },
            ..Case::new(vec![own(Act::Write), detached(Act::ReadIo)])
        };
        let fake = two_callers(case);
        let g = fake.snapshot();
        assert!(g.seen.late, "caller 1 joined caller 0's batch");
        assert!(g.committed.is_empty(), "nothing committed after the latch");
        for m in 0..2 {
            assert!(
                matches!(&g.answers[m], Some(Answer::Failed(e)) if e.contains("stopped accepting writes")),
                "caller {m} is answered FailStopped: {:?}",
                g.answers[m]
            );
        }
    }

    /// Found by `an_io_error_under_a_kept_write_latches`, alone: a work that latched and kept
    /// its write is not committed.
    #[test]
    fn a_write_kept_past_a_latch_is_not_committed() {
        quiet_model_panics();
        let fake = Arc::new(Fake::new(Case::new(vec![own(Act::WriteIo)])));
        fake.call(0);
        fake.check_end();
        let g = fake.snapshot();
        assert!(g.committed.is_empty(), "nothing committed after the latch");
        assert!(
            matches!(&g.answers[0], Some(Answer::Failed(e)) if e.contains("stopped accepting writes")),
            "answered FailStopped: {:?}",
            g.answers[0]
        );
    }
}
