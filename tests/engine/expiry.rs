//! A record is replayed until `expires_at`, answers as a tombstone (`Expired`) until
//! `forget_at`, and is treated as absent from then on, whether or not a sweep ran; retention can
//! be set per operation and must outlive the lease.

use crate::common;

use std::cell::Cell;
use std::time::Duration;

use common::*;
use idem::rules::{is_expired, is_forgotten};
use idem::{Abort, BeginAnswer, Error, ExecuteAnswer, Response, Scope, Store};

const HOUR: Duration = Duration::from_secs(3600);
const MS: Duration = Duration::from_millis(1);

/// Retention 1 h, tombstones until 3 h after the intent finished.
fn hourly() -> Harness {
    Harness::with(|b| b.retention(HOUR).tombstone_horizon(3 * HOUR))
}

fn run(store: &Store, op: &str, payload: &[u8], runs: &Cell<u32>) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t1", op, "k", payload), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, op)?;
        Ok(Response::new(201, format!("run {}", runs.get())))
    })
}

#[track_caller]
fn expired(outcome: Result<ExecuteAnswer, Error>) -> idem::Tombstone {
    match outcome {
        Ok(ExecuteAnswer::Expired(t)) => t,
        other => panic!("expected ExecuteAnswer::Expired, got {other:?}"),
    }
}

#[test]
fn replays_until_expires_at_then_tombstone_until_forget_at_then_executes_again_without_a_sweep() {
    let h = hourly();
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"p", &runs));
    let record = store
        .get(&Scope::new("t1", "create"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(record.expires_at, T0.saturating_add(HOUR));
    assert_eq!(record.forget_at, T0.saturating_add(3 * HOUR));

    h.clock.advance(HOUR - MS);
    assert_eq!(replayed(run(store, "create", b"p", &runs)).body(), b"run 1");
    assert_eq!(runs.get(), 1);

    h.clock.advance(MS); // exactly expires_at: the response is gone, the intent is not
    assert!(is_expired(&record, store.now()));
    assert!(!is_forgotten(&record, store.now()));
    let t = expired(run(store, "create", b"p", &runs));
    assert_eq!(t.status(), 201);
    assert!(!t.is_failure());
    h.clock.advance(2 * HOUR - MS); // the last millisecond of the horizon
    expired(run(store, "create", b"p", &runs));
    assert_eq!(runs.get(), 1, "a tombstone never runs the closure");
    assert_eq!(effects(store, "create"), 1);

    h.clock.advance(MS); // exactly forget_at: the key is free
    assert!(is_forgotten(&record, store.now()));
    let late = executed(run(store, "create", b"p", &runs));
    assert_eq!(late.body(), b"run 2");
    assert_eq!(runs.get(), 2, "past the horizon the retry runs again");
    assert_eq!(effects(store, "create"), 2, "a second effect happened");

    // The new record has its own times from now.
    let renewed = store
        .get(&Scope::new("t1", "create"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(renewed.created_at, store.now());
    assert_eq!(renewed.expires_at, store.now().saturating_add(HOUR));
    assert_eq!(renewed.forget_at, store.now().saturating_add(3 * HOUR));
    assert_eq!(replayed(run(store, "create", b"p", &runs)).body(), b"run 2");
}

#[test]
fn without_a_tombstone_horizon_the_key_is_free_when_the_response_window_ends() {
    let h = Harness::with(|b| b.retention(HOUR).tombstone_horizon(Duration::ZERO));
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"p", &runs));
    let record = store
        .get(&Scope::new("t1", "create"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(
        record.forget_at, record.expires_at,
        "the horizon is raised to the retention"
    );
    h.clock.advance(HOUR - MS);
    replayed(run(store, "create", b"p", &runs));
    h.clock.advance(MS);
    assert_eq!(executed(run(store, "create", b"p", &runs)).body(), b"run 2");
}

#[test]
fn retention_for_overrides_one_operation() {
    let h = Harness::with(|b| {
        b.retention(HOUR)
            .tombstone_horizon(3 * HOUR)
            .retention_for("otp", Duration::from_secs(120))
    });
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "otp", b"p", &runs));
    executed(run(store, "create", b"p", &runs));

    h.clock.advance(Duration::from_secs(120));
    // The overridden operation's response window is over, the default one's is not.
    expired(run(store, "otp", b"p", &runs));
    replayed(run(store, "create", b"p", &runs));
    assert_eq!(effects(store, "otp"), 1);
    assert_eq!(effects(store, "create"), 1);

    // Both keep the store's horizon.
    h.clock.advance(3 * HOUR - Duration::from_secs(120));
    executed(run(store, "otp", b"p", &runs));
    executed(run(store, "create", b"p", &runs));
    assert_eq!(effects(store, "otp"), 2);
}

#[test]
fn a_different_payload_is_a_mismatch_until_forget_at_then_the_key_is_free() {
    let h = hourly();
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"payload A", &runs));
    h.clock.advance(HOUR - MS);
    assert!(matches!(
        run(store, "create", b"payload B", &runs),
        Err(Error::PayloadMismatch { .. })
    ));
    h.clock.advance(MS); // tombstone: still bound to payload A
    assert!(matches!(
        run(store, "create", b"payload B", &runs),
        Err(Error::PayloadMismatch { .. })
    ));
    h.clock.advance(2 * HOUR);
    executed(run(store, "create", b"payload B", &runs));
    assert_eq!(runs.get(), 2);
    // The key is now bound to payload B.
    assert!(matches!(
        run(store, "create", b"payload A", &runs),
        Err(Error::PayloadMismatch { .. })
    ));
}

