//! Outbox event ids. Consumers deduplicate on them, so:
//! - two different origins never share an id, even when an inbox message id is built to spell
//!   a record key's bytes (until then both were hashed as bare bytes under one context);
//! - a *new* intent that re-uses a key after the old one was purged or forgotten, or a message
//!   processed again after its mark was purged or forgotten, gets new ids (until then it got the
//!   old intent's ids, and a consumer that still remembered them dropped the new events);
//! - one intent keeps its ids: a takeover pushes what the first attempt would have pushed, a
//!   group-commit re-run pushes what the first run pushed, a redelivery pushes nothing.

use crate::common;

use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use common::*;
use idem::inbox::ProcessAnswer;
use idem::outbox::{Event, EventId};
use idem::{Abort, Response, Scope, Store, Tx};

/// Pushes two events and returns their ids.
fn push_two(tx: &Tx<'_>) -> Result<Vec<EventId>, Abort> {
    Ok(vec![
        tx.outbox().push(Event::new("t", b"first".to_vec()))?,
        tx.outbox().push(Event::new("t", b"second".to_vec()))?,
    ])
}

/// Executes intent `t/op/<key>`, pushing two events; returns their ids.
fn execute_pushing(store: &Store, key: &str) -> Vec<EventId> {
    let mut ids = Vec::new();
    executed(store.execute(req("t", "op", key, b"p"), |tx| {
        ids = push_two(tx)?;
        Ok(Response::new(201, "ok"))
    }));
    ids
}

/// Processes message `id` for subscriber `sub`, pushing two events; returns their ids.
fn process_pushing(store: &Store, sub: &str, id: &[u8]) -> Vec<EventId> {
    match store.process(sub, id, push_two).expect("process") {
        ProcessAnswer::Ran(ids) => ids,
        other => panic!("expected ProcessAnswer, got {other:?}"),
    }
}

fn pending_ids(store: &Store) -> Vec<EventId> {
    store
        .pending_events(100)
        .expect("pending")
        .into_iter()
        .map(|e| e.id)
        .collect()
}

#[track_caller]
fn disjoint(a: &[EventId], b: &[EventId]) {
    for id in a {
        assert!(!b.contains(id), "{id} appears in both {a:?} and {b:?}");
    }
}

#[test]
fn an_inbox_message_whose_id_spells_a_record_key_gets_other_event_ids() {
    let h = Harness::new();
    let store = h.store();
    // The record key of tenant "t", operation "op", key "k" is
    //   01 | 00 01 74 | 00 02 6f 70 | 00 01 6b
    // and the inbox mark key of subscriber "t" and message id M is
    //   01 | 00 01 74 | M
    // so the message id 00 02 6f 70 00 01 6b makes both keys the same bytes.
    let message_id = b"\x00\x02op\x00\x01k";
    let mark_key = [&[0x01u8, 0x00, 0x01][..], b"t", message_id].concat();
    assert_eq!(
        record_key("t", "op", b"k"),
        mark_key,
        "the test builds colliding keys"
    );
    // Same instant, same push positions: only the kind of origin differs.
    let from_record = execute_pushing(store, "k");
    let from_message = process_pushing(store, "t", message_id);
    disjoint(&from_record, &from_message);
    assert_eq!(
        pending_ids(store),
        [from_record, from_message].concat(),
        "four events, four ids"
    );
}

#[test]
fn a_new_intent_after_a_purge_gets_new_event_ids() {
    let h = Harness::new();
    let store = h.store();
    let first = execute_pushing(store, "k");
    assert!(store.purge(&Scope::new("t", "op"), "k").expect("purge"));
    h.clock.advance(Duration::from_millis(1));
    let second = execute_pushing(store, "k");
    disjoint(&first, &second);
    assert_eq!(pending_ids(store), [first, second].concat());
}

#[test]
fn a_new_intent_after_the_tombstone_horizon_gets_new_event_ids() {
    let hour = Duration::from_secs(3600);
    let h = Harness::with(|b| b.retention(hour).tombstone_horizon(2 * hour));
    let store = h.store();
    let first = execute_pushing(store, "k");
    // Within the horizon the intent is remembered: nothing runs, nothing is pushed.
    h.clock.advance(hour);
    let late = store.execute(req("t", "op", "k", b"p"), |_| {
        unreachable!("an expired intent does not run")
    });
    assert!(
        matches!(late, Ok(idem::ExecuteAnswer::Expired(_))),
        "{late:?}"
    );
    // Past the horizon the key is free: a new intent, with new ids (swept or not).
    h.clock.advance(hour);
    let second = execute_pushing(store, "k");
    disjoint(&first, &second);
    store.sweep().expect("sweep");
    h.clock.advance(3 * hour);
    let third = execute_pushing(store, "k");
    disjoint(&first, &third);
    disjoint(&second, &third);
}

