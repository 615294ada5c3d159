//! Flow B's fenced lease.

use crate::engine::commit::{Durable, Step};
use crate::engine::journal::Wtx;
use crate::engine::store::ENGINE;
use crate::engine::store::Store;
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::keys::DownstreamKey;
use crate::model::outbox::Origin;
use crate::model::record::{HolderToken, Record};
use crate::model::response::Abort;
use crate::model::response::Response;
use crate::model::rules::holds_lease;
use crate::model::rules::instants;
use crate::model::scope::Request;
use crate::runtime::observe::{self, Attempted, Call, Kind};

/// The answer to [`Store::begin`]: `Acquired(Lease)`, `Replayed(Response)`, `InFlight { retry_after }`
/// or `Expired(Tombstone)`. Generic over the lease type so every engine answers with the same enum
/// (the PostgreSQL engine's is `BeginAnswer<PgLease>`); here it is this engine's [`Lease`].
pub type BeginAnswer<L = Lease> = crate::model::response::BeginAnswer<L>;

/// The right to finish one intent, held by exactly one attempt at a time.
///
/// Every call re-reads the record inside a write transaction and proceeds only if the record
/// still carries this lease's holder token ([`crate::rules::holds_lease`]). Once the lease lapsed and
/// another attempt took the key over (or a retry of the same [`crate::Claim`] took it back),
/// every call here fails with [`Error::LeaseLost`] and changes nothing: a stale holder can never
/// complete or overwrite a newer one.
///
/// Dropping an unfinished lease releases it (the record is removed and the key is free at
/// once). If the process dies instead, the lease deadline frees the key for a takeover. Every
/// finishing call (`complete`, `fail`, `release`) consumes the lease; if it returns an error
/// other than `LeaseLost`, the lease is released on drop, and a retry of the intent starts
/// again with the same [`Lease::downstream_key`].
///
/// # Example
///
/// A worker claims a job and stalls past its lease (a GC pause, a partition) without dying.
/// Another worker takes the job over with the same downstream key; when the first one wakes
/// up, its lease is fenced out: it can neither complete nor release what the new holder owns.
///
/// ```
/// use std::time::Duration;
/// use idem::clock::ManualClock;
/// use idem::{BeginAnswer, Error, Request, Response, Scope, Store, Timestamp};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let clock = ManualClock::new(Timestamp(1_700_000_000_000));
/// let store = Store::builder()
///     .clock(clock.clone())
///     .lease_duration(Duration::from_secs(30))
///     .open(dir.path().join("idem.redb"))?;
/// let job = || Request::new(Scope::new("tenant-42", "ship_parcel"), "parcel-5", "express");
///
/// let BeginAnswer::Acquired(stalled) = store.begin(job()?)? else { unreachable!() };
/// assert_eq!(stalled.attempt(), 1);
///
/// clock.advance(Duration::from_secs(31)); // no heartbeat: the lease lapsed
/// let BeginAnswer::Acquired(takeover) = store.begin(job()?)? else { unreachable!() };
/// assert_eq!(takeover.takeover_of(), Some(1));
/// assert_eq!(takeover.downstream_key(), stalled.downstream_key()); // the carrier dedupes
///
/// // The stale holder is fenced by its token: nothing it does reaches the record.
/// let late = stalled.complete(Response::new(200, "label from attempt 1"));
/// assert!(matches!(late, Err(Error::LeaseLost { .. })));
///
/// takeover.complete(Response::new(200, "label from attempt 2"))?;
/// let BeginAnswer::Replayed(answer) = store.begin(job()?)? else { unreachable!() };
/// assert_eq!(answer.body(), b"label from attempt 2");
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Lease {
    store: Store,
    request: Request,
    key: Vec<u8>,
    holder: HolderToken,
    deadline: Timestamp,
    attempt: u32,
    finished: bool,
    /// Dropped unfinished, the lease lapses at its deadline instead of being released.
    lapse_on_drop: bool,
}

