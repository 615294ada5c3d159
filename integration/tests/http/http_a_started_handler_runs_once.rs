//! Once the handler ran, its key never runs it again for the record's lifetime.
//! An answer over the store's `max_response_bytes` is recorded without its body (status,
//! replayed headers, `Location`) and replayed with `Idempotent-Body-Omitted: true`; a handler
//! that panics, whose response body fails, or whose inner service returns `Err`, is recorded as
//! a terminal 500 failure and replayed. (Only 503, or a status the user excludes with
//! `record_status`, releases the key: `integration/tests/http/http_layer.rs`,
//! `integration/tests/http/http_a_server_error_is_recorded_unless_503.rs`.)
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::Extension;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use idem::http::{IDEMPOTENT_BODY_OMITTED, IdempotencyHandle, IdempotencyLayer, Recorded};
use idem::redb::ReadableTableMetadata;
use tower::{Layer, ServiceExt};

use crate::http_fixtures;
use http_fixtures::{Breaks, complete_with_route, post_req, problem, send, store};

/// 100 KiB: over the store's default `max_response_bytes` (64 KiB).
const BIG: usize = 100 * 1024;

/// A layer (tenant header `x-tenant-id`) on a fresh store in `dir`, and a handler call counter.
fn layer_and_calls(dir: &tempfile::TempDir) -> (IdempotencyLayer, Arc<AtomicU32>) {
    let layer = IdempotencyLayer::tenant_header(store(dir), "x-tenant-id");
    (layer, Arc::new(AtomicU32::new(0)))
}

/// Asserts that the handler ran once and that the layer counted one handler failure.
#[track_caller]
fn ran_once_and_failed(calls: &AtomicU32, layer: &IdempotencyLayer) {
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.metrics().handler_failures, 1);
}

/// Retries `body` with key `k` on `path`: asserts a replay without body; returns its headers.
async fn replayed_without_its_body(
    app: &Router,
    path: &str,
    body: &str,
    status: StatusCode,
    location: &str,
) -> HeaderMap {
    let (s, h, body) = send(app, post_req(path, Some("k"), body)).await;
    assert_eq!(s, status);
    assert!(body.is_empty());
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(h[IDEMPOTENT_BODY_OMITTED], "true");
    assert_eq!(h["location"], location);
    h
}

#[tokio::test]
async fn an_oversized_answer_runs_once_and_is_replayed_without_its_body() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, calls) = layer_and_calls(&dir);
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/reports",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async {
                    (
                        StatusCode::CREATED,
                        [("location", "/reports/7"), ("content-type", "text/csv")],
                        "x".repeat(BIG),
                    )
                }
            }),
        )
        .route_layer(layer.clone());

    // The first answer goes out whole.
    let (s, h, body) = send(&app, post_req("/reports", Some("k"), "q")).await;
    assert_eq!((s, body.len()), (StatusCode::CREATED, BIG));
    assert!(h.get("idempotent-replayed").is_none());
    assert!(h.get(IDEMPOTENT_BODY_OMITTED).is_none());

    // Every retry: the recorded status and Location, no body, and the marker; no second run.
    for _ in 0..2 {
        let h = replayed_without_its_body(&app, "/reports", "q", StatusCode::CREATED, "/reports/7")
            .await;
        // A header that describes the body is not replayed without it.
        assert!(h.get("content-type").is_none());
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "one execution, two replays"
    );
    assert_eq!(layer.metrics().bodies_not_kept, 1);
}

const ROWS: idem::redb::TableDefinition<&str, u64> = idem::redb::TableDefinition::new("rows");

#[tokio::test]
async fn an_oversized_answer_recorded_by_the_handler_commits_its_effect_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id");
    let app = complete_with_route("/rows", &layer, &calls, |tx| {
        let mut rows = tx.open_table(ROWS)?;
        let n = rows.len()?;
        rows.insert(format!("row-{n}").as_str(), n)?;
        let mut answer = Recorded::json(
            StatusCode::OK,
            &serde_json::json!({"row": n, "pad": "x".repeat(BIG)}),
        );
        answer
            .headers
            .insert("location", "/rows/0".parse().unwrap());
        Ok(answer)
    });

    let (s, h, body) = send(&app, post_req("/rows", Some("k"), "")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(body.len() > BIG);
    assert!(h.get("idempotent-replayed").is_none());
    for _ in 0..2 {
        replayed_without_its_body(&app, "/rows", "", StatusCode::OK, "/rows/0").await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let read = store.read_transaction().unwrap();
    assert_eq!(read.open_table(ROWS).unwrap().len().unwrap(), 1, "one row");
    assert_eq!(layer.metrics().bodies_not_kept, 1);
}

/// Sends `key` twice to `app`: the first answer is the layer's 500 problem, the second its
/// replay; returns nothing, asserts both.
async fn fails_once_then_replays_the_failure(app: Router, path: &str) {
    let (s, h, first) = send(&app, post_req(path, Some("k"), "")).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(problem(&first)["type"], "urn:idem:problem:handler-failed");
    assert!(h.get("idempotent-replayed").is_none());
    let (s, h, again) = send(&app, post_req(path, Some("k"), "")).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(again, first);
}

#[tokio::test]
async fn a_panicking_handler_is_recorded_as_a_failure_and_never_runs_again() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, calls) = layer_and_calls(&dir);
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/charge",
            post(move || {
                let c = Arc::clone(&c);
                async move {
                    // The effect happens, then the handler panics before answering.
                    c.fetch_add(1, Ordering::SeqCst);
                    if c.load(Ordering::SeqCst) > 0 {
                        panic!("handler bug after the charge");
                    }
                    "unreachable"
                }
            }),
        )
        .route_layer(layer.clone());
    fails_once_then_replays_the_failure(app, "/charge").await;
    ran_once_and_failed(&calls, &layer);
}

