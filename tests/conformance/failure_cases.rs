//! The article's eight failure cases, each as a case every engine must pass: a lost response,
//! racing duplicates, a reused key, a consumer crash before the ack, a replayed webhook, a
//! republished event, a workflow activity that crashed before reporting, and a late retry of
//! an expired record.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Barrier, Mutex, mpsc};
use std::time::Duration;

use idem::error::BoxError;
use idem::format::State;
use idem::inbox::{ProcessAnswer, ReceiveAnswer};
use idem::outbox::{DispatcherOptions, Event, EventId, StoredEvent};
use idem::{BeginAnswer, ExecuteAnswer, Response, Scope};

use super::*;
use crate::common::T0;

/// A body that is not UTF-8 and contains NUL, so "byte for byte" is really tested.
const BODY: &[u8] = b"{\"id\":\"ord_1\",\"raw\":\"\x00\xff\xfe\"}";

/// (1) The intent committed but the response was lost: every retry replays the first response
/// byte for byte (status, body, resource pointer) without running the closure; one effect. A
/// flow-B completion replays the same way to `begin` and to `execute`.
pub fn lost_response_retry_replays_byte_for_byte<E: Engine>(e: &mut E) {
    let first = Response::new(201, BODY).with_resource("order", "ord_1");
    let place = Behavior::answer(first.clone()).effect("order");
    let request = req("t1", "create_order", "key-1", b"order#1");
    assert_eq!(executed(e.execute(request.clone(), &place)), first);

    let retry = Behavior::answer(Response::new(500, "must not be stored")).effect("order");
    for _ in 0..3 {
        let again = replayed(e.execute(request.clone(), &retry));
        assert_eq!(again, first);
        assert_eq!(again.body(), BODY);
        assert_eq!(again.status(), 201);
        let resource = again.resource().expect("the resource pointer is kept");
        assert_eq!(
            (resource.kind.as_str(), resource.id.as_str()),
            ("order", "ord_1")
        );
        assert!(!again.is_failure());
    }
    assert_eq!((place.runs(), retry.runs()), (1, 0), "the closure ran once");
    assert_eq!(e.effects("order"), 1, "one effect");

    // Flow B: the completion is what every later claim replays.
    let charge = req("t1", "charge", "key-1", b"amount=100");
    let lease = acquired(e.begin(charge.clone()));
    assert_eq!(lease.complete(first.clone()).expect("complete"), first);
    assert_eq!(begin_replayed(e.begin(charge.clone())), first);
    assert_eq!(replayed(e.execute(charge, &retry)), first);
    assert_eq!(retry.runs(), 0);
}

/// (2) Eight threads send the same request at once: exactly one closure run commits, one
/// effect, one `Ran`, seven `Replayed`, and all eight answers are the winner's, byte for
/// byte (each thread's closure would answer its own body).
pub fn racing_identical_requests_cause_one_effect_and_one_answer<E: Engine>(e: &mut E) {
    const THREADS: usize = 8;
    let e = &*e;
    let barrier = Barrier::new(THREADS);
    let answers: Vec<(ExecuteAnswer, u32)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || {
                    let b = Behavior::answer(Response::new(201, format!("thread-{i}")))
                        .effect("payment");
                    barrier.wait();
                    let outcome = e
                        .execute(req("t1", "pay", "race-1", b"amount=100"), &b)
                        .expect("execute");
                    (outcome, b.runs())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let executed: Vec<&Response> = answers
        .iter()
        .filter_map(|(o, _)| match o {
            ExecuteAnswer::Ran(r) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(executed.len(), 1, "exactly one Ran: {answers:?}");
    let winner = executed[0].clone();
    for (outcome, _) in &answers {
        match outcome {
            ExecuteAnswer::Ran(r) | ExecuteAnswer::Replayed(r) => assert_eq!(r, &winner),
            other => panic!("every answer is the winner's: {other:?}"),
        }
    }
    assert!(answers.iter().any(|(_, runs)| *runs > 0));
    assert_eq!(e.effects("payment"), 1, "exactly one effect");
    assert_eq!(
        replayed(e.execute(
            req("t1", "pay", "race-1", b"amount=100"),
            &Behavior::panic()
        )),
        winner
    );
}

/// (2, flow B) Eight threads claim one key at once: one lease, seven `InFlight`.
pub fn racing_begins_grant_one_lease<E: Engine>(e: &mut E) {
    const THREADS: usize = 8;
    let e = &*e;
    let barrier = Barrier::new(THREADS);
    let (leases, in_flight) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    e.begin(req("t1", "charge", "race-b", b"amount=100"))
                        .expect("begin")
                })
            })
            .collect();
        let mut leases = Vec::new();
        let mut in_flight = 0;
        for h in handles {
            match h.join().expect("thread") {
                BeginAnswer::Acquired(l) => leases.push(l),
                BeginAnswer::InFlight { .. } => in_flight += 1,
                other => panic!("expected Acquired or InFlight, got {other:?}"),
            }
        }
        (leases, in_flight)
    });
    assert_eq!((leases.len(), in_flight), (1, THREADS - 1));
    for lease in leases {
        lease
            .complete(Response::new(200, "charged"))
            .expect("complete");
    }
    assert_eq!(
        begin_replayed(e.begin(req("t1", "charge", "race-b", b"amount=100"))).body(),
        b"charged"
    );
}

