//! The async face (feature `tokio`): [`AsyncStore`] runs either engine's calls off the async
//! runtime, with a bound on how many run at once, and [`AsyncLease`] finishes flow-B leases from
//! async code; [`AsyncPublisher`] lets the outbox dispatcher publish through an async broker
//! client.
//!
//! **What blocks, and for how long.** Every store call does I/O and waits for it: the file
//! store waits for the group's commit and its fsync (about a millisecond on a local SSD, more on
//! network storage, plus the batch it queues behind); the PostgreSQL store waits for its round
//! trips and the server's commit. Called directly from an async task that blocks a runtime worker
//! for that long, and the PostgreSQL client refuses it outright (it panics). Through this face
//! each call runs on tokio's blocking pool (`spawn_blocking`) and the task awaits it.
//!
//! **Overload is an answer, not a queue.** At most [`AsyncStore::max_in_flight`] admissions —
//! `execute`, `begin`, `process`, `receive` — run at once; one more is answered
//! [`Error::Busy`] at once (so a flood of requests cannot pile up in the blocking pool's
//! unbounded queue). A lease's calls (heartbeat, complete, fail, release) are never refused: a
//! started intent must always be able to finish.
//!
//! **Dropping blocks.** Dropping an unfinished file-store `Lease` releases its key with a
//! write, and dropping a dispatcher handle joins its thread. [`AsyncLease`] releases on the
//! blocking pool when dropped inside a runtime; a `DispatcherHandle` should be shut down with
//! `spawn_blocking(move || handle.shutdown())`.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
//! # let dir = tempfile::tempdir()?;
//! use idem::asynchronous::AsyncStore;
//! use idem::redb::TableDefinition;
//! use idem::{ExecuteAnswer, Request, Response, Scope, Store};
//!
//! const ORDERS: TableDefinition<&str, u32> = TableDefinition::new("orders");
//!
//! let store = AsyncStore::new(Store::open(dir.path().join("idem.redb"))?);
//! let place = || async {
//!     let req = Request::new(Scope::new("tenant-42", "create_order"), "order-123", &2u32)?;
//!     store
//!         .execute(req, |tx| {
//!             tx.open_table(ORDERS)?.insert("order-123", 2)?;
//!             Ok(Response::new(201, "created"))
//!         })
//!         .await
//! };
//! assert!(matches!(place().await?, ExecuteAnswer::Ran(_)));
//! assert!(matches!(place().await?, ExecuteAnswer::Replayed(_)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::backend::{Backend, BackendLease, TxOf};
use crate::error::BoxError;
use crate::inbox::{ProcessAnswer, ReceiveAnswer};
use crate::model::keys::DownstreamKey;
use crate::outbox::{DispatcherHandle, DispatcherOptions, Publisher, StoredEvent};
use crate::{Abort, BeginAnswer, Claim, Error, ExecuteAnswer, Request, Response, Store, Timestamp};

/// How often `begin_wait` asks again while another attempt is in flight (it sleeps between
/// asks: no thread waits).
const WAIT_POLL: Duration = Duration::from_millis(20);

/// The default bound on admissions in flight: half of tokio's default blocking pool (512
/// threads), so the calls that finish started intents always find threads.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Either engine, called from async code: each call runs on tokio's blocking pool, with at
/// most `max_in_flight` admissions at once (see the module docs). Cheap to clone.
pub struct AsyncStore<B: Backend = Store> {
    store: B,
    permits: Arc<Semaphore>,
    max_in_flight: usize,
}

impl<B: Backend> Clone for AsyncStore<B> {
    fn clone(&self) -> Self {
        AsyncStore {
            store: self.store.clone(),
            permits: Arc::clone(&self.permits),
            max_in_flight: self.max_in_flight,
        }
    }
}

