//! The example service built with idem's `metrics` feature serves `GET /metrics` in the
//! Prometheus text format: after the first two requests of docs/HTTP.md's curl session (a payment, then the same
//! request again, replayed), it shows `idem_outcomes_total` with the executed finish and the
//! replayed claim of `POST /v1/payments`, and the group-commit histograms. Its stderr is
//! unchanged by the logging it now has: the listening line first, and on SIGTERM exactly the two
//! shutdown lines (idem's spans print nothing at the default `info` level).
#![cfg(all(feature = "http", feature = "metrics", unix))]

use crate::edge_example;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

/// The first request of docs/HTTP.md's curl session: `curl -si -X POST localhost:8080/v1/payments ...`.
const PAYMENT: &str = r#"{"account":"acc_1","amount":4200,"currency":"EUR"}"#;

/// Sends one request (`Connection: close`) and returns the status line, the headers and the
/// body.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (String, String, String) {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost:8080\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a complete answer");
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (
        status.to_owned(),
        headers.to_ascii_lowercase(),
        body.to_owned(),
    )
}

fn pay(addr: SocketAddr) -> (String, String, String) {
    send(
        addr,
        "POST",
        "/v1/payments",
        &[
            ("X-Tenant-Id", "acme"),
            ("Idempotency-Key", "pay-2026-0001"),
            ("Content-Type", "application/json"),
        ],
        PAYMENT,
    )
}

/// The value of the sample `name{labels}` in a Prometheus text exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn get_metrics_shows_idem_outcomes_after_the_readme_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr, mut stderr) = edge_example::spawn(dir.path(), &[]);

    let (first, _, created) = pay(addr);
    assert_eq!(first, "HTTP/1.1 201 Created", "{created}");
    let (again, headers, replayed) = pay(addr);
    assert_eq!(again, "HTTP/1.1 201 Created", "{replayed}");
    assert!(headers.contains("idempotent-replayed: true"), "{headers}");
    assert_eq!(created, replayed);

    let (status, headers, text) = send(addr, "GET", "/metrics", &[], "");
    assert_eq!(status, "HTTP/1.1 200 OK", "{text}");
    assert!(
        headers.contains("content-type: text/plain; version=0.0.4"),
        "{headers}"
    );
    assert!(
        text.contains("# TYPE idem_outcomes_total counter"),
        "{text}"
    );
    let outcome = |call: &str, outcome: &str| {
        sample(
            &text,
            &format!(
                r#"idem_outcomes_total{{call="{call}",operation="POST /v1/payments",outcome="{outcome}"}}"#
            ),
        )
    };
    assert_eq!(outcome("begin", "acquired"), Some(1.0), "{text}");
    assert_eq!(outcome("finish", "executed"), Some(1.0), "{text}");
    assert_eq!(outcome("begin", "replayed"), Some(1.0), "{text}");
    // The group-commit figures, as Prometheus histograms.
    for histogram in [
        "idem_commit_batch_size",
        "idem_commit_seconds",
        "idem_queue_wait_seconds",
    ] {
        assert!(
            text.contains(&format!("# TYPE {histogram} histogram")),
            "{histogram}: {text}"
        );
        assert!(
            sample(&text, &format!("{histogram}_count")).is_some_and(|n| n >= 1.0),
            "{histogram}: {text}"
        );
    }
    // No tenant and no key in any series.
    assert!(
        !text.contains("acme") && !text.contains("pay-2026-0001"),
        "{text}"
    );

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let lines: Vec<String> = stderr.by_ref().map_while(Result::ok).collect();
    let exit = child.wait().unwrap();
    assert!(
        exit.success(),
        "the service stops cleanly: {exit:?} {lines:?}"
    );
    assert_eq!(
        lines,
        [
            "edge_service: shutting down (finishing requests in flight, at most 10000 ms)",
            "edge_service: stopped",
        ]
    );
}