/// (3) The same key with a different payload is `PayloadMismatch` on both flows: the closure
/// does not run, the record is unchanged, the first intent still replays. A live lease binds
/// its key the same way.
pub fn same_key_different_payload_is_a_mismatch_and_changes_nothing<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create_order");
    let first = executed(e.execute(
        req("t1", "create_order", "k", b"qty=2"),
        &Behavior::answer(Response::new(201, "two")).effect("orders"),
    ));
    let before = e.get(&scope, "k").expect("get");
    let other = Behavior::answer(Response::new(201, "five")).effect("orders");
    mismatch(e.execute(req("t1", "create_order", "k", b"qty=5"), &other));
    mismatch(e.begin(req("t1", "create_order", "k", b"qty=5")));
    assert_eq!(other.runs(), 0);
    assert_eq!(e.get(&scope, "k").expect("get"), before, "nothing changed");
    assert_eq!(e.effects("orders"), 1);
    assert_eq!(
        replayed(e.execute(req("t1", "create_order", "k", b"qty=2"), &other)),
        first
    );

    let lease = acquired(e.begin(req("t1", "charge", "k", b"amount=1")));
    mismatch(e.execute(req("t1", "charge", "k", b"amount=2"), &other));
    mismatch(e.begin(req("t1", "charge", "k", b"amount=2")));
    assert_eq!(other.runs(), 0);
    lease
        .complete(Response::new(200, "charged 1"))
        .expect("the holder is unaffected");
}

/// (4) A consumer committed its work, then crashed before acking; the broker redelivers to a
/// restarted process: `Duplicate` (processed at the first handling's time), the closure does
/// not run, one effect.
pub fn consumer_crash_before_ack_redelivery_is_a_duplicate<E: Engine>(e: &mut E) {
    let handle = Behavior::answer(Response::new(200, "charged")).effect("charge");
    match e.process("billing", "msg-1", &handle).expect("process") {
        ProcessAnswer::Ran(r) => assert_eq!(r.body(), b"charged"),
        other => panic!("expected ProcessAnswer, got {other:?}"),
    }
    e.advance(Duration::from_secs(60));
    e.restart();
    let again = Behavior::answer(Response::new(200, "charged again")).effect("charge");
    match e.process("billing", "msg-1", &again).expect("redelivery") {
        ProcessAnswer::Duplicate {
            processed_at,
            rejection: None,
        } => assert_eq!(processed_at, T0),
        other => panic!("expected Duplicate, got {other:?}"),
    }
    assert_eq!(again.runs(), 0, "a duplicate does not run");
    assert_eq!(e.effects("charge"), 1);
    // Another subscriber is another inbox.
    assert!(matches!(
        e.process("shipping", "msg-1", &again)
            .expect("other subscriber"),
        ProcessAnswer::Ran(_)
    ));
    assert_eq!(e.effects("charge"), 2);
}