impl<B: Backend> std::fmt::Debug for AsyncStore<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncStore")
            .field("max_in_flight", &self.max_in_flight)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> AsyncStore<B> {
    /// `store` for async callers, with at most the store's `max_queue` (and at most 256)
    /// admissions in flight.
    pub fn new(store: B) -> Self {
        let n = store.max_queue().clamp(1, DEFAULT_MAX_IN_FLIGHT);
        AsyncStore {
            store,
            permits: Arc::new(Semaphore::new(n)),
            max_in_flight: n,
        }
    }

    /// At most `n` admissions (`execute`, `begin`, `process`, `receive`) in flight at once
    /// (at least 1); more are answered [`Error::Busy`] at once. A limit above half of the
    /// runtime's blocking pool starves the calls that finish started intents.
    pub fn with_max_in_flight(mut self, n: usize) -> Self {
        let n = n.clamp(1, Semaphore::MAX_PERMITS);
        self.permits = Arc::new(Semaphore::new(n));
        self.max_in_flight = n;
        self
    }

    /// The bound on admissions in flight.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// Admissions running now.
    pub fn in_flight(&self) -> usize {
        self.max_in_flight
            .saturating_sub(self.permits.available_permits())
    }

    /// The engine under this face (for its synchronous calls: stats, sweeps, inspection).
    pub fn inner(&self) -> &B {
        &self.store
    }

    /// Flow A ([`crate::Store::execute`]): `f` runs at most once per intent, on the blocking
    /// pool, in the transaction that records its result.
    pub async fn execute<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(TxOf<'t, B>) -> Result<Response, Abort> + Send + 'static,
    {
        let store = self.store.clone();
        // `f` is Send + 'static: the engine may run it on the thread that holds the batch.
        self.admitted(move || store.execute_on_writer(request, move |tx| f(tx)))
            .await
    }

    /// Flow B ([`crate::Store::begin`]): claims the key with a lease, or answers without one.
    pub async fn begin(&self, request: Request) -> Result<BeginAnswer<AsyncLease<B>>, Error> {
        let store = self.store.clone();
        let begun = self.admitted(move || store.begin(request)).await?;
        Ok(match begun {
            BeginAnswer::Acquired(lease) => BeginAnswer::Acquired(AsyncLease::new(lease)),
            BeginAnswer::Replayed(r) => BeginAnswer::Replayed(r),
            BeginAnswer::InFlight { retry_after } => BeginAnswer::InFlight { retry_after },
            BeginAnswer::Expired(t) => BeginAnswer::Expired(t),
        })
    }

    /// [`AsyncStore::begin`] for a [`Claim`] ([`crate::Store::begin_claim`]): after a failed
    /// call, a retry with the same claim recognises a claim that landed and takes its lease at
    /// once. The claim learns this call's holder token when the call returns: if this future is
    /// dropped before then, a retry does not recognise what the abandoned call may have
    /// written (it waits for that lease to lapse, as a plain `begin` does).
    pub async fn begin_claim(
        &self,
        claim: &mut Claim,
    ) -> Result<BeginAnswer<AsyncLease<B>>, Error> {
        let store = self.store.clone();
        let mut sent = claim.clone();
        let (begun, sent) = self
            .admitted(move || {
                let begun = store.begin_claim(&mut sent);
                Ok((begun, sent))
            })
            .await?;
        *claim = sent;
        Ok(match begun? {
            BeginAnswer::Acquired(lease) => BeginAnswer::Acquired(AsyncLease::new(lease)),
            BeginAnswer::Replayed(r) => BeginAnswer::Replayed(r),
            BeginAnswer::InFlight { retry_after } => BeginAnswer::InFlight { retry_after },
            BeginAnswer::Expired(t) => BeginAnswer::Expired(t),
        })
    }

    /// Like [`AsyncStore::begin`], but while another attempt is in flight, waits (sleeping,
    /// not blocking a thread) up to `max_wait` for it to finish, release or lapse, asking again
    /// every 20 ms or at the hinted `retry_after`, whichever is sooner. Returns
    /// `BeginAnswer::InFlight` if it is still in flight after `max_wait`.
    pub async fn begin_wait(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<AsyncLease<B>>, Error> {
        let give_up = Instant::now().checked_add(max_wait);
        // One claim for every ask: an ask whose answer was lost is recognised by the next.
        let mut claim = Claim::new(request);
        loop {
            match self.begin_claim(&mut claim).await? {
                BeginAnswer::InFlight { retry_after } => {
                    let now = Instant::now();
                    let pause = match give_up {
                        Some(t) if now >= t => return Ok(BeginAnswer::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL).min(retry_after),
                        None => WAIT_POLL.min(retry_after),
                    };
                    tokio::time::sleep(pause).await;
                }
                other => return Ok(other),
            }
        }
    }

    /// The inbox ([`crate::Store::process`]): `f` runs at most once per message.
    pub async fn process<T, F>(
        &self,
        subscriber: impl Into<String>,
        message_id: impl Into<Vec<u8>>,
        mut f: F,
    ) -> Result<ProcessAnswer<T>, Error>
    where
        T: Send + 'static,
        F: for<'t> FnMut(TxOf<'t, B>) -> Result<T, Abort> + Send + 'static,
    {
        let store = self.store.clone();
        let (subscriber, id) = (subscriber.into(), message_id.into());
        self.admitted(move || store.process(&subscriber, &id, move |tx| f(tx)))
            .await
    }

    /// Webhook receipts ([`crate::Store::receive`]): `f` runs at most once per delivery; call it
    /// after the signature was verified.
    pub async fn receive<T, F>(
        &self,
        source: impl Into<String>,
        delivery_id: impl Into<Vec<u8>>,
        mut f: F,
    ) -> Result<ReceiveAnswer<T>, Error>
    where
        T: Send + 'static,
        F: for<'t> FnMut(TxOf<'t, B>) -> Result<T, Abort> + Send + 'static,
    {
        let store = self.store.clone();
        let (source, id) = (source.into(), delivery_id.into());
        self.admitted(move || store.receive(&source, &id, move |tx| f(tx)))
            .await
    }

    /// Flow B's claim for a face that keeps the engine's own lease (the HTTP layer holds it in
    /// a slot shared with its heartbeats): an admission like [`AsyncStore::begin`].
    #[cfg(feature = "http")]
    pub(crate) async fn begin_held(
        &self,
        request: Request,
    ) -> Result<BeginAnswer<B::Lease>, Error> {
        let store = self.store.clone();
        self.admitted(move || store.begin(request)).await
    }

    /// Runs an admission on the blocking pool, holding a permit for its length, or answers
    /// `Busy` at once when none is free.
    async fn admitted<T: Send + 'static>(
        &self,
        call: impl FnOnce() -> Result<T, Error> + Send + 'static,
    ) -> Result<T, Error> {
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            return Err(Error::Busy {
                queued: self.max_in_flight,
                waited: Duration::ZERO,
            });
        };
        blocking(move || {
            let result = call();
            drop(permit);
            result
        })
        .await
    }
}

