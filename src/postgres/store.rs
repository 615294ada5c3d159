//! The PostgreSQL store: its shared state, flow A (`execute`), the claim half of flow B
//! (`begin`, `begin_wait`), inspection (`get`, `purge`), the read path, and the fleet's clock.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::Error;
use crate::model::claim::Claim;
use crate::model::clock::{Clock, Timestamp};
use crate::model::outbox::Origin;
use crate::model::record::{HolderToken, Record};
use crate::model::response::{Abort, BeginAnswer, ExecuteAnswer, Response};
use crate::model::rules::answers::{self, Early};
use crate::model::rules::instants;
use crate::model::rules::{Decision, decide_claim};
use crate::model::scope::{Limits, Request, Scope, admit_key, record_key};
use crate::model::settings::Config;
use crate::postgres::commit::{Batch, Group, Locks, Pooled, Step};
use crate::postgres::conn::{Failure, NOW_MS, classify, no_connection, storage};
use crate::postgres::lease::PgLease;
use crate::postgres::schema::Sql;
use crate::postgres::tx::{PgTx, TxState};
use crate::runtime::observe::{Call, Engine, Kind};
use crate::runtime::signal::Signal;

/// Granularity of `begin_wait`'s polling (it is also woken at once by this store's own lease
/// completions; other processes' are seen by polling).
const WAIT_POLL: Duration = Duration::from_millis(20);

/// Where the store's time comes from.
#[derive(Clone)]
pub(crate) enum TimeSource {
    /// The database server's clock (`clock_timestamp()`), the same for every node of a fleet.
    Server,
    /// An injected clock (tests).
    Clock(Arc<dyn Clock>),
}

/// The state every clone of a [`PgStore`] shares.
pub(crate) struct Inner {
    pub(crate) pool: r2d2::Pool<crate::postgres::conn::Manager>,
    pub(crate) pool_timeout: Duration,
    /// How many dead connections a call may meet before it gives up: the pool's size, plus
    /// one. After a server restart (or terminated backends) every idle pooled connection is
    /// dead, and each is discarded as it fails, so a call on an idle store is still answered.
    pub(crate) reconnects: u32,
    pub(crate) sql: Sql,
    pub(crate) config: Config,
    pub(crate) time: TimeSource,
    pub(crate) group: Group,
    /// Random per-instance prefix of holder tokens.
    pub(crate) instance: [u8; 8],
    pub(crate) next_token: AtomicU64,
    /// The last server time seen, and when (for [`PgStore::now`]'s estimate).
    pub(crate) seen_server: Mutex<(Timestamp, Instant)>,
    /// Lease events so far, broadcast after every commit that finished, released or removed a
    /// lease of this store, so `begin_wait` wakes at once.
    pub(crate) lease_events: Mutex<u64>,
    pub(crate) lease_changed: Condvar,
    /// Notified after a commit whose closure pushed outbox events (the dispatcher waits on it).
    pub(crate) work: Arc<Signal>,
    /// The layers' own state, one value per type ([`PgStore::extension`]).
    pub(crate) extensions: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
    /// The background sweeper, if configured.
    pub(crate) sweeper: Mutex<Option<crate::postgres::sweep::Sweeper>>,
    /// Test hooks (NOT PUBLIC API).
    #[cfg(feature = "__internal_whitebox")]
    pub(crate) hooks: crate::postgres::whitebox::Hooks,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(s) = self.sweeper.get_mut().take() {
            s.stop();
        }
    }
}

/// An idempotency store on a PostgreSQL database, shared by every process of a fleet. Cheap to
/// clone (clones share the pool); `Send + Sync`. Open it with [`PgStore::builder`].
///
/// The same contract as the file store ([`crate::Store`]), decided by the same pure rules: the
/// record is re-read under a row lock inside the transaction that writes it, leases are fenced
/// by their holder token in the `UPDATE … WHERE holder = …` itself, and every decision uses the
/// database server's clock, so no node's clock can free a key early or steal a lease.
///
/// Every call blocks for its round trips to the server (and the commit's fsync there). From
/// async code, run calls on the blocking pool (`tokio::task::spawn_blocking`), as the HTTP
/// layer does: the synchronous client refuses to block inside an async task (it panics).
#[derive(Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.sql.schema)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// Stores whose transaction is running a caller closure on this thread.
    static IN_CLOSURE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

