//! `Store::compact` gives space back after a large deletion, needs the store to itself — no
//! other clone, no live lease, no open read transaction, each refused with `Error::InUse` and
//! no change — and leaves a store that works as before, background threads included.

// White-box hooks (`Store::check_expiry_index`, `Store::sweeper_liveness`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::*;
use idem::{Durability, Error, Response, Store};

const HOUR: Duration = Duration::from_secs(3600);

fn size(h: &Harness) -> u64 {
    std::fs::metadata(&h.path).expect("file size").len()
}

fn claim(store: &Store, key: &str) {
    executed(store.execute(req("t", "op", key, b"p"), |_| {
        Ok(Response::new(201, vec![b'x'; 256]))
    }));
}

#[test]
fn compaction_after_a_sweep_shrinks_the_file() {
    let mut h = Harness::with(|b| {
        b.retention(HOUR)
            .tombstone_horizon(HOUR)
            .durability(Durability::Periodic(HOUR))
            .sweep_interval(HOUR)
    });
    let store = h.store().clone();
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                for i in 0..600 {
                    claim(store, &format!("spike-{t}-{i}"));
                }
            });
        }
    });
    h.clock.advance(HOUR);
    assert_eq!(store.sweep().expect("sweep").deleted, 2400);
    claim(&store, "survivor");
    let swept = size(&h);

    let mut store = store;
    // The harness still holds a handle.
    assert!(matches!(store.compact(), Err(Error::InUse { .. })));
    h.close();
    assert!(store.compact().expect("compact"), "pages were moved");
    let compacted = size(&h);
    assert!(
        compacted * 2 < swept,
        "compaction gave space back: {swept} → {compacted} bytes"
    );

    // Everything still works, background sweeper included.
    assert_eq!(
        replayed(store.execute(req("t", "op", "survivor", b"p"), |_| {
            Ok(Response::new(500, "no"))
        }))
        .status(),
        201
    );
    claim(&store, "after");
    let alive = store.sweeper_liveness().expect("the sweeper was restarted");
    assert!(alive.upgrade().is_some());
    store.check_expiry_index().expect("index matches");
}

#[test]
fn compaction_is_refused_while_anything_else_uses_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(dir.path().join("idem.redb")).expect("open");
    claim(&store, "k");

    let clone = store.clone();
    match store.compact() {
        Err(Error::InUse { reason, .. }) => assert!(reason.contains("1 other"), "{reason}"),
        other => panic!("expected InUse, got {other:?}"),
    }
    drop(clone);

    let lease = acquired(store.begin(req("t", "op", "leased", b"p")));
    assert!(matches!(store.compact(), Err(Error::InUse { .. })));
    lease.complete(Response::new(200, "ok")).expect("complete");

    let read = store.read_transaction().expect("read");
    match store.compact() {
        Err(Error::InUse { reason, .. }) => {
            assert!(reason.contains("read transaction"), "{reason}")
        }
        other => panic!("expected InUse, got {other:?}"),
    }
    drop(read);

    store.compact().expect("alone at last");
    replayed(store.execute(req("t", "op", "k", b"p"), |_| Ok(Response::new(500, "no"))));
}
