//! The outbox dispatcher's order: per ordering key, events are published in commit order, a
//! retry of the first one included; a dead letter holds its key back until it is requeued,
//! while other keys go on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use idem::Response;
use idem::error::BoxError;
use idem::outbox::{DispatcherOptions, Event, EventId, StoredEvent};

use super::*;

/// One publish call as the publisher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    seq: u64,
    id: EventId,
    payload: String,
    ok: bool,
}

/// One intent per event: `key` pushes `payload` under `ordering_key`.
fn push<E: Engine>(e: &E, key: &str, payload: &str, ordering_key: &str) {
    let b = Behavior::answer(Response::new(200, "ok"))
        .push(Event::new("topic", payload.as_bytes().to_vec()).ordering_key(ordering_key));
    executed(e.execute(req("t", "push", key, payload.as_bytes()), &b));
}

fn payload(e: &StoredEvent) -> String {
    String::from_utf8_lossy(&e.payload).into_owned()
}

/// A publisher that reports every call on a channel and fails those `fail` says to.
fn recording(
    mut fail: impl FnMut(&str) -> bool + Send + 'static,
) -> (
    impl FnMut(&StoredEvent) -> Result<(), BoxError> + Send + 'static,
    mpsc::Receiver<Call>,
) {
    let (sent, calls) = mpsc::channel();
    let publisher = move |e: &StoredEvent| -> Result<(), BoxError> {
        let p = payload(e);
        let ok = !fail(&p);
        let _ = sent.send(Call {
            seq: e.seq,
            id: e.id,
            payload: p,
            ok,
        });
        if ok {
            Ok(())
        } else {
            Err("broker unavailable".into())
        }
    };
    (publisher, calls)
}

fn next(calls: &mpsc::Receiver<Call>) -> Call {
    calls.recv_timeout(WAIT).expect("a publish call")
}

/// Three intents push events for key `k` (and one for `other` in between); the publisher
/// fails the first attempt of the first event. The published order of `k` is its commit order
/// — `k1` (failed), `k1`, `k2`, `k3` — with the same id on the retry; `other` is delivered;
/// nothing is left.
pub fn outbox_publishes_each_key_in_commit_order_through_a_retry<E: Engine>(e: &mut E) {
    let e = &*e;
    for (key, p, ordering_key) in [
        ("1", "k1", "k"),
        ("2", "k2", "k"),
        ("3", "o1", "other"),
        ("4", "k3", "k"),
    ] {
        push(e, key, p, ordering_key);
    }
    let committed: Vec<(u64, String)> = e
        .pending_events(10)
        .expect("pending")
        .iter()
        .map(|ev| (ev.seq, payload(ev)))
        .collect();
    let order: Vec<&str> = committed.iter().map(|(_, p)| p.as_str()).collect();
    assert_eq!(
        order,
        ["k1", "k2", "o1", "k3"],
        "pending events are in commit order"
    );
    assert!(
        committed.windows(2).all(|w| w[0].0 < w[1].0),
        "seq follows commit order"
    );

    let mut first_k1 = true;
    let (publisher, calls) =
        recording(move |p| p == "k1" && std::mem::replace(&mut first_k1, false));
    let dispatcher = e
        .start_dispatcher(
            publisher,
            DispatcherOptions::new().backoff(Duration::from_secs(1), Duration::from_secs(4)),
        )
        .expect("start the dispatcher");
    let mut seen: Vec<Call> = Vec::new();
    while seen.iter().filter(|c| c.ok).count() < 4 {
        let c = next(&calls);
        if !c.ok {
            wait_until("the failure to be recorded", || {
                e.outbox_metrics().publish_failures == 1
            });
            e.advance(Duration::from_secs(10));
            dispatcher.wake();
        }
        seen.push(c);
    }
    let k: Vec<(&str, bool)> = seen
        .iter()
        .filter(|c| c.payload.starts_with('k'))
        .map(|c| (c.payload.as_str(), c.ok))
        .collect();
    assert_eq!(
        k,
        [("k1", false), ("k1", true), ("k2", true), ("k3", true)],
        "commit order per key"
    );
    let published: Vec<u64> = seen
        .iter()
        .filter(|c| c.ok && c.payload.starts_with('k'))
        .map(|c| c.seq)
        .collect();
    let committed_k: Vec<u64> = committed
        .iter()
        .filter(|(_, p)| p.starts_with('k'))
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(published, committed_k, "delivered in seq order");
    let k1: Vec<EventId> = seen
        .iter()
        .filter(|c| c.payload == "k1")
        .map(|c| c.id)
        .collect();
    assert_eq!(k1[0], k1[1], "the retry has the same id");
    assert!(
        seen.iter().any(|c| c.payload == "o1" && c.ok),
        "the other key is delivered"
    );
    wait_until("every delivery", || {
        e.outbox_stats().map(|s| s.pending == 0).unwrap_or(false)
    });
    dispatcher.shutdown().expect("shutdown");
    assert!(
        calls.try_recv().is_err(),
        "nothing published twice after delivery"
    );
    assert_eq!(e.outbox_metrics().delivered, 4);
}

