//! The tower [`Service`] and the flow of one covered request: admit (key, tenant, operation,
//! body: [`super::admit`]) → the read path of the store ([`Store::begin`](crate::Store::begin):
//! replay, tombstone, in flight, or a claim) → lease → the handler, in its own task, with
//! heartbeats → record its answer.

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tower::Service;

use super::admit::{default_operation, key_of, read_body, tenant_of};
use super::answers::{
    error_response, handler_failed, in_flight, invalid_key, invalid_operation, misconfigured,
    overloaded, plain_response, problem_response, retry_later,
};
use super::envelope::fit_response;
use super::fingerprint::{body_part, fingerprint_tagged};
use super::handle::IdempotencyHandle;
use super::key::parse_key;
use super::layer::{Config, Disposition, MissingKey, TenantSource, disposition};
use super::lease::{Slot, blocking, finish_lease, spawn_heartbeat, store_call_failed, take_lease};
use super::metrics::{bump, handler_failure, not_recorded, released};
use super::problem;
use super::replay::{expired, replay};
use crate::backend::{Backend, BackendLease};
use crate::{BeginAnswer, Error, Request, Scope, Store};

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S, B: Backend = Store> {
    pub(super) inner: S,
    pub(super) config: Arc<Config<B>>,
}

impl<S: std::fmt::Debug, B: Backend> std::fmt::Debug for IdempotencyService<S, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The boxed future of [`IdempotencyService`].
pub type ResponseFuture<E> =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send + 'static>>;

impl<S, ST, B, RB> Service<http::Request<B>> for IdempotencyService<S, ST>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ST: Backend,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::error::BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(handle(config, inner, req))
    }
}

async fn call_inner<S, RB>(mut inner: S, req: http::Request<Body>) -> Result<Answer, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    let resp = inner.call(req).await?;
    Ok(Answer(resp.map(Body::new)))
}

/// What the inner service answered, with its body boxed.
struct Answer(http::Response<Body>);

async fn handle<S, ST, B, RB>(
    config: Arc<Config<ST>>,
    inner: S,
    req: http::Request<B>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ST: Backend,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::error::BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    let (parts, body) = req.into_parts();
    if !config.methods.contains(&parts.method) {
        let req = http::Request::from_parts(parts, Body::new(body));
        return Ok(call_inner(inner, req).await?.0);
    }
    // A configuration the layer cannot use answers every covered request, key or not.
    if let TenantSource::BadHeaderName(name) = &config.tenant {
        return Ok(misconfigured(name));
    }
    // Key, tenant and operation are checked before the body is read: a request refused for
    // its names never costs a body buffer. (A key taken from the request itself,
    // `key_from_request`, is known only once the body is read.)
    let header_key = match key_of(&config, &parts) {
        Ok(Some(key)) => Some(key),
        Ok(None) if config.key_from.is_some() => None,
        Ok(None) => {
            return match config.missing_key {
                MissingKey::PassThrough => {
                    let req = http::Request::from_parts(parts, Body::new(body));
                    Ok(call_inner(inner, req).await?.0)
                }
                MissingKey::Reject => Ok(missing_key(&config, &parts)),
            };
        }
        Err(e) => return Ok(invalid_key(&e.detail(&config.key_header))),
    };
    let tenant = match tenant_of(&config, &parts) {
        Ok(t) => t,
        Err(e) => return Ok(e.response()),
    };
    let (operation, from_path) = match config.operation.as_ref().and_then(|f| f(&parts)) {
        Some(op) => (op, false),
        None => default_operation(&parts),
    };
    let max = config.store.limits().max_operation_len;
    if operation.is_empty() || operation.len() > max {
        return Ok(invalid_operation(
            from_path,
            &format!(
                "the operation this request maps to is {} bytes; the store takes 1 to {max} \
                 (Limits::max_operation_len): shorten the route template or the \
                 `.operation(...)` name, add the layer with `route_layer`, or raise the limit",
                operation.len()
            ),
        ));
    }
    let body = match read_body(&parts, body, config.body_limit).await {
        Ok(b) => b,
        Err(resp) => return Ok(resp),
    };
    let key = match (header_key, &config.key_from) {
        (Some(key), _) => key,
        (None, Some(extract)) => match extract(&parts, &body) {
            Some(k) => match parse_key(k.as_bytes(), config.store.limits().max_key_len) {
                Ok(k) => k,
                Err(e) => return Ok(invalid_key(&e.detail(&config.key_header))),
            },
            None => match config.missing_key {
                MissingKey::PassThrough => {
                    let req = http::Request::from_parts(parts, Body::from(body));
                    return Ok(call_inner(inner, req).await?.0);
                }
                MissingKey::Reject => return Ok(missing_key(&config, &parts)),
            },
        },
        // `header_key` is `None` only when `key_from` is set (above).
        (None, None) => return Ok(missing_key(&config, &parts)),
    };
    let (tag, body_part) = body_part(&config.body_fingerprint, &parts, &body);
    let fingerprint = fingerprint_tagged(
        tag,
        &parts,
        &operation,
        &config.fingerprint_headers,
        &body_part,
    );
    let request = Request::with_fingerprint(Scope::new(tenant, operation), key, fingerprint);

    // Admission through the async face: a free slot or an immediate 503, never a queue. The
    // slot is held for the claim only, and given back on the blocking pool when it ends, even if
    // this future is dropped.
    let lease = match config.calls.begin_held(request).await {
        Ok(BeginAnswer::Acquired(lease)) => lease,
        Ok(BeginAnswer::Replayed(stored)) => {
            return Ok(replayed_answer(&config, &parts, replay(&stored)));
        }
        Ok(BeginAnswer::Expired(tombstone)) => {
            return Ok(replayed_answer(&config, &parts, expired(&tombstone)));
        }
        Ok(BeginAnswer::InFlight { retry_after }) => return Ok(in_flight(retry_after)),
        Err(Error::Busy { waited, .. }) if waited.is_zero() => {
            bump(&config.counters.overloaded);
            return Ok(overloaded(config.calls.max_in_flight()));
        }
        Err(Error::Internal { .. }) => return Ok(store_call_failed()),
        Err(e) => return Ok(error_response(&e)),
    };
    run(config, inner, parts, body, lease).await
}

