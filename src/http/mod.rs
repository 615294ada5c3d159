//! The HTTP face (feature `http`): a tower [`Layer`] that makes any axum/hyper/tower service
//! honour the `Idempotency-Key` request header (IETF draft-ietf-httpapi-idempotency-key-header,
//! still a draft: the contract below is ours, documented in `docs/HTTP.md`).
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use idem::http::IdempotencyLayer;
//!
//! # fn app(store: idem::Store) -> Router {
//! let layer = IdempotencyLayer::tenant_header(store, "x-tenant-id");
//! Router::new()
//!     .route("/v1/orders", post(|| async { (axum::http::StatusCode::CREATED, "{}") }))
//!     // `route_layer`: the layer sees the matched route template (`/v1/orders/{id}`).
//!     .route_layer(layer)
//! # }
//! ```
//!
//! # What the layer guarantees, and what it does not
//!
//! For a covered request (an unsafe method — POST, PUT, PATCH, DELETE by default — carrying the
//! key) the layer claims the key with a fenced lease ([`Store::begin`], flow B) **before** the
//! handler runs, and finishes the lease with the handler's answer after. So:
//!
//! - **at most one concurrent execution per (tenant, operation, key)**: a second request while
//!   the first runs gets `409` + `Retry-After`; the handler is not called;
//! - **replay of the stored answer**: once recorded, every retry gets the stored status, body
//!   and the configured headers, plus `Idempotent-Replayed: true`, without calling the handler;
//! - **a key is bound to its request**: the same key with a different method, route, selected
//!   headers or body is `422`;
//! - **one key, one field line**: the key is exactly one `Idempotency-Key` field line holding a
//!   Structured Field string (`"abc"`) or a bare key (`abc`, visible ASCII without `"` `,` `;`
//!   `\` or whitespace); two lines, a list, parameters or a malformed value is `400` (see
//!   `docs/HTTP.md` for the grammar). Key, tenant and operation are checked against the store's
//!   [`crate::Limits`] before the body is read;
//! - **once the handler ran, the key never runs it again** for the record's lifetime: an answer
//!   over the store's `max_response_bytes` is recorded without its body and replayed with
//!   [`IDEMPOTENT_BODY_OMITTED`]; a handler that panics, whose response body fails, or whose
//!   inner service returns `Err` is recorded as a terminal `500` ([`problem::HANDLER_FAILED`]);
//!   if recording itself fails, the lease is left to lapse, never released. Every status is
//!   recorded except `503` (and what the user excludes with
//!   [`IdempotencyLayer::record_status`]): only such a status releases the key, and, for a
//!   handler that records through [`Idempotency::complete_with`], a transaction that rolled
//!   back (nothing of it happened; a panic in it is recorded as a terminal `500` instead);
//! - **bounded store admissions**: at most [`IdempotencyLayer::max_in_flight`] claims (default
//!   the store's `max_queue`, at most 256) run at once; over that, a covered request gets
//!   `503` + `Retry-After` at once ([`problem::RETRY`]). Store calls after the handler ran are
//!   never refused for lack of room.
//!
//! The handler's own writes are **not** in idem's transaction by default: if the process dies
//! after the handler wrote and before the answer was recorded, the lease lapses and a retry runs
//! the handler again. A handler that needs its effect and the record to commit together (one
//! effect per intent, across crashes) records its answer itself, in the same redb write
//! transaction as its writes, through the [`Idempotency`] handle the layer puts in the request
//! extensions ([`Idempotency::complete_with`]); the layer then passes that answer through.
//! `examples/edge_service.rs` does this for payments.
//!
//! No runtime thread is blocked on disk: every store call runs on
//! [`tokio::task::spawn_blocking`]. Once the handler started, it runs to the end in its own task
//! and its answer is recorded even if the client disconnects. While it runs, the lease is
//! heartbeated every third of the store's `lease_duration`, so a slow handler is not taken over
//! by a retry. A heartbeat that fails transiently (the store's queue full, a failed store call
//! on the blocking pool) is retried after a short pause; heartbeats stop only when the lease
//! is finished, when it was lost, or when the store fail-stopped or is damaged (then it takes
//! no write, so no answer could be recorded either). A process that died stops heartbeating,
//! and then the lease lapses. [`IdempotencyLayer::metrics`] counts what an operator should see
//! (bodies not kept, overload, handler failures, answers that could not be recorded, failed
//! heartbeats).

use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};
use http::request::Parts;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt, Limited};
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

use crate::error::Field;
use crate::{Abort, Begin, Error, Fingerprint, Lease, Request, Response, Scope, Store, Tx};

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The response header set on every replayed answer (Stripe's convention).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The response header (`true`) on a replay whose body was not kept: the handler's answer was
/// over the store's `max_response_bytes`, so only its status, the replayed headers that do not
/// describe the body, and `Location` were recorded. The handler ran once; it does not run again.
pub const IDEMPOTENT_BODY_OMITTED: &str = "idempotent-body-omitted";
/// The media type of every error the layer produces (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` URIs of the problems the layer answers with (RFC 9457 `type` member).
pub mod problem {
    /// 400: a covered request without the key (unless [`super::MissingKey::PassThrough`]).
    pub const MISSING_KEY: &str = "urn:idem:problem:missing-idempotency-key";
    /// 400: the key field is not exactly one well-formed key (two field lines, a list,
    /// parameters, a bad character or quote), or it is empty or over the store's key limit.
    pub const INVALID_KEY: &str = "urn:idem:problem:invalid-idempotency-key";
    /// 400: the tenant extractor found no tenant.
    pub const MISSING_TENANT: &str = "urn:idem:problem:missing-tenant";
    /// 400: the tenant is empty, over the store's tenant limit, or (from a tenant header) not
    /// exactly one field line of visible ASCII without commas.
    pub const INVALID_TENANT: &str = "urn:idem:problem:invalid-tenant";
    /// 500: the operation (`"{METHOD} {route template}"` or the `.operation(...)` override) is
    /// empty or over the store's operation limit: a configuration error of the service. (400
    /// when no route template is known and the request path stood in for it.)
    pub const INVALID_OPERATION: &str = "urn:idem:problem:invalid-operation";
    /// 400: the request body could not be read.
    pub const UNREADABLE_BODY: &str = "urn:idem:problem:unreadable-body";
    /// 413: the request body is over the layer's body limit.
    pub const BODY_TOO_LARGE: &str = "urn:idem:problem:body-too-large";
    /// 409 + `Retry-After`: another request with this key is being processed.
    pub const IN_FLIGHT: &str = "urn:idem:problem:request-in-flight";
    /// 422: the key was used before with a different request.
    pub const KEY_REUSED: &str = "urn:idem:problem:key-reused-with-different-request";
    /// 503 + `Retry-After`: the layer's in-flight limit is reached, the store is saturated, or
    /// the handler asked for a retry. Nothing ran or nothing was recorded.
    pub const RETRY: &str = "urn:idem:problem:retry-later";
    /// 500: the layer was built with a configuration it cannot use (a
    /// [`super::IdempotencyLayer::tenant_header`] name that is not a valid header name); every
    /// covered request gets this answer and nothing runs, until the service is fixed.
    pub const MISCONFIGURED: &str = "urn:idem:problem:layer-misconfigured";
    /// 500: the store failed; the outcome of this request may be unknown: retry with the key.
    pub const STORE_FAILED: &str = "urn:idem:problem:store-failed";
    /// 500: the handler failed after it started (it panicked, its response body failed, or
    /// the inner service returned an error). Recorded as a terminal failure and replayed: the
    /// key does not run the handler again.
    pub const HANDLER_FAILED: &str = "urn:idem:problem:handler-failed";
}

/// What to do with a covered request that carries no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Answer `400` with [`problem::MISSING_KEY`] (default).
    #[default]
    Reject,
    /// Call the handler without any idempotency handling.
    PassThrough,
}

type PartsFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;
type StatusFn = dyn Fn(StatusCode) -> bool + Send + Sync;

/// Where the tenant comes from.
#[derive(Clone)]
enum TenantSource {
    /// One field line of this header ([`IdempotencyLayer::tenant_header`]).
    Header(HeaderName),
    /// The caller's extractor ([`IdempotencyLayer::new`]).
    Extract(Arc<PartsFn>),
    /// [`IdempotencyLayer::tenant_header`] was given this, which is not a header name: every
    /// covered request is answered `500` ([`problem::MISCONFIGURED`]) rather than a panic.
    BadHeaderName(String),
}

