//! The claim half of flow B: `begin`, `begin_claim` and `begin_wait` claim a key with a lease
//! (the [`Lease`] itself is `engine/lease.rs`), and the lease events that wake a waiting
//! `begin_wait` at once.

use std::time::{Duration, Instant};

use crate::engine::commit::{Durable, Step};
use crate::engine::lease::{BeginAnswer, Lease};
use crate::engine::open::Open;
use crate::engine::store::decide::Claimed;
use crate::engine::store::{ENGINE, Store};
use crate::error::Error;
use crate::model::claim::Claim;
use crate::model::clock::Timestamp;
use crate::model::record::HolderToken;
use crate::model::rules::answers::Early;
use crate::model::rules::instants;
use crate::model::scope::Request;
use crate::runtime::observe::{Call, Kind};

/// Granularity of `begin_wait`'s polling (it is also woken at once by local completions).
const WAIT_POLL: Duration = Duration::from_millis(20);

impl Store {
    /// Flow B: claims the key with a lease for work that calls the outside world. Returns
    /// `BeginAnswer::Acquired` with a [`Lease`] (the attempt may now make the external call, using
    /// [`Lease::downstream_key`]), or the stored result (`BeginAnswer::Replayed`, or
    /// `BeginAnswer::Expired` past the retention), or `BeginAnswer::InFlight`; a different
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
    /// use idem::{BeginAnswer, Request, Response, Scope, Store};
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
    ///         BeginAnswer::Acquired(lease) => {
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
    ///         BeginAnswer::Replayed(stored) => Ok(Some(stored)),
    ///         BeginAnswer::InFlight { .. } | BeginAnswer::Expired(_) => Ok(None),
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
    pub fn begin(&self, request: Request) -> Result<BeginAnswer, Error> {
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
    /// use idem::{BeginAnswer, Claim, Request, Response, Scope, Store};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let request = Request::new(Scope::new("tenant-42", "ship_parcel"), "parcel-5", "express")?;
    /// let mut claim = Claim::new(request.clone());
    ///
    /// let BeginAnswer::Acquired(lease) = store.begin_claim(&mut claim)? else { unreachable!() };
    /// std::mem::forget(lease); // the answer is lost: nothing releases the key
    /// assert!(matches!(store.begin(request)?, BeginAnswer::InFlight { .. }));
    ///
    /// let BeginAnswer::Acquired(lease) = store.begin_claim(&mut claim)? else { unreachable!() };
    /// assert_eq!(lease.attempt(), 1); // the same attempt, taken back at once
    /// lease.complete(Response::new(200, "label"))?;
    /// assert!(matches!(store.begin_claim(&mut claim)?, BeginAnswer::Replayed(_)));
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer, Error> {
        Call::of(ENGINE, Kind::Begin, claim.request().scope()).observe(|_| {
            let claimed = self.claim_key(claim)?;
            self.begun(claim.request().clone(), claimed)
        })
    }

    /// The lease of a committed claim for `request`, or the answer given instead. The Lease is
    /// built only after the commit: a Lease releases its key on drop, so one must never exist
    /// for a claim that did not commit.
    fn begun(&self, request: Request, claimed: ClaimedKey) -> Result<BeginAnswer, Error> {
        match claimed {
            Ok((key, holder, deadline, attempt)) => Ok(BeginAnswer::Acquired(Lease::new(
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
            let mut open = Open::new(*txn);
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
    /// over). Returns `BeginAnswer::InFlight` if it is still in flight after `max_wait`. Woken at
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
    /// use idem::{BeginAnswer, Request, Response, Scope, Store};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let job = || Request::new(Scope::new("tenant-42", "render_report"), "report-9", "q3");
    ///
    /// let BeginAnswer::Acquired(lease) = store.begin(job()?)? else { unreachable!() };
    /// assert!(matches!(store.begin(job()?)?, BeginAnswer::InFlight { .. }));
    ///
    /// let second = std::thread::scope(|s| -> Result<BeginAnswer, idem::Error> {
    ///     let waiter = s.spawn(|| store.begin_wait(job()?, Duration::from_secs(10)));
    ///     // The first worker finishes; the waiter is woken at once.
    ///     lease.complete(Response::new(200, "report.pdf"))?;
    ///     waiter.join().expect("the waiter does not panic")
    /// })?;
    /// match second {
    ///     BeginAnswer::Replayed(answer) => assert_eq!(answer.body(), b"report.pdf"),
    ///     other => panic!("expected the first worker's answer, got {other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn begin_wait(&self, request: Request, max_wait: Duration) -> Result<BeginAnswer, Error> {
        // One observed call however many claims the wait makes.
        Call::of(ENGINE, Kind::Begin, request.scope())
            .observe(|_| self.begin_wait_observed(request, max_wait))
    }

    /// [`Store::begin_wait`], inside its observed call (`runtime/observe/`).
    fn begin_wait_observed(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer, Error> {
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
                        Some(t) if now >= t => return Ok(BeginAnswer::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL),
                        None => WAIT_POLL,
                    };
                    self.wait_for_lease_event(seen, slice);
                }
                other => return self.begun(claim.into_request(), other),
            }
        }
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
}

/// What a flow-B claim got: the key and the lease's token, deadline and attempt number once
/// the claim committed, or an answer without a claim.
type ClaimedKey = Result<(Vec<u8>, HolderToken, Timestamp, u32), Early>;