/// The shortest pause between two heartbeats of a running handler's lease.
const MIN_BEAT: Duration = Duration::from_millis(10);

/// Renewals of a claim before its handler starts; a lease that lapses again after each of them
/// is shorter than a hop to the blocking pool, and the request is answered 503 instead of
/// renewing forever.
const MAX_RENEWALS: u32 = 4;

/// Runs the handler under `lease` and records its answer.
async fn run<S, ST, RB>(
    config: Arc<Config<ST>>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    mut lease: ST::Lease,
) -> Result<http::Response<Body>, S::Error>
where
    ST: Backend,
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::error::BoxError>,
{
    // A claim whose request waited to be polled again (a busy runtime, a clock step) may hold
    // a lease that has lapsed, so another attempt may have taken the key over, or one that
    // lapses before the first heartbeat can land (a third of the way, at least `MIN_BEAT`):
    // it is renewed, and checked again right before the handler starts (the renewal is an
    // await: the request may wait again). Nothing has run yet: a lease lost meanwhile is
    // answered as in flight, and on a failure the lease is given back, on the blocking pool.
    let mut margin = MIN_BEAT * 3;
    let mut renewals = 0;
    loop {
        // A lease with no time left has lapsed, whatever the margin.
        let left = lease.deadline().saturating_since(config.store.now());
        if !left.is_zero() && left >= margin {
            break;
        }
        if renewals == MAX_RENEWALS {
            // Nothing ran: the lease is given back, on the blocking pool.
            let _ = blocking(move || lease.release()).await;
            return Ok(retry_later(
                "the lease lapsed before the handler could start, after every renewal; \
                 nothing ran: retry with the same key (is the store's lease_duration shorter \
                 than this service's scheduling delays?)",
            ));
        }
        renewals += 1;
        let store = config.store.clone();
        let renewed = blocking(move || {
            let deadline = lease.heartbeat()?;
            Ok::<_, Error>((lease, deadline.saturating_since(store.now())))
        })
        .await;
        (lease, margin) = match renewed {
            // A lease shorter than the margin never has more left than a renewal grants.
            Ok(Ok((lease, granted))) => (lease, margin.min(granted)),
            Ok(Err(Error::LeaseLost { .. })) => return Ok(in_flight(Duration::from_secs(1))),
            Ok(Err(e)) => return Ok(error_response(&e)),
            Err(resp) => return Ok(resp),
        };
    }
    // From here on the handler may cause an effect: the key is never released behind its back.
    // A lease that is dropped unfinished (a cancelled task, a failed recording) lapses at its
    // deadline; only the user's `record_status` policy releases it, explicitly.
    lease.lapse_on_drop(true);
    let every = (lease.deadline().saturating_since(config.store.now()) / 3).max(MIN_BEAT);
    let request = Arc::new(lease.request().clone());
    let downstream = lease.downstream_key();
    let slot = Arc::new(Slot(Mutex::new(Some(lease))));
    let heartbeat = spawn_heartbeat(&slot, every, Arc::clone(&config.counters));
    parts.extensions.insert(IdempotencyHandle {
        slot: Arc::clone(&slot),
        request,
        downstream,
        config: Arc::clone(&config),
    });
    let req = http::Request::from_parts(parts, Body::from(body));
    // The handler runs in its own task: once started it finishes, and its answer is recorded,
    // even if this future is dropped (the client went away). A panic is caught there, so the
    // slot is still at hand to record the failure.
    let task = tokio::spawn(async move {
        match CatchUnwind(Box::pin(call_inner(inner, req))).await {
            Ok(Ok(answer)) => Ok(record(&config, &slot, answer.0).await),
            Ok(Err(e)) => {
                record_failure(&config, &slot).await;
                Err(e)
            }
            Err(_panic) => Ok(record_failure(&config, &slot).await),
        }
    });
    let done = task.await;
    heartbeat.abort();
    match done {
        Ok(result) => result,
        // The task was cancelled (the runtime is shutting down), or the layer's own recording
        // code panicked: a lease still unfinished went with the task, and lapses.
        Err(_) => Ok(problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::HANDLER_FAILED,
            "Handler cancelled",
            "the handler was cancelled before its answer was recorded; the key stays claimed \
             until its lease lapses",
        )),
    }
}

