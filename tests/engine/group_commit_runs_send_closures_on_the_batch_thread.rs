//! `Store::execute_on_writer`: a `Send + 'static` closure may run on whichever thread holds the
//! batch's write transaction (no hand-off to its caller's thread), and nothing else changes:
//! every caller gets its own outcome, one effect per key, a failing or panicking member leaves
//! nothing and changes no one else's outcome (the panic unwinds on its caller's thread), and
//! such members mix with `execute` members in one batch.
//!
//! Batches are formed as in `group_commit_isolation.rs`: a gate holds the writer until the
//! callers are queued, and its batch admits them when it is released.

use crate::common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};
use std::thread;

use common::*;
use idem::{Abort, Error, ExecuteAnswer, Response};

/// Where a closure ran, and on whose behalf.
type Runs = Arc<Mutex<Vec<(usize, thread::ThreadId)>>>;

#[test]
fn send_closures_run_on_the_batch_thread_and_keep_their_own_outcomes() {
    let h = Harness::new();
    let store = h.store();
    const N: usize = 10;
    let runs: Runs = Arc::default();
    let (callers, outcomes) = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let runs = Arc::clone(&runs);
                let handle = s.spawn(move || {
                    let key = format!("k{i}");
                    let me = thread::current().id();
                    // Member 3 fails retryably, member 6 panics; the others answer.
                    let outcome = catch_unwind(AssertUnwindSafe(|| {
                        store.execute_on_writer(req("t", "op", &key, b"p"), move |tx| {
                            runs.lock().unwrap().push((i, thread::current().id()));
                            bump(tx, &format!("k{i}"))?;
                            match i {
                                3 => Err(Abort::retryable("transient")),
                                6 => panic!("member 6 panics"),
                                _ => Ok(Response::new(201, format!("k{i}"))),
                            }
                        })
                    }));
                    (me, outcome)
                });
                wait_for_queue(store, i + 1);
                handle
            })
            .collect();
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect();
        let callers: Vec<thread::ThreadId> = results.iter().map(|r| r.0).collect();
        let outcomes: Vec<_> = results.into_iter().map(|r| r.1).collect();
        (callers, outcomes)
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("k{i}");
        match i {
            3 => {
                assert!(
                    matches!(outcome, Ok(Err(Error::Aborted { .. }))),
                    "{i}: {outcome:?}"
                );
                assert_eq!(
                    effects(store, &key),
                    0,
                    "a failed member's writes never commit"
                );
            }
            6 => {
                let panic =
                    outcome.expect_err("member 6's panic unwinds on its own caller's thread");
                assert_eq!(panic.downcast_ref::<&str>(), Some(&"member 6 panics"));
                assert_eq!(effects(store, &key), 0);
            }
            _ => {
                let r = executed(outcome.expect("no panic"));
                assert_eq!(r.body(), key.as_bytes(), "each caller gets its own answer");
                assert_eq!(effects(store, &key), 1, "{key}: one effect");
            }
        }
    }
    // The fast path was taken: some closure ran on a thread other than its caller's.
    let runs = runs.lock().unwrap();
    let elsewhere = runs.iter().filter(|(i, t)| *t != callers[*i]).count();
    assert!(
        elsewhere > 0,
        "every closure ran on its own caller's thread: the batch thread never ran one"
    );
    // A replay of each committed key runs nothing.
    for i in (0..N).filter(|i| *i != 3 && *i != 6) {
        let key = format!("k{i}");
        let again = store
            .execute_on_writer(req("t", "op", &key, b"p"), |_| {
                panic!("a replay runs nothing")
            })
            .unwrap();
        assert!(matches!(again, ExecuteAnswer::Replayed(_)));
    }
}

#[test]
fn send_and_thread_bound_members_share_a_batch() {
    let h = Harness::new();
    let store = h.store();
    let before = store.metrics();
    const N: usize = 12;
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let handles = queue_callers(s, store, N, |i| {
            let key = format!("m{i}");
            if i % 3 == 0 {
                // A closure that borrows the caller's stack: `execute`.
                store.execute(req("t", "op", &key, b"p"), |tx| {
                    bump(tx, &key)?;
                    Ok(Response::new(201, key.clone()))
                })
            } else {
                store.execute_on_writer(req("t", "op", &key, b"p"), move |tx| {
                    bump(tx, &format!("m{i}"))?;
                    Ok(Response::new(201, format!("m{i}")))
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
    let m = store.metrics();
    assert_eq!(
        (
            m.commits - before.commits,
            m.committed_requests - before.committed_requests
        ),
        (1, 1 + N as u64),
        "the gate and every caller, of both kinds, in one commit: {m:?}"
    );
}
