//! Flow B's leases: a lapsed holder is fenced out for good once another attempt took over;
//! a heartbeat extends a lease, a release frees the key at once, and `begin_wait` returns the
//! result another attempt finished.

use std::sync::mpsc;
use std::time::Duration;

use idem::{BeginAnswer, Claim, Response, Scope};

use super::*;
use crate::common::T0;

/// What the stale holder tries.
#[derive(Debug, Clone, Copy)]
enum Stale {
    Heartbeat,
    Complete,
    Fail,
    CompleteWith,
    Release,
    Drop,
}

/// A lapses, B takes over (`takeover_of == Some(1)`). Whatever A then does — heartbeat,
/// complete, fail, complete_with (its closure does not run), release (not an error), drop —
/// it gets `LeaseLost` (or nothing for release and drop) and changes nothing: the record is
/// B's, the key is still in flight, and B's result is what replays.
pub fn stale_holder_is_fenced_after_a_takeover<E: Engine>(e: &mut E) {
    let ops = [
        Stale::Heartbeat,
        Stale::Complete,
        Stale::Fail,
        Stale::CompleteWith,
        Stale::Release,
        Stale::Drop,
    ];
    let scope = Scope::new("t1", "charge");
    for op in ops {
        let key = format!("pay-{op:?}");
        let charge = req("t1", "charge", &key, b"amount=100");
        let mut a = acquired(e.begin(charge.clone()));
        e.advance(LEASE);
        let b = acquired(e.begin(charge.clone()));
        assert_eq!((b.attempt(), b.takeover_of()), (2, Some(1)), "{op:?}");
        assert_eq!(b.downstream_key(), a.downstream_key());
        let before = e.get(&scope, &key).expect("get");

        let stale = Behavior::answer(Response::new(200, "stale")).effect("stale");
        match op {
            Stale::Heartbeat => {
                lease_lost(a.heartbeat());
                drop(a);
            }
            Stale::Complete => lease_lost(a.complete(Response::new(200, "stale"))),
            Stale::Fail => lease_lost(a.fail(Response::new(402, "stale"))),
            Stale::CompleteWith => lease_lost(a.complete_with(&stale)),
            Stale::Release => a.release().expect("releasing a lost lease is not an error"),
            Stale::Drop => drop(a),
        }
        assert_eq!(
            stale.runs(),
            0,
            "{op:?}: a stale holder's closure does not run"
        );
        assert_eq!(
            e.get(&scope, &key).expect("get"),
            before,
            "{op:?} changed nothing"
        );
        begin_in_flight(e.begin(charge.clone()));

        let fresh = b
            .complete(Response::new(200, format!("B after {op:?}")))
            .expect("B completes");
        assert_eq!(begin_replayed(e.begin(charge.clone())), fresh);
        assert_eq!(replayed(e.execute(charge, &Behavior::panic())), fresh);
    }
    assert_eq!(e.effects("stale"), 0);
}

/// A heartbeat extends the lease to now + lease: past the original deadline nobody takes over
/// (neither `begin` nor `execute`, whose closure does not run). A release frees the key at
/// once: the record is gone and the next claim is a first attempt with the same downstream key.
pub fn heartbeat_extends_and_release_frees_at_once<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "hb", b"amount=100");
    let mut lease = acquired(e.begin(charge.clone()));
    let original = lease.deadline();
    e.advance(Duration::from_secs(20));
    let extended = lease.heartbeat().expect("heartbeat");
    assert_eq!(extended, e.now().saturating_add(LEASE));
    assert_eq!(lease.deadline(), extended);
    e.advance(Duration::from_secs(20));
    assert!(e.now() > original);
    begin_in_flight(e.begin(charge.clone()));
    let flow_a = Behavior::answer(Response::new(200, "flow A"));
    in_flight(e.execute(charge.clone(), &flow_a));
    assert_eq!(flow_a.runs(), 0);
    lease
        .complete(Response::new(200, "done"))
        .expect("complete");
    assert_eq!(begin_replayed(e.begin(charge)).body(), b"done");

    let refund = req("t1", "refund", "rel", b"amount=100");
    let lease = acquired(e.begin(refund.clone()));
    let key = lease.downstream_key();
    lease.release().expect("release");
    assert_eq!(
        e.get(&Scope::new("t1", "refund"), "rel").expect("get"),
        None
    );
    let again = acquired(e.begin(refund));
    assert_eq!((again.attempt(), again.takeover_of()), (1, None));
    assert_eq!(again.downstream_key(), key);
    again.release().expect("release");
}

