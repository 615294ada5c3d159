//! Flow B's fenced lease on PostgreSQL: [`PgLease`].

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::keys::DownstreamKey;
use crate::model::outbox::Origin;
use crate::model::record::{HolderToken, Record};
use crate::model::response::{Abort, Response};
use crate::model::rules::{answers, holds_lease, instants};
use crate::model::scope::Request;
use crate::postgres::commit::{Batch, Locks, Step};
use crate::postgres::store::ENGINE;
use crate::postgres::store::PgStore;
use crate::postgres::tx::PgTx;
use crate::runtime::observe::{self, Attempted, Call, Kind};

/// The right to finish one intent, held by exactly one attempt at a time across every process
/// sharing the database.
///
/// Every call locks the record's row and proceeds only if it still carries this lease's holder
/// token ([`crate::rules::holds_lease`]), and the write itself is `UPDATE … WHERE holder =
/// <token>` (or the same `DELETE`), its row count checked by the server. Once the lease lapsed
/// and another attempt took the key over (or a retry of the same [`crate::Claim`] took it back),
/// every call fails with [`Error::LeaseLost`] and changes nothing.
///
/// Dropping an unfinished lease releases it (the key is free at once). If the process dies,
/// the lease deadline — on the database server's clock — frees the key for a takeover, by any
/// process.
///
/// # Example
///
/// (`no_run`: it needs a server.) A long export keeps its lease with heartbeats; a takeover of
/// a crashed attempt resumes with the same downstream key, so the receiver drops the chunks it
/// already has.
///
/// ```no_run
/// use idem::postgres::PgStore;
/// use idem::{BeginAnswer, Request, Response, Scope};
///
/// # fn send_chunk(idempotency_key: &str, chunk: u32) -> Result<(), std::io::Error> { Ok(()) }
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgStore::open("postgresql://app@db.internal/exports")?;
/// let request = Request::new(Scope::new("tenant-42", "export"), "export-2024-06", "csv")?;
/// let BeginAnswer::Acquired(mut lease) = store.begin(request)? else {
///     return Ok(()); // done already, or running on another node
/// };
/// if let Some(previous) = lease.takeover_of() {
///     println!("attempt {previous} stopped heartbeating; resuming with the same key");
/// }
/// let key = lease.downstream_key().to_hex();
/// for chunk in 0..10 {
///     send_chunk(&key, chunk)?;
///     lease.heartbeat()?; // LeaseLost if another node took over: stop then
/// }
/// lease.complete_with(|tx| {
///     tx.execute("UPDATE exports SET done = true WHERE id = $1", &[&"export-2024-06"])?;
///     Ok(Response::new(200, "exported"))
/// })?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PgLease {
    store: PgStore,
    request: Request,
    key: Vec<u8>,
    holder: HolderToken,
    deadline: Timestamp,
    attempt: u32,
    finished: bool,
    /// Dropped unfinished, the lease lapses at its deadline instead of being released.
    lapse_on_drop: bool,
}

impl PgLease {
    pub(crate) fn new(
        store: PgStore,
        request: Request,
        key: Vec<u8>,
        holder: HolderToken,
        deadline: Timestamp,
        attempt: u32,
    ) -> Self {
        PgLease {
            store,
            request,
            key,
            holder,
            deadline,
            attempt,
            finished: false,
            lapse_on_drop: false,
        }
    }

    /// Whether dropping this lease unfinished releases the key (`false`, the default) or lets
    /// the lease lapse at its deadline (`true`), as [`crate::Lease`]'s (used by the HTTP layer).
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn lapse_on_drop(&mut self, lapse: bool) {
        self.lapse_on_drop = lapse;
    }

    /// The key to send downstream: derived from (scope, key) only, identical on every attempt
    /// of every process, and identical to the file store's ([`crate::Lease::downstream_key`]).
    pub fn downstream_key(&self) -> DownstreamKey {
        DownstreamKey::derive(&self.key)
    }

    /// This attempt's number: 1 for the first, +1 for every takeover of a lapsed lease.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// `Some(previous attempt number)` when this lease took over a lapsed one.
    pub fn takeover_of(&self) -> Option<u32> {
        (self.attempt > 1).then(|| self.attempt - 1)
    }

    /// When the lease lapses unless heartbeated (the database server's clock).
    pub fn deadline(&self) -> Timestamp {
        self.deadline
    }

    /// The request this lease is for.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The holder token.
    pub fn holder(&self) -> HolderToken {
        self.holder
    }

