//! A small payments service on the `Idempotency-Key` layer, on one embedded store file, or
//! (`--postgres URL`) on a PostgreSQL database shared by several replicas.
//!
//! ```text
//! cargo run --release --example edge_service --features http [-- --help]
//! ```
//!
//! Flags (`--help` lists them): `--data DIR` (default `./data`, the store is `DIR/idem.redb`),
//! or `--postgres URL` (feature `postgres`: a fleet of replicas on one database, in schema
//! `--pg-schema`, default `edge_service`),
//! `--listen ADDR` (default `127.0.0.1:8080`), `--lease-ms` (default 30000: how long a request
//! cut off by a crash blocks its key), `--header-timeout-ms` (10000), `--body-timeout-ms`
//! (10000), `--request-timeout-ms` (30000) and `--grace-ms` (10000), see [`Timeouts`].
//! Exit status: 0 after a clean stop, 1 when it cannot start (e.g. a busy port: the message names
//! the flag to change), 2 for a bad command line, 3 when the shutdown grace period ran out.
//!
//! - `POST /v1/payments` (`X-Tenant-Id`, `Idempotency-Key`, JSON `{"account", "amount",
//!   "currency"}`; `amount` in minor units, from 1 to [`MAX_AMOUNT`]) → 201 with the payment;
//! - `GET /v1/payments/{id}` → 200 with the payment as it is now (e.g. refunded), 404 if absent;
//! - `POST /v1/payments/{id}/refund` (`Idempotency-Key`) → 200, marks it refunded;
//! - `GET /v1/ledger` → 200 `{"entries", "total"}` for the tenant, so a client can count effects;
//! - `GET /v1/outbox` → 200 `{"pending", "dead", "delivered", "truncated"}` for the tenant:
//!   its events not yet delivered, its dead letters, and its events this process delivered
//!   since it started;
//! - `GET /v1/health` → 200 `{"status": "ok"}`, or 503 problem+json once the store stopped
//!   after an I/O failure (the service also logs that failure once, on stderr).
//!
//! Every request except the health check names its tenant (`X-Tenant-Id`) and sees only that tenant's data. Every error
//! the service answers is an RFC 9457 `application/problem+json` document with `type`,
//! `title`, `status` and `detail`: the layer's (`urn:idem:problem:*`) and the service's own
//! ([`problem`]), including unknown routes, wrong methods and timeouts. (hyper's automatic
//! answers to requests that are not HTTP at all, e.g. a malformed request line, have no body.)
//!
//! **Why the POST handlers record their own answer.** The layer claims the key with a lease
//! before the handler runs; a handler that wrote in a transaction of its own would leave a gap
//! where a crash after its write and before the layer recorded the answer lets a retry book the
//! payment twice. So both POST handlers write the payment row and its ledger entry *inside*
//! the transaction that records the answer ([`Idempotency::complete_with`]), together with an
//! outbox event (topic `payments`, ordering key = the payment id, payload = the payment JSON,
//! headers `type` = `payment.captured` / `payment.refunded` and `tenant`): a kill -9 at any
//! moment either leaves the effect, its event and the answer, or none of them (the lease lapses
//! and the retry runs once, pushing the event once). The layer still does everything else: key
//! and tenant extraction, the fingerprint, 400/409/413/422 problems, replays with
//! `Idempotent-Replayed: true`.
//!
//! **Money.** Amounts are `i64` minor units; one payment is 1 to [`MAX_AMOUNT`], and every sum
//! is checked: a booking that would take the tenant's running total ([`LEDGER_TOTALS`]) out of
//! `i64` is refused with 422, and `GET /v1/ledger` answers a problem rather than a wrong
//! (saturated or wrapped) total.
//!
//! `main` also starts the outbox dispatcher ([`start_dispatcher`]); its publisher stands in for
//! a broker and prints each event on stdout (`published seq=… id=… topic=payments tenant=… key=pay_…`).
//! Delivery is at least once: after a kill -9 an event may be printed again, with the same id.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use idem::http::{
    Backend, BackendLease, Idempotency, IdempotencyLayer, PROBLEM_JSON, Recorded, problem_response,
};
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, Event, OutboxEvent, Publisher,
};
use idem::redb::{ReadableTable, TableDefinition};
use idem::{Abort, Store, Tx};
use serde_json::{Value, json};

/// Payment id → the payment as JSON (it carries its tenant).
pub const PAYMENTS: TableDefinition<&str, &str> = TableDefinition::new("payments");
/// `"{tenant}\0{entry id}"` → signed amount. One entry per capture and per refund.
pub const LEDGER: TableDefinition<&str, i64> = TableDefinition::new("ledger");
/// Tenant → the sum of its ledger entries, written in the transaction that writes each entry
/// (checked arithmetic: an entry that would take it out of `i64` is refused, never saturated).
pub const LEDGER_TOTALS: TableDefinition<&str, i64> = TableDefinition::new("ledger_totals");

/// The largest amount of one payment, in minor units: 10^12 (ten billion in a currency with
/// cents). Amounts are integers from 1 to this; anything else is answered 422.
pub const MAX_AMOUNT: i64 = 1_000_000_000_000;

/// At most this many undelivered events, and this many dead letters, are scanned to count a
/// tenant's outbox (`"truncated": true` when there were more).
pub const OUTBOX_SCAN: usize = 10_000;

const TENANT: &str = "x-tenant-id";

