//! The read path (the lookup that answers replays, mismatches and in-flight keys without the
//! writer, and `Store::get`) shares one open records table per commit instead of beginning a
//! read transaction per lookup (src/engine/snapshot.rs). It must still answer as a fresh read
//! would: a lookup that begins after a commit was answered sees that commit. And the shared
//! table, a read transaction, must not get in the way of what a reader blocks (compaction).

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;

use common::*;
use idem::{ExecuteAnswer, Response, Scope, Store};

fn scope() -> Scope {
    Scope::new("t", "op")
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, idem::Error> {
    store.execute(req("t", "op", key, b"p"), |_| {
        Ok(Response::new(201, "made"))
    })
}

#[test]
fn a_get_after_an_execute_sees_its_record() {
    let h = Harness::new();
    let store = h.store();
    for i in 0..50 {
        let key = format!("k{i}");
        // This lookup shares a table opened before the commit below.
        assert!(store.get(&scope(), &key).expect("get").is_none());
        executed(claim(store, &key));
        assert!(
            store.get(&scope(), &key).expect("get").is_some(),
            "{key}: a get after the execute returned must see its record"
        );
    }
}

#[test]
fn a_key_purged_after_a_replay_runs_its_closure_again() {
    let h = Harness::new();
    let store = h.store();
    let runs = AtomicUsize::new(0);
    let run = || {
        store.execute(req("t", "op", "k", b"p"), |_| {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(201, "made"))
        })
    };
    executed(run());
    // Answered by the read path: the shared table now holds the record.
    replayed(run());
    assert!(store.purge(&scope(), "k").expect("purge"));
    // A replay from the table shared before the purge would skip the closure.
    executed(run());
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert!(store.get(&scope(), "k").expect("get").is_some());
}

#[test]
fn a_lookup_that_begins_after_a_commit_was_answered_sees_it() {
    const KEYS: usize = 300;
    let h = Harness::new();
    let store = h.store();
    // The number of keys whose execute has returned (each key i < answered is committed).
    let answered = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let checked = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !done.load(Ordering::SeqCst) {
                    let n = answered.load(Ordering::SeqCst);
                    if n == 0 {
                        continue;
                    }
                    let key = format!("k{}", n - 1);
                    let record = store.get(&scope(), &key).expect("get");
                    assert!(
                        record.is_some(),
                        "{key} was answered before this lookup began, which did not see it"
                    );
                    checked.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        for i in 0..KEYS {
            executed(claim(store, &format!("k{i}")));
            answered.store(i + 1, Ordering::SeqCst);
        }
        done.store(true, Ordering::SeqCst);
    });
    assert!(checked.load(Ordering::Relaxed) > 0, "no lookup ran");
}

#[test]
fn the_shared_table_does_not_block_compaction() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path().join("idem.redb")).expect("open");
    executed(claim(&store, "k"));
    // The replay opens the shared table after the last commit, and nothing commits after it.
    replayed(claim(&store, "k"));
    store
        .compact()
        .expect("compaction with only the read path's table open");
    replayed(claim(&store, "k"));
}

#[test]
fn in_multi_process_mode_a_lookup_sees_another_handles_commit() {
    // Two handles on one file in redb's multi-writer mode stand for two processes: one's
    // commits bump nothing in the other, so the other must not answer from a shared table.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let open = || {
        Store::builder()
            .multi_process(true)
            .open(&path)
            .expect("open in multi-process mode")
    };
    let (a, b) = (open(), open());
    for i in 0..20 {
        let key = format!("k{i}");
        assert!(b.get(&scope(), &key).expect("get").is_none());
        executed(claim(&a, &key));
        assert!(
            b.get(&scope(), &key).expect("get").is_some(),
            "{key}: committed by the other handle, not seen"
        );
        replayed(claim(&b, &key));
    }
}
