//! A tenant problem has its own type and title (`invalid-tenant`, "Invalid
//! tenant"), not the key's; the key, the tenant and the operation are checked against the
//! store's limits before the request body is read (a bad request never costs a body buffer).
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use axum::body::Body;
use axum::http::StatusCode;
use idem::http::IdempotencyLayer;
use tower::{Layer, ServiceExt};

use crate::http_fixtures;
use http_fixtures::{Untouched, body_of, counted_route, post_with, problem, store};

/// Sends `lines` with a body that must not be read; returns the status and the problem, and
/// asserts the body was not polled.
async fn refused_unread(
    app: &axum::Router,
    lines: &[(&str, &[u8])],
) -> (StatusCode, serde_json::Value) {
    let polled = Arc::new(AtomicBool::new(false));
    let req = post_with("/pay/1", lines, Body::new(Untouched(Arc::clone(&polled))));
    let (s, h, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
    assert!(
        !polled.load(Ordering::SeqCst),
        "the body was read before the request was refused"
    );
    assert_eq!(h["content-type"], "application/problem+json");
    (s, problem(&body))
}

#[tokio::test]
async fn a_long_tenant_gets_a_tenant_problem_without_its_body_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"),
        Arc::clone(&calls),
    );
    // 129 bytes: one over the store's default tenant limit.
    let tenant = "t".repeat(129);
    let (s, p) = refused_unread(
        &app,
        &[
            ("x-tenant-id", tenant.as_bytes()),
            ("idempotency-key", b"k"),
        ],
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["type"], "urn:idem:problem:invalid-tenant");
    assert_eq!(p["title"], "Invalid tenant");
    assert!(p["detail"].as_str().unwrap().contains("129"), "{p}");

    // An empty tenant, one that is not visible ASCII, and two tenant lines: the same problem.
    for lines in [
        vec![("x-tenant-id", b"".as_slice())],
        vec![("x-tenant-id", b"t 1".as_slice())],
        vec![("x-tenant-id", b"caf\xc3\xa9".as_slice())],
        vec![("x-tenant-id", b"t1".as_slice()), ("x-tenant-id", b"t1")],
    ] {
        let mut all = lines.clone();
        all.push(("idempotency-key", b"k"));
        let (s, p) = refused_unread(&app, &all).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{lines:?}");
        assert_eq!(p["type"], "urn:idem:problem:invalid-tenant", "{lines:?}");
    }
    // No tenant at all is still "missing", also without reading the body.
    let (s, p) = refused_unread(&app, &[("idempotency-key", b"k")]).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["type"], "urn:idem:problem:missing-tenant");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_tenant_from_an_extractor_is_checked_against_the_limit_too() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::new(store(&dir), |parts| {
        parts
            .headers
            .get("x-principal")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).repeat(200))
    });
    let app = counted_route(layer, Arc::clone(&calls));
    let (s, p) = refused_unread(&app, &[("x-principal", b"p"), ("idempotency-key", b"k")]).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(p["type"], "urn:idem:problem:invalid-tenant");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_bad_key_is_refused_without_its_body_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"),
        Arc::clone(&calls),
    );
    let long = "k".repeat(256);
    for key in [long.as_bytes(), b"a, b", b"\"\""] {
        let (s, p) =
            refused_unread(&app, &[("x-tenant-id", b"t1"), ("idempotency-key", key)]).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(p["type"], "urn:idem:problem:invalid-idempotency-key");
        assert_eq!(p["title"], "Invalid Idempotency-Key");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn an_operation_over_the_limit_is_refused_without_its_body_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id")
        .operation(|_| Some("o".repeat(129)));
    let app = counted_route(layer, Arc::clone(&calls));
    let (s, p) = refused_unread(&app, &[("x-tenant-id", b"t1"), ("idempotency-key", b"k")]).await;
    // The operation is the service's own naming (route template or `.operation`): a
    // configuration error, not the client's.
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(p["type"], "urn:idem:problem:invalid-operation");
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Without a route template the request path stands in for it: then the client chose the
    // length, and the answer is 400.
    let svc = IdempotencyLayer::tenant_header(store(&tempfile::tempdir().unwrap()), "x-tenant-id")
        .layer(tower::service_fn(|_req: axum::http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(axum::http::Response::new(Body::empty()))
        }));
    let polled = Arc::new(AtomicBool::new(false));
    let path = format!("/{}", "p".repeat(200));
    let req = post_with(
        &path,
        &[("x-tenant-id", b"t1"), ("idempotency-key", b"k")],
        Body::new(Untouched(Arc::clone(&polled))),
    );
    let (s, _, body) = body_of(svc.oneshot(req).await.unwrap()).await;
    assert!(!polled.load(Ordering::SeqCst));
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(problem(&body)["type"], "urn:idem:problem:invalid-operation");
}