/// Runs `call` on the blocking pool; a panic there is [`Error::Internal`] for this call, never
/// a panic of the awaiting task.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    run_blocking(call).await?
}

/// Runs any store work `f` on the blocking pool (the one place the faces leave the async
/// runtime); `Err` when it panicked or was cancelled.
pub(crate) async fn run_blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| Error::Internal {
            what: "a store call on the blocking pool panicked or was cancelled",
        })
}

/// A flow-B lease, finished from async code (each call on the blocking pool; never refused for
/// overload: a started intent can always finish). Dropped unfinished inside a runtime, it is
/// released on the blocking pool (or lapses, if it was marked so), never on the async worker.
pub struct AsyncLease<B: Backend = Store> {
    lease: Option<B::Lease>,
    request: Request,
    downstream: DownstreamKey,
    deadline: Timestamp,
}

impl<B: Backend> std::fmt::Debug for AsyncLease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLease")
            .field("request", &self.request)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> AsyncLease<B> {
    fn new(lease: B::Lease) -> Self {
        AsyncLease {
            request: lease.request().clone(),
            downstream: lease.downstream_key(),
            deadline: lease.deadline(),
            lease: Some(lease),
        }
    }

    /// The key to send downstream (the same on every attempt; see `Lease::downstream_key`).
    pub fn downstream_key(&self) -> DownstreamKey {
        self.downstream
    }

    /// When the lease lapses unless heartbeated (as of the last call).
    pub fn deadline(&self) -> Timestamp {
        self.deadline
    }

    /// The request this lease is for.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Extends the lease (`Lease::heartbeat`).
    pub async fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        let mut lease = self.take()?;
        let (lease, result) = blocking(move || {
            let result = lease.heartbeat();
            Ok((lease, result))
        })
        .await?;
        self.lease = Some(lease);
        let deadline = result?;
        self.deadline = deadline;
        Ok(deadline)
    }

    /// Records success (`Lease::complete`).
    pub async fn complete(mut self, response: Response) -> Result<Response, Error> {
        let lease = self.take()?;
        blocking(move || lease.complete(response)).await
    }

    /// Records a terminal failure (`Lease::fail`).
    pub async fn fail(mut self, response: Response) -> Result<Response, Error> {
        let lease = self.take()?;
        blocking(move || lease.fail(response)).await
    }

    /// Records the result with the closure's own writes, in one transaction
    /// (`Lease::complete_with`). On a failure other than `LeaseLost` the lease is released.
    pub async fn complete_with<F>(mut self, mut f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(TxOf<'t, B>) -> Result<Response, Abort> + Send + 'static,
    {
        let mut lease = self.take()?;
        blocking(move || {
            let result = lease.complete_with_held(move |tx| f(tx));
            match result {
                Ok(r) => Ok(r),
                Err(e @ Error::LeaseLost { .. }) => Err(e),
                Err(e) => {
                    let _ = lease.release();
                    Err(e)
                }
            }
        })
        .await
    }

    /// Gives the key up now (`Lease::release`).
    pub async fn release(mut self) -> Result<(), Error> {
        let lease = self.take()?;
        blocking(move || lease.release()).await
    }

    fn take(&mut self) -> Result<B::Lease, Error> {
        self.lease.take().ok_or(Error::Internal {
            what: "an AsyncLease was used after its lease was finished",
        })
    }
}

impl<B: Backend> Drop for AsyncLease<B> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            // Dropping a lease releases its key with a write: off the async worker.
            match tokio::runtime::Handle::try_current() {
                Ok(handle) => {
                    handle.spawn_blocking(move || drop(lease));
                }
                Err(_) => drop(lease),
            }
        }
    }
}