/// Problem types of the service's own errors (the layer's are `urn:idem:problem:*`).
pub mod problem {
    /// No route for this path.
    pub const NOT_FOUND: &str = "urn:edge-service:problem:not-found";
    /// The route exists, the method does not.
    pub const METHOD_NOT_ALLOWED: &str = "urn:edge-service:problem:method-not-allowed";
    /// No payment with this id for this tenant.
    pub const NO_SUCH_PAYMENT: &str = "urn:edge-service:problem:no-such-payment";
    /// The payment body is not valid JSON of the expected shape, or a field is invalid.
    pub const INVALID_PAYMENT: &str = "urn:edge-service:problem:invalid-payment";
    /// The amount is outside 1..=`MAX_AMOUNT`.
    pub const AMOUNT_OUT_OF_RANGE: &str = "urn:edge-service:problem:amount-out-of-range";
    /// The tenant's ledger total would not fit in an `i64`.
    pub const LEDGER_OUT_OF_RANGE: &str = "urn:edge-service:problem:ledger-total-out-of-range";
    /// `X-Tenant-Id` sent more than once, or not a tenant the layer takes (empty, over the
    /// store's tenant limit, not visible ASCII, or with a comma: `idem::http::tenant_from_header`).
    pub const INVALID_TENANT: &str = "urn:edge-service:problem:invalid-tenant";
    /// A path parameter could not be read.
    pub const INVALID_PATH: &str = "urn:edge-service:problem:invalid-path";
    /// The request took longer than `--request-timeout-ms`.
    pub const TIMEOUT: &str = "urn:edge-service:problem:request-timeout";
    /// Reading the store failed.
    pub const READ_FAILED: &str = "urn:edge-service:problem:read-failed";
    /// The store stopped after an I/O failure (`GET /v1/health`): restart the service.
    pub const STORE_FAILED: &str = "urn:edge-service:problem:store-failed";
}

/// The request body of `POST /v1/payments`.
#[derive(serde::Deserialize)]
struct NewPayment {
    account: String,
    amount: i64,
    currency: String,
}

/// Events of each tenant that this process handed to the broker (here: stdout), shared by the
/// dispatcher's publisher and `GET /v1/outbox`.
#[derive(Clone, Default)]
pub struct Delivered(Arc<Mutex<HashMap<String, u64>>>);

impl Delivered {
    fn add(&self, tenant: &str) {
        // A poisoned lock only means a panic while counting: the map is still usable.
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry(tenant.to_owned()).or_default() += 1;
    }

    fn of(&self, tenant: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(tenant).copied().unwrap_or(0)
    }
}

struct AppState<E> {
    store: E,
    delivered: Delivered,
}

impl<E: Clone> Clone for AppState<E> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            delivered: self.delivered.clone(),
        }
    }
}

/// The transaction handle a handler writes through on engine `E` (`&Tx` on the file store,
/// `&mut PgTx` on PostgreSQL).
pub type TxOf<'t, E> = <<E as Backend>::Lease as BackendLease>::Tx<'t>;

/// What the service needs of its store besides the layer's [`Backend`]: its reads and its
/// dispatcher. Implemented by the file store ([`Store`]) and, with the `postgres` feature, by
/// `idem::postgres::PgStore` (its tables in the store's schema, see `pg`).
pub trait Engine: Backend {
    /// The stored row of payment `id` (`{"tenant", "payment"}` as JSON), if any.
    fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError>;
    /// The tenant's ledger: its number of entries and their sum (`None` if it leaves `i64`).
    fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError>;
    /// The oldest `limit` undelivered events.
    fn pending_events(&self, limit: usize) -> Result<Vec<OutboxEvent>, idem::Error>;
    /// The oldest `limit` dead letters.
    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error>;
    /// Starts the store's outbox dispatcher.
    fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, idem::Error>;
    /// The failure the store stopped after, if it did (the file store's fail-stop: every write
    /// fails until the service restarts). `None` by default: an engine without a latch.
    fn failure(&self) -> Option<String> {
        None
    }
}

/// The bookings a handler makes inside the transaction that records its answer: implemented
/// for each engine's transaction handle, so the payment logic ([`capture`], [`refund`]) is
/// written once.
pub trait Books {
    /// The tenant's ledger total (0 for a new tenant), locked for this transaction.
    fn total(&mut self, tenant: &str) -> Result<i64, Abort>;
    /// The stored row of payment `id`.
    fn payment(&mut self, id: &str) -> Result<Option<String>, Abort>;
    /// Stores the row of payment `id`.
    fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort>;
    /// Books the tenant's ledger entry `entry` (`{payment id}:capture`, `…:refund`) of `amount`
    /// and sets the tenant's total to `total`.
    fn book(&mut self, tenant: &str, entry: &str, amount: i64, total: i64) -> Result<(), Abort>;
    /// Pushes an outbox event.
    fn push(&mut self, event: Event) -> Result<(), Abort>;
}

/// The service's router on `store`: what `main` serves (inside [`with_timeouts`]), and what
/// the tests drive in-process. `delivered` is shared with [`start_dispatcher`].
pub fn app<E: Engine>(store: E, delivered: Delivered) -> Router
where
    for<'t> TxOf<'t, E>: Books,
{
    // `route_layer`: only matched routes are covered, and the layer sees the route template
    // (`POST /v1/payments/{id}/refund`), so the operation does not depend on the id.
    let idempotent = IdempotencyLayer::tenant_header(store.clone(), TENANT);
    Router::new()
        .route("/v1/payments", post(create_payment::<E>))
        .route("/v1/payments/{id}/refund", post(refund_payment::<E>))
        .route("/v1/payments/{id}", get(get_payment::<E>))
        .route("/v1/ledger", get(ledger::<E>))
        .route("/v1/outbox", get(outbox::<E>))
        .route_layer(idempotent)
        .route("/v1/health", get(health::<E>))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(AppState { store, delivered })
}

/// Slow-client limits and the shutdown grace period.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A client must send a request's complete headers within this time once the connection
    /// waits for a request (a new connection, or an idle keep-alive one), or the connection is
    /// closed (hyper's `header_read_timeout`; `axum::serve` gives hyper no timer, so it is off
    /// there).
    pub header: Duration,
    /// The whole body must arrive within this time after the headers; a body still incomplete
    /// then fails, and the layer answers 400 (tower-http's `RequestBodyDeadlineLayer`: a
    /// deadline on the whole transfer, so a client trickling one byte at a time is cut off too).
    pub body: Duration,
    /// The whole request (body, store, handler) gets this long before the service answers 503
    /// + `Retry-After` ([`with_timeouts`]).
    pub request: Duration,
    /// On SIGTERM / ctrl-c: how long requests in flight may take to finish before they are
    /// cut off ([`serve`]).
    pub grace: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header: Duration::from_secs(10),
            body: Duration::from_secs(10),
            request: Duration::from_secs(30),
            grace: Duration::from_secs(10),
        }
    }
}

