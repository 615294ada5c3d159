//! A `begin` whose connection fails at its commit gets `Error::OutcomeUnknown`: its claim may
//! have landed, leaving the key Pending under a holder token no lease holds. A retry with the
//! same `Claim` (`PgStore::begin_claim`) recognises its own token and takes the lease at once —
//! the same attempt, the same downstream key — instead of answering `InFlight` until the lease
//! lapses; another caller still sees the key in flight. A claim that did not land is simply
//! claimed again.
//!
//! The commit is lost deterministically with the white-box hook `PgStore::on_commit`
//! (`__internal_whitebox`, NOT PUBLIC API), which terminates the batch's backend before or
//! after its `COMMIT` ran. The clock is a manual one that never moves here: "at once" means no
//! lease had to lapse.
//!
//! Needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when `IDEM_REQUIRE_PG`
//! or `CI` is set).

#![cfg(feature = "postgres")]
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use common::pg::PgHarness;
use idem::keys::derive_key;
use idem::postgres::{CommitLoss, PgStore};
use idem::{BeginAnswer, Claim, Error, Request, Response, Scope};

fn scope() -> Scope {
    Scope::new("t", "ship")
}

fn req(key: &str) -> Request {
    Request::from_canonical_bytes(scope(), key, b"express")
}

/// Makes the store's next commit fail as `loss` says, once.
fn lose_next_commit(store: &PgStore, loss: CommitLoss) {
    let mut armed = true;
    store.on_commit(move |_| std::mem::take(&mut armed).then_some(loss));
}

#[test]
fn a_begin_whose_claim_landed_but_whose_answer_was_lost_is_taken_at_once_by_its_retry() {
    let Some(h) = PgHarness::new("claimlanded") else {
        return;
    };
    let store = h.store();
    let mut claim = Claim::new(req("parcel-1"));
    lose_next_commit(store, CommitLoss::AfterItRan);
    match store.begin_claim(&mut claim) {
        Err(Error::OutcomeUnknown { .. }) => {}
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    // The claim landed: the key is Pending, and anyone else waits for its lease.
    let stored = store.get(&scope(), "parcel-1").expect("get");
    assert!(
        matches!(
            stored.map(|r| r.state),
            Some(idem::format::State::Pending { .. })
        ),
        "the claim landed"
    );
    assert!(matches!(
        store.begin(req("parcel-1")),
        Ok(BeginAnswer::InFlight { .. })
    ));

    // The retry with the same claim takes it at once.
    let lease = match store.begin_claim(&mut claim) {
        Ok(BeginAnswer::Acquired(lease)) => lease,
        other => panic!("the retry must take its own claim at once, got {other:?}"),
    };
    assert_eq!((lease.attempt(), lease.takeover_of()), (1, None));
    assert_eq!(
        lease.downstream_key(),
        derive_key(common::record_key("t", "ship", b"parcel-1"), ""),
        "the downstream key of every attempt"
    );
    assert_eq!(
        lease.deadline(),
        store.now().saturating_add(store.lease_duration())
    );
    let label = lease
        .complete(Response::new(200, "label"))
        .expect("the resumed lease completes");
    match store.begin_claim(&mut claim) {
        Ok(BeginAnswer::Replayed(r)) => assert_eq!(r, label),
        other => panic!("expected the replay, got {other:?}"),
    }
}

#[test]
fn a_begin_whose_claim_did_not_land_is_claimed_again_by_its_retry() {
    let Some(h) = PgHarness::new("claimnotlanded") else {
        return;
    };
    let store = h.store();
    let mut claim = Claim::new(req("parcel-2"));
    lose_next_commit(store, CommitLoss::BeforeItRuns);
    match store.begin_claim(&mut claim) {
        Err(Error::OutcomeUnknown { .. }) => {}
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert_eq!(store.get(&scope(), "parcel-2").expect("get"), None);
    match store.begin_claim(&mut claim) {
        Ok(BeginAnswer::Acquired(lease)) => {
            assert_eq!(lease.attempt(), 1);
            lease.release().expect("release");
        }
        other => panic!("the key is free, got {other:?}"),
    }
}
