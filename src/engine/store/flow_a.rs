//! Flow A: `execute` and `execute_on_writer`, and the step either runs inside a batch's write
//! transaction (decide again under the writer, run the closure, record the settled result).

use crate::engine::commit::{Durable, Step};
use crate::engine::open::Open;
use crate::engine::store::decide::Claimed;
use crate::engine::store::{ENGINE, Store};
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::Origin;
use crate::model::response::Abort;
use crate::model::response::{ExecuteAnswer, Response};
use crate::model::retention::Windows;
use crate::model::rules::instants;
use crate::model::scope::Request;
use crate::runtime::observe::{Call, Kind};

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
    ///   [`ExecuteAnswer::Expired`]: `f` does not run (the intent already happened);
    /// - another attempt's live lease → [`ExecuteAnswer::InFlight`];
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
    /// use idem::{Error, ExecuteAnswer, Request, Response, Scope, Store};
    ///
    /// const ORDERS: TableDefinition<&str, u32> = TableDefinition::new("orders");
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let scope = Scope::new("tenant-42", "create_order");
    /// let runs = Cell::new(0);
    /// let create = |quantity: u32| -> Result<ExecuteAnswer, Error> {
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
    /// assert!(matches!(&first, ExecuteAnswer::Ran(r) if r.status() == 201));
    /// assert!(retry.is_replay());
    /// assert_eq!(first.response(), retry.response()); // the same status and body
    /// assert_eq!(runs.get(), 1); // the closure ran once
    ///
    /// // The order row committed with the record.
    /// let orders = store.read_transaction()?.open_table(ORDERS)?;
    /// assert_eq!(orders.get("order-123")?.map(|q| q.value()), Some(2));
    ///
    /// // The key is bound to its first payload.
    /// assert!(matches!(create(5), Err(Error::PayloadMismatch { .. })));
    /// assert_eq!(runs.get(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        Call::of(ENGINE, Kind::Execute, request.scope())
            .observe(|call| self.execute_observed(request, &mut f, call))
    }

    /// [`Store::execute`], inside its observed `call` (`runtime/observe/`).
    fn execute_observed<F>(
        &self,
        request: Request,
        mut f: F,
        call: &Call,
    ) -> Result<ExecuteAnswer, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &[], &key)? {
            return early.into_outcome();
        }
        let windows = self.inner.config.windows_for(request.scope().operation());
        let done = self.write(Durable::AsConfigured, |txn, now| {
            let mut open = Open::new(*txn);
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
    pub fn execute_on_writer<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
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
        let (result, announced) = self.run_on_tx(&open.txn(), now, origin, f);
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
                outcome: Ok(ExecuteAnswer::Ran(response)),
                took_over: attempt.number > 1,
                announced,
            }),
            Err(e) => Step::Abort(e),
        }
    }

    /// After flow A's transaction ended: wake the dispatcher if events were pushed, and the
    /// waiters of a lapsed lease this intent finished.
    fn flow_a_done(&self, done: FlowA, call: &Call) -> Result<ExecuteAnswer, Error> {
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
}

/// What flow A's work in a write decided: the answer, and what to do once it committed.
struct FlowA {
    outcome: Result<ExecuteAnswer, Error>,
    took_over: bool,
    announced: bool,
}