/// `app` with the body deadline and the overall request timeout of `timeouts`.
pub fn with_timeouts(app: Router, timeouts: &Timeouts) -> Router {
    // `Router::layer` covers every route and the fallbacks; the last layer added is the
    // outermost. The body deadline starts when the request enters it, right after its headers.
    app.layer(tower_http::timeout::RequestBodyDeadlineLayer::new(
        timeouts.body,
    ))
    .layer(axum::middleware::from_fn_with_state(
        timeouts.request,
        request_deadline,
    ))
}

/// Answers 503 + `Retry-After` when the request takes longer than `limit`.
///
/// This only stops *waiting*: it does not cancel a payment that already started. The
/// Idempotency-Key layer runs the handler in a task of its own once it claimed the key, so a
/// started handler finishes and its answer is recorded after this timeout answered. The detail
/// says so: a retry with the same key gets that answer (or 409 while it is still running), and
/// never books a second payment.
async fn request_deadline(State(limit): State<Duration>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => {
            let mut resp = problem_response(
                StatusCode::SERVICE_UNAVAILABLE,
                problem::TIMEOUT,
                "Request timed out",
                &format!(
                    "no answer within {} ms; a payment that had started still completes: \
                     retry with the same Idempotency-Key to get its answer",
                    limit.as_millis()
                ),
            );
            resp.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(1u64));
            resp
        }
    }
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// Every request in flight finished within the grace period.
    Drained,
    /// The grace period ran out: this many connections were still open and were cut off.
    GraceExpired {
        /// Connections cut off.
        open: usize,
    },
}

/// Serves `app` on `listener` over HTTP/1.1 until `shutdown` completes, with hyper's header
/// read timeout ([`Timeouts::header`]). Then it stops accepting, lets requests in flight finish
/// for at most [`Timeouts::grace`], and cuts off what is still open.
///
/// A cut-off request's handler, if the layer already started it, is not rolled back by this: its
/// writes and answer commit together or not at all (the runtime drops it at its next await
/// point), and the key's lease lapses if nothing was recorded.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Router,
    timeouts: &Timeouts,
    shutdown: impl Future<Output = ()>,
) -> Stopped {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.header);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // E.g. out of file descriptors: wait a little rather than spin.
                    eprintln!("edge_service: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            // A connection error (client gone, header timeout) concerns that client only.
            let _ = conn.await;
        });
    }
    drop(listener); // stop accepting: new connections are refused from here on
    while connections.try_join_next().is_some() {}
    match tokio::time::timeout(timeouts.grace, graceful.shutdown()).await {
        Ok(()) => Stopped::Drained,
        Err(_) => {
            while connections.try_join_next().is_some() {}
            let open = connections.len();
            connections.shutdown().await; // aborts them and waits until they are dropped
            Stopped::GraceExpired { open }
        }
    }
}

async fn not_found(req: Request) -> Response {
    problem_response(
        StatusCode::NOT_FOUND,
        problem::NOT_FOUND,
        "Not found",
        &format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> Response {
    problem_response(
        StatusCode::METHOD_NOT_ALLOWED,
        problem::METHOD_NOT_ALLOWED,
        "Method not allowed",
        &format!("{} does not accept {}", req.uri().path(), req.method()),
    )
}

/// The request's tenant, checked with the layer's own rule ([`idem::http::tenant_from_header`]:
/// exactly one `X-Tenant-Id` line, 1 to the store's `max_tenant_len` bytes of visible ASCII
/// without commas), so the read routes take exactly the tenants the layer takes on the POST
/// routes. Rejected with a 400 problem.
struct Tenant(String);

impl<E: Engine> FromRequestParts<AppState<E>> for Tenant {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        app: &AppState<E>,
    ) -> Result<Self, Self::Rejection> {
        let max = app.store.limits().max_tenant_len;
        match idem::http::tenant_from_header(&parts.headers, &HeaderName::from_static(TENANT), max)
        {
            Ok(Some(tenant)) => Ok(Tenant(tenant)),
            Ok(None) => Err(problem_response(
                StatusCode::BAD_REQUEST,
                idem::http::problem::MISSING_TENANT,
                "Tenant required",
                "send X-Tenant-Id",
            )),
            Err(e) => Err(problem_response(
                StatusCode::BAD_REQUEST,
                problem::INVALID_TENANT,
                "Invalid tenant",
                &format!("X-Tenant-Id: {e}"),
            )),
        }
    }
}

/// The `{id}` path parameter; axum's rejection (e.g. percent-encoding that is not UTF-8) is
/// answered as a 400 problem instead of axum's plain-text one.
struct PaymentId(String);

impl<S: Send + Sync> FromRequestParts<S> for PaymentId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(id)) => Ok(PaymentId(id)),
            Err(rejection) => Err(problem_response(
                StatusCode::BAD_REQUEST,
                problem::INVALID_PATH,
                "Invalid path",
                &rejection.body_text(),
            )),
        }
    }
}

/// The layer's handle. It is always there on the routes under the layer; answered as a 500
/// problem (nothing booked) if a route were ever served without it.
struct Claimed<E: Backend>(Idempotency<E>);

impl<S: Send + Sync, E: Backend> FromRequestParts<S> for Claimed<E> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<Idempotency<E>>() {
            Some(idem) => Ok(Claimed(idem.clone())),
            None => Err(problem_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                idem::http::problem::STORE_FAILED,
                "Idempotency layer missing",
                "the route is not covered by the Idempotency-Key layer; nothing was booked",
            )),
        }
    }
}

/// A problem answer recorded by [`Idempotency::complete_with`] (replayed as it is, with its
/// `application/problem+json` content type).
fn recorded_problem(status: StatusCode, kind: &str, title: &str, detail: &str) -> Recorded {
    let body = json!({"type": kind, "title": title, "status": status.as_u16(), "detail": detail});
    let mut answer = Recorded::json(status, &body);
    answer
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    answer
}