#[derive(Clone)]
struct Config {
    store: Store,
    tenant: TenantSource,
    operation: Option<Arc<PartsFn>>,
    methods: Vec<Method>,
    key_header: HeaderName,
    fingerprint_headers: Vec<HeaderName>,
    replay_headers: Vec<HeaderName>,
    body_limit: usize,
    missing_key: MissingKey,
    record_status: Arc<StatusFn>,
    /// One permit per store admission (`begin`) running; shared by the layer's clones.
    admissions: Arc<Semaphore>,
    max_in_flight: usize,
    counters: Arc<Counters>,
}

/// The layer's counters (monotonic since it was built), shared by its clones.
#[derive(Debug, Default)]
struct Counters {
    bodies_not_kept: AtomicU64,
    overloaded: AtomicU64,
    handler_failures: AtomicU64,
    not_recorded: AtomicU64,
    heartbeat_failures: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What one [`IdempotencyLayer`] (with its clones and the services they built) has seen since
/// it was built: [`IdempotencyLayer::metrics`]. The counters that should stay at zero in a
/// healthy service are warnings worth an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LayerMetrics {
    /// Answers recorded without their body because they were over the store's
    /// `max_response_bytes`; their replays carry [`IDEMPOTENT_BODY_OMITTED`]. Raise the cap or
    /// answer with a pointer (`Location`) instead of a large body.
    pub bodies_not_kept: u64,
    /// Covered requests answered `503` + `Retry-After` because [`LayerMetrics::max_in_flight`]
    /// store admissions were already running. Nothing ran for them.
    pub overloaded: u64,
    /// Handlers that failed after they started (panicked, their response body failed, or the
    /// inner service returned an error) and were recorded as a terminal `500`.
    pub handler_failures: u64,
    /// Answers the layer could not record after the handler ran (a store failure, a lost
    /// lease). The key was not released: its lease lapses at its deadline, and only then may a
    /// retry run the handler again.
    pub not_recorded: u64,
    /// Heartbeats of a running handler's lease that failed. A transient failure (the store's
    /// queue full, a failed store call) is retried at once after a short pause, so the lease
    /// does not lapse under the handler; only a failure no retry mends ends the heartbeats (the
    /// lease was lost, the store fail-stopped), and the answer is then not recorded. A few
    /// under a load peak are harmless; a steady rise means the store is saturated.
    pub heartbeat_failures: u64,
    /// Store admissions running at the moment of the snapshot.
    pub in_flight: usize,
    /// The bound on them ([`IdempotencyLayer::max_in_flight`]).
    pub max_in_flight: usize,
}

/// The tower [`Layer`]. Build it with [`IdempotencyLayer::new`] (any tenant extractor) or
/// [`IdempotencyLayer::tenant_header`], adjust it with the builder methods, and add it with
/// axum's `Router::route_layer` (so the route template is known) or `ServiceBuilder`.
///
/// Defaults: methods POST, PUT, PATCH, DELETE; key header `Idempotency-Key`; operation
/// `"{METHOD} {route template}"` (the request path when no template is known); fingerprint of
/// method, operation, path and query, and body (no headers); body limit 1 MiB; missing key →
/// 400; replayed headers `Content-Type` and `Location`; every status recorded except 503 (4xx
/// and other 5xx as a terminal failure); at most the store's `max_queue`, and at most 256, store
/// admissions in flight.
///
/// Clones of a layer share its in-flight limit and its [`LayerMetrics`]; a builder method
/// called on one clone changes only that clone's settings ([`IdempotencyLayer::max_in_flight`]
/// gives it a limit of its own).
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Arc<Config>,
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.config.methods)
            .field("key_header", &self.config.key_header)
            .field("body_limit", &self.config.body_limit)
            .field("missing_key", &self.config.missing_key)
            .field("max_in_flight", &self.config.max_in_flight)
            .finish_non_exhaustive()
    }
}

/// A semaphore size within tokio's bounds (at least one permit).
fn permits(n: usize) -> usize {
    n.clamp(1, Semaphore::MAX_PERMITS)
}

/// The default bound on store admissions: half of tokio's default blocking pool (512
/// threads). Every admission occupies a blocking thread while it waits for the store; with
/// more admissions than threads, the surplus would queue in tokio's blocking queue and the
/// calls that finish started requests (recording, heartbeats), which queue behind them in
/// FIFO order, would be delayed past their lease deadline. Half leaves them threads.
const DEFAULT_MAX_IN_FLIGHT: usize = 256;

impl IdempotencyLayer {
    /// A layer on `store` whose tenant comes from `tenant` (e.g. the authenticated principal an
    /// earlier layer put in the extensions). `None` answers `400` ([`problem::MISSING_TENANT`])
    /// on a covered request; an empty tenant or one over the store's tenant limit answers `400`
    /// ([`problem::INVALID_TENANT`]), before the body is read.
    pub fn new(
        store: Store,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self::with_tenant(store, TenantSource::Extract(Arc::new(tenant)))
    }

