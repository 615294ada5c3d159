//! The tower [`Layer`]: [`IdempotencyLayer`], its configuration and builder methods (with their
//! documented defaults), and the one place a handler's status is judged ([`disposition`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::{CONTENT_TYPE, HeaderName, LOCATION};
use http::request::Parts;
use http::{Method, StatusCode};
use tower::Layer;

use super::key::IDEMPOTENCY_KEY;
use super::metrics::{Counters, LayerMetrics};
use super::service::IdempotencyService;
use crate::Store;
use crate::asynchronous::AsyncStore;
use crate::backend::Backend;

/// What to do with a covered request that carries no key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingKey {
    /// Answer `400` with [`problem::MISSING_KEY`](super::problem::MISSING_KEY) (default).
    #[default]
    Reject,
    /// Call the handler without any idempotency handling.
    PassThrough,
}

type PartsFn = dyn Fn(&Parts) -> Option<String> + Send + Sync;

type StatusFn = dyn Fn(StatusCode) -> bool + Send + Sync;

type BodyFn = dyn Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync;

type KeyFn = dyn Fn(&Parts, &[u8]) -> Option<String> + Send + Sync;

type ReplayFn = dyn Fn(&Parts, &mut http::Response<axum::body::Body>) + Send + Sync;

/// What of the body binds the key (the body part of the request fingerprint).
#[derive(Clone, Default)]
pub(super) enum BodyFingerprint {
    /// The body's RFC 8785 canonical JSON when the request's `Content-Type` labels it JSON
    /// (`application/json`, `application/*+json`) and it has one; otherwise the bytes as sent
    /// (default).
    #[default]
    ByContentType,
    /// The bytes as sent, whatever the `Content-Type` ([`IdempotencyLayer::raw_body`]).
    Raw,
    /// The body's RFC 8785 canonical JSON whatever the `Content-Type`, when it has one
    /// ([`IdempotencyLayer::canonical_json_body`]).
    CanonicalJson,
    /// The bytes the caller's function picks ([`IdempotencyLayer::fingerprint_body_with`]).
    Custom(Arc<BodyFn>),
}

/// Where the tenant comes from.
#[derive(Clone)]
pub(super) enum TenantSource {
    /// One field line of this header ([`IdempotencyLayer::tenant_header`]).
    Header(HeaderName),
    /// The caller's extractor ([`IdempotencyLayer::new`]).
    Extract(Arc<PartsFn>),
    /// [`IdempotencyLayer::tenant_header`] was given this, which is not a header name: every
    /// covered request is answered `500` ([`problem::MISCONFIGURED`](super::problem::MISCONFIGURED)) rather than a panic.
    BadHeaderName(String),
}

pub(super) struct Config<B: Backend> {
    pub(super) store: B,
    pub(super) tenant: TenantSource,
    pub(super) operation: Option<Arc<PartsFn>>,
    pub(super) methods: Vec<Method>,
    pub(super) key_header: HeaderName,
    pub(super) fingerprint_headers: Vec<HeaderName>,
    pub(super) replay_headers: Vec<HeaderName>,
    pub(super) body_limit: usize,
    pub(super) missing_key: MissingKey,
    pub(super) record_status: Arc<StatusFn>,
    pub(super) body_fingerprint: BodyFingerprint,
    /// Where the key comes from when the key header is absent.
    pub(super) key_from: Option<Arc<KeyFn>>,
    /// Called on every replayed (or expired) answer before it is sent.
    pub(super) on_replay: Option<Arc<ReplayFn>>,
    /// The async face the layer's admissions (`begin`) go through: its bound on admissions in
    /// flight is the layer's `max_in_flight`, shared by the layer's clones.
    pub(super) calls: AsyncStore<B>,
    pub(super) counters: Arc<Counters>,
}

impl<B: Backend> Clone for Config<B> {
    fn clone(&self) -> Self {
        Config {
            store: self.store.clone(),
            tenant: self.tenant.clone(),
            operation: self.operation.clone(),
            methods: self.methods.clone(),
            key_header: self.key_header.clone(),
            fingerprint_headers: self.fingerprint_headers.clone(),
            replay_headers: self.replay_headers.clone(),
            body_limit: self.body_limit,
            missing_key: self.missing_key,
            record_status: Arc::clone(&self.record_status),
            body_fingerprint: self.body_fingerprint.clone(),
            key_from: self.key_from.clone(),
            on_replay: self.on_replay.clone(),
            calls: self.calls.clone(),
            counters: Arc::clone(&self.counters),
        }
    }
}