fn invalid(detail: &str) -> Recorded {
    recorded_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        problem::INVALID_PAYMENT,
        "Invalid payment",
        detail,
    )
}

fn ledger_out_of_range(total: i64, entry: i64) -> Recorded {
    recorded_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        problem::LEDGER_OUT_OF_RANGE,
        "Ledger total out of range",
        &format!(
            "the tenant's ledger total {total} plus {entry} does not fit in a signed 64-bit \
             integer (from {} to {}); nothing was booked",
            i64::MIN,
            i64::MAX
        ),
    )
}

async fn create_payment<E: Engine>(
    Tenant(tenant): Tenant,
    Claimed(idem): Claimed<E>,
    body: axum::body::Bytes,
) -> Response
where
    for<'t> TxOf<'t, E>: Books,
{
    // The id derives from the idempotency key: the same on every attempt of this intent.
    let hex = idem.downstream_key().to_hex();
    let id = format!("pay_{}", hex.get(..20).unwrap_or(&hex));
    idem.complete_with(move |mut tx| capture(&mut tx, &tenant, &id, &body))
        .await
}

/// Books a new payment `id` for `tenant` from the request `body`, in the transaction that
/// records the answer.
pub fn capture(
    books: &mut impl Books,
    tenant: &str,
    id: &str,
    body: &[u8],
) -> Result<Recorded, Abort> {
    let new: NewPayment = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            return Ok(invalid(&format!(
                "expected {{\"account\", \"amount\", \"currency\"}}: {e}"
            )));
        }
    };
    if !(1..=MAX_AMOUNT).contains(&new.amount) {
        return Ok(recorded_problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::AMOUNT_OUT_OF_RANGE,
            "Amount out of range",
            &format!(
                "amount is {}; it must be an integer number of minor units from 1 to \
                 {MAX_AMOUNT}",
                new.amount
            ),
        ));
    }
    if new.currency.len() != 3 || new.account.is_empty() {
        return Ok(invalid(
            "currency must be a 3-letter code, account non-empty",
        ));
    }
    // Checked before any write: a 4xx is recorded with the closure's writes, so nothing may be
    // written on the refusal path.
    let total = books.total(tenant)?;
    let Some(new_total) = total.checked_add(new.amount) else {
        return Ok(ledger_out_of_range(total, new.amount));
    };
    let payment = json!({
        "id": id, "account": new.account, "amount": new.amount,
        "currency": new.currency, "status": "captured",
    });
    let stored = json!({"tenant": tenant, "payment": payment}).to_string();
    books.put_payment(id, &stored)?;
    books.book(tenant, &format!("{id}:capture"), new.amount, new_total)?;
    books.push(payment_event("payment.captured", tenant, id, &payment))?;
    let mut answer = Recorded::json(StatusCode::CREATED, &payment);
    if let Ok(loc) = format!("/v1/payments/{id}").parse() {
        answer.headers.insert(LOCATION, loc);
    }
    Ok(answer)
}

async fn refund_payment<E: Engine>(
    Tenant(tenant): Tenant,
    PaymentId(id): PaymentId,
    Claimed(idem): Claimed<E>,
) -> Response
where
    for<'t> TxOf<'t, E>: Books,
{
    idem.complete_with(move |mut tx| refund(&mut tx, &tenant, &id))
        .await
}

/// Refunds payment `id` of `tenant` (once: a refunded payment answers as it is), in the
/// transaction that records the answer.
pub fn refund(books: &mut impl Books, tenant: &str, id: &str) -> Result<Recorded, Abort> {
    let found = books.payment(id)?;
    let Some(mut row) = found
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .filter(|row| row["tenant"] == tenant)
    else {
        return Ok(recorded_problem(
            StatusCode::NOT_FOUND,
            problem::NO_SUCH_PAYMENT,
            "No such payment",
            "no payment with this id for this tenant",
        ));
    };
    let captured = row["payment"]["status"] == "captured";
    if let Some(payment) = row.get_mut("payment").and_then(Value::as_object_mut)
        && captured
    {
        // Stored amounts were range-checked when captured; `checked_neg` and `checked_add`
        // still refuse a row that would not fit rather than wrap.
        let amount = payment.get("amount").and_then(Value::as_i64).unwrap_or(0);
        let total = books.total(tenant)?;
        let Some((entry, new_total)) = amount
            .checked_neg()
            .and_then(|entry| Some((entry, total.checked_add(entry)?)))
        else {
            return Ok(ledger_out_of_range(total, amount.saturating_neg()));
        };
        payment.insert("status".into(), json!("refunded"));
        books.put_payment(id, &row.to_string())?;
        books.book(tenant, &format!("{id}:refund"), entry, new_total)?;
        books.push(payment_event(
            "payment.refunded",
            tenant,
            id,
            &row["payment"],
        ))?;
    }
    Ok(Recorded::json(StatusCode::OK, &row["payment"]))
}

/// The file store's bookings: redb tables in the store's file.
impl Books for &Tx<'_> {
    fn total(&mut self, tenant: &str) -> Result<i64, Abort> {
        let totals = self.open_table(LEDGER_TOTALS)?;
        Ok(totals.get(tenant)?.map_or(0, |v| v.value()))
    }

    fn payment(&mut self, id: &str) -> Result<Option<String>, Abort> {
        let payments = self.open_table(PAYMENTS)?;
        Ok(payments.get(id)?.map(|v| v.value().to_owned()))
    }

    fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort> {
        self.open_table(PAYMENTS)?.insert(id, row)?;
        Ok(())
    }

    fn book(&mut self, tenant: &str, entry: &str, amount: i64, total: i64) -> Result<(), Abort> {
        let key = format!("{tenant}\0{entry}");
        self.open_table(LEDGER)?.insert(key.as_str(), amount)?;
        self.open_table(LEDGER_TOTALS)?.insert(tenant, total)?;
        Ok(())
    }

    fn push(&mut self, event: Event) -> Result<(), Abort> {
        self.outbox().push(event)?;
        Ok(())
    }
}