    /// A layer whose tenant is the value of the request header `name` (in any case:
    /// `X-Tenant-Id` is `x-tenant-id`): exactly one field line of visible ASCII without commas
    /// (`A, B` is what an intermediary makes of two lines), at most the store's tenant limit
    /// ([`tenant_from_header`], which a service's own extractor can share). No such header
    /// answers `400` ([`problem::MISSING_TENANT`]); two lines or a bad value answers `400`
    /// ([`problem::INVALID_TENANT`]).
    ///
    /// A `name` that is not a valid header name (empty, or with a character outside RFC 9110's
    /// token characters, e.g. a space or `:`) does not panic: the layer answers every covered
    /// request `500` ([`problem::MISCONFIGURED`]) without running the handler, so the mistake
    /// shows at the first request.
    pub fn tenant_header(store: Store, name: &str) -> Self {
        // `from_bytes` lowercases; it refuses only what is no header name in any case.
        let source = match HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => TenantSource::Header(header),
            Err(_) => TenantSource::BadHeaderName(name.to_owned()),
        };
        Self::with_tenant(store, source)
    }

    fn with_tenant(store: Store, tenant: TenantSource) -> Self {
        let max_in_flight = permits(store.max_queue().min(DEFAULT_MAX_IN_FLIGHT));
        IdempotencyLayer {
            config: Arc::new(Config {
                store,
                tenant,
                operation: None,
                methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
                key_header: HeaderName::from_static(IDEMPOTENCY_KEY),
                fingerprint_headers: Vec::new(),
                replay_headers: vec![CONTENT_TYPE, LOCATION],
                body_limit: 1024 * 1024,
                missing_key: MissingKey::Reject,
                record_status: Arc::new(|s: StatusCode| s != StatusCode::SERVICE_UNAVAILABLE),
                admissions: Arc::new(Semaphore::new(max_in_flight)),
                max_in_flight,
                counters: Arc::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        // Copy-on-write: a layer already cloned keeps its own settings.
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// The methods the layer covers; others pass through untouched.
    pub fn methods(self, methods: impl IntoIterator<Item = Method>) -> Self {
        let methods: Vec<Method> = methods.into_iter().collect();
        self.edit(|c| c.methods = methods)
    }

    /// The header that carries the key (default `Idempotency-Key`).
    pub fn key_header(self, name: HeaderName) -> Self {
        self.edit(|c| c.key_header = name)
    }

    /// Overrides the operation half of the scope. `None` from `f` falls back to the default,
    /// `"{METHOD} {route template}"`. An operation over the store's operation limit answers
    /// `500` ([`problem::INVALID_OPERATION`]): a configuration error.
    pub fn operation(self, f: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static) -> Self {
        self.edit(|c| c.operation = Some(Arc::new(f)))
    }

    /// Request headers that are part of the fingerprint (in this order; an absent header counts
    /// as absent, not as empty).
    pub fn fingerprint_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.edit(|c| c.fingerprint_headers = names)
    }

    /// Response headers recorded with the answer and sent again on replays (default
    /// `Content-Type`, `Location`).
    pub fn replay_headers(self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        let names: Vec<HeaderName> = names.into_iter().collect();
        self.edit(|c| c.replay_headers = names)
    }

    /// The largest request body the layer buffers (default 1 MiB); above it, `413`.
    pub fn body_limit(self, bytes: usize) -> Self {
        self.edit(|c| c.body_limit = bytes)
    }

    /// What a covered request without a key gets (default [`MissingKey::Reject`]).
    pub fn missing_key(self, policy: MissingKey) -> Self {
        self.edit(|c| c.missing_key = policy)
    }

    /// Which handler statuses are recorded and replayed. The default records every status
    /// except `503 Service Unavailable`; a status for which `f` returns false releases the key
    /// (nothing stored, the next retry runs the handler again).
    ///
    /// So a status excluded here must mean **"no effect happened"** (the handler refused, or
    /// undid its work): it is how a key whose handler ran is given up. The default excludes
    /// only 503, the conventional "not processed, retry later"; a `500` is recorded (as a
    /// terminal failure, like a 4xx), because handlers commonly answer 500 for "failed after a
    /// partial write", and a retry must not cause a second effect (Stripe likewise stores a 500
    /// once execution began). A handler that fails *after* causing an effect must answer a
    /// recorded status (or panic, which the layer records as a terminal 500).
    pub fn record_status(self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.record_status = Arc::new(f))
    }

    /// The most store admissions (the claim of a key, [`Store::begin`]) this layer and its
    /// clones run at once (at least 1). The default is the store's `max_queue`, at most 256:
    /// half of tokio's default blocking pool (512 threads), because each admission occupies a
    /// blocking thread while it waits for the store, and the calls that finish started requests
    /// (recording their answers, heartbeats) must still find threads — queued behind surplus
    /// admissions they could be delayed past their lease deadline. A larger limit wants a
    /// blocking pool (`max_blocking_threads`) of at least twice its size. A covered
    /// request that finds them all busy is answered `503` + `Retry-After: 1`
    /// ([`problem::RETRY`]) at once, without waiting and without running the handler, and
    /// counted in [`LayerMetrics::overloaded`]. Store calls after the handler ran (recording
    /// its answer, heartbeats) are not counted against the limit and are never refused, so a
    /// started request always records.
    pub fn max_in_flight(self, n: usize) -> Self {
        let n = permits(n);
        self.edit(|c| {
            c.max_in_flight = n;
            c.admissions = Arc::new(Semaphore::new(n));
        })
    }

    /// A snapshot of this layer's counters (shared with its clones and the services they
    /// built).
    pub fn metrics(&self) -> LayerMetrics {
        let c = &self.config.counters;
        let max = self.config.max_in_flight;
        LayerMetrics {
            bodies_not_kept: c.bodies_not_kept.load(Ordering::Relaxed),
            overloaded: c.overloaded.load(Ordering::Relaxed),
            handler_failures: c.handler_failures.load(Ordering::Relaxed),
            not_recorded: c.not_recorded.load(Ordering::Relaxed),
            heartbeat_failures: c.heartbeat_failures.load(Ordering::Relaxed),
            in_flight: max.saturating_sub(self.config.admissions.available_permits()),
            max_in_flight: max,
        }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = IdempotencyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// The service [`IdempotencyLayer`] wraps around an inner service.
#[derive(Clone)]
pub struct IdempotencyService<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: std::fmt::Debug> std::fmt::Debug for IdempotencyService<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyService")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

/// The boxed future of [`IdempotencyService`].
pub type ResponseFuture<E> =
    Pin<Box<dyn Future<Output = Result<http::Response<Body>, E>> + Send + 'static>>;

impl<S, B, RB> Service<http::Request<B>> for IdempotencyService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::BoxError>,
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
    RB::Error: Into<crate::BoxError>,
{
    let resp = inner.call(req).await?;
    Ok(Answer(resp.map(Body::new)))
}

/// What the inner service answered, with its body boxed.
struct Answer(http::Response<Body>);

async fn handle<S, B, RB>(
    config: Arc<Config>,
    inner: S,
    req: http::Request<B>,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::BoxError>,
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
    // its names never costs a body buffer.
    let key = match key_of(&config, &parts) {
        Ok(Some(key)) => key,
        Ok(None) => match config.missing_key {
            MissingKey::PassThrough => {
                let req = http::Request::from_parts(parts, Body::new(body));
                return Ok(call_inner(inner, req).await?.0);
            }
            MissingKey::Reject => {
                return Ok(problem_response(
                    StatusCode::BAD_REQUEST,
                    problem::MISSING_KEY,
                    "Idempotency-Key required",
                    &format!(
                        "{} {} needs an {} header; send a new unique key per intent and \
                         the same key on every retry of it",
                        parts.method,
                        parts.uri.path(),
                        config.key_header
                    ),
                ));
            }
        },
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
    let fingerprint = fingerprint(&parts, &operation, &config.fingerprint_headers, &body);
    let request = Request::with_fingerprint(Scope::new(tenant, operation), key, fingerprint);

    // Admission: a permit or an immediate 503, never a queue. The permit is held for the claim
    // only, and dropped on the blocking pool when it ends, even if this future is dropped.
    let Ok(permit) = Arc::clone(&config.admissions).try_acquire_owned() else {
        bump(&config.counters.overloaded);
        return Ok(overloaded(config.max_in_flight));
    };
    let store = config.store.clone();
    let begun = blocking(move || {
        let begun = store.begin(request);
        drop(permit);
        begun
    })
    .await;
    let lease = match begun {
        Ok(Ok(Begin::Acquired(lease))) => lease,
        Ok(Ok(Begin::Replayed(stored))) => return Ok(replay(&stored)),
        Ok(Ok(Begin::Expired(tombstone))) => return Ok(expired(&tombstone)),
        Ok(Ok(Begin::InFlight { retry_after })) => return Ok(in_flight(retry_after)),
        Ok(Err(e)) => return Ok(error_response(&e)),
        Err(resp) => return Ok(resp),
    };
    run(config, inner, parts, body, lease).await
}

/// Runs the handler under `lease` and records its answer.
async fn run<S, RB>(
    config: Arc<Config>,
    inner: S,
    mut parts: Parts,
    body: Bytes,
    mut lease: Lease,
) -> Result<http::Response<Body>, S::Error>
where
    S: Service<http::Request<Body>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
    RB::Error: Into<crate::BoxError>,
{
    // From here on the handler may cause an effect: the key is never released behind its back.
    // A lease that is dropped unfinished (a cancelled task, a failed recording) lapses at its
    // deadline; only the user's `record_status` policy releases it, explicitly.
    lease.lapse_on_drop(true);
    let every =
        (lease.deadline().saturating_since(config.store.now()) / 3).max(Duration::from_millis(10));
    let request = Arc::new(lease.request().clone());
    let downstream = lease.downstream_key();
    let slot = Arc::new(Slot(Mutex::new(Some(lease))));
    let heartbeat = spawn_heartbeat(&slot, every, Arc::clone(&config.counters));
    parts.extensions.insert(Idempotency {
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

/// What the layer does with a handler's answer, decided by its status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disposition {
    /// Record it: as a terminal failure (`failure`: 4xx, 5xx) or as completed (the rest).
    Record {
        /// Stored with [`Lease::fail`] rather than [`Lease::complete`].
        failure: bool,
    },
    /// Record nothing and release the key: a status `record_status` excludes (503 by
    /// default), which says no effect happened.
    Release,
}

/// The one place a status is judged: the user's `record_status` policy, then failure or not.
fn disposition(config: &Config, status: StatusCode) -> Disposition {
    if !(config.record_status)(status) {
        Disposition::Release
    } else {
        Disposition::Record {
            failure: status.is_client_error() || status.is_server_error(),
        }
    }
}

/// Finishes the lease with the handler's answer (or passes through an answer the handler
/// recorded itself through [`Idempotency::complete_with`]).
async fn record(
    config: &Config,
    slot: &Arc<Slot>,
    resp: http::Response<Body>,
) -> http::Response<Body> {
    let status = resp.status();
    let Disposition::Record { failure } = disposition(config, status) else {
        // The user's policy: this status means no effect happened, so the key is given up.
        if let Some(lease) = take_lease(slot).await {
            let _ = blocking(move || lease.release()).await;
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
async fn record_failure(config: &Config, slot: &Arc<Slot>) -> http::Response<Body> {
    let (status, headers, body) = handler_failed();
    // No lease in the slot: the handler recorded its own answer before failing.
    if let Some(lease) = take_lease(slot).await
        && finish(config, lease, true, status, &headers, &body).await
    {
        bump(&config.counters.handler_failures);
    }
    plain_response(status, headers, body)
}

/// The parts of the terminal `500` recorded for a handler that failed after it started.
fn handler_failed() -> (StatusCode, HeaderMap, Bytes) {
    problem_parts(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::HANDLER_FAILED,
        "Handler failed",
        "the handler failed after it started (it panicked, its response body failed, or the \
         service returned an error), so its effect is unknown; this answer is recorded and \
         this key will not run the request again: check the outcome, and use a new key for a \
         new attempt",
    )
}

/// Records an answer with the lease (as a terminal failure if `failure`), fitted into the
/// store's response cap; true if it was recorded. If recording fails the lease is dropped
/// unfinished and lapses (it was marked so before the handler ran): never released.
async fn finish(
    config: &Config,
    lease: Lease,
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
        bump(&config.counters.not_recorded);
    } else if !body_kept {
        bump(&config.counters.bodies_not_kept);
    }
    recorded
}

/// Runs on the blocking pool: fails (`failure`) or completes `lease` with `stored`, letting it
/// lapse (not releasing it) if that fails.
fn finish_lease(mut lease: Lease, failure: bool, stored: Response) -> Result<Response, Error> {
    lease.lapse_on_drop(true);
    if failure {
        lease.fail(stored)
    } else {
        lease.complete(stored)
    }
}

/// Takes the lease out of its slot on the blocking pool: a heartbeat may hold the slot's lock
/// during a disk write.
async fn take_lease(slot: &Arc<Slot>) -> Option<Lease> {
    let slot = Arc::clone(slot);
    blocking(move || slot.0.lock().take()).await.ok().flatten()
}

/// What one heartbeat found.
enum Beat {
    /// The lease was extended.
    Extended,
    /// The slot is empty: the lease was finished, released, or taken to be finished.
    Gone,
    /// A failure that may pass (see [`transient`]): try again soon.
    Retry,
    /// A failure no retry mends: the lease is lost, or the store refuses every write.
    Stop,
}

/// A heartbeat failure worth retrying: the store's queue was full (`Busy`), or a storage
/// error that may pass (an I/O failure latches fail-stop, so the retry then gets `FailStopped`
/// and stops). `Aborted` cannot come from a heartbeat, and would be retryable. Everything else
/// is terminal: `LeaseLost` (another attempt holds the key, or it was released), `FailStopped`
/// and `OutcomeUnknown` (the store takes no write until reopened), `CorruptStore` and
/// `CorruptRecord` (damage), and errors a heartbeat cannot meet.
fn transient(e: &Error) -> bool {
    matches!(
        e,
        Error::Busy { .. } | Error::Aborted { .. } | Error::Storage { .. }
    )
}

/// Extends the lease every `every` while the handler runs, so a handler slower than the
/// store's `lease_duration` is not taken over by a retry (a second concurrent execution).
/// A transient failure (the store's queue full, a failed blocking task) does not end this: it
/// is counted in [`LayerMetrics::heartbeat_failures`] and retried after `every / 4`, well
/// before the deadline (two thirds of the lease away after a missed beat). Stops when the
/// lease left its slot (finished or released), or on a failure no retry mends (the lease was
/// lost, the store fail-stopped or is damaged).
fn spawn_heartbeat(
    slot: &Arc<Slot>,
    every: Duration,
    counters: Arc<Counters>,
) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(slot);
    let retry = (every / 4).max(Duration::from_millis(5));
    tokio::spawn(async move {
        let mut pause = every;
        loop {
            tokio::time::sleep(pause).await;
            let Some(slot) = weak.upgrade() else {
                return;
            };
            let beat = blocking(move || match slot.0.lock().as_mut() {
                None => Beat::Gone,
                Some(lease) => match lease.heartbeat() {
                    Ok(_) => Beat::Extended,
                    Err(e) if transient(&e) => Beat::Retry,
                    Err(_) => Beat::Stop,
                },
            })
            .await;
            pause = match beat {
                Ok(Beat::Extended) => every,
                Ok(Beat::Gone) => return,
                Ok(Beat::Stop) => {
                    bump(&counters.heartbeat_failures);
                    return;
                }
                // A panic or cancellation of the blocking task: the lease is still in its
                // slot (a panic unwinds through the lock guard, which does not poison).
                Ok(Beat::Retry) | Err(_) => {
                    bump(&counters.heartbeat_failures);
                    retry
                }
            };
        }
    })
}

/// Owns the lease while the handler runs. The lease was marked to lapse when dropped
/// unfinished, so if the last reference goes away with the lease still in it (the handler's
/// task was cancelled), nothing is released: the key stays claimed until the deadline.
struct Slot(Mutex<Option<Lease>>);

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

/// The handle the layer puts in the extensions of every request it claimed a key for (axum:
/// `Extension<Idempotency>`). A handler that wants its own writes and the recorded answer in
/// one redb transaction calls [`Idempotency::complete_with`]; one that does not need that
/// ignores it, and the layer records whatever it returns.
#[derive(Clone)]
pub struct Idempotency {
    slot: Arc<Slot>,
    request: Arc<Request>,
    downstream: crate::DownstreamKey,
    config: Arc<Config>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("request", &self.request)
            .finish_non_exhaustive()
    }
}

/// The answer a handler records through [`Idempotency::complete_with`].
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

impl Idempotency {
    /// The downstream key of this intent ([`Lease::downstream_key`]): the same on every
    /// attempt, for an external call or a resource id.
    pub fn downstream_key(&self) -> crate::DownstreamKey {
        self.downstream
    }

    /// The claimed request: scope (tenant, operation), key and fingerprint.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// Runs `f` in the write transaction that records its answer (flow A inside the layer's
    /// lease, [`Lease::complete_with`]), on the blocking pool. `f`'s writes through the [`Tx`]
    /// and the answer commit together or not at all; `f` may run more than once (group commit)
    /// and only the committed run counts.
    ///
    /// The answer is judged like the layer's own: a status the layer records as a failure
    /// (4xx, 5xx) is stored as a terminal failure, with `f`'s writes (answer 503 to roll them
    /// back and give the key up); an answer over the store's `max_response_bytes` is stored
    /// without its body (replayed with [`IDEMPOTENT_BODY_OMITTED`]). `Err(Abort::Terminal(r))`
    /// from `f` is recorded as a terminal failure whatever its status, with `f`'s writes, and
    /// answered as `r`'s status (500 if it is no HTTP status), body, and resource pointer of
    /// kind `"location"` as `Location`. The first answer is never marked as a replay.
    ///
    /// A status the layer would not record (503 by default), [`Abort::Retryable`], or a
    /// transaction that fails to commit rolls `f`'s writes back and releases the key: nothing
    /// of `f` happened. (Effects the handler caused outside `f`, before calling this, are its
    /// own to make idempotent, with [`Idempotency::downstream_key`].) If `f` panics, its writes
    /// are rolled back too, but the handler may have caused effects before calling this, so the
    /// key is not released: like any handler that fails after it started, a terminal `500`
    /// ([`problem::HANDLER_FAILED`]) is recorded, counted in [`LayerMetrics::handler_failures`]
    /// and replayed to every retry.
    ///
    /// Returns the HTTP response to send: the answer, or a problem response when nothing could
    /// be recorded. Call it at most once per request; a second call answers `500`.
    pub async fn complete_with<F>(&self, mut f: F) -> http::Response<Body>
    where
        F: FnMut(&Tx<'_>) -> Result<Recorded, Abort> + Send + 'static,
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
                    let _ = lease.release();
                    Completed::Released(r)
                }
                // Lost: nothing of ours to release.
                (Err(e @ Error::LeaseLost { .. }), _) => Completed::Failed(e),
                // Rolled back: nothing of `f` happened.
                (Err(e), _) => {
                    let _ = lease.release();
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
                bump(if recorded {
                    &counters.handler_failures
                } else {
                    &counters.not_recorded
                });
                let (status, headers, body) = handler_failed();
                plain_response(status, headers, body)
            }
            Ok(Completed::Failed(e)) => error_response(&e),
            Err(resp) => resp,
        }
    }
}

/// How [`Idempotency::complete_with`] ended, decided on the blocking pool.
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

fn plain_response(status: StatusCode, headers: HeaderMap, body: Bytes) -> http::Response<Body> {
    let mut resp = http::Response::new(Body::from(body));
    *resp.status_mut() = status;
    *resp.headers_mut() = headers;
    resp
}

/// Runs a store call on the blocking pool; a panic there becomes a `500` problem.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, http::Response<Body>> {
    tokio::task::spawn_blocking(f).await.map_err(|_| {
        problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Store call failed",
            "a store call failed unexpectedly; retry with the same key",
        )
    })
}

// ---- the key and the tenant ----

/// Why a key field was refused (the problem's `detail` names the header).
#[derive(Debug, Clone, PartialEq, Eq)]
enum KeyError {
    /// The field appears on this many lines.
    Lines(usize),
    /// No characters (an empty value, or `""`).
    Empty,
    /// Longer than the store's key limit.
    TooLong { len: usize, max: usize },
    /// Starts with a quote but is not exactly one Structured Field string without parameters.
    NotAString(String),
    /// A bare key with a character outside its alphabet, at this byte offset.
    BadChar { byte: u8, at: usize },
}

impl KeyError {
    fn detail(&self, header: &HeaderName) -> String {
        match self {
            KeyError::Lines(n) => format!(
                "the request has {n} {header} field lines: send exactly one key (two lines, or \
                 one line listing two keys, never name one intent)"
            ),
            KeyError::Empty => format!("the {header} is empty: send a new unique key per intent"),
            KeyError::TooLong { len, max } => format!(
                "the {header} is {len} bytes, over the store's limit of {max} (Limits::max_key_len)"
            ),
            KeyError::NotAString(why) => format!(
                "the {header} starts with a quote but is not one Structured Field string \
                 (RFC 9651) without parameters: {why}"
            ),
            KeyError::BadChar { byte, at } => format!(
                "the {header} has byte 0x{byte:02x} at offset {at}; an unquoted key is visible \
                 ASCII without '\"', ',', ';', '\\' or whitespace (quote it as a Structured \
                 Field string, \"...\", to use spaces)"
            ),
        }
    }
}

/// A byte a bare (unquoted) key may contain: visible ASCII except the characters that would
/// make it ambiguous with a Structured Field string (`"`, `\`), a list (`,`) or parameters
/// (`;`). Whitespace and control characters are never part of a key.
fn bare_key_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7e) && !matches!(b, b'"' | b',' | b';' | b'\\')
}

