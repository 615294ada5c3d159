//! Flow B: a lapsed lease is taken over with the same downstream key, and the stale holder is
//! fenced out for good; heartbeats, release, drop, terminal failures, `complete_with` and
//! `begin_wait` behave as documented.

use crate::common;

use std::cell::Cell;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use idem::format::State;
use idem::{Abort, BeginAnswer, Error, Request, Response, Scope, Store};

const LEASE: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(10);

fn charge() -> Request {
    req("t1", "charge", "pay-1", b"amount=100")
}

fn stored(store: &Store) -> Option<idem::format::Record> {
    store
        .get(&Scope::new("t1", "charge"), "pay-1")
        .expect("get")
}

#[track_caller]
fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::LeaseLost { key }) => assert_eq!(key, "pay-1"),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

/// The clock gone an hour back.
const AN_HOUR_BEFORE_T0: idem::Timestamp = idem::Timestamp(T0.0 - 3_600_000);

/// Asserts a live lease keeps others out: `begin` in flight, `execute` runs nothing (`why`).
#[track_caller]
fn nobody_takes_over(store: &Store, why: &str) {
    begin_in_flight(store.begin(charge()));
    let ran = Cell::new(false);
    let outcome = store.execute(charge(), |_| {
        ran.set(true);
        Ok(Response::new(200, "flow A"))
    });
    assert!(
        matches!(outcome, Ok(idem::ExecuteAnswer::InFlight { .. })),
        "{outcome:?}"
    );
    assert!(!ran.get(), "{why}");
}

#[test]
fn crashed_holder_is_taken_over_with_the_same_downstream_key() {
    let h = Harness::new();
    let store = h.store();
    let first = acquired(store.begin(charge()));
    assert_eq!(first.attempt(), 1);
    assert_eq!(first.takeover_of(), None);
    assert_eq!(first.deadline(), T0.saturating_add(LEASE));
    let downstream = first.downstream_key();
    // The holder made the external call, then crashed before `complete`.
    std::mem::forget(first);

    // Until the deadline, the key is in flight; the boundary itself is lapsed.
    h.clock.advance(LEASE - Duration::from_millis(1));
    begin_in_flight(store.begin(charge()));
    h.clock.advance(Duration::from_millis(1));

    let second = acquired(store.begin(charge()));
    assert_eq!(second.takeover_of(), Some(1));
    assert_eq!(second.attempt(), 2);
    assert_eq!(
        second.downstream_key(),
        downstream,
        "same key for the provider"
    );
    assert_eq!(second.downstream_key().to_hex().len(), 64);
    // A takeover keeps the intent's creation time.
    assert_eq!(stored(store).expect("record").created_at, T0);

    second
        .complete(Response::new(200, "charged"))
        .expect("complete");
    assert_eq!(begin_replayed(store.begin(charge())).body(), b"charged");
}

#[test]
fn stale_holder_cannot_complete_after_a_takeover() {
    let h = Harness::new();
    let store = h.store();
    let old = acquired(store.begin(charge()));
    h.clock.advance(LEASE + Duration::from_secs(1));
    let new = acquired(store.begin(charge()));
    assert_eq!(new.takeover_of(), Some(1));
    let before = stored(store).expect("record");

    assert_lease_lost(old.complete(Response::new(200, "stale answer")));
    assert_eq!(
        stored(store),
        Some(before),
        "the stale complete changed nothing"
    );
    // The key is still in flight for others (the new lease is alive).
    begin_in_flight(store.begin(charge()));

    new.complete(Response::new(200, "fresh answer"))
        .expect("new holder completes");
    assert_eq!(
        begin_replayed(store.begin(charge())).body(),
        b"fresh answer"
    );
}

