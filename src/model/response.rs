//! What is stored and replayed: a minimal response; and how a caller's closure ends without one
//! (`Abort`).

use std::time::Duration;

use crate::error::{BoxError, Error};

/// A pointer to the resource an operation created or touched (e.g. `("order", "ord_123")`), so
/// a late retry can be answered with "already done: here is where it is".
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Resource {
    /// The resource type, e.g. `"order"`.
    pub kind: String,
    /// The resource id.
    pub id: String,
}

/// The minimal answer stored for a finished intent and returned byte for byte on every replay:
/// a status code, a canonical body and an optional resource pointer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Response {
    status: u16,
    body: Vec<u8>,
    resource: Option<Resource>,
    failed: bool,
}

impl Response {
    /// A response with a status code (HTTP-style, or any code meaningful to the caller) and a
    /// canonical body.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Response {
            status,
            body: body.into(),
            resource: None,
            failed: false,
        }
    }

    /// Adds a pointer to the resource this operation created.
    pub fn with_resource(mut self, kind: impl Into<String>, id: impl Into<String>) -> Self {
        self.resource = Some(Resource {
            kind: kind.into(),
            id: id.into(),
        });
        self
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The body bytes.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The resource pointer, if any.
    pub fn resource(&self) -> Option<&Resource> {
        self.resource.as_ref()
    }

    /// True when this response records a terminal failure
    /// ([`Abort::Terminal`](crate::model::response::Abort::Terminal) or `Lease::fail`): the intent is
    /// finished and will not run again.
    pub fn is_failure(&self) -> bool {
        self.failed
    }

    /// Size counted against the store's response cap: body plus resource fields.
    pub(crate) fn stored_len(&self) -> usize {
        self.body.len()
            + self
                .resource
                .as_ref()
                .map_or(0, |r| r.kind.len() + r.id.len())
    }

    /// This response cut down to fit `max` stored bytes: whole if it fits, else without its
    /// body, else without its resource pointer too (the status and the failure flag always fit).
    /// For a store that must keep *something* of an answer whose effect already happened.
    pub(crate) fn fitted(&self, max: usize) -> Response {
        if self.stored_len() <= max {
            return self.clone();
        }
        let resource = self
            .resource
            .clone()
            .filter(|r| r.kind.len() + r.id.len() <= max);
        Response::from_parts(self.status, Vec::new(), resource, self.failed)
    }

    pub(crate) fn from_parts(
        status: u16,
        body: Vec<u8>,
        resource: Option<Resource>,
        failed: bool,
    ) -> Self {
        Response {
            status,
            body,
            resource,
            failed,
        }
    }

    pub(crate) fn mark_failed(mut self) -> Self {
        self.failed = true;
        self
    }

    /// The failure flag always follows the stored state: a response recorded as Completed is
    /// never reported as a failure, whatever the caller passed in.
    pub(crate) fn mark_succeeded(mut self) -> Self {
        self.failed = false;
        self
    }
}

/// What is kept of a finished intent after its response window: the status, the resource
/// pointer and whether it was a terminal failure — not the body. A late retry that finds one
/// gets [`ExecuteAnswer::Expired`] / `BeginAnswer::Expired`: the intent already happened and does not run
/// again.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tombstone {
    status: u16,
    resource: Option<Resource>,
    failed: bool,
}

impl Tombstone {
    /// A tombstone with a status, an optional resource pointer and the failure flag.
    pub fn new(status: u16, resource: Option<Resource>, failed: bool) -> Self {
        Tombstone {
            status,
            resource,
            failed,
        }
    }

    /// The status code of the original response.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The resource pointer of the original response, if it had one.
    pub fn resource(&self) -> Option<&Resource> {
        self.resource.as_ref()
    }

    /// True when the intent ended in a terminal failure
    /// ([`Abort::Terminal`](crate::model::response::Abort::Terminal), `Lease::fail`).
    pub fn is_failure(&self) -> bool {
        self.failed
    }
}

