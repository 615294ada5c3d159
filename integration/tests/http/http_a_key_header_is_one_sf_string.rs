//! The `Idempotency-Key` field is exactly one field line holding one Structured
//! Field string (`"abc"`, RFC 9651) or a Stripe-style bare key (`abc`). Two field lines, a list
//! (what an intermediary makes of two lines, RFC 9110 §5.3), parameters, an unbalanced quote,
//! whitespace or control characters are refused with 400 before the handler runs; the same
//! holds for two tenant header lines. The parser's full table is in the unit tests of `src/http/`.
#![cfg(feature = "http")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::body::Body;
use axum::http::StatusCode;
use idem::http::IdempotencyLayer;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, counted_route, post_with, problem, store};

const TENANT: (&str, &[u8]) = ("x-tenant-id", b"t1");

#[tokio::test]
async fn two_key_lines_or_their_combined_list_never_book_a_second_payment() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"),
        Arc::clone(&calls),
    );
    let send = |lines: Vec<(&'static str, &'static [u8])>| {
        let app = app.clone();
        async move {
            let mut all = vec![TENANT];
            all.extend(lines);
            body_of(
                app.oneshot(post_with("/pay/1", &all, Body::from("{\"amount\":42}")))
                    .await
                    .unwrap(),
            )
            .await
        }
    };

    let (s, _, first) = send(vec![("idempotency-key", b"A")]).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // The same payment with a second key line, with the lines combined into one by an
    // intermediary, and with two equal lines: each is refused, none runs the handler.
    for lines in [
        vec![
            ("idempotency-key", b"A".as_slice()),
            ("idempotency-key", b"B"),
        ],
        vec![
            ("idempotency-key", b"B".as_slice()),
            ("idempotency-key", b"A"),
        ],
        vec![("idempotency-key", b"A, B".as_slice())],
        vec![("idempotency-key", b"A,B".as_slice())],
        vec![("idempotency-key", b"\"A\", \"B\"".as_slice())],
        vec![
            ("idempotency-key", b"A".as_slice()),
            ("idempotency-key", b"A"),
        ],
    ] {
        let (s, h, body) = send(lines.clone()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{lines:?}");
        assert_eq!(h["content-type"], "application/problem+json");
        let p = problem(&body);
        assert_eq!(
            p["type"], "urn:idem:problem:invalid-idempotency-key",
            "{lines:?}"
        );
        assert_eq!(p["title"], "Invalid Idempotency-Key");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second payment");

    // The retry of the intent, in either accepted spelling, replays the first answer.
    for key in [b"A".as_slice(), b"\"A\"", b"  \"A\" "] {
        let (s, h, body) = send(vec![("idempotency-key", key)]).await;
        assert_eq!((s, &body), (StatusCode::CREATED, &first));
        assert_eq!(h["idempotent-replayed"], "true");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_key_values_are_refused_before_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"),
        Arc::clone(&calls),
    );
    let refused: &[&[u8]] = &[
        b"\"abc\";p=1", // a parameter
        b"abc;p=1",     // a parameter on a bare key
        b"\"abc",       // unbalanced quote
        b"abc\"",       // a quote inside a bare key
        b"\"abc\"x",    // trailing characters
        b"a b",         // whitespace inside
        b"a\tb",        // a control character (HTAB) inside
        b"a\\b",        // a backslash in a bare key
        b"\"a\\tb\"",   // an invalid escape in a string
        b"caf\xc3\xa9", // not ASCII
        b"\"caf\xc3\xa9\"",
        b"\"\"", // empty string
        b"",     // empty value
    ];
    for value in refused {
        let req = post_with(
            "/pay/1",
            &[TENANT, ("idempotency-key", value)],
            Body::from("x"),
        );
        let (s, _, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
        let shown = String::from_utf8_lossy(value);
        assert_eq!(s, StatusCode::BAD_REQUEST, "{shown:?}");
        assert_eq!(
            problem(&body)["type"],
            "urn:idem:problem:invalid-idempotency-key",
            "{shown:?}"
        );
    }
    // Over the store's key limit (255 bytes by default), quoted or not.
    let long = "k".repeat(256);
    for value in [long.clone(), format!("\"{long}\"")] {
        let req = post_with(
            "/pay/1",
            &[TENANT, ("idempotency-key", value.as_bytes())],
            Body::from("x"),
        );
        let (s, _, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(
            problem(&body)["type"],
            "urn:idem:problem:invalid-idempotency-key"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);

    // Accepted: a Stripe-style UUID (not an sf-token: it may start with a digit), a string
    // with a space and escapes, any other visible ASCII bare key, and a key of exactly the
    // limit.
    let max = "k".repeat(255);
    let accepted: [&[u8]; 4] = [
        b"8e03978e-40d5-43e8-bc93-6894a57f9324",
        b"\"a key \\\"with\\\" quotes\"",
        b"?1",
        max.as_bytes(),
    ];
    for (i, value) in accepted.iter().enumerate() {
        let req = post_with(
            &format!("/pay/{i}"),
            &[TENANT, ("idempotency-key", value)],
            Body::from("x"),
        );
        let (s, _, _) = body_of(app.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(
            s,
            StatusCode::CREATED,
            "{:?}",
            String::from_utf8_lossy(value)
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn two_tenant_lines_are_refused_with_a_tenant_problem() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let app = counted_route(
        IdempotencyLayer::tenant_header(store(&dir), "x-tenant-id"),
        Arc::clone(&calls),
    );
    for lines in [
        vec![("x-tenant-id", b"t1".as_slice()), ("x-tenant-id", b"t2")],
        vec![("x-tenant-id", b"t1".as_slice()), ("x-tenant-id", b"t1")],
        vec![("x-tenant-id", b"t1, t2".as_slice())],
    ] {
        let mut all = lines.clone();
        all.push(("idempotency-key", b"k"));
        let req = post_with("/pay/1", &all, Body::from("x"));
        let (s, _, body) = body_of(app.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{lines:?}");
        let p = problem(&body);
        assert_eq!(p["type"], "urn:idem:problem:invalid-tenant", "{lines:?}");
        assert_eq!(p["title"], "Invalid tenant");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}
