//! By default every status the handler answers is recorded except `503 Service Unavailable`
//! (the conventional "not processed, retry later"): a handler that maps "failed after a
//! partial write" to `500` may have caused an effect, so its key must not run it again. Only a
//! 503 (or a status excluded with `record_status`) releases the key.
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use idem::http::{IdempotencyLayer, Recorded};
use idem::redb::ReadableTableMetadata;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, complete_with_route, post_req, store};

/// A route that counts its calls (its "effect") and answers `status` with a body naming the
/// call.
fn answering(layer: IdempotencyLayer, status: StatusCode, calls: Arc<AtomicU32>) -> Router {
    Router::new()
        .route(
            "/charge",
            post(move || {
                let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                async move { (status, format!("call {n}")) }
            }),
        )
        .route_layer(layer)
}

#[tokio::test]
async fn a_500_or_502_after_the_handler_ran_is_recorded_and_replayed() {
    for status in [StatusCode::INTERNAL_SERVER_ERROR, StatusCode::BAD_GATEWAY] {
        let dir = tempfile::tempdir().unwrap();
        let calls = Arc::new(AtomicU32::new(0));
        let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id");
        let app = answering(layer, status, Arc::clone(&calls));
        let (s, h, first) = body_of(
            app.clone()
                .oneshot(post_req("/charge", Some("k"), ""))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!((s, &first[..]), (status, &b"call 1"[..]));
        assert!(h.get("idempotent-replayed").is_none());
        for _ in 0..2 {
            let (s, h, again) = body_of(
                app.clone()
                    .oneshot(post_req("/charge", Some("k"), ""))
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!((s, &again[..]), (status, &b"call 1"[..]), "{status}");
            assert_eq!(h["idempotent-replayed"], "true", "{status}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{status}: one execution");
    }
}

#[tokio::test]
async fn a_503_releases_the_key_and_the_retry_runs() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id");
    let app = answering(layer, StatusCode::SERVICE_UNAVAILABLE, Arc::clone(&calls));
    for n in 1..=2 {
        let (s, h, body) = body_of(
            app.clone()
                .oneshot(post_req("/charge", Some("k"), ""))
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body, format!("call {n}"));
        assert!(h.get("idempotent-replayed").is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

const ROWS: idem::redb::TableDefinition<&str, u64> = idem::redb::TableDefinition::new("rows");

#[tokio::test]
async fn a_500_recorded_through_complete_with_commits_with_its_writes_and_is_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(&dir);
    let calls = Arc::new(AtomicU32::new(0));
    let layer = IdempotencyLayer::tenant_header(store.clone(), "x-tenant-id");
    let app = complete_with_route("/rows", &layer, &calls, |tx| {
        // A write, then a failure answer: like a 4xx, a recorded 500 commits together with
        // the closure's writes.
        tx.open_table(ROWS)?.insert("row", 1)?;
        Ok(Recorded::json(
            StatusCode::INTERNAL_SERVER_ERROR,
            &serde_json::json!({"error": "partial"}),
        ))
    });
    let (s, h, first) = body_of(
        app.clone()
            .oneshot(post_req("/rows", Some("k"), ""))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(h.get("idempotent-replayed").is_none());
    let (s, h, again) = body_of(app.oneshot(post_req("/rows", Some("k"), "")).await.unwrap()).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(again, first);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let read = store.read_transaction().unwrap();
    assert_eq!(read.open_table(ROWS).unwrap().len().unwrap(), 1);
}