/// The answer to `Store::execute`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ExecuteAnswer {
    /// The closure ran now and its result was committed with its writes. A terminal failure
    /// ([`Abort::Terminal`](crate::model::response::Abort::Terminal)) also ends here, with
    /// [`Response::is_failure`] true.
    Ran(Response),
    /// The intent had already finished: the stored response, byte for byte. The closure did
    /// not run and nothing was written.
    Replayed(Response),
    /// Another attempt holds a live lease on this key (flow B). Retry after the hint, or use
    /// `Store::begin_wait` to wait for its result.
    InFlight {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// The intent already finished, but so long ago that its response window is over: only
    /// its [`Tombstone`] (status, resource pointer, failure flag) is left. The closure did not
    /// run and nothing was written. Answer "already done" (e.g. the status with the resource
    /// pointer and no body, or HTTP 303 to the resource); never run the operation again.
    Expired(Tombstone),
}

impl ExecuteAnswer {
    /// The response, unless the key is in flight or only a tombstone is left.
    pub fn response(&self) -> Option<&Response> {
        match self {
            ExecuteAnswer::Ran(r) | ExecuteAnswer::Replayed(r) => Some(r),
            ExecuteAnswer::InFlight { .. } | ExecuteAnswer::Expired(_) => None,
        }
    }

    /// True for [`ExecuteAnswer::Replayed`].
    pub fn is_replay(&self) -> bool {
        matches!(self, ExecuteAnswer::Replayed(_))
    }

    /// The tombstone, for [`ExecuteAnswer::Expired`].
    pub fn tombstone(&self) -> Option<&Tombstone> {
        match self {
            ExecuteAnswer::Expired(t) => Some(t),
            _ => None,
        }
    }
}

/// The answer to a flow-B claim (`Store::begin`, and the same call of every engine), generic
/// over the engine's lease type `L` (at the crate root, `BeginAnswer` means `BeginAnswer<Lease>`).
#[derive(Debug)]
#[must_use]
pub enum BeginAnswer<L> {
    /// This attempt holds the lease: do the external work, then complete or fail the lease.
    /// Its `takeover_of` tells whether an earlier attempt held it first.
    Acquired(L),
    /// The intent had already finished: its stored response.
    Replayed(Response),
    /// Another attempt holds a live lease.
    InFlight {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// The intent already finished and its response window is over: only its [`Tombstone`]
    /// is left. Do not make the external call again (see [`ExecuteAnswer::Expired`]).
    Expired(Tombstone),
}

/// How a caller's closure ends without success. Returned as the `Err` of a closure passed to
/// `Store::execute` or `Lease::complete_with`.
///
/// | variant | stored | caller's writes | a retry with the same key |
/// |---|---|---|---|
/// | `Ok(response)` (not an `Abort`) | Completed + response | committed | replays the response |
/// | [`Abort::Terminal`] | Failed + response | committed | replays the failure |
/// | [`Abort::Retryable`] | nothing | rolled back | runs again |
/// | [`Abort::Store`] | nothing | rolled back | runs again (after a reopen if fail-stopped) |
#[derive(Debug)]
#[non_exhaustive]
pub enum Abort {
    /// A transient failure (a timeout, a lock, an unavailable dependency): nothing is recorded
    /// and the key stays free so the retry runs again.
    Retryable(BoxError),
    /// A final business failure (e.g. "card declined"): the response is recorded as Failed and
    /// replayed to every retry, like a stored error in Stripe's API. The caller's writes made in
    /// the same closure are committed with it.
    Terminal(Response),
    /// An error from the store or the storage engine (e.g. from `?` on a table operation).
    Store(Error),
}

impl Abort {
    /// A retryable abort from any error.
    pub fn retryable(error: impl Into<BoxError>) -> Self {
        Abort::Retryable(error.into())
    }

    /// A terminal failure whose response is stored and replayed.
    pub fn terminal(response: Response) -> Self {
        Abort::Terminal(response)
    }
}

impl From<Error> for Abort {
    fn from(e: Error) -> Self {
        Abort::Store(e)
    }
}
