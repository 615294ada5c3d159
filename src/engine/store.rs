//! The store: its shared state, flow A (`execute`), the claim half of flow B (`begin`),
//! inspection (`get`, `for_each_record`, `purge`), and the plumbing every write and read goes
//! through (the read path, the record's load and put, the fail-stop latch, the closure
//! boundary). Opening is in `builder.rs`, maintenance in `maintenance.rs`, the background
//! threads in `background.rs`, the storage boundary's panic handling in `boundary.rs`.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use crate::engine::background::Background;
use crate::engine::boundary::{caller_code, contained, redb_error, unlatched};
use crate::engine::builder::Durability;
#[cfg(doc)]
use crate::engine::builder::StoreBuilder;
use crate::engine::commit::{Durable, Group, GroupConfig, Step};
use crate::engine::expiry::{put_in, remove_in};
use crate::engine::lease::Begin;
use crate::engine::lease::Lease;
#[cfg(doc)]
use crate::engine::maintenance::Metrics;
use crate::engine::open::Open;
#[cfg(doc)]
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::snapshot::Snapshot;
use crate::engine::sweep::SweepTotals;
use crate::engine::tables::{EXPIRY, RECORDS};
use crate::engine::tx::Tx;
use crate::error::{Error, StorageError};
use crate::model::claim::Claim;
use crate::model::clock::{Clock, Timestamp};
use crate::model::outbox::Origin;
use crate::model::record::{HolderToken, Record, State};
use crate::model::response::Abort;
use crate::model::response::{Outcome, Response};
use crate::model::retention::Windows;
use crate::model::rules::answers::{self, Early};
use crate::model::rules::instants::{self, Attempt};
use crate::model::rules::{Decision, Holders, decide_among};
use crate::model::scope::{Limits, Request, Scope, admit_key, record_key};
use crate::model::settings::Config;
use crate::runtime::observe::{self, Call, Engine, Kind};
use crate::runtime::signal::Signal;

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

/// Granularity of `begin_wait`'s polling (it is also woken at once by local completions).
const WAIT_POLL: Duration = Duration::from_millis(20);
/// The store's redb database, closed at the storage boundary. redb's own close commits (it
/// saves its allocator state and returns the freed pages), and on a file damaged since the open
/// (or opened without [`StoreBuilder::verify_on_open`]) that commit can panic; [`Inner`]'s drop
/// takes the database out and drops it inside `catch_unwind`, so a panic there does not leave
/// the drop. (A second panic while redb unwinds from the first aborts the process, which nothing
/// can catch: [`StoreBuilder::verify_on_open`] keeps such files from being opened.)
/// `None` only from then on, when no call can reach it.
struct Db(Option<redb::Database>);

impl Db {
    fn get(&self) -> Result<&redb::Database, redb::Error> {
        self.0.as_ref().ok_or(redb::Error::DatabaseClosed)
    }

    fn get_mut(&mut self) -> Result<&mut redb::Database, redb::Error> {
        self.0.as_mut().ok_or(redb::Error::DatabaseClosed)
    }
}

/// The state every clone of a [`Store`] shares. Its fields are private to this file: the rest of
/// the crate reaches them through the small accessors on [`Store`].
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
impl Drop for Inner {
    fn drop(&mut self) {
        self.background.stop();
        // Its read transaction ends before the file closes.
        self.snapshot.release();
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
    ///
    /// # Example
    ///
    /// A retry after a lost answer replays it: the closure ran once, and its write and the
    /// record committed together. The same key with another payload is refused.
    ///
    /// ```
    /// use std::cell::Cell;
    /// use idem::redb::{ReadableTable, TableDefinition};
    /// use idem::{Error, Outcome, Request, Response, Scope, Store};
    ///
    /// const ORDERS: TableDefinition<&str, u32> = TableDefinition::new("orders");
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let scope = Scope::new("tenant-42", "create_order");
    /// let runs = Cell::new(0);
    /// let create = |quantity: u32| -> Result<Outcome, Error> {
    ///     let request = Request::new(scope.clone(), "order-123", &("sku-1", quantity))?;
    ///     store.execute(request, |tx| {
    ///         runs.set(runs.get() + 1);
    ///         tx.open_table(ORDERS)?.insert("order-123", quantity)?;
    ///         Ok(Response::new(201, r#"{"id":"order-123"}"#).with_resource("order", "order-123"))
    ///     })
    /// };
    ///
    /// let first = create(2)?;
    /// let retry = create(2)?;
    /// assert!(matches!(&first, Outcome::Executed(r) if r.status() == 201));
    /// assert!(retry.is_replay());
    /// assert_eq!(first.response(), retry.response()); // the same status and body
    /// assert_eq!(runs.get(), 1); // the closure ran once
    ///
    /// // The order row committed with the record.
    /// let orders = store.begin_read()?.open_table(ORDERS)?;
    /// assert_eq!(orders.get("order-123")?.map(|q| q.value()), Some(2));
    ///
    /// // The key is bound to its first payload.
    /// assert!(matches!(create(5), Err(Error::PayloadMismatch { .. })));
    /// assert_eq!(runs.get(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute<F>(&self, request: Request, mut f: F) -> Result<Outcome, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        Call::of(ENGINE, Kind::Execute, request.scope())
            .observe(|call| self.execute_observed(request, &mut f, call))
    }

