//! A batch about to commit takes the callers that queued while it ran into the same commit, in
//! queue order: detached callers (`Store::execute_on_writer`), which the thread holding the batch
//! runs, and callers that run their closure on their own thread (`Store::execute`), which get
//! the transaction in turn. Nothing else changes for a late member: its own outcome, one
//! effect per key, and a failing late member leaves nothing and re-runs the members before it,
//! the gate included (the re-run batch admits no one: `group_commit_isolation.rs` counts the
//! runs).
//!
//! The gate here is detached itself: an `execute_on_writer` closure that holds the writer (on the
//! thread that leads its batch) until released, so callers queue behind a running detached
//! batch. (`group_commit_runs_send_closures_on_the_batch_thread.rs` has the gate on its own
//! thread, with both kinds of callers queued behind it.)

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use common::*;
use idem::{Abort, Error, Response, Store};

/// Starts an `execute_on_writer` caller whose closure holds the writer until `release` is sent (on
/// its first run only; a re-run goes straight through) and counts its runs. Returns once the
/// gate holds the writer.
fn detached_gate<'s, 'e>(
    s: &'s thread::Scope<'s, 'e>,
    store: &'e Store,
    runs: Arc<AtomicUsize>,
) -> (mpsc::Sender<()>, thread::ScopedJoinHandle<'s, ()>) {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let handle = s.spawn(move || {
        executed(
            store.execute_on_writer(req("t", "op", "gate", b"p"), move |tx| {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    held_tx.send(()).expect("test alive");
                    release_rx
                        .recv_timeout(Duration::from_secs(20))
                        .expect("released");
                }
                bump(tx, "gate")?;
                Ok(Response::new(200, "gate"))
            }),
        );
    });
    held_rx.recv().expect("the gate holds the writer");
    (release_tx, handle)
}

/// A detached caller of `key` that fails retryably when `fail` is set.
fn send_caller(store: &Store, key: &str, fail: bool) -> Result<idem::ExecuteAnswer, Error> {
    let label = key.to_owned();
    store.execute_on_writer(req("t", "op", key, b"p"), move |tx| {
        bump(tx, &label)?;
        if fail {
            return Err(Abort::retryable("transient"));
        }
        Ok(Response::new(201, label.clone()))
    })
}

#[test]
fn detached_callers_queued_while_a_detached_batch_runs_join_its_commit() {
    let h = Harness::new();
    let store = h.store();
    let before = store.metrics();
    const N: usize = 6;
    let gate_runs = Arc::new(AtomicUsize::new(0));
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = detached_gate(s, store, gate_runs.clone());
        let handles = queue_callers(s, store, N, |i| {
            send_caller(store, &format!("late{i}"), false)
        });
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect::<Vec<_>>()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("late{i}");
        assert_eq!(executed(outcome).body(), key.as_bytes(), "its own answer");
        assert_eq!(effects(store, &key), 1, "{key}: one effect");
    }
    assert_eq!(effects(store, "gate"), 1);
    assert_eq!(
        gate_runs.load(Ordering::SeqCst),
        1,
        "nothing failed: no re-run"
    );
    let after = store.metrics();
    assert_eq!(
        after.commits - before.commits,
        1,
        "the gate and every caller queued behind it commit together: {after:?}"
    );
    assert_eq!(
        after.committed_requests - before.committed_requests,
        1 + N as u64
    );
}

#[test]
fn a_failing_late_member_leaves_nothing_and_the_members_before_it_rerun() {
    let h = Harness::new();
    let store = h.store();
    let gate_runs = Arc::new(AtomicUsize::new(0));
    // late0 and late1 succeed, late2 fails, late3 succeeds (in the next batch).
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = detached_gate(s, store, gate_runs.clone());
        let handles = queue_callers(s, store, 4, |i| {
            send_caller(store, &format!("late{i}"), i == 2)
        });
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect::<Vec<_>>()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("late{i}");
        if i == 2 {
            assert!(
                matches!(outcome, Err(Error::Aborted { .. })),
                "{i}: {outcome:?}"
            );
            assert_eq!(
                effects(store, &key),
                0,
                "a failed member's writes never commit"
            );
        } else {
            assert_eq!(executed(outcome).body(), key.as_bytes());
            assert_eq!(effects(store, &key), 1, "{key}: one effect");
        }
    }
    assert_eq!(
        effects(store, "gate"),
        1,
        "the gate's re-run replaced its first run"
    );
    assert_eq!(
        gate_runs.load(Ordering::SeqCst),
        2,
        "the gate ran before the failed member: it re-ran once"
    );
    assert!(store.metrics().reruns >= 1);
}

#[test]
fn a_caller_on_its_own_thread_joins_late_too_and_so_do_those_behind_it() {
    let h = Harness::new();
    let store = h.store();
    let before = store.metrics();
    let gate_runs = Arc::new(AtomicUsize::new(0));
    // Queue: send0, own1 (execute), send2: all three join the gate's commit, in that order.
    let order = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = detached_gate(s, store, gate_runs.clone());
        let handles = queue_callers(s, store, 3, |i| {
            let order = Arc::clone(&order);
            let key = format!("m{i}");
            if i == 1 {
                let me = thread::current().id();
                store.execute(req("t", "op", &key, b"p"), |tx| {
                    assert_eq!(thread::current().id(), me, "on its own thread");
                    order.lock().push(i);
                    bump(tx, &key)?;
                    Ok(Response::new(201, key.clone()))
                })
            } else {
                let label = key.clone();
                store.execute_on_writer(req("t", "op", &key, b"p"), move |tx| {
                    order.lock().push(i);
                    bump(tx, &label)?;
                    Ok(Response::new(201, label.clone()))
                })
            }
        });
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect::<Vec<_>>()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("m{i}");
        assert_eq!(executed(outcome).body(), key.as_bytes());
        assert_eq!(effects(store, &key), 1);
    }
    assert_eq!(*order.lock(), [0, 1, 2], "queue order");
    let after = store.metrics();
    assert_eq!(
        after.commits - before.commits,
        1,
        "the gate, m0, m1 and m2 commit together: {after:?}"
    );
    assert_eq!(after.committed_requests - before.committed_requests, 4);
}