/// `begin_wait` on a key another attempt holds waits for it and returns its result when it
/// completes; when it releases, the waiter acquires; on a finished key it replays at once.
pub fn begin_wait_returns_the_result_another_attempt_finished<E: Engine>(e: &mut E) {
    let e = &*e;
    let charge = req("t1", "charge", "wait", b"amount=100");
    let lease = acquired(e.begin(charge.clone()));
    let (ready, go) = mpsc::channel::<()>();
    let waited = std::thread::scope(|s| {
        s.spawn(move || {
            go.recv().expect("the waiter is ready");
            std::thread::sleep(Duration::from_millis(50));
            lease
                .complete(Response::new(200, "holder's answer"))
                .expect("the holder completes");
        });
        begin_in_flight(e.begin(charge.clone()));
        ready.send(()).expect("holder alive");
        e.begin_wait(charge.clone(), WAIT)
    });
    assert_eq!(begin_replayed(waited).body(), b"holder's answer");
    match e.begin_wait(charge, Duration::ZERO) {
        Ok(BeginAnswer::Replayed(r)) => assert_eq!(r.body(), b"holder's answer"),
        other => panic!("expected a replay, got {other:?}"),
    }

    let refund = req("t1", "refund", "wait", b"amount=100");
    let lease = acquired(e.begin(refund.clone()));
    let (ready, go) = mpsc::channel::<()>();
    let waited = std::thread::scope(|s| {
        s.spawn(move || {
            go.recv().expect("the waiter is ready");
            std::thread::sleep(Duration::from_millis(50));
            lease.release().expect("release");
        });
        ready.send(()).expect("holder alive");
        e.begin_wait(refund.clone(), WAIT)
    });
    let lease = acquired(waited);
    assert_eq!(lease.attempt(), 1);
    lease
        .complete(Response::new(200, "refunded"))
        .expect("complete");
    // Still in flight after a bounded wait: InFlight.
    let held = acquired(e.begin(req("t1", "void", "wait", b"x")));
    begin_in_flight(e.begin_wait(req("t1", "void", "wait", b"x"), Duration::from_millis(60)));
    held.release().expect("release");
}

/// A lease that lapsed while nobody took it over is still held: its heartbeat revives it (to
/// now + lease) and it completes; that answer replays.
pub fn a_lapsed_lease_nobody_took_over_can_still_finish<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "late", b"amount=100");
    let mut lease = acquired(e.begin(charge.clone()));
    e.advance(LEASE * 3);
    assert_eq!(
        lease.heartbeat().expect("heartbeat after the lapse"),
        e.now().saturating_add(LEASE)
    );
    begin_in_flight(e.begin(charge.clone()));
    e.advance(LEASE * 2);
    let done = lease
        .complete(Response::new(200, "late but fine"))
        .expect("complete after the lapse");
    assert_eq!(begin_replayed(e.begin(charge)), done);
}

/// Flow A may take over a lapsed lease: `execute` runs (one effect), the old holder is fenced
/// out, and flow A's answer replays.
pub fn execute_takes_over_a_lapsed_lease_and_fences_the_old_holder<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "via-a", b"amount=100");
    let old = acquired(e.begin(charge.clone()));
    e.advance(LEASE);
    let flow_a = Behavior::answer(Response::new(200, "via flow A")).effect("charge");
    let r = executed(e.execute(charge.clone(), &flow_a));
    lease_lost(old.complete(Response::new(200, "stale")));
    assert_eq!(replayed(e.execute(charge.clone(), &flow_a)), r);
    assert_eq!(begin_replayed(e.begin(charge)), r);
    assert_eq!((flow_a.runs(), e.effects("charge")), (1, 1));
}

/// `begin_wait` on a live lease that lapses while it waits (the clock moves on another
/// thread) takes it over; the old holder is fenced out.
pub fn begin_wait_takes_over_a_lease_that_lapses_while_waiting<E: Engine>(e: &mut E) {
    let e = &*e;
    let charge = req("t1", "charge", "lapse", b"amount=100");
    let old = acquired(e.begin(charge.clone()));
    let (ready, go) = mpsc::channel::<()>();
    let waited = std::thread::scope(|s| {
        s.spawn(move || {
            go.recv().expect("the waiter is ready");
            std::thread::sleep(Duration::from_millis(50));
            e.advance(LEASE);
        });
        ready.send(()).expect("clock thread alive");
        e.begin_wait(charge.clone(), WAIT)
    });
    let new = acquired(waited);
    assert_eq!(new.takeover_of(), Some(1));
    lease_lost(old.complete(Response::new(200, "stale")));
    let done = new.complete(Response::new(200, "new")).expect("complete");
    assert_eq!(begin_replayed(e.begin(charge)), done);
}

