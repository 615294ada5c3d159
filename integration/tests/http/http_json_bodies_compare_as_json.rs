//! A body labelled JSON (`Content-Type: application/json` or `application/*+json`, parameters
//! ignored) is compared as JSON by default: a retry that re-serialises it (members reordered,
//! other whitespace, another spelling of one value) is replayed and the handler runs once, a
//! different payload is still 422. A body labelled otherwise, or not labelled, is compared by
//! its bytes; so is a body labelled JSON that is not JSON (it reaches the handler, which answers
//! it) or whose canonical form would blur it (a member name twice, a number RFC 8785 would
//! round). `raw_body()` compares every body by its bytes; `canonical_json_body()` compares JSON
//! as JSON whatever the label; `fingerprint_body_with` still decides alone (docs/HTTP.md,
//! "Scope and fingerprint").
#![cfg(feature = "http")]

use crate::http_fixtures;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::routing::post;
use http_fixtures::{problem, send, store};
use idem::http::IdempotencyLayer;

/// A router whose handler counts its runs and reads the body as JSON: `201 run n: <the body>`
/// when it is JSON, `400 run n: not JSON` when it is not (as a JSON handler would).
fn json_app(layer: IdempotencyLayer) -> (Router, Arc<AtomicU32>) {
    let runs = Arc::new(AtomicU32::new(0));
    let counted = Arc::clone(&runs);
    let router = Router::new()
        .route(
            "/v1/orders",
            post(move |body: Bytes| {
                let counted = Arc::clone(&counted);
                async move {
                    let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                    match serde_json::from_slice::<serde_json::Value>(&body) {
                        Ok(v) => (StatusCode::CREATED, format!("run {n}: {v}")),
                        Err(_) => (StatusCode::BAD_REQUEST, format!("run {n}: not JSON")),
                    }
                }
            }),
        )
        .route_layer(layer);
    (router, runs)
}

fn layer(dir: &tempfile::TempDir) -> IdempotencyLayer {
    IdempotencyLayer::tenant_header(store(dir), "x-tenant-id")
}

/// A POST to `/v1/orders` for tenant `t1` with `key`, one `Content-Type` line per label, and
/// `body`.
fn order(key: &str, labels: &[&str], body: &str) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri("/v1/orders")
        .header("x-tenant-id", "t1")
        .header("idempotency-key", key);
    for label in labels {
        b = b.header("content-type", *label);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// The labels the default compares as JSON, spelled as clients send them.
const JSON_LABELS: &[&str] = &[
    "application/json",
    "application/json; charset=utf-8",
    "Application/JSON ; charset=UTF-8",
    "application/merge-patch+json",
    "application/vnd.api+JSON;version=2",
];

/// Labels that are not JSON, or not one media type: the body is compared by its bytes.
const OTHER_LABELS: &[&[&str]] = &[
    &[],
    &["text/plain"],
    &["text/json"],
    &["application/jsonx"],
    &["application/json-seq"],
    &["application/x-www-form-urlencoded"],
    &["application/json garbage"],
    &["application/json", "application/json"],
];

const FIRST: &str =
    r#"{"sku":"a-1","qty":2,"ship":{"to":"Oslo","express":false},"tags":["gift","red"]}"#;
/// `FIRST` re-serialised: members reordered at every level, whitespace added.
const RESERIALISED: &str = "{\n  \"tags\": [ \"gift\", \"red\" ],\n  \"ship\": { \"express\": \
                            false, \"to\": \"Oslo\" },\n  \"qty\": 2,\n  \"sku\": \"a-1\"\n}\n";

fn assert_replayed(
    what: &str,
    got: &(StatusCode, HeaderMap, Bytes),
    first: &(StatusCode, HeaderMap, Bytes),
) {
    assert_eq!(got.0, first.0, "{what}: the first status");
    assert_eq!(
        got.1.get("idempotent-replayed").map(|v| v.as_bytes()),
        Some(&b"true"[..]),
        "{what}: a replay"
    );
    assert_eq!(got.2, first.2, "{what}: the first answer, byte for byte");
}

fn assert_key_reused(what: &str, got: &(StatusCode, HeaderMap, Bytes)) {
    assert_eq!(got.0, StatusCode::UNPROCESSABLE_ENTITY, "{what}");
    assert_eq!(
        problem(&got.2)["type"],
        idem::http::problem::KEY_REUSED,
        "{what}"
    );
}

#[tokio::test]
async fn a_re_serialised_json_retry_is_replayed_and_the_handler_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir));
    for (i, label) in JSON_LABELS.iter().enumerate() {
        let key = format!("k{i}");
        let first = send(&app, order(&key, &[label], FIRST)).await;
        assert_eq!(first.0, StatusCode::CREATED, "{label}");
        let retry = send(&app, order(&key, &[label], RESERIALISED)).await;
        assert_replayed(label, &retry, &first);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            i as u32 + 1,
            "{label}: ran once"
        );
    }
    // The label's spelling is not part of the request: a retry that spells it otherwise (or
    // names another JSON type) is compared as JSON too.
    let first = send(&app, order("k-spelling", &["application/json"], FIRST)).await;
    for label in JSON_LABELS {
        let retry = send(&app, order("k-spelling", &[label], RESERIALISED)).await;
        assert_replayed(label, &retry, &first);
    }
    assert_eq!(runs.load(Ordering::SeqCst), JSON_LABELS.len() as u32 + 1);
}

