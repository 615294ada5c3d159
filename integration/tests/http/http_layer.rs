//! The `Idempotency-Key` layer's HTTP contract, driven with tower's `oneshot` (no sockets).
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderName, Method, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use idem::Store;
use idem::http::{IdempotencyLayer, MissingKey};
use tokio::sync::Notify;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{Chunks, body_of, post_req, slow_route, store};

/// A route that counts its calls and answers with the status the test set.
fn counting(store: Store, status: Arc<AtomicU32>, calls: Arc<AtomicU32>) -> Router {
    Router::new()
        .route(
            "/things/{id}",
            post(move |body: Bytes| {
                let status = Arc::clone(&status);
                let calls = Arc::clone(&calls);
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    let code = StatusCode::from_u16(status.load(Ordering::SeqCst) as u16).unwrap();
                    (
                        code,
                        [("x-call", n.to_string()), ("x-secret", "s".to_owned())],
                        format!("call {n}: {}", String::from_utf8_lossy(&body)),
                    )
                        .into_response()
                }
            }),
        )
        .route("/things/{id}", get(|| async { "read" }))
        .route_layer(IdempotencyLayer::tenant_header(store, "x-tenant-id"))
}

#[tokio::test]
async fn second_request_while_the_first_runs_gets_409_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicU32::new(0));
    let app = slow_route("/slow", &entered, &release, &calls)
        .route_layer(IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"));

    let first = tokio::spawn(app.clone().oneshot(post_req("/slow", Some("k"), "x")));
    entered.notified().await;
    let (status, headers, body) = body_of(
        app.clone()
            .oneshot(post_req("/slow", Some("k"), "x"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(headers["content-type"], "application/problem+json");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry >= 1);
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "urn:idem:problem:request-in-flight");
    assert_eq!(problem["status"], 409);

    release.notify_one();
    let (status, _, body) = body_of(first.await.unwrap().unwrap()).await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"done"[..]));
    let (status, headers, body) = body_of(
        app.oneshot(post_req("/slow", Some("k"), "x"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((status, &body[..]), (StatusCode::CREATED, &b"done"[..]));
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_503_is_retryable_client_errors_are_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let status = Arc::new(AtomicU32::new(503));
    let calls = Arc::new(AtomicU32::new(0));
    let app = counting(store(&dir), Arc::clone(&status), Arc::clone(&calls));

    // 503 (the default's only unrecorded status): nothing stored, the retry runs the handler
    // again. (Other 5xx are recorded: integration/tests/http/http_a_server_error_is_recorded_unless_503.rs.)
    let (s, h, _) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("a"), "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(h.get("idempotent-replayed").is_none());
    status.store(404, Ordering::SeqCst);
    let (s, _, first) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("a"), "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // 4xx: stored and replayed; the handler is not called again.
    status.store(201, Ordering::SeqCst);
    let (s, h, again) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("a"), "p"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(again, first);
    assert_eq!(h["idempotent-replayed"], "true");
    // Only the configured headers come back (Content-Type, Location by default).
    assert!(h.get("x-secret").is_none());
    assert!(h.get("x-call").is_none());
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn record_status_and_replay_headers_are_configurable() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id")
        // 409 from the handler (e.g. a conflict that may clear) is not recorded.
        .record_status(|s| !s.is_server_error() && s != StatusCode::CONFLICT)
        .replay_headers([HeaderName::from_static("x-call")]);
    let app = Router::new()
        .route(
            "/x",
            post(move || {
                let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    let code = if n == 1 {
                        StatusCode::CONFLICT
                    } else {
                        StatusCode::OK
                    };
                    (code, [("x-call", n.to_string())], "ok")
                }
            }),
        )
        .route_layer(layer);
    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/x", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/x", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (s, h, _) = body_of(app.oneshot(post_req("/x", Some("k"), "")).await.unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-call"], "2");
    assert!(h.get("content-type").is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn mismatch_missing_key_tenant_body_limit_and_safe_methods() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let status = Arc::new(AtomicU32::new(201));
    let app = counting(store(&dir), status, Arc::clone(&calls));

    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("k"), "a"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    // Same key, another body: 422.
    let (s, h, _) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("k"), "b"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(h["content-type"], "application/problem+json");
    // Same key, same body, another resource of the same route template: the scope is the
    // template, the fingerprint covers the concrete path: 422, not a replay of /things/1.
    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/things/2", Some("k"), "a"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    // No key: 400, handler not called.
    let (s, _, body) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", None, "a"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], "urn:idem:problem:missing-idempotency-key");
    // Empty and over-long keys: 400.
    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some("\"\""), "a"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let long = "k".repeat(300);
    let (s, _, body) = body_of(
        app.clone()
            .oneshot(post_req("/things/1", Some(&long), "a"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], "urn:idem:problem:invalid-idempotency-key");
    // No tenant: 400.
    let req = Request::builder()
        .method(Method::POST)
        .uri("/things/1")
        .header("idempotency-key", "k2")
        .body(Body::from("a"))
        .unwrap();
    let (s, _, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let p: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(p["type"], "urn:idem:problem:missing-tenant");
    // GET is not covered: passes through without a key.
    let req = Request::builder()
        .uri("/things/1")
        .body(Body::empty())
        .unwrap();
    let (s, _, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
    assert_eq!((s, &body[..]), (StatusCode::OK, &b"read"[..]));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Over the body limit: 413, whether the length is declared or streamed.
    let dir2 = tempfile::tempdir().unwrap();
    let limited = Router::new()
        .route("/b", post(|| async { "ok" }))
        .route_layer(IdempotencyLayer::tenant_header(store(&dir2), "x-tenant-id").body_limit(8));
    let (s, h, _) = body_of(
        limited
            .clone()
            .oneshot(post_req("/b", Some("k"), "123456789"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(h["content-type"], "application/problem+json");
    let stream = Body::new(Chunks(vec!["12345", "6789"]));
    let req = Request::builder()
        .method(Method::POST)
        .uri("/b")
        .header("x-tenant-id", "t1")
        .header("idempotency-key", "k")
        .body(stream)
        .unwrap();
    let (s, _, _) = body_of(limited.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    let (s, _, _) = body_of(
        limited
            .oneshot(post_req("/b", Some("k"), "12345678"))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn missing_key_can_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let app = Router::new()
        .route("/p", post(|| async { (StatusCode::CREATED, "made") }))
        .route_layer(
            IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id")
                .missing_key(MissingKey::PassThrough),
        );
    let (s, h, _) = body_of(app.clone().oneshot(post_req("/p", None, "")).await.unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
    assert!(h.get("idempotent-replayed").is_none());
}

#[tokio::test]
async fn a_started_handler_is_recorded_even_if_the_client_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let calls = Arc::new(AtomicU32::new(0));
    let app = slow_route("/slow", &entered, &release, &calls)
        .route_layer(IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"));
    let client = tokio::spawn(app.clone().oneshot(post_req("/slow", Some("k"), "x")));
    entered.notified().await;
    client.abort(); // the connection drops: the layer's future is dropped
    let _ = client.await;
    release.notify_one();
    // The handler finishes in its own task and its answer is recorded: the retry replays it.
    // Polled until a deadline far above any fsync stall on a loaded CI box (the answer's commit
    // is one fsync away), not a fixed number of tries.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut replayed = None;
    while std::time::Instant::now() < deadline {
        let (s, h, body) = body_of(
            app.clone()
                .oneshot(post_req("/slow", Some("k"), "x"))
                .await
                .unwrap(),
        )
        .await;
        if s == StatusCode::CONFLICT {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            continue;
        }
        replayed = Some((s, h, body));
        break;
    }
    let (s, h, body) = replayed.expect("answer recorded");
    assert_eq!((s, &body[..]), (StatusCode::CREATED, &b"done"[..]));
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

const ROWS: idem::redb::TableDefinition<&str, u64> = idem::redb::TableDefinition::new("rows");

#[tokio::test]
async fn complete_with_commits_the_handlers_writes_with_the_answer_or_neither() {
    use axum::extract::Extension;
    use idem::http::{IdempotencyHandle, Recorded};
    use idem::redb::ReadableTableMetadata;

    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let fail_first = Arc::new(AtomicU32::new(1));
    let f = Arc::clone(&fail_first);
    let app = Router::new()
        .route(
            "/rows",
            post(move |Extension(idem): Extension<IdempotencyHandle>| {
                let f = Arc::clone(&f);
                async move {
                    idem.complete_with(move |tx| {
                        let mut rows = tx.open_table(ROWS)?;
                        let n = rows.len()?;
                        rows.insert(format!("row-{n}").as_str(), n)?;
                        // The first attempt fails with a 503: its row must not persist.
                        let status = if f.swap(0, Ordering::SeqCst) == 1 {
                            StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            StatusCode::CREATED
                        };
                        Ok(Recorded::json(status, &serde_json::json!({"row": n})))
                    })
                    .await
                }
            }),
        )
        .route_layer(IdempotencyLayer::tenant_header(
            store.clone(),
            "x-tenant-id",
        ));
    let count = |store: &Store| {
        let read = store.read_transaction().unwrap();
        read.open_table(ROWS).map_or(0, |t| t.len().unwrap())
    };

    let (s, h, _) = body_of(
        app.clone()
            .oneshot(post_req("/rows", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert!(h.get("idempotent-replayed").is_none());
    assert_eq!(count(&store), 0, "a 503 rolls the handler's writes back");

    let (s, _, first) = body_of(
        app.clone()
            .oneshot(post_req("/rows", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(&first[..], br#"{"row":0}"#);
    let (s, h, again) = body_of(app.oneshot(post_req("/rows", Some("k"), "")).await.unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(again, first);
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(count(&store), 1, "one row for one intent");
}

#[tokio::test]
async fn after_the_retention_a_retry_gets_the_status_and_location_without_a_body() {
    use idem::Timestamp;
    use idem::clock::ManualClock;
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = Store::builder()
        .clock(clock.clone())
        .retention(std::time::Duration::from_secs(3600))
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let app = Router::new()
        .route(
            "/o",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                async { (StatusCode::CREATED, [("location", "/o/1")], "made") }
            }),
        )
        .route_layer(IdempotencyLayer::tenant_header(store, "x-tenant-id"));
    let (s, _, _) = body_of(
        app.clone()
            .oneshot(post_req("/o", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    clock.advance(std::time::Duration::from_secs(2 * 3600));
    let (s, h, body) = body_of(app.oneshot(post_req("/o", Some("k"), "")).await.unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
    assert!(body.is_empty());
    assert_eq!(h["location"], "/o/1");
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_lease_is_not_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::builder()
        // A lease long enough that a heartbeat (every third of it, one fsync each) is never late on a
        // loaded CI box: a late heartbeat lets the retry take over, which is correct behaviour but
        // not what this test is about. 150 ms failed under the packaged-crate test run.
        .lease_duration(std::time::Duration::from_millis(1000))
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let c = Arc::clone(&calls);
    let (entered, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (e, r) = (Arc::clone(&entered), Arc::clone(&release));
    let app = Router::new()
        .route(
            "/slow",
            post(move || {
                c.fetch_add(1, Ordering::SeqCst);
                let (e, r) = (Arc::clone(&e), Arc::clone(&r));
                async move {
                    e.notify_one();
                    // Runs until the test has probed for twice the lease duration.
                    r.notified().await;
                    (StatusCode::CREATED, "done")
                }
            }),
        )
        .route_layer(IdempotencyLayer::tenant_header(store, "x-tenant-id"));
    let started = std::time::Instant::now();
    let first = tokio::spawn(app.clone().oneshot(post_req("/slow", Some("k"), "x")));
    entered.notified().await;
    // Well past the lease duration, the first attempt still holds the key: heartbeats.
    let mut probes = 0;
    while started.elapsed() < std::time::Duration::from_millis(2200) {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let (s, _, _) = body_of(
            app.clone()
                .oneshot(post_req("/slow", Some("k"), "x"))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            s,
            StatusCode::CONFLICT,
            "probe {probes} at {:?}",
            started.elapsed()
        );
        probes += 1;
    }
    assert!(
        probes >= 2,
        "only {probes} probes in {:?}",
        started.elapsed()
    );
    release.notify_one();
    let (s, _, _) = body_of(first.await.unwrap().unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
