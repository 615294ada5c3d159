//! Two processes of the example service (`edge_service --postgres URL`) on one database, as two
//! replicas behind a load balancer: requests for the same keys alternate between them (and race
//! on both at once), and still each key books one payment, every replay is byte-identical from
//! either node, a different payload is 422 from either node, and each node's dispatcher
//! publishes the events of the other's bookings too (the outbox is shared).
//!
//! Runs the service's binary (`edge_example::example_binary`), which Cargo builds with the tests.
#![cfg(all(feature = "http", feature = "postgres", unix))]

use crate::common;
use crate::edge_example;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

use common::pg::{client, fresh_schema, pg_url};

/// A node of the service; killed (and the schema dropped by the last one) on drop.
struct Node {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(url: &str, schema: &str, dir: &std::path::Path) -> Node {
    let (child, addr, lines) = edge_example::spawn(
        dir,
        &[
            "--postgres",
            url,
            "--pg-schema",
            schema,
            "--lease-ms",
            "5000",
        ],
    );
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Node { child, addr }
}

/// What a request got: status, the headers the test looks at, body.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reply {
    status: u16,
    location: Option<String>,
    replayed: bool,
    body: Vec<u8>,
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> Reply {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    Reply {
        status: head.split(' ').nth(1).unwrap().parse().unwrap(),
        location: header("location"),
        replayed: header("idempotent-replayed").as_deref() == Some("true"),
        body: raw[split + 4..].to_vec(),
    }
}

fn pay(addr: SocketAddr, key: &str, amount: u64) -> Reply {
    let headers = format!("X-Tenant-Id: acme\r\nIdempotency-Key: {key}\r\n");
    let body = format!(r#"{{"account":"acc_1","amount":{amount},"currency":"EUR"}}"#);
    send(addr, "POST", "/v1/payments", &headers, &body)
}

/// A key's payment, retried until it is no longer in flight on the other node.
fn pay_settled(addr: SocketAddr, key: &str) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = pay(addr, key, 4200);
        if r.status != 409 || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn json(r: &Reply) -> serde_json::Value {
    serde_json::from_slice(&r.body).expect("a JSON body")
}

#[test]
fn two_nodes_book_each_key_once_and_replay_it_identically() {
    let Some(url) = pg_url() else { return };
    let schema = fresh_schema("twoedge");
    let dir = tempfile::tempdir().unwrap();
    let a = start(&url, &schema, dir.path());
    let b = start(&url, &schema, dir.path());
    let nodes = [a.addr, b.addr];
    const KEYS: usize = 20;

    // Alternating: the first attempt on one node, the retry on the other.
    for i in 0..KEYS {
        let key = format!("alt-{i}");
        let first = pay_settled(nodes[i % 2], &key);
        assert_eq!(first.status, 201, "{key}: {first:?}");
        assert!(!first.replayed);
        let retry = pay_settled(nodes[(i + 1) % 2], &key);
        assert_eq!(retry.status, 201);
        assert!(retry.replayed, "{key}: the other node replays");
        assert_eq!(
            (retry.body.clone(), retry.location.clone()),
            (first.body.clone(), first.location.clone()),
            "{key}: byte-identical from either node"
        );
        // The same key with another amount is refused by both nodes.
        for node in nodes {
            let other = pay(node, &key, 9900);
            assert_eq!(other.status, 422, "{key}: {other:?}");
        }
    }

    // Racing: both nodes get the same new keys at once, from several clients.
    let raced: Vec<Vec<Reply>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..KEYS)
            .map(|i| {
                s.spawn(move || {
                    let key = format!("race-{i}");
                    let key = key.as_str();
                    std::thread::scope(|inner| {
                        let hs: Vec<_> = (0..4)
                            .map(|c| inner.spawn(move || pay_settled(nodes[c % 2], key)))
                            .collect();
                        hs.into_iter().map(|h| h.join().unwrap()).collect()
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, replies) in raced.iter().enumerate() {
        let first: Vec<&Reply> = replies.iter().filter(|r| !r.replayed).collect();
        assert_eq!(first.len(), 1, "race-{i}: exactly one booking: {replies:?}");
        for r in replies {
            assert_eq!(r.status, 201, "race-{i}: {r:?}");
            assert_eq!(
                (&r.body, &r.location),
                (&first[0].body, &first[0].location),
                "race-{i}: the same answer for every client"
            );
        }
    }

    // One ledger entry per key, whichever node is asked.
    for node in nodes {
        let ledger = json(&send(
            node,
            "GET",
            "/v1/ledger",
            "X-Tenant-Id: acme\r\n",
            "",
        ));
        assert_eq!(ledger["entries"], 2 * KEYS as u64, "{ledger}");
        assert_eq!(ledger["total"], 2 * KEYS as u64 * 4200, "{ledger}");
    }
    let mut db = client(&url);
    let rows: i64 = db
        .query_one(&format!("SELECT count(*) FROM {schema}.payments"), &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, 2 * KEYS as i64);

    // Both dispatchers share the outbox: every booking's event is published (by one node or
    // the other), and none is left.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let outbox = json(&send(
            a.addr,
            "GET",
            "/v1/outbox",
            "X-Tenant-Id: acme\r\n",
            "",
        ));
        if outbox["pending"] == 0 {
            assert_eq!(outbox["dead"], 0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "events left undelivered: {outbox}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop((a, b));
    let _ = db.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}