#[test]
fn a_message_processed_again_after_its_mark_was_forgotten_or_purged_gets_new_event_ids() {
    let hour = Duration::from_secs(3600);
    let h = Harness::with(|b| b.inbox_retention(hour));
    let store = h.store();
    let first = process_pushing(store, "billing", b"m-1");
    h.clock.advance(hour);
    let second = process_pushing(store, "billing", b"m-1");
    disjoint(&first, &second);
    assert!(store.purge_inbox_mark("billing", "m-1").expect("purge"));
    h.clock.advance(Duration::from_millis(1));
    let third = process_pushing(store, "billing", b"m-1");
    disjoint(&first, &third);
    disjoint(&second, &third);
    // The same for a webhook receipt.
    let hook = |store: &Store| match store.receive("github", "d-1", push_two).expect("receive") {
        idem::inbox::ReceiveAnswer::Ran(ids) => ids,
        other => panic!("expected Ran, got {other:?}"),
    };
    let before = hook(store);
    assert!(store.purge_webhook_receipt("github", "d-1").expect("purge"));
    h.clock.advance(Duration::from_millis(1));
    disjoint(&before, &hook(store));
}

/// Flow B: the first attempt dies after its external call, a second attempt takes the key over
/// and finishes. Its events carry the ids the first attempt would have pushed (the intent's
/// creation time is kept by the takeover), shown against a twin store where the first attempt
/// finished itself.
#[test]
fn a_takeover_pushes_the_ids_the_first_attempt_would_have_pushed() {
    let lease = Duration::from_secs(30);
    let finish = |lease: idem::Lease| {
        let mut ids = Vec::new();
        lease
            .complete_with(|tx| {
                ids = push_two(tx)?;
                Ok(Response::new(200, "paid"))
            })
            .expect("complete");
        ids
    };

    let twin = Harness::new();
    let first = acquired(twin.store().begin(req("t", "pay", "k", b"p")));
    twin.clock.advance(Duration::from_secs(1));
    let by_first = finish(first);

    let h = Harness::new();
    let store = h.store();
    let dead = acquired(store.begin(req("t", "pay", "k", b"p")));
    std::mem::forget(dead); // the process died after the external call
    h.clock.advance(lease);
    let second = acquired(store.begin(req("t", "pay", "k", b"p")));
    assert_eq!(second.takeover_of(), Some(1));
    let by_second = finish(second);

    assert_eq!(by_second, by_first);
    assert_eq!(pending_ids(store), by_first);
}

/// A group-commit re-run (another member of the batch failed) runs the closure again in a fresh
/// transaction: it pushes the same ids as the rolled-back run, and those are the ids committed.
/// A redelivery of a processed message is a duplicate and pushes nothing.
#[test]
fn a_group_commit_rerun_pushes_the_same_ids_and_a_redelivery_pushes_none() {
    let h = Harness::new();
    let store = h.store();
    let runs: Mutex<Vec<Vec<EventId>>> = Mutex::new(Vec::new());
    thread::scope(|s| {
        // A gate holds the writer until both members are queued, so they share one batch.
        let (release_tx, gate) = gate(s, store);
        let runs = &runs;
        let member = s.spawn(move || {
            executed(store.execute(req("t", "op", "k", b"p"), |tx| {
                let ids = push_two(tx)?;
                runs.lock().expect("runs").push(ids);
                Ok(Response::new(201, "ok"))
            }))
        });
        wait_for_queue(store, 1);
        let failing = s.spawn(move || {
            store.execute(req("t", "op", "fails", b"p"), |tx| {
                tx.outbox().push(Event::new("t", b"never".to_vec()))?;
                Err(Abort::retryable("transient"))
            })
        });
        wait_for_queue(store, 2);
        release_tx.send(()).expect("gate alive");
        gate.join().expect("gate");
        member.join().expect("member");
        assert!(failing.join().expect("failing").is_err());
    });
    let runs = runs.into_inner().expect("runs");
    assert_eq!(runs.len(), 2, "the member ran, was rolled back and re-ran");
    assert_eq!(runs[0], runs[1], "the re-run pushes the same ids");
    assert_eq!(
        pending_ids(store),
        runs[1],
        "and those are the ids committed"
    );

    let processed = process_pushing(store, "billing", b"m-1");
    let again = store
        .process("billing", b"m-1", |_| -> Result<(), Abort> {
            unreachable!("a duplicate does not run")
        })
        .expect("process");
    assert!(
        matches!(again, ProcessAnswer::Duplicate { .. }),
        "{again:?}"
    );
    assert_eq!(pending_ids(store), [runs[1].clone(), processed].concat());
}