#[test]
fn retention_counts_from_completion_not_from_the_claim() {
    let h = hourly();
    let store = h.store();
    let lease = acquired(store.begin(req("t1", "charge", "k", b"p")));
    h.clock.advance(Duration::from_secs(20));
    lease
        .complete(Response::new(200, "ok").with_resource("charge", "ch_1"))
        .expect("complete");
    // One hour after the claim, but less than one hour after completion.
    h.clock.advance(HOUR - Duration::from_secs(10));
    assert_eq!(
        begin_replayed(store.begin(req("t1", "charge", "k", b"p"))).body(),
        b"ok"
    );
    h.clock.advance(Duration::from_secs(10));
    match store.begin(req("t1", "charge", "k", b"p")) {
        Ok(BeginAnswer::Expired(t)) => {
            assert_eq!(t.status(), 200);
            assert_eq!(t.resource().map(|r| r.id.as_str()), Some("ch_1"));
        }
        other => panic!("expected BeginAnswer::Expired, got {other:?}"),
    }
    // Three hours after completion the key is free.
    h.clock.advance(2 * HOUR);
    let again = acquired(store.begin(req("t1", "charge", "k", b"p")));
    assert_eq!(
        again.attempt(),
        1,
        "a forgotten record is absent, not taken over"
    );
    assert_eq!(again.takeover_of(), None);
}

#[test]
fn an_expired_terminal_failure_stays_a_failure_then_runs_again_past_the_horizon() {
    let h = hourly();
    let store = h.store();
    let failed = executed(store.execute(req("t1", "charge", "k", b"p"), |_| {
        Err(Abort::terminal(Response::new(402, "declined")))
    }));
    assert!(failed.is_failure());
    h.clock.advance(HOUR);
    let t = expired(store.execute(req("t1", "charge", "k", b"p"), |_| {
        Ok(Response::new(200, "must not run"))
    }));
    assert!(t.is_failure());
    assert_eq!(t.status(), 402);
    h.clock.advance(2 * HOUR);
    let ok = executed(store.execute(req("t1", "charge", "k", b"p"), |_| {
        Ok(Response::new(200, "approved"))
    }));
    assert!(!ok.is_failure());
}

#[test]
fn a_clock_that_goes_backwards_does_not_free_a_key() {
    let h = hourly();
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"p", &runs));
    h.clock.set(idem::Timestamp(0));
    replayed(run(store, "create", b"p", &runs));
    assert_eq!(runs.get(), 1);
}

#[test]
fn builder_refuses_retention_shorter_than_the_lease() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("idem.redb");
    let too_short = Store::builder()
        .lease_duration(Duration::from_secs(30))
        .retention(Duration::from_secs(29))
        .open(&path);
    assert!(
        matches!(too_short, Err(Error::Config { .. })),
        "{too_short:?}"
    );

    let override_too_short = Store::builder()
        .lease_duration(Duration::from_secs(30))
        .retention(HOUR)
        .retention_for("otp", Duration::from_secs(10))
        .open(&path);
    assert!(
        matches!(override_too_short, Err(Error::Config { .. })),
        "{override_too_short:?}"
    );

    let zero_lease = Store::builder().lease_duration(Duration::ZERO).open(&path);
    assert!(
        matches!(zero_lease, Err(Error::Config { .. })),
        "{zero_lease:?}"
    );

    // Equal is allowed.
    let equal = Store::builder()
        .lease_duration(Duration::from_secs(30))
        .retention(Duration::from_secs(30))
        .open(&path);
    assert!(equal.is_ok(), "{equal:?}");
}
