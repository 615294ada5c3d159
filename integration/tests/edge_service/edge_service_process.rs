//! The example service as an operator runs it: its command line, a busy port, slow clients and
//! SIGTERM, on the built binary (`target/<profile>/examples/edge_service`, which `cargo test
//! --features http` builds together with the tests) in a child process on 127.0.0.1.
#![cfg(all(feature = "http", unix))]

use crate::edge_example;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edge_example::example_binary;
use parking_lot::Mutex;

/// Generous bound for anything that should happen "at once" or after a ~1 s timeout.
const PATIENCE: Duration = Duration::from_secs(20);

/// Runs the example to completion (for flags that make it exit at once).
fn run(args: &[&str], dir: &Path) -> Output {
    Command::new(example_binary())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

struct Server {
    child: Child,
    addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts the example on a free loopback port with `flags`; returns once it listens.
    fn start(dir: &Path, flags: &[&str]) -> Server {
        let (child, addr, lines) = edge_example::spawn(dir, flags);
        // Keep draining stderr (the child never blocks on a full pipe), and keep it to read.
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut s = sink.lock();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Server {
            child,
            addr,
            stderr,
        }
    }

    fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits at most `within` for the process to exit.
    fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stderr lines so far (give the drain thread a moment after the exit).
    fn stderr(&self) -> String {
        std::thread::sleep(Duration::from_millis(100));
        self.stderr.lock().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, PATIENCE).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s
}

/// Reads until the server closes the connection. `Err` if it did not within [`PATIENCE`]
/// (a reset counts as closed).
fn read_until_closed(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(raw),
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!(
                    "still open after {PATIENCE:?}; read so far: {:?}",
                    String::from_utf8_lossy(&raw)
                ));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Ok(raw), // reset by the server: closed
        }
    }
}

const PAY: &str = r#"{"account":"acc_1","amount":4200,"currency":"EUR"}"#;

/// Sends a POST whose headers are complete but whose body stops one byte short; with
/// `Expect: 100-continue` the server's `100 Continue` shows that it is reading the body.
fn stall_in_body(addr: SocketAddr, key: &str) -> TcpStream {
    let mut s = connect(addr);
    let head = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nX-Tenant-Id: t1\r\nIdempotency-Key: {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        PAY.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let continued = b"HTTP/1.1 100 Continue\r\n\r\n";
    let mut got = vec![0u8; continued.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, continued, "{}", String::from_utf8_lossy(&got));
    s.write_all(&PAY.as_bytes()[..PAY.len() - 1]).unwrap();
    s
}

fn payment(addr: SocketAddr, key: &str) -> u16 {
    let mut s = connect(addr);
    let req = format!(
        "POST /v1/payments HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Tenant-Id: t1\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{PAY}",
        PAY.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let raw = read_until_closed(&mut s).unwrap();
    let raw = String::from_utf8_lossy(&raw);
    raw.split(' ').nth(1).unwrap().parse().unwrap()
}

#[test]
fn help_prints_usage_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(&["--help"], dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Usage: edge_service [OPTIONS]"), "{stdout}");
    for flag in [
        "--data",
        "--listen",
        "--lease-ms",
        "--header-timeout-ms",
        "--body-timeout-ms",
        "--request-timeout-ms",
        "--grace-ms",
    ] {
        assert!(
            stdout.contains(flag),
            "{flag} missing from --help: {stdout}"
        );
    }
    assert!(
        !dir.path().join("data").exists(),
        "--help created a data directory"
    );
}

#[test]
fn a_bad_flag_prints_a_usage_error_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        &["--bogus"][..],
        &["--listen", "not-an-address"],
        &["--body-timeout-ms", "0"],
    ] {
        let out = run(args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error:"), "{args:?}: {stderr}");
        assert!(stderr.contains("--help"), "{args:?}: {stderr}");
    }
    assert!(!dir.path().join("data").exists());
}

#[test]
fn a_busy_port_says_which_flag_to_change_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let data = dir.path().join("data");
    let out = run(
        &["--listen", &addr, "--data", data.to_str().unwrap()],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{addr} is in use")),
        "names the address: {stderr}"
    );
    assert!(
        stderr.contains("pass --listen 127.0.0.1:PORT"),
        "names the flag: {stderr}"
    );
    assert!(!data.exists(), "no store was created: {stderr}");
}

#[test]
fn a_client_that_stalls_one_byte_before_the_end_of_its_body_is_answered_after_the_body_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--body-timeout-ms", "1000", "--request-timeout-ms", "60000"],
    );
    let mut stalled: Vec<TcpStream> = (0..4)
        .map(|i| stall_in_body(server.addr, &format!("slow-{i}")))
        .collect();
    for s in &mut stalled {
        let raw = read_until_closed(s).expect("the server gave up on the slow body");
        let raw = String::from_utf8_lossy(&raw);
        // After the `100 Continue` already read: a 400 problem (the body could not be read).
        assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
        let lower = raw.to_ascii_lowercase();
        assert!(
            lower.contains("content-type: application/problem+json"),
            "{raw}"
        );
    }
    // Nothing was booked for them, and the service still serves.
    assert_eq!(payment(server.addr, "fast"), 201);
    assert_eq!(payment(server.addr, "slow-0"), 201, "the key was not taken");
}

#[test]
fn a_client_that_stalls_in_its_headers_is_disconnected_after_the_header_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--header-timeout-ms", "1000"]);
    let mut partial = connect(server.addr);
    partial
        .write_all(b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nX-Tenant-Id: t1\r\n")
        .unwrap();
    // A connection that never sends a byte is cut off the same way.
    let mut silent = connect(server.addr);
    read_until_closed(&mut partial).expect("closed after the header timeout");
    read_until_closed(&mut silent).expect("closed after the header timeout");
    assert_eq!(payment(server.addr, "after"), 201);
}

#[test]
fn sigterm_with_a_stalled_client_exits_with_status_3_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(
        dir.path(),
        &[
            "--grace-ms",
            "1000",
            "--body-timeout-ms",
            "600000",
            "--request-timeout-ms",
            "600000",
            "--header-timeout-ms",
            "600000",
        ],
    );
    let _stalled = stall_in_body(server.addr, "slow");
    server.sigterm();
    let status = server
        .exit_within(PATIENCE)
        .expect("exited within the grace period and a margin");
    let stderr = server.stderr();
    assert_eq!(status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
    assert!(
        stderr.contains("grace period over with 1 connection(s) still open"),
        "{stderr}"
    );
}

#[test]
fn sigterm_with_nothing_in_flight_stops_with_status_0_and_closes_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), &[]);
    assert_eq!(payment(server.addr, "kept"), 201);
    server.sigterm();
    let status = server.exit_within(PATIENCE).expect("exited");
    let stderr = server.stderr();
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("edge_service: stopped"), "{stderr}");
    // The file is closed and whole: it opens, and the payment is there.
    let store = idem::Store::open(dir.path().join("idem.redb")).unwrap();
    let txn = store.begin_read().unwrap();
    let table = txn
        .open_table(idem::redb::TableDefinition::<&str, i64>::new("ledger"))
        .unwrap();
    use idem::redb::ReadableTableMetadata;
    assert_eq!(table.len().unwrap(), 1);
}
