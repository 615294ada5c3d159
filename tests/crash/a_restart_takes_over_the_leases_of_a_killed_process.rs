//! A process holding leases is killed with SIGKILL; the next process to open the file takes
//! every one of those keys over at once (attempt 2, the same downstream key), although their
//! leases still have most of a minute to run: the file admits one process at a time, so their
//! holder is provably gone (docs/design.md, "A restart frees the leases of the dead"). In
//! `multi_process` mode another process may still hold them, so there the leases must lapse.
//!
//! The test re-executes its own binary as the child: it opens the store, takes a lease on each
//! key (60 s), prints `held <key> <downstream key>` for each, then waits to be killed.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::clock::ManualClock;
use idem::{BeginAnswer, ExecuteAnswer, Request, Response, Scope, Store, Timestamp};

const CHILD_ENV: &str = "IDEM_RESTART_CHILD";
const MULTI_ENV: &str = "IDEM_RESTART_MULTI";
/// The child's test function, by its full name (`--exact`).
fn child_name() -> String {
    crate::common::test_name(module_path!(), "restart_child_entry")
}
const KEYS: usize = 8;
const LEASE: Duration = Duration::from_secs(60);
/// Both processes decide at this instant: the children's leases are nowhere near lapsing.
const NOW: Timestamp = Timestamp(1_700_000_000_000);

fn request(i: usize) -> Request {
    let key = format!("k{i}");
    Request::from_canonical_bytes(Scope::new("t", "charge"), key.as_str(), b"payload")
}

fn builder(multi_process: bool) -> idem::StoreBuilder {
    Store::builder()
        .lease_duration(LEASE)
        .clock(ManualClock::new(NOW))
        .multi_process(multi_process)
}

/// Kills and reaps the child on every path out of the test.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a child that takes a lease on every key of the store at `path`, waits until it holds
/// them all, SIGKILLs it, and returns the downstream keys it was given, in key order.
fn leases_of_a_killed_child(path: &Path, multi_process: bool) -> Vec<String> {
    let mut child = ChildGuard(
        Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", &child_name(), "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, path)
            .env(MULTI_ENV, if multi_process { "1" } else { "0" })
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child"),
    );
    let stdout = BufReader::new(child.0.stdout.take().expect("child stdout"));
    let mut held = Vec::new();
    for line in stdout.lines() {
        let line = line.expect("child output");
        if let Some(rest) = line.strip_prefix("held ") {
            let (key, downstream) = rest.split_once(' ').expect("held <key> <downstream>");
            assert_eq!(key, format!("k{}", held.len()));
            held.push(downstream.to_owned());
            if held.len() == KEYS {
                break;
            }
        }
    }
    assert_eq!(held.len(), KEYS, "the child took every lease");
    child.0.kill().expect("SIGKILL");
    child.0.wait().expect("reap");
    held
}

#[test]
fn the_next_process_takes_over_every_lease_of_a_killed_one_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let downstream = leases_of_a_killed_child(&path, false);

    let started = Instant::now();
    let store = builder(false)
        .open(&path)
        .expect("the restart opens the file");
    for (i, child_key) in downstream.iter().enumerate().take(KEYS - 1) {
        match store.begin(request(i)).expect("begin") {
            BeginAnswer::Acquired(lease) => {
                assert_eq!(lease.attempt(), 2, "k{i}: the next attempt");
                assert_eq!(lease.takeover_of(), Some(1), "k{i}: a takeover");
                assert_eq!(
                    &lease.downstream_key().to_hex(),
                    child_key,
                    "k{i}: the same downstream key as the killed attempt"
                );
                lease
                    .complete(Response::new(201, "charged"))
                    .expect("the new holder completes");
            }
            other => panic!("k{i}: {other:?}, not taken over at the restart"),
        }
    }
    // Flow A on a key the dead process held: it runs, as after a lapse.
    let last = KEYS - 1;
    let outcome = store
        .execute(request(last), |_| Ok(Response::new(201, "charged")))
        .expect("execute");
    assert!(matches!(outcome, ExecuteAnswer::Ran(_)), "{outcome:?}");
    // A lease this process grants is its own: not taken over by its own next request.
    let BeginAnswer::Acquired(_mine) = store.begin(request(100)).expect("begin") else {
        panic!("a fresh key is acquired");
    };
    assert!(
        matches!(store.begin(request(100)), Ok(BeginAnswer::InFlight { .. })),
        "a lease of the running process stays in flight"
    );
    eprintln!(
        "{KEYS} keys of a killed process taken over {:?} after the restart began (lease {LEASE:?})",
        started.elapsed()
    );
}

#[test]
fn in_multi_process_mode_a_killed_processs_leases_must_lapse() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    leases_of_a_killed_child(&path, true);
    let store = builder(true)
        .open(&path)
        .expect("the restart opens the file");
    for i in 0..KEYS {
        assert!(
            matches!(store.begin(request(i)), Ok(BeginAnswer::InFlight { .. })),
            "k{i}: another process may still hold it, so its lease stands"
        );
    }
}

/// The body of the child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child process of the restart tests"]
fn restart_child_entry() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let multi_process = std::env::var(MULTI_ENV).is_ok_and(|v| v == "1");
    let store = builder(multi_process)
        .open(path)
        .expect("child opens the store");
    let mut leases = Vec::new();
    for i in 0..KEYS {
        let BeginAnswer::Acquired(lease) = store.begin(request(i)).expect("child begins") else {
            panic!("child: k{i} not acquired");
        };
        // On a line of its own: libtest's `test ... ` has no newline yet.
        println!("\nheld k{i} {}", lease.downstream_key().to_hex());
        leases.push(lease);
    }
    // Held until the parent kills this process; never longer than a minute.
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(3);
}
