//! The server committed but the response never reached the client: the retry with the same key
//! gets the first response back byte for byte, and nothing runs twice, even across a reopen.

use crate::common;

use std::cell::Cell;

use common::*;
use idem::{ExecuteAnswer, Response};

/// A body that is not UTF-8 and contains NUL, so "byte for byte" is really tested.
const BODY: &[u8] = b"{\"id\":\"ord_1\",\"raw\":\"\x00\xff\xfe\"}";

fn first_response() -> Response {
    Response::new(201, BODY).with_resource("order", "ord_1")
}

#[test]
fn retry_replays_the_identical_response_without_running_the_closure() {
    let h = Harness::new();
    let store = h.store();
    let runs = Cell::new(0u32);
    let place = || {
        store.execute(req("t1", "create_order", "key-1", b"order#1"), |tx| {
            runs.set(runs.get() + 1);
            bump(tx, "order")?;
            Ok(first_response())
        })
    };

    let first = executed(place());
    assert_eq!(first, first_response());

    for _ in 0..3 {
        let outcome = place().expect("retry");
        assert!(outcome.is_replay(), "retry must replay, got {outcome:?}");
        let again = replayed(Ok(outcome));
        assert_eq!(again.status(), 201);
        assert_eq!(again.body(), BODY);
        let resource = again.resource().expect("resource pointer kept");
        assert_eq!(
            (resource.kind.as_str(), resource.id.as_str()),
            ("order", "ord_1")
        );
        assert!(!again.is_failure());
        assert_eq!(again, first);
    }

    assert_eq!(runs.get(), 1, "the closure ran exactly once");
    assert_eq!(
        effects(store, "order"),
        1,
        "exactly one effect in the caller's table"
    );
}

#[test]
fn replay_survives_dropping_and_reopening_the_store() {
    let mut h = Harness::new();
    let first = executed(
        h.store()
            .execute(req("t1", "create_order", "key-1", b"order#1"), |tx| {
                bump(tx, "order")?;
                Ok(first_response())
            }),
    );

    h.reopen();

    let runs = Cell::new(0u32);
    let again = replayed(
        h.store()
            .execute(req("t1", "create_order", "key-1", b"order#1"), |tx| {
                runs.set(runs.get() + 1);
                bump(tx, "order")?;
                Ok(Response::new(500, "must not be stored"))
            }),
    );
    assert_eq!(again, first);
    assert_eq!(again.body(), BODY);
    assert_eq!(runs.get(), 0, "the closure must not run after a reopen");

    h.close();
    assert_eq!(effects_in_file(&h.path, "order"), 1);
}

#[test]
fn flow_b_completion_replays_to_begin_and_to_execute() {
    let mut h = Harness::new();
    let request = req("t1", "charge", "key-1", b"amount=100");
    let lease = acquired(h.store().begin(request.clone()));
    let stored = lease
        .complete(first_response())
        .expect("complete the lease");
    assert_eq!(stored, first_response());

    assert_eq!(begin_replayed(h.store().begin(request.clone())), stored);
    let runs = Cell::new(0u32);
    let via_execute = replayed(h.store().execute(request.clone(), |_| {
        runs.set(runs.get() + 1);
        Ok(Response::new(500, "must not run"))
    }));
    assert_eq!(via_execute, stored);
    assert_eq!(runs.get(), 0);

    h.reopen();
    assert_eq!(begin_replayed(h.store().begin(request)), stored);
}

#[test]
fn the_replay_is_an_outcome_replayed_not_executed() {
    let h = Harness::new();
    let request = req("t1", "op", "key-1", b"p");
    let first = h
        .store()
        .execute(request.clone(), |_| Ok(Response::new(200, "ok")))
        .expect("first");
    let second = h
        .store()
        .execute(request, |_| Ok(Response::new(200, "ok")))
        .expect("second");
    assert!(matches!(first, ExecuteAnswer::Ran(_)));
    assert!(matches!(second, ExecuteAnswer::Replayed(_)));
    assert_eq!(first.response(), second.response());
}