/// Publishes outbox events through an async broker client (the async counterpart of
/// [`Publisher`]): the dispatcher's thread drives each publish on the runtime given to
/// [`start_dispatcher`]. Return `Ok` only once the broker has accepted the event.
pub trait AsyncPublisher: Send + 'static {
    /// Publishes one event.
    fn publish(&mut self, event: &StoredEvent)
    -> impl Future<Output = Result<(), BoxError>> + Send;
}

/// The bridge: a sync [`Publisher`] that blocks its (dispatcher) thread on the async publish.
struct Bridge<P> {
    publisher: P,
    runtime: tokio::runtime::Handle,
}

impl<P: AsyncPublisher> Publisher for Bridge<P> {
    fn publish(&mut self, event: &StoredEvent) -> Result<(), BoxError> {
        let Bridge { publisher, runtime } = self;
        runtime.block_on(publisher.publish(event))
    }
}

/// Starts `store`'s outbox dispatcher with an async publisher: the dispatcher's own thread
/// (never a runtime worker) waits for each publish, which runs on the runtime `runtime` is a
/// handle of (`tokio::runtime::Handle::current()`). Same contract as the engine's
/// `start_dispatcher`. Shut the handle down off the runtime (`spawn_blocking`): it joins the
/// thread.
pub fn start_dispatcher<B: DispatchingBackend>(
    store: &B,
    publisher: impl AsyncPublisher,
    options: DispatcherOptions,
    runtime: tokio::runtime::Handle,
) -> Result<DispatcherHandle, Error> {
    store.start_sync_dispatcher(Bridge { publisher, runtime }, options)
}

/// An engine that runs an outbox dispatcher (both do).
pub trait DispatchingBackend: Backend {
    /// The engine's `start_dispatcher`.
    fn start_sync_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error>;
}

impl DispatchingBackend for Store {
    fn start_sync_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        self.start_dispatcher(publisher, options)
    }
}

#[cfg(feature = "postgres")]
impl DispatchingBackend for crate::postgres::PgStore {
    fn start_sync_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        self.start_dispatcher(publisher, options)
    }
}
