//! How the caller's closure ends decides what commits: a retryable error leaves nothing (no
//! record, no caller writes) and the retry runs again; a terminal error is recorded with the
//! caller's writes and replayed forever; a storage error rolls everything back.

use crate::common;

use std::cell::Cell;
use std::io;

use common::*;
use idem::format::State;
use idem::redb::TableDefinition;
use idem::{Abort, Error, Response, Scope};

#[test]
fn retryable_abort_leaves_no_record_and_no_writes_and_the_retry_runs_again() {
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let attempt = |fail: bool| {
        store.execute(req("t1", "create", "k", b"p"), |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "create")?;
            if fail {
                Err(Abort::retryable("inventory service timed out"))
            } else {
                Ok(Response::new(201, "created"))
            }
        })
    };

    let err = attempt(true).expect_err("retryable abort is an error");
    assert!(err.is_retryable());
    match &err {
        Error::Aborted { source } => {
            assert_eq!(source.to_string(), "inventory service timed out")
        }
        other => panic!("expected Aborted, got {other:?}"),
    }
    assert_eq!(
        store.get(&Scope::new("t1", "create"), "k").expect("get"),
        None
    );
    assert_eq!(
        effects(store, "create"),
        0,
        "the caller's write was rolled back"
    );
    assert_eq!(
        store.fail_stop_cause(),
        None,
        "an abort does not fail-stop the store"
    );

    // Again retryable, via the enum variant and a typed error.
    let again = store.execute(req("t1", "create", "k", b"p"), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, "create")?;
        Err(Abort::Retryable(Box::new(io::Error::new(
            io::ErrorKind::TimedOut,
            "still down",
        ))))
    });
    assert!(matches!(again, Err(Error::Aborted { .. })), "{again:?}");
    assert_eq!(effects(store, "create"), 0);

    // The retry runs the closure again and succeeds.
    assert_eq!(executed(attempt(false)).body(), b"created");
    assert_eq!(runs.get(), 3);
    assert_eq!(effects(store, "create"), 1);
    assert_eq!(replayed(attempt(false)).body(), b"created");
    assert_eq!(runs.get(), 3);
}

#[test]
fn terminal_abort_commits_the_writes_and_every_retry_replays_the_failure() {
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let charge = || {
        store.execute(req("t1", "charge", "k", b"card=4000"), |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "declines")?;
            Err(Abort::Terminal(Response::new(402, "card declined")))
        })
    };

    let first = executed(charge());
    assert!(first.is_failure());
    assert_eq!(first.status(), 402);
    assert_eq!(first.body(), b"card declined");
    assert_eq!(
        effects(store, "declines"),
        1,
        "writes made with a terminal abort commit"
    );
    let record = store
        .get(&Scope::new("t1", "charge"), "k")
        .expect("get")
        .expect("record");
    assert!(matches!(record.state, State::Failed(ref r) if r == &first));

    for _ in 0..3 {
        let again = replayed(charge());
        assert!(again.is_failure());
        assert_eq!(again, first);
    }
    assert_eq!(runs.get(), 1, "a terminal failure is never run again");
    assert_eq!(effects(store, "declines"), 1);

    // Even a closure that would now succeed does not run.
    let r = replayed(store.execute(req("t1", "charge", "k", b"card=4000"), |_| {
        Ok(Response::new(200, "ok now"))
    }));
    assert!(r.is_failure());
}

#[test]
fn terminal_abort_via_the_helper_is_the_same_as_the_variant() {
    let h = Harness::new();
    let store = h.store();
    let a = executed(store.execute(req("t1", "op", "a", b"p"), |_| {
        Err(Abort::terminal(Response::new(409, "conflict")))
    }));
    let b = executed(store.execute(req("t1", "op", "b", b"p"), |_| {
        Err(Abort::Terminal(Response::new(409, "conflict")))
    }));
    assert_eq!(a, b);
    assert!(a.is_failure());
}

