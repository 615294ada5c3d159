//! The example service on a disk that fills up under load: its store fail-stops at the first
//! failed write, the service says so once on stderr (built as the README and docs/HTTP.md build
//! it, without the `tracing` feature), `GET /v1/health` answers 503 problem+json naming the
//! failure, and no acknowledged payment is lost — a restart once space is back serves every one
//! of them.
//!
//! The full disk is a small tmpfs (tests/tmpfs: needs root; `IDEM_REQUIRE_MOUNT=1` fails
//! instead of skipping where it cannot be mounted).
#![cfg(all(feature = "http", target_os = "linux"))]

use crate::edge_example;
use crate::tmpfs;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tmpfs::Tmpfs;

/// One request; `None` on any connection trouble.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n{headers}\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

#[test]
fn a_full_disk_fail_stops_the_store_and_the_service_logs_it_once_and_reports_it_on_health() {
    let Some(fs) = Tmpfs::mount(&tmpfs::journal_and(4)) else {
        return;
    };
    let data = fs.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    let (mut server, addr, lines) = edge_example::spawn(&data, &[]);
    let stderr: std::sync::Arc<parking_lot::Mutex<Vec<String>>> = Default::default();
    let collected = stderr.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            collected.lock().push(line);
        }
    });
    let (status, body) = send(addr, "GET", "/v1/health", "", "").expect("health");
    assert_eq!((status, body.as_str()), (200, r#"{"status":"ok"}"#));

    let mut acknowledged = Vec::new();
    let pay = |i: usize| {
        let headers = format!("X-Tenant-Id: t1\r\nIdempotency-Key: key-{i}\r\n");
        let body = format!(r#"{{"account":"acc_{i}","amount":100,"currency":"EUR"}}"#);
        send(addr, "POST", "/v1/payments", &headers, &body)
    };
    for i in 0..20 {
        match pay(i) {
            Some((201, b)) => acknowledged.push(b),
            other => panic!("payment {i} before the disk filled: {other:?}"),
        }
    }
    // The disk fills up; payments go on until the store fails a write.
    let filler = fs.fill();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut failed = 0;
    for i in 20.. {
        assert!(
            Instant::now() < deadline,
            "the store never failed on a full disk"
        );
        match pay(i) {
            Some((201, b)) => acknowledged.push(b),
            Some((500..=599, _)) => {
                failed += 1;
                if failed >= 5 {
                    break;
                }
            }
            other => panic!("payment {i}: {other:?}"),
        }
    }

    let (status, body) = send(addr, "GET", "/v1/health", "", "").expect("health");
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("urn:edge-service:problem:store-failed"),
        "{body}"
    );
    assert!(
        body.contains("No space left on device"),
        "names the failure: {body}"
    );
    // The watcher looks every 250 ms: give it a moment, then count its lines.
    std::thread::sleep(Duration::from_millis(800));
    let said: Vec<String> = stderr
        .lock()
        .iter()
        .filter(|l| l.contains("the store stopped after an I/O failure"))
        .cloned()
        .collect();
    assert_eq!(said.len(), 1, "said once: {:?}", stderr.lock());
    assert!(said[0].contains("No space left on device"), "{}", said[0]);

    server.kill().expect("stop");
    server.wait().expect("reap");
    std::fs::remove_file(&filler).expect("space is back");
    // And more: the open replays the answers the journal holds beyond the store file, which
    // the full disk kept the store file from taking.
    fs.resize(&tmpfs::journal_and(64));
    let (mut server, addr, lines) = edge_example::spawn(&data, &[]);
    std::thread::spawn(move || lines.for_each(drop));
    let (status, _) = send(addr, "GET", "/v1/health", "", "").expect("health");
    assert_eq!(status, 200, "a restart reopens the store");
    for b in &acknowledged {
        let v: serde_json::Value = serde_json::from_str(b).expect("payment json");
        let id = v["id"].as_str().expect("id");
        let (status, _) = send(
            addr,
            "GET",
            &format!("/v1/payments/{id}"),
            "X-Tenant-Id: t1\r\n",
            "",
        )
        .expect("get");
        assert_eq!(
            status, 200,
            "acknowledged payment {id} survived the full disk"
        );
    }
    eprintln!(
        "{} payments acknowledged, then {failed} refused once the disk was full",
        acknowledged.len()
    );
    server.kill().expect("stop");
    server.wait().expect("reap");
}