impl PgStore {
    /// Flow A: runs `f` at most once per intent, in the same PostgreSQL transaction that
    /// records the result. `f` gets the transaction ([`PgTx`]) to write your own tables
    /// through: its writes and the record commit together, or neither does.
    ///
    /// - a finished intent is replayed from a plain read of its row (no lock taken, nothing
    ///   written, made by the same round trip that opens the group's transaction): `f` does not
    ///   run, the stored status and body come back byte for byte;
    /// - otherwise `f` runs, and the record is written in its transaction fenced by what was
    ///   read: an `INSERT` when the row was absent (it fails if another transaction inserted it
    ///   first), an `UPDATE … WHERE record = <the bytes read>` when it was there (it matches
    ///   nothing if another transaction rewrote it): either way the call runs again and replays
    ///   the other's answer. No check-then-act gap;
    ///   `Ok(response)` → Completed; [`Abort::Terminal`] → Failed (replayed later);
    ///   [`Abort::Retryable`] / [`Abort::Store`] / a failed statement → nothing, not even `f`'s
    ///   own writes;
    /// - an intent that finished longer ago than its retention → [`ExecuteAnswer::Expired`];
    /// - another attempt's live lease → [`ExecuteAnswer::InFlight`];
    /// - the key used with a different payload → [`Error::PayloadMismatch`].
    ///
    /// `f` may be called more than once per call (concurrent calls share one transaction, and
    /// another caller's failure or a serialization failure re-runs it); only the committed
    /// run's writes persist. Keep its effects inside the transaction.
    ///
    /// # Example
    ///
    /// (`no_run`: it needs a server.) Your own SQL runs through the `&mut PgTx` the closure
    /// gets, in the transaction that records the answer.
    ///
    /// ```no_run
    /// use idem::postgres::PgStore;
    /// use idem::{ExecuteAnswer, Request, Response, Scope};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PgStore::open("postgresql://app@db.internal/shop")?;
    /// let request = Request::new(Scope::new("tenant-42", "create_order"), "order-123", &("sku-1", 2i32))?;
    /// let outcome = store.execute(request.clone(), |tx| {
    ///     tx.execute(
    ///         "INSERT INTO orders (id, sku, qty) VALUES ($1, $2, $3)",
    ///         &[&"order-123", &"sku-1", &2i32],
    ///     )?;
    ///     Ok(Response::new(201, r#"{"id":"order-123"}"#).with_resource("order", "order-123"))
    /// })?;
    /// // A retry, from this process or any other sharing the database, replays the answer.
    /// let retry = store.execute(request, |_tx| unreachable!("a finished intent never runs again"))?;
    /// assert!(retry.is_replay());
    /// assert_eq!(outcome.response(), retry.response());
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        Call::of(ENGINE, Kind::Execute, request.scope())
            .observe(|call| self.execute_observed(request, &mut f, call))
    }

    /// [`PgStore::execute`], inside its observed `call` (`runtime/observe/`).
    fn execute_observed<F>(
        &self,
        request: Request,
        mut f: F,
        call: &Call,
    ) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        let key = self.admit(&request)?;
        let windows = self.inner.config.windows_for(request.scope().operation());
        let mut took_over = false;
        let mut announced = false;
        let outcome = self.write(Locks::record(&key), |batch| {
            let now = batch.now();
            let stored = match batch.record(&key) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(e)),
            };
            let attempt = match self.claimable(stored.as_ref(), &request, &[], now) {
                Ok(attempt) => attempt,
                Err(early) => return Step::Clean(early.into_outcome()),
            };
            took_over = attempt.number > 1;
            let origin = Origin::record(&key, attempt.created_at);
            let (result, pushed) = match self.run_on_tx(batch, origin, &mut f) {
                Ok(done) => done,
                Err(e) => return Step::Abort(e),
            };
            announced = pushed;
            let (state, response) =
                match answers::settle(result, self.inner.config.max_response_bytes) {
                    Ok(settled) => settled,
                    Err(e) => return Step::Abort(e),
                };
            let record = instants::finish(
                *request.fingerprint(),
                attempt.created_at,
                state,
                now,
                &windows,
            );
            match batch.put_record(&key, &record) {
                Ok(()) => Step::Done(Ok(ExecuteAnswer::Ran(response))),
                Err(e) => Step::Abort(e),
            }
        });
        if announced && outcome.is_ok() {
            self.announce_work();
        }
        let outcome = outcome?;
        if took_over && outcome.is_ok() {
            self.lease_event();
            call.took_over();
        }
        outcome
    }

    /// Flow B: claims the key with a fenced lease for work that calls the outside world.
    /// Returns `BeginAnswer::Acquired` with a [`PgLease`] (make the external call with
    /// [`PgLease::downstream_key`], identical to the file store's for the same scope and key),
    /// or the stored result (`BeginAnswer::Replayed`, `BeginAnswer::Expired`), or `BeginAnswer::InFlight`; a
    /// different payload is [`Error::PayloadMismatch`]. Fails fast; see
    /// [`PgStore::begin_wait`].
    ///
    /// # Example
    ///
    /// (`no_run`: it needs a server.) The provider gets the lease's downstream key; the charge
    /// is recorded in your own table with the answer ([`PgLease::complete_with`]), or the key
    /// is released when nothing happened downstream.
    ///
    /// ```no_run
    /// use idem::postgres::PgStore;
    /// use idem::{BeginAnswer, Request, Response, Scope};
    ///
    /// # fn charge(idempotency_key: &str, cents: i64) -> Result<String, std::io::Error> { Ok(format!("ch_{idempotency_key}")) }
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PgStore::open("postgresql://app@db.internal/payments")?;
    /// let request = Request::new(Scope::new("tenant-42", "pay_invoice"), "inv-7", &1_000i64)?;
    /// match store.begin(request)? {
    ///     BeginAnswer::Acquired(lease) => match charge(&lease.downstream_key().to_hex(), 1_000) {
    ///         Ok(charge_id) => {
    ///             lease.complete_with(|tx| {
    ///                 tx.execute(
    ///                     "INSERT INTO payments (invoice, charge_id) VALUES ($1, $2)",
    ///                     &[&"inv-7", &charge_id],
    ///                 )?;
    ///                 Ok(Response::new(200, charge_id.clone()))
    ///             })?;
    ///         }
    ///         Err(_) => lease.release()?, // nothing happened downstream: a retry runs at once
    ///     },
    ///     BeginAnswer::Replayed(answer) => println!("already paid: {:?}", answer.body()),
    ///     BeginAnswer::InFlight { retry_after } => println!("another node is paying; retry in {retry_after:?}"),
    ///     BeginAnswer::Expired(_) => println!("paid, long ago"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin(&self, request: Request) -> Result<BeginAnswer<PgLease>, Error> {
        Call::of(ENGINE, Kind::Begin, request.scope()).observe(|_| {
            let mut claim = Claim::new(request);
            let claimed = self.claim_key(&mut claim)?;
            self.begun(claim.into_request(), claimed)
        })
    }

    /// [`PgStore::begin`] for a [`Claim`] whose retries recognise the lease it already took:
    /// when a call fails — [`Error::OutcomeUnknown`] above all, where the claim may have
    /// committed without its answer arriving — call again with the same claim. If an earlier
    /// call's claim landed, the key is Pending under that call's holder token: this call
    /// recognises it and takes the lease at once ([`crate::rules::Decision::Resume`]: same
    /// attempt, same downstream key, a new token), where [`PgStore::begin`] would answer
    /// `InFlight` until the lease lapsed. Otherwise the same answers as `begin`.
    ///
    /// A lease an earlier call of this claim handed out is fenced by the resume
    /// ([`Error::LeaseLost`]): retry with the claim only while you hold none of its leases.
    ///
    /// # Example
    ///
    /// (`no_run`: it needs a server.)
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use idem::postgres::PgStore;
    /// use idem::{BeginAnswer, Claim, Error, Request, Response, Scope};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PgStore::open("postgresql://app@db.internal/payments")?;
    /// let request = Request::new(Scope::new("tenant-42", "pay_invoice"), "inv-7", &1_000i64)?;
    /// let mut claim = Claim::new(request);
    /// let mut tries = 0;
    /// let begun = loop {
    ///     tries += 1;
    ///     match store.begin_claim(&mut claim) {
    ///         // The connection failed: the claim may have landed; the retry recognises it.
    ///         Err(Error::OutcomeUnknown { .. } | Error::Storage { .. } | Error::Busy { .. })
    ///             if tries < 5 =>
    ///         {
    ///             std::thread::sleep(Duration::from_millis(100))
    ///         }
    ///         other => break other?,
    ///     }
    /// };
    /// if let BeginAnswer::Acquired(lease) = begun {
    ///     // … call the provider with lease.downstream_key() …
    ///     lease.complete(Response::new(200, "paid"))?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<PgLease>, Error> {
        Call::of(ENGINE, Kind::Begin, claim.request().scope()).observe(|_| {
            let claimed = self.claim_key(claim)?;
            self.begun(claim.request().clone(), claimed)
        })
    }

    /// The lease of a committed claim for `request`, or the answer given instead. The lease
    /// exists only once its claim committed: a lease releases its key on drop.
    fn begun(&self, request: Request, claimed: Claimed) -> Result<BeginAnswer<PgLease>, Error> {
        match claimed {
            Ok(c) => Ok(BeginAnswer::Acquired(PgLease::new(
                self.clone(),
                request,
                c.key,
                c.holder,
                c.deadline,
                c.attempt,
            ))),
            Err(early) => early.into_begin(),
        }
    }

    /// Flow B's claim for `claim`, under a holder token drawn for this call (the claim
    /// remembers it, and forgets it when the call answers without writing it): a claim, a
    /// takeover of a lapsed lease, or a resume of a record one of the claim's earlier calls
    /// wrote.
    fn claim_key(&self, claim: &mut Claim) -> Result<Claimed, Error> {
        let request = claim.request();
        let key = self.admit(request)?;
        let config = &self.inner.config;
        let windows = config.windows_for(request.scope().operation());
        let holder = self.new_token();
        claim.issue(holder);
        let (request, own) = (claim.request(), claim.tokens());
        let claimed = self.write(Locks::record(&key), |batch| {
            let now = batch.now();
            let stored = match batch.record(&key) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(Early::Error(e))),
            };
            let attempt = match self.claimable(stored.as_ref(), request, own, now) {
                Ok(attempt) => attempt,
                Err(early) => return Step::Clean(Err(early)),
            };
            let (record, lease_deadline) = instants::claim(
                *request.fingerprint(),
                attempt,
                holder,
                now,
                config.lease_duration,
                &windows,
            );
            match batch.put_record(&key, &record) {
                Ok(()) => Step::Done(Ok((lease_deadline, attempt.number))),
                Err(e) => Step::Abort(e),
            }
        })?;
        match claimed {
            Ok((deadline, attempt)) => Ok(Ok(ClaimedKey {
                key,
                holder,
                deadline,
                attempt,
            })),
            Err(early) => {
                // Answered from what was stored: this call's token was never written.
                claim.withdraw(&holder);
                Ok(Err(early))
            }
        }
    }

    /// Like [`PgStore::begin`], but when another attempt is in flight, waits up to `max_wait`
    /// for it to finish (returning its result), release (acquiring the key) or lapse (taking it
    /// over). Woken at once by this store's own lease events; re-checks every 20 ms for other
    /// processes' commits and lapsing leases. Refused with [`Error::Reentrant`] inside a closure
    /// of the same store.
    pub fn begin_wait(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<PgLease>, Error> {
        // One observed call however many claims the wait makes.
        Call::of(ENGINE, Kind::Begin, request.scope())
            .observe(|_| self.begin_wait_observed(request, max_wait))
    }

    /// [`PgStore::begin_wait`], inside its observed call (`runtime/observe/`).
    fn begin_wait_observed(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<PgLease>, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        let give_up = Instant::now().checked_add(max_wait);
        // One claim for every ask: an ask whose answer was lost is recognised by the next.
        let mut claim = Claim::new(request);
        loop {
            let seen = *self.inner.lease_events.lock();
            match self.claim_key(&mut claim)? {
                Err(Early::InFlight { retry_after }) => {
                    let now = Instant::now();
                    let slice = match give_up {
                        Some(t) if now >= t => return Ok(BeginAnswer::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL),
                        None => WAIT_POLL,
                    };
                    let mut events = self.inner.lease_events.lock();
                    if *events == seen {
                        let _ = self.inner.lease_changed.wait_for(&mut events, slice);
                    }
                }
                other => return self.begun(claim.into_request(), other),
            }
        }
    }

    /// The stored record for `key` in `scope`, exactly as stored (it may be past its
    /// `expires_at` or `forget_at` if no sweep has run since). For inspection and tests.
    pub fn get(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Option<Record>, Error> {
        let key = admit_key(&self.inner.config.limits, scope, key)?;
        Ok(self.read_record(&key)?.1)
    }

    /// Removes the record for `key` in `scope`, whatever its state, and returns whether one
    /// existed. An operator's tool: the key becomes free, so a retry of the intent **runs
    /// again**, and a live lease on it is fenced out ([`Error::LeaseLost`]).
    pub fn purge(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = admit_key(&self.inner.config.limits, scope, key)?;
        let existed = self.write(Locks::locked_record(&key), |batch| {
            // The row as locked, whether or not it decodes.
            match batch.record(&key) {
                Ok(None) => Step::Clean(false),
                Ok(Some(_))
                | Err(Error::CorruptRecord { .. } | Error::UnsupportedFormat { .. }) => {
                    batch.remove_record(&key);
                    Step::Done(true)
                }
                Err(e) => Step::Abort(e),
            }
        })?;
        self.lease_event();
        Ok(existed)
    }

    /// The store's time: the database server's clock (estimated from the last statement's
    /// time plus the time elapsed here since; every decision uses the server's exact time,
    /// read in the transaction that makes it), or the injected clock.
    pub fn now(&self) -> Timestamp {
        match &self.inner.time {
            TimeSource::Clock(c) => c.now(),
            TimeSource::Server => {
                let (at, when) = *self.inner.seen_server.lock();
                at.saturating_add(when.elapsed())
            }
        }
    }

    /// The name-length limits every request is checked against.
    pub fn limits(&self) -> Limits {
        self.inner.config.limits
    }

    /// The largest response body the store records.
    pub fn max_response_bytes(&self) -> usize {
        self.inner.config.max_response_bytes
    }

    /// How long a lease lasts without a heartbeat.
    pub fn lease_duration(&self) -> Duration {
        self.inner.config.lease_duration
    }

    /// How many requests may wait for the next commit: the natural bound for a face's
    /// in-flight store calls.
    pub fn max_queue(&self) -> usize {
        self.inner.group.config.max_queue
    }

    /// The PostgreSQL schema holding idem's tables.
    pub fn schema(&self) -> &str {
        &self.inner.sql.schema
    }

    /// A connection from the store's pool for your own statements outside idem's transactions
    /// (e.g. reading the rows a flow-A closure wrote, to serve a `GET`): the counterpart of the
    /// file store's `read_transaction`. It goes back to the pool when dropped. Writes made through it
    /// are not atomic with any idempotency record: make them in a closure instead.
    pub fn client(&self) -> Result<PgClient, Error> {
        Ok(PgClient(self.connection()?))
    }

    // ---- shared plumbing ----

    pub(crate) fn sql(&self) -> &Sql {
        &self.inner.sql
    }

    pub(crate) fn config(&self) -> &Config {
        &self.inner.config
    }

    pub(crate) fn group(&self) -> &Group {
        &self.inner.group
    }

    /// A pooled connection, or why there is none.
    pub(crate) fn connection(&self) -> Result<Pooled, Error> {
        let waited = self.inner.pool_timeout;
        self.inner
            .pool
            .get_timeout(waited)
            .map_err(|e| no_connection(e, waited))
    }

    /// The time a batch decides at, given the server's time it read.
    pub(crate) fn batch_time(&self, server_ms: i64) -> Timestamp {
        let server = Timestamp(u64::try_from(server_ms).unwrap_or(0));
        *self.inner.seen_server.lock() = (server, Instant::now());
        match &self.inner.time {
            TimeSource::Server => server,
            TimeSource::Clock(c) => c.now(),
        }
    }

    fn admit(&self, request: &Request) -> Result<Vec<u8>, Error> {
        self.inner.config.limits.check(request)?;
        Ok(record_key(request))
    }

    /// The attempt a claim at `now` starts, or the answer it gets instead; `own`: the holder
    /// tokens of the request's [`Claim`] (none for flow A).
    fn claimable(
        &self,
        stored: Option<&Record>,
        request: &Request,
        own: &[HolderToken],
        now: Timestamp,
    ) -> Result<instants::Attempt, Early> {
        let decision = decide_claim(stored, request.fingerprint(), own, now);
        if let Some(early) = answers::early(
            decision.clone(),
            request,
            now,
            self.inner.config.retry_after_cap,
        ) {
            return Err(early);
        }
        debug_assert!(matches!(
            decision,
            Decision::Claim | Decision::Takeover { .. } | Decision::Resume { .. }
        ));
        Ok(instants::attempt(&decision, stored, now))
    }

    /// The record under `key` and the time, from one statement outside any transaction.
    pub(crate) fn read_record(&self, key: &[u8]) -> Result<(Timestamp, Option<Record>), Error> {
        let q = format!(
            "SELECT {NOW_MS}, (SELECT record FROM {} WHERE record_key = $1)",
            self.inner.sql.records
        );
        let (now, bytes) = self.read_row(&q, key)?;
        Ok((now, bytes.map(|b| Record::decode(&b)).transpose()?))
    }

    /// Runs a read of one optional bytea value (and the server's time) for `key`, on a pooled
    /// connection; a connection that broke (a restarted server) is replaced, as many times as
    /// the pool may hold dead ones.
    pub(crate) fn read_row(
        &self,
        q: &str,
        key: &[u8],
    ) -> Result<(Timestamp, Option<Vec<u8>>), Error> {
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = self.connection()?;
            let result = conn
                .prepared(q)
                .and_then(|s| conn.client.query_one(&s, &[&key]));
            match result {
                Ok(row) => {
                    let now = self.batch_time(row.get::<_, i64>(0));
                    let bytes: Option<Vec<u8>> = row.get(1);
                    return Ok((now, bytes));
                }
                Err(e) => {
                    conn.saw(&e);
                    if tries <= self.inner.reconnects && classify(&e) != Failure::Refused {
                        continue;
                    }
                    return Err(storage(e));
                }
            }
        }
    }

    /// Runs the caller's closure on a [`PgTx`] over the batch's connection, marking this
    /// thread as inside this store's transaction (a nested write call fails fast with
    /// [`Error::Reentrant`]). Returns its result and whether it announced work; a statement of
    /// the closure that failed (the server then refuses the rest of the transaction) is this
    /// member's failure even if the closure swallowed it.
    pub(crate) fn run_on_tx<R>(
        &self,
        batch: &mut Batch<'_>,
        origin: Origin<'_>,
        f: impl for<'t> FnOnce(&'t mut PgTx<'t>) -> R,
    ) -> Result<(R, bool), Error> {
        let now = batch.now();
        let state = TxState::default();
        let result = {
            let mut tx = PgTx::new(batch.conn(), &self.inner.sql, now, origin, &state);
            self.run_closure(|| f(&mut tx))
        };
        if let Some(failed) = state.take_failure() {
            return Err(failed);
        }
        Ok((result, state.announced()))
    }

    fn run_closure<T>(&self, f: impl FnOnce() -> T) -> T {
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
        let _ = IN_CLOSURE.try_with(|v| v.borrow_mut().push(id));
        let _unmark = Unmark(id);
        f()
    }

    pub(crate) fn in_closure(&self) -> bool {
        let id = self.id();
        IN_CLOSURE
            .try_with(|v| v.borrow().contains(&id))
            .unwrap_or(false)
    }

    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Wakes whoever waits for announced work (this store's outbox dispatcher).
    pub(crate) fn announce_work(&self) {
        self.inner.work.notify();
    }

    /// The work-announced signal.
    pub(crate) fn work_signal(&self) -> Arc<Signal> {
        self.inner.work.clone()
    }

    /// Wakes `begin_wait` callers of this store.
    pub(crate) fn lease_event(&self) {
        let mut events = self.inner.lease_events.lock();
        *events = events.wrapping_add(1);
        self.inner.lease_changed.notify_all();
    }

    /// The store's value of type `T`, created with `T::default()` on first use (the outbox's
    /// counters and dispatcher registry).
    pub(crate) fn extension<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut slots = self.inner.extensions.lock();
        let slot = slots
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(slot).downcast::<T>() {
            Ok(value) => value,
            // Unreachable: the slot of `TypeId::of::<T>()` only ever holds a `T`.
            Err(_) => {
                let value = Arc::new(T::default());
                *slot = value.clone();
                value
            }
        }
    }

    pub(crate) fn new_token(&self) -> HolderToken {
        let n = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.inner.instance);
        t[8..].copy_from_slice(&n.to_be_bytes());
        HolderToken(t)
    }
}

/// A pooled connection lent by [`PgStore::client`]: a `postgres::Client` (through `Deref`),
/// returned to the pool when dropped.
pub struct PgClient(Pooled);

impl std::ops::Deref for PgClient {
    type Target = postgres::Client;

    fn deref(&self) -> &postgres::Client {
        &self.0.client
    }
}

impl std::ops::DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut postgres::Client {
        &mut self.0.client
    }
}

impl std::fmt::Debug for PgClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClient").finish_non_exhaustive()
    }
}

/// A committed claim: the key, and the lease's token, deadline and attempt number.
struct ClaimedKey {
    key: Vec<u8>,
    holder: HolderToken,
    deadline: Timestamp,
    attempt: u32,
}

/// What a flow-B claim got: the key, or an answer without a claim.
type Claimed = Result<ClaimedKey, Early>;

/// This engine's name in what it reports (feature `tracing`: the spans' `engine` field).
pub(crate) const ENGINE: Engine = Engine("postgres");
