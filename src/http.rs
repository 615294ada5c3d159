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
//!   headers or body is `422`.
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
//! by a retry; only a process that died stops heartbeating, and then the lease lapses.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
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
use tower::{Layer, Service};

use crate::{Abort, Begin, Error, Fingerprint, Lease, Request, Response, Scope, Store, Tx};

/// The request header that carries the key.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The response header set on every replayed answer (Stripe's convention).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";
/// The media type of every error the layer produces (RFC 9457).
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The `type` URIs of the problems the layer answers with (RFC 9457 `type` member).
pub mod problem {
    /// 400: a covered request without the key (unless [`super::MissingKey::PassThrough`]).
    pub const MISSING_KEY: &str = "urn:idem:problem:missing-idempotency-key";
    /// 400: the key is empty, too long, or not visible ASCII.
    pub const INVALID_KEY: &str = "urn:idem:problem:invalid-idempotency-key";
    /// 400: the tenant extractor found no tenant.
    pub const MISSING_TENANT: &str = "urn:idem:problem:missing-tenant";
    /// 400: the request body could not be read.
    pub const UNREADABLE_BODY: &str = "urn:idem:problem:unreadable-body";
    /// 413: the request body is over the layer's body limit.
    pub const BODY_TOO_LARGE: &str = "urn:idem:problem:body-too-large";
    /// 409 + `Retry-After`: another request with this key is being processed.
    pub const IN_FLIGHT: &str = "urn:idem:problem:request-in-flight";
    /// 422: the key was used before with a different request.
    pub const KEY_REUSED: &str = "urn:idem:problem:key-reused-with-different-request";
    /// 503 + `Retry-After`: the store is saturated or the handler asked for a retry.
    pub const RETRY: &str = "urn:idem:problem:retry-later";
    /// 500: the store failed; the outcome of this request may be unknown: retry with the key.
    pub const STORE_FAILED: &str = "urn:idem:problem:store-failed";
    /// 500: the handler failed (panicked) before answering; nothing was recorded.
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

#[derive(Clone)]
struct Config {
    store: Store,
    tenant: Arc<PartsFn>,
    operation: Option<Arc<PartsFn>>,
    methods: Vec<Method>,
    key_header: HeaderName,
    fingerprint_headers: Vec<HeaderName>,
    replay_headers: Vec<HeaderName>,
    body_limit: usize,
    missing_key: MissingKey,
    record_status: Arc<StatusFn>,
}

/// The tower [`Layer`]. Build it with [`IdempotencyLayer::new`] (any tenant extractor) or
/// [`IdempotencyLayer::tenant_header`], adjust it with the builder methods, and add it with
/// axum's `Router::route_layer` (so the route template is known) or `ServiceBuilder`.
///
/// Defaults: methods POST, PUT, PATCH, DELETE; key header `Idempotency-Key`; operation
/// `"{METHOD} {route template}"` (the request path when no template is known); fingerprint of
/// method, operation, path and query, and body (no headers); body limit 1 MiB; missing key → 400; replayed
/// headers `Content-Type` and `Location`; every status recorded except 5xx.
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
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer on `store` whose tenant comes from `tenant` (e.g. a header, or the authenticated
    /// principal an earlier layer put in the extensions). `None` answers `400`
    /// ([`problem::MISSING_TENANT`]) on a covered request.
    pub fn new(
        store: Store,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        IdempotencyLayer {
            config: Arc::new(Config {
                store,
                tenant: Arc::new(tenant),
                operation: None,
                methods: vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE],
                key_header: HeaderName::from_static(IDEMPOTENCY_KEY),
                fingerprint_headers: Vec::new(),
                replay_headers: vec![CONTENT_TYPE, LOCATION],
                body_limit: 1024 * 1024,
                missing_key: MissingKey::Reject,
                record_status: Arc::new(|s: StatusCode| !s.is_server_error()),
            }),
        }
    }

