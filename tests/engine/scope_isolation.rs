//! There is no global keyspace: the same key under two tenants, or two operations, names two
//! independent intents, and the composite key cannot be confused by separators inside names.

use crate::common;

use std::cell::Cell;

use common::*;
use idem::{Response, Scope};

/// Runs one request whose closure bumps `label` and answers `body`; returns whether the
/// closure ran.
fn run_once(h: &Harness, tenant: &str, op: &str, key: &str, payload: &[u8], body: &str) -> bool {
    let ran = Cell::new(false);
    let outcome = h.store().execute(req(tenant, op, key, payload), |tx| {
        ran.set(true);
        bump(tx, &format!("{tenant}|{op}|{key}"))?;
        Ok(Response::new(201, body))
    });
    let response = outcome
        .expect("execute")
        .response()
        .cloned()
        .expect("response");
    assert_eq!(response.body(), body.as_bytes(), "{tenant}/{op}/{key}");
    ran.get()
}

#[test]
fn same_key_under_two_tenants_is_two_intents() {
    let h = Harness::new();
    assert!(run_once(&h, "tenant-a", "create", "k", b"A", "a"));
    // A different payload under another tenant is not a mismatch: it is another intent.
    assert!(run_once(&h, "tenant-b", "create", "k", b"B", "b"));
    // Each replays its own answer.
    assert!(!run_once(&h, "tenant-a", "create", "k", b"A", "a"));
    assert!(!run_once(&h, "tenant-b", "create", "k", b"B", "b"));
    assert_eq!(effects(h.store(), "tenant-a|create|k"), 1);
    assert_eq!(effects(h.store(), "tenant-b|create|k"), 1);

    let a = h.store().get(&Scope::new("tenant-a", "create"), "k");
    let b = h.store().get(&Scope::new("tenant-b", "create"), "k");
    let (a, b) = (a.expect("get a").expect("a"), b.expect("get b").expect("b"));
    assert_ne!(a.fingerprint, b.fingerprint);
}

#[test]
fn same_key_under_two_operations_is_two_intents() {
    let h = Harness::new();
    assert!(run_once(&h, "t", "create_payment", "k", b"P", "payment"));
    assert!(run_once(&h, "t", "refund", "k", b"P", "refund"));
    assert!(!run_once(&h, "t", "create_payment", "k", b"P", "payment"));
    assert!(!run_once(&h, "t", "refund", "k", b"P", "refund"));
    assert_eq!(effects(h.store(), "t|create_payment|k"), 1);
    assert_eq!(effects(h.store(), "t|refund|k"), 1);
}

#[test]
fn separators_inside_names_cannot_make_two_scopes_collide() {
    let h = Harness::new();
    // Pairs whose naive concatenation (with or without a separator) is identical.
    let cases: [[(&str, &str, &str); 2]; 3] = [
        [("a:b", "c", "k"), ("a", "b:c", "k")],
        [("ab", "c", "k"), ("a", "bc", "k")],
        [("t", "o", "k1"), ("t", "ok", "1")],
    ];
    for (i, [(t1, o1, k1), (t2, o2, k2)]) in cases.into_iter().enumerate() {
        let body1 = format!("first-{i}");
        let body2 = format!("second-{i}");
        assert!(run_once(&h, t1, o1, k1, b"X", &body1), "case {i} first");
        assert!(
            run_once(&h, t2, o2, k2, b"Y", &body2),
            "case {i}: the second scope must execute, not replay or mismatch"
        );
        assert!(!run_once(&h, t1, o1, k1, b"X", &body1));
        assert!(!run_once(&h, t2, o2, k2, b"Y", &body2));
    }
}

#[test]
fn a_lease_in_one_tenant_does_not_block_another() {
    let h = Harness::new();
    let a = acquired(h.store().begin(req("tenant-a", "charge", "k", b"p")));
    let b = acquired(h.store().begin(req("tenant-b", "charge", "k", b"p")));
    let c = acquired(h.store().begin(req("tenant-a", "refund", "k", b"p")));
    assert_ne!(a.downstream_key(), b.downstream_key());
    assert_ne!(a.downstream_key(), c.downstream_key());
    assert_ne!(b.downstream_key(), c.downstream_key());
    a.complete(Response::new(200, "a")).expect("a");
    // b and c are still in flight, a replays.
    begin_in_flight(h.store().begin(req("tenant-b", "charge", "k", b"p")));
    begin_in_flight(h.store().begin(req("tenant-a", "refund", "k", b"p")));
    let r = begin_replayed(h.store().begin(req("tenant-a", "charge", "k", b"p")));
    assert_eq!(r.body(), b"a");
    b.complete(Response::new(200, "b")).expect("b");
    c.complete(Response::new(200, "c")).expect("c");
}
