//! The edge service's built binary (`CARGO_BIN_EXE_edge-service-under-test`), shared by the tests
//! that run it in a child process (`the_edge_service_books_each_payment_once_and_stops_cleanly`, `readme_curl_session`, ...).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Lines};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};

/// The path of the edge service's binary (this package's `edge-service-under-test`, which Cargo
/// builds together with the tests).
pub fn example_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_edge-service-under-test"))
}

/// Starts the example (`flags`) on `dir` and a free loopback port; the caller drains stderr.
pub fn spawn(dir: &Path, flags: &[&str]) -> (Child, SocketAddr, Lines<BufReader<ChildStderr>>) {
    let (child, addr, _, lines) = spawn_with_preamble(dir, flags);
    (child, addr, lines)
}

/// [`spawn`], also returning what the service printed before it listened (after a crash: the
/// store's repair).
pub fn spawn_with_preamble(
    dir: &Path,
    flags: &[&str],
) -> (
    Child,
    SocketAddr,
    Vec<String>,
    Lines<BufReader<ChildStderr>>,
) {
    let mut child = Command::new(example_binary())
        .arg("--data")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(flags)
        // The service's stderr is what the tests read: a RUST_LOG of the developer's would add
        // log lines to it.
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut preamble = Vec::new();
    let addr = loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("the service ended before it listened, after printing {preamble:?}");
        };
        if let Some(rest) = line.strip_prefix("edge_service: listening on http://") {
            break rest
                .split(' ')
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("unexpected listening line {line:?}"));
        }
        preamble.push(line);
    };
    (child, addr, preamble, lines)
}
