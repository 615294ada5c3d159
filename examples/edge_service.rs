//! A small payments service on the `Idempotency-Key` layer, on one embedded store file.
//!
//! ```text
//! cargo run --release --example edge_service --features http [-- --data DIR --listen ADDR]
//! ```
//!
//! Defaults: `--data ./data` (the store is `DIR/idem.redb`), `--listen 127.0.0.1:8080`,
//! `--lease-ms 30000` (how long a request cut off by a crash blocks its key).
//!
//! - `POST /v1/payments` (`X-Tenant-Id`, `Idempotency-Key`, JSON `{"account", "amount",
//!   "currency"}`) → 201 with the payment;
//! - `GET /v1/payments/{id}` → 200 with the payment as it is now (e.g. refunded), 404 if absent;
//! - `POST /v1/payments/{id}/refund` (`Idempotency-Key`) → 200, marks it refunded;
//! - `GET /v1/ledger` → 200 `{"entries", "total"}` for the tenant, so a client can count effects;
//! - `GET /v1/outbox` → 200 `{"pending", "dead", "delivered"}`: events not yet delivered, dead
//!   letters, and events this process delivered since it started.
//!
//! **Why the POST handlers record their own answer.** The layer claims the key with a lease
//! before the handler runs; a handler that wrote in a transaction of its own would leave a gap
//! where a crash after its write and before the layer recorded the answer lets a retry book the
//! payment twice. So both POST handlers write the payment row and its ledger entry *inside*
//! the transaction that records the answer ([`Idempotency::complete_with`]), together with an
//! outbox event (topic `payments`, ordering key = the payment id, payload = the payment JSON,
//! header `type` = `payment.captured` / `payment.refunded`): a kill -9 at any moment either
//! leaves the effect, its event and the answer, or none of them (the lease lapses and the retry
//! runs once, pushing the event once). The layer still does everything else: key and tenant extraction, the
//! fingerprint, 400/409/413/422 problems, replays with `Idempotent-Replayed: true`.
//!
//!
//! `main` also starts the outbox dispatcher ([`start_dispatcher`]); its publisher stands in for
//! a broker and prints each event on stdout (`published seq=… id=… topic=payments key=pay_…`).
//! Delivery is at least once: after a kill -9 an event may be printed again, with the same id.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use idem::http::{Idempotency, IdempotencyLayer, Recorded, problem_response};
use idem::redb::{ReadableTable, TableDefinition};
use idem::{DispatcherHandle, DispatcherOptions, Event, OutboxEvent, Store};
use serde_json::{Value, json};

/// Payment id → the payment as JSON (it carries its tenant).
const PAYMENTS: TableDefinition<&str, &str> = TableDefinition::new("payments");
/// `"{tenant}\0{entry id}"` → signed amount. One entry per capture and per refund.
const LEDGER: TableDefinition<&str, i64> = TableDefinition::new("ledger");

const TENANT: &str = "x-tenant-id";

/// The request body of `POST /v1/payments`.
#[derive(serde::Deserialize)]
struct NewPayment {
    account: String,
    amount: i64,
    currency: String,
}

/// The service's router on `store`: what `main` serves, and what the tests drive in-process.
pub fn app(store: Store) -> Router {
    // `route_layer`: only matched routes are covered, and the layer sees the route template
    // (`POST /v1/payments/{id}/refund`), so the operation does not depend on the id.
    let idempotent = IdempotencyLayer::tenant_header(store.clone(), TENANT);
    Router::new()
        .route("/v1/payments", post(create_payment))
        .route("/v1/payments/{id}/refund", post(refund_payment))
        .route("/v1/payments/{id}", get(get_payment))
        .route("/v1/ledger", get(ledger))
        .route("/v1/outbox", get(outbox))
        .route_layer(idempotent)
        .with_state(store)
}

fn tenant_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get(TENANT)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

fn missing_tenant() -> Response {
    problem_response(
        StatusCode::BAD_REQUEST,
        idem::http::problem::MISSING_TENANT,
        "Tenant required",
        "send X-Tenant-Id",
    )
}

fn invalid(detail: &str) -> Recorded {
    Recorded::json(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({"type": "about:blank", "title": "Invalid payment", "status": 422, "detail": detail}),
    )
}