impl Engine for Store {
    fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError> {
        let txn = self.begin_read()?;
        let table = match txn.open_table(PAYMENTS) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(id)?.map(|v| v.value().to_owned()))
    }

    fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError> {
        let txn = self.begin_read()?;
        let table = match txn.open_table(LEDGER) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok((0, Some(0))),
            Err(e) => return Err(e.into()),
        };
        let (from, to) = (format!("{tenant}\0"), format!("{tenant}\u{1}"));
        let mut entries = 0u64;
        let mut total = Some(0i64);
        for row in table.range(from.as_str()..to.as_str())? {
            let (_, amount) = row?;
            entries += 1;
            total = total.and_then(|t| t.checked_add(amount.value()));
        }
        Ok((entries, total))
    }

    fn pending_events(&self, limit: usize) -> Result<Vec<OutboxEvent>, idem::Error> {
        Store::pending_events(self, limit)
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error> {
        Store::dead_letters(self, limit)
    }

    fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, idem::Error> {
        Store::start_dispatcher(self, publisher, options)
    }

    fn failure(&self) -> Option<String> {
        Store::failure(self)
    }
}

/// The service on PostgreSQL (`--postgres URL`): idem's tables and the service's own
/// (`payments`, `ledger`, `ledger_totals`) in one PostgreSQL schema (`--pg-schema`), so every
/// replica of the service on that database shares the keys, the payments and the outbox.
#[cfg(feature = "postgres")]
pub mod pg {
    use std::sync::OnceLock;
    use std::time::Duration;

    use idem::Abort;
    use idem::outbox::{
        DeadLetter, DispatcherHandle, DispatcherOptions, Event, OutboxEvent, Publisher,
    };
    use idem::postgres::{PgStore, PgTx};

    use super::{Books, Engine};

    /// The schema of the service's tables (one per process: set once, by [`open_store`]).
    static SCHEMA: OnceLock<String> = OnceLock::new();

    fn table(name: &str) -> String {
        format!(
            "{}.{name}",
            SCHEMA.get().map_or("edge_service", String::as_str)
        )
    }

    /// Opens the store on `url` in `schema` (created with its tables if missing), with sweeps
    /// every 10 minutes and `lease` as the lease duration.
    pub fn open_store(
        url: &str,
        schema: &str,
        lease: Duration,
    ) -> Result<PgStore, Box<dyn std::error::Error>> {
        if SCHEMA.get_or_init(|| schema.to_owned()) != schema {
            return Err("one process serves one PostgreSQL schema".into());
        }
        let store = PgStore::builder(url)
            .schema(schema)
            .sweep_interval(Duration::from_secs(600))
            .lease_duration(lease)
            .open()?;
        let mut client = postgres::Client::connect(url, postgres::NoTls)?;
        client.batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {p} (id text PRIMARY KEY, row text NOT NULL);
             CREATE TABLE IF NOT EXISTS {l} (tenant text NOT NULL, entry text NOT NULL, amount int8 NOT NULL, PRIMARY KEY (tenant, entry));
             CREATE TABLE IF NOT EXISTS {t} (tenant text PRIMARY KEY, total int8 NOT NULL);",
            p = table("payments"),
            l = table("ledger"),
            t = table("ledger_totals"),
        ))?;
        Ok(store)
    }

    /// The bookings on PostgreSQL: the service's tables, in the store's transaction.
    impl Books for &mut PgTx<'_> {
        fn total(&mut self, tenant: &str) -> Result<i64, Abort> {
            let totals = table("ledger_totals");
            // The tenant's row exists and is locked from here on: concurrent bookings of one
            // tenant take turns, so the checked sum is never computed from a stale total.
            self.execute(
                &format!("INSERT INTO {totals} (tenant, total) VALUES ($1, 0) ON CONFLICT (tenant) DO NOTHING"),
                &[&tenant],
            )?;
            let row = self.query_one(
                &format!("SELECT total FROM {totals} WHERE tenant = $1 FOR UPDATE"),
                &[&tenant],
            )?;
            Ok(row.get(0))
        }

        fn payment(&mut self, id: &str) -> Result<Option<String>, Abort> {
            let row = self.query_opt(
                &format!(
                    "SELECT row FROM {} WHERE id = $1 FOR UPDATE",
                    table("payments")
                ),
                &[&id],
            )?;
            Ok(row.map(|r| r.get(0)))
        }

        fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort> {
            self.execute(
                &format!(
                    "INSERT INTO {} (id, row) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET row = EXCLUDED.row",
                    table("payments")
                ),
                &[&id, &row],
            )?;
            Ok(())
        }

        fn book(
            &mut self,
            tenant: &str,
            entry: &str,
            amount: i64,
            total: i64,
        ) -> Result<(), Abort> {
            self.execute(
                &format!(
                    "INSERT INTO {} (tenant, entry, amount) VALUES ($1, $2, $3)",
                    table("ledger")
                ),
                &[&tenant, &entry, &amount],
            )?;
            self.execute(
                &format!(
                    "UPDATE {} SET total = $2 WHERE tenant = $1",
                    table("ledger_totals")
                ),
                &[&tenant, &total],
            )?;
            Ok(())
        }

        fn push(&mut self, event: Event) -> Result<(), Abort> {
            self.outbox().push(event)?;
            Ok(())
        }
    }

    impl Engine for PgStore {
        fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError> {
            let mut c = self.client()?;
            let row = c.query_opt(
                &format!("SELECT row FROM {} WHERE id = $1", table("payments")),
                &[&id],
            )?;
            Ok(row.map(|r| r.get(0)))
        }

        fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError> {
            let mut c = self.client()?;
            // numeric: the sum of i64 entries never overflows here; one that leaves i64 is None.
            let row = c.query_one(
                &format!(
                    "SELECT count(*), CASE WHEN sum(amount::numeric) BETWEEN -9223372036854775808 AND 9223372036854775807 THEN coalesce(sum(amount), 0)::int8 END FROM {} WHERE tenant = $1",
                    table("ledger")
                ),
                &[&tenant],
            )?;
            Ok((u64::try_from(row.get::<_, i64>(0)).unwrap_or(0), row.get(1)))
        }

        fn pending_events(&self, limit: usize) -> Result<Vec<OutboxEvent>, idem::Error> {
            PgStore::pending_events(self, limit)
        }

        fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error> {
            PgStore::dead_letters(self, limit)
        }

        fn start_dispatcher(
            &self,
            publisher: impl Publisher,
            options: DispatcherOptions,
        ) -> Result<DispatcherHandle, idem::Error> {
            PgStore::start_dispatcher(self, publisher, options)
        }
    }
}