#[tokio::test]
async fn a_response_body_that_fails_is_recorded_as_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, calls) = layer_and_calls(&dir);
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/export",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::OK, Body::new(Breaks(false))).into_response() }
            }),
        )
        .route_layer(layer.clone());
    fails_once_then_replays_the_failure(app, "/export").await;
    ran_once_and_failed(&calls, &layer);
}

#[tokio::test]
async fn an_inner_service_error_is_recorded_as_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let (layer, calls) = layer_and_calls(&dir);
    let c = Arc::clone(&calls);
    // A plain tower service whose error is not an HTTP answer (e.g. a timeout inside it).
    let svc = layer.layer(tower::service_fn(move |_req: axum::http::Request<Body>| {
        c.fetch_add(1, Ordering::SeqCst);
        async { Err::<axum::http::Response<Body>, _>(std::io::Error::other("timed out")) }
    }));
    let first = svc.clone().oneshot(post_req("/job", Some("k"), "")).await;
    assert_eq!(first.unwrap_err().to_string(), "timed out");
    let (s, h, body) = send(&svc, post_req("/job", Some("k"), "")).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(problem(&body)["type"], "urn:idem:problem:handler-failed");
    ran_once_and_failed(&calls, &layer);
}

#[tokio::test]
async fn a_panic_inside_complete_with_rolls_its_writes_back_and_is_recorded_as_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id");
    let app = complete_with_route("/book", &layer, &calls, |tx| {
        tx.open_table(ROWS)?.insert("row", 1)?;
        panic!("handler bug inside the transaction");
    });
    // The handler started (it may have called out before `complete_with`): like any panic
    // after the start, a terminal 500 is recorded and replayed, never a second run.
    fails_once_then_replays_the_failure(app, "/book").await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(layer.metrics().handler_failures, 1);
    // The transaction's writes went with the panic.
    let read = store.read_transaction().unwrap();
    assert!(
        read.open_table(ROWS).map_or(0, |t| t.len().unwrap()) == 0,
        "the panicked transaction's write was rolled back"
    );
}

#[tokio::test]
async fn a_terminal_abort_from_complete_with_is_a_first_answer_fitted_into_the_cap() {
    use idem::{Abort, Response};
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let layer = IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id");
    let app = Router::new()
        .route(
            "/charge/{size}",
            post(
                move |axum::extract::Path(size): axum::extract::Path<usize>,
                      Extension(idem): Extension<IdempotencyHandle>| {
                    c.fetch_add(1, Ordering::SeqCst);
                    async move {
                        idem.complete_with(move |tx| {
                            // A terminal failure commits the closure's writes with it.
                            tx.open_table(ROWS)?.insert(size.to_string().as_str(), 1)?;
                            Err(Abort::Terminal(
                                Response::new(402, "d".repeat(size))
                                    .with_resource("location", "/charges/1"),
                            ))
                        })
                        .await
                    }
                },
            ),
        )
        .route_layer(layer.clone());

    for size in [8, BIG] {
        let path = format!("/charge/{size}");
        let key = format!("k{size}");
        // The first answer is the handler's, whole, and does not say it is a replay.
        let (s, h, body) = send(&app, post_req(&path, Some(&key), "")).await;
        assert_eq!(
            (s, body.len()),
            (StatusCode::PAYMENT_REQUIRED, size),
            "{size}"
        );
        assert!(h.get("idempotent-replayed").is_none(), "{size}");
        assert_eq!(h["location"], "/charges/1");
        // Every retry replays the recorded failure; an oversized body was not kept.
        let (s, h, again) = send(&app, post_req(&path, Some(&key), "")).await;
        assert_eq!(s, StatusCode::PAYMENT_REQUIRED);
        assert_eq!(h["idempotent-replayed"], "true");
        assert_eq!(h["location"], "/charges/1");
        if size == BIG {
            assert!(again.is_empty());
            assert_eq!(h[IDEMPOTENT_BODY_OMITTED], "true");
        } else {
            assert_eq!(again, body);
        }
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one execution per key");
    assert_eq!(layer.metrics().bodies_not_kept, 1);
    let read = store.read_transaction().unwrap();
    assert_eq!(read.open_table(ROWS).unwrap().len().unwrap(), 2);
}

/// A lease that has lapsed again after every renewal before its handler could start (here one
/// shorter than the store's millisecond clock: it lapses when granted) is answered 503 with
/// nothing run and the key given back, instead of renewing forever or starting the handler
/// under a lease a retry could take over.
#[tokio::test]
async fn a_lease_that_lapses_before_its_handler_starts_is_a_503_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let store = idem::Store::builder()
        .lease_duration(std::time::Duration::from_micros(1))
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let layer = IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id");
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/payments",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { StatusCode::CREATED }
            }),
        )
        .route_layer(layer);

    for _ in 0..3 {
        let (s, h, body) = send(&app, post_req("/payments", Some("k"), "{}")).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(h.contains_key("retry-after"));
        let p = problem(&body);
        assert!(
            p["detail"].as_str().unwrap().contains("lease_duration"),
            "{p}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // Given back: no record of a claim is left behind.
    let scope = idem::Scope::new("t1", "POST /payments");
    assert!(store.get(&scope, b"k").unwrap().is_none());
}