/// Optional whitespace around a field value (RFC 9110 §5.5) is not part of it.
fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => &v[s..=e],
        _ => &[],
    }
}

/// Parses one key field value (see `docs/HTTP.md`): a value starting with `"` must be exactly
/// one Structured Field string without parameters (RFC 9651, parsed by `sfv`); any other value
/// is a bare key of [`bare_key_byte`]s (Stripe-style clients send unquoted UUIDs). Either way
/// 1..=`max_len` bytes.
fn parse_key(value: &[u8], max_len: usize) -> Result<String, KeyError> {
    let v = trim_ows(value);
    let key = if v.first() == Some(&b'"') {
        sfv::Parser::new(v)
            .parse_item_with_visitor(KeyItem)
            .map_err(|e| KeyError::NotAString(e.to_string()))?
    } else {
        if let Some(at) = v.iter().position(|&b| !bare_key_byte(b)) {
            return Err(KeyError::BadChar { byte: v[at], at });
        }
        // Every byte is ASCII (checked above), so this never fails.
        String::from_utf8(v.to_vec()).map_err(|_| KeyError::BadChar { byte: 0, at: 0 })?
    };
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > max_len {
        return Err(KeyError::TooLong {
            len: key.len(),
            max: max_len,
        });
    }
    Ok(key)
}

