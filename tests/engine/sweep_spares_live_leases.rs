//! A sweep never deletes a Pending record whose lease is alive (its `forget_at` is never before
//! its lease deadline, and heartbeats move both); a lease record past its `expires_at` — the
//! attempt died and nobody took over — is deleted, and its old holder is fenced out.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::*;
use idem::format::State;
use idem::{Error, Response, Scope, Store};

const LEASE: Duration = Duration::from_secs(30);
const MS: Duration = Duration::from_millis(1);

fn pending(store: &Store, key: &str) -> bool {
    matches!(
        store.get(&Scope::new("t1", "charge"), key).expect("get"),
        Some(r) if matches!(r.state, State::Pending { .. })
    )
}

#[test]
fn a_heartbeating_lease_survives_every_sweep_even_when_retention_equals_the_lease() {
    // The tightest setting allowed: the record lives exactly as long as the lease.
    let h = Harness::with(|b| {
        b.lease_duration(LEASE)
            .retention(LEASE)
            .tombstone_horizon(LEASE)
    });
    let store = h.store();
    let mut lease = acquired(store.begin(req("t1", "charge", "k", b"p")));
    for _ in 0..100 {
        // Up to the last millisecond of the lease, then heartbeat.
        h.clock.advance(LEASE - MS);
        let report = store.sweep().expect("sweep");
        assert_eq!(report.swept(), 0, "{report:?}");
        assert!(pending(store, "k"), "the live lease's record was swept");
        lease.heartbeat().expect("still held");
    }
    // 50 minutes later the attempt finishes normally.
    let r = lease
        .complete(Response::new(201, "done"))
        .expect("complete");
    assert_eq!(
        begin_replayed(store.begin(req("t1", "charge", "k", b"p"))),
        r
    );
    store.check_expiry_index().expect("index matches");
}

#[test]
fn a_lapsed_lease_is_swept_only_once_its_record_expires_and_the_holder_is_fenced() {
    let h = Harness::with(|b| b.lease_duration(LEASE).retention(Duration::from_secs(3600)));
    let store = h.store();
    let dead = acquired(store.begin(req("t1", "charge", "k", b"p")));

    // The lease lapsed, but the record lives until its expires_at: a retry would take over.
    h.clock.advance(LEASE);
    assert_eq!(store.sweep().expect("sweep").swept(), 0);
    assert!(pending(store, "k"));

    // At expires_at (an hour after the claim) the record is forgotten and swept.
    h.clock.advance(Duration::from_secs(3600) - LEASE);
    let report = store.sweep().expect("sweep");
    assert_eq!((report.deleted, report.tombstoned), (1, 0), "{report:?}");
    assert!(!pending(store, "k"));
    assert_eq!(
        store.get(&Scope::new("t1", "charge"), "k").expect("get"),
        None,
        "a lease that never finished leaves no tombstone"
    );

    // The old holder wakes up: its lease is gone.
    assert!(matches!(
        dead.complete(Response::new(201, "late")),
        Err(Error::LeaseLost { .. })
    ));
    let next = acquired(store.begin(req("t1", "charge", "k", b"p")));
    assert_eq!(next.attempt(), 1);
    store.check_expiry_index().expect("index matches");
}

#[test]
fn a_sweep_among_many_leases_deletes_exactly_the_expired_ones() {
    let h = Harness::with(|b| b.lease_duration(LEASE).retention(LEASE));
    let store = h.store();
    let mut live = Vec::new();
    let mut dead = Vec::new();
    for i in 0..20 {
        dead.push(acquired(store.begin(req(
            "t1",
            "charge",
            &format!("dead-{i}"),
            b"p",
        ))));
    }
    h.clock.advance(LEASE / 2);
    for i in 0..20 {
        live.push(acquired(store.begin(req(
            "t1",
            "charge",
            &format!("live-{i}"),
            b"p",
        ))));
    }
    h.clock.advance(LEASE / 2); // the first 20 are at their deadline, the others half-way
    let report = store.sweep().expect("sweep");
    assert_eq!(report.deleted, 20, "{report:?}");
    for i in 0..20 {
        assert!(pending(store, &format!("live-{i}")), "live-{i} was swept");
        assert!(!pending(store, &format!("dead-{i}")));
    }
    for lease in live {
        lease
            .complete(Response::new(200, "ok"))
            .expect("a live lease completes");
    }
    for lease in dead {
        assert!(matches!(
            lease.complete(Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
    }
    store.check_expiry_index().expect("index matches");
}