#[test]
fn stale_holder_cannot_overwrite_a_completed_takeover() {
    let h = Harness::new();
    let store = h.store();
    let old = acquired(store.begin(charge()));
    h.clock.advance(LEASE);
    let new = acquired(store.begin(charge()));
    new.complete(Response::new(200, "fresh")).expect("complete");
    let before = stored(store).expect("record");

    assert_lease_lost(old.fail(Response::new(402, "stale failure")));
    assert_eq!(stored(store), Some(before));
    let r = begin_replayed(store.begin(charge()));
    assert_eq!(r.body(), b"fresh");
    assert!(!r.is_failure());
}

#[test]
fn stale_heartbeat_fail_and_complete_with_are_lease_lost_and_change_nothing() {
    let h = Harness::new();
    let store = h.store();
    let mut old_a = acquired(store.begin(charge()));
    h.clock.advance(LEASE);
    let new = acquired(store.begin(charge()));
    let before = stored(store).expect("record");

    assert_lease_lost(old_a.heartbeat());
    assert_eq!(stored(store).as_ref(), Some(&before));
    let ran = Cell::new(false);
    assert_lease_lost(old_a.complete_with(|tx| {
        ran.set(true);
        bump(tx, "stale")?;
        Ok(Response::new(200, "stale"))
    }));
    assert!(!ran.get(), "a stale holder's closure must not run");
    assert_eq!(stored(store).as_ref(), Some(&before));
    assert_eq!(effects(store, "stale"), 0);

    // Another stale holder: this time `fail`.
    drop(new);
    let old_b = acquired(store.begin(charge()));
    h.clock.advance(LEASE);
    let newer = acquired(store.begin(charge()));
    let before = stored(store).expect("record");
    assert_lease_lost(old_b.fail(Response::new(402, "stale")));
    assert_eq!(stored(store), Some(before));
    newer
        .complete(Response::new(200, "ok"))
        .expect("newer completes");
}

#[test]
fn dropping_or_releasing_a_stale_lease_does_not_free_the_new_holders_key() {
    let h = Harness::new();
    let store = h.store();
    let old_dropped = acquired(store.begin(charge()));
    let old_released = acquired(store.begin(req("t1", "charge", "pay-2", b"x")));
    h.clock.advance(LEASE);
    let new = acquired(store.begin(charge()));
    let new2 = acquired(store.begin(req("t1", "charge", "pay-2", b"x")));
    let before = stored(store).expect("record");

    drop(old_dropped);
    old_released
        .release()
        .expect("releasing a lost lease is not an error");
    assert_eq!(stored(store), Some(before));
    begin_in_flight(store.begin(charge()));
    begin_in_flight(store.begin(req("t1", "charge", "pay-2", b"x")));
    new.complete(Response::new(200, "ok")).expect("complete");
    new2.complete(Response::new(200, "ok")).expect("complete");
}

#[test]
fn heartbeat_extends_the_lease_past_its_original_deadline() {
    let h = Harness::new();
    let store = h.store();
    let mut lease = acquired(store.begin(charge()));
    let original = lease.deadline();

    h.clock.advance(Duration::from_secs(20));
    let extended = lease.heartbeat().expect("heartbeat");
    assert_eq!(extended, store.now().saturating_add(LEASE));
    assert_eq!(lease.deadline(), extended);
    assert!(extended > original);

    // Past the original deadline, before the new one: still in flight for everyone.
    h.clock.advance(Duration::from_secs(20));
    assert!(store.now() > original);
    nobody_takes_over(store, "no second attempt ran before the extended deadline");

    lease.complete(Response::new(200, "ok")).expect("complete");
}