/// `sfv` visitor of the key item: a String bare item, no parameters.
struct KeyItem;

/// The key's parameters visitor: refuses any parameter.
struct NoParams(String);

/// Why a quoted value is not a key (wrapped into `sfv`'s error message).
#[derive(Debug)]
struct NotAKey(&'static str);

impl std::fmt::Display for NotAKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for NotAKey {}

impl<'de> sfv::visitor::ItemVisitor<'de> for KeyItem {
    type Out = String;
    type Error = NotAKey;

    fn bare_item(
        self,
        bare_item: sfv::BareItemFromInput<'de>,
    ) -> Result<impl sfv::visitor::ParameterVisitor<'de, Out = String>, NotAKey> {
        match bare_item {
            sfv::GenericBareItem::String(s) => Ok(NoParams(s.as_str().to_owned())),
            _ => Err(NotAKey("the value is not a string")),
        }
    }
}

impl<'de> sfv::visitor::ParameterVisitor<'de> for NoParams {
    type Out = String;
    type Error = NotAKey;

    fn parameter(
        &mut self,
        _key: &'de sfv::KeyRef,
        _value: sfv::BareItemFromInput<'de>,
    ) -> Result<(), NotAKey> {
        Err(NotAKey("the key has parameters"))
    }

    fn finish(self) -> Result<String, NotAKey> {
        Ok(self.0)
    }
}

/// The key of a covered request (`Ok(None)`: no key field at all).
fn key_of(config: &Config, parts: &Parts) -> Result<Option<String>, KeyError> {
    let mut lines = parts.headers.get_all(&config.key_header).iter();
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    match lines.count() {
        0 => parse_key(first.as_bytes(), config.store.limits().max_key_len).map(Some),
        more => Err(KeyError::Lines(more + 1)),
    }
}

/// `500`: the tenant header name given to [`IdempotencyLayer::tenant_header`] is not a header
/// name.
fn misconfigured(name: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::MISCONFIGURED,
        "Idempotency layer misconfigured",
        &format!(
            "the service built its idempotency layer with IdempotencyLayer::tenant_header \
             ({name:?}), which is not a valid HTTP header name; nothing ran and nothing was \
             recorded: the service's configuration must be fixed"
        ),
    )
}

/// Why a tenant is refused ([`tenant_from_header`]; the layer answers `400`
/// [`problem::INVALID_TENANT`] with this message, naming the header).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidTenant {
    /// The tenant header appears on this many field lines: two lines, or the one line an
    /// intermediary combines them into (`t1, t2`), never name one tenant.
    #[error("the tenant header has {0} field lines: send exactly one tenant")]
    Lines(usize),
    /// The value (without the whitespace around it) has a byte that is not visible ASCII, or
    /// is a comma.
    #[error(
        "the tenant has byte 0x{byte:02x} at offset {at}; a tenant is visible ASCII without \
         ',' or whitespace"
    )]
    BadByte {
        /// The byte.
        byte: u8,
        /// Its offset in the value.
        at: usize,
    },
    /// The tenant is empty.
    #[error("the tenant is empty")]
    Empty,
    /// The tenant is longer than the store's limit ([`crate::Limits::max_tenant_len`]).
    #[error("the tenant is {len} bytes, over the store's limit of {max} (Limits::max_tenant_len)")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// The tenant that the request header `name` names in `headers`, checked as
/// [`IdempotencyLayer::tenant_header`] checks it: exactly one field line, whose value (without
/// the whitespace around it) is 1 to `max_len` bytes of visible ASCII without `,`. `Ok(None)`:
/// the header is absent (the layer answers [`problem::MISSING_TENANT`]).
///
/// For a service's own tenant extractor on the routes the layer does not cover (reads), so
/// that every route takes the same tenants; pass the store's
/// [`crate::Limits::max_tenant_len`] (`examples/edge_service.rs` does this).
pub fn tenant_from_header(
    headers: &HeaderMap,
    name: &HeaderName,
    max_len: usize,
) -> Result<Option<String>, InvalidTenant> {
    let mut lines = headers.get_all(name).iter();
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    let more = lines.count();
    if more > 0 {
        return Err(InvalidTenant::Lines(more + 1));
    }
    let v = trim_ows(first.as_bytes());
    if let Some(at) = v
        .iter()
        .position(|&b| !matches!(b, 0x21..=0x7e) || b == b',')
    {
        return Err(InvalidTenant::BadByte { byte: v[at], at });
    }
    // Every byte is visible ASCII (checked above): the conversion cannot fail.
    let tenant =
        String::from_utf8(v.to_vec()).map_err(|_| InvalidTenant::BadByte { byte: 0, at: 0 })?;
    check_tenant_len(&tenant, max_len)?;
    Ok(Some(tenant))
}

/// A tenant from any source is 1 to `max` bytes.
fn check_tenant_len(tenant: &str, max: usize) -> Result<(), InvalidTenant> {
    if tenant.is_empty() {
        return Err(InvalidTenant::Empty);
    }
    if tenant.len() > max {
        return Err(InvalidTenant::TooLong {
            len: tenant.len(),
            max,
        });
    }
    Ok(())
}

/// Why a covered request has no usable tenant.
enum TenantError {
    /// The extractor found none, or there is no tenant header: `400` missing tenant.
    Missing,
    /// `400` invalid tenant, with this detail.
    Invalid(String),
    /// `500`: the layer's tenant header name is no header name.
    Misconfigured(String),
}

impl TenantError {
    fn response(&self) -> http::Response<Body> {
        match self {
            TenantError::Missing => problem_response(
                StatusCode::BAD_REQUEST,
                problem::MISSING_TENANT,
                "Tenant required",
                "the request names no tenant; idempotency keys are scoped per tenant",
            ),
            TenantError::Invalid(detail) => invalid_tenant(detail),
            TenantError::Misconfigured(name) => misconfigured(name),
        }
    }
}