    /// A layer whose tenant is the value of the request header `name` (visible ASCII).
    pub fn tenant_header(store: Store, name: &'static str) -> Self {
        let name = HeaderName::from_static(name);
        Self::new(store, move |parts| {
            let v = parts.headers.get(&name)?.to_str().ok()?;
            (!v.is_empty()).then(|| v.to_owned())
        })
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
    /// `"{METHOD} {route template}"`.
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

    /// Which handler statuses are recorded and replayed. The default records everything but
    /// 5xx; a status for which `f` returns false releases the key (nothing stored, the next
    /// retry runs the handler again).
    pub fn record_status(self, f: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.edit(|c| c.record_status = Arc::new(f))
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
    let key = match parts.headers.get(&config.key_header) {
        None => match config.missing_key {
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
        Some(v) => match parse_key(v) {
            Some(k) => k,
            None => {
                return Ok(invalid_key(
                    "the key must be 1 or more visible ASCII characters",
                ));
            }
        },
    };
    let Some(tenant) = (config.tenant)(&parts) else {
        return Ok(problem_response(
            StatusCode::BAD_REQUEST,
            problem::MISSING_TENANT,
            "Tenant required",
            "the request names no tenant; idempotency keys are scoped per tenant",
        ));
    };
    let operation = config
        .operation
        .as_ref()
        .and_then(|f| f(&parts))
        .unwrap_or_else(|| default_operation(&parts));
    let body = match read_body(&parts, body, config.body_limit).await {
        Ok(b) => b,
        Err(resp) => return Ok(resp),
    };
    let fingerprint = fingerprint(&parts, &operation, &config.fingerprint_headers, &body);
    let request = Request::with_fingerprint(Scope::new(tenant, operation), key, fingerprint);

    let store = config.store.clone();
    let begun = match blocking(move || store.begin(request)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Ok(error_response(&e)),
        Err(resp) => return Ok(resp),
    };
    let lease = match begun {
        Begin::Acquired(lease) => lease,
        Begin::Replayed(stored) => return Ok(replay(&stored)),
        Begin::Expired(tombstone) => return Ok(expired(&tombstone)),
        Begin::InFlight { retry_after } => return Ok(in_flight(retry_after)),
    };

    // From here on the handler runs in its own task: once started it finishes, and its answer
    // is recorded, even if this future is dropped (the client went away).
    let every =
        (lease.deadline().saturating_since(config.store.now()) / 3).max(Duration::from_millis(10));
    let request = Arc::new(lease.request().clone());
    let downstream = lease.downstream_key();
    let slot = Arc::new(Slot(Mutex::new(Some(lease))));
    let heartbeat = spawn_heartbeat(&slot, every);
    let mut parts = parts;
    parts.extensions.insert(Idempotency {
        slot: Arc::clone(&slot),
        request,
        downstream,
        replay_headers: config.replay_headers.clone().into(),
        config: Arc::clone(&config),
    });
    let req = http::Request::from_parts(parts, Body::from(body));
    let task = tokio::spawn(async move {
        let answer = call_inner(inner, req).await;
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                release(&slot).await;
                return Err(e);
            }
        };
        Ok(record(&config, &slot, answer.0).await)
    });
    let done = task.await;
    heartbeat.abort();
    match done {
        Ok(result) => result,
        Err(_) => Ok(problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::HANDLER_FAILED,
            "Handler failed",
            "the handler failed before answering; nothing was recorded: retry with the same key",
        )),
    }
}

/// Finishes the lease with the handler's answer (or passes through an answer the handler
/// recorded itself through [`Idempotency::complete_with`]).
async fn record(
    config: &Config,
    slot: &Arc<Slot>,
    resp: http::Response<Body>,
) -> http::Response<Body> {
    let Some(lease) = take_lease(slot).await else {
        // The handler finished the lease itself (or it was released): its answer stands.
        return resp;
    };
    let status = resp.status();
    if !(config.record_status)(status) {
        let _ = blocking(move || lease.release()).await;
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            let _ = blocking(move || lease.release()).await;
            return problem_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                problem::HANDLER_FAILED,
                "Handler failed",
                "the handler's response body failed; nothing was recorded: retry with the same key",
            );
        }
    };
    let stored = stored_response(status, &parts.headers, &config.replay_headers, &bytes);
    // A failure to record (e.g. a response over the store's max_response_bytes, or a lost
    // lease) does not hide the handler's answer: the effect happened. The key is released (the
    // lease is dropped on the blocking pool), so a retry would run the handler again.
    let _ = blocking(move || {
        if status.is_client_error() || status.is_server_error() {
            lease.fail(stored)
        } else {
            lease.complete(stored)
        }
    })
    .await;
    http::Response::from_parts(parts, Body::from(bytes))
}

async fn release(slot: &Arc<Slot>) {
    if let Some(lease) = take_lease(slot).await {
        let _ = blocking(move || lease.release()).await;
    }
}

/// Takes the lease out of its slot on the blocking pool: a heartbeat may hold the slot's lock
/// during a disk write.
async fn take_lease(slot: &Arc<Slot>) -> Option<Lease> {
    let slot = Arc::clone(slot);
    blocking(move || slot.0.lock().take()).await.ok().flatten()
}

