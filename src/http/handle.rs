//! The handle a handler gets in its request extensions: [`IdempotencyHandle`], whose
//! [`IdempotencyHandle::complete_with`] records the answer in the same transaction as the handler's
//! own writes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, LOCATION};
use http::{HeaderMap, StatusCode};

use super::answers::{error_response, handler_failed, plain_response, problem_response};
use super::envelope::fit_response;
use super::layer::{Config, Disposition, disposition};
use super::lease::{Slot, blocking, finish_lease, take_lease};
use super::metrics::{bump, handler_failure, not_recorded, released};
use super::problem;
use crate::backend::{Backend, BackendLease};
use crate::model::keys::DownstreamKey;
use crate::{Abort, Error, Request, Response, Store};

/// The handle the layer puts in the extensions of every request it claimed a key for (axum:
/// `Extension<IdempotencyHandle>` on the file store, `Extension<IdempotencyHandle<PgStore>>` on
/// PostgreSQL). A handler that wants its own writes and the recorded answer in one transaction
/// calls [`IdempotencyHandle::complete_with`]; one that does not need that ignores it, and the layer
/// records whatever it returns.
pub struct IdempotencyHandle<B: Backend = Store> {
    pub(super) slot: Arc<Slot<B::Lease>>,
    pub(super) request: Arc<Request>,
    pub(super) downstream: DownstreamKey,
    pub(super) config: Arc<Config<B>>,
}

impl<B: Backend> Clone for IdempotencyHandle<B> {
    fn clone(&self) -> Self {
        IdempotencyHandle {
            slot: Arc::clone(&self.slot),
            request: Arc::clone(&self.request),
            downstream: self.downstream,
            config: Arc::clone(&self.config),
        }
    }
}

impl<B: Backend> std::fmt::Debug for IdempotencyHandle<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

/// The answer a handler records through [`IdempotencyHandle::complete_with`].
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The status.
    pub status: StatusCode,
    /// Headers; those in the layer's replay set are stored and replayed.
    pub headers: HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Recorded {
    /// A JSON answer (`Content-Type: application/json`).
    pub fn json(status: StatusCode, value: &serde_json::Value) -> Self {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        Recorded {
            status,
            headers,
            body: Bytes::from(value.to_string()),
        }
    }
}

impl<B: Backend> IdempotencyHandle<B> {
    /// The downstream key of this intent ([`Lease::downstream_key`](crate::Lease::downstream_key)): the same on every
    /// attempt, for an external call or a resource id.
    pub fn downstream_key(&self) -> DownstreamKey {
        self.downstream
    }