#[tokio::test]
async fn a_different_json_payload_under_the_same_key_is_still_422() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir));
    let first = send(&app, order("k", &["application/json"], FIRST)).await;
    assert_eq!(first.0, StatusCode::CREATED);
    // Compared as JSON: the re-serialised retry is the same request ...
    let retry = send(&app, order("k", &["application/json"], RESERIALISED)).await;
    assert_replayed("re-serialised", &retry, &first);
    // ... and any other value is another one, however it is serialised.
    for (what, other) in [
        (
            "another number",
            r#"{"sku":"a-1","qty":3,"ship":{"to":"Oslo","express":false},"tags":["gift","red"]}"#,
        ),
        (
            "a string for the number",
            r#"{"sku":"a-1","qty":"2","ship":{"to":"Oslo","express":false},"tags":["gift","red"]}"#,
        ),
        (
            "a nested value",
            r#"{"sku":"a-1","qty":2,"ship":{"to":"Oslo","express":true},"tags":["gift","red"]}"#,
        ),
        (
            "the array in another order",
            r#"{"sku":"a-1","qty":2,"ship":{"to":"Oslo","express":false},"tags":["red","gift"]}"#,
        ),
        (
            "one more member",
            r#"{"sku":"a-1","qty":2,"ship":{"to":"Oslo","express":false},"tags":["gift","red"],"note":null}"#,
        ),
        (
            "one member less",
            r#"{"sku":"a-1","qty":2,"ship":{"to":"Oslo","express":false}}"#,
        ),
        (
            "a member name's case",
            r#"{"SKU":"a-1","qty":2,"ship":{"to":"Oslo","express":false},"tags":["gift","red"]}"#,
        ),
        (
            "another value, members reordered",
            "{ \"qty\": 3, \"sku\": \"a-1\", \"tags\": [\"gift\",\"red\"], \"ship\": {\"express\": false, \"to\": \"Oslo\"} }",
        ),
    ] {
        let got = send(&app, order("k", &["application/json"], other)).await;
        assert_key_reused(what, &got);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran once");
}

