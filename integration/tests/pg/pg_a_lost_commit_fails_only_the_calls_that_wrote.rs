//! A batch whose connection is lost at its `COMMIT`: only the members whose answer depends on
//! that commit learn nothing (`Error::OutcomeUnknown`). A member that wrote nothing and read
//! nothing the batch wrote — a replay, a mismatch, an in-flight answer, a lease call that found
//! its lease lost — already knows its answer from the rows as they were committed before the
//! batch opened, and gets it. A member that read what an earlier member of the same batch wrote
//! is as unknown as that write.
//!
//! Batches are formed deterministically: one store with a single writer lane, a gate call that
//! holds the lane while the members queue one by one (`PgStore::queued_for_commit`), and the
//! white-box hook `PgStore::on_commit` that terminates the batch's backend at its commit, before
//! or after the `COMMIT` ran (`__internal_whitebox`, NOT PUBLIC API).
//!
//! Needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when `IDEM_REQUIRE_PG`
//! or `CI` is set).

#![cfg(feature = "postgres")]
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::sync::mpsc;
use std::thread::{Scope as ThreadScope, ScopedJoinHandle};
use std::time::Duration;

use common::pg::PgHarness;
use idem::postgres::{CommitLoss, PgStore};
use idem::{BeginAnswer, Error, ExecuteAnswer, Request, Response, Scope};

fn req(key: &str, payload: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("t", "lost-commit"), key, payload.as_bytes())
}

/// What a call answered, as a word (so a batch's answers compare as one list).
fn word<T: std::fmt::Debug>(
    result: &Result<T, Error>,
    answer: impl Fn(&T) -> &'static str,
) -> String {
    match result {
        Ok(v) => answer(v).to_owned(),
        Err(Error::OutcomeUnknown { .. }) => "outcome-unknown".to_owned(),
        Err(Error::PayloadMismatch { .. }) => "mismatch".to_owned(),
        Err(Error::LeaseLost { .. }) => "lease-lost".to_owned(),
        Err(other) => format!("error {other:?}"),
    }
}

fn outcome_word(result: &Result<ExecuteAnswer, Error>) -> String {
    word(result, |o| match o {
        ExecuteAnswer::Ran(_) => "executed",
        ExecuteAnswer::Replayed(_) => "replayed",
        ExecuteAnswer::InFlight { .. } => "in-flight",
        ExecuteAnswer::Expired(_) => "expired",
    })
}

fn begin_word<L: std::fmt::Debug>(result: &Result<BeginAnswer<L>, Error>) -> String {
    word(result, |b| match b {
        BeginAnswer::Acquired(_) => "acquired",
        BeginAnswer::Replayed(_) => "replayed",
        BeginAnswer::InFlight { .. } => "in-flight",
        BeginAnswer::Expired(_) => "expired",
    })
}

/// A call of a batch under test, answering its word.
type Call<'e> = Box<dyn FnOnce() -> String + Send + 'e>;

/// Holds the store's only writer lane with a call whose closure waits, queues `calls` behind it
/// one at a time (queue order is list order: they form the next batch, in that order), makes
/// the commit of a batch of exactly `calls.len()` members fail as `loss` says, releases the
/// gate, and returns every call's word in list order.
fn lose_the_commit_of<'e>(
    store: &'e PgStore,
    loss: CommitLoss,
    calls: Vec<Call<'e>>,
) -> Vec<String> {
    let members = calls.len();
    std::thread::scope(|s| {
        let (release, gate) = gate(s, store);
        let handles: Vec<ScopedJoinHandle<'_, String>> = calls
            .into_iter()
            .enumerate()
            .map(|(i, call)| {
                let handle = s.spawn(call);
                wait_for_queue(store, i + 1);
                handle
            })
            .collect();
        store.on_commit(move |n| (n == members).then_some(loss));
        release.send(()).expect("the gate waits");
        assert_eq!(
            outcome_word(&gate.join().expect("the gate's thread")),
            "executed",
            "the gate's own batch commits"
        );
        let words = handles
            .into_iter()
            .map(|h| h.join().expect("a member's thread"))
            .collect();
        store.on_commit(|_| None);
        words
    })
}

/// Runs a call whose closure holds the writer lane until the returned sender is used.
fn gate<'s, 'e>(
    s: &'s ThreadScope<'s, 'e>,
    store: &'e PgStore,
) -> (
    mpsc::Sender<()>,
    ScopedJoinHandle<'s, Result<ExecuteAnswer, Error>>,
) {
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let handle = s.spawn(move || {
        let mut first = true;
        store.execute(req("gate", "p"), |_| {
            if std::mem::take(&mut first) {
                held_tx.send(()).expect("the test waits");
                release_rx.recv().expect("released");
            }
            Ok(Response::new(200, "gate"))
        })
    });
    held_rx.recv().expect("the gate holds the writer lane");
    (release_tx, handle)
}

