//! Past its response window a finished record is a tombstone: a late retry gets
//! `ExecuteAnswer::Expired` / `BeginAnswer::Expired` (status and resource pointer, no body), its closure
//! does not run and nothing is written; a different payload is still a mismatch. Past the
//! tombstone horizon the key is free and the retry runs. The answers are the same whether the
//! sweep has physically shrunk and deleted the record or not.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::cell::Cell;
use std::time::Duration;

use common::*;
use idem::format::State;
use idem::{Abort, BeginAnswer, Error, ExecuteAnswer, Response, Scope, Store, Tombstone};

const DAY: Duration = Duration::from_secs(24 * 3600);
const MS: Duration = Duration::from_millis(1);

/// The defaults, spelled out: 24 h retention, tombstones until 7 days.
fn harness() -> Harness {
    Harness::with(|b| b.retention(DAY).tombstone_horizon(7 * DAY))
}

fn create(store: &Store, payload: &[u8], runs: &Cell<u32>) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t1", "create_order", "order-1", payload), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, "orders")?;
        Ok(Response::new(201, r#"{"id":"ord_1"}"#).with_resource("order", "ord_1"))
    })
}

fn stored(store: &Store) -> Option<idem::format::Record> {
    store
        .get(&Scope::new("t1", "create_order"), "order-1")
        .expect("get")
}

#[track_caller]
fn expired(outcome: Result<ExecuteAnswer, Error>) -> Tombstone {
    match outcome {
        Ok(ExecuteAnswer::Expired(t)) => t,
        other => panic!("expected ExecuteAnswer::Expired, got {other:?}"),
    }
}

#[test]
fn a_late_retry_gets_the_tombstone_then_runs_past_the_horizon_with_and_without_sweeps() {
    for sweep in [false, true] {
        let h = harness();
        let store = h.store();
        let runs = Cell::new(0u32);
        let first = executed(create(store, b"qty=2", &runs));
        let full_size = stored(store).expect("record").encode().len();

        h.clock.advance(DAY);
        if sweep {
            let report = store.sweep().expect("sweep");
            assert_eq!((report.tombstoned, report.deleted), (1, 0), "{report:?}");
            let record = stored(store).expect("a tombstone is kept");
            let State::Tombstone(t) = &record.state else {
                panic!("the sweep shrank the record: {:?}", record.state)
            };
            assert_eq!(t.status(), 201);
            assert!(
                record.encode().len() + first.body().len() <= full_size,
                "the body is gone from the file"
            );
            assert_eq!(store.stats().expect("stats").tombstones, 1);
        } else {
            // Lazily: still stored in full, yet answered as a tombstone from its instants.
            assert!(matches!(
                stored(store).expect("record").state,
                State::Completed(_)
            ));
            let stats = store.stats().expect("stats");
            assert_eq!((stats.completed, stats.due), (1, 1), "{stats:?}");
        }

        let commits = store.metrics().commits;
        let t = expired(create(store, b"qty=2", &runs));
        assert_eq!(t.status(), 201);
        assert!(!t.is_failure());
        let resource = t.resource().expect("the resource pointer survives");
        assert_eq!(
            (resource.kind.as_str(), resource.id.as_str()),
            ("order", "ord_1")
        );
        assert_eq!(runs.get(), 1, "sweep={sweep}: the closure did not run");
        assert_eq!(effects(store, "orders"), 1);
        assert_eq!(store.metrics().commits, commits, "nothing was written");
        // Flow B sees the same tombstone, and does not get a lease.
        match store.begin(req("t1", "create_order", "order-1", b"qty=2")) {
            Ok(BeginAnswer::Expired(b)) => assert_eq!(b, t),
            other => panic!("sweep={sweep}: expected BeginAnswer::Expired, got {other:?}"),
        }
        match store.begin_wait(
            req("t1", "create_order", "order-1", b"qty=2"),
            Duration::from_secs(1),
        ) {
            Ok(BeginAnswer::Expired(b)) => assert_eq!(b, t),
            other => panic!("sweep={sweep}: expected BeginAnswer::Expired, got {other:?}"),
        }
        // The key is still bound to its payload.
        assert!(matches!(
            create(store, b"qty=5", &runs),
            Err(Error::PayloadMismatch { .. })
        ));

        h.clock.advance(6 * DAY - MS);
        if sweep {
            assert_eq!(store.sweep().expect("sweep").swept(), 0);
        }
        expired(create(store, b"qty=2", &runs));

        h.clock.advance(MS); // the horizon: 7 days after the intent finished
        if sweep {
            let report = store.sweep().expect("sweep");
            assert_eq!((report.tombstoned, report.deleted), (0, 1), "{report:?}");
            assert_eq!(stored(store), None, "deleted from the file");
        }
        let again = executed(create(store, b"qty=2", &runs));
        assert_eq!(again.body(), first.body());
        assert_eq!(
            runs.get(),
            2,
            "sweep={sweep}: past the horizon the intent runs again"
        );
        assert_eq!(effects(store, "orders"), 2);
        store.check_expiry_index().expect("index matches");
    }
}

#[test]
fn a_terminal_failure_leaves_a_failed_tombstone() {
    for sweep in [false, true] {
        let h = harness();
        let store = h.store();
        executed(
            store.execute(req("t1", "charge", "c-1", b"amount=10"), |_| {
                Err(Abort::terminal(
                    Response::new(402, "card declined").with_resource("attempt", "a_1"),
                ))
            }),
        );
        h.clock.advance(DAY);
        if sweep {
            assert_eq!(store.sweep().expect("sweep").tombstoned, 1);
        }
        let t = expired(
            store.execute(req("t1", "charge", "c-1", b"amount=10"), |_| {
                Ok(Response::new(200, "must not run"))
            }),
        );
        assert!(t.is_failure(), "sweep={sweep}");
        assert_eq!(t.status(), 402);
        assert_eq!(t.resource().map(|r| r.id.as_str()), Some("a_1"));
    }
}

#[test]
fn a_flow_b_completion_expires_to_a_tombstone_and_is_not_called_again() {
    let h = harness();
    let store = h.store();
    let charge = || req("t1", "charge", "checkout-77", b"amount=4200");
    let lease = acquired(store.begin(charge()));
    lease
        .complete(Response::new(201, "ch_1").with_resource("charge", "ch_1"))
        .expect("complete");
    h.clock.advance(DAY);
    store.sweep().expect("sweep");
    match store.begin(charge()) {
        Ok(BeginAnswer::Expired(t)) => {
            assert_eq!(t.status(), 201);
            assert_eq!(t.resource().map(|r| r.id.as_str()), Some("ch_1"));
        }
        other => panic!("a late retry must not call the provider again: {other:?}"),
    }
    h.clock.advance(6 * DAY);
    store.sweep().expect("sweep");
    let again = acquired(store.begin(charge()));
    assert_eq!(again.attempt(), 1);
}
