//! The layer bounds its in-flight store admissions (`max_in_flight`, default the store's
//! `max_queue`, at most 256). Over the bound a covered request is answered 503 + `Retry-After`
//! at once, without queueing and without running the handler; store calls after a handler ran
//! (recording, heartbeats) never need a permit, so a started request always records.
#![cfg(feature = "http")]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use idem::http::IdempotencyLayer;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, counted_route, hold_route, post_req, problem, send, store};

/// A guard against a hang on a broken implementation, not a performance bound.
const HANG: Duration = Duration::from_secs(20);

/// A spawned request's answer (status, headers, body), awaited at most [`HANG`].
async fn finished(
    request: JoinHandle<Result<Response, Infallible>>,
) -> (StatusCode, HeaderMap, Bytes) {
    body_of(
        tokio::time::timeout(HANG, request)
            .await
            .unwrap()
            .unwrap()
            .unwrap(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_in_flight_limit_a_request_gets_503_at_once_and_parked_ones_finish_once() {
    let dir = tempfile::tempdir().unwrap();
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id").max_in_flight(2);
    assert_eq!(layer.metrics().max_in_flight, 2);
    let calls = Arc::new(AtomicU32::new(0));

    // `/hold` records its answer in a transaction that waits for the test: while it waits it
    // holds the store's single writer, so every other claim waits inside the store.
    let entered = Arc::new(Notify::new());
    let (hold, release) = hold_route("/hold", &entered);
    let hold = hold.route_layer(layer.clone());
    let app = counted_route(layer.clone(), Arc::clone(&calls)).merge(hold);

    let holder = tokio::spawn(app.clone().oneshot(post_req("/hold", Some("h"), "")));
    entered.notified().await;
    // Two claims take the two permits and wait in the store behind the writer.
    let parked: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|k| {
            tokio::spawn(
                app.clone()
                    .oneshot(post_req(&format!("/pay/{k}"), Some(k), "")),
            )
        })
        .collect();
    let mut spins = 0;
    while layer.metrics().in_flight < 2 {
        spins += 1;
        assert!(spins < 4_000, "the two claims never took their permits");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A third covered request: 503 + Retry-After, answered while the store is still blocked.
    let (s, h, body) = body_of(
        tokio::time::timeout(HANG, app.clone().oneshot(post_req("/pay/c", Some("c"), "")))
            .await
            .expect("an overloaded request is answered without waiting for the store")
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(problem(&body)["type"], "urn:idem:problem:retry-later");
    assert_eq!(layer.metrics().overloaded, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing ran yet");

    // Unblock the writer: the holder records (its recording needs no permit), the parked
    // claims go through and run their handlers once each.
    release.send(()).unwrap();
    let (s, _, _) = finished(holder).await;
    assert_eq!(s, StatusCode::CREATED);
    for p in parked {
        let (s, h, _) = finished(p).await;
        assert_eq!(s, StatusCode::CREATED);
        assert!(h.get("idempotent-replayed").is_none());
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one effect per parked request"
    );
    assert_eq!(layer.metrics().in_flight, 0);

    // The refused request ran nothing: its retry runs now, once; every other key replays.
    let (s, h, _) = send(&app, post_req("/pay/c", Some("c"), "")).await;
    assert_eq!(s, StatusCode::CREATED);
    assert!(h.get("idempotent-replayed").is_none());
    for (path, key) in [
        ("/hold", "h"),
        ("/pay/a", "a"),
        ("/pay/b", "b"),
        ("/pay/c", "c"),
    ] {
        let (_, h, _) = send(&app, post_req(path, Some(key), "")).await;
        assert_eq!(h["idempotent-replayed"], "true", "{path}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_in_flight_limit_defaults_to_the_store_queue_at_most_256() {
    // The store's default queue (4,096) is larger than tokio's blocking pool (512 threads):
    // the default stays at half the pool, so finishing calls and heartbeats find a thread.
    let dir = tempfile::tempdir().unwrap();
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id");
    assert_eq!(layer.metrics().max_in_flight, 256);
    // An explicit limit overrides it, larger or smaller.
    assert_eq!(
        layer.clone().max_in_flight(1000).metrics().max_in_flight,
        1000
    );
    assert_eq!(layer.max_in_flight(3).metrics().max_in_flight, 3);

    // A store queue under 256 is the limit.
    let dir = tempfile::tempdir().unwrap();
    let store = idem::Store::builder()
        .max_queue(7)
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let layer = IdempotencyLayer::tenant_header(store, "x-tenant-id");
    let m = layer.metrics();
    assert_eq!((m.max_in_flight, m.in_flight, m.overloaded), (7, 0, 0));
}