async fn create_payment(
    headers: HeaderMap,
    Extension(idem): Extension<Idempotency>,
    body: axum::body::Bytes,
) -> Response {
    let Some(tenant) = tenant_of(&headers) else {
        return missing_tenant();
    };
    // The id derives from the idempotency key: the same on every attempt of this intent.
    let hex = idem.downstream_key().to_hex();
    let id = format!("pay_{}", hex.get(..20).unwrap_or(&hex));
    idem.complete_with(move |tx| {
        let new: NewPayment = match serde_json::from_slice(&body) {
            Ok(p) => p,
            Err(e) => return Ok(invalid(&e.to_string())),
        };
        if new.amount <= 0 || new.currency.len() != 3 || new.account.is_empty() {
            return Ok(invalid(
                "amount must be > 0, currency a 3-letter code, account non-empty",
            ));
        }
        let payment = json!({
            "id": id, "account": new.account, "amount": new.amount,
            "currency": new.currency, "status": "captured",
        });
        let stored = json!({"tenant": tenant, "payment": payment}).to_string();
        tx.open_table(PAYMENTS)?
            .insert(id.as_str(), stored.as_str())?;
        let entry = format!("{tenant}\0{id}:capture");
        tx.open_table(LEDGER)?.insert(entry.as_str(), new.amount)?;
        tx.outbox()
            .push(payment_event("payment.captured", &id, &payment))?;
        let mut answer = Recorded::json(StatusCode::CREATED, &payment);
        if let Ok(loc) = format!("/v1/payments/{id}").parse() {
            answer.headers.insert(axum::http::header::LOCATION, loc);
        }
        Ok(answer)
    })
    .await
}

async fn refund_payment(
    headers: HeaderMap,
    Path(id): Path<String>,
    Extension(idem): Extension<Idempotency>,
) -> Response {
    let Some(tenant) = tenant_of(&headers) else {
        return missing_tenant();
    };
    idem.complete_with(move |tx| {
        let mut payments = tx.open_table(PAYMENTS)?;
        let found = payments.get(id.as_str())?.map(|v| v.value().to_owned());
        let Some(mut row) = found
            .and_then(|s| serde_json::from_str::<Value>(&s).ok())
            .filter(|row| row["tenant"] == tenant.as_str())
        else {
            return Ok(Recorded::json(
                StatusCode::NOT_FOUND,
                &json!({"type": "about:blank", "title": "No such payment", "status": 404}),
            ));
        };
        let captured = row["payment"]["status"] == "captured";
        if let Some(payment) = row.get_mut("payment").and_then(Value::as_object_mut)
            && captured
        {
            payment.insert("status".into(), json!("refunded"));
            let amount = payment.get("amount").and_then(Value::as_i64).unwrap_or(0);
            payments.insert(id.as_str(), row.to_string().as_str())?;
            let entry = format!("{tenant}\0{id}:refund");
            tx.open_table(LEDGER)?.insert(entry.as_str(), -amount)?;
            tx.outbox()
                .push(payment_event("payment.refunded", &id, &row["payment"]))?;
        }
        Ok(Recorded::json(StatusCode::OK, &row["payment"]))
    })
    .await
}

/// The outbox event of a payment state change: ordered per payment, so a consumer never sees
/// the refund before the capture.
fn payment_event(kind: &str, id: &str, payment: &Value) -> Event {
    Event::new("payments", payment.to_string())
        .ordering_key(id)
        .header("type", kind)
}

/// One line per published event (no broker here: stdout stands in for it).
pub fn describe(event: &OutboxEvent) -> String {
    let kind = event
        .headers
        .iter()
        .find(|(name, _)| name == "type")
        .map_or("-", |(_, v)| v.as_str());
    format!(
        "published seq={} id={} topic={} key={} type={kind} payload={}",
        event.seq,
        event.id,
        event.topic,
        event.ordering_key.as_deref().unwrap_or("-"),
        String::from_utf8_lossy(&event.payload)
    )
}

/// Starts the outbox dispatcher of the service: its publisher prints each event on stdout
/// ([`describe`]) and reports it delivered. A real service would send it to its broker here.
pub fn start_dispatcher(store: &Store) -> Result<DispatcherHandle, idem::Error> {
    store.start_dispatcher(
        |event: &OutboxEvent| -> Result<(), idem::BoxError> {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "edge_service: {}", describe(event))?;
            out.flush()?;
            Ok(())
        },
        DispatcherOptions::new(),
    )
}

