//! Downstream keys: a workflow activity and its compensation get stable, distinct keys; a
//! compensation that runs twice has one effect.

use crate::common;

use common::{Harness, bump, effects, req};
use idem::Response;
use idem::keys::{activity_key, compensation_key, derive_key};

#[test]
fn a_compensation_that_runs_twice_has_one_effect() {
    let h = Harness::new();
    let forward = activity_key("wf-run-1", "reserve-stock");
    let undo = compensation_key(&forward);
    assert_ne!(undo, forward);
    for _ in 0..2 {
        // The saga's compensation step is retried (e.g. the orchestrator crashed).
        let key = compensation_key(&activity_key("wf-run-1", "reserve-stock"));
        let _ = h
            .store()
            .execute(req("inventory", "release", &key.to_hex(), b"sku-1"), |tx| {
                bump(tx, "released")?;
                Ok(Response::new(200, "released"))
            })
            .unwrap();
    }
    assert_eq!(effects(h.store(), "released"), 1);
}

#[test]
fn step_keys_hang_off_the_lease_key() {
    let h = Harness::new();
    let lease = common::acquired(h.store().begin(req("t", "checkout", "k", b"p")));
    let parent = lease.downstream_key();
    let charge = derive_key(parent.as_bytes(), "charge");
    let email = derive_key(parent.as_bytes(), "email");
    assert_ne!(charge, email);
    assert_ne!(charge, parent);
    assert_eq!(charge, derive_key(parent.as_bytes(), "charge"));
    lease.release().unwrap();
}