    /// Extends the lease to the lease duration from now (the server's time) and returns the new
    /// deadline; never lowers it ([`crate::rules::heartbeat_deadline`]).
    pub fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        let store = self.store.clone();
        let lease = store.config().lease_duration;
        let deadline = store.write(Locks::locked_record(&self.key), |batch| {
            let record = match self.held(batch) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(e)),
            };
            let Some((record, deadline)) = instants::heartbeat(&record, batch.now(), lease) else {
                return Step::Clean(Err(self.lost()));
            };
            match batch.put_record(&self.key, &record) {
                Ok(()) => Step::Done(Ok(deadline)),
                Err(e) => Step::Abort(e),
            }
        })?;
        let deadline = deadline.inspect_err(observe::lease_error)?;
        self.deadline = deadline;
        Ok(deadline)
    }

    /// Records success with `response`; every retry of the intent replays it.
    pub fn complete(mut self, response: Response) -> Result<Response, Error> {
        self.finish_held(move |_| Ok(response.clone()))
    }

    /// Records a terminal failure with `response`; every retry replays it.
    pub fn fail(mut self, response: Response) -> Result<Response, Error> {
        self.finish_held(move |_| Err(Abort::Terminal(response.clone())))
    }

    /// Records the result together with the caller's own writes, in one transaction (same
    /// closure contract as [`PgStore::execute`]). On [`Abort::Retryable`], nothing is written
    /// and the lease is released.
    pub fn complete_with<F>(mut self, f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        self.finish_held(f)
    }

    /// Like [`PgLease::complete_with`], through `&mut self` (used by the HTTP layer): after a
    /// failure other than `LeaseLost` the caller still holds the unfinished lease.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn complete_with_held<F>(&mut self, f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        self.finish_held(f)
    }

    /// Gives the key up now, so the next attempt runs at once. A lease already lost is not an
    /// error here.
    pub fn release(mut self) -> Result<(), Error> {
        self.finished = true;
        self.release_inner()
    }

    fn finish_held<F>(&mut self, mut f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        Call::of(ENGINE, Kind::Finish, self.request.scope())
            .observe(|_| self.finish_observed(&mut f))
    }

    /// [`PgLease::finish_held`], inside its observed call (`runtime/observe/`).
    fn finish_observed<F>(&mut self, mut f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
    {
        let store = self.store.clone();
        let windows = store.config().windows_for(self.request.scope().operation());
        let max = store.config().max_response_bytes;
        let mut announced = false;
        let result = store.write(Locks::locked_record(&self.key), |batch| {
            let record = match self.held(batch) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(e)),
            };
            let origin = Origin::record(&self.key, record.created_at);
            let (result, pushed) = match store.run_on_tx(batch, origin, &mut f) {
                Ok(done) => done,
                Err(e) => return Step::Abort(e),
            };
            announced = pushed;
            let (state, response) = match answers::settle(result, max) {
                Ok(settled) => settled,
                Err(e) => return Step::Abort(e),
            };
            let finished = instants::finish(
                record.fingerprint,
                record.created_at,
                state,
                batch.now(),
                &windows,
            );
            match batch.put_record(&self.key, &finished) {
                Ok(()) => Step::Done(Ok(response)),
                Err(e) => Step::Abort(e),
            }
        });
        if announced && result.is_ok() {
            store.announce_work();
        }
        match result {
            Ok(Ok(response)) => {
                self.finished = true;
                store.lease_event();
                Ok(response)
            }
            Ok(Err(e @ Error::LeaseLost { .. })) => {
                self.finished = true;
                Err(e)
            }
            Ok(Err(e)) | Err(e) => Err(e),
        }
    }

    /// The locked record, if this lease still holds the key.
    fn held(&self, batch: &Batch<'_>) -> Result<Record, Error> {
        match batch.record(&self.key)? {
            Some(r) if holds_lease(Some(&r), &self.holder, batch.now()) => Ok(r),
            _ => Err(self.lost()),
        }
    }

    fn lost(&self) -> Error {
        Error::LeaseLost {
            key: self.request.key_display(),
        }
    }

    fn release_inner(&self) -> Result<(), Error> {
        let store = &self.store;
        let released = store.write(Locks::locked_record(&self.key), |batch| {
            match self.held(batch) {
                Ok(_) => {
                    batch.remove_record(&self.key);
                    Step::Done(Ok(true))
                }
                Err(Error::LeaseLost { .. }) => Step::Clean(Ok(false)),
                Err(e) => Step::Clean(Err(e)),
            }
        })??;
        if released {
            store.lease_event();
        }
        Ok(())
    }
}

impl Drop for PgLease {
    fn drop(&mut self) {
        if !self.finished && !self.lapse_on_drop {
            // Best effort: if this fails (the server is unreachable), the lease deadline frees
            // the key instead.
            if let Err(e) = self.release_inner() {
                observe::unreleased_lease(self.request.scope().operation(), &e);
            }
        }
    }
}

impl Attempted for PgLease {
    fn attempt_number(&self) -> u32 {
        self.attempt
    }
}
