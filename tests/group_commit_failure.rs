//! A commit that fails answers every caller of its batch with "outcome unknown", latches the
//! store fail-stop, and leaves no caller waiting: queued callers fail fast too.

mod common;

use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use idem::{Error, Response, Store};

#[test]
fn a_failed_batch_commit_answers_every_member_and_every_queued_caller() {
    let backend = CrashBackend::default();
    let store = Store::builder()
        .open_with_backend(backend.clone())
        .expect("open");
    const N: usize = 8;
    let (held1_tx, held1_rx) = mpsc::channel::<()>();
    let (release1_tx, release1_rx) = mpsc::channel::<()>();
    let (held2_tx, held2_rx) = mpsc::channel::<()>();
    let (release2_tx, release2_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    thread::scope(|s| {
        let store = &store;
        // Gate 1 holds the writer while gate 2 and N callers queue behind it.
        s.spawn(move || {
            let r = store.execute(req("t", "op", "gate1", b"p"), |_| {
                held1_tx.send(()).expect("test alive");
                release1_rx.recv().expect("released");
                Ok(Response::new(200, "gate1"))
            });
            assert!(r.is_ok(), "gate 1 commits before the disk fails: {r:?}");
        });
        held1_rx.recv().expect("gate 1 holds the writer");
        let done = done_tx.clone();
        s.spawn(move || {
            let r = store.execute(req("t", "op", "gate2", b"p"), |_| {
                held2_tx.send(()).expect("test alive");
                release2_rx.recv().expect("released");
                Ok(Response::new(200, "gate2"))
            });
            done.send(("gate2".to_owned(), r)).expect("test alive");
        });
        wait_for_queue(store, 1);
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
            wait_for_queue(store, 2 + i);
        }
        // Gate 1 commits; gate 2 leads the next batch (itself + N) and holds it open.
        release1_tx.send(()).expect("gate 1 alive");
        held2_rx.recv().expect("gate 2 holds the second batch");
        // The disk fails before that batch commits; two callers arrive meanwhile.
        backend.failing.store(true, Ordering::SeqCst);
        for key in ["late1", "late2"] {
            let done = done_tx.clone();
            s.spawn(move || {
                let r = store.execute(req("t", "op", key, b"p"), |_| Ok(Response::new(201, "x")));
                done.send((key.to_owned(), r)).expect("test alive");
            });
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
                // A late caller either queued behind the failed batch, or arrived after it.
                Err(Error::FailStopped { .. }) => {}
                other => panic!("{key}: expected a failure, got {other:?}"),
            }
        }
    });
    assert!(store.failure().is_some());
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
        Ok(idem::Outcome::Replayed(_))
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
