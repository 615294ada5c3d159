//! `IdempotencyLayer::tenant_header` takes the header name in any case (`X-Tenant-Id` is
//! `x-tenant-id`), and never panics: a name that is not a valid header name at all makes the
//! layer answer every covered request `500` with problem `layer-misconfigured`, without
//! running the handler (uncovered requests pass through).
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use idem::http::IdempotencyLayer;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, counted_route, post_req, problem, store};

#[tokio::test]
async fn a_tenant_header_name_in_any_case_is_that_header() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "X-Tenant-Id"),
        Arc::clone(&calls),
    );
    // `post_req` sends `x-tenant-id: t1`: header names are case-insensitive.
    let (s, h, first) = body_of(
        app.clone()
            .oneshot(post_req("/pay/1", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert!(h.get("idempotent-replayed").is_none());
    let (s, h, again) = body_of(
        app.clone()
            .oneshot(post_req("/pay/1", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!((s, again), (StatusCode::CREATED, first));
    assert_eq!(h["idempotent-replayed"], "true");
    // Without the header: missing tenant.
    let req = Request::post("/pay/1")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .unwrap();
    let (s, _, body) = body_of(app.oneshot(req).await.unwrap()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(problem(&body)["type"], "urn:idem:problem:missing-tenant");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_tenant_header_name_that_is_no_header_name_answers_500_misconfigured() {
    for name in ["x tenant", "", "x-tenant:", "tenant\u{e9}", "a\nb"] {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let app = counted_route(
            IdempotencyLayer::tenant_header(store(&dir), name),
            Arc::clone(&calls),
        );
        let (s, h, body) = body_of(
            app.clone()
                .oneshot(post_req("/pay/1", Some("k"), ""))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{name:?}");
        assert_eq!(h["content-type"], "application/problem+json");
        let p = problem(&body);
        assert_eq!(
            p["type"], "urn:idem:problem:layer-misconfigured",
            "{name:?}"
        );
        assert!(
            p["detail"].as_str().unwrap().contains("tenant_header"),
            "{p}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{name:?}: nothing ran");
    }
}