/// The outbox event of a payment state change: ordered per payment, so a consumer never sees
/// the refund before the capture. The `tenant` header scopes `GET /v1/outbox`.
fn payment_event(kind: &str, tenant: &str, id: &str, payment: &Value) -> Event {
    Event::new("payments", payment.to_string())
        .ordering_key(id)
        .header("type", kind)
        .header("tenant", tenant)
}

fn header<'a>(event: &'a OutboxEvent, name: &str) -> Option<&'a str> {
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// One line per published event (no broker here: stdout stands in for it).
pub fn describe(event: &OutboxEvent) -> String {
    format!(
        "published seq={} id={} topic={} tenant={} key={} type={} payload={}",
        event.seq,
        event.id,
        event.topic,
        header(event, "tenant").unwrap_or("-"),
        event.ordering_key.as_deref().unwrap_or("-"),
        header(event, "type").unwrap_or("-"),
        String::from_utf8_lossy(&event.payload)
    )
}

/// Starts the outbox dispatcher of the service: its publisher prints each event on stdout
/// ([`describe`]), counts it in `delivered` and reports it delivered. A real service would
/// send it to its broker here.
pub fn start_dispatcher<E: Engine>(
    store: &E,
    delivered: Delivered,
) -> Result<DispatcherHandle, idem::Error> {
    Engine::start_dispatcher(
        store,
        move |event: &OutboxEvent| -> Result<(), idem::error::BoxError> {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "edge_service: {}", describe(event))?;
            out.flush()?;
            delivered.add(header(event, "tenant").unwrap_or(""));
            Ok(())
        },
        DispatcherOptions::new(),
    )
}

/// Store reads run on the blocking pool: they touch the disk.
async fn read<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, idem::error::BoxError> + Send + 'static,
) -> Result<T, Response> {
    let failed = |detail: String| {
        problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::READ_FAILED,
            "Read failed",
            &detail,
        )
    };
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(e) => Err(failed(e.to_string())),
    }
}

async fn get_payment<E: Engine>(
    State(app): State<AppState<E>>,
    Tenant(tenant): Tenant,
    PaymentId(id): PaymentId,
) -> Response {
    let row = read(move || app.store.payment(&id)).await;
    match row {
        Err(resp) => resp,
        Ok(row) => match row.and_then(|s| serde_json::from_str::<Value>(&s).ok()) {
            Some(row) if row["tenant"] == tenant.as_str() => {
                (StatusCode::OK, Json(row["payment"].clone())).into_response()
            }
            _ => problem_response(
                StatusCode::NOT_FOUND,
                problem::NO_SUCH_PAYMENT,
                "No such payment",
                "no payment with this id for this tenant",
            ),
        },
    }
}

/// `GET /v1/health`: 200 `{"status": "ok"}` while the store takes writes; 503 problem+json
/// naming the failure once it stopped after an I/O failure (restart the service to reopen it).
async fn health<E: Engine>(State(app): State<AppState<E>>) -> Response {
    match app.store.failure() {
        None => Json(json!({"status": "ok"})).into_response(),
        Some(cause) => problem_response(
            StatusCode::SERVICE_UNAVAILABLE,
            problem::STORE_FAILED,
            "Store stopped after an I/O failure",
            &format!(
                "the store refuses writes since an I/O failure ({cause}); check the disk and \
                 restart the service, which reopens the store"
            ),
        ),
    }
}

/// Logs the store's failure once, when it happens (checked every `every`): a fail-stopped
/// store answers every write with an error until the service restarts, and the log line says
/// why.
async fn log_store_failure<E: Engine>(store: E, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Some(cause) = store.failure() {
            eprintln!(
                "edge_service: the store stopped after an I/O failure ({cause}): every write \
                 fails until the service is restarted (GET /v1/health answers 503)"
            );
            return;
        }
    }
}

/// The tenant's ledger, summed with checked arithmetic: `None` when the sum leaves `i64`
/// (impossible for entries this service wrote, which [`LEDGER_TOTALS`] bounds).
async fn ledger<E: Engine>(State(app): State<AppState<E>>, Tenant(tenant): Tenant) -> Response {
    let counted = read(move || app.store.ledger(&tenant)).await;
    match counted {
        Ok((entries, Some(total))) => {
            Json(json!({"entries": entries, "total": total})).into_response()
        }
        Ok((entries, None)) => problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            problem::LEDGER_OUT_OF_RANGE,
            "Ledger total out of range",
            &format!(
                "the tenant's {entries} ledger entries add up to more than a signed 64-bit \
                 integer holds; they were not written by this service's checked bookings"
            ),
        ),
        Err(resp) => resp,
    }
}

/// The tenant's outbox: its undelivered events and dead letters (counted among the oldest
/// [`OUTBOX_SCAN`] of each), and its events this process delivered.
async fn outbox<E: Engine>(State(app): State<AppState<E>>, Tenant(tenant): Tenant) -> Response {
    let delivered = app.delivered.of(&tenant);
    let counted = read(move || {
        let ours = |e: &OutboxEvent| header(e, "tenant") == Some(tenant.as_str());
        let pending = app.store.pending_events(OUTBOX_SCAN + 1)?;
        let dead = app.store.dead_letters(OUTBOX_SCAN + 1)?;
        let truncated = pending.len() > OUTBOX_SCAN || dead.len() > OUTBOX_SCAN;
        let pending = pending.iter().take(OUTBOX_SCAN).filter(|e| ours(e)).count();
        let dead = dead
            .iter()
            .take(OUTBOX_SCAN)
            .filter(|d| ours(&d.event))
            .count();
        Ok((pending, dead, truncated))
    })
    .await;
    match counted {
        Ok((pending, dead, truncated)) => Json(json!({
            "pending": pending, "dead": dead, "delivered": delivered, "truncated": truncated,
        }))
        .into_response(),
        Err(resp) => resp,
    }
}

