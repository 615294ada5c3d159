//! The example service (`examples/edge_service/`) checks the tenant of its read routes with
//! the layer's own rule (`idem::http::tenant_from_header`): a tenant the layer refuses on
//! `POST` (a comma, over the store's tenant limit) is refused on `GET` too, and one it accepts
//! is accepted by both. Driven in-process with tower's `oneshot`.
#![cfg(feature = "http")]

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, problem};

const PAY: &str = r#"{"account":"acc_1","amount":4200,"currency":"EUR"}"#;

fn request(
    method: Method,
    path: &str,
    tenant: &str,
    key: Option<&str>,
    body: &str,
) -> Request<Body> {
    let mut b = Request::builder()
        .method(method)
        .uri(path)
        .header("x-tenant-id", tenant)
        .header("content-type", "application/json");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

#[tokio::test]
async fn a_tenant_the_layer_refuses_is_refused_by_the_read_routes_too() {
    let dir = tempfile::tempdir().unwrap();
    let store = edge_service::open_store(dir.path(), std::time::Duration::from_secs(30)).unwrap();
    let app = edge_service::app(store, edge_service::Delivered::default());
    let long = "t".repeat(129);
    for (i, tenant) in ["t,1", "t1,t2", long.as_str()].into_iter().enumerate() {
        // The layer, on the POST route: 400 invalid-tenant, nothing booked.
        let key = format!("k{i}");
        let post = request(Method::POST, "/v1/payments", tenant, Some(&key), PAY);
        let (s, _, body) = body_of(app.clone().oneshot(post).await.unwrap()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{tenant}");
        assert_eq!(problem(&body)["type"], "urn:idem:problem:invalid-tenant");
        // The service's own extractor, on the read routes: refused as well, with its problem.
        for path in ["/v1/ledger", "/v1/outbox", "/v1/payments/pay_x"] {
            let get = request(Method::GET, path, tenant, None, "");
            let (s, h, body) = body_of(app.clone().oneshot(get).await.unwrap()).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {tenant}");
            assert_eq!(h["content-type"], "application/problem+json");
            assert_eq!(
                problem(&body)["type"],
                "urn:edge-service:problem:invalid-tenant",
                "{path} {tenant}"
            );
        }
    }

    // A tenant both accept: exactly the store's limit, visible ASCII.
    let max = "t".repeat(128);
    let post = request(Method::POST, "/v1/payments", &max, Some("ok"), PAY);
    let (s, _, _) = body_of(app.clone().oneshot(post).await.unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
    let get = request(Method::GET, "/v1/ledger", &max, None, "");
    let (s, _, body) = body_of(app.oneshot(get).await.unwrap()).await;
    assert_eq!(s, StatusCode::OK);
    let ledger: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(ledger["entries"], 1);
}