/// A heartbeat while the clock is an hour behind returned a deadline an hour
/// earlier than the one already granted, so a second attempt took the key over 29 s early
/// (while the first holder still counted on its lease). A heartbeat never lowers a deadline:
/// `max(granted, now + lease)`.
#[test]
fn a_heartbeat_under_a_backward_clock_keeps_the_granted_deadline_and_nobody_takes_over_early() {
    let h = Harness::new();
    let store = h.store();
    let mut lease = acquired(store.begin(charge()));
    let granted = lease.deadline();
    assert_eq!(granted, T0.saturating_add(LEASE));

    // The clock goes an hour back; the holder heartbeats.
    h.clock.set(AN_HOUR_BEFORE_T0);
    let deadline = lease.heartbeat().expect("heartbeat");
    assert_eq!(deadline, granted, "the deadline already granted stays");
    assert_eq!(lease.deadline(), granted);
    match stored(store).map(|r| r.state) {
        Some(State::Pending { lease_deadline, .. }) => assert_eq!(lease_deadline, granted),
        other => panic!("expected the Pending record, got {other:?}"),
    }

    // Back to real time, one second before the granted deadline: nobody may take over.
    h.clock.set(T0.saturating_add(Duration::from_secs(29)));
    nobody_takes_over(store, "no second attempt ran before the granted deadline");

    // A heartbeat with the clock right again extends from now, as always.
    let extended = lease.heartbeat().expect("heartbeat");
    assert_eq!(extended, store.now().saturating_add(LEASE));
    lease.complete(Response::new(200, "ok")).expect("complete");
    assert_eq!(begin_replayed(store.begin(charge())).body(), b"ok");
}

/// `begin` and `begin_wait` under a backward clock keep the same rule: a live lease is not
/// taken over while the clock is behind (the lapse is measured against the granted deadline).
#[test]
fn a_backward_clock_lets_neither_begin_nor_begin_wait_take_a_live_lease() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    h.clock.set(AN_HOUR_BEFORE_T0);
    begin_in_flight(store.begin(charge()));
    match store.begin_wait(charge(), Duration::from_millis(50)) {
        Ok(BeginAnswer::InFlight { .. }) => {}
        other => panic!("expected InFlight, got {other:?}"),
    }
    // The holder still holds it, and finishes.
    lease.complete(Response::new(200, "ok")).expect("complete");
    h.clock.set(T0);
    assert_eq!(begin_replayed(store.begin(charge())).body(), b"ok");
}

#[test]
fn a_lapsed_lease_that_nobody_took_over_can_still_finish() {
    let h = Harness::new();
    let store = h.store();
    let mut lease = acquired(store.begin(charge()));
    h.clock.advance(LEASE * 3);
    // Heartbeat revives it; complete records the answer.
    let deadline = lease.heartbeat().expect("heartbeat after lapse");
    assert_eq!(deadline, store.now().saturating_add(LEASE));
    h.clock.advance(LEASE * 2);
    let r = lease
        .complete(Response::new(200, "late but fine"))
        .expect("complete after lapse");
    assert_eq!(r.body(), b"late but fine");
    assert_eq!(
        begin_replayed(store.begin(charge())).body(),
        b"late but fine"
    );
}

#[test]
fn dropping_a_lease_releases_the_key_at_once() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    drop(lease);
    assert_eq!(stored(store), None, "the record is removed");
    let again = acquired(store.begin(charge()));
    assert_eq!(again.attempt(), 1);
    assert_eq!(again.takeover_of(), None);
}

#[test]
fn release_frees_the_key_at_once() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let downstream = lease.downstream_key();
    lease.release().expect("release");
    assert_eq!(stored(store), None);
    let again = acquired(store.begin(charge()));
    assert_eq!(again.attempt(), 1);
    assert_eq!(again.downstream_key(), downstream);
}

#[test]
fn fail_stores_a_terminal_failure_that_replays() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let r = lease
        .fail(Response::new(402, "card declined"))
        .expect("fail");
    assert!(r.is_failure());
    assert_eq!(r.status(), 402);
    assert!(matches!(
        stored(store).expect("record").state,
        State::Failed(_)
    ));

    let replay = begin_replayed(store.begin(charge()));
    assert!(replay.is_failure());
    assert_eq!(replay, r);
    let ran = Cell::new(false);
    let via_execute = replayed(store.execute(charge(), |_| {
        ran.set(true);
        Ok(Response::new(200, "would succeed now"))
    }));
    assert!(!ran.get());
    assert!(via_execute.is_failure());
    assert_eq!(via_execute.body(), b"card declined");
}

