//! The router: its routes and fallbacks, the request extractors (tenant, payment id, the
//! layer's handle), and the read handlers (payment, health, ledger, outbox).

use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{Backend, IdempotencyHandle, IdempotencyLayer, problem_response};
use idem::outbox::StoredEvent;
use serde_json::{Value, json};

use crate::*;

pub(crate) struct AppState<E> {
    pub(crate) store: E,
    pub(crate) delivered: Delivered,
}

impl<E: Clone> Clone for AppState<E> {
    fn clone(&self) -> Self {
        AppState {
            store: self.store.clone(),
            delivered: self.delivered.clone(),
        }
    }
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

pub(crate) async fn not_found(req: Request) -> Response {
    problem_response(
        StatusCode::NOT_FOUND,
        problem::NOT_FOUND,
        "Not found",
        &format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

pub(crate) async fn method_not_allowed(req: Request) -> Response {
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
pub(crate) struct Tenant(pub(crate) String);

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
pub(crate) struct PaymentId(pub(crate) String);

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
pub(crate) struct Claimed<E: Backend>(pub(crate) IdempotencyHandle<E>);

impl<S: Send + Sync, E: Backend> FromRequestParts<S> for Claimed<E> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        match parts.extensions.get::<IdempotencyHandle<E>>() {
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

/// Store reads run on the blocking pool: they touch the disk.
pub(crate) async fn read<T: Send + 'static>(
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

pub(crate) async fn get_payment<E: Engine>(
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
pub(crate) async fn health<E: Engine>(State(app): State<AppState<E>>) -> Response {
    match app.store.fail_stop_cause() {
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
pub(crate) async fn log_store_failure<E: Engine>(store: E, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        if let Some(cause) = store.fail_stop_cause() {
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
pub(crate) async fn ledger<E: Engine>(
    State(app): State<AppState<E>>,
    Tenant(tenant): Tenant,
) -> Response {
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
pub(crate) async fn outbox<E: Engine>(
    State(app): State<AppState<E>>,
    Tenant(tenant): Tenant,
) -> Response {
    let delivered = app.delivered.of(&tenant);
    let counted = read(move || {
        let ours = |e: &StoredEvent| header(e, "tenant") == Some(tenant.as_str());
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
