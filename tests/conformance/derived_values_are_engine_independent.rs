//! What the engines derive is the same bytes on every engine, so a fleet can move between
//! them and a provider sees the same keys: downstream keys, event ids (from a record, from a
//! mark, from an identity) and the stored record encoding, pinned as constants here.

use idem::Response;
use idem::format::Record;
use idem::keys::Fingerprint;
use idem::outbox::Event;

use super::*;

/// A digest of a stored record's encoding (its bytes are docs/FORMAT.md's).
fn digest(record: &Record) -> String {
    Fingerprint::of_bytes(&record.encode()).to_hex()
}

/// The downstream key of (t1, charge, pay-1), the ids of events pushed at T0 by an `execute`
/// (two pushes: positions 0 and 1), by a `process` and with an identity, and the encoding of
/// the Completed record finished at T0 are the pinned values.
pub fn ids_keys_and_encodings_are_the_same_on_every_engine<E: Engine>(e: &mut E) {
    let lease = acquired(e.begin(req("t1", "charge", "pay-1", b"amount=100")));
    assert_eq!(lease.downstream_key().to_hex(), DOWNSTREAM_KEY);
    lease.release().expect("release");

    let pay = Behavior::answer(Response::new(201, "ok").with_resource("order", "o1"))
        .push(Event::new("payments", b"a".to_vec()))
        .push(Event::new("payments", b"b".to_vec()).ordering_key("o1"))
        .push(Event::new("payments", b"c".to_vec()).identity("payment-o1"));
    executed(e.execute(req("t1", "pay", "pay-1", b"amount=100"), &pay));
    let ids: Vec<String> = pay.pushed().iter().map(|id| id.to_hex()).collect();
    assert_eq!(ids, [RECORD_EVENT_0, RECORD_EVENT_1, IDENTITY_EVENT]);
    let record = e
        .get(&idem::Scope::new("t1", "pay"), "pay-1")
        .expect("get")
        .expect("record");
    assert_eq!(digest(&record), RECORD_DIGEST);

    let consume =
        Behavior::answer(Response::new(200, "ok")).push(Event::new("ledger", b"d".to_vec()));
    executed_inbox(e.process("ledger", "m-1", &consume));
    assert_eq!(consume.pushed()[0].to_hex(), MARK_EVENT_0);
    let pending: Vec<String> = e
        .pending_events(10)
        .expect("pending")
        .iter()
        .map(|ev| ev.id.to_hex())
        .collect();
    assert_eq!(
        pending,
        [RECORD_EVENT_0, RECORD_EVENT_1, IDENTITY_EVENT, MARK_EVENT_0]
    );
}

#[track_caller]
fn executed_inbox(r: Result<idem::inbox::ProcessAnswer<Response>, idem::Error>) {
    assert!(matches!(r, Ok(idem::inbox::ProcessAnswer::Ran(_))), "{r:?}");
}

const DOWNSTREAM_KEY: &str = "bc02dbb067971c6ea1811e6f408e96a724226c7d7afb062acf4f10ff38bba8ef";
const RECORD_EVENT_0: &str = "7f9edb65b9403803a0e3418e82ef5e2af10a7a6dbf2adb2b26862c722e8a62a4";
const RECORD_EVENT_1: &str = "e7b1aa9d1e23f804055bc409c9ee47fee4442152dd455cff6b4c5a8987d5049a";
const IDENTITY_EVENT: &str = "99f5cb65d30377815b9c46dccdac2178fca4c739c9d0acc266d42fe7f72870cd";
const MARK_EVENT_0: &str = "ba5cf681a7fbcdb5adc9de10bb128f9a0e30776e63217ba03565415c0663b504";
const RECORD_DIGEST: &str = "5973b713351b58a6f73d8414c22a002fe04f410afd0bd2cdc4fbe86ddf28b036";

/// An event id depends on the intent (its key and when its first attempt began) and the
/// push's position, not on the attempt: a takeover's push gets the id the crashed attempt's
/// would have had, which is the id a fresh intent begun at that same instant gets.
pub fn a_takeover_pushes_the_event_id_of_its_intent<E: Engine>(e: &mut E) {
    let charge = req("t1", "charge", "ev-1", b"amount=100");
    acquired(e.begin(charge.clone())).crash();
    e.advance(LEASE);
    let second = acquired(e.begin(charge.clone()));
    assert_eq!(second.takeover_of(), Some(1));
    let report =
        Behavior::answer(Response::new(200, "charged")).push(Event::new("payments", b"x".to_vec()));
    second.complete_with(&report).expect("complete_with");
    let by_takeover = report.pushed();

    assert!(
        e.purge(&idem::Scope::new("t1", "charge"), "ev-1")
            .expect("purge")
    );
    e.set_time(crate::common::T0);
    let fresh =
        Behavior::answer(Response::new(200, "charged")).push(Event::new("payments", b"x".to_vec()));
    executed(e.execute(charge, &fresh));
    assert_eq!(
        fresh.pushed(),
        by_takeover,
        "the same intent instant, the same id"
    );
    assert_eq!(by_takeover.len(), 1);
}
