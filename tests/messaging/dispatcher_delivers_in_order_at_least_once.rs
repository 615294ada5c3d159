//! The outbox dispatcher: woken by commits, per-key commit order even when the first event is
//! retried, republish with the same id after a crash between publish and mark (a downstream
//! inbox keeps one effect), dead letters after N attempts without stalling other keys,
//! requeue, clean shutdown.
//!
//! The store runs on a manual clock: retries become due only when the test moves the clock
//! and wakes the dispatcher. The test waits for the dispatcher thread's real progress with
//! bounded timeouts.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Harness, bump, effects, req};
use idem::error::BoxError;
use idem::inbox::ProcessAnswer;
use idem::outbox::{DispatcherOptions, Event, EventId, StoredEvent};
use idem::{Error, Response, Store};

const WAIT: Duration = Duration::from_secs(10);

/// One publish call as the publisher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    id: EventId,
    payload: String,
    ok: bool,
}

fn push(store: &Store, key: &str, ordering_key: &str, payload: &str) {
    common::executed(
        store.execute(req("t", "op", key, payload.as_bytes()), |tx| {
            tx.outbox().push(
                Event::new("topic", payload.as_bytes().to_vec()).ordering_key(ordering_key),
            )?;
            Ok(Response::new(200, ""))
        }),
    );
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn next(calls: &mpsc::Receiver<Call>) -> Call {
    calls.recv_timeout(WAIT).expect("a publish call")
}

fn payload(e: &StoredEvent) -> String {
    String::from_utf8_lossy(&e.payload).into_owned()
}

#[test]
fn a_commit_wakes_an_idle_dispatcher_at_once() {
    let h = Harness::new();
    let (tx, calls) = mpsc::channel();
    // An hour between idle re-checks: only the commit's wake-up can explain a prompt publish.
    let handle = h
        .store()
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let _ = tx.send(Call {
                    id: e.id,
                    payload: payload(e),
                    ok: true,
                });
                Ok(())
            },
            DispatcherOptions::new().idle_recheck(Duration::from_secs(3600)),
        )
        .unwrap();
    push(h.store(), "k", "a", "hello");
    assert_eq!(next(&calls).payload, "hello");
    // The counter moves right after the mark's commit.
    wait_until("the delivery mark", || {
        h.store().outbox_stats().unwrap().pending == 0 && h.store().outbox_metrics().delivered == 1
    });
    handle.shutdown().unwrap();
}

#[test]
fn per_key_order_holds_while_the_first_event_is_retried() {
    let h = Harness::new();
    let store = h.store();
    push(store, "1", "a", "a1");
    push(store, "2", "a", "a2");
    push(store, "3", "b", "b1");
    let (tx, calls) = mpsc::channel();
    let mut failures_left = 2;
    let handle = store
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let p = payload(e);
                let ok = !(p == "a1" && failures_left > 0);
                if !ok {
                    failures_left -= 1;
                }
                let _ = tx.send(Call {
                    id: e.id,
                    payload: p,
                    ok,
                });
                if ok {
                    Ok(())
                } else {
                    Err("broker unavailable".into())
                }
            },
            DispatcherOptions::new().backoff(Duration::from_secs(1), Duration::from_secs(4)),
        )
        .unwrap();
    let mut seen = Vec::new();
    while seen.iter().filter(|c: &&Call| c.ok).count() < 3 {
        let c = next(&calls);
        if !c.ok {
            // Let the retry fall due, then wake the dispatcher.
            wait_until("the failure to be recorded", || {
                store.pending_events(1).unwrap()[0].failed_attempts > 0
                    && store.outbox_metrics().publish_failures as usize
                        == seen.iter().filter(|c: &&Call| !c.ok).count() + 1
            });
            h.clock.advance(Duration::from_secs(10));
            handle.wake();
        }
        seen.push(c);
    }
    let a: Vec<_> = seen
        .iter()
        .filter(|c| c.payload.starts_with('a'))
        .map(|c| (c.payload.as_str(), c.ok))
        .collect();
    assert_eq!(
        a,
        [("a1", false), ("a1", false), ("a1", true), ("a2", true)],
        "a2 is never published before a1 was delivered"
    );
    assert!(seen.iter().any(|c| c.payload == "b1" && c.ok));
    let a1_ids: Vec<_> = seen
        .iter()
        .filter(|c| c.payload == "a1")
        .map(|c| c.id)
        .collect();
    assert!(
        a1_ids.windows(2).all(|w| w[0] == w[1]),
        "a retry has the same id"
    );
    wait_until("all marks", || store.outbox_stats().unwrap().pending == 0);
    handle.shutdown().unwrap();
}