/// (5) A webhook replayed with the same delivery id is `Duplicate` and runs nothing; another
/// delivery id is a new delivery; a rejected delivery's replay carries the rejection.
pub fn webhook_replayed_with_the_same_delivery_id_is_a_duplicate<E: Engine>(e: &mut E) {
    let hook = Behavior::answer(Response::new(202, "queued")).effect("jobs");
    assert!(matches!(
        e.receive("github", "guid-1", &hook).expect("receive"),
        ReceiveAnswer::Ran(_)
    ));
    for _ in 0..2 {
        match e.receive("github", "guid-1", &hook).expect("replay") {
            ReceiveAnswer::Duplicate {
                received_at,
                rejection: None,
            } => assert_eq!(received_at, T0),
            other => panic!("expected Duplicate, got {other:?}"),
        }
    }
    assert_eq!((hook.runs(), e.effects("jobs")), (1, 1));
    // The same id from another source, and another id, are new deliveries.
    assert!(matches!(
        e.receive("stripe", "guid-1", &hook).expect("receive"),
        ReceiveAnswer::Ran(_)
    ));
    assert!(matches!(
        e.receive("github", "guid-2", &hook).expect("receive"),
        ReceiveAnswer::Ran(_)
    ));
    assert_eq!(e.effects("jobs"), 3);

    let reject = Behavior::terminal(Response::new(422, "unknown event type")).effect("rejected");
    let ReceiveAnswer::Rejected(rejection) =
        e.receive("github", "guid-3", &reject).expect("receive")
    else {
        panic!("expected Rejected")
    };
    assert!(rejection.is_failure());
    match e.receive("github", "guid-3", &hook).expect("replay") {
        ReceiveAnswer::Duplicate {
            rejection: Some(r), ..
        } => assert_eq!(r, rejection),
        other => panic!("expected a Duplicate carrying the rejection, got {other:?}"),
    }
    assert_eq!(
        e.effects("rejected"),
        1,
        "the rejection's writes committed once"
    );
}

/// (6) The broker got the event but the acknowledgement was lost (the publisher records it,
/// then returns `Err` once): the dispatcher publishes it again with the same `EventId` (the one
/// the push returned), and a consumer inbox keyed by the id applies it once.
pub fn dispatcher_republish_keeps_the_event_id_and_the_inbox_applies_once<E: Engine>(e: &mut E) {
    let pay = Behavior::answer(Response::new(201, "paid"))
        .effect("payment")
        .push(Event::new("payments", b"pay-1".to_vec()).ordering_key("pay-1"));
    executed(e.execute(req("t1", "pay", "pay-1", b"amount=100"), &pay));
    let pushed = pay.pushed();
    assert_eq!(pushed.len(), 1);

    let (sent, calls) = mpsc::channel::<EventId>();
    let mut lose_the_ack = true;
    let dispatcher = e
        .start_dispatcher(
            move |event: &StoredEvent| -> Result<(), BoxError> {
                let _ = sent.send(event.id);
                if std::mem::replace(&mut lose_the_ack, false) {
                    return Err("the broker's acknowledgement was lost".into());
                }
                Ok(())
            },
            DispatcherOptions::new().backoff(Duration::from_secs(1), Duration::from_secs(1)),
        )
        .expect("start the dispatcher");
    let consume = Behavior::answer(Response::new(200, "applied")).effect("applied");
    let first = calls.recv_timeout(WAIT).expect("the first publish");
    assert_eq!(first, pushed[0], "the published id is the pushed one");
    assert!(matches!(
        e.process("ledger", &first.to_hex(), &consume),
        Ok(ProcessAnswer::Ran(_))
    ));

    wait_until("the failed attempt to be recorded", || {
        e.outbox_metrics().publish_failures == 1
    });
    e.advance(Duration::from_secs(5));
    dispatcher.wake();
    let second = calls.recv_timeout(WAIT).expect("the republish");
    assert_eq!(second, first, "republished with the same id");
    assert!(matches!(
        e.process("ledger", &second.to_hex(), &consume),
        Ok(ProcessAnswer::Duplicate { .. })
    ));
    wait_until("the delivery", || {
        e.outbox_stats().map(|s| s.pending == 0).unwrap_or(false)
    });
    dispatcher.shutdown().expect("shutdown");
    assert_eq!(e.effects("applied"), 1, "the consumer applied it once");
    assert_eq!(consume.runs(), 1);
}

/// A payment provider that dedupes on the idempotency key it is sent.
#[derive(Default)]
struct Provider {
    charges: Mutex<HashMap<String, String>>,
    actions: AtomicU32,
}

impl Provider {
    fn charge(&self, idempotency_key: &str) -> String {
        let mut charges = self.charges.lock().expect("provider");
        let n = charges.len();
        charges
            .entry(idempotency_key.to_owned())
            .or_insert_with(|| {
                self.actions.fetch_add(1, Ordering::SeqCst);
                format!("ch_{n}")
            })
            .clone()
    }
}