impl Lease {
    pub(crate) fn new(
        store: Store,
        request: Request,
        key: Vec<u8>,
        holder: HolderToken,
        deadline: Timestamp,
        attempt: u32,
    ) -> Self {
        Lease {
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

    /// Whether dropping this lease unfinished — including inside a finishing call that failed
    /// with anything but `LeaseLost` — releases the key (the default, `false`) or lets the lease
    /// lapse at its deadline (`true`). For a face whose work may already have caused an effect
    /// outside the record's transaction: a retry must not run it again at once. An explicit
    /// [`Lease::release`] still releases. (Used by the HTTP layer.)
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn lapse_on_drop(&mut self, lapse: bool) {
        self.lapse_on_drop = lapse;
    }

    /// The key to send downstream (e.g. as the payment provider's idempotency key). Derived
    /// from (scope, key) only: identical on every attempt, including a takeover after a crash.
    pub fn downstream_key(&self) -> DownstreamKey {
        DownstreamKey::derive(&self.key)
    }

    /// This attempt's number: 1 for the first, +1 for every takeover of a lapsed lease.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// `Some(previous attempt number)` when this lease took over a lapsed one. Informational
    /// only: an earlier attempt may also have made the external call before releasing the key
    /// or before its record expired, in which case this attempt is numbered 1 again. Always
    /// call downstream with [`Lease::downstream_key`].
    pub fn takeover_of(&self) -> Option<u32> {
        (self.attempt > 1).then(|| self.attempt - 1)
    }

    /// When the lease lapses unless heartbeated.
    pub fn deadline(&self) -> Timestamp {
        self.deadline
    }

    /// The request this lease is for.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The holder token (for diagnostics and the fuzzer's model).
    pub fn holder(&self) -> HolderToken {
        self.holder
    }

    /// Extends the lease to the store's lease duration from now, and returns the new deadline.
    /// A lapsed lease that nobody took over can still be extended. A heartbeat never lowers
    /// the deadline ([`crate::rules::heartbeat_deadline`]): if the clock moved backwards, the deadline
    /// already granted stays, so no other attempt can take the key over before it.
    pub fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        let store = &self.store;
        let lease = store.config().lease_duration;
        let deadline = store.write(Durable::AsConfigured, |txn, now| {
            let record = match self.held(txn, now) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(e)),
            };
            // `held` only returns a Pending record; the stored deadline is the one in force.
            let Some((record, deadline)) = instants::heartbeat(&record, now, lease) else {
                return Step::Clean(Err(Error::LeaseLost {
                    key: self.request.key_display(),
                }));
            };
            match store.put(txn, &self.key, &record) {
                Ok(()) => Step::Done(Ok(deadline)),
                Err(e) => Step::Abort(e),
            }
        })?;
        let deadline = deadline.inspect_err(observe::lease_error)?;
        self.deadline = deadline;
        Ok(deadline)
    }

    /// Records success with `response`; every retry of the intent replays it.
    pub fn complete(self, response: Response) -> Result<Response, Error> {
        self.finish(move |_| Ok(response.clone()))
    }

    /// Records a terminal failure with `response`; every retry replays it and nothing runs again.
    pub fn fail(self, response: Response) -> Result<Response, Error> {
        self.finish(move |_| Err(Abort::Terminal(response.clone())))
    }

    /// Records the result together with the caller's own writes, in one transaction (same
    /// closure contract as [`Store::execute`]). Returns the stored response
    /// ([`Response::is_failure`] tells a terminal failure). On [`Abort::Retryable`], nothing is
    /// written and the lease is released.
    pub fn complete_with<F>(self, f: F) -> Result<Response, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        self.finish(f)
    }

    /// Like [`Lease::complete_with`], but through `&mut self`: after a failure other than
    /// `LeaseLost` the caller still holds the unfinished lease and decides what becomes of it
    /// (release it, record something else, or drop it to be released or to lapse). After `Ok`
    /// or `LeaseLost` it is finished, and dropping it does nothing. (Used by the HTTP layer,
    /// which records a terminal failure when `f` panicked, without ever letting the key go.)
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn complete_with_held<F>(&mut self, f: F) -> Result<Response, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        self.finish_held(f)
    }

    /// Gives the key up now, so the next attempt runs at once (e.g. after a retryable failure
    /// of the external call). A lease that was already lost is not an error here.
    pub fn release(mut self) -> Result<(), Error> {
        self.finished = true;
        self.release_inner()
    }

    fn finish<F>(mut self, f: F) -> Result<Response, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        // Unfinished after a failure (not `LeaseLost`): released or left to lapse on drop.
        self.finish_held(f)
    }

    fn finish_held<F>(&mut self, mut f: F) -> Result<Response, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        Call::of(ENGINE, Kind::Finish, self.request.scope())
            .observe(|_| self.finish_observed(&mut f))
    }

    /// [`Lease::finish_held`], inside its observed call (`runtime/observe/`).
    fn finish_observed<F>(&mut self, mut f: F) -> Result<Response, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        let store = self.store.clone();
        let windows = store.config().windows_for(self.request.scope().operation());
        let mut announced = false;
        let result = store.write(Durable::AsConfigured, |txn, now| {
            let record = match self.held(txn, now) {
                Ok(r) => r,
                Err(e) => return Step::Clean(Err(e)),
            };
            // The intent's creation time, kept by takeovers: every attempt pushes the same ids.
            let origin = Origin::record(&self.key, record.created_at);
            let (result, pushed) = store.run_on_tx(txn, now, origin, &mut f);
            announced = pushed;
            let (state, response) = match store.settle(result) {
                Ok(settled) => settled,
                Err(e) => return Step::Abort(e),
            };
            let finished =
                instants::finish(record.fingerprint, record.created_at, state, now, &windows);
            match store.put(txn, &self.key, &finished) {
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
            // Lost: nothing of ours to release on drop.
            Ok(Err(e @ Error::LeaseLost { .. })) => {
                self.finished = true;
                Err(e)
            }
            Ok(Err(e)) | Err(e) => Err(e),
        }
    }

    /// Reads the record inside `txn` and returns it if this lease still holds the key.
    fn held(&self, txn: &Wtx<'_>, now: Timestamp) -> Result<Record, Error> {
        match self.store.load(txn, &self.key)? {
            Some(r) if holds_lease(Some(&r), &self.holder, now) => Ok(r),
            _ => Err(Error::LeaseLost {
                key: self.request.key_display(),
            }),
        }
    }

    fn release_inner(&self) -> Result<(), Error> {
        let store = &self.store;
        let released = store.write(Durable::AsConfigured, |txn, now| {
            match self.held(txn, now) {
                Ok(_) => match store.remove(txn, &self.key) {
                    Ok(_) => Step::Done(Ok(true)),
                    Err(e) => Step::Abort(e),
                },
                // Already lost: nothing to release.
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

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.finished && !self.lapse_on_drop {
            // Best effort: if this fails (fail-stopped store, I/O error), the lease deadline
            // frees the key instead. I/O failures were latched by the store already.
            if let Err(e) = self.release_inner() {
                observe::unreleased_lease(self.request.scope().operation(), &e);
            }
        }
    }
}

impl Attempted for Lease {
    fn attempt_number(&self) -> u32 {
        self.attempt
    }
}
