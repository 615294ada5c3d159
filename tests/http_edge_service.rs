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

async fn serve(dir: &std::path::Path) -> SocketAddr {
    let store = edge_service::open_store(dir, std::time::Duration::from_secs(30)).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, edge_service::app(store))
            .await
            .unwrap();
    });
    addr
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_call_replay_mismatch_missing_key_refund_and_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(dir.path()).await;

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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_concurrent_identical_posts_book_once() {
    let dir = tempfile::tempdir().unwrap();
    let addr = serve(dir.path()).await;
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
}