/// The tenant of a covered request.
fn tenant_of(config: &Config, parts: &Parts) -> Result<String, TenantError> {
    let max = config.store.limits().max_tenant_len;
    match &config.tenant {
        TenantSource::Extract(f) => {
            let tenant = f(parts).ok_or(TenantError::Missing)?;
            check_tenant_len(&tenant, max).map_err(|e| TenantError::Invalid(e.to_string()))?;
            Ok(tenant)
        }
        TenantSource::Header(name) => match tenant_from_header(&parts.headers, name, max) {
            Ok(Some(tenant)) => Ok(tenant),
            Ok(None) => Err(TenantError::Missing),
            Err(e) => Err(TenantError::Invalid(format!("{name}: {e}"))),
        },
        TenantSource::BadHeaderName(name) => Err(TenantError::Misconfigured(name.clone())),
    }
}

/// `"{METHOD} {route template}"`, and whether the request path stood in for an unknown
/// template (then the client chose the operation's length).
fn default_operation(parts: &Parts) -> (String, bool) {
    match parts.extensions.get::<MatchedPath>() {
        Some(route) => (format!("{} {}", parts.method, route.as_str()), false),
        None => (format!("{} {}", parts.method, parts.uri.path()), true),
    }
}
async fn read_body<B>(parts: &Parts, body: B, limit: usize) -> Result<Bytes, http::Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::BoxError>,
{
    let too_large = || {
        problem_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem::BODY_TOO_LARGE,
            "Request body too large",
            &format!("the request body is over the limit of {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(problem_response(
            StatusCode::BAD_REQUEST,
            problem::UNREADABLE_BODY,
            "Unreadable request body",
            &format!("the request body could not be read: {e}"),
        )),
    }
}

/// The request fingerprint: method, operation, path and query, the selected headers and the
/// body, each length-prefixed (so no two different requests concatenate to the same bytes).
pub fn fingerprint(
    parts: &Parts,
    operation: &str,
    headers: &[HeaderName],
    body: &[u8],
) -> Fingerprint {
    let mut buf = Vec::with_capacity(64 + body.len());
    let mut put = |b: &[u8]| {
        buf.extend_from_slice(&(b.len() as u64).to_be_bytes());
        buf.extend_from_slice(b);
    };
    put(b"idem-http-v1");
    put(parts.method.as_str().as_bytes());
    put(operation.as_bytes());
    // The concrete target too: the operation is the route template, so without it the same
    // key on `/payments/1/refund` and `/payments/2/refund` would replay one for the other.
    put(parts
        .uri
        .path_and_query()
        .map_or(b"".as_slice(), |p| p.as_str().as_bytes()));
    for name in headers {
        put(name.as_str().as_bytes());
        let values: Vec<&HeaderValue> = parts.headers.get_all(name).iter().collect();
        put(&(values.len() as u64).to_be_bytes());
        for v in values {
            put(v.as_bytes());
        }
    }
    put(body);
    Fingerprint::of_bytes(&buf)
}

// ---- the stored answer: status + (replayed headers, body) envelope ----

/// The envelope of an answer kept whole.
const ENVELOPE_V1: &[u8; 4] = b"IDH1";
/// The envelope with a flags byte, written only when a flag is set.
const ENVELOPE_V2: &[u8; 4] = b"IDH2";
/// `IDH2` flag: the body (and the headers that describe it) was over the store's response cap
/// and was not kept. The only flag; any other bit makes the envelope unreadable.
const FLAG_BODY_OMITTED: u8 = 0x01;

/// The replayed headers of an answer, in the order of the replay set.
fn select_headers<'a>(
    headers: &'a HeaderMap,
    replay: &'a [HeaderName],
) -> Vec<(&'a HeaderName, &'a HeaderValue)> {
    replay
        .iter()
        .flat_map(|n| headers.get_all(n).iter().map(move |v| (n, v)))
        .filter(|(n, v)| n.as_str().len() <= usize::from(u16::MAX) && v.len() <= u32::MAX as usize)
        .take(usize::from(u16::MAX))
        .collect()
}

/// Headers that describe a body: not replayed with an omitted one (an empty body must not be
/// announced as `application/json` of some length, or cached under the original's validator).
fn describes_body(name: &HeaderName) -> bool {
    let n = name.as_str();
    n.starts_with("content-") || matches!(n, "etag" | "last-modified" | "digest" | "repr-digest")
}

/// The envelope bytes. `flags == 0`: `"IDH1" ‖ u16be(count) ‖ (u16be(len) ‖ name ‖
/// u32be(len) ‖ value)* ‖ body` (the format since the first release, so older readers replay
/// it). Otherwise `"IDH2" ‖ u8(flags) ‖` the same from the count on.
fn encode_envelope(headers: &[(&HeaderName, &HeaderValue)], flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + body.len());
    if flags == 0 {
        out.extend_from_slice(ENVELOPE_V1);
    } else {
        out.extend_from_slice(ENVELOPE_V2);
        out.push(flags);
    }
    // `select_headers` keeps at most u16::MAX headers, each within the length prefixes.
    out.extend_from_slice(&(headers.len() as u16).to_be_bytes());
    for (n, v) in headers {
        out.extend_from_slice(&(n.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// The record's resource pointer: the answer's `Location`, which so survives into the
/// tombstone (and into a replay whose envelope had no room for it).
fn location_of(headers: &HeaderMap) -> Option<&str> {
    headers.get(LOCATION).and_then(|v| v.to_str().ok())
}

fn with_location(resp: Response, location: Option<&str>) -> Response {
    match location {
        Some(loc) => resp.with_resource("location", loc),
        None => resp,
    }
}

/// The stored form of an HTTP answer kept whole: the store keeps a status and opaque bytes,
/// so the replayed headers travel in a small envelope before the body ([`encode_envelope`]).
fn stored_response(
    status: StatusCode,
    headers: &HeaderMap,
    replay: &[HeaderName],
    body: &[u8],
) -> Response {
    let selected = select_headers(headers, replay);
    let resp = Response::new(status.as_u16(), encode_envelope(&selected, 0, body));
    with_location(resp, location_of(headers))
}

/// The stored form of an answer within `max` bytes (the store's `max_response_bytes`, as the
/// store counts it: envelope plus resource pointer), and whether its body was kept. What
/// fits is kept, in this order of sacrifice: the body and the headers that describe it
/// (marked [`FLAG_BODY_OMITTED`]), then the other replayed headers from the last, then the
/// resource pointer, and at last the envelope itself: the status alone can always be stored.
fn fit_response(
    status: StatusCode,
    headers: &HeaderMap,
    replay: &[HeaderName],
    body: &[u8],
    max: usize,
) -> (Response, bool) {
    let whole = stored_response(status, headers, replay, body);
    if whole.stored_len() <= max {
        return (whole, true);
    }
    let mut selected: Vec<_> = select_headers(headers, replay)
        .into_iter()
        .filter(|(n, _)| !describes_body(n))
        .collect();
    let mut location = location_of(headers);
    loop {
        let envelope = encode_envelope(&selected, FLAG_BODY_OMITTED, b"");
        let resp = with_location(Response::new(status.as_u16(), envelope), location);
        if resp.stored_len() <= max {
            return (resp, false);
        }
        if selected.pop().is_none() && location.take().is_none() {
            // Not even an empty envelope fits (a cap under 7 bytes): the status alone.
            return (Response::new(status.as_u16(), Vec::new()), false);
        }
    }
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if buf.len() < n {
        return None;
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Some(head)
}

/// A decoded envelope.
#[derive(Debug)]
struct Envelope {
    headers: HeaderMap,
    body: Bytes,
    body_omitted: bool,
}

/// Decodes [`encode_envelope`]'s bytes (`IDH1` or `IDH2`); `None` if they are damaged or carry
/// an unknown flag. A body without a magic (a record written by other code, or a status-only
/// record) is replayed as is, without headers.
fn decode_envelope(bytes: &[u8]) -> Option<Envelope> {
    let (mut rest, flags) = if let Some(rest) = bytes.strip_prefix(ENVELOPE_V1.as_slice()) {
        (rest, 0)
    } else if let Some(mut rest) = bytes.strip_prefix(ENVELOPE_V2.as_slice()) {
        let flags = take(&mut rest, 1)?[0];
        if flags & !FLAG_BODY_OMITTED != 0 {
            return None;
        }
        (rest, flags)
    } else {
        return Some(Envelope {
            headers: HeaderMap::new(),
            body: Bytes::copy_from_slice(bytes),
            body_omitted: false,
        });
    };
    let count = u16::from_be_bytes(take(&mut rest, 2)?.try_into().ok()?);
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let n = u16::from_be_bytes(take(&mut rest, 2)?.try_into().ok()?);
        let name = HeaderName::from_bytes(take(&mut rest, usize::from(n))?).ok()?;
        let n = u32::from_be_bytes(take(&mut rest, 4)?.try_into().ok()?);
        let value = HeaderValue::from_bytes(take(&mut rest, usize::try_from(n).ok()?)?).ok()?;
        headers.append(name, value);
    }
    Some(Envelope {
        headers,
        body: Bytes::copy_from_slice(rest),
        body_omitted: flags & FLAG_BODY_OMITTED != 0,
    })
}

fn replayed(resp: &mut http::Response<Body>) {
    resp.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
}

/// The HTTP answer for a stored response: its status, body and recorded headers, plus
/// `Idempotent-Replayed: true`; for an answer whose body was not kept, an empty body,
/// [`IDEMPOTENT_BODY_OMITTED`]`: true` and the `Location` of the resource pointer.
pub fn replay(stored: &Response) -> http::Response<Body> {
    let Some(envelope) = decode_envelope(stored.body()) else {
        return problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Stored answer unreadable",
            "the recorded answer for this key is damaged; an operator can inspect it with `idem get`",
        );
    };
    let status = StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::OK);
    let mut resp = plain_response(status, envelope.headers, envelope.body);
    if envelope.body_omitted {
        resp.headers_mut().insert(
            HeaderName::from_static(IDEMPOTENT_BODY_OMITTED),
            HeaderValue::from_static("true"),
        );
        if !resp.headers().contains_key(LOCATION)
            && let Some(r) = stored.resource().filter(|r| r.kind == "location")
            && let Ok(v) = HeaderValue::from_str(&r.id)
        {
            resp.headers_mut().insert(LOCATION, v);
        }
    }
    replayed(&mut resp);
    resp
}

/// The HTTP answer for an intent that finished longer ago than the retention: the original
/// status and `Location` (when it had one), no body, `Idempotent-Replayed: true`. The handler
/// is not called.
pub fn expired(tombstone: &crate::Tombstone) -> http::Response<Body> {
    let status = StatusCode::from_u16(tombstone.status()).unwrap_or(StatusCode::OK);
    let mut resp = plain_response(status, HeaderMap::new(), Bytes::new());
    if let Some(r) = tombstone.resource().filter(|r| r.kind == "location")
        && let Ok(v) = HeaderValue::from_str(&r.id)
    {
        resp.headers_mut().insert(LOCATION, v);
    }
    replayed(&mut resp);
    resp
}

fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0).max(u64::from(d.as_secs() == 0))
}