#[test]
fn a_crash_between_publish_and_mark_republishes_and_the_consumer_inbox_keeps_one_effect() {
    let producer = Harness::new();
    let consumer = Harness::new();
    push(producer.store(), "k", "a", "pay");
    let (tx, calls) = mpsc::channel();
    let downstream = consumer.store().clone();
    let crash_once = Arc::new(AtomicBool::new(true));
    let crash = crash_once.clone();
    let handle = producer
        .store()
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                // The broker delivers to the consumer, which processes it through its inbox.
                let r = downstream.process("payments", e.id.to_hex(), |t| bump(t, "paid"))?;
                let _ = tx.send(Call {
                    id: e.id,
                    payload: format!("{r:?}"),
                    ok: true,
                });
                if crash.swap(false, Ordering::SeqCst) {
                    panic!("injected crash after publish, before the delivery mark");
                }
                Ok(())
            },
            DispatcherOptions::new().backoff(Duration::from_secs(1), Duration::from_secs(1)),
        )
        .unwrap();
    let first = next(&calls);
    assert!(first.payload.starts_with("Ran("), "{}", first.payload);
    wait_until("the failed attempt", || {
        producer.store().outbox_metrics().publish_failures == 1
    });
    producer.clock.advance(Duration::from_secs(5));
    handle.wake();
    let second = next(&calls);
    assert_eq!(second.id, first.id, "republished with the same id");
    assert!(second.payload.starts_with("Duplicate"));
    wait_until("the mark", || {
        producer.store().outbox_stats().unwrap().pending == 0
    });
    handle.shutdown().unwrap();
    assert_eq!(effects(consumer.store(), "paid"), 1);
}

#[test]
fn undelivered_events_are_published_by_the_next_process() {
    let mut h = Harness::new();
    push(h.store(), "k", "a", "x");
    // The process stops before any dispatcher ran; a restarted process delivers.
    h.reopen();
    let (tx, calls) = mpsc::channel();
    let handle = h
        .store()
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let _ = tx.send(Call {
                    id: e.id,
                    payload: payload(e),
                    ok: true,
                });
                Ok(())
            },
            DispatcherOptions::new(),
        )
        .unwrap();
    assert_eq!(next(&calls).payload, "x");
    wait_until("the mark", || {
        h.store().outbox_stats().unwrap().pending == 0
    });
    handle.shutdown().unwrap();
}

#[test]
fn an_always_failing_event_is_dead_lettered_and_other_keys_go_on() {
    let h = Harness::new();
    let store = h.store();
    push(store, "1", "poison", "p1");
    push(store, "2", "poison", "p2");
    push(store, "3", "fine", "f1");
    let (tx, calls) = mpsc::channel();
    let broken = Arc::new(AtomicBool::new(true));
    let is_broken = broken.clone();
    let handle = store
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let p = payload(e);
                let ok = !(p.starts_with('p') && is_broken.load(Ordering::SeqCst));
                let _ = tx.send(Call {
                    id: e.id,
                    payload: p,
                    ok,
                });
                if ok {
                    Ok(())
                } else {
                    Err("schema rejected".into())
                }
            },
            DispatcherOptions::new()
                .max_attempts(3)
                .backoff(Duration::from_secs(1), Duration::from_secs(1)),
        )
        .unwrap();
    let mut failures = 0;
    let mut delivered = Vec::new();
    while failures < 3 || delivered.is_empty() {
        let c = next(&calls);
        if c.ok {
            delivered.push(c.payload);
        } else {
            assert_eq!(c.payload, "p1", "p2 waits behind p1");
            failures += 1;
            wait_until("the failure", || {
                store.outbox_metrics().publish_failures == failures
            });
            h.clock.advance(Duration::from_secs(5));
            handle.wake();
        }
    }
    assert_eq!(delivered, ["f1"]);
    wait_until("the dead letter", || {
        store.outbox_metrics().dead_lettered == 1
    });
    let dead = store.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(payload(&dead[0].event), "p1");
    assert_eq!(dead[0].event.failed_attempts, 3);
    assert!(dead[0].error.contains("schema rejected"));
    let stats = store.outbox_stats().unwrap();
    assert_eq!((stats.pending, stats.dead), (1, 1), "p2 is held back");
    // Other keys still flow while the poison key is held back.
    push(store, "4", "fine", "f2");
    assert_eq!(next(&calls).payload, "f2");
    // Fix the consumer, requeue: p1 then p2, in order.
    broken.store(false, Ordering::SeqCst);
    assert!(store.requeue_dead_letter(dead[0].event.seq).unwrap());
    assert!(!store.requeue_dead_letter(dead[0].event.seq).unwrap());
    assert_eq!(next(&calls).payload, "p1");
    assert_eq!(next(&calls).payload, "p2");
    wait_until("everything delivered", || {
        let s = store.outbox_stats().unwrap();
        s.pending == 0 && s.dead == 0
    });
    handle.shutdown().unwrap();
}