/// Finishes the lease with the handler's answer (or passes through an answer the handler
/// recorded itself through [`IdempotencyHandle::complete_with`]).
async fn record<B: Backend>(
    config: &Config<B>,
    slot: &Arc<Slot<B::Lease>>,
    resp: http::Response<Body>,
) -> http::Response<Body> {
    let status = resp.status();
    let Disposition::Record { failure } = disposition(config, status) else {
        // The user's policy: this status means no effect happened, so the key is given up.
        if let Some(lease) = take_lease(slot).await
            && let Ok(result) = blocking(move || lease.release()).await
        {
            released(&result);
        }
        return resp;
    };
    // The body is collected while the lease is still in its slot (heartbeated).
    let (parts, body) = resp.into_parts();
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => return record_failure(config, slot).await,
    };
    if let Some(lease) = take_lease(slot).await {
        finish(config, lease, failure, status, &parts.headers, &bytes).await;
    }
    // If recording failed, the handler's answer still goes out: the effect happened.
    http::Response::from_parts(parts, Body::from(bytes))
}

/// The handler failed after it started: records a terminal `500` (its effect is unknown, so
/// it must not run again) and returns that answer.
async fn record_failure<B: Backend>(
    config: &Config<B>,
    slot: &Arc<Slot<B::Lease>>,
) -> http::Response<Body> {
    let (status, headers, body) = handler_failed();
    // No lease in the slot: the handler recorded its own answer before failing.
    if let Some(lease) = take_lease(slot).await
        && finish(config, lease, true, status, &headers, &body).await
    {
        handler_failure(&config.counters);
    }
    plain_response(status, headers, body)
}

/// Records an answer with the lease (as a terminal failure if `fail_stop_cause`), fitted into the
/// store's response cap; true if it was recorded. If recording fails the lease is dropped
/// unfinished and lapses (it was marked so before the handler ran): never released.
async fn finish<B: Backend>(
    config: &Config<B>,
    lease: B::Lease,
    failure: bool,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> bool {
    let max = config.store.max_response_bytes();
    let (stored, body_kept) = fit_response(status, headers, &config.replay_headers, body, max);
    let done = blocking(move || finish_lease(lease, failure, stored)).await;
    let recorded = matches!(done, Ok(Ok(_)));
    if !recorded {
        not_recorded(
            &config.counters,
            done.as_ref().ok().and_then(|r| r.as_ref().err()),
        );
    } else if !body_kept {
        bump(&config.counters.bodies_not_kept);
    }
    recorded
}

/// A future that turns a panic while polling `F` into `Err` (the payload), so the layer can
/// record the failure instead of losing the lease with the unwinding task.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn std::any::Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let fut = self.get_mut().0.as_mut();
        // AssertUnwindSafe: after a panic the inner future is never polled again (it is
        // dropped with this one), so no broken state of it is observed.
        match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}

/// The `400` of a covered request without a key.
fn missing_key<B: Backend>(config: &Config<B>, parts: &Parts) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::MISSING_KEY,
        "Idempotency-Key required",
        &format!(
            "{} {} needs an {} header; send a new unique key per intent and the same key on \
             every retry of it",
            parts.method,
            parts.uri.path(),
            config.key_header
        ),
    )
}

/// A replayed (or expired) answer, after the service's `on_replay` hook saw it.
fn replayed_answer<B: Backend>(
    config: &Config<B>,
    parts: &Parts,
    mut answer: http::Response<Body>,
) -> http::Response<Body> {
    if let Some(hook) = &config.on_replay {
        hook(parts, &mut answer);
    }
    answer
}
