//! A commit that fails answers every caller of its batch with "outcome unknown", latches the
//! store fail-stop, and leaves no caller waiting: queued callers fail fast too.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use idem::{Error, Response, Store};

#[test]
fn a_failed_batch_commit_answers_every_member_and_every_queued_caller() {
    let backend = CrashBackend::default();
    const N: usize = 8;
    // The failed batch is gate 2 and the N callers queued behind it, which it admits before it
    // commits; `max_batch` keeps the two late callers out of it, queued behind it.
    let store = Store::builder()
        .max_batch(N + 1)
        .open_with_backend(backend.clone())
        .expect("open");
    let (held2_tx, held2_rx) = mpsc::channel::<()>();
    let (release2_tx, release2_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    // Gate 1 commits before the disk fails.
    let r = store.execute(req("t", "op", "gate1", b"p"), |_| {
        Ok(Response::new(200, "gate1"))
    });
    assert!(r.is_ok(), "gate 1 commits before the disk fails: {r:?}");
    thread::scope(|s| {
        let store = &store;
        // Gate 2 holds the writer while N callers queue behind it.
        let done = done_tx.clone();
        s.spawn(move || {
            let r = store.execute(req("t", "op", "gate2", b"p"), |_| {
                held2_tx.send(()).expect("test alive");
                release2_rx.recv().expect("released");
                Ok(Response::new(200, "gate2"))
            });
            done.send(("gate2".to_owned(), r)).expect("test alive");
        });
        held2_rx.recv().expect("gate 2 holds the writer");
        for i in 0..N {
            let done = done_tx.clone();
            s.spawn(move || {
                let key = format!("k{i}");
                let r = store.execute(req("t", "op", &key, b"p"), |tx| {
                    bump(tx, &key)?;
                    Ok(Response::new(201, "ok"))
                });
                done.send((key, r)).expect("test alive");
            });
            wait_for_queue(store, 1 + i);
        }
        // The disk fails before that batch commits; two callers queue meanwhile, behind the
        // full batch.
        backend.failing.store(true, Ordering::SeqCst);
        for (i, key) in ["late1", "late2"].into_iter().enumerate() {
            let done = done_tx.clone();
            s.spawn(move || {
                let r = store.execute(req("t", "op", key, b"p"), |_| Ok(Response::new(201, "x")));
                done.send((key.to_owned(), r)).expect("test alive");
            });
            wait_for_queue(store, N + 1 + i);
        }
        release2_tx.send(()).expect("gate 2 alive");
        let mut answers = Vec::new();
        for _ in 0..N + 3 {
            // Bounded: a hang fails the test instead of blocking CI.
            answers.push(
                done_rx
                    .recv_timeout(Duration::from_secs(20))
                    .expect("every caller gets an answer"),
            );
        }
        for (key, r) in answers {
            match r {
                Err(Error::OutcomeUnknown { .. }) => {
                    assert!(
                        !key.starts_with("late"),
                        "{key} was not in the failed batch"
                    )
                }
                // The late callers queued behind the failed batch.
                Err(Error::FailStopped { .. }) => {
                    assert!(key.starts_with("late"), "{key} was in the failed batch")
                }
                other => panic!("{key}: expected a failure, got {other:?}"),
            }
        }
    });
    assert!(store.fail_stop_cause().is_some());
    assert!(matches!(
        store.execute(req("t", "op", "after", b"p"), |_| Ok(Response::new(1, "x"))),
        Err(Error::FailStopped { .. })
    ));
    // What was durable before the failure is intact after a crash; the failed batch is not
    // half-applied.
    drop(store);
    let reopened = Store::builder()
        .open_with_backend(backend.crash())
        .expect("reopen");
    assert!(matches!(
        reopened.execute(req("t", "op", "gate1", b"p"), |_| Ok(Response::new(1, "x"))),
        Ok(idem::ExecuteAnswer::Replayed(_))
    ));
    for i in 0..N {
        let key = format!("k{i}");
        let recorded = reopened
            .get(&idem::Scope::new("t", "op"), &key)
            .expect("get")
            .is_some();
        assert_eq!(
            recorded,
            effects(&reopened, &key) == 1,
            "{key}: record and effect together"
        );
    }
}
