//! Keys are scoped (tenant and operation, length-prefixed) and bound to their first payload
//! for as long as the record lives, tombstone included.

use idem::format::State;
use idem::{Response, Scope};

use super::*;

/// Runs `(tenant, op, key, payload)` answering `body` and bumping `tenant|op|key`; returns the
/// answer's body and whether the closure ran.
fn run<E: Engine>(
    e: &E,
    tenant: &str,
    op: &str,
    key: &str,
    payload: &[u8],
    body: &str,
) -> (Vec<u8>, bool) {
    let b = Behavior::answer(Response::new(201, body)).effect(&format!("{tenant}|{op}|{key}"));
    let outcome = e
        .execute(req(tenant, op, key, payload), &b)
        .expect("execute");
    let response = outcome.response().cloned().expect("a response");
    (response.body().to_vec(), b.runs() == 1)
}

/// The same key under another tenant, or another operation, is another intent: each runs once
/// (a different payload there is no mismatch), each replays its own answer.
pub fn same_key_under_another_tenant_or_operation_is_another_intent<E: Engine>(e: &mut E) {
    let cases = [
        ("tenant-a", "create", "A"),
        ("tenant-b", "create", "B"),
        ("tenant-a", "refund", "C"),
    ];
    for (tenant, op, payload) in cases {
        assert_eq!(
            run(e, tenant, op, "k", payload.as_bytes(), payload),
            (payload.as_bytes().to_vec(), true)
        );
    }
    for (tenant, op, payload) in cases {
        let (body, ran) = run(e, tenant, op, "k", payload.as_bytes(), "second");
        assert_eq!(
            (body, ran),
            (payload.as_bytes().to_vec(), false),
            "{tenant}/{op} replays its own"
        );
        assert_eq!(e.effects(&format!("{tenant}|{op}|k")), 1);
    }
    let a = e
        .get(&Scope::new("tenant-a", "create"), "k")
        .expect("get")
        .expect("a");
    let b = e
        .get(&Scope::new("tenant-b", "create"), "k")
        .expect("get")
        .expect("b");
    assert_ne!(a.fingerprint, b.fingerprint);
}

/// The composite key is length-prefixed: tenant `a:b` + operation `c` is not tenant `a` +
/// operation `b:c`, and operation `b` + key `c:k` is not operation `b:c` + key `k`.
pub fn composite_key_is_length_prefixed<E: Engine>(e: &mut E) {
    let cases = [("a:b", "c", "k"), ("a", "b:c", "k"), ("a", "b", "c:k")];
    for (i, (tenant, op, key)) in cases.iter().enumerate() {
        let payload = format!("payload-{i}");
        let (body, ran) = run(e, tenant, op, key, payload.as_bytes(), &payload);
        assert!(ran, "{tenant}/{op}/{key} is its own intent");
        assert_eq!(body, payload.as_bytes());
    }
    for (i, (tenant, op, key)) in cases.iter().enumerate() {
        let payload = format!("payload-{i}");
        assert_eq!(
            run(e, tenant, op, key, payload.as_bytes(), "again"),
            (payload.into_bytes(), false)
        );
        assert!(
            e.get(&Scope::new(*tenant, *op), key)
                .expect("get")
                .is_some()
        );
    }
}

/// Within the horizon the key stays bound to its payload: a different payload is
/// `PayloadMismatch` against the (lazy, then swept) tombstone on both flows and changes
/// nothing; past the horizon the different payload is a new intent.
pub fn mismatch_against_a_tombstone<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create_order");
    executed(e.execute(
        req("t1", "create_order", "k", b"qty=2"),
        &Behavior::answer(Response::new(201, "two")),
    ));
    let other = Behavior::answer(Response::new(201, "five")).effect("five");
    e.advance(RETENTION);
    let before = e.get(&scope, "k").expect("get");
    mismatch(e.execute(req("t1", "create_order", "k", b"qty=5"), &other));
    mismatch(e.begin(req("t1", "create_order", "k", b"qty=5")));
    assert_eq!(e.get(&scope, "k").expect("get"), before);

    assert_eq!(e.sweep().expect("sweep").tombstoned, 1);
    let shrunk = e.get(&scope, "k").expect("get").expect("tombstone");
    assert!(matches!(shrunk.state, State::Tombstone(_)));
    mismatch(e.execute(req("t1", "create_order", "k", b"qty=5"), &other));
    mismatch(e.begin(req("t1", "create_order", "k", b"qty=5")));
    assert_eq!(e.get(&scope, "k").expect("get"), Some(shrunk));
    assert_eq!((other.runs(), e.effects("five")), (0, 0));
    // The original payload is still "already done".
    assert_eq!(
        expired(e.execute(req("t1", "create_order", "k", b"qty=2"), &other)).status(),
        201
    );

    e.advance(HORIZON - RETENTION);
    assert_eq!(
        executed(e.execute(req("t1", "create_order", "k", b"qty=5"), &other)).body(),
        b"five"
    );
    assert_eq!(e.effects("five"), 1);
}
