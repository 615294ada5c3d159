//! `idem get --body` on records the HTTP layer wrote: the stored `IDH1` / `IDH2` envelope is
//! decoded into the answer's status, its replayed headers and its body (text when it is UTF-8,
//! hex when not; "not kept" when the answer was over `max_response_bytes`), in text and in
//! `--json`, instead of the envelope's raw bytes.
//!
//! The records are written by an `IdempotencyLayer` in front of axum routes (called as a tower
//! `Service` on a current-thread runtime, no sockets; only the library's own `http` dependencies,
//! so the test stays in the package of the `idem` binary); the store and the CLI share the file in multi-process mode, so the
//! CLI reads it while the layer still holds it.
#![cfg(all(feature = "cli", feature = "http"))]

use crate::idem_cli;

use std::path::Path;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use idem::Store;
use idem::http::IdempotencyLayer;
use idem_cli::idem;

/// A POST to `path` for tenant t1 with `key` and `body`.
fn post_req(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("x-tenant-id", "t1");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// Sends `req` through `app` (ready, then called) and returns the answer's status.
async fn send(app: &Router, req: Request<Body>) -> StatusCode {
    use tower::Service;
    let mut svc = app.clone();
    std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut svc, cx))
        .await
        .unwrap();
    svc.call(req).await.unwrap().status()
}

/// `idem --multi-process get --body` of the layer's record for `route` and `key` (tenant t1),
/// with `more` flags; its stdout.
fn get_body(file: &Path, route: &str, key: &str, more: &[&str]) -> String {
    let op = format!("POST {route}");
    let args = [
        &[
            "--multi-process",
            "get",
            "--tenant",
            "t1",
            "--op",
            &op,
            "--key",
            key,
            "--body",
        ][..],
        more,
    ]
    .concat();
    let o = idem(file, &args);
    assert!(o.status.success(), "{args:?}: {o:?}");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The value of the text line `field` (the first one).
fn line<'a>(out: &'a str, field: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(field).map(str::trim))
        .unwrap_or_else(|| panic!("no {field} in {out}"))
}

fn headers(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.strip_prefix("header "))
        .map(str::trim)
        .collect()
}

#[test]
fn get_body_shows_the_status_headers_and_body_the_http_layer_stored() {
    // A current-thread runtime (the library's `rt`): the layer runs the handlers on it and the
    // store calls on its blocking pool.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(get_body_shows_the_status_headers_and_body_the_http_layer_stored_on_a_runtime());
}

async fn get_body_shows_the_status_headers_and_body_the_http_layer_stored_on_a_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.redb");
    let store = Store::builder()
        .multi_process(true)
        .max_response_bytes(200)
        .open(&file)
        .unwrap();
    let app = Router::new()
        .route(
            "/p/{id}",
            post(|| async {
                (
                    StatusCode::CREATED,
                    [("content-type", "application/json"), ("location", "/p/1")],
                    r#"{"id":1}"#,
                )
                    .into_response()
            }),
        )
        .route(
            "/bin",
            post(|| async {
                (
                    [("content-type", "application/octet-stream")],
                    vec![0xffu8, 0x00, 0xfe],
                )
                    .into_response()
            }),
        )
        .route(
            "/big",
            post(|| async { ([("content-type", "text/plain")], "b".repeat(1000)).into_response() }),
        )
        .route_layer(IdempotencyLayer::tenant_header(store, "x-tenant-id"));
    for path in ["/p/1", "/bin", "/big"] {
        let status = send(&app, post_req(path, Some("k1"), "{}")).await;
        assert!(status.is_success(), "{path}: {status}");
    }

    // Kept whole: IDH1 with the replayed headers and a UTF-8 body.
    let out = get_body(&file, "/p/{id}", "k1", &[]);
    assert_eq!(line(&out, "status"), "201");
    assert_eq!(line(&out, "resource"), "location /p/1");
    assert!(line(&out, "envelope").starts_with("IDH1"), "{out}");
    assert_eq!(
        headers(&out),
        ["content-type: application/json", "location: /p/1"]
    );
    assert_eq!(line(&out, "body "), r#"{"id":1}"#);
    assert!(!out.contains('\0'), "no raw envelope bytes: {out:?}");
    // The answer's body is 8 bytes; what is stored is the envelope around it.
    assert_eq!(line(&out, "body_bytes"), "8");
    assert!(
        line(&out, "stored_bytes").parse::<usize>().unwrap() > 8,
        "{out}"
    );

    // A body that is not UTF-8: in hex.
    let out = get_body(&file, "/bin", "k1", &[]);
    assert_eq!(line(&out, "status"), "200");
    assert_eq!(headers(&out), ["content-type: application/octet-stream"]);
    assert_eq!(line(&out, "body_hex"), "ff00fe");

    // Over max_response_bytes: IDH2, the body and Content-Type not kept.
    let out = get_body(&file, "/big", "k1", &[]);
    assert!(line(&out, "envelope").starts_with("IDH2"), "{out}");
    assert!(headers(&out).is_empty(), "{out}");
    assert!(line(&out, "body ").starts_with("(not kept"), "{out}");

    // --json: the same in the record's `http` object.
    let json = |route: &str| -> serde_json::Value {
        serde_json::from_str(&get_body(&file, route, "k1", &["--json"])).unwrap()
    };
    let v = json("/p/{id}");
    assert_eq!(v["status"], 201);
    assert_eq!(v["body_bytes"], 8);
    assert!(v["stored_bytes"].as_u64().unwrap() > 8, "{v}");
    assert_eq!(
        v["http"],
        serde_json::json!({
            "envelope": "IDH1",
            "body_omitted": false,
            "headers": [["content-type", "application/json"], ["location", "/p/1"]],
            "body": "{\"id\":1}",
        })
    );
    assert_eq!(json("/bin")["http"]["body_hex"], "ff00fe");
    let big = json("/big");
    assert_eq!(big["http"]["body_omitted"], true);
    assert_eq!(big["http"]["headers"], serde_json::json!([]));
}