/// The in-flight hint is the lease's remaining time, capped at the default 1 s: 1 s at the
/// claim, 400 ms when 400 ms are left, on both flows.
pub fn in_flight_hint_is_the_remaining_lease_capped<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "hint", b"amount=100");
    let lease = acquired(e.begin(charge.clone()));
    assert_eq!(
        begin_in_flight(e.begin(charge.clone())),
        Duration::from_secs(1)
    );
    assert_eq!(
        in_flight(e.execute(charge.clone(), &Behavior::panic())),
        Duration::from_secs(1)
    );
    e.advance(LEASE - Duration::from_millis(400));
    assert_eq!(
        begin_in_flight(e.begin(charge.clone())),
        Duration::from_millis(400)
    );
    assert_eq!(
        in_flight(e.execute(charge, &Behavior::panic())),
        Duration::from_millis(400)
    );
    lease.release().expect("release");
}

/// A heartbeat while the clock is an hour behind keeps the deadline already granted (it
/// never lowers it): back at T0 + 29 s nobody takes over.
pub fn a_heartbeat_under_a_backward_clock_keeps_the_granted_deadline<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "back", b"amount=100");
    let mut lease = acquired(e.begin(charge.clone()));
    let granted = lease.deadline();
    e.set_time(idem::Timestamp(T0.0 - 3_600_000));
    assert_eq!(lease.heartbeat().expect("heartbeat"), granted);
    begin_in_flight(e.begin(charge.clone()));
    e.set_time(T0.saturating_add(Duration::from_secs(29)));
    begin_in_flight(e.begin(charge.clone()));
    let flow_a = Behavior::answer(Response::new(200, "flow A"));
    in_flight(e.execute(charge.clone(), &flow_a));
    assert_eq!(flow_a.runs(), 0);
    assert_eq!(
        lease.heartbeat().expect("heartbeat"),
        e.now().saturating_add(LEASE)
    );
    lease.complete(Response::new(200, "ok")).expect("complete");
    // An unbounded wait on a finished key replays at once.
    assert_eq!(
        begin_replayed(e.begin_wait(charge, Duration::MAX)).body(),
        b"ok"
    );
}

/// A claim whose answer was lost (its lease forgotten, as by a caller that never received it)
/// leaves the key Pending: another caller sees it in flight, and the retry with the same
/// [`Claim`] takes it at once — the same attempt and downstream key, a full lease from now —
/// while the lease the earlier call handed out is fenced. A claim recognises only its own
/// tokens: once another attempt took the key over, the claim sees it in flight like anyone;
/// and a claim that got an answer without a lease is claimed afresh.
pub fn a_begin_retried_with_its_claim_takes_its_own_lease_at_once<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "ship");
    let parcel = req("t1", "ship", "parcel-1", b"express");
    let mut claim = Claim::new(parcel.clone());
    let mut first = acquired(e.begin_claim(&mut claim));
    begin_in_flight(e.begin(parcel.clone()));

    e.advance(MS * 5);
    let resumed = acquired(e.begin_claim(&mut claim));
    assert_eq!((resumed.attempt(), resumed.takeover_of()), (1, None));
    assert_eq!(resumed.downstream_key(), first.downstream_key());
    assert_eq!(resumed.deadline(), e.now().saturating_add(LEASE));
    // The earlier handle is fenced: nothing it does reaches the record.
    let before = e.get(&scope, "parcel-1").expect("get");
    lease_lost(first.heartbeat());
    lease_lost(first.complete(Response::new(200, "from the lost answer")));
    assert_eq!(e.get(&scope, "parcel-1").expect("get"), before);
    begin_in_flight(e.begin(parcel.clone()));

    let label = resumed
        .complete(Response::new(200, "label"))
        .expect("the resumed lease completes");
    assert_eq!(begin_replayed(e.begin_claim(&mut claim)), label);

    // Another attempt's takeover is not the claim's own.
    let other = req("t1", "ship", "parcel-2", b"express");
    let mut claim = Claim::new(other.clone());
    acquired(e.begin_claim(&mut claim)).crash();
    e.advance(LEASE);
    let taken = acquired(e.begin(other.clone()));
    assert_eq!(taken.takeover_of(), Some(1));
    begin_in_flight(e.begin_claim(&mut claim));
    taken.release().expect("release");

    // A claim that was answered without a lease wrote nothing: it claims afresh later.
    let third = req("t1", "ship", "parcel-3", b"express");
    let holder = acquired(e.begin(third.clone()));
    let mut claim = Claim::new(third.clone());
    begin_in_flight(e.begin_claim(&mut claim));
    holder.release().expect("release");
    let fresh = acquired(e.begin_claim(&mut claim));
    assert_eq!(fresh.attempt(), 1);
    fresh.release().expect("release");
}
