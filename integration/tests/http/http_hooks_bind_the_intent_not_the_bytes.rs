//! The layer's hooks for what binds a key and what a replay carries: `canonical_json_body` (the
//! same JSON re-serialised is the same request even without a JSON `Content-Type`; a different
//! value is still 422),
//! `fingerprint_body_with` (only the chosen part binds the key), `key_from_request` (a key
//! inside the request when there is no header; the header wins; none is 400) and `on_replay`
//! (called on replays only).
#![cfg(feature = "http")]

use crate::http_fixtures;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::{HeaderValue, StatusCode};
use axum::routing::post;
use http_fixtures::{post_req, send, store};
use idem::http::IdempotencyLayer;

/// A router whose handler counts its runs and answers 201 with the run number.
fn counted_app(layer: IdempotencyLayer) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let router = Router::new()
        .route(
            "/v1/orders",
            post(move || {
                let counted = Arc::clone(&counted);
                async move {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    (StatusCode::CREATED, format!("run {n}"))
                }
            }),
        )
        .route_layer(layer);
    (router, runs)
}

#[tokio::test]
async fn canonical_json_makes_reordered_keys_and_whitespace_the_same_request() {
    let dir = tempfile::tempdir().unwrap();
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id").canonical_json_body();
    let (app, runs) = counted_app(layer);
    let first = send(
        &app,
        post_req("/v1/orders", Some("k1"), r#"{"sku":"a","qty":2}"#),
    )
    .await;
    assert_eq!(first.0, StatusCode::CREATED);
    let again = send(
        &app,
        post_req(
            "/v1/orders",
            Some("k1"),
            "{ \"qty\": 2,\n  \"sku\": \"a\" }",
        ),
    )
    .await;
    assert_eq!(again.0, StatusCode::CREATED);
    assert_eq!(again.2, first.2, "replayed, not run again");
    assert_eq!(again.1["idempotent-replayed"], "true");
    let other = send(
        &app,
        post_req("/v1/orders", Some("k1"), r#"{"qty":3,"sku":"a"}"#),
    )
    .await;
    assert_eq!(
        other.0,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another value is another request"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Without the option an unlabelled body (no JSON `Content-Type`) is compared by its bytes:
    // the re-serialised body is a different request.
    let dir = tempfile::tempdir().unwrap();
    let (plain, _) = counted_app(IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"));
    send(
        &plain,
        post_req("/v1/orders", Some("k1"), r#"{"sku":"a","qty":2}"#),
    )
    .await;
    let reordered = send(
        &plain,
        post_req("/v1/orders", Some("k1"), r#"{"qty":2,"sku":"a"}"#),
    )
    .await;
    assert_eq!(reordered.0, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn a_chosen_part_of_the_body_binds_the_key() {
    let dir = tempfile::tempdir().unwrap();
    // Only `amount` defines the intent; `client_ts` differs on every retry.
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id").fingerprint_body_with(
        |_, body| {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            v["amount"].to_string().into_bytes()
        },
    );
    let (app, runs) = counted_app(layer);
    let first = send(
        &app,
        post_req("/v1/orders", Some("k1"), r#"{"amount":4200,"client_ts":1}"#),
    )
    .await;
    let retry = send(
        &app,
        post_req("/v1/orders", Some("k1"), r#"{"amount":4200,"client_ts":2}"#),
    )
    .await;
    assert_eq!(retry.2, first.2);
    assert_eq!(retry.1["idempotent-replayed"], "true");
    let other = send(
        &app,
        post_req("/v1/orders", Some("k1"), r#"{"amount":9900,"client_ts":3}"#),
    )
    .await;
    assert_eq!(other.0, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_key_from_the_request_when_there_is_no_header() {
    let dir = tempfile::tempdir().unwrap();
    let layer =
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id").key_from_request(|_, body| {
            let v: serde_json::Value = serde_json::from_slice(body).ok()?;
            v["message_id"].as_str().map(str::to_owned)
        });
    let (app, runs) = counted_app(layer);
    let body = r#"{"message_id":"msg-1","amount":5}"#;
    let first = send(&app, post_req("/v1/orders", None, body)).await;
    assert_eq!(first.0, StatusCode::CREATED);
    let again = send(&app, post_req("/v1/orders", None, body)).await;
    assert_eq!(again.2, first.2);
    assert_eq!(again.1["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // No key anywhere: 400, the handler never runs.
    let none = send(&app, post_req("/v1/orders", None, r#"{"amount":5}"#)).await;
    assert_eq!(none.0, StatusCode::BAD_REQUEST);
    // A key that is no key (control characters): 400.
    let bad = send(
        &app,
        post_req("/v1/orders", None, r#"{"message_id":"a\u0001b"}"#),
    )
    .await;
    assert_eq!(bad.0, StatusCode::BAD_REQUEST);
    // The header wins over the body's key: a new intent under the header's key.
    let header = send(&app, post_req("/v1/orders", Some("hdr-1"), body)).await;
    assert_eq!(header.0, StatusCode::CREATED);
    assert_ne!(header.2, first.2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn on_replay_sees_replays_only() {
    let dir = tempfile::tempdir().unwrap();
    let layer =
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id").on_replay(|parts, resp| {
            assert_eq!(parts.uri.path(), "/v1/orders");
            resp.headers_mut()
                .insert("x-replay-hook", HeaderValue::from_static("seen"));
        });
    let (app, _) = counted_app(layer);
    let first = send(&app, post_req("/v1/orders", Some("k1"), "{}")).await;
    assert!(
        first.1.get("x-replay-hook").is_none(),
        "not on a first answer"
    );
    let again = send(&app, post_req("/v1/orders", Some("k1"), "{}")).await;
    assert_eq!(again.1["x-replay-hook"], "seen");
}
