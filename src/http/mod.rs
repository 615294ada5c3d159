//! The HTTP face (feature `http`): a tower [`Layer`](tower::Layer) that makes any
//! axum/hyper/tower service honour the `Idempotency-Key` request header.
//!
//! The header is an IETF draft (draft-ietf-httpapi-idempotency-key-header); the contract below
//! is ours, documented in `docs/HTTP.md`.
//!
//! ```
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
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! #     let dir = tempfile::tempdir()?;
//! #     let _app = app(idem::Store::open(dir.path().join("idem.redb"))?);
//! #     Ok(())
//! # }
//! ```
//!
//! A request through it, its retry and a reused key: [`IdempotencyLayer`]'s example.
//!
//! # What the layer guarantees, and what it does not
//!
//! For a covered request (an unsafe method — POST, PUT, PATCH, DELETE by default — carrying the
//! key) the layer claims the key with a fenced lease ([`Store::begin`](crate::Store::begin), flow B) **before** the
//! handler runs, and finishes the lease with the handler's answer after. So:
//!
//! - **at most one concurrent execution per (tenant, operation, key)**: a second request while
//!   the first runs gets `409` + `Retry-After`; the handler is not called;
//! - **replay of the stored answer**: once recorded, every retry gets the stored status, body
//!   and the configured headers, plus `Idempotent-Replayed: true`, without calling the handler;
//! - **a key is bound to its request**: the same key with a different method, route, selected
//!   headers or body is `422`; a body labelled JSON (`application/json`, `application/*+json`)
//!   is compared as JSON (RFC 8785: member order and whitespace do not count), other bodies
//!   byte for byte ([`IdempotencyLayer::raw_body`] compares every body byte for byte);
//! - **one key, one field line**: the key is exactly one `Idempotency-Key` field line holding a
//!   Structured Field string (`"abc"`) or a bare key (`abc`, visible ASCII without `"` `,` `;`
//!   `\` or whitespace); two lines, a list, parameters or a malformed value is `400` (see
//!   `docs/HTTP.md` for the grammar). Key, tenant and operation are checked against the store's
//!   [`crate::store::Limits`] before the body is read;
//! - **once the handler ran, the key never runs it again** for the record's lifetime: an answer
//!   over the store's `max_response_bytes` is recorded without its body and replayed with
//!   [`IDEMPOTENT_BODY_OMITTED`]; a handler that panics, whose response body fails, or whose
//!   inner service returns `Err` is recorded as a terminal `500` ([`problem::HANDLER_FAILED`]);
//!   if recording itself fails, the lease is left to lapse, never released. Every status is
//!   recorded except `503` (and what the user excludes with
//!   [`IdempotencyLayer::record_status`]): only such a status releases the key, and, for a
//!   handler that records through [`IdempotencyHandle::complete_with`], a transaction that rolled
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
//! transaction as its writes, through the [`IdempotencyHandle`] handle the layer puts in the request
//! extensions ([`IdempotencyHandle::complete_with`]); the layer then passes that answer through.
//! `examples/edge_service/` does this for payments.
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
//!
//! # Where each part lives
//!
//! | file | responsibility |
//! |---|---|
//! | `layer.rs` | [`IdempotencyLayer`]: configuration, builder, defaults; how a status is judged |
//! | `service.rs` | [`IdempotencyService`]: the request flow (admit → read path → lease → handler → record) |
//! | `admit.rs` | a covered request's key, tenant, operation and body, checked before the store is asked |
//! | `key.rs` | the `Idempotency-Key` grammar |
//! | `tenant.rs` | the tenant rule ([`tenant_from_header`], [`InvalidTenant`]) |
//! | `fingerprint.rs` | the `idem-http-v1` request [`request_fingerprint`] (a stored format) |
//! | `json.rs` | whether a body is labelled JSON (its `Content-Type`), and its RFC 8785 canonical form |
//! | `envelope.rs` | the `IDH1` / `IDH2` envelope of a stored answer (a stored format) and its fitting into the cap |
//! | `replay.rs` | the HTTP answer of a stored response ([`replay`]) or a tombstone ([`expired`]) |
//! | `lease.rs` | the lease held while a handler runs: heartbeats, finishing; store calls off the runtime |
//! | `handle.rs` | [`IdempotencyHandle`], the handler's handle, and [`IdempotencyHandle::complete_with`] |
//! | `problem.rs`, `answers.rs` | the RFC 9457 problem `type`s ([`problem`]) and the answers the layer makes itself |
//! | `metrics.rs` | [`LayerMetrics`] and the counters behind it |
//! | `whitebox.rs` | NOT PUBLIC API (`__internal_whitebox`): the parsers above, for idem's fuzz targets |
//!
//! The two stored formats are described in `docs/FORMAT.md` ("HTTP layer formats") and pinned
//! by `integration/tests/http/http_formats_are_pinned.rs`.

mod admit;
mod answers;
mod envelope;
mod fingerprint;
mod handle;
mod json;
mod key;
mod layer;
mod lease;
mod metrics;
/// The `type` URIs of the problems the layer answers with (RFC 9457 `type` member).
pub mod problem;
mod replay;
mod service;
mod tenant;
/// NOT PUBLIC API (feature `__internal_whitebox`): the header and body parsers, for idem's own
/// fuzz targets (`tests/sim/header_parsers.rs`).
#[doc(hidden)]
#[cfg(feature = "__internal_whitebox")]
pub mod whitebox;

pub use crate::backend::{Backend, BackendLease};
pub use answers::{PROBLEM_JSON, error_response, problem_response};
pub use fingerprint::request_fingerprint;
pub use handle::{IdempotencyHandle, Recorded};
pub use key::IDEMPOTENCY_KEY;
pub use layer::{IdempotencyLayer, MissingKey};
pub use metrics::LayerMetrics;
pub use replay::{IDEMPOTENT_BODY_OMITTED, IDEMPOTENT_REPLAYED, expired, replay};
pub use service::{IdempotencyService, ResponseFuture};
pub use tenant::{InvalidTenant, tenant_from_header};
