//! A key is bound to the payload that first used it: the same key with a different payload is
//! refused with `PayloadMismatch`, runs nothing and changes nothing, whatever state the key is
//! in. Equal payloads built differently fingerprint equal and replay.

use crate::common;

use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use idem::{Abort, Error, Request, Response, Scope, Store};

#[track_caller]
fn assert_mismatch<T: std::fmt::Debug>(result: Result<T, Error>, key: &str) {
    match result {
        Err(Error::PayloadMismatch {
            tenant,
            operation,
            key: k,
        }) => {
            assert_eq!(tenant, "t1");
            assert_eq!(operation, "create");
            assert_eq!(k, key);
        }
        other => panic!("expected PayloadMismatch, got {other:?}"),
    }
}

fn raw(store: &Store, key: &str) -> Vec<u8> {
    store
        .get(&Scope::new("t1", "create"), key)
        .expect("get")
        .expect("record exists")
        .encode()
}

#[test]
fn different_payload_on_a_completed_key_is_refused_and_changes_nothing() {
    let h = Harness::new();
    let store = h.store();
    executed(store.execute(req("t1", "create", "k", b"payload A"), |tx| {
        bump(tx, "create")?;
        Ok(Response::new(201, "A"))
    }));
    let before = raw(store, "k");
    h.clock.advance(Duration::from_secs(5));

    let runs = Cell::new(0u32);
    assert_mismatch(
        store.execute(req("t1", "create", "k", b"payload B"), |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "create")?;
            Ok(Response::new(201, "B"))
        }),
        "k",
    );
    assert_mismatch(store.begin(req("t1", "create", "k", b"payload B")), "k");

    assert_eq!(runs.get(), 0, "the closure must not run on a mismatch");
    assert_eq!(raw(store, "k"), before, "the record is byte-identical");
    assert_eq!(effects(store, "create"), 1);
    // The original payload still replays the original answer.
    let r = replayed(store.execute(req("t1", "create", "k", b"payload A"), |_| {
        Ok(Response::new(500, "must not run"))
    }));
    assert_eq!(r.body(), b"A");
}

#[test]
fn different_payload_on_a_failed_key_is_refused() {
    let h = Harness::new();
    let store = h.store();
    let failed = executed(store.execute(req("t1", "create", "k", b"A"), |_| {
        Err(Abort::terminal(Response::new(402, "declined")))
    }));
    assert!(failed.is_failure());
    let before = raw(store, "k");
    assert_mismatch(
        store.execute(req("t1", "create", "k", b"B"), |_| {
            Ok(Response::new(200, "would succeed"))
        }),
        "k",
    );
    assert_eq!(raw(store, "k"), before);
}

#[test]
fn different_payload_on_a_pending_lease_is_refused() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(req("t1", "create", "k", b"payload A")));
    let before = raw(store, "k");

    assert_mismatch(store.begin(req("t1", "create", "k", b"payload B")), "k");
    let runs = Cell::new(0u32);
    assert_mismatch(
        store.execute(req("t1", "create", "k", b"payload B"), |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "create")?;
            Ok(Response::new(201, "B"))
        }),
        "k",
    );
    assert_eq!(runs.get(), 0);
    assert_eq!(raw(store, "k"), before, "the Pending record is untouched");
    assert_eq!(effects(store, "create"), 0);

    // The holder is unaffected and finishes normally.
    lease
        .complete(Response::new(201, "A"))
        .expect("holder completes");
    let r = begin_replayed(store.begin(req("t1", "create", "k", b"payload A")));
    assert_eq!(r.body(), b"A");
}

#[test]
fn a_lapsed_lease_cannot_be_taken_over_with_a_different_payload() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(req("t1", "create", "k", b"payload A")));
    h.clock.advance(Duration::from_secs(60)); // well past the 30 s lease
    let before = raw(store, "k");

    assert_mismatch(store.begin(req("t1", "create", "k", b"payload B")), "k");
    assert_mismatch(
        store.execute(req("t1", "create", "k", b"payload B"), |_| {
            Ok(Response::new(201, "B"))
        }),
        "k",
    );
    assert_eq!(raw(store, "k"), before);
    // The same payload does take it over.
    let second = acquired(store.begin(req("t1", "create", "k", b"payload A")));
    assert_eq!(second.takeover_of(), Some(1));
    drop(lease);
}

#[derive(serde::Serialize)]
struct Order {
    sku: String,
    quantity: u32,
    notes: BTreeMap<String, String>,
}

fn notes(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn equal_serde_payloads_built_differently_replay_instead_of_mismatching() {
    let h = Harness::new();
    let store = h.store();
    let scope = Scope::new("t1", "create");

    // Same map, filled in opposite orders.
    let forward = notes(&[("a", "1"), ("b", "2"), ("c", "3")]);
    let backward = notes(&[("c", "3"), ("b", "2"), ("a", "1")]);
    let first = Order {
        sku: "sku-1".into(),
        quantity: 2,
        notes: forward.clone(),
    };
    let second = Order {
        sku: String::from("sku-1"),
        quantity: 2,
        notes: backward.clone(),
    };
    // A tuple of the same values has the same postcard encoding as the struct.
    let as_tuple = ("sku-1", 2u32, backward);

    let r1 = Request::new(scope.clone(), "k", &first).expect("fingerprint");
    let r2 = Request::new(scope.clone(), "k", &second).expect("fingerprint");
    let r3 = Request::new(scope.clone(), "k", &as_tuple).expect("fingerprint");
    assert_eq!(r1.fingerprint(), r2.fingerprint());
    assert_eq!(r1.fingerprint(), r3.fingerprint());

    let runs = Cell::new(0u32);
    let run = |request: Request| {
        store.execute(request, |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "create")?;
            Ok(Response::new(201, "created"))
        })
    };
    executed(run(r1));
    assert_eq!(replayed(run(r2)).body(), b"created");
    assert_eq!(replayed(run(r3)).body(), b"created");
    assert_eq!(runs.get(), 1);

    // A genuinely different value under the same key is still a mismatch.
    let changed = Order {
        sku: "sku-1".into(),
        quantity: 3,
        notes: forward,
    };
    assert_mismatch(
        run(Request::new(scope.clone(), "k", &changed).expect("fingerprint")),
        "k",
    );
    assert_eq!(runs.get(), 1);
    assert_eq!(effects(store, "create"), 1);
}

#[test]
fn serde_and_canonical_bytes_entry_points_do_not_collide() {
    // The same bytes through the two entry points are different intents (domain separation),
    // so mixing entry points for one key is reported, not silently replayed.
    let h = Harness::new();
    let store = h.store();
    let bytes: &[u8] = b"abc";
    let scope = Scope::new("t1", "create");
    let via_serde = Request::new(scope.clone(), "k", &bytes).expect("fingerprint");
    let via_bytes = Request::from_canonical_bytes(scope, "k", bytes);
    assert_ne!(via_serde.fingerprint(), via_bytes.fingerprint());
    executed(store.execute(via_serde, |_| Ok(Response::new(200, "ok"))));
    assert_mismatch(
        store.execute(via_bytes, |_| Ok(Response::new(200, "ok"))),
        "k",
    );
}
