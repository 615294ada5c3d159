//! `StoreBuilder::quick_repair`: a process SIGKILLed while it commits claims leaves a file whose
//! reopen loads the allocator state the last commit saved instead of walking the whole file to
//! rebuild it (redb calls its repair callback only for the rebuild); without quick-repair the
//! same crash makes the reopen rebuild it — which is what makes a large store slow to come back
//! (benches/results/2026-12-02-0de0621-scale.md). Every acknowledged claim is there either way.
#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem::redb::ReadableTableMetadata;
use idem::{ExecuteAnswer, Request, Response, Scope, Store};

const CHILD_ENV: &str = "IDEM_QUICK_REPAIR_CHILD";
const MODE_ENV: &str = "IDEM_QUICK_REPAIR_ON";
/// The child's test function, by its full name (`--exact`).
fn child_name() -> String {
    crate::common::test_name(module_path!(), "quick_repair_child_entry")
}
const RECORDS: idem::redb::TableDefinition<&[u8], &[u8]> =
    idem::redb::TableDefinition::new("idem.records.v1");

/// Runs a child that claims keys on `path` (quick-repair `on` or off), kills it once it has
/// acknowledged 200 claims, and returns how many it acknowledged.
fn crash_while_claiming(path: &Path, on: bool) -> u64 {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            &child_name(),
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD_ENV, path)
        .env(MODE_ENV, if on { "1" } else { "0" })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked = 0;
    for line in lines.map_while(Result::ok) {
        if line.starts_with("ack ") {
            acked += 1;
            if acked == 200 {
                break;
            }
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success(), "the child was killed");
    acked
}

/// Opens the file with redb directly, recording whether it had to rebuild the allocator state.
fn reopen_rebuilds(path: &Path) -> (bool, u64) {
    let rebuilt = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&rebuilt);
    let db = idem::redb::Database::builder()
        .set_repair_callback(move |_| flag.store(true, Ordering::SeqCst))
        .create(path)
        .expect("the crashed file opens");
    let read = idem::redb::ReadableDatabase::begin_read(&db).unwrap();
    let records = read.open_table(RECORDS).unwrap().len().unwrap();
    (rebuilt.load(Ordering::SeqCst), records)
}

#[test]
fn a_crash_with_quick_repair_reopens_without_rebuilding_the_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("on.redb");
    let acked = crash_while_claiming(&path, true);
    let (rebuilt, records) = reopen_rebuilds(&path);
    assert!(
        !rebuilt,
        "quick-repair: the saved allocator state was loaded"
    );
    assert!(
        records >= acked,
        "{records} records for {acked} acknowledged claims"
    );
}

#[test]
fn the_same_crash_without_quick_repair_rebuilds_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("off.redb");
    let acked = crash_while_claiming(&path, false);
    let (rebuilt, records) = reopen_rebuilds(&path);
    assert!(
        rebuilt,
        "no quick-repair: the reopen rebuilt the allocator state"
    );
    assert!(
        records >= acked,
        "{records} records for {acked} acknowledged claims"
    );
}

/// The body of the child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child process of the quick-repair test"]
fn quick_repair_child_entry() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let on = std::env::var(MODE_ENV).as_deref() == Ok("1");
    // Direct mode: quick_repair is about its durable commits (journal mode's checkpoints save
    // the allocator state whatever it says).
    let store = Store::builder()
        .journal(false)
        .quick_repair(on)
        .open(path)
        .expect("child opens the store");
    println!();
    for i in 0u64.. {
        let key = format!("k{i}");
        let req = Request::from_canonical_bytes(Scope::new("t", "op"), &key, b"p");
        let outcome = store.execute(req, |_| Ok(Response::new(201, "ok")));
        if matches!(outcome, Ok(ExecuteAnswer::Ran(_))) {
            println!("ack {key}");
        }
        if i > 1_000_000 {
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}