#[test]
fn one_dispatcher_at_a_time_and_shutdown_is_clean() {
    let h = Harness::new();
    let publisher = |_: &StoredEvent| -> Result<(), BoxError> { Ok(()) };
    let first = h
        .store()
        .start_dispatcher(publisher, DispatcherOptions::new())
        .unwrap();
    let second = h
        .store()
        .start_dispatcher(publisher, DispatcherOptions::new());
    assert!(matches!(second, Err(Error::InUse { .. })));
    first.shutdown().unwrap();
    let again = h
        .store()
        .start_dispatcher(publisher, DispatcherOptions::new())
        .unwrap();
    drop(again); // dropping the handle stops and joins too
    let bad = h
        .store()
        .start_dispatcher(publisher, DispatcherOptions::new().max_attempts(0));
    assert!(matches!(bad, Err(Error::Config { .. })));
    // A consumer-side inbox answer for completeness of the contract.
    let r = h.store().process("s", "m", |_| Ok(())).unwrap();
    assert_eq!(r, ProcessAnswer::Ran(()));
}

#[test]
fn concurrent_producers_on_one_key_are_published_in_commit_order() {
    let h = Harness::new();
    let store = h.store();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for i in 0..25 {
                    push(store, &format!("{t}-{i}"), "shared", &format!("{t}:{i}"));
                }
            });
        }
    });
    let committed: Vec<u64> = store
        .pending_events(1000)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(committed.len(), 100);
    let (tx, calls) = mpsc::channel();
    let mut flaky = 0u32;
    let handle = store
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                flaky += 1;
                // Every 7th attempt fails once: retries must not reorder the key.
                if flaky.is_multiple_of(7) {
                    return Err("transient".into());
                }
                let _ = tx.send((e.seq, payload(e)));
                Ok(())
            },
            DispatcherOptions::new()
                .batch(16)
                .backoff(Duration::from_millis(1), Duration::from_millis(1)),
        )
        .unwrap();
    let mut published = Vec::new();
    while published.len() < 100 {
        match calls.recv_timeout(Duration::from_millis(20)) {
            Ok(c) => published.push(c),
            Err(_) => {
                // A retry is waiting for the manual clock.
                h.clock.advance(Duration::from_secs(1));
                handle.wake();
            }
        }
    }
    let seqs: Vec<u64> = published.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, committed, "publish order is commit order");
    // Each producer's events appear in the order it committed them.
    for t in 0..4 {
        let mine: Vec<u32> = published
            .iter()
            .filter_map(|(_, p)| p.strip_prefix(&format!("{t}:")).map(|i| i.parse().unwrap()))
            .collect();
        assert_eq!(mine, (0..25).collect::<Vec<_>>());
    }
    wait_until("all marks", || store.outbox_stats().unwrap().pending == 0);
    handle.shutdown().unwrap();
}

#[test]
fn retries_are_woken_by_the_timer() {
    // The system clock: the retry falls due by itself; the idle re-check is an hour, so only the
    // retry timer can explain the second attempt.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("idem.redb")).unwrap();
    push(&store, "k", "a", "once");
    let (tx, calls) = mpsc::channel();
    let mut first = true;
    let handle = store
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let ok = !std::mem::replace(&mut first, false);
                let _ = tx.send(Call {
                    id: e.id,
                    payload: payload(e),
                    ok,
                });
                if ok {
                    Ok(())
                } else {
                    Err("first attempt fails".into())
                }
            },
            DispatcherOptions::new()
                .backoff(Duration::from_millis(5), Duration::from_millis(10))
                .idle_recheck(Duration::from_secs(3600)),
        )
        .unwrap();
    assert!(!next(&calls).ok);
    assert!(next(&calls).ok);
    wait_until("the mark", || store.outbox_stats().unwrap().pending == 0);
    handle.shutdown().unwrap();
}