#[test]
fn complete_with_commits_caller_writes_with_the_completion() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let r = lease
        .complete_with(|tx| {
            bump(tx, "ledger")?;
            Ok(Response::new(200, "charged").with_resource("payment", "pay-1"))
        })
        .expect("complete_with");
    assert_eq!(r.resource().map(|x| x.id.as_str()), Some("pay-1"));
    assert_eq!(effects(store, "ledger"), 1);
    assert_eq!(begin_replayed(store.begin(charge())), r);
}

#[test]
fn complete_with_terminal_abort_commits_writes_and_stores_a_failure() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let r = lease
        .complete_with(|tx| {
            bump(tx, "ledger")?;
            Err(Abort::terminal(Response::new(402, "declined")))
        })
        .expect("terminal failure is recorded");
    assert!(r.is_failure());
    assert_eq!(effects(store, "ledger"), 1);
    assert!(begin_replayed(store.begin(charge())).is_failure());
}

#[test]
fn complete_with_retryable_abort_writes_nothing_and_releases_the_lease() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let result = lease.complete_with(|tx| {
        bump(tx, "ledger")?;
        Err(Abort::retryable("provider timed out"))
    });
    assert!(matches!(result, Err(Error::Aborted { .. })), "{result:?}");
    assert_eq!(
        effects(store, "ledger"),
        0,
        "the caller's write was rolled back"
    );
    assert_eq!(stored(store), None, "the lease was released");
    assert_eq!(acquired(store.begin(charge())).attempt(), 1);
}

#[test]
fn execute_can_take_over_a_lapsed_lease_and_fences_the_old_holder() {
    let h = Harness::new();
    let store = h.store();
    let old = acquired(store.begin(charge()));
    h.clock.advance(LEASE);
    let r = executed(store.execute(charge(), |tx| {
        bump(tx, "charge")?;
        Ok(Response::new(200, "via flow A"))
    }));
    assert_lease_lost(old.complete(Response::new(200, "stale")));
    assert_eq!(replayed(store.execute(charge(), |_| unreachable!())), r);
    assert_eq!(effects(store, "charge"), 1);
}

#[test]
fn begin_wait_returns_the_holders_response_when_it_completes_on_another_thread() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let waited = thread::scope(|s| {
        s.spawn(move || {
            ready_rx.recv().expect("waiter is ready");
            lease
                .complete(Response::new(200, "holder's answer"))
                .expect("holder completes");
        });
        // Prove the key is in flight before waiting, then let the holder finish.
        begin_in_flight(store.begin(charge()));
        ready_tx.send(()).expect("holder alive");
        store.begin_wait(charge(), WAIT)
    });
    let r = begin_replayed(waited);
    assert_eq!(r.body(), b"holder's answer");
}

#[test]
fn begin_wait_acquires_when_the_holder_releases() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let waited = thread::scope(|s| {
        s.spawn(move || {
            ready_rx.recv().expect("waiter is ready");
            lease.release().expect("release");
        });
        ready_tx.send(()).expect("holder alive");
        store.begin_wait(charge(), WAIT)
    });
    let lease = acquired(waited);
    assert_eq!(lease.attempt(), 1);
}

#[test]
fn begin_wait_takes_over_a_lease_that_lapses_while_waiting() {
    let h = Harness::new();
    let store = h.store();
    let old = acquired(store.begin(charge()));
    let (ready_tx, ready_rx) = mpsc::channel();
    let waited = thread::scope(|s| {
        let clock = h.clock.clone();
        s.spawn(move || {
            ready_rx.recv().expect("waiter is ready");
            clock.advance(LEASE);
        });
        ready_tx.send(()).expect("clock thread alive");
        store.begin_wait(charge(), WAIT)
    });
    let new = acquired(waited);
    assert_eq!(new.takeover_of(), Some(1));
    assert_lease_lost(old.complete(Response::new(200, "stale")));
    new.complete(Response::new(200, "new")).expect("complete");
}