fn in_flight(retry_after: Duration) -> http::Response<Body> {
    let mut resp = problem_response(
        StatusCode::CONFLICT,
        problem::IN_FLIGHT,
        "Request in flight",
        "another request with this idempotency key is being processed; retry after the delay",
    );
    resp.headers_mut().insert(
        RETRY_AFTER,
        HeaderValue::from(retry_after_secs(retry_after)),
    );
    resp
}

fn retry_later(detail: &str) -> http::Response<Body> {
    let mut resp = problem_response(
        StatusCode::SERVICE_UNAVAILABLE,
        problem::RETRY,
        "Retry later",
        detail,
    );
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(1u64));
    resp
}

/// All `max` admission permits are taken: `503` at once.
fn overloaded(max: usize) -> http::Response<Body> {
    retry_later(&format!(
        "the service is running its limit of {max} idempotency claims; nothing ran and nothing \
         was recorded: retry with the same key after the delay"
    ))
}

fn invalid_key(detail: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::INVALID_KEY,
        "Invalid Idempotency-Key",
        detail,
    )
}

fn invalid_tenant(detail: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::INVALID_TENANT,
        "Invalid tenant",
        detail,
    )
}

/// `500`: the service's own naming is over the limit; `400` when the request path stood in
/// for the route template (the client chose it).
fn invalid_operation(from_path: bool, detail: &str) -> http::Response<Body> {
    let status = if from_path {
        StatusCode::BAD_REQUEST
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    problem_response(
        status,
        problem::INVALID_OPERATION,
        "Invalid operation",
        detail,
    )
}

/// The HTTP answer for a store error (RFC 9457 problem): `PayloadMismatch` → 422; `Empty` /
/// `TooLong` → 400 for the key or the tenant, 500 for the operation (the service's own name);
/// `Busy` / `Aborted` → 503 + `Retry-After: 1`; anything else → 500.
pub fn error_response(e: &Error) -> http::Response<Body> {
    match e {
        Error::PayloadMismatch { .. } => problem_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency-Key reused with a different request",
            "this key was first used with a different method, route, headers or body: a new \
             intent needs a new key; a retry must resend the original request",
        ),
        Error::Empty { field } | Error::TooLong { field, .. } => match field {
            Field::Tenant => invalid_tenant(&e.to_string()),
            Field::Operation => invalid_operation(false, &e.to_string()),
            Field::Key => invalid_key(&e.to_string()),
        },
        Error::Busy { .. } | Error::Aborted { .. } => {
            retry_later("nothing was recorded; retry with the same key")
        }
        _ => problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Idempotency store failed",
            "the outcome of this request may be unknown: retry with the same key",
        ),
    }
}

/// The parts of an RFC 9457 `application/problem+json` answer.
fn problem_parts(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    let body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    (status, headers, Bytes::from(body.to_string()))
}

