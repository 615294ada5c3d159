//! The outbox: an event pushed from a closure commits with the closure's writes or not at all,
//! from every kind of closure (flow A, flow B completion, inbox), and its id is stable.

use crate::common;

use common::{Harness, acquired, bump, effects, req};
use idem::outbox::Event;
use idem::{Abort, Response};

#[test]
fn business_write_and_event_are_both_committed() {
    let h = Harness::new();
    let store = h.store();
    let mut id = None;
    common::executed(store.execute(req("t", "create_order", "k1", b"p"), |tx| {
        bump(tx, "order")?;
        id = Some(
            tx.outbox().push(
                Event::new("orders", b"created".to_vec())
                    .ordering_key("order-1")
                    .header("type", "OrderCreated"),
            )?,
        );
        Ok(Response::new(201, "ok"))
    }));
    assert_eq!(effects(store, "order"), 1);
    let pending = store.pending_events(10).unwrap();
    assert_eq!(pending.len(), 1);
    let e = &pending[0];
    assert_eq!(Some(e.id), id);
    assert_eq!(e.topic, "orders");
    assert_eq!(e.ordering_key.as_deref(), Some("order-1"));
    assert_eq!(e.payload, b"created");
    assert_eq!(e.headers, vec![("type".into(), "OrderCreated".into())]);
    assert_eq!(e.created_at, common::T0);
    // A replay pushes nothing.
    common::replayed(store.execute(req("t", "create_order", "k1", b"p"), |_| {
        unreachable!("a replay does not run the closure")
    }));
    assert_eq!(store.outbox_stats().unwrap().pending, 1);
}

#[test]
fn a_failing_closure_leaves_neither_write_nor_event() {
    let h = Harness::new();
    let store = h.store();
    let err = store
        .execute(req("t", "create_order", "k2", b"p"), |tx| {
            bump(tx, "order")?;
            tx.outbox().push(Event::new("orders", b"x".to_vec()))?;
            Err(Abort::retryable("payment service down"))
        })
        .unwrap_err();
    assert!(matches!(err, idem::Error::Aborted { .. }));
    assert_eq!(effects(store, "order"), 0);
    assert_eq!(store.outbox_stats().unwrap().pending, 0);
    // The same failure in an inbox closure.
    let _ = store
        .process("sub", "m", |tx| -> Result<(), Abort> {
            tx.outbox().push(Event::new("orders", b"x".to_vec()))?;
            Err(Abort::retryable("later"))
        })
        .unwrap_err();
    assert_eq!(store.outbox_stats().unwrap().pending, 0);
}

#[test]
fn the_event_id_is_the_same_when_the_intent_runs_again() {
    // The first run aborts (nothing commits), the retry of the same intent commits at the
    // same instant: the committed event has the id the first run computed, because ids derive
    // from the intent (its record key and creation instant) and the push's position, not from a
    // counter. (Had the clock moved, the retry would be a claim at a later instant with other
    // ids; the first run's ids were never committed, so no consumer can have seen them.)
    let h = Harness::new();
    let store = h.store();
    let mut first = None;
    let _ = store.execute(req("t", "op", "same", b"p"), |tx| {
        first = Some(tx.outbox().push(Event::new("t", b"1".to_vec()))?);
        Err(Abort::retryable("transient"))
    });
    let mut second = None;
    common::executed(store.execute(req("t", "op", "same", b"p"), |tx| {
        second = Some(tx.outbox().push(Event::new("t", b"1".to_vec()))?);
        tx.outbox().push(Event::new("t", b"2".to_vec()))?;
        Ok(Response::new(200, ""))
    }));
    assert_eq!(first, second);
    let pending = store.pending_events(10).unwrap();
    assert_eq!(pending.len(), 2);
    assert_ne!(pending[0].id, pending[1].id, "two pushes, two ids");
    assert!(pending[0].seq < pending[1].seq);
}

#[test]
fn caller_identity_gives_the_id() {
    let h = Harness::new();
    let store = h.store();
    let mut ids = Vec::new();
    for key in ["a", "b"] {
        common::executed(store.execute(req("t", "op", key, b"p"), |tx| {
            ids.push(
                tx.outbox()
                    .push(Event::new("t", b"".to_vec()).identity("order-9/created"))?,
            );
            Ok(Response::new(200, ""))
        }));
    }
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1]);
}

#[test]
fn lease_completions_and_inbox_closures_push_too() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(req("t", "pay", "k", b"p")));
    lease
        .complete_with(|tx| {
            tx.outbox().push(Event::new("payments", b"paid".to_vec()))?;
            Ok(Response::new(200, ""))
        })
        .unwrap();
    store
        .process("sub", "m-1", |tx| {
            tx.outbox()
                .push(Event::new("shipments", b"ship".to_vec()))?;
            Ok(())
        })
        .unwrap();
    let topics: Vec<_> = store
        .pending_events(10)
        .unwrap()
        .into_iter()
        .map(|e| e.topic)
        .collect();
    assert_eq!(topics, ["payments", "shipments"]);
}

#[test]
fn events_survive_a_restart() {
    let mut h = Harness::new();
    common::executed(h.store().execute(req("t", "op", "k", b"p"), |tx| {
        tx.outbox().push(Event::new("t", b"x".to_vec()))?;
        Ok(Response::new(200, ""))
    }));
    h.reopen();
    assert_eq!(h.store().outbox_stats().unwrap().pending, 1);
    // Sequence numbers keep growing across restarts.
    let before = h.store().pending_events(1).unwrap()[0].seq;
    common::executed(h.store().execute(req("t", "op", "k2", b"p"), |tx| {
        tx.outbox().push(Event::new("t", b"y".to_vec()))?;
        Ok(Response::new(200, ""))
    }));
    assert!(h.store().pending_events(2).unwrap()[1].seq > before);
}
