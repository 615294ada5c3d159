//! A retention policy is stated as the windows in which a duplicate can arrive (client retry,
//! queue redrive, webhook replay, operator replay, settlement); the store keeps the response for
//! the longest one, and a tombstone until the policy's (or the store's) horizon.

use crate::common;

use std::time::Duration;

use common::*;
use idem::{ExecuteAnswer, Response, RetentionPolicy, Scope, Store};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn claim(store: &Store, op: &str) -> idem::format::Record {
    executed(store.execute(req("t", op, "k", b"p"), |_| Ok(Response::new(201, "ok"))));
    store
        .get(&Scope::new("t", op), "k")
        .expect("get")
        .expect("record")
}

#[test]
fn the_longest_window_is_the_retention_and_the_horizon_follows_the_policy() {
    let payments = RetentionPolicy::new()
        .client_retry(HOUR)
        .queue_redrive(4 * HOUR)
        .webhook_replay(3 * DAY)
        .settlement(2 * DAY)
        .tombstone_horizon(45 * DAY);
    let h = Harness::with(|b| {
        b.retention_policy(RetentionPolicy::new().client_retry(2 * HOUR))
            .retention_policy_for("charge", payments)
            .tombstone_horizon(5 * DAY)
    });
    let store = h.store();

    let charge = claim(store, "charge");
    assert_eq!(
        charge.expires_at,
        T0.saturating_add(3 * DAY),
        "webhook replay is the longest"
    );
    assert_eq!(
        charge.forget_at,
        T0.saturating_add(45 * DAY),
        "the policy's own horizon"
    );

    let other = claim(store, "other");
    assert_eq!(
        other.expires_at,
        T0.saturating_add(2 * HOUR),
        "the default policy"
    );
    assert_eq!(
        other.forget_at,
        T0.saturating_add(5 * DAY),
        "the store's horizon"
    );

    h.clock.advance(3 * DAY - Duration::from_millis(1));
    assert!(
        store
            .execute(req("t", "charge", "k", b"p"), |_| Ok(Response::new(
                500, "no"
            )))
            .expect("replay")
            .is_replay()
    );
    h.clock.advance(Duration::from_millis(1));
    assert!(matches!(
        store.execute(req("t", "charge", "k", b"p"), |_| Ok(Response::new(
            500, "no"
        ))),
        Ok(ExecuteAnswer::Expired(_))
    ));
}

#[test]
fn a_horizon_shorter_than_the_retention_means_no_tombstone() {
    let h = Harness::with(|b| {
        b.retention_policy(
            RetentionPolicy::new()
                .operator_replay(2 * DAY)
                .tombstone_horizon(DAY),
        )
    });
    let store = h.store();
    let r = claim(store, "op");
    assert_eq!(r.expires_at, T0.saturating_add(2 * DAY));
    assert_eq!(
        r.forget_at, r.expires_at,
        "the horizon is raised to the retention"
    );
}

#[test]
fn a_lease_record_leaves_no_tombstone_and_lives_at_least_its_lease() {
    let h = Harness::with(|b| {
        b.lease_duration(HOUR)
            .retention(HOUR)
            .tombstone_horizon(DAY)
    });
    let store = h.store();
    let _lease = acquired(store.begin(req("t", "charge", "k", b"p")));
    let r = store
        .get(&Scope::new("t", "charge"), "k")
        .expect("get")
        .expect("record");
    assert_eq!(r.expires_at, T0.saturating_add(HOUR));
    assert_eq!(r.forget_at, r.expires_at);
}