#[tokio::test]
async fn one_value_spelled_otherwise_is_the_same_request() {
    // RFC 8785 writes each value one way: `2.0` is `2`, `-0` is `0`, `1e2` is `100`, `"\u00e9"`
    // is `"é"`.
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir));
    let first = send(
        &app,
        order(
            "k",
            &["application/json"],
            r#"{"n":2,"z":0,"big":100,"s":"é/"}"#,
        ),
    )
    .await;
    assert_eq!(first.0, StatusCode::CREATED);
    let retry = send(
        &app,
        order(
            "k",
            &["application/json"],
            r#"{"s":"\u00e9\/","big":1E+2,"z":-0,"n":2.0}"#,
        ),
    )
    .await;
    assert_replayed("one value, other spellings", &retry, &first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn json_its_canonical_form_would_blur_is_compared_by_its_bytes() {
    // (first body, a body that canonicalisation would make equal to it, or that differs from it
    // in whitespace only). Each first body is kept by byte comparison: the same bytes replay,
    // anything else is 422, under the default (labelled JSON) and under `canonical_json_body`
    // (unlabelled).
    let cases: [(&str, &str, &str); 5] = [
        // A member name twice: serde_json keeps the last value, other parsers the first.
        ("a member name twice", r#"{"n":1,"n":2}"#, r#"{"n":2}"#),
        (
            "a member name twice, once escaped",
            r#"{"n":1,"\u006e":2}"#,
            r#"{"n":2}"#,
        ),
        // Integers above 2^53: RFC 8785 writes the nearest double, 9007199254740992.
        (
            "an integer a double cannot hold",
            r#"{"id":9007199254740993}"#,
            r#"{"id":9007199254740992}"#,
        ),
        (
            "the same integer, other whitespace",
            r#"{"id":9007199254740993}"#,
            r#"{ "id": 9007199254740993 }"#,
        ),
        (
            "a number that underflows to 0",
            r#"{"x":1e-400}"#,
            r#"{"x":0}"#,
        ),
    ];
    let precision = (
        "more digits than a double holds",
        r#"{"p":0.10000000000000000001}"#,
        r#"{"p":0.1}"#,
    );
    for canonical_always in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (app, labels): (_, &[&str]) = if canonical_always {
            (json_app(layer(&dir).canonical_json_body()), &[])
        } else {
            (json_app(layer(&dir)), &["application/json"])
        };
        let (app, runs) = app;
        for (i, (what, first_body, blurred)) in cases.iter().chain([&precision]).enumerate() {
            let what = format!("{what} (canonical_json_body: {canonical_always})");
            let key = format!("k{i}");
            let first = send(&app, order(&key, labels, first_body)).await;
            assert_eq!(first.0, StatusCode::CREATED, "{what}");
            assert_key_reused(&what, &send(&app, order(&key, labels, blurred)).await);
            let again = send(&app, order(&key, labels, first_body)).await;
            assert_replayed(&what, &again, &first);
            assert_eq!(runs.load(Ordering::SeqCst), i as u32 + 1, "{what}");
        }
    }
}

#[tokio::test]
async fn only_a_json_content_type_makes_a_body_compare_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir));
    for (i, labels) in OTHER_LABELS.iter().enumerate() {
        let key = format!("k{i}");
        let first = send(&app, order(&key, labels, FIRST)).await;
        assert_eq!(first.0, StatusCode::CREATED, "{labels:?}");
        // The same JSON re-serialised is another body: 422.
        assert_key_reused(
            &format!("{labels:?}"),
            &send(&app, order(&key, labels, RESERIALISED)).await,
        );
        // The same bytes replay.
        let again = send(&app, order(&key, labels, FIRST)).await;
        assert_replayed(&format!("{labels:?}"), &again, &first);
        assert_eq!(runs.load(Ordering::SeqCst), i as u32 + 1, "{labels:?}");
    }
    // The label decides how the body compares: the same bytes first labelled JSON, then not,
    // are two different requests.
    let first = send(&app, order("k-json", &["application/json"], FIRST)).await;
    assert_eq!(first.0, StatusCode::CREATED);
    let replay = send(&app, order("k-json", &["application/json"], RESERIALISED)).await;
    assert_replayed("labelled JSON", &replay, &first);
    assert_key_reused(
        "the same bytes, unlabelled",
        &send(&app, order("k-json", &["text/plain"], FIRST)).await,
    );
}

