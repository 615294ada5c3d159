//! End to end: the example payments service (`examples/edge_service.rs`) served on a loopback
//! port, driven over real TCP connections with HTTP/1.1.
#![cfg(feature = "http")]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "../examples/edge_service.rs"]
#[allow(dead_code)]
mod edge_service;

struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to the end.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    assert_ne!(
        headers.get("transfer-encoding").map(String::as_str),
        Some("chunked")
    );
    Reply {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

/// Serves the example on a loopback port; also returns the store (no dispatcher runs unless a
/// test starts one, so pushed events stay in the outbox and can be counted).
async fn serve(dir: &std::path::Path) -> (SocketAddr, idem::Store) {
    let store = edge_service::open_store(dir, std::time::Duration::from_secs(30)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = store.clone();
    tokio::spawn(async move {
        axum::serve(listener, edge_service::app(served))
            .await
            .unwrap();
    });
    (addr, store)
}

const PAY: &str = r#"{"account":"acc_1","amount":4200,"currency":"EUR"}"#;

fn post_headers<'a>(tenant: &'a str, key: &'a str) -> [(&'a str, &'a str); 2] {
    [("X-Tenant-Id", tenant), ("Idempotency-Key", key)]
}

async fn ledger(addr: SocketAddr, tenant: &str) -> (i64, i64) {
    let r = send(addr, "GET", "/v1/ledger", &[("X-Tenant-Id", tenant)], "").await;
    assert_eq!(r.status, 200);
    let v = r.json();
    (v["entries"].as_i64().unwrap(), v["total"].as_i64().unwrap())
}

/// `GET /v1/outbox`: (pending, dead, delivered).
async fn outbox(addr: SocketAddr) -> (u64, u64, u64) {
    let r = send(addr, "GET", "/v1/outbox", &[], "").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    let n = |f: &str| v[f].as_u64().unwrap();
    (n("pending"), n("dead"), n("delivered"))
}

fn header<'a>(event: &'a idem::OutboxEvent, name: &str) -> Option<&'a str> {
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_call_replay_mismatch_missing_key_refund_and_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, store) = serve(dir.path()).await;

    let first = send(
        addr,
        "POST",
        "/v1/payments",
        &post_headers("t1", "k-1"),
        PAY,
    )
    .await;
    assert_eq!(
        first.status,
        201,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.header("idempotent-replayed"), None);
    let payment = first.json();
    assert_eq!(payment["status"], "captured");
    assert_eq!(payment["amount"], 4200);
    let id = payment["id"].as_str().unwrap().to_owned();
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/payments/{id}").as_str())
    );

    // The response was lost; the client retries: the same answer, no second payment.
    let replay = send(
        addr,
        "POST",
        "/v1/payments",
        &post_headers("t1", "k-1"),
        PAY,
    )
    .await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("content-type"), Some("application/json"));
    assert_eq!(replay.header("location"), first.header("location"));

    // The same key with another body: 422, a problem document, nothing booked.
    let other = PAY.replace("4200", "4300");
    let mismatch = send(
        addr,
        "POST",
        "/v1/payments",
        &post_headers("t1", "k-1"),
        &other,
    )
    .await;
    assert_eq!(mismatch.status, 422);
    assert_eq!(
        mismatch.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        mismatch.json()["type"],
        "urn:idem:problem:key-reused-with-different-request"
    );

    // No key: 400.
    let missing = send(addr, "POST", "/v1/payments", &[("X-Tenant-Id", "t1")], PAY).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.json()["type"],
        "urn:idem:problem:missing-idempotency-key"
    );

    // The same key under another tenant is another intent.
    let t2 = send(
        addr,
        "POST",
        "/v1/payments",
        &post_headers("t2", "k-1"),
        PAY,
    )
    .await;
    assert_eq!(t2.status, 201);
    assert_eq!(t2.header("idempotent-replayed"), None);
    assert_eq!(ledger(addr, "t1").await, (1, 4200));
    assert_eq!(ledger(addr, "t2").await, (1, 4200));

    // Refund (idempotent the same way), then read the payment as it is now.
    let refund_path = format!("/v1/payments/{id}/refund");
    let refund = send(addr, "POST", &refund_path, &post_headers("t1", "r-1"), "").await;
    assert_eq!(
        refund.status,
        200,
        "{}",
        String::from_utf8_lossy(&refund.body)
    );
    assert_eq!(refund.json()["status"], "refunded");
    let again = send(addr, "POST", &refund_path, &post_headers("t1", "r-1"), "").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, refund.body);
    let now = send(
        addr,
        "GET",
        &format!("/v1/payments/{id}"),
        &[("X-Tenant-Id", "t1")],
        "",
    )
    .await;
    assert_eq!(now.status, 200);
    assert_eq!(now.json()["status"], "refunded");
    assert_eq!(ledger(addr, "t1").await, (2, 0));

    // A replay after the refund still returns the original 201 body ("captured").
    let late = send(
        addr,
        "POST",
        "/v1/payments",
        &post_headers("t1", "k-1"),
        PAY,
    )
    .await;
    assert_eq!(late.status, 201);
    assert_eq!(late.body, first.body);

    // Other tenants do not see it.
    let hidden = send(
        addr,
        "GET",
        &format!("/v1/payments/{id}"),
        &[("X-Tenant-Id", "t3")],
        "",
    )
    .await;
    assert_eq!(hidden.status, 404);

    // One outbox event per state change of a distinct intent (t1 capture, t2 capture, t1
    // refund): replays, the 422, the 400 and the repeated refund pushed nothing. No
    // dispatcher runs here, so all of them are still pending, in commit order.
    assert_eq!(outbox(addr).await, (3, 0, 0));
    let events = store.pending_events(10).unwrap();
    assert_eq!(events.len(), 3);
    assert!(events.iter().all(|e| e.topic == "payments"));
    assert_eq!(events[0].ordering_key.as_deref(), Some(id.as_str()));
    assert_eq!(header(&events[0], "type"), Some("payment.captured"));
    let captured: Value = serde_json::from_slice(&events[0].payload).unwrap();
    assert_eq!(captured, payment, "the payload is the payment as answered");
    assert_eq!(header(&events[1], "type"), Some("payment.captured"));
    assert_ne!(
        events[1].ordering_key, events[0].ordering_key,
        "t2's payment"
    );
    assert_eq!(events[2].ordering_key.as_deref(), Some(id.as_str()));
    assert_eq!(header(&events[2], "type"), Some("payment.refunded"));
    let refunded: Value = serde_json::from_slice(&events[2].payload).unwrap();
    assert_eq!(refunded, refund.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_posts_book_once() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, store) = serve(dir.path()).await;
    let bodies = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let bodies = Arc::clone(&bodies);
        tasks.push(tokio::spawn(async move {
            // Each client retries on 409 after Retry-After (shortened here) until it gets
            // the answer, like a well-behaved client.
            for _ in 0..200 {
                let r = send(
                    addr,
                    "POST",
                    "/v1/payments",
                    &post_headers("t1", "burst"),
                    PAY,
                )
                .await;
                match r.status {
                    201 => {
                        bodies.lock().push(r.body);
                        return;
                    }
                    409 => {
                        assert!(r.header("retry-after").is_some());
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                    s => panic!("unexpected {s}: {}", String::from_utf8_lossy(&r.body)),
                }
            }
            panic!("no answer after 200 tries");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let bodies = std::mem::take(&mut *bodies.lock());
    assert_eq!(bodies.len(), 50);
    assert!(
        bodies.iter().all(|b| *b == bodies[0]),
        "every 2xx body is identical"
    );
    assert_eq!(
        ledger(addr, "t1").await,
        (1, 4200),
        "exactly one ledger entry"
    );
    assert_eq!(
        store.outbox_stats().unwrap().pending,
        1,
        "exactly one outbox event"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dispatcher_delivers_one_event_per_payment() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, store) = serve(dir.path()).await;
    let dispatcher = edge_service::start_dispatcher(&store).unwrap();
    for key in ["d-1", "d-2", "d-3", "d-1", "d-2"] {
        let r = send(addr, "POST", "/v1/payments", &post_headers("t1", key), PAY).await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let counts = outbox(addr).await;
        if counts == (0, 0, 3) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not delivered: {counts:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tokio::task::spawn_blocking(move || dispatcher.shutdown())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.metrics().outbox_delivered,
        3,
        "replays pushed nothing"
    );
}