/// Extends the lease every `every` while the handler runs, so a handler slower than the
/// store's `lease_duration` is not taken over by a retry (a second concurrent execution).
/// Stops when the lease left its slot (finished or released), or was lost.
fn spawn_heartbeat(slot: &Arc<Slot>, every: Duration) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(slot);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(slot) = weak.upgrade() else {
                return;
            };
            let alive = blocking(move || match slot.0.lock().as_mut() {
                Some(lease) => lease.heartbeat().is_ok(),
                None => false,
            })
            .await;
            if !matches!(alive, Ok(true)) {
                return;
            }
        }
    })
}

/// Owns the lease while the handler runs. If the last reference goes away with the lease
/// still in it (a panicking handler), it is released on the blocking pool, never on a runtime
/// thread.
struct Slot(Mutex<Option<Lease>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(lease) = self.0.get_mut().take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn_blocking(move || drop(lease));
                }
                Err(_) => drop(lease),
            }
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
    replay_headers: Arc<[HeaderName]>,
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
    /// A status the layer records as a failure (4xx) is stored as a terminal failure; a status
    /// the layer would not record (5xx by default) or [`Abort::Retryable`] rolls `f`'s writes
    /// back and releases the key. Returns the HTTP response to send: the answer, or a problem
    /// response when nothing could be recorded. Call it at most once per request; a second
    /// call answers `500`.
    pub async fn complete_with<F>(&self, mut f: F) -> http::Response<Body>
    where
        F: FnMut(&Tx<'_>) -> Result<Recorded, Abort> + Send + 'static,
    {
        let Some(lease) = take_lease(&self.slot).await else {
            return problem_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                problem::STORE_FAILED,
                "Idempotency handle already used",
                "complete_with was called twice for one request",
            );
        };
        let replay_headers = Arc::clone(&self.replay_headers);
        let config = Arc::clone(&self.config);
        let done = blocking(move || {
            let mut answer = None;
            let result = lease.complete_with(|tx| {
                // Only the last (committed) run's answer counts.
                answer = None;
                let r = f(tx)?;
                let stored = stored_response(r.status, &r.headers, &replay_headers, &r.body);
                let status = r.status;
                answer = Some(r);
                if !(config.record_status)(status) {
                    Err(Abort::Retryable(
                        format!("status {status} is not recorded").into(),
                    ))
                } else if status.is_client_error() || status.is_server_error() {
                    Err(Abort::Terminal(stored))
                } else {
                    Ok(stored)
                }
            });
            (result, answer)
        })
        .await;
        match done {
            Ok((Ok(_), Some(r))) => plain_response(r.status, r.headers, r.body),
            // Not recorded because of its status: the handler's answer still goes out.
            Ok((Err(Error::Aborted { .. }), Some(r))) if !(self.config.record_status)(r.status) => {
                plain_response(r.status, r.headers, r.body)
            }
            Ok((Err(e), _)) => error_response(&e),
            Ok((Ok(stored), None)) => replay(&stored),
            Err(resp) => resp,
        }
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

fn parse_key(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?.trim();
    // The draft defines the field as a Structured Field string ("..."); a bare token is
    // accepted too (Stripe's convention).
    let s = s
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s);
    (!s.is_empty()).then(|| s.to_owned())
}

