//! `Response::is_failure` always reflects what was stored: a response recorded as Completed is
//! never reported as a failure, so the first answer and every replay are equal.

use crate::common;

use common::*;
use idem::{Abort, BeginAnswer, Response};

#[test]
fn a_failed_replay_returned_as_success_is_stored_and_replayed_as_success() {
    let h = Harness::new();
    let store = h.store();
    let failed = executed(store.execute(req("t", "a", "k", b"p"), |_| {
        Err(Abort::terminal(Response::new(402, "declined")))
    }));
    assert!(failed.is_failure());
    // The caller passes that response object on as a success for another intent.
    let first = executed(store.execute(req("t", "b", "k", b"p"), |_| Ok(failed.clone())));
    assert!(!first.is_failure(), "Completed is never reported as failed");
    let retry = replayed(store.execute(req("t", "b", "k", b"p"), |_| {
        Ok(Response::new(500, "must not run"))
    }));
    assert_eq!(first, retry);
}

#[test]
fn lease_completion_normalises_the_flag_too() {
    let h = Harness::new();
    let store = h.store();
    let failed = executed(store.execute(req("t", "a", "k", b"p"), |_| {
        Err(Abort::terminal(Response::new(402, "declined")))
    }));
    let lease = acquired(store.begin(req("t", "charge", "k", b"p")));
    let first = lease.complete(failed).expect("complete");
    assert!(!first.is_failure());
    match store.begin(req("t", "charge", "k", b"p")) {
        Ok(BeginAnswer::Replayed(r)) => assert_eq!(r, first),
        other => panic!("expected a replay, got {other:?}"),
    }
}
