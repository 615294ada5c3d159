//! Group commit keeps every caller's atomicity and isolation: requests that share one write
//! transaction behave exactly as if they had been serialised, and one caller's failure
//! (retryable error, store error, panic) neither commits its writes nor changes anyone else's
//! outcome.
//!
//! Batches are formed deterministically: a "gate" caller holds the writer inside its closure
//! until the others are queued (observed through `Metrics::queued`), so they all land in its
//! batch (a batch admits the callers queued while it ran before it commits), in queue order.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use common::*;
use idem::{Abort, BeginAnswer, Error, ExecuteAnswer, Response};

#[test]
fn a_failing_member_leaves_nothing_and_changes_no_one_elses_outcome() {
    let h = Harness::new();
    let store = h.store();
    const N: usize = 12;
    let calls: Vec<AtomicU32> = (0..N).map(|_| AtomicU32::new(0)).collect();
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        // Spawned one at a time, each queued before the next: queue order = index order, so
        // the failures sit at positions 4 and 7 of the batch, after a non-empty prefix.
        let handles: Vec<_> = (0..N)
            .map(|i| {
                let calls = &calls;
                let h = s.spawn(move || {
                    let key = format!("k{i}");
                    store.execute(req("t", "op", &key, b"p"), |tx| {
                        calls[i].fetch_add(1, Ordering::SeqCst);
                        bump(tx, &key)?;
                        match i {
                            4 => Err(Abort::retryable("transient")),
                            7 => Err(Abort::Store(Error::Config {
                                reason: "simulated store error".into(),
                            })),
                            _ => Ok(Response::new(201, key.clone())),
                        }
                    })
                });
                wait_for_queue(store, i + 1);
                h
            })
            .collect();
        wait_for_queue(store, N);
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect::<Vec<_>>()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("k{i}");
        match i {
            4 => {
                assert!(matches!(outcome, Err(Error::Aborted { .. })), "{outcome:?}");
                assert_eq!(
                    effects(store, &key),
                    0,
                    "a failed member's writes never commit"
                );
                assert!(
                    store
                        .get(&idem::Scope::new("t", "op"), &key)
                        .expect("get")
                        .is_none()
                );
            }
            7 => {
                assert!(matches!(outcome, Err(Error::Config { .. })), "{outcome:?}");
                assert_eq!(effects(store, &key), 0);
            }
            _ => {
                let r = executed(outcome);
                assert_eq!(r.body(), key.as_bytes());
                assert_eq!(effects(store, &key), 1, "{key}: exactly one effect");
            }
        }
    }
    let m = store.metrics();
    assert!(
        m.reruns >= 1,
        "the batch was re-run without the failed members: {m:?}"
    );
    // Members before a failure ran once more; nobody else ran twice.
    let runs: Vec<u32> = calls.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    assert_eq!(runs, vec![2, 2, 2, 2, 1, 2, 2, 1, 1, 1, 1, 1]);
    assert_eq!(store.fail_stop_cause(), None);
}

#[test]
fn a_panicking_member_leaves_nothing_and_the_rest_of_its_batch_commits() {
    let h = Harness::new();
    let store = h.store();
    const N: usize = 6;
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let handles: Vec<_> = (0..N)
            .map(|i| {
                s.spawn(move || {
                    let key = format!("k{i}");
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        store.execute(req("t", "op", &key, b"p"), |tx| {
                            bump(tx, &key)?;
                            if i == 2 {
                                panic!("handler bug in caller 2");
                            }
                            Ok(Response::new(201, key.clone()))
                        })
                    }))
                })
            })
            .collect();
        wait_for_queue(store, N);
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller thread"))
            .collect::<Vec<_>>()
    });
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let key = format!("k{i}");
        if i == 2 {
            assert!(outcome.is_err(), "the panic reaches its own caller");
            assert_eq!(effects(store, &key), 0);
        } else {
            executed(outcome.expect("no panic for the others"));
            assert_eq!(effects(store, &key), 1);
        }
    }
    assert_eq!(store.fail_stop_cause(), None);
}

#[test]
fn the_same_key_twice_in_one_batch_executes_once_and_replays_once() {
    let h = Harness::new();
    let store = h.store();
    let runs = AtomicU32::new(0);
    let outcomes = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let handles: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    store.execute(req("t", "op", "same", b"p"), |tx| {
                        runs.fetch_add(1, Ordering::SeqCst);
                        bump(tx, "same")?;
                        Ok(Response::new(201, "once"))
                    })
                })
            })
            .collect();
        wait_for_queue(store, 2);
        let before = store.metrics().commits;
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        let outcomes: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect();
        // One commit: the gate's batch admitted both queued callers before it committed.
        assert_eq!(store.metrics().commits - before, 1);
        outcomes
    });
    let executed_n = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(ExecuteAnswer::Ran(_))))
        .count();
    let replayed_n = outcomes
        .iter()
        .filter(|o| matches!(o, Ok(ExecuteAnswer::Replayed(_))))
        .count();
    assert_eq!((executed_n, replayed_n), (1, 1), "{outcomes:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(effects(store, "same"), 1);
}

#[test]
fn two_begins_for_one_key_in_one_batch_grant_one_lease() {
    let h = Harness::new();
    let store = h.store();
    let begins = thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let handles: Vec<_> = (0..2)
            .map(|_| s.spawn(|| store.begin(req("t", "charge", "same", b"p"))))
            .collect();
        wait_for_queue(store, 2);
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        handles
            .into_iter()
            .map(|h| h.join().expect("caller"))
            .collect::<Vec<_>>()
    });
    let acquired_n = begins
        .iter()
        .filter(|b| matches!(b, Ok(BeginAnswer::Acquired(_))))
        .count();
    let in_flight_n = begins
        .iter()
        .filter(|b| matches!(b, Ok(BeginAnswer::InFlight { .. })))
        .count();
    assert_eq!((acquired_n, in_flight_n), (1, 1), "{begins:?}");
}

#[test]
fn a_full_queue_turns_callers_away_with_busy() {
    let h = Harness::with(|b| b.max_queue(2).queue_timeout(Duration::from_millis(50)));
    let store = h.store();
    thread::scope(|s| {
        let (release_tx, gate) = gate(s, store);
        let queued: Vec<_> = (0..2)
            .map(|i| {
                s.spawn(move || {
                    store.execute(req("t", "op", &format!("q{i}"), b"p"), |_| {
                        Ok(Response::new(201, "queued"))
                    })
                })
            })
            .collect();
        wait_for_queue(store, 2);
        let turned_away = store.execute(req("t", "op", "late", b"p"), |_| {
            Ok(Response::new(201, "never"))
        });
        assert!(
            matches!(turned_away, Err(Error::Busy { queued: 2, .. })),
            "{turned_away:?}"
        );
        assert!(turned_away.is_err_and(|e| e.is_retryable()));
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        for q in queued {
            executed(q.join().expect("queued caller"));
        }
    });
    assert_eq!(store.metrics().busy, 1);
    // Nothing was recorded for the caller that was turned away.
    assert!(
        store
            .get(&idem::Scope::new("t", "op"), "late")
            .expect("get")
            .is_none()
    );
}
