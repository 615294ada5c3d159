//! The engines as one interface, for the faces that run on either (the HTTP layer, the async
//! face): [`Backend`] is a store — flow A, a flow-B claim, the inbox, its limits and clock — and
//! [`BackendLease`] its fenced lease. Implemented by the file store ([`Store`] and [`Lease`])
//! and, with the `postgres` feature, by the PostgreSQL store (`PgStore` and `PgLease`); sealed,
//! so the faces' promises rest only on engines that keep the contract. The closures get the
//! engine's own transaction handle ([`BackendLease::Tx`]: `&Tx` on the file store, `&mut PgTx`
//! on PostgreSQL).

use crate::inbox::{ProcessAnswer, ReceiveAnswer};
use crate::model::keys::DownstreamKey;
use crate::model::scope::Limits;
use crate::{
    Abort, BeginAnswer, Claim, Error, ExecuteAnswer, Lease, Request, Response, Store, Timestamp, Tx,
};

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::Store {}
    impl Sealed for crate::Lease {}
    #[cfg(feature = "postgres")]
    impl Sealed for crate::postgres::PgStore {}
    #[cfg(feature = "postgres")]
    impl Sealed for crate::postgres::PgLease {}
}

/// A store the faces run on: [`Store`] (one file) or `idem::postgres::PgStore` (a fleet on one
/// PostgreSQL database). The HTTP layer and the async face behave the same on both.
pub trait Backend: sealed::Sealed + Clone + Send + Sync + 'static {
    /// The store's fenced lease.
    type Lease: BackendLease;

    /// Flow A (`execute` of the engine): `f` runs at most once per intent, in the transaction
    /// that records its result.
    fn execute<F>(&self, request: Request, f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(TxOf<'t, Self>) -> Result<Response, Abort>;

    /// Flow A for a `Send + 'static` closure, which the engine may run on another of its
    /// threads (the file store's `execute_on_writer`); by default the same as `execute`.
    fn execute_on_writer<F>(&self, request: Request, f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(TxOf<'t, Self>) -> Result<Response, Abort> + Send + 'static,
    {
        self.execute(request, f)
    }

    /// Claims the key of `request` with a lease, or answers without one (flow B's `begin`).
    fn begin(&self, request: Request) -> Result<BeginAnswer<Self::Lease>, Error>;

    /// Flow B's claim for a [`Claim`] whose retries recognise the lease it already took (the
    /// engine's `begin_claim`).
    fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<Self::Lease>, Error>;

    /// The inbox (`process` of the engine): `f` runs at most once per message.
    fn process<T, F>(
        &self,
        subscriber: &str,
        message_id: &[u8],
        f: F,
    ) -> Result<ProcessAnswer<T>, Error>
    where
        F: for<'t> FnMut(TxOf<'t, Self>) -> Result<T, Abort>;

    /// Webhook receipts (`receive` of the engine): `f` runs at most once per delivery.
    fn receive<T, F>(
        &self,
        source: &str,
        delivery_id: &[u8],
        f: F,
    ) -> Result<ReceiveAnswer<T>, Error>
    where
        F: for<'t> FnMut(TxOf<'t, Self>) -> Result<T, Abort>;

    /// The store's current time (the database server's, for PostgreSQL).
    fn now(&self) -> Timestamp;

    /// The name-length limits every request is checked against.
    fn limits(&self) -> Limits;

    /// The largest response body the store records.
    fn max_response_bytes(&self) -> usize;

    /// How many requests may wait for the next commit.
    fn max_queue(&self) -> usize;
}

/// The transaction handle a closure of engine `B` gets (`&Tx` on the file store, `&mut PgTx` on
/// PostgreSQL).
pub type TxOf<'t, B> = <<B as Backend>::Lease as BackendLease>::Tx<'t>;

/// The lease a [`Backend`] hands out, as the faces use it.
pub trait BackendLease: sealed::Sealed + Send + 'static {
    /// What a closure of this engine gets to write through: `&Tx` on the file store, `&mut
    /// PgTx` on PostgreSQL.
    type Tx<'t>;

    /// The request the lease is for.
    fn request(&self) -> &Request;

    /// When the lease lapses unless heartbeated.
    fn deadline(&self) -> Timestamp;

    /// The key to send downstream (the same on every attempt).
    fn downstream_key(&self) -> DownstreamKey;

    /// Extends the lease.
    fn heartbeat(&mut self) -> Result<Timestamp, Error>;

    /// Records success.
    fn complete(self, response: Response) -> Result<Response, Error>;

    /// Records a terminal failure.
    fn fail(self, response: Response) -> Result<Response, Error>;

    /// Gives the key up now.
    fn release(self) -> Result<(), Error>;

    /// Dropped unfinished, lapse instead of releasing (the layer marks every lease so once a
    /// handler may have caused an effect).
    #[doc(hidden)]
    fn lapse_on_drop(&mut self, lapse: bool);

    /// Records the closure's answer with its writes, keeping the lease on a failure other than
    /// `LeaseLost` (so the layer can record the failure itself).
    #[doc(hidden)]
    fn complete_with_held<F>(&mut self, f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(Self::Tx<'t>) -> Result<Response, Abort>;
}

impl Backend for Store {
    type Lease = Lease;

    fn execute<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(&'t Tx<'t>) -> Result<Response, Abort>,
    {
        Store::execute(self, request, |tx| f(tx))
    }

    fn execute_on_writer<F>(&self, request: Request, mut f: F) -> Result<ExecuteAnswer, Error>
    where
        F: for<'t> FnMut(&'t Tx<'t>) -> Result<Response, Abort> + Send + 'static,
    {
        Store::execute_on_writer(self, request, move |tx| f(tx))
    }

    fn process<T, F>(
        &self,
        subscriber: &str,
        message_id: &[u8],
        mut f: F,
    ) -> Result<ProcessAnswer<T>, Error>
    where
        F: for<'t> FnMut(&'t Tx<'t>) -> Result<T, Abort>,
    {
        Store::process(self, subscriber, message_id, |tx| f(tx))
    }

    fn receive<T, F>(
        &self,
        source: &str,
        delivery_id: &[u8],
        mut f: F,
    ) -> Result<ReceiveAnswer<T>, Error>
    where
        F: for<'t> FnMut(&'t Tx<'t>) -> Result<T, Abort>,
    {
        Store::receive(self, source, delivery_id, |tx| f(tx))
    }

    fn begin(&self, request: Request) -> Result<BeginAnswer<Lease>, Error> {
        Store::begin(self, request)
    }

    fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<Lease>, Error> {
        Store::begin_claim(self, claim)
    }

    fn now(&self) -> Timestamp {
        Store::now(self)
    }

    fn limits(&self) -> Limits {
        Store::limits(self)
    }

    fn max_response_bytes(&self) -> usize {
        Store::max_response_bytes(self)
    }

    fn max_queue(&self) -> usize {
        Store::max_queue(self)
    }
}

impl BackendLease for Lease {
    type Tx<'t> = &'t Tx<'t>;

    fn request(&self) -> &Request {
        Lease::request(self)
    }

    fn deadline(&self) -> Timestamp {
        Lease::deadline(self)
    }

    fn downstream_key(&self) -> DownstreamKey {
        Lease::downstream_key(self)
    }

    fn heartbeat(&mut self) -> Result<Timestamp, Error> {
        Lease::heartbeat(self)
    }

    fn complete(self, response: Response) -> Result<Response, Error> {
        Lease::complete(self, response)
    }

    fn fail(self, response: Response) -> Result<Response, Error> {
        Lease::fail(self, response)
    }

    fn release(self) -> Result<(), Error> {
        Lease::release(self)
    }

    fn lapse_on_drop(&mut self, lapse: bool) {
        Lease::lapse_on_drop(self, lapse);
    }

    fn complete_with_held<F>(&mut self, mut f: F) -> Result<Response, Error>
    where
        F: for<'t> FnMut(&'t Tx<'t>) -> Result<Response, Abort>,
    {
        Lease::complete_with_held(self, |tx| f(tx))
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::postgres::{PgLease, PgStore, PgTx};

    impl Backend for PgStore {
        type Lease = PgLease;

        fn execute<F>(&self, request: Request, f: F) -> Result<ExecuteAnswer, Error>
        where
            F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
        {
            PgStore::execute(self, request, f)
        }

        fn process<T, F>(
            &self,
            subscriber: &str,
            message_id: &[u8],
            f: F,
        ) -> Result<ProcessAnswer<T>, Error>
        where
            F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
        {
            PgStore::process(self, subscriber, message_id, f)
        }

        fn receive<T, F>(
            &self,
            source: &str,
            delivery_id: &[u8],
            f: F,
        ) -> Result<ReceiveAnswer<T>, Error>
        where
            F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
        {
            PgStore::receive(self, source, delivery_id, f)
        }

        fn begin(&self, request: Request) -> Result<BeginAnswer<PgLease>, Error> {
            PgStore::begin(self, request)
        }

        fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<PgLease>, Error> {
            PgStore::begin_claim(self, claim)
        }

        fn now(&self) -> Timestamp {
            PgStore::now(self)
        }

        fn limits(&self) -> Limits {
            PgStore::limits(self)
        }

        fn max_response_bytes(&self) -> usize {
            PgStore::max_response_bytes(self)
        }

        fn max_queue(&self) -> usize {
            PgStore::max_queue(self)
        }
    }

    impl BackendLease for PgLease {
        type Tx<'t> = &'t mut PgTx<'t>;

        fn request(&self) -> &Request {
            PgLease::request(self)
        }

        fn deadline(&self) -> Timestamp {
            PgLease::deadline(self)
        }

        fn downstream_key(&self) -> DownstreamKey {
            PgLease::downstream_key(self)
        }

        fn heartbeat(&mut self) -> Result<Timestamp, Error> {
            PgLease::heartbeat(self)
        }

        fn complete(self, response: Response) -> Result<Response, Error> {
            PgLease::complete(self, response)
        }

        fn fail(self, response: Response) -> Result<Response, Error> {
            PgLease::fail(self, response)
        }

        fn release(self) -> Result<(), Error> {
            PgLease::release(self)
        }

        fn lapse_on_drop(&mut self, lapse: bool) {
            PgLease::lapse_on_drop(self, lapse);
        }

        fn complete_with_held<F>(&mut self, f: F) -> Result<Response, Error>
        where
            F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
        {
            PgLease::complete_with_held(self, f)
        }
    }
}