/// A small payments service on idem's Idempotency-Key layer, on one embedded store file.
///
/// Exit status: 0 stopped cleanly; 1 could not start; 2 bad command line; 3 the shutdown grace
/// period ran out and requests in flight were cut off.
#[derive(Parser, Debug)]
#[command(name = "edge_service")]
pub struct Args {
    /// Directory of the store file DIR/idem.redb (created if missing).
    #[arg(long, value_name = "DIR", default_value = "data")]
    pub data: PathBuf,
    /// Address to listen on; port 0 picks a free one (the address is printed on stderr).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// How long a request cut off by a crash (kill -9) blocks its key before a retry takes it
    /// over, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub lease_ms: u64,
    /// A client must send a request's headers within this many milliseconds (also the limit
    /// for an idle keep-alive connection), or the connection is closed.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,
    /// A request body must arrive completely within this many milliseconds after the headers,
    /// or the request is answered 400 and the connection closed.
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout_ms: u64,
    /// A request not answered within this many milliseconds is answered 503 + Retry-After (a
    /// payment that had started still completes; a retry with the same key gets its answer).
    #[arg(long, value_name = "MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,
    /// On SIGTERM or ctrl-c: how many milliseconds requests in flight may take to finish before
    /// they are cut off (exit status 3).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub grace_ms: u64,
    /// Run on this PostgreSQL database instead of the store file (e.g.
    /// postgresql://app@db/payments): every replica started with the same URL and schema shares
    /// the keys, the payments and the outbox. Needs the `postgres` feature.
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// With --postgres: the PostgreSQL schema of idem's tables and the service's own.
    #[arg(long, value_name = "NAME", default_value = "edge_service")]
    pub pg_schema: String,
}

impl Args {
    /// The timeouts these flags set.
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            header: Duration::from_millis(self.header_timeout_ms),
            body: Duration::from_millis(self.body_timeout_ms),
            request: Duration::from_millis(self.request_timeout_ms),
            grace: Duration::from_millis(self.grace_ms),
        }
    }
}

/// Exit status when the grace period ran out with requests in flight.
pub const EXIT_GRACE_EXPIRED: u8 = 3;

/// Registers the SIGTERM and ctrl-c (SIGINT) handlers now and returns the future that resolves
/// on the first of them. Called before the service prints that it listens, so a signal sent right
/// after that line always reaches the graceful shutdown (never the default "die at once").
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let interrupt = signal(SignalKind::interrupt());
        async move {
            match (term, interrupt) {
                (Ok(mut term), Ok(mut interrupt)) => {
                    tokio::select! {
                        _ = term.recv() => {},
                        _ = interrupt.recv() => {},
                    }
                }
                (Ok(mut only), Err(_)) | (Err(_), Ok(mut only)) => {
                    only.recv().await;
                }
                (Err(_), Err(_)) => std::future::pending::<()>().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Opens the store the way the service does: sweeps every 10 minutes keep the file bounded;
/// `lease` is how long a request that died with the process (kill -9) blocks its key before a
/// retry takes it over (`--lease-ms`, default 30 s). After a kill the file is repaired before
/// the service listens (seconds per GB): its progress and its time are printed, so the start
/// does not look hung.
pub fn open_store(
    dir: &std::path::Path,
    lease: Duration,
) -> Result<Store, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let store = Store::builder()
        .sweep_interval(Duration::from_secs(600))
        .lease_duration(lease)
        .on_repair(|progress| {
            eprintln!(
                "edge_service: the store was not closed cleanly; repairing it: {:.0} %",
                progress.fraction() * 100.0
            );
        })
        .open(dir.join("idem.redb"))?;
    if let Some(took) = store.repair_time() {
        eprintln!(
            "edge_service: the store was repaired in {:.2} s",
            took.as_secs_f64()
        );
    }
    Ok(store)
}

/// What to tell an operator whose `--listen` address cannot be bound.
fn bind_error(addr: SocketAddr, e: &std::io::Error) -> String {
    let host = match addr {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "{addr} is in use (another process listens there): pass --listen {host}:PORT with a \
             free port, or stop that process"
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "not allowed to listen on {addr} (ports below 1024 need privileges): pass --listen \
             {host}:PORT with a port from 1024 up"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "{addr} is not an address of this machine: pass --listen with one of its addresses, \
             e.g. --listen 127.0.0.1:{}",
            addr.port()
        ),
        _ => format!("cannot listen on {addr}: {e}; pass --listen with another address"),
    }
}