fn default_operation(parts: &Parts) -> String {
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or_else(|| parts.uri.path(), MatchedPath::as_str);
    format!("{} {}", parts.method, route)
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

const ENVELOPE_MAGIC: &[u8; 4] = b"IDH1";

/// The stored form of an HTTP answer: the store keeps a status and opaque bytes, so the
/// replayed headers travel in a small envelope before the body: `"IDH1" ‖ u16be(count) ‖
/// (u16be(len) ‖ name ‖ u32be(len) ‖ value)* ‖ body`. A `Location` header is also kept as
/// the record's resource pointer, so it survives into the tombstone.
fn stored_response(
    status: StatusCode,
    headers: &HeaderMap,
    replay: &[HeaderName],
    body: &[u8],
) -> Response {
    let selected: Vec<(&HeaderName, &HeaderValue)> = replay
        .iter()
        .flat_map(|n| headers.get_all(n).iter().map(move |v| (n, v)))
        .filter(|(n, v)| n.as_str().len() <= usize::from(u16::MAX) && v.len() <= u32::MAX as usize)
        .take(usize::from(u16::MAX))
        .collect();
    let mut out = Vec::with_capacity(8 + body.len());
    out.extend_from_slice(ENVELOPE_MAGIC);
    out.extend_from_slice(&(selected.len() as u16).to_be_bytes());
    for (n, v) in &selected {
        out.extend_from_slice(&(n.as_str().len() as u16).to_be_bytes());
        out.extend_from_slice(n.as_str().as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out.extend_from_slice(body);
    let resp = Response::new(status.as_u16(), out);
    match headers.get(LOCATION).and_then(|v| v.to_str().ok()) {
        Some(loc) => resp.with_resource("location", loc),
        None => resp,
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

/// Decodes [`stored_response`]'s envelope; `None` if it is damaged. A body without the magic
/// (a record written by other code) is replayed as is, without headers.
fn decode_envelope(bytes: &[u8]) -> Option<(HeaderMap, Bytes)> {
    let Some(mut rest) = bytes.strip_prefix(ENVELOPE_MAGIC.as_slice()) else {
        return Some((HeaderMap::new(), Bytes::copy_from_slice(bytes)));
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
    Some((headers, Bytes::copy_from_slice(rest)))
}

/// The HTTP answer for a stored response: its status, body and recorded headers, plus
/// `Idempotent-Replayed: true`.
pub fn replay(stored: &Response) -> http::Response<Body> {
    let Some((headers, body)) = decode_envelope(stored.body()) else {
        return problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Stored answer unreadable",
            "the recorded answer for this key is damaged; an operator can inspect it with `idem get`",
        );
    };
    let status = StatusCode::from_u16(stored.status()).unwrap_or(StatusCode::OK);
    let mut resp = plain_response(status, headers, body);
    resp.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
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
    resp.headers_mut().insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
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

fn invalid_key(detail: &str) -> http::Response<Body> {
    problem_response(
        StatusCode::BAD_REQUEST,
        problem::INVALID_KEY,
        "Invalid Idempotency-Key",
        detail,
    )
}

/// The HTTP answer for a store error (RFC 9457 problem): `PayloadMismatch` → 422; `Empty` /
/// `TooLong` → 400; `Busy` / `Aborted` → 503 + `Retry-After: 1`; anything else → 500.
pub fn error_response(e: &Error) -> http::Response<Body> {
    match e {
        Error::PayloadMismatch { .. } => problem_response(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::KEY_REUSED,
            "Idempotency-Key reused with a different request",
            "this key was first used with a different method, route, headers or body: a new \
             intent needs a new key; a retry must resend the original request",
        ),
        Error::Empty { .. } | Error::TooLong { .. } => invalid_key(&e.to_string()),
        Error::Busy { .. } | Error::Aborted { .. } => {
            let mut resp = problem_response(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::RETRY,
                "Retry later",
                "nothing was recorded; retry with the same key",
            );
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(1u64));
            resp
        }
        _ => problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::STORE_FAILED,
            "Idempotency store failed",
            "the outcome of this request may be unknown: retry with the same key",
        ),
    }
}

/// An RFC 9457 `application/problem+json` response.
pub fn problem_response(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> http::Response<Body> {
    let body = serde_json::json!({
        "type": kind,
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    plain_response(status, headers, Bytes::from(body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_rejects_damage() {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        h.insert("x-other", HeaderValue::from_static("dropped"));
        let stored = stored_response(StatusCode::CREATED, &h, &[CONTENT_TYPE, LOCATION], b"{}");
        let (headers, body) = decode_envelope(stored.body()).unwrap();
        assert_eq!(headers.len(), 1);
        assert_eq!(headers[CONTENT_TYPE], "application/json");
        assert_eq!(&body[..], b"{}");
        for cut in 5..stored.body().len() - 2 {
            // Truncations inside the header block are errors, never panics.
            let _ = decode_envelope(&stored.body()[..cut]);
        }
        assert!(decode_envelope(b"IDH1\x00\x01\x00\x05ab").is_none());
        assert_eq!(&decode_envelope(b"raw").unwrap().1[..], b"raw");
    }

    #[test]
    fn keys_and_retry_after() {
        assert_eq!(
            parse_key(&HeaderValue::from_static("\"abc\"")),
            Some("abc".into())
        );
        assert_eq!(
            parse_key(&HeaderValue::from_static("abc")),
            Some("abc".into())
        );
        assert_eq!(parse_key(&HeaderValue::from_static("\"\"")), None);
        assert_eq!(retry_after_secs(Duration::from_millis(0)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(300)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
    }
}