/// After `max_attempts` (1 here) the first event of `poison` becomes a dead letter: the key's
/// next event is never published while it is dead, events of `fine` (old and new) go on, and
/// requeueing the dead letter publishes it, then the held event, in order.
pub fn dead_letter_holds_its_key_until_requeued_and_other_keys_go_on<E: Engine>(e: &mut E) {
    let e = &*e;
    push(e, "1", "p1", "poison");
    push(e, "2", "p2", "poison");
    push(e, "3", "f1", "fine");
    let broken = Arc::new(AtomicBool::new(true));
    let is_broken = broken.clone();
    let (publisher, calls) =
        recording(move |p| p.starts_with('p') && is_broken.load(Ordering::SeqCst));
    let dispatcher = e
        .start_dispatcher(publisher, DispatcherOptions::new().max_attempts(1))
        .expect("start the dispatcher");
    let mut seen = Vec::new();
    while !seen.iter().any(|c: &Call| c.payload == "f1") || !seen.iter().any(|c| c.payload == "p1")
    {
        seen.push(next(&calls));
    }
    wait_until("the dead letter", || {
        e.outbox_stats().map(|s| s.dead == 1).unwrap_or(false)
    });
    wait_until("the dead-letter counter", || {
        e.outbox_metrics().dead_lettered == 1
    });
    let dead = e.dead_letters(10).expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(payload(&dead[0].event), "p1");
    assert_eq!(dead[0].event.failed_attempts, 1);
    assert!(
        dead[0].error.contains("broker unavailable"),
        "{:?}",
        dead[0].error
    );
    wait_until("f1's delivery", || {
        e.outbox_stats()
            .map(|s| (s.pending, s.dead) == (1, 1))
            .unwrap_or(false)
    });

    // Other keys go on while `poison` is held.
    push(e, "4", "f2", "fine");
    while !seen.iter().any(|c: &Call| c.payload == "f2") {
        seen.push(next(&calls));
    }
    assert!(
        !seen.iter().any(|c| c.payload == "p2"),
        "p2 waits behind its dead letter: {seen:?}"
    );
    wait_until("f2's delivery, p2 left pending", || {
        e.pending_events(10)
            .map(|p| p.iter().map(payload).collect::<Vec<_>>() == ["p2"])
            .unwrap_or(false)
    });

    broken.store(false, Ordering::SeqCst);
    assert!(e.requeue_dead_letter(dead[0].event.seq).expect("requeue"));
    assert!(
        !e.requeue_dead_letter(dead[0].event.seq)
            .expect("requeue twice")
    );
    let after: Vec<Call> = (0..2).map(|_| next(&calls)).collect();
    let names: Vec<(&str, bool)> = after.iter().map(|c| (c.payload.as_str(), c.ok)).collect();
    assert_eq!(
        names,
        [("p1", true), ("p2", true)],
        "in order after the requeue"
    );
    assert_eq!(
        (after[0].seq, after[0].id),
        (dead[0].event.seq, dead[0].event.id),
        "back in its place"
    );
    wait_until("everything delivered", || {
        e.outbox_stats()
            .map(|s| (s.pending, s.dead) == (0, 0))
            .unwrap_or(false)
    });
    dispatcher.shutdown().expect("shutdown");
}

/// Events committed by a process that stopped before any dispatcher ran are published by the
/// next process, with the ids their pushes returned, in commit order.
pub fn undelivered_events_are_published_by_the_next_process<E: Engine>(e: &mut E) {
    let mut pushed = Vec::new();
    for (key, p) in [("1", "x1"), ("2", "x2")] {
        let b = Behavior::answer(Response::new(200, "ok"))
            .push(Event::new("topic", p.as_bytes().to_vec()).ordering_key("x"));
        executed(e.execute(req("t", "push", key, p.as_bytes()), &b));
        pushed.extend(b.pushed());
    }
    e.restart();
    assert_eq!(e.outbox_stats().expect("stats").pending, 2);
    let (publisher, calls) = recording(|_| false);
    let dispatcher = e
        .start_dispatcher(publisher, DispatcherOptions::new())
        .expect("start the dispatcher");
    let got: Vec<EventId> = (0..2).map(|_| next(&calls).id).collect();
    assert_eq!(got, pushed);
    wait_until("the deliveries", || {
        e.outbox_stats().map(|s| s.pending == 0).unwrap_or(false)
    });
    dispatcher.shutdown().expect("shutdown");
}