#[test]
fn a_storage_error_propagated_with_question_mark_rolls_everything_back() {
    const SAME_NAME_OTHER_TYPE: TableDefinition<u64, u64> = TableDefinition::new("test.effects");
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let result = store.execute(req("t1", "create", "k", b"p"), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, "create")?;
        // redb refuses to reopen a table under a different type: a TableError, through `?`.
        let _wrong = tx.open_table(SAME_NAME_OTHER_TYPE)?;
        Ok(Response::new(201, "unreachable"))
    });
    assert!(
        matches!(result, Err(Error::Storage { .. })),
        "expected a storage error, got {result:?}"
    );
    assert_eq!(runs.get(), 1);
    assert_eq!(
        store.get(&Scope::new("t1", "create"), "k").expect("get"),
        None
    );
    assert_eq!(
        effects(store, "create"),
        0,
        "the write before the error was rolled back"
    );
    assert_eq!(
        store.fail_stop_cause(),
        None,
        "misuse is not an I/O failure: no fail-stop"
    );

    // The retry runs again and succeeds.
    executed(store.execute(req("t1", "create", "k", b"p"), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, "create")?;
        Ok(Response::new(201, "created"))
    }));
    assert_eq!(runs.get(), 2);
    assert_eq!(effects(store, "create"), 1);
}

#[test]
fn an_explicit_abort_store_rolls_back() {
    let h = Harness::new();
    let store = h.store();
    let result = store.execute(req("t1", "create", "k", b"p"), |tx| {
        bump(tx, "create")?;
        Err(Abort::Store(Error::Config {
            reason: "caller-chosen store error".into(),
        }))
    });
    assert!(matches!(result, Err(Error::Config { .. })), "{result:?}");
    assert_eq!(
        store.get(&Scope::new("t1", "create"), "k").expect("get"),
        None
    );
    assert_eq!(effects(store, "create"), 0);
}

#[test]
fn a_panicking_closure_writes_nothing_and_leaves_the_key_free() {
    let h = Harness::new();
    let store = h.store();
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = store.execute(req("t1", "create", "k", b"p"), |tx| {
            bump(tx, "create")?;
            panic!("caller bug");
        });
    }));
    assert!(panicked.is_err());
    assert_eq!(
        store.get(&Scope::new("t1", "create"), "k").expect("get"),
        None
    );
    assert_eq!(effects(store, "create"), 0);
    executed(store.execute(req("t1", "create", "k", b"p"), |tx| {
        bump(tx, "create")?;
        Ok(Response::new(201, "created"))
    }));
    assert_eq!(effects(store, "create"), 1);
}

#[test]
fn a_nested_store_call_inside_the_closure_fails_fast_instead_of_deadlocking() {
    let h = Harness::new();
    let store = h.store().clone();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // A detached thread: if it deadlocks, it is leaked (holding only this test's own file).
    std::thread::spawn(move || {
        let outer = store.execute(req("t1", "outer", "k", b"p"), |_| {
            let inner = store.execute(req("t1", "inner", "k", b"p"), |_| {
                Ok(Response::new(200, "inner"))
            });
            let _ = done_tx.send(matches!(inner, Err(idem::Error::Reentrant)));
            Ok(Response::new(200, "outer"))
        });
        drop(outer);
    });
    match done_rx.recv_timeout(std::time::Duration::from_secs(2)) {
        Ok(reentrant) => assert!(reentrant, "a nested write fails with Error::Reentrant"),
        Err(_) => panic!("a nested store.execute inside a closure deadlocked"),
    }
}

#[test]
fn begin_wait_inside_a_closure_is_refused_at_once() {
    let h = Harness::new();
    let store = h.store();
    // A live lease on the key, so begin_wait would otherwise wait for it.
    let _lease = acquired(store.begin(req("t1", "charge", "k", b"p")));
    let inner = std::cell::RefCell::new(None);
    executed(store.execute(req("t1", "outer", "k", b"p"), |_| {
        *inner.borrow_mut() = Some(store.begin_wait(
            req("t1", "charge", "k", b"p"),
            std::time::Duration::from_secs(3600),
        ));
        Ok(Response::new(200, "outer"))
    }));
    assert!(
        matches!(inner.into_inner(), Some(Err(idem::Error::Reentrant))),
        "begin_wait from inside a closure must fail fast, not hold the writer while it waits"
    );
}