/// The tower [`Layer`]. Build it with [`IdempotencyLayer::new`] (any tenant extractor) or
/// [`IdempotencyLayer::tenant_header`], adjust it with the builder methods, and add it with
/// axum's `Router::route_layer` (so the route template is known) or `ServiceBuilder`.
///
/// Defaults: methods POST, PUT, PATCH, DELETE; key header `Idempotency-Key`; operation
/// `"{METHOD} {route template}"` (the request path when no template is known); fingerprint of
/// method, operation, path and query, and body (no headers), a body labelled JSON
/// (`Content-Type: application/json` or `application/*+json`) compared as JSON (its RFC 8785
/// canonical form, [`raw_body`](Self::raw_body) to compare bytes); body limit 1 MiB; missing key →
/// 400; replayed headers `Content-Type` and `Location`; every status recorded except 503 (4xx
/// and other 5xx as a terminal failure); at most the store's `max_queue`, and at most 256, store
/// admissions in flight.
///
/// Clones of a layer share its in-flight limit and its [`LayerMetrics`]; a builder method
/// called on one clone changes only that clone's settings ([`IdempotencyLayer::max_in_flight`]
/// gives it a limit of its own).
///
/// The layer runs on any [`Backend`]: the file store ([`Store`], the default type) or, with the
/// `postgres` feature, `idem::postgres::PgStore` for a fleet of replicas sharing one database
/// (`IdempotencyLayer::tenant_header(pg_store, "x-tenant-id")`); its behaviour is the same.
///
/// # Example
///
/// An axum route behind the layer, driven through tower's `Service::call` (no socket). The retry of a
/// request whose answer was lost gets the recorded answer without running the handler; the
/// same key with another body is refused.
///
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use axum::Router;
/// use axum::body::{Body, to_bytes};
/// use axum::http::{Request, StatusCode};
/// use axum::routing::post;
/// use idem::http::IdempotencyLayer;
/// use tower::Service; // a Router is always ready: `call` it directly
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
/// #   let dir = tempfile::tempdir()?;
///     let store = idem::Store::open(dir.path().join("idem.redb"))?;
///     let orders = Arc::new(AtomicU32::new(0));
///     let counter = Arc::clone(&orders);
///     let app = Router::new()
///         .route("/v1/orders", post(move |body: String| async move {
///             let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
///             (StatusCode::CREATED, format!("order {n}: {body}"))
///         }))
///         // `route_layer`: the layer sees the route template, part of the operation.
///         .route_layer(IdempotencyLayer::tenant_header(store, "x-tenant-id"));
///
///     let post_order = |key: &str, body: &'static str| {
///         Request::post("/v1/orders")
///             .header("x-tenant-id", "tenant-42")
///             .header("idempotency-key", key)
///             .body(Body::from(body))
///     };
///
///     let first = app.clone().call(post_order("k-1", "2 x sku-1")?).await?;
///     assert_eq!(first.status(), StatusCode::CREATED);
///     let first_body = to_bytes(first.into_body(), 1 << 20).await?;
///
///     let retry = app.clone().call(post_order("k-1", "2 x sku-1")?).await?;
///     assert_eq!(retry.status(), StatusCode::CREATED);
///     assert_eq!(retry.headers()["idempotent-replayed"], "true");
///     assert_eq!(to_bytes(retry.into_body(), 1 << 20).await?, first_body);
///     assert_eq!(orders.load(Ordering::SeqCst), 1); // the handler ran once
///
///     let reused = app.clone().call(post_order("k-1", "9 x sku-1")?).await?;
///     assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
///     assert_eq!(orders.load(Ordering::SeqCst), 1);
/// #   Ok::<(), Box<dyn std::error::Error>>(())
/// # })
/// # }
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer<B: Backend = Store> {
    config: Arc<Config<B>>,
}