    /// The claimed request: scope (tenant, operation), key and fingerprint.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Runs `f` in the write transaction that records its answer (flow A inside the layer's
    /// lease, [`Lease::complete_with`](crate::Lease::complete_with)), on the blocking pool. `f`'s writes through the
    /// transaction handle (`&Tx` on the file store, `&mut PgTx` on PostgreSQL) and the answer
    /// commit together or not at all; `f` may run more than once (group commit) and only the
    /// committed run counts.
    ///
    /// The answer is judged like the layer's own: a status the layer records as a failure
    /// (4xx, 5xx) is stored as a terminal failure, with `f`'s writes (answer 503 to roll them
    /// back and give the key up); an answer over the store's `max_response_bytes` is stored
    /// without its body (replayed with [`IDEMPOTENT_BODY_OMITTED`](super::IDEMPOTENT_BODY_OMITTED)). `Err(Abort::Terminal(r))`
    /// from `f` is recorded as a terminal failure whatever its status, with `f`'s writes, and
    /// answered as `r`'s status (500 if it is no HTTP status), body, and resource pointer of
    /// kind `"location"` as `Location`. The first answer is never marked as a replay.
    ///
    /// A status the layer would not record (503 by default), [`Abort::Retryable`], or a
    /// transaction that fails to commit rolls `f`'s writes back and releases the key: nothing
    /// of `f` happened. (Effects the handler caused outside `f`, before calling this, are its
    /// own to make idempotent, with [`IdempotencyHandle::downstream_key`].) If `f` panics, its writes
    /// are rolled back too, but the handler may have caused effects before calling this, so the
    /// key is not released: like any handler that fails after it started, a terminal `500`
    /// ([`problem::HANDLER_FAILED`]) is recorded, counted in [`LayerMetrics::handler_failures`](super::LayerMetrics::handler_failures)
    /// and replayed to every retry.
    ///
    /// Returns the HTTP response to send: the answer, or a problem response when nothing could
    /// be recorded. Call it at most once per request; a second call answers `500`.
    pub async fn complete_with<F>(&self, mut f: F) -> http::Response<Body>
    where
        F: for<'t> FnMut(<B::Lease as BackendLease>::Tx<'t>) -> Result<Recorded, Abort>
            + Send
            + 'static,
    {
        let Some(mut lease) = take_lease(&self.slot).await else {
            return problem_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                problem::STORE_FAILED,
                "Idempotency handle already used",
                "complete_with was called twice for one request",
            );
        };
        // The lease still lapses if dropped unfinished (marked so before the handler ran):
        // every release below is explicit, and only where nothing of `f` happened.
        let config = Arc::clone(&self.config);
        let done = blocking(move || {
            let max = config.store.max_response_bytes();
            let mut answer = None;
            let mut body_kept = true;
            let mut panicked = false;
            let result = lease.complete_with_held(|tx| {
                // Only the last (committed) run's answer counts.
                answer = None;
                // A panic of `f` is caught inside the transaction, so it rolls back like a
                // retryable abort and the lease stays at hand to record the failure.
                // AssertUnwindSafe: after a panic `f` is not called again (this member leaves
                // its batch on the abort).
                let (r, disposition) = match catch_unwind(AssertUnwindSafe(|| f(tx))) {
                    Ok(Ok(r)) => {
                        let d = disposition(&config, r.status);
                        (r, d)
                    }
                    // The handler's own terminal failure: recorded as one, whatever its status.
                    Ok(Err(Abort::Terminal(resp))) => (
                        terminal_answer(&resp),
                        Disposition::Record { failure: true },
                    ),
                    Ok(Err(other)) => return Err(other),
                    Err(_panic) => {
                        panicked = true;
                        return Err(Abort::Retryable("the handler panicked".into()));
                    }
                };
                let (stored, kept) =
                    fit_response(r.status, &r.headers, &config.replay_headers, &r.body, max);
                body_kept = kept;
                let status = r.status;
                answer = Some((r, disposition));
                match disposition {
                    Disposition::Release => Err(Abort::Retryable(
                        format!("status {status} is not recorded").into(),
                    )),
                    Disposition::Record { failure: true } => Err(Abort::Terminal(stored)),
                    Disposition::Record { failure: false } => Ok(stored),
                }
            });
            match (result, answer) {
                (Ok(_), Some((r, _))) => Completed::Recorded(r, body_kept),
                (Err(Error::Aborted { .. }), _) if panicked => {
                    let (status, headers, body) = handler_failed();
                    let (stored, _) =
                        fit_response(status, &headers, &config.replay_headers, &body, max);
                    let recorded = finish_lease(lease, true, stored).is_ok();
                    Completed::Panicked { recorded }
                }
                // Not recorded because of its status: the handler's answer still goes out.
                (Err(Error::Aborted { .. }), Some((r, Disposition::Release))) => {
                    released(&lease.release());
                    Completed::Released(r)
                }
                // Lost: nothing of ours to release.
                (Err(e @ Error::LeaseLost { .. }), _) => Completed::Failed(e),
                // Rolled back: nothing of `f` happened.
                (Err(e), _) => {
                    released(&lease.release());
                    Completed::Failed(e)
                }
                // `Ok` comes only from a run that kept its answer.
                (Ok(_), None) => Completed::Failed(Error::Internal {
                    what: "complete_with recorded an answer it did not keep",
                }),
            }
        })
        .await;
        let counters = &self.config.counters;
        match done {
            Ok(Completed::Recorded(r, body_kept)) => {
                if !body_kept {
                    bump(&counters.bodies_not_kept);
                }
                plain_response(r.status, r.headers, r.body)
            }
            Ok(Completed::Released(r)) => plain_response(r.status, r.headers, r.body),
            Ok(Completed::Panicked { recorded }) => {
                if recorded {
                    handler_failure(counters);
                } else {
                    not_recorded(counters, None);
                }
                let (status, headers, body) = handler_failed();
                plain_response(status, headers, body)
            }
            Ok(Completed::Failed(e)) => error_response(&e),
            Err(resp) => resp,
        }
    }
}

/// How [`IdempotencyHandle::complete_with`] ended, decided on the blocking pool.
enum Completed {
    /// The answer was recorded (and whether its body was kept).
    Recorded(Recorded, bool),
    /// The answer's status is not recorded: its writes rolled back, the key released.
    Released(Recorded),
    /// `f` panicked: its writes rolled back, and a terminal `500` was recorded (or, if that
    /// failed, the lease lapses).
    Panicked {
        /// The `500` was recorded.
        recorded: bool,
    },
    /// Nothing was recorded.
    Failed(Error),
}

/// The HTTP answer of the [`Response`] a handler returned as `Abort::Terminal`: its status
/// (500 if it is no HTTP status), its body, and a resource pointer of kind `"location"` (the
/// layer's own) as `Location`.
fn terminal_answer(resp: &Response) -> Recorded {
    let status = StatusCode::from_u16(resp.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = HeaderMap::new();
    if let Some(r) = resp.resource().filter(|r| r.kind == "location")
        && let Ok(v) = HeaderValue::from_str(&r.id)
    {
        headers.insert(LOCATION, v);
    }
    Recorded {
        status,
        headers,
        body: Bytes::copy_from_slice(resp.body()),
    }
}
