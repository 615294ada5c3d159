//! Two processes share one store file (`multi_process(true)`, redb's MultiWriter mode) and race
//! four threads each over the same 1,000 keys, every claim writing its effect row in the same
//! transaction: the file ends with exactly 1,000 effects, one per key.
//!
//! The test re-executes its own binary as the two child processes.

use crate::common;

use std::process::{Command, Stdio};
use std::thread;

use common::*;
use idem::{ExecuteAnswer, Response, Store};

const KEYS: usize = 1000;
const THREADS: usize = 4;
const CHILD_ENV: &str = "IDEM_MULTI_PROCESS_CHILD";

#[test]
fn two_processes_racing_on_the_same_keys_cause_one_effect_per_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("shared.redb");
    // Create the file first so both children open an existing store.
    drop(
        Store::builder()
            .multi_process(true)
            .open(&path)
            .expect("create"),
    );
    let exe = std::env::current_exe().expect("test binary");
    // Both children are started before either is waited for: they run at the same time.
    let running: Vec<_> = (0..2)
        .map(|seed| {
            Command::new(&exe)
                .args(["--exact", &test_name(module_path!(), "child_process_entry")])
                .args(["--ignored", "--nocapture"])
                .env(CHILD_ENV, &path)
                .env("IDEM_CHILD_SEED", seed.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn child")
        })
        .collect();
    let children: Vec<_> = running
        .into_iter()
        .map(|c| c.wait_with_output().expect("child output"))
        .collect();
    let mut executed_total = 0;
    for out in &children {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let n: usize = stdout
            .lines()
            .find_map(|l| l.strip_prefix("executed="))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no executed= line in child output:\n{stdout}"));
        executed_total += n;
    }
    assert_eq!(
        executed_total, KEYS,
        "exactly one execution per key across both processes"
    );
    let store = Store::builder()
        .multi_process(true)
        .open(&path)
        .expect("reopen");
    for i in 0..KEYS {
        assert_eq!(effects(&store, &format!("k{i}")), 1, "key k{i}");
    }
}

/// The body of each child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child processes of the multi-process test"]
fn child_process_entry() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let seed: usize = std::env::var("IDEM_CHILD_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let store = Store::builder()
        .multi_process(true)
        .open(path)
        .expect("child opens the shared store");
    let executed: usize = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &store;
                s.spawn(move || {
                    let mut n = 0;
                    // Each thread walks all keys from a different offset and direction, so the
                    // two processes and their threads collide on every key.
                    for j in 0..KEYS {
                        let i = if (seed + t).is_multiple_of(2) {
                            (j + t * 250) % KEYS
                        } else {
                            (KEYS - 1 - j + t * 250) % KEYS
                        };
                        let key = format!("k{i}");
                        let outcome = store
                            .execute(req("t", "op", &key, b"p"), |tx| {
                                bump(tx, &key)?;
                                Ok(Response::new(201, key.clone()))
                            })
                            .expect("execute");
                        match outcome {
                            ExecuteAnswer::Ran(_) => n += 1,
                            ExecuteAnswer::Replayed(r) => assert_eq!(r.body(), key.as_bytes()),
                            ExecuteAnswer::InFlight { .. } => panic!("flow A never leaves a lease"),
                            ExecuteAnswer::Expired(t) => panic!("no time passed, yet {t:?}"),
                        }
                    }
                    n
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("thread")).sum()
    });
    let m = store.metrics();
    println!("executed={executed}");
    println!(
        "commits={} average_batch={:.1}",
        m.commits,
        m.average_batch()
    );
}

/// A backend of the caller's own (`open_with_backend`) that has byte-range locks opens in
/// multi-process mode: idem's wrapper passes every lock call on to it, the query whether
/// another process holds a range included (without it, redb's open failed: "The storage
/// backend does not support this operation").
#[test]
fn a_backend_with_byte_range_locks_opens_in_multi_process_mode() {
    let backend = CrashBackend::default();
    let open = || {
        Store::builder()
            .multi_process(true)
            .open_with_backend(AloneOnFile(backend.clone()))
            .expect("open in multi_process mode")
    };
    let request = || idem::Request::from_canonical_bytes(idem::Scope::new("t", "op"), "k", b"p");
    let store = open();
    let first = store
        .execute(request(), |_| Ok(Response::new(201, "done")))
        .expect("execute");
    assert!(matches!(first, ExecuteAnswer::Ran(_)));
    drop(store);
    let again = open()
        .execute(request(), |_| panic!("a finished intent never runs again"))
        .expect("replay");
    assert!(matches!(again, ExecuteAnswer::Replayed(r) if r.body() == b"done"));
}