#[test]
fn begin_wait_with_zero_wait_on_a_live_lease_is_in_flight() {
    let h = Harness::with(|b| b.retry_after_cap(Duration::from_secs(60)));
    let store = h.store();
    let _lease = acquired(store.begin(charge()));
    h.clock.advance(Duration::from_secs(10));
    let retry_after = begin_in_flight(store.begin_wait(charge(), Duration::ZERO));
    assert!(retry_after > Duration::ZERO);
    // The hint is the lease's remaining time (under the cap).
    assert_eq!(retry_after, Duration::from_secs(20));
}

#[test]
fn retry_after_is_capped() {
    let h = Harness::new(); // default cap: 1 s
    let store = h.store();
    let _lease = acquired(store.begin(charge()));
    let retry_after = begin_in_flight(store.begin(charge()));
    assert_eq!(retry_after, Duration::from_secs(1));
}

#[test]
fn downstream_keys_differ_across_keys_tenants_and_operations_and_survive_reopen() {
    let mut h = Harness::new();
    let key_of = |h: &Harness, t: &str, o: &str, k: &str| {
        let lease = acquired(h.store().begin(req(t, o, k, b"p")));
        let dk = lease.downstream_key();
        lease.release().expect("release");
        dk
    };
    let base = key_of(&h, "t1", "charge", "k1");
    assert_ne!(base, key_of(&h, "t1", "charge", "k2"));
    assert_ne!(base, key_of(&h, "t2", "charge", "k1"));
    assert_ne!(base, key_of(&h, "t1", "refund", "k1"));
    // Independent of the payload, and stable across store instances.
    let lease = acquired(h.store().begin(req("t1", "charge", "k1", b"other payload")));
    assert_eq!(lease.downstream_key(), base);
    drop(lease);
    h.reopen();
    assert_eq!(base, key_of(&h, "t1", "charge", "k1"));
}

#[test]
fn begin_wait_on_a_finished_key_replays_at_once() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    lease
        .complete(Response::new(200, "done"))
        .expect("complete");
    match store.begin_wait(charge(), Duration::ZERO) {
        Ok(BeginAnswer::Replayed(r)) => assert_eq!(r.body(), b"done"),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[test]
fn a_panic_inside_complete_with_releases_the_key_and_writes_nothing() {
    let h = Harness::new();
    let store = h.store();
    let lease = acquired(store.begin(charge()));
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = lease.complete_with(|tx| {
            bump(tx, "ledger")?;
            panic!("caller bug while recording the result");
        });
    }));
    assert!(panicked.is_err());
    assert_eq!(effects(store, "ledger"), 0);
    assert_eq!(
        stored(store),
        None,
        "the unfinished lease was released on unwind"
    );
    assert_eq!(acquired(store.begin(charge())).attempt(), 1);
}

#[test]
fn begin_wait_with_an_unbounded_wait_does_not_panic() {
    let h = Harness::new();
    let store = h.store();
    // Free key: must simply acquire.
    let lease = acquired(store.begin_wait(charge(), Duration::MAX));
    // In-flight key: must wait for the holder and replay its answer.
    let (ready_tx, ready_rx) = mpsc::channel();
    let waited = thread::scope(|s| {
        s.spawn(move || {
            ready_rx.recv().expect("waiter is ready");
            lease
                .complete(Response::new(200, "done"))
                .expect("complete");
        });
        ready_tx.send(()).expect("holder alive");
        store.begin_wait(charge(), Duration::MAX)
    });
    assert_eq!(begin_replayed(waited).body(), b"done");
}