/// Reads run on the blocking pool too: redb reads touch the disk.
async fn read<T: Send + 'static>(
    store: Store,
    f: impl FnOnce(&idem::redb::ReadTransaction) -> Result<T, Box<dyn std::error::Error + Send + Sync>>
    + Send
    + 'static,
) -> Result<T, Response> {
    let failed = |detail: String| {
        problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "about:blank",
            "Read failed",
            &detail,
        )
    };
    match tokio::task::spawn_blocking(move || {
        let txn = store.begin_read()?;
        f(&txn)
    })
    .await
    {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(e) => Err(failed(e.to_string())),
    }
}

async fn get_payment(
    State(store): State<Store>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(tenant) = tenant_of(&headers) else {
        return missing_tenant();
    };
    let row = read(store, move |txn| {
        let table = match txn.open_table(PAYMENTS) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(id.as_str())?.map(|v| v.value().to_owned()))
    })
    .await;
    match row {
        Err(resp) => resp,
        Ok(row) => match row.and_then(|s| serde_json::from_str::<Value>(&s).ok()) {
            Some(row) if row["tenant"] == tenant.as_str() => {
                (StatusCode::OK, Json(row["payment"].clone())).into_response()
            }
            _ => problem_response(
                StatusCode::NOT_FOUND,
                "about:blank",
                "No such payment",
                "no payment with this id for this tenant",
            ),
        },
    }
}

async fn ledger(State(store): State<Store>, headers: HeaderMap) -> Response {
    let Some(tenant) = tenant_of(&headers) else {
        return missing_tenant();
    };
    let counted = read(store, move |txn| {
        let table = match txn.open_table(LEDGER) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok((0u64, 0i64)),
            Err(e) => return Err(e.into()),
        };
        let (from, to) = (format!("{tenant}\0"), format!("{tenant}\u{1}"));
        let mut entries = 0u64;
        let mut total = 0i64;
        for row in table.range(from.as_str()..to.as_str())? {
            let (_, amount) = row?;
            entries += 1;
            total = total.saturating_add(amount.value());
        }
        Ok((entries, total))
    })
    .await;
    match counted {
        Ok((entries, total)) => Json(json!({"entries": entries, "total": total})).into_response(),
        Err(resp) => resp,
    }
}

/// Outbox counts: undelivered events, dead letters, and events delivered by this process.
async fn outbox(State(store): State<Store>) -> Response {
    let counted = read(store.clone(), move |_| {
        let stats = store.outbox_stats()?;
        let delivered = store.metrics().outbox_delivered;
        Ok((stats.pending, stats.dead, delivered))
    })
    .await;
    match counted {
        Ok((pending, dead, delivered)) => {
            Json(json!({"pending": pending, "dead": dead, "delivered": delivered})).into_response()
        }
        Err(resp) => resp,
    }
}

struct Args {
    data: PathBuf,
    listen: SocketAddr,
    lease: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        data: PathBuf::from("data"),
        listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
        lease: Duration::from_secs(30),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--data" => args.data = PathBuf::from(value),
            "--listen" => {
                args.listen = value
                    .parse()
                    .map_err(|e| format!("--listen {value}: {e}"))?
            }
            "--lease-ms" => {
                let ms: u64 = value
                    .parse()
                    .map_err(|e| format!("--lease-ms {value}: {e}"))?;
                args.lease = Duration::from_millis(ms.max(1));
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; use --data DIR, --listen ADDR, --lease-ms MS"
                ));
            }
        }
    }
    Ok(args)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    eprintln!("edge_service: shutting down (finishing requests in flight)");
}

/// Opens the store the way the service does: sweeps every 10 minutes keep the file bounded;
/// `lease` is how long a request that died with the process (kill -9) blocks its key before a
/// retry takes it over (`--lease-ms`, default 30 s).
pub fn open_store(
    dir: &std::path::Path,
    lease: Duration,
) -> Result<Store, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    Ok(Store::builder()
        .sweep_interval(Duration::from_secs(600))
        .lease_duration(lease)
        .open(dir.join("idem.redb"))?)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let store = open_store(&args.data, args.lease)?;
    let dispatcher = start_dispatcher(&store)?;
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    eprintln!(
        "edge_service: listening on http://{} (store {})",
        listener.local_addr()?,
        args.data.join("idem.redb").display()
    );
    axum::serve(listener, app(store))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    // Stops after the publish in progress; undelivered events wait for the next start.
    dispatcher.shutdown()?;
    Ok(())
}