impl<B: Backend> std::fmt::Debug for IdempotencyLayer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("methods", &self.config.methods)
            .field("key_header", &self.config.key_header)
            .field("body_limit", &self.config.body_limit)
            .field("missing_key", &self.config.missing_key)
            .field("max_in_flight", &self.config.calls.max_in_flight())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> IdempotencyLayer<B> {
    /// A layer on `store` whose tenant comes from `tenant` (e.g. the authenticated principal an
    /// earlier layer put in the extensions). `None` answers `400` ([`problem::MISSING_TENANT`](super::problem::MISSING_TENANT))
    /// on a covered request; an empty tenant or one over the store's tenant limit answers `400`
    /// ([`problem::INVALID_TENANT`](super::problem::INVALID_TENANT)), before the body is read.
    pub fn new(
        store: B,
        tenant: impl Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        Self::with_tenant(store, TenantSource::Extract(Arc::new(tenant)))
    }

    /// A layer whose tenant is the value of the request header `name` (in any case:
    /// `X-Tenant-Id` is `x-tenant-id`): exactly one field line of visible ASCII without commas
    /// (`A, B` is what an intermediary makes of two lines), at most the store's tenant limit
    /// ([`tenant_from_header`](super::tenant_from_header), which a service's own extractor can share). No such header
    /// answers `400` ([`problem::MISSING_TENANT`](super::problem::MISSING_TENANT)); two lines or a bad value answers `400`
    /// ([`problem::INVALID_TENANT`](super::problem::INVALID_TENANT)).
    ///
    /// A `name` that is not a valid header name (empty, or with a character outside RFC 9110's
    /// token characters, e.g. a space or `:`) does not panic: the layer answers every covered
    /// request `500` ([`problem::MISCONFIGURED`](super::problem::MISCONFIGURED)) without running the handler, so the mistake
    /// shows at the first request.
    pub fn tenant_header(store: B, name: &str) -> Self {
        // `from_bytes` lowercases; it refuses only what is no header name in any case.
        let source = match HeaderName::from_bytes(name.as_bytes()) {
            Ok(header) => TenantSource::Header(header),
            Err(_) => TenantSource::BadHeaderName(name.to_owned()),
        };
        Self::with_tenant(store, source)
    }

    fn with_tenant(store: B, tenant: TenantSource) -> Self {
        // The face's default bound: the store's `max_queue`, at most 256 (half of tokio's default
        // blocking pool: every admission occupies a blocking thread while it waits, and the
        // calls that finish started requests — recordings, heartbeats — must still find one).
        let calls = AsyncStore::new(store.clone());
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
                body_fingerprint: BodyFingerprint::ByContentType,
                key_from: None,
                on_replay: None,
                calls,
                counters: Arc::default(),
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Config<B>)) -> Self {
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
    /// `500` ([`problem::INVALID_OPERATION`](super::problem::INVALID_OPERATION)): a configuration error.
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

    /// Compares every body by its bytes as sent, also a body labelled JSON.
    ///
    /// By default a body labelled JSON (`Content-Type: application/json` or
    /// `application/*+json`, parameters ignored) is compared as JSON, by its RFC 8785 canonical
    /// form: the same JSON re-serialised (members reordered, other whitespace) is the same
    /// request and is replayed. With `raw_body` it is another request (`422`): for a service
    /// whose clients must resend the original bytes. A stored format: turning it on or off
    /// changes the fingerprint of every request labelled JSON, so retries of intents recorded
    /// before the change answer `422` until their records are forgotten (docs/HTTP.md).
    pub fn raw_body(self) -> Self {
        self.edit(|c| c.body_fingerprint = BodyFingerprint::Raw)
    }

    /// Compares every body that is JSON as JSON (its RFC 8785 canonical form: members sorted,
    /// no insignificant whitespace, one notation per number), **whatever its `Content-Type`**:
    /// for clients that send JSON unlabelled (no `Content-Type`, `text/plain`). The default does
    /// this for a body labelled JSON only. As by default, a body without a canonical form that
    /// keeps its values — not JSON, a member name twice, a number RFC 8785 would round
    /// (`9007199254740993`, `1e-400`) — is compared by its bytes (docs/HTTP.md). A stored
    /// format, like [`raw_body`](Self::raw_body): turning it on or off changes the fingerprint
    /// of every JSON request not labelled JSON. Trade-off: values JSON does not tell apart bind
    /// to one key (`1.0` and `1`, `-0` and `0`, `"\u00e9"` and `"é"`), also in a body labelled
    /// otherwise.
    pub fn canonical_json_body(self) -> Self {
        self.edit(|c| c.body_fingerprint = BodyFingerprint::CanonicalJson)
    }

    /// Fingerprints the bytes `f` picks from the body (and the request's parts) instead of the
    /// whole body — the role of AWS Powertools' `payload_validation_jmespath`: e.g. only the
    /// fields that define the intent, so a retry that changes a field outside them (a client
    /// timestamp, a trace id) is still replayed, while a different amount is still 422. What `f`
    /// leaves out no longer binds the key: a retry that differs only there gets the first
    /// answer. Method, operation, path, query and `fingerprint_headers` still count; the body's
    /// `Content-Type` does not (`f` sees the parts and decides). A stored format, like
    /// [`raw_body`](Self::raw_body).
    pub fn fingerprint_body_with(
        self,
        f: impl Fn(&Parts, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) -> Self {
        self.edit(|c| c.body_fingerprint = BodyFingerprint::Custom(Arc::new(f)))
    }

    /// Where the key comes from when a request has no key header — the role of AWS
    /// Powertools' `event_key_jmespath`: `f` gets the request's parts and its body (read within
    /// [`body_limit`](Self::body_limit)) and returns the key, e.g. a message id inside the JSON
    /// body. The key is checked like a header's (visible ASCII, within the store's key limit:
    /// otherwise `400`); `None` is a missing key ([`missing_key`](Self::missing_key)). A key
    /// header, when present, always wins. The key must name the intent, never the attempt (a
    /// field that differs on a retry makes every retry a new intent).
    pub fn key_from_request(
        self,
        f: impl Fn(&Parts, &[u8]) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.edit(|c| c.key_from = Some(Arc::new(f)))
    }

    /// Calls `f` with the request's parts and the answer on every replayed answer (and every
    /// "already done" answer of an expired intent) before it is sent — the role of AWS
    /// Powertools' `response_hook`: add a header, log, count. It does not run on a first
    /// answer. `f` must not panic (a panic is the service's, as in a handler).
    pub fn on_replay(
        self,
        f: impl Fn(&Parts, &mut http::Response<axum::body::Body>) + Send + Sync + 'static,
    ) -> Self {
        self.edit(|c| c.on_replay = Some(Arc::new(f)))
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

    /// The most store admissions (the claim of a key, [`Backend::begin`]) this layer and its
    /// clones run at once (at least 1). The default is the store's `max_queue`, at most 256:
    /// half of tokio's default blocking pool (512 threads), because each admission occupies a
    /// blocking thread while it waits for the store, and the calls that finish started requests
    /// (recording their answers, heartbeats) must still find threads — queued behind surplus
    /// admissions they could be delayed past their lease deadline. A larger limit wants a
    /// blocking pool (`max_blocking_threads`) of at least twice its size. A covered
    /// request that finds them all busy is answered `503` + `Retry-After: 1`
    /// ([`problem::RETRY`](super::problem::RETRY)) at once, without waiting and without running the handler, and
    /// counted in [`LayerMetrics::overloaded`]. Store calls after the handler ran (recording
    /// its answer, heartbeats) are not counted against the limit and are never refused, so a
    /// started request always records.
    pub fn max_in_flight(self, n: usize) -> Self {
        self.edit(|c| c.calls = c.calls.clone().with_max_in_flight(n))
    }

    /// A snapshot of this layer's counters (shared with its clones and the services they
    /// built).
    pub fn metrics(&self) -> LayerMetrics {
        let c = &self.config.counters;
        let max = self.config.calls.max_in_flight();
        LayerMetrics {
            bodies_not_kept: c.bodies_not_kept.load(Ordering::Relaxed),
            overloaded: c.overloaded.load(Ordering::Relaxed),
            handler_failures: c.handler_failures.load(Ordering::Relaxed),
            not_recorded: c.not_recorded.load(Ordering::Relaxed),
            heartbeat_failures: c.heartbeat_failures.load(Ordering::Relaxed),
            in_flight: self.config.calls.in_flight(),
            max_in_flight: max,
        }
    }
}

impl<S, B: Backend> Layer<S> for IdempotencyLayer<B> {
    type Service = IdempotencyService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

/// What the layer does with a handler's answer, decided by its status alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Disposition {
    /// Record it: as a terminal failure (`fail_stop_cause`: 4xx, 5xx) or as completed (the rest).
    Record {
        /// Stored with the lease's `fail` rather than its `complete`.
        failure: bool,
    },
    /// Record nothing and release the key: a status `record_status` excludes (503 by
    /// default), which says no effect happened.
    Release,
}

/// The one place a status is judged: the user's `record_status` policy, then failure or not.
pub(super) fn disposition<B: Backend>(config: &Config<B>, status: StatusCode) -> Disposition {
    if !(config.record_status)(status) {
        Disposition::Release
    } else {
        Disposition::Record {
            failure: status.is_client_error() || status.is_server_error(),
        }
    }
}