async fn run(args: Args, telemetry: Telemetry) -> Result<Stopped, String> {
    // Bind first: a busy port is the commonest start-up failure, and it should not leave a
    // store file behind in a directory the operator did not mean to use.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| bind_error(args.listen, &e))?;
    let lease = Duration::from_millis(args.lease_ms);
    match args.postgres.clone() {
        None => {
            let store = open_store(&args.data, lease)
                .map_err(|e| format!("cannot open the store in {}: {e}", args.data.display()))?;
            let what = format!("store {}", args.data.join("idem.redb").display());
            serve_on(args, listener, store, what, telemetry).await
        }
        #[cfg(feature = "postgres")]
        Some(url) => {
            let schema = args.pg_schema.clone();
            let opened = tokio::task::spawn_blocking(move || {
                pg::open_store(&url, &schema, lease).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
            let store = opened.map_err(|e| format!("cannot open the PostgreSQL store: {e}"))?;
            let what = format!("PostgreSQL schema {}", args.pg_schema);
            serve_on(args, listener, store, what, telemetry).await
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err(
            "this build has no PostgreSQL engine: build the example with \
             --features http,postgres"
                .into(),
        ),
    }
}

/// Serves the service on `store` until SIGTERM or ctrl-c, with its dispatcher.
async fn serve_on<E: Engine>(
    args: Args,
    listener: tokio::net::TcpListener,
    store: E,
    what: String,
    telemetry: Telemetry,
) -> Result<Stopped, String>
where
    for<'t> TxOf<'t, E>: Books,
{
    let delivered = Delivered::default();
    let dispatcher = {
        let (store, delivered) = (store.clone(), delivered.clone());
        tokio::task::spawn_blocking(move || start_dispatcher(&store, delivered))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the outbox dispatcher: {e}"))?
    };
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    let signal = shutdown_signal();
    eprintln!("edge_service: listening on http://{addr} ({what})");
    let watcher = tokio::spawn(log_store_failure(
        store.clone(),
        std::time::Duration::from_millis(250),
    ));
    let timeouts = args.timeouts();
    telemetry.spawn_upkeep();
    let service = app(store.clone(), delivered).merge(telemetry.routes());
    let router = with_timeouts(service, &timeouts);
    let stopped = serve(listener, router, &timeouts, async {
        signal.await;
        eprintln!(
            "edge_service: shutting down (finishing requests in flight, at most {} ms)",
            timeouts.grace.as_millis()
        );
    })
    .await;
    watcher.abort();
    // Stops after the publish in progress; undelivered events wait for the next start.
    match tokio::task::spawn_blocking(move || dispatcher.shutdown()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!("edge_service: outbox dispatcher: {e}"),
        Err(e) => eprintln!("edge_service: outbox dispatcher: {e}"),
    }
    // Closed on the blocking pool: closing may block (the file store's final fsync).
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    Ok(stopped)
}

/// Logs with tracing-subscriber's fmt subscriber on stderr, filtered by `RUST_LOG` (default
/// `info`; an unreadable value falls back to it). With idem's `tracing` feature, idem's warnings
/// appear there (a failed background sweep or dispatcher round, an answer that could not be
/// recorded, a failed heartbeat), and `RUST_LOG=idem=debug` adds a line per decision (inside its
/// `execute` / `begin` / `finish` span: engine, tenant, operation, decision) and per group-commit
/// batch. The service's own lines (listening, shutting down, stopped) are printed directly and
/// come whatever the filter.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // `try_init`: a subscriber set before (none in this binary) stays.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The content type of the Prometheus text exposition format.
#[cfg(feature = "metrics")]
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram buckets of the latencies (`*_seconds`): 100 µs to 2.5 s.
#[cfg(feature = "metrics")]
const SECONDS_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

/// Histogram buckets of `idem_commit_batch_size`: powers of two up to the default `max_batch`.
#[cfg(feature = "metrics")]
const BATCH_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

/// What the service exposes about itself besides its logs: with idem's `metrics` feature,
/// `GET /metrics` in the Prometheus text format (every counter, gauge and histogram idem
/// records, e.g. `idem_outcomes_total{call="begin",operation="POST /v1/payments",outcome="replayed"}`),
/// from metrics-exporter-prometheus's recorder; without the feature, nothing.
#[derive(Clone, Default)]
pub struct Telemetry {
    #[cfg(feature = "metrics")]
    prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl Telemetry {
    /// Installs the Prometheus recorder as the process's `metrics` recorder (feature `metrics`;
    /// nothing without it). Latencies and batch sizes are rendered as Prometheus histograms.
    pub fn install() -> Result<Telemetry, String> {
        #[cfg(feature = "metrics")]
        let telemetry = {
            use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("idem_commit_batch_size".into()),
                        &BATCH_BUCKETS,
                    )
                })
                .and_then(|b| b.install_recorder())
                .map_err(|e| format!("cannot install the Prometheus metrics recorder: {e}"))?;
            Telemetry {
                prometheus: Some(handle),
            }
        };
        #[cfg(not(feature = "metrics"))]
        let telemetry = Telemetry::default();
        Ok(telemetry)
    }

    /// `GET /metrics` (feature `metrics`), outside the Idempotency-Key layer and without a
    /// tenant; no route without the feature.
    pub fn routes(&self) -> Router {
        #[cfg(feature = "metrics")]
        if let Some(handle) = self.prometheus.clone() {
            return Router::new().route(
                "/metrics",
                get(move || {
                    let text = handle.render();
                    async move { ([(CONTENT_TYPE, PROMETHEUS_TEXT)], text) }
                }),
            );
        }
        Router::new()
    }

    /// Runs the recorder's upkeep (it drains histogram samples) every 5 s on the runtime.
    fn spawn_upkeep(&self) {
        #[cfg(feature = "metrics")]
        if let Some(handle) = self.prometheus.clone() {
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    handle.run_upkeep();
                }
            });
        }
    }
}

fn main() -> ExitCode {
    // `--help` prints usage and exits 0; a bad flag prints clap's error and exits 2.
    let args = Args::parse();
    init_logging();
    let telemetry = match Telemetry::install() {
        Ok(telemetry) => telemetry,
        Err(e) => {
            eprintln!("edge_service: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("edge_service: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(args, telemetry));
    // Tasks still holding store handles (a handler cut off by the grace period) are dropped
    // here, so the store closes (its Drop makes every acknowledged commit durable) before exit.
    // A blocking store call still running after 5 s is left to the OS: redb is crash-safe.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(Stopped::Drained) => {
            eprintln!("edge_service: stopped");
            ExitCode::SUCCESS
        }
        Ok(Stopped::GraceExpired { open }) => {
            eprintln!(
                "edge_service: grace period over with {open} connection(s) still open: cut them \
                 off (a request cut off mid-way either committed with its answer or left nothing; \
                 its client retries with the same key)"
            );
            ExitCode::from(EXIT_GRACE_EXPIRED)
        }
        Err(e) => {
            eprintln!("edge_service: {e}");
            ExitCode::FAILURE
        }
    }
}
