//! Shared fixtures of the `Idempotency-Key` layer's tests (`integration/tests/http/http_layer.rs` and the
//! behaviour modules `integration/tests/http/http_*.rs`): requests, bodies and answers, driven with tower's
//! `oneshot` (no sockets).

#![allow(dead_code)]

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use http_body_util::BodyExt;
use idem::Store;
use idem::http::{IdempotencyHandle, IdempotencyLayer, Recorded};
use tokio::sync::Notify;
use tower::ServiceExt;

/// A store with default settings on a fresh file in `dir`.
pub fn store(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path().join("idem.redb")).unwrap()
}

/// A POST to `path` for tenant `t1`, with the key (when given) and the body.
pub fn post_req(path: &str, key: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("x-tenant-id", "t1");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    b.body(Body::from(body.to_owned())).unwrap()
}

/// A POST to `path` with exactly these header field lines (raw bytes, in order: a name given
/// twice is two field lines) and `body`.
pub fn post_with(path: &str, lines: &[(&str, &[u8])], body: Body) -> Request<Body> {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(path)
        .body(body)
        .unwrap();
    for (name, value) in lines {
        req.headers_mut().append(
            axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_bytes(value).unwrap(),
        );
    }
    req
}

/// Status, headers and the whole body of an answer.
pub async fn body_of(resp: axum::response::Response) -> (StatusCode, HeaderMap, Bytes) {
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// Sends `req` through a clone of `svc`; returns the answer's status, headers and whole body.
pub async fn send<S>(svc: &S, req: Request<Body>) -> (StatusCode, HeaderMap, Bytes)
where
    S: tower::Service<Request<Body>, Response = axum::response::Response> + Clone,
    S::Error: std::fmt::Debug,
{
    body_of(svc.clone().oneshot(req).await.unwrap()).await
}

/// The RFC 9457 problem in an answer's body.
pub fn problem(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).unwrap()
}

/// A route `POST /pay/{id}` behind `layer` that counts its calls and answers `201` with a
/// `Location` and a body naming the call.
pub fn counted_route(layer: IdempotencyLayer, calls: Arc<AtomicU32>) -> Router {
    Router::new()
        .route(
            "/pay/{id}",
            post(move || {
                let calls = Arc::clone(&calls);
                async move {
                    let n = calls.fetch_add(1, Ordering::SeqCst) + 1;
                    (
                        StatusCode::CREATED,
                        [("location", "/pay/1")],
                        format!("call {n}"),
                    )
                        .into_response()
                }
            }),
        )
        .route_layer(layer)
}

/// A router (no layer yet) with one POST `path` whose handler the test holds: it counts its
/// calls in `calls`, notifies `entered` once it runs, waits until `release` is notified, and
/// answers `201 done`.
pub fn slow_route(
    path: &str,
    entered: &Arc<Notify>,
    release: &Arc<Notify>,
    calls: &Arc<AtomicU32>,
) -> Router {
    let (e, r, c) = (Arc::clone(entered), Arc::clone(release), Arc::clone(calls));
    Router::new().route(
        path,
        post(move || {
            let (e, r, c) = (Arc::clone(&e), Arc::clone(&r), Arc::clone(&c));
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                e.notify_one();
                r.notified().await;
                (StatusCode::CREATED, "done")
            }
        }),
    )
}

/// A router (no layer yet) with one POST `path` that records its answer (`201 {}`) with
/// `IdempotencyHandle::complete_with` in a transaction that waits for the test: it notifies `holding`
/// once it runs, and holds the store's single writer until the test sends one message on the
/// returned sender (one message ends one such transaction).
pub fn hold_route(path: &str, holding: &Arc<Notify>) -> (Router, mpsc::Sender<()>) {
    let (release, wait) = mpsc::channel::<()>();
    let wait = Arc::new(Mutex::new(wait));
    let h = Arc::clone(holding);
    let router = Router::new().route(
        path,
        post(
            move |axum::extract::Extension(idem): axum::extract::Extension<IdempotencyHandle>| {
                let (h, wait) = (Arc::clone(&h), Arc::clone(&wait));
                async move {
                    idem.complete_with(move |_tx| {
                        h.notify_one();
                        let _ = wait.lock().unwrap().recv();
                        Ok(Recorded::json(StatusCode::CREATED, &serde_json::json!({})))
                    })
                    .await
                }
            },
        ),
    );
    (router, release)
}

/// A body that arrives in chunks with no declared length.
pub struct Chunks(pub Vec<&'static str>);

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.0.is_empty() {
            return Poll::Ready(None);
        }
        let c = self.0.remove(0);
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            c.as_bytes(),
        )))))
    }
}

/// A request body that must not be read: polling it sets the flag and fails the read.
pub struct Untouched(pub Arc<AtomicBool>);

impl http_body::Body for Untouched {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        self.0.store(true, Ordering::SeqCst);
        Poll::Ready(Some(Err(std::io::Error::other(
            "this body must not have been read",
        ))))
    }
    fn size_hint(&self) -> http_body::SizeHint {
        // Announces a large body (what a client sends before a slow upload).
        http_body::SizeHint::with_exact(512 * 1024)
    }
}

/// A response body that yields some bytes and then fails (a handler's stream that broke).
pub struct Breaks(pub bool);

impl http_body::Body for Breaks {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if !self.0 {
            self.0 = true;
            return Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
                b"partial",
            )))));
        }
        Poll::Ready(Some(Err(std::io::Error::other(
            "the handler's stream broke",
        ))))
    }
}

/// A router with one POST `path` under `layer` whose handler counts its calls in `calls` and
/// records its answer itself, with `IdempotencyHandle::complete_with(f)`.
pub fn complete_with_route<F>(
    path: &str,
    layer: &IdempotencyLayer,
    calls: &Arc<AtomicU32>,
    f: F,
) -> Router
where
    F: FnMut(&idem::Tx<'_>) -> Result<idem::http::Recorded, idem::Abort>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let calls = Arc::clone(calls);
    Router::new()
        .route(
            path,
            post(
                move |axum::extract::Extension(idem): axum::extract::Extension<
                    idem::http::IdempotencyHandle,
                >| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let f = f.clone();
                    async move { idem.complete_with(f).await }
                },
            ),
        )
        .route_layer(layer.clone())
}