/// An RFC 9457 `application/problem+json` response.
pub fn problem_response(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> http::Response<Body> {
    let (status, headers, body) = problem_parts(status, kind, title, detail);
    plain_response(status, headers, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(*n, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn envelope_round_trips_and_rejects_damage() {
        let h = headers(&[("content-type", "application/json"), ("x-other", "dropped")]);
        let stored = stored_response(StatusCode::CREATED, &h, &[CONTENT_TYPE, LOCATION], b"{}");
        let env = decode_envelope(stored.body()).unwrap();
        assert_eq!(env.headers.len(), 1);
        assert_eq!(env.headers[CONTENT_TYPE], "application/json");
        assert_eq!(&env.body[..], b"{}");
        assert!(!env.body_omitted);
        for cut in 5..stored.body().len() - 2 {
            // Truncations inside the header block are errors, never panics.
            let _ = decode_envelope(&stored.body()[..cut]);
        }
        assert!(decode_envelope(b"IDH1\x00\x01\x00\x05ab").is_none());
        assert!(decode_envelope(b"IDH2").is_none());
        assert_eq!(&decode_envelope(b"raw").unwrap().body[..], b"raw");
    }

    #[test]
    fn envelope_golden_bytes() {
        let h = headers(&[("content-type", "a/b"), ("location", "/x")]);
        let replay = [CONTENT_TYPE, LOCATION];
        // A whole answer: IDH1, unchanged since the first release.
        let whole = stored_response(StatusCode::CREATED, &h, &replay, b"hi");
        let golden_v1: &[u8] = b"IDH1\x00\x02\
            \x00\x0ccontent-type\x00\x00\x00\x03a/b\
            \x00\x08location\x00\x00\x00\x02/x\
            hi";
        assert_eq!(whole.body(), golden_v1);
        assert_eq!(whole.resource().unwrap().id, "/x");
        // A record written by an earlier release decodes as before.
        let env = decode_envelope(golden_v1).unwrap();
        assert_eq!(
            (env.headers.len(), &env.body[..], env.body_omitted),
            (2, &b"hi"[..], false)
        );

        // A body that was not kept: IDH2, flags 0x01, no body, no header describing it.
        let (omitted, kept) = fit_response(StatusCode::CREATED, &h, &replay, &[b'x'; 100], 40);
        assert!(!kept);
        let golden_v2: &[u8] = b"IDH2\x01\x00\x01\x00\x08location\x00\x00\x00\x02/x";
        assert_eq!(omitted.body(), golden_v2);
        assert_eq!(omitted.status(), 201);
        assert_eq!(omitted.resource().unwrap().id, "/x");
        let env = decode_envelope(golden_v2).unwrap();
        assert!(env.body_omitted && env.body.is_empty());
        assert_eq!(env.headers[LOCATION], "/x");

        // Unknown flags are not guessed at.
        assert!(decode_envelope(b"IDH2\x02\x00\x00").is_none());
        assert!(decode_envelope(b"IDH2\x81\x00\x00").is_none());
    }

    #[test]
    fn an_answer_is_fitted_into_the_cap_dropping_body_then_headers_then_pointer() {
        let h = headers(&[
            ("content-type", "text/csv"),
            ("location", "/r/1"),
            ("x-a", "aaaaaaaaaa"),
        ]);
        let replay = [CONTENT_TYPE, LOCATION, HeaderName::from_static("x-a")];
        let fit = |max| fit_response(StatusCode::OK, &h, &replay, &[b'b'; 1000], max);
        let cap = 64 * 1024;
        let (r, kept) = fit(cap);
        assert!(kept && r.body().ends_with(&[b'b'; 1000]));
        for max in [1000, 100, 40, 30, 20, 10, 7, 6, 0] {
            let (r, kept) = fit(max);
            assert!(!kept, "{max}");
            assert!(r.stored_len() <= max, "{max}: {}", r.stored_len());
            assert_eq!(r.status(), 200);
            let resp = replay_of(&r);
            assert!(resp.headers().get(CONTENT_TYPE).is_none(), "{max}");
        }
        // Room for everything but the body: Location and x-a are kept, Content-Type is not.
        let env = decode_envelope(fit(100).0.body()).unwrap();
        assert_eq!(env.headers.len(), 2);
        assert!(env.body_omitted);
        // Less room: x-a (last) goes first, then Location from the envelope (the pointer
        // still carries it), then the pointer.
        let (r, _) = fit(35);
        let env = decode_envelope(r.body()).unwrap();
        assert_eq!(env.headers.len(), 0);
        assert_eq!(r.resource().unwrap().id, "/r/1");
        assert_eq!(replay_of(&r).headers()[LOCATION], "/r/1");
        let (r, _) = fit(10);
        assert!(r.resource().is_none() && decode_envelope(r.body()).unwrap().body_omitted);
        // Under 7 bytes not even the empty envelope fits: the status alone.
        let (r, _) = fit(6);
        assert!(r.body().is_empty() && r.resource().is_none());
    }

    fn replay_of(r: &Response) -> http::Response<Body> {
        replay(r)
    }

    #[test]
    fn key_grammar_table() {
        const MAX: usize = 8;
        let ok = |v: &[u8], k: &str| assert_eq!(parse_key(v, MAX), Ok(k.to_owned()), "{v:?}");
        let not_a_string = |v: &[u8]| {
            assert!(
                matches!(parse_key(v, MAX), Err(KeyError::NotAString(_))),
                "{:?}: {:?}",
                String::from_utf8_lossy(v),
                parse_key(v, MAX)
            )
        };
        let bad_char = |v: &[u8], byte: u8, at: usize| {
            assert_eq!(
                parse_key(v, MAX),
                Err(KeyError::BadChar { byte, at }),
                "{v:?}"
            )
        };

        // Structured Field strings (RFC 9651 §3.3.3), parsed by sfv.
        ok(b"\"abc\"", "abc");
        ok(b"\"a b\"", "a b");
        ok(b"\"a\\\"b\"", "a\"b");
        ok(b"\"a\\\\b\"", "a\\b");
        ok(b"\"a,b\"", "a,b");
        ok(b"\"a;b\"", "a;b");
        ok(b" \"abc\" ", "abc");
        ok(b"\t\"abc\"\t", "abc");
        ok(b"\"12345678\"", "12345678");
        not_a_string(b"\"abc\";p=1"); // parameters
        not_a_string(b"\"abc\";p"); // a boolean parameter
        not_a_string(b"\"abc\"; p=1");
        not_a_string(b"\"a\", \"b\""); // a list
        not_a_string(b"\"a\",\"b\"");
        not_a_string(b"\"a\" \"b\"");
        not_a_string(b"\"abc"); // unbalanced quote
        not_a_string(b"\"abc\\\""); // the closing quote is escaped
        not_a_string(b"\"abc\"x"); // trailing characters
        not_a_string(b"\"abc\",");
        not_a_string(b"\"a\\tb\""); // only \" and \\ are escapes
        not_a_string(b"\"a\tb\""); // a control character in the string
        not_a_string(b"\"a\x7fb\"");
        not_a_string(b"\"caf\xc3\xa9\""); // not ASCII
        not_a_string(b"\"");
        assert_eq!(parse_key(b"\"\"", MAX), Err(KeyError::Empty));
        assert_eq!(parse_key(b" \"\" ", MAX), Err(KeyError::Empty));
        assert_eq!(
            parse_key(b"\"123456789\"", MAX),
            Err(KeyError::TooLong { len: 9, max: MAX })
        );

        // Bare keys: Stripe-style values, visible ASCII without " , ; \ or whitespace.
        ok(b"abc", "abc");
        ok(b"8e03978e", "8e03978e"); // starts with a digit: not an sf-token, still a key
        ok(b"a-b_c.d~", "a-b_c.d~");
        ok(b"?1", "?1");
        ok(b":YQ==:", ":YQ==:");
        ok(b"*/+=!#$%", "*/+=!#$%");
        ok(b"(a)", "(a)");
        ok(b"@1", "@1");
        ok(b"  abc\t", "abc"); // OWS around the value is not part of it
        ok(b"12345678", "12345678");
        bad_char(b"a, b", b',', 1); // a combined list
        bad_char(b"a,b", b',', 1);
        bad_char(b"a;p=1", b';', 1); // parameters
        bad_char(b"a b", b' ', 1); // whitespace inside
        bad_char(b"a\tb", b'\t', 1);
        bad_char(b"a\x01b", 0x01, 1); // control characters
        bad_char(b"a\x7fb", 0x7f, 1);
        bad_char(b"abc\"", b'"', 3); // a quote not at the start
        bad_char(b"a\\b", b'\\', 1);
        bad_char(b"caf\xc3\xa9", 0xc3, 3); // not ASCII
        bad_char(b"\xff", 0xff, 0);
        assert_eq!(parse_key(b"", MAX), Err(KeyError::Empty));
        assert_eq!(parse_key(b" \t ", MAX), Err(KeyError::Empty));
        assert_eq!(
            parse_key(b"123456789", MAX),
            Err(KeyError::TooLong { len: 9, max: MAX })
        );

        // Every single byte, bare: exactly the alphabet is accepted.
        for b in 0..=255u8 {
            let accepted = parse_key(&[b'k', b, b'k'], MAX).is_ok();
            let expected = (0x21..=0x7e).contains(&b) && !b"\",;\\".contains(&b);
            assert_eq!(accepted, expected, "byte 0x{b:02x}");
        }
        // Two field lines are refused before parsing (`key_of`); the detail says so.
        assert!(
            KeyError::Lines(2)
                .detail(&HeaderName::from_static(IDEMPOTENCY_KEY))
                .contains("2 idempotency-key field lines")
        );
    }

    #[test]
    fn keys_and_retry_after() {
        assert_eq!(retry_after_secs(Duration::from_millis(0)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(300)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
    }

    fn claimed(store: &Store) -> Lease {
        let req = Request::from_canonical_bytes(Scope::new("t", "POST /x"), "k", b"");
        match store.begin(req).unwrap() {
            Begin::Acquired(lease) => lease,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn in_flight_now(store: &Store) -> bool {
        let req = Request::from_canonical_bytes(Scope::new("t", "POST /x"), "k", b"");
        matches!(store.begin(req).unwrap(), Begin::InFlight { .. })
    }

    #[test]
    fn a_recording_that_fails_after_the_handler_ran_lets_the_lease_lapse() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder()
            .max_response_bytes(16)
            .open(dir.path().join("idem.redb"))
            .unwrap();
        // A recording the store refuses (here: over its cap, bypassing `fit_response`).
        let lease = claimed(&store);
        let too_big = Response::new(200, vec![0; 64]);
        assert!(matches!(
            finish_lease(lease, false, too_big),
            Err(Error::ResponseTooLarge { .. })
        ));
        // Not released: a retry is told "in flight" until the lease lapses.
        assert!(in_flight_now(&store));
    }

    #[test]
    fn heartbeat_failures_are_retried_unless_no_retry_mends_them() {
        let io = || redb::Error::Io(std::io::Error::other("disk"));
        let key = || "k".to_owned();
        for e in [
            Error::Busy {
                queued: 1,
                waited: Duration::from_millis(1),
            },
            Error::Aborted {
                source: "retry".into(),
            },
            Error::Storage { source: io() },
        ] {
            assert!(transient(&e), "{e}");
        }
        for e in [
            Error::LeaseLost { key: key() },
            Error::FailStopped {
                cause: "disk".into(),
            },
            Error::OutcomeUnknown {
                source: Arc::new(io()),
            },
            Error::CorruptStore {
                reason: "page".into(),
            },
            Error::CorruptRecord {
                reason: "bytes".into(),
            },
            Error::Internal { what: "bug" },
        ] {
            assert!(!transient(&e), "{e}");
        }
    }

    #[test]
    fn a_slot_dropped_with_its_lease_lets_the_lease_lapse() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("idem.redb")).unwrap();
        let mut lease = claimed(&store);
        lease.lapse_on_drop(true);
        // The handler's task was cancelled with the slot still holding the lease.
        drop(Slot(Mutex::new(Some(lease))));
        assert!(in_flight_now(&store));
    }
}