/// Waits (bounded) until `n` callers of `store` are queued for its next batch.
fn wait_for_queue(store: &PgStore, n: usize) {
    for _ in 0..20_000 {
        if store.queued_for_commit() >= n {
            return;
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    panic!("callers never queued: {} of {n}", store.queued_for_commit());
}

#[test]
fn calls_that_only_read_get_their_answers_when_their_batch_loses_its_commit() {
    let Some(h) = PgHarness::with("onlyread", |b| b.writers(1)) else {
        return;
    };
    let store = h.store();
    // What the readers will find, committed before their batch opens.
    assert_eq!(
        outcome_word(&store.execute(req("done", "p"), |_| Ok(Response::new(201, "done")))),
        "executed"
    );
    let Ok(BeginAnswer::Acquired(held)) = store.begin(req("held", "p")) else {
        panic!("the key is free")
    };
    let Ok(BeginAnswer::Acquired(lost)) = store.begin(req("lost", "p")) else {
        panic!("the key is free")
    };
    assert!(
        store
            .purge(&Scope::new("t", "lost-commit"), "lost")
            .expect("purge")
    );

    let mut lost = lost;
    let words = lose_the_commit_of(
        store,
        CommitLoss::AfterItRan,
        vec![
            // The one member that writes.
            Box::new(|| {
                outcome_word(&store.execute(req("new", "p"), |_| Ok(Response::new(201, "new"))))
            }),
            Box::new(|| {
                outcome_word(&store.execute(req("done", "p"), |_| panic!("a finished intent runs")))
            }),
            Box::new(|| {
                outcome_word(
                    &store.execute(req("done", "other payload"), |_| panic!("a mismatch runs")),
                )
            }),
            Box::new(|| begin_word(&store.begin(req("held", "p")))),
            Box::new(move || word(&lost.heartbeat(), |_| "heartbeat")),
        ],
    );
    assert_eq!(
        words,
        [
            "outcome-unknown",
            "replayed",
            "mismatch",
            "in-flight",
            "lease-lost"
        ],
        "only the member that wrote may not know its answer"
    );
    // The commit did land: the writer's retry replays.
    assert_eq!(
        outcome_word(&store.execute(req("new", "p"), |_| panic!("runs again"))),
        "replayed"
    );
    held.release().expect("release");
}

#[test]
fn a_read_of_what_an_earlier_member_of_a_lost_batch_wrote_is_an_unknown_outcome() {
    let Some(h) = PgHarness::with("readwritten", |b| b.writers(1)) else {
        return;
    };
    let store = h.store();
    assert_eq!(
        outcome_word(&store.execute(req("done", "p"), |_| Ok(Response::new(201, "done")))),
        "executed"
    );
    let words = lose_the_commit_of(
        store,
        CommitLoss::BeforeItRuns,
        vec![
            Box::new(|| {
                outcome_word(&store.execute(req("k", "p"), |_| Ok(Response::new(201, "k"))))
            }),
            // Replays the record the first member wrote in this batch.
            Box::new(|| outcome_word(&store.execute(req("k", "p"), |_| panic!("runs twice")))),
            // Mismatches it.
            Box::new(|| outcome_word(&store.execute(req("k", "q"), |_| panic!("a mismatch runs")))),
            Box::new(|| begin_word(&store.begin(req("j", "p")))),
            // Sees the lease the member before it claimed in this batch.
            Box::new(|| {
                outcome_word(&store.execute(req("j", "p"), |_| panic!("runs under a lease")))
            }),
            // Reads only what was committed before the batch.
            Box::new(|| outcome_word(&store.execute(req("done", "p"), |_| panic!("runs again")))),
        ],
    );
    assert_eq!(
        words,
        [
            "outcome-unknown",
            "outcome-unknown",
            "outcome-unknown",
            "outcome-unknown",
            "outcome-unknown",
            "replayed"
        ],
        "a member that read the batch's own writes depends on its commit"
    );
    // Nothing landed: "replayed" for the second member would have been false.
    assert!(
        store
            .get(&Scope::new("t", "lost-commit"), "k")
            .expect("get")
            .is_none()
    );
    assert_eq!(
        outcome_word(&store.execute(req("k", "p"), |_| Ok(Response::new(201, "k")))),
        "executed"
    );
    assert_eq!(begin_word(&store.begin(req("j", "p"))), "acquired");
}