#[tokio::test]
async fn invalid_json_under_a_json_content_type_reaches_the_handler_and_compares_by_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir));
    // Valid JSON under the label is compared as JSON ...
    let first = send(&app, order("k-valid", &["application/json"], FIRST)).await;
    let retry = send(&app, order("k-valid", &["application/json"], RESERIALISED)).await;
    assert_replayed("valid JSON", &retry, &first);
    // ... a body that is not JSON is not refused by the layer: the handler answers it (here
    // 400, as a JSON handler does), that answer is recorded like any 4xx, and the body is
    // compared by its bytes.
    for (i, (what, body, other)) in [
        ("cut short", r#"{"sku":"a-1","#, r#"{ "sku": "a-1","#),
        ("a trailing comma", r#"{"sku":"a-1",}"#, r#"{"sku":"a-1"}"#),
        ("empty", "", " "),
        (
            "not UTF-8 JSON",
            "\u{feff}{\"sku\":\"a-1\"}",
            r#"{"sku":"a-1"}"#,
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("k{i}");
        let answered = send(&app, order(&key, &["application/json"], body)).await;
        assert_eq!(answered.0, StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(
            &answered.2[..],
            format!("run {}: not JSON", i + 2).as_bytes(),
            "{what}: the handler's own answer"
        );
        let again = send(&app, order(&key, &["application/json"], body)).await;
        assert_replayed(what, &again, &answered);
        assert_key_reused(
            what,
            &send(&app, order(&key, &["application/json"], other)).await,
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            i as u32 + 2,
            "{what}: ran once"
        );
    }
}

#[tokio::test]
async fn raw_body_compares_every_body_by_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (raw, runs) = json_app(layer(&dir).raw_body());
    for (i, label) in JSON_LABELS.iter().enumerate() {
        let key = format!("k{i}");
        let first = send(&raw, order(&key, &[label], FIRST)).await;
        assert_eq!(first.0, StatusCode::CREATED, "{label}");
        assert_key_reused(
            label,
            &send(&raw, order(&key, &[label], RESERIALISED)).await,
        );
        let again = send(&raw, order(&key, &[label], FIRST)).await;
        assert_replayed(label, &again, &first);
        assert_eq!(runs.load(Ordering::SeqCst), i as u32 + 1, "{label}");
    }
    // The default on the same requests: compared as JSON.
    let dir = tempfile::tempdir().unwrap();
    let (default, _) = json_app(layer(&dir));
    let first = send(&default, order("k", &["application/json"], FIRST)).await;
    let retry = send(&default, order("k", &["application/json"], RESERIALISED)).await;
    assert_replayed("the default", &retry, &first);
}

#[tokio::test]
async fn a_custom_body_fingerprint_decides_whatever_the_content_type() {
    // Only `amount` binds the key; a body labelled JSON is not canonicalised first.
    let dir = tempfile::tempdir().unwrap();
    let (app, runs) = json_app(layer(&dir).fingerprint_body_with(|_, body| {
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        v["amount"].to_string().into_bytes()
    }));
    let first = send(
        &app,
        order(
            "k",
            &["application/json"],
            r#"{"amount":4200,"client_ts":1}"#,
        ),
    )
    .await;
    let retry = send(
        &app,
        order(
            "k",
            &["text/plain"],
            r#"{ "client_ts": 2, "amount": 4200 }"#,
        ),
    )
    .await;
    assert_replayed("the same amount", &retry, &first);
    assert_key_reused(
        "another amount",
        &send(
            &app,
            order("k", &["application/json"], r#"{"amount":4300}"#),
        )
        .await,
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
