//! A record is replayed until `expires_at` and treated as absent from then on, whether or not a
//! sweep ran; retention can be set per operation and must outlive the lease.

mod common;

use std::cell::Cell;
use std::time::Duration;

use common::*;
use idem::{Abort, Error, Response, Scope, Store, is_expired};

const HOUR: Duration = Duration::from_secs(3600);
const MS: Duration = Duration::from_millis(1);

fn hourly() -> Harness {
    Harness::with(|b| b.retention(HOUR))
}

fn run(store: &Store, op: &str, payload: &[u8], runs: &Cell<u32>) -> Result<idem::Outcome, Error> {
    store.execute(req("t1", op, "k", payload), |tx| {
        runs.set(runs.get() + 1);
        bump(tx, op)?;
        Ok(Response::new(201, format!("run {}", runs.get())))
    })
}

#[test]
fn replays_until_expires_at_then_executes_again_without_a_sweep() {
    let h = hourly();
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"p", &runs));
    let record = store
        .get(&Scope::new("t1", "create"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(record.expires_at, T0.saturating_add(HOUR));

    h.clock.advance(HOUR - MS);
    assert_eq!(replayed(run(store, "create", b"p", &runs)).body(), b"run 1");
    assert_eq!(runs.get(), 1);

    h.clock.advance(MS); // exactly expires_at: the record is gone
    assert!(is_expired(&record, store.now()));
    let late = executed(run(store, "create", b"p", &runs));
    assert_eq!(late.body(), b"run 2");
    assert_eq!(runs.get(), 2, "the late retry ran the closure again");
    assert_eq!(effects(store, "create"), 2, "a second effect happened");

    // The new record has its own retention from now.
    let renewed = store
        .get(&Scope::new("t1", "create"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(renewed.created_at, store.now());
    assert_eq!(renewed.expires_at, store.now().saturating_add(HOUR));
    assert_eq!(replayed(run(store, "create", b"p", &runs)).body(), b"run 2");
}

#[test]
fn retention_for_overrides_one_operation() {
    let h = Harness::with(|b| {
        b.retention(HOUR)
            .retention_for("otp", Duration::from_secs(120))
    });
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "otp", b"p", &runs));
    executed(run(store, "create", b"p", &runs));

    h.clock.advance(Duration::from_secs(120));
    // The overridden operation expired, the default one did not.
    executed(run(store, "otp", b"p", &runs));
    replayed(run(store, "create", b"p", &runs));
    assert_eq!(effects(store, "otp"), 2);
    assert_eq!(effects(store, "create"), 1);
}

#[test]
fn an_expired_record_with_a_different_payload_is_absent_not_a_mismatch() {
    let h = hourly();
    let store = h.store();
    let runs = Cell::new(0u32);
    executed(run(store, "create", b"payload A", &runs));
    h.clock.advance(HOUR - MS);
    assert!(matches!(
        run(store, "create", b"payload B", &runs),
        Err(Error::PayloadMismatch { .. })
    ));
    h.clock.advance(MS);
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
    lease.complete(Response::new(200, "ok")).expect("complete");
    // One hour after the claim, but less than one hour after completion.
    h.clock.advance(HOUR - Duration::from_secs(10));
    assert_eq!(
        begin_replayed(store.begin(req("t1", "charge", "k", b"p"))).body(),
        b"ok"
    );
    h.clock.advance(Duration::from_secs(10));
    let again = acquired(store.begin(req("t1", "charge", "k", b"p")));
    assert_eq!(
        again.attempt(),
        1,
        "an expired record is absent, not taken over"
    );
    assert_eq!(again.takeover_of(), None);
}

#[test]
fn an_expired_terminal_failure_runs_again() {
    let h = hourly();
    let store = h.store();
    let failed = executed(store.execute(req("t1", "charge", "k", b"p"), |_| {
        Err(Abort::terminal(Response::new(402, "declined")))
    }));
    assert!(failed.is_failure());
    h.clock.advance(HOUR);
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