    /// [`Store::execute`], inside its observed `call` (`runtime/observe.rs`).
    fn execute_observed<F>(&self, request: Request, mut f: F, call: &Call) -> Result<Outcome, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &[], &key)? {
            return early.into_outcome();
        }
        let windows = self.inner.config.windows_for(request.scope().operation());
        let done = self.write(Durable::AsConfigured, |txn, now| {
            let mut open = Open::new(txn);
            self.flow_a_step(&mut open, now, &request, &key, &windows, &mut f)
        })?;
        self.flow_a_done(done, call)
    }

    /// [`Store::execute`] for a `Send + 'static` closure, which the store may run on whichever
    /// thread holds the batch's write transaction instead of waking this thread for its turn:
    /// the same contract, answers and failures (a panic of `f` unwinds here), with one thread
    /// hand-off fewer per grouped caller, which is most of a busy batch's time beyond its
    /// fsync. The async face and the HTTP layer's closures are `Send + 'static`.
    /// Use [`Store::execute`] when `f` borrows from the caller's stack or must run on the
    /// caller's thread (thread-locals).
    pub fn execute_send<F>(&self, request: Request, mut f: F) -> Result<Outcome, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort> + Send + 'static,
    {
        Call::of(ENGINE, Kind::Execute, request.scope()).observe(|call| {
            let key = self.admit(&request)?;
            if let Some(early) = self.read_path(&request, &[], &key)? {
                return early.into_outcome();
            }
            let windows = self.inner.config.windows_for(request.scope().operation());
            let store = self.clone();
            let done = self.write_detached(Durable::AsConfigured, move |open, now| {
                store.flow_a_step(open, now, &request, &key, &windows, &mut f)
            })?;
            self.flow_a_done(done, call)
        })
    }

    /// Flow A's work in a write transaction: decide again under the writer, run the closure on
    /// a `Tx`, record the settled result.
    fn flow_a_step(
        &self,
        open: &mut Open<'_>,
        now: Timestamp,
        request: &Request,
        key: &[u8],
        windows: &Windows,
        f: &mut impl FnMut(&Tx<'_>) -> Result<Response, Abort>,
    ) -> Step<FlowA> {
        let answer = |outcome| FlowA {
            outcome,
            took_over: false,
            announced: false,
        };
        let attempt = match self.decide_in(open, request, &[], key, now) {
            Ok(Claimed::Free(attempt)) => attempt,
            Ok(Claimed::Early(early)) => return Step::Clean(answer(early.into_outcome())),
            Err(e) => return Step::Clean(answer(Err(e))),
        };
        let origin = Origin::record(key, attempt.created_at);
        let (result, announced) = self.run_on_tx(open.txn(), now, origin, f);
        let (state, response) = match self.settle(result) {
            Ok(settled) => settled,
            Err(e) => return Step::Abort(e),
        };
        let record = instants::finish(
            *request.fingerprint(),
            attempt.created_at,
            state,
            now,
            windows,
        );
        match self.put_open(open, key, &record) {
            Ok(()) => Step::Done(FlowA {
                outcome: Ok(Outcome::Executed(response)),
                took_over: attempt.number > 1,
                announced,
            }),
            Err(e) => Step::Abort(e),
        }
    }

    /// After flow A's transaction ended: wake the dispatcher if events were pushed, and the
    /// waiters of a lapsed lease this intent finished.
    fn flow_a_done(&self, done: FlowA, call: &Call) -> Result<Outcome, Error> {
        if done.announced && done.outcome.is_ok() {
            self.announce_work();
        }
        if done.took_over && done.outcome.is_ok() {
            // This finished a lapsed flow-B lease: wake its waiters.
            self.lease_event();
            call.took_over();
        }
        done.outcome
    }

    /// Flow B: claims the key with a lease for work that calls the outside world. Returns
    /// `Begin::Acquired` with a [`Lease`] (the attempt may now make the external call, using
    /// [`Lease::downstream_key`]), or the stored result (`Begin::Replayed`, or
    /// `Begin::Expired` past the retention), or `Begin::InFlight`; a different
    /// payload is [`Error::PayloadMismatch`]. Fails fast; see [`Store::begin_wait`] to wait.
    ///
    /// # Example
    ///
    /// A charge through a provider that deduplicates on the key it is sent. The first attempt
    /// fails on the provider's side and releases the key; the retry sends the same downstream
    /// key, completes, and every later retry replays the answer without calling the provider.
    ///
    /// ```
    /// use std::collections::HashMap;
    /// use idem::{Begin, Request, Response, Scope, Store};
    ///
    /// /// A payment provider that honours idempotency keys (a stand-in for a real API).
    /// #[derive(Default)]
    /// struct Provider {
    ///     charges: HashMap<String, u64>,
    ///     fail_next: bool,
    /// }
    /// impl Provider {
    ///     fn charge(&mut self, idempotency_key: &str, cents: u64) -> Result<String, &'static str> {
    ///         if std::mem::take(&mut self.fail_next) {
    ///             return Err("503 from the provider");
    ///         }
    ///         self.charges.entry(idempotency_key.to_owned()).or_insert(cents);
    ///         Ok(format!("ch_{}", &idempotency_key[..8]))
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let mut provider = Provider { fail_next: true, ..Provider::default() };
    /// let mut keys_sent = Vec::new();
    /// let mut pay = |invoice: &str, cents: u64| -> Result<Option<Response>, Box<dyn std::error::Error>> {
    ///     let request = Request::new(Scope::new("tenant-42", "pay_invoice"), invoice, &cents)?;
    ///     match store.begin(request)? {
    ///         Begin::Acquired(lease) => {
    ///             let key = lease.downstream_key().to_hex();
    ///             keys_sent.push(key.clone());
    ///             match provider.charge(&key, cents) {
    ///                 Ok(charge) => Ok(Some(lease.complete(Response::new(200, charge))?)),
    ///                 // Nothing happened downstream: give the key up so a retry runs now.
    ///                 Err(_) => {
    ///                     lease.release()?;
    ///                     Ok(None)
    ///                 }
    ///             }
    ///         }
    ///         Begin::Replayed(stored) => Ok(Some(stored)),
    ///         Begin::InFlight { .. } | Begin::Expired(_) => Ok(None),
    ///     }
    /// };
    ///
    /// assert_eq!(pay("inv-7", 1_000)?, None); // the provider failed; the key was released
    /// let paid = pay("inv-7", 1_000)?.expect("the retry completes");
    /// let again = pay("inv-7", 1_000)?.expect("a replay");
    /// assert_eq!(paid, again); // replayed, byte for byte
    /// assert_eq!(keys_sent.len(), 2); // the replay did not call the provider
    /// assert_eq!(keys_sent[0], keys_sent[1]); // both attempts sent the same key
    /// assert_eq!(provider.charges.len(), 1); // one charge
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin(&self, request: Request) -> Result<Begin, Error> {
        Call::of(ENGINE, Kind::Begin, request.scope()).observe(|_| {
            let mut claim = Claim::new(request);
            let claimed = self.claim_key(&mut claim)?;
            self.begun(claim.into_request(), claimed)
        })
    }

    /// [`Store::begin`] for a [`Claim`] whose retries recognise the lease it already took:
    /// when a call fails — [`Error::OutcomeUnknown`] above all, where the claim may have
    /// committed without its answer arriving (reopen the store first: it is fail-stopped) —
    /// call again with the same claim. If an earlier call's claim landed, the key is Pending
    /// under that call's holder token: this call recognises it and takes the lease at once
    /// ([`crate::rules::Decision::Resume`]: same attempt, same downstream key, a new token),
    /// where [`Store::begin`] would answer `InFlight` until the lease lapsed. Otherwise the same
    /// answers as `begin`. The claim outlives the store: a reopened store recognises it.
    ///
    /// A lease an earlier call of this claim handed out is fenced by the resume
    /// ([`Error::LeaseLost`]): retry with the claim only while you hold none of its leases.
    ///
    /// # Example
    ///
    /// A worker loses the answer of its claim (here: the lease is forgotten, as if the answer
    /// never arrived). A plain `begin` sees another attempt in flight; the worker's retry with
    /// its claim takes the lease at once.
    ///
    /// ```
    /// use idem::{Begin, Claim, Request, Response, Scope, Store};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let request = Request::new(Scope::new("tenant-42", "ship_parcel"), "parcel-5", "express")?;
    /// let mut claim = Claim::new(request.clone());
    ///
    /// let Begin::Acquired(lease) = store.begin_claim(&mut claim)? else { unreachable!() };
    /// std::mem::forget(lease); // the answer is lost: nothing releases the key
    /// assert!(matches!(store.begin(request)?, Begin::InFlight { .. }));
    ///
    /// let Begin::Acquired(lease) = store.begin_claim(&mut claim)? else { unreachable!() };
    /// assert_eq!(lease.attempt(), 1); // the same attempt, taken back at once
    /// lease.complete(Response::new(200, "label"))?;
    /// assert!(matches!(store.begin_claim(&mut claim)?, Begin::Replayed(_)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin_claim(&self, claim: &mut Claim) -> Result<Begin, Error> {
        Call::of(ENGINE, Kind::Begin, claim.request().scope()).observe(|_| {
            let claimed = self.claim_key(claim)?;
            self.begun(claim.request().clone(), claimed)
        })
    }

    /// The lease of a committed claim for `request`, or the answer given instead. The Lease is
    /// built only after the commit: a Lease releases its key on drop, so one must never exist
    /// for a claim that did not commit.
    fn begun(&self, request: Request, claimed: ClaimedKey) -> Result<Begin, Error> {
        match claimed {
            Ok((key, holder, deadline, attempt)) => Ok(Begin::Acquired(Lease::new(
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

    /// Flow B's claim for `claim`, under a holder token drawn for this call (the claim
    /// remembers it, and forgets it when the call answers without writing it): a claim, a
    /// takeover of a lapsed lease, or a resume of a record one of the claim's earlier calls
    /// wrote.
    fn claim_key(&self, claim: &mut Claim) -> Result<ClaimedKey, Error> {
        let key = self.admit(claim.request())?;
        if let Some(early) = self.read_path(claim.request(), claim.tokens(), &key)? {
            return Ok(Err(early));
        }
        let config = &self.inner.config;
        let windows = config.windows_for(claim.request().scope().operation());
        let holder = self.new_token();
        claim.issue(holder);
        let (request, own) = (claim.request(), claim.tokens());
        let claimed = self.write(Durable::AsConfigured, |txn, now| {
            let mut open = Open::new(txn);
            let attempt = match self.decide_in(&mut open, request, own, &key, now) {
                Ok(Claimed::Free(attempt)) => attempt,
                Ok(Claimed::Early(early)) => return Step::Clean(Err(early)),
                Err(e) => return Step::Clean(Err(Early::Error(e))),
            };
            let (record, lease_deadline) = instants::claim(
                *request.fingerprint(),
                attempt,
                holder,
                now,
                config.lease_duration,
                &windows,
            );
            match self.put_open(&mut open, &key, &record) {
                Ok(()) => Step::Done(Ok((lease_deadline, attempt.number))),
                Err(e) => Step::Abort(e),
            }
        })?;
        match claimed {
            Ok((deadline, attempt)) => Ok(Ok((key, holder, deadline, attempt))),
            Err(early) => {
                // Answered from what was stored: this call's token was never written.
                claim.withdraw(&holder);
                Ok(Err(early))
            }
        }
    }

    /// Like [`Store::begin`], but when another attempt is in flight, waits up to `max_wait` for
    /// it to finish (returning its result), release (acquiring the key) or lapse (taking it
    /// over). Returns `Begin::InFlight` if it is still in flight after `max_wait`. Woken at
    /// once when a lease of this store is finished, released or purged; re-checks every 20 ms
    /// to notice a lapsing lease or another process's commit. `Duration::MAX` waits without a
    /// deadline. Refused with [`Error::Reentrant`] inside a closure of the same store (the
    /// holder could never finish while this thread holds the writer).
    ///
    /// # Example
    ///
    /// A second worker gets the same job while the first still runs it: [`Store::begin`]
    /// answers `InFlight` at once, `begin_wait` waits and gets the first worker's answer.
    ///
    /// ```
    /// use std::time::Duration;
    /// use idem::{Begin, Request, Response, Scope, Store};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let job = || Request::new(Scope::new("tenant-42", "render_report"), "report-9", "q3");
    ///
    /// let Begin::Acquired(lease) = store.begin(job()?)? else { unreachable!() };
    /// assert!(matches!(store.begin(job()?)?, Begin::InFlight { .. }));
    ///
    /// let second = std::thread::scope(|s| -> Result<Begin, idem::Error> {
    ///     let waiter = s.spawn(|| store.begin_wait(job()?, Duration::from_secs(10)));
    ///     // The first worker finishes; the waiter is woken at once.
    ///     lease.complete(Response::new(200, "report.pdf"))?;
    ///     waiter.join().expect("the waiter does not panic")
    /// })?;
    /// match second {
    ///     Begin::Replayed(answer) => assert_eq!(answer.body(), b"report.pdf"),
    ///     other => panic!("expected the first worker's answer, got {other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin_wait(&self, request: Request, max_wait: Duration) -> Result<Begin, Error> {
        // One observed call however many claims the wait makes.
        Call::of(ENGINE, Kind::Begin, request.scope())
            .observe(|_| self.begin_wait_observed(request, max_wait))
    }

    /// [`Store::begin_wait`], inside its observed call (`runtime/observe.rs`).
    fn begin_wait_observed(&self, request: Request, max_wait: Duration) -> Result<Begin, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        // `None`: a wait so long that the deadline is not representable, i.e. no deadline.
        let give_up = Instant::now().checked_add(max_wait);
        // One claim for every ask: an ask whose answer was lost is recognised by the next.
        let mut claim = Claim::new(request);
        loop {
            let seen = self.lease_events_seen();
            match self.claim_key(&mut claim)? {
                Err(Early::InFlight { retry_after }) => {
                    let now = Instant::now();
                    let slice = match give_up {
                        Some(t) if now >= t => return Ok(Begin::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL),
                        None => WAIT_POLL,
                    };
                    self.wait_for_lease_event(seen, slice);
                }
                other => return self.begun(claim.into_request(), other),
            }
        }
    }

    /// The stored record for `key` in `scope`, exactly as stored (it may be past its
    /// `expires_at` or `forget_at` if no sweep has run since; see [`crate::rules::is_expired`] and
    /// [`crate::rules::is_forgotten`]). For inspection and tests; never needed to
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
        let db = self.inner.db.get().map_err(|e| self.storage(e))?;
        db.begin_read().map_err(|e| self.storage(e))
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

    /// How long opening this store spent repairing its file, if the file was not closed
    /// cleanly (the last process died with it open) and quick-repair had not saved the
    /// allocator state: redb's walk of the whole file, progress reported to
    /// [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair). `None` for a file that was
    /// closed cleanly, a new file, or a reopen from quick-repair's saved state. A service may
    /// log it, or count it as an unclean restart.
    pub fn repair_time(&self) -> Option<Duration> {
        self.inner.repair_time
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
        modes: FileModes,
    ) -> Store {
        let inner = Inner {
            db: Db(Some(db)),
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

    // ---- shared plumbing (also used by Lease) ----

    /// The record key of `key` in `scope`, validated like a request's (no payload involved).
    fn admit_key(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Vec<u8>, Error> {
        admit_key(&self.inner.config.limits, scope, key)
    }

    fn admit(&self, request: &Request) -> Result<Vec<u8>, Error> {
        self.inner.config.limits.check(request)?;
        Ok(record_key(request))
    }

    /// The lock-free path: the answer a read transaction gives `request` (whose claim drew the
    /// holder tokens `own`; none for flow A) without a write, if any — a replay, a mismatch, an
    /// in-flight key. A fail-stopped store answers none: the answer after a failure is
    /// `FailStopped` whatever redb still holds in its cache.
    fn read_path(
        &self,
        request: &Request,
        own: &[HolderToken],
        key: &[u8],
    ) -> Result<Option<Early>, Error> {
        self.check_writable()?;
        let stored = self.read_record(key)?;
        let now = self.now();
        Ok(self.early(
            decide_among(
                stored.as_ref(),
                request.fingerprint(),
                own,
                now,
                self.inner.holders,
            ),
            request,
            now,
        ))
    }

    /// What `request` (whose claim drew the holder tokens `own`; none for flow A) may do,
    /// decided from the record read in the write transaction.
    fn decide_in(
        &self,
        open: &mut Open<'_>,
        request: &Request,
        own: &[HolderToken],
        key: &[u8],
        now: Timestamp,
    ) -> Result<Claimed, Error> {
        let stored = self.load_open(open, key)?;
        let decision = decide_among(
            stored.as_ref(),
            request.fingerprint(),
            own,
            now,
            self.inner.holders,
        );
        if let Some(early) = self.early(decision.clone(), request, now) {
            return Ok(Claimed::Early(early));
        }
        Ok(Claimed::Free(instants::attempt(
            &decision,
            stored.as_ref(),
            now,
        )))
    }

    /// The answer that needs no claim, if any; `now` is the time the decision was made at.
    fn early(&self, decision: Decision<'_>, request: &Request, now: Timestamp) -> Option<Early> {
        answers::early(decision, request, now, self.inner.config.retry_after_cap)
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
            let db = self.inner.db.get().map_err(|e| self.storage(e))?;
            let read = db.begin_read().map_err(|e| self.storage(e))?;
            f(&read).map_err(|e| self.observe(e))
        })
    }

    /// The record under `key` as of the latest commit, through the table the read path shares
    /// (engine/snapshot.rs), at the storage boundary like [`Store::read`].
    pub(crate) fn read_record(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        contained("reading a record", || {
            let table = self
                .inner
                .snapshot
                .records(self.inner.db.get().map_err(|e| self.storage(e))?)
                .map_err(|e| self.storage(e))?;
            record_in(&*table, key).map_err(|e| self.observe(e))
        })
    }

    pub(crate) fn load(&self, txn: &WriteTransaction, key: &[u8]) -> Result<Option<Record>, Error> {
        self.load_open(&mut Open::new(txn), key)
    }

    /// [`Store::load`] through tables already open.
    pub(crate) fn load_open(
        &self,
        open: &mut Open<'_>,
        key: &[u8],
    ) -> Result<Option<Record>, Error> {
        let table = open.records().map_err(|e| self.storage(e))?;
        record_in(table, key).map_err(|e| self.observe(e))
    }

    /// Writes a record, moving its expiry-index entry in the same transaction.
    pub(crate) fn put(
        &self,
        txn: &WriteTransaction,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Error> {
        self.put_open(&mut Open::new(txn), key, record)
    }

    /// [`Store::put`] through tables already open.
    pub(crate) fn put_open(
        &self,
        open: &mut Open<'_>,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Error> {
        self.with_latch(|| {
            let (records, expiry) = open.both()?;
            Ok(put_in(records, expiry, key, record)?)
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

    /// What a closure's result records (flow A and lease completion share the rule,
    /// [`answers::settle`]), within this store's response cap.
    pub(crate) fn settle(
        &self,
        result: Result<Response, Abort>,
    ) -> Result<(State, Response), Error> {
        answers::settle(result, self.inner.config.max_response_bytes)
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
            Error::Storage {
                source: redb_error(e),
            }
        };
        let db = self.inner.db.get().map_err(latched)?;
        let mut txn = db.begin_write().map_err(|e| latched(e.into()))?;
        if self.inner.quick_repair {
            txn.set_quick_repair(true);
        }
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
            if let Err(e) = txn.set_durability(redb::Durability::Immediate) {
                observe::warn!(
                    "a forced durable commit stays non-durable until the flusher's next tick",
                    error = observe::display(e),
                );
            }
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
        let result = txn.commit();
        // Whether or not it reached the file, before anyone is answered (engine/snapshot.rs).
        self.inner.snapshot.committed();
        if let Err(e) = result {
            let source: redb::Error = e.into();
            self.latch(&source);
            return Err(Error::OutcomeUnknown {
                source: redb_error(source),
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
        self.observe(Error::Storage {
            source: redb_error(e),
        })
    }

    /// Latches fail-stop if `e` reports an I/O-level failure; returns `e`, or, for an I/O-level
    /// failure after the store had already failed, [`Error::FailStopped`] naming the first
    /// failure (redb answers every later read of an uncached page with "previous I/O error",
    /// which names no cause).
    pub(crate) fn observe(&self, e: Error) -> Error {
        match &e {
            Error::Storage { source } if is_io_failure_in(source) => match self.latch(source) {
                Some(cause) => Error::FailStopped { cause },
                None => e,
            },
            Error::OutcomeUnknown { source } => {
                self.latch(source);
                e
            }
            _ => e,
        }
    }

    /// Latches fail-stop for damage found inside a write (its reason is the cause), and returns
    /// the error.
    pub(crate) fn latch_damage(&self, e: Error) -> Error {
        match &e {
            Error::CorruptStore { reason } => self.latch(reason),
            other => self.latch(other),
        };
        e
    }

    /// Latches fail-stop with `cause`, unless the store had already failed: then returns that
    /// earlier, first cause.
    pub(crate) fn latch(&self, cause: &dyn std::fmt::Display) -> Option<String> {
        let mut failure = self.inner.failure.lock();
        match &*failure {
            Some(first) => Some(first.clone()),
            None => {
                *failure = Some(cause.to_string());
                None
            }
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

/// Whether a storage error reports an I/O-level failure, whichever redb error type it wraps:
/// idem wraps `redb::Error`, but a caller's closure may build `Error::Storage` from the error a
/// table call gave it (a `redb::StorageError`, `TableError`, `CommitError`, ...), and such an
/// I/O failure must latch fail-stop all the same.
fn is_io_failure_in(source: &StorageError) -> bool {
    use redb::StorageError as S;
    let storage = |e: &S| {
        matches!(
            e,
            S::Io(_) | S::PreviousIo | S::Corrupted(_) | S::LockPoisoned(_) | S::DatabaseClosed
        )
    };
    if let Some(e) = source.downcast_ref::<redb::Error>() {
        return is_io_failure(e);
    }
    if let Some(e) = source.downcast_ref::<S>() {
        return storage(e);
    }
    if let Some(redb::TableError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::TransactionError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::DatabaseError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::CompactionError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::SavepointError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    match source.downcast_ref::<redb::CommitError>() {
        Some(redb::CommitError::Storage(e)) => storage(e),
        Some(redb::CommitError::TransactionPoisoned) => true,
        _ => false,
    }
}

/// The record stored under `key`, from a read transaction (a [`Store`] or a [`ReadOnlyStore`]).
pub(crate) fn read_record_in(
    read: &redb::ReadTransaction,
    key: &[u8],
) -> Result<Option<Record>, Error> {
    record_in(&read.open_table(RECORDS).map_err(unlatched)?, key)
}

/// The record under `key` in an open records table, decoded. A redb error is returned
/// [`unlatched`]: the caller latches it (or has nothing to latch).
fn record_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<Record>, Error> {
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

enum Claimed {
    Early(Early),
    Free(Attempt),
}

/// What a flow-B claim got: the key and the lease's token, deadline and attempt number once
/// the claim committed, or an answer without a claim.
type ClaimedKey = Result<(Vec<u8>, HolderToken, Timestamp, u32), Early>;

/// This engine's name in what it reports (feature `tracing`: the spans' `engine` field).
pub(crate) const ENGINE: Engine = Engine("redb");

/// What flow A's work in a write decided: the answer, and what to do once it committed.
struct FlowA {
    outcome: Result<Outcome, Error>,
    took_over: bool,
    announced: bool,
}