/// (7) A workflow activity made the external call, then its process died before reporting
/// (the lease is forgotten, not released): until the lease lapses the key is in flight; then
/// the next attempt takes over (`takeover_of == Some(1)`) with the SAME downstream key, so a
/// provider that dedupes on it acts once; the takeover's completion is what replays.
pub fn activity_crash_before_reporting_is_taken_over_with_the_same_downstream_key<E: Engine>(
    e: &mut E,
) {
    let provider = Provider::default();
    let activity = req("run-7", "charge-card", "step-1", b"amount=4200");
    let first = acquired(e.begin(activity.clone()));
    assert_eq!((first.attempt(), first.takeover_of()), (1, None));
    assert_eq!(first.deadline(), T0.saturating_add(LEASE));
    let key = first.downstream_key();
    let charge_id = provider.charge(&key.to_hex());
    first.crash();

    e.advance(LEASE - MS);
    begin_in_flight(e.begin(activity.clone()));
    in_flight(e.execute(activity.clone(), &Behavior::panic()));
    e.advance(MS);

    let second = acquired(e.begin(activity.clone()));
    assert_eq!((second.attempt(), second.takeover_of()), (2, Some(1)));
    assert_eq!(
        second.downstream_key(),
        key,
        "the same key for the provider"
    );
    let again = provider.charge(&second.downstream_key().to_hex());
    assert_eq!(again, charge_id, "the provider deduped the repeated call");
    assert_eq!(
        provider.actions.load(Ordering::SeqCst),
        1,
        "the provider acted once"
    );
    let record = e
        .get(activity.scope(), "step-1")
        .expect("get")
        .expect("record");
    assert_eq!(
        record.created_at, T0,
        "a takeover keeps the intent's creation time"
    );
    assert!(matches!(record.state, State::Pending { attempt: 2, .. }));

    let report = Behavior::answer(Response::new(200, again.clone())).effect("charge-recorded");
    let recorded = second
        .complete_with(&report)
        .expect("the takeover completes");
    assert_eq!(recorded.body(), again.as_bytes());
    assert_eq!(begin_replayed(e.begin(activity)), recorded);
    assert_eq!(e.effects("charge-recorded"), 1);
}

/// (8) A record expired and a legitimate late retry arrives: within the tombstone horizon it
/// is `Expired` (status and resource pointer, no body; the closure does not run), on both
/// flows, before and after a sweep shrank it; past the horizon (after the sweep deleted it) it
/// runs again.
pub fn late_retry_is_expired_within_the_horizon_and_runs_again_past_it<E: Engine>(e: &mut E) {
    let request = req("t1", "create_order", "late-1", b"qty=2");
    let create =
        Behavior::answer(Response::new(201, r#"{"id":"ord_1"}"#).with_resource("order", "ord_1"))
            .effect("orders");
    executed(e.execute(request.clone(), &create));

    e.advance(RETENTION);
    let lazy = expired(e.execute(request.clone(), &create));
    assert_eq!(lazy.status(), 201);
    assert!(!lazy.is_failure());
    let resource = lazy.resource().expect("the resource pointer survives");
    assert_eq!(
        (resource.kind.as_str(), resource.id.as_str()),
        ("order", "ord_1")
    );

    let report = e.sweep().expect("sweep");
    assert_eq!((report.tombstoned, report.deleted), (1, 0), "{report:?}");
    let scope = Scope::new("t1", "create_order");
    let record = e
        .get(&scope, "late-1")
        .expect("get")
        .expect("a tombstone is kept");
    assert!(
        matches!(record.state, State::Tombstone(_)),
        "{:?}",
        record.state
    );
    assert_eq!(expired(e.execute(request.clone(), &create)), lazy);
    assert_eq!(begin_expired(e.begin(request.clone())), lazy);
    assert_eq!(create.runs(), 1, "the closure did not run again");
    assert_eq!(e.effects("orders"), 1);

    e.advance(HORIZON - RETENTION - MS);
    assert_eq!(expired(e.execute(request.clone(), &create)), lazy);
    e.advance(MS);
    let report = e.sweep().expect("sweep");
    assert_eq!((report.tombstoned, report.deleted), (0, 1), "{report:?}");
    assert_eq!(e.get(&scope, "late-1").expect("get"), None);
    executed(e.execute(request, &create));
    assert_eq!(
        (create.runs(), e.effects("orders")),
        (2, 2),
        "past the horizon it runs again"
    );
}