#[test]
fn a_running_dispatcher_does_not_keep_the_store_open() {
    let mut h = Harness::new();
    let handle = h
        .store()
        .start_dispatcher(
            |_: &StoredEvent| -> Result<(), BoxError> { Ok(()) },
            DispatcherOptions::new().idle_recheck(Duration::from_millis(5)),
        )
        .unwrap();
    h.close();
    // The thread holds no strong handle between rounds: the file closes and can be reopened
    // (by this process) while the dispatcher handle is still alive.
    wait_until("the file to be released", || Store::open(&h.path).is_ok());
    handle.shutdown().unwrap();
}

#[test]
fn a_held_backlog_larger_than_a_batch_does_not_starve_other_keys() {
    let h = Harness::new();
    let store = h.store();
    for i in 0..20 {
        push(store, &format!("p{i}"), "poison", &format!("p{i}"));
    }
    push(store, "f", "fine", "f1");
    let (tx, calls) = mpsc::channel();
    let handle = store
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let p = payload(e);
                let ok = !p.starts_with('p');
                let _ = tx.send(Call {
                    id: e.id,
                    payload: p,
                    ok,
                });
                if ok { Ok(()) } else { Err("rejected".into()) }
            },
            // Rows held behind the first poison event fill far more than one batch.
            DispatcherOptions::new().batch(4).max_attempts(1),
        )
        .unwrap();
    let mut seen = Vec::new();
    while !seen.contains(&"f1".to_owned()) {
        seen.push(next(&calls).payload);
    }
    assert_eq!(seen, ["p0", "f1"], "p1.. wait behind the dead-lettered p0");
    wait_until("f1's mark", || store.outbox_stats().unwrap().pending == 19);
    assert_eq!(store.outbox_stats().unwrap().dead, 1);
    handle.shutdown().unwrap();
}

#[test]
fn power_loss_after_publish_before_the_mark_republishes_with_the_same_id() {
    let consumer = Harness::new();
    let backend = common::CrashBackend::default();
    let clock = idem::clock::ManualClock::new(common::T0);
    let open = |b: common::CrashBackend| {
        Store::builder()
            .clock(clock.clone())
            .open_with_backend(b)
            .unwrap()
    };
    let producer = open(backend.clone());
    push(&producer, "k", "a", "pay");
    let (tx, calls) = mpsc::channel();
    let downstream = consumer.store().clone();
    let power = backend.failing.clone();
    let handle = producer
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let r = downstream.process("payments", e.id.to_hex(), |t| bump(t, "paid"))?;
                let _ = tx.send(Call {
                    id: e.id,
                    payload: format!("{r:?}"),
                    ok: true,
                });
                // The broker has the event; the machine loses power before the mark is on disk.
                power.store(true, Ordering::SeqCst);
                Ok(())
            },
            DispatcherOptions::new(),
        )
        .unwrap();
    let first = next(&calls);
    assert!(first.payload.starts_with("Ran("), "{}", first.payload);
    wait_until("the failed mark", || producer.fail_stop_cause().is_some());
    handle.shutdown().unwrap();
    drop(producer);

    // Restart on what reached the disk: the event is still undelivered.
    let producer = open(backend.crash());
    assert_eq!(producer.outbox_stats().unwrap().pending, 1);
    let (tx, calls) = mpsc::channel();
    let downstream = consumer.store().clone();
    let handle = producer
        .start_dispatcher(
            move |e: &StoredEvent| -> Result<(), BoxError> {
                let r = downstream.process("payments", e.id.to_hex(), |t| bump(t, "paid"))?;
                let _ = tx.send(Call {
                    id: e.id,
                    payload: format!("{r:?}"),
                    ok: true,
                });
                Ok(())
            },
            DispatcherOptions::new(),
        )
        .unwrap();
    let second = next(&calls);
    assert_eq!(second.id, first.id, "republished with the same id");
    assert!(second.payload.starts_with("Duplicate"));
    wait_until("the mark", || producer.outbox_stats().unwrap().pending == 0);
    handle.shutdown().unwrap();
    assert_eq!(effects(consumer.store(), "paid"), 1);
}
