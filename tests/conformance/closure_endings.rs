//! How a closure ends decides what commits: a retryable abort, a failed statement or a panic
//! leave nothing (no record, none of its writes, the key free, the store working); a terminal
//! abort is a recorded failure with its writes; and a replay is the first answer even after
//! the state it described changed.

use std::panic::{AssertUnwindSafe, catch_unwind};

use idem::format::State;
use idem::inbox::ProcessAnswer;
use idem::outbox::Event;
use idem::{Error, Response, Scope};

use super::*;

/// `Abort::Retryable` → `Error::Aborted`, a failed statement of the caller's → `Error::Storage`:
/// for `execute`, `complete_with` (the lease is released) and `process`, no record or mark,
/// the effect and the pushed event rolled back, and the retry runs and commits.
pub fn retryable_and_store_errors_store_nothing_and_free_the_key<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create");
    for (name, failing) in [
        ("retryable", Behavior::retryable()),
        ("store", Behavior::store_error()),
    ] {
        let failing = failing
            .effect(name)
            .push(Event::new("topic", name.as_bytes().to_vec()));
        let key = format!("k-{name}");
        fails_as(name, e.execute(req("t1", "create", &key, b"p"), &failing));
        assert_eq!(e.get(&scope, &key).expect("get"), None, "{name}: no record");

        let lease = acquired(e.begin(req("t1", "charge", &key, b"p")));
        fails_as(name, lease.complete_with(&failing));
        assert_eq!(
            e.get(&Scope::new("t1", "charge"), &key).expect("get"),
            None,
            "{name}: released"
        );

        fails_as(name, e.process("billing", &key, &failing));
        assert_eq!(
            e.inbox_mark("billing", &key).expect("mark"),
            None,
            "{name}: no mark"
        );

        assert_eq!(e.effects(name), 0, "{name}: the writes were rolled back");
        assert_eq!(
            e.outbox_stats().expect("stats").pending,
            0,
            "{name}: no event"
        );
        assert!(failing.runs() >= 3);

        let fixed = Behavior::answer(Response::new(201, "created")).effect(name);
        executed(e.execute(req("t1", "create", &key, b"p"), &fixed));
        acquired(e.begin(req("t1", "charge", &key, b"p")))
            .complete_with(&fixed)
            .expect("complete_with");
        assert!(matches!(
            e.process("billing", &key, &fixed),
            Ok(ProcessAnswer::Ran(_))
        ));
        assert_eq!(e.effects(name), 3, "{name}: the retries ran and committed");
    }
}

/// Asserts the error a `retryable` or `store` failure gives.
#[track_caller]
fn fails_as<T: std::fmt::Debug>(name: &str, result: Result<T, Error>) {
    match (name, result) {
        ("retryable", Err(Error::Aborted { .. })) | ("store", Err(Error::Storage { .. })) => {}
        (name, other) => panic!("{name}: unexpected {other:?}"),
    }
}

/// A panic in the closure unwinds to the caller; nothing is stored (no record, no mark, no
/// writes), the key is free (a lease whose `complete_with` panicked is released), and the
/// store keeps working.
pub fn panic_unwinds_to_the_caller_and_stores_nothing<E: Engine>(e: &mut E) {
    let scope = Scope::new("t1", "create");
    let boom = Behavior::panic().effect("boom");
    let r = catch_unwind(AssertUnwindSafe(|| {
        e.execute(req("t1", "create", "k", b"p"), &boom)
    }));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(e.get(&scope, "k").expect("get"), None);

    let lease = acquired(e.begin(req("t1", "charge", "k", b"p")));
    let r = catch_unwind(AssertUnwindSafe(|| lease.complete_with(&boom)));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(
        e.get(&Scope::new("t1", "charge"), "k").expect("get"),
        None,
        "the lease was released"
    );

    let r = catch_unwind(AssertUnwindSafe(|| e.process("billing", "m", &boom)));
    assert!(r.is_err(), "the panic reaches the caller");
    assert_eq!(e.inbox_mark("billing", "m").expect("mark"), None);
    assert_eq!(
        (boom.runs(), e.effects("boom")),
        (3, 0),
        "nothing of the panicked runs commits"
    );

    let fixed = Behavior::answer(Response::new(201, "created")).effect("boom");
    executed(e.execute(req("t1", "create", "k", b"p"), &fixed));
    let lease = acquired(e.begin(req("t1", "charge", "k", b"p")));
    assert_eq!(lease.attempt(), 1);
    lease.complete_with(&fixed).expect("complete_with");
    assert!(matches!(
        e.process("billing", "m", &fixed),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert_eq!(e.effects("boom"), 3, "the store still works");
}

/// `Abort::Terminal` → `Ran` with `is_failure`, the record Failed, the closure's writes
/// committed; every retry replays the failure (`execute` and `begin`) without running.
pub fn terminal_abort_is_a_failure_with_its_writes_committed<E: Engine>(e: &mut E) {
    let decline =
        Behavior::terminal(Response::new(402, "card declined").with_resource("attempt", "a_1"))
            .effect("declines");
    let first = executed(e.execute(req("t1", "charge", "c-1", b"amount=10"), &decline));
    assert!(first.is_failure());
    assert_eq!((first.status(), first.body()), (402, &b"card declined"[..]));
    assert_eq!(
        e.effects("declines"),
        1,
        "the terminal run's writes committed"
    );
    let record = e
        .get(&Scope::new("t1", "charge"), "c-1")
        .expect("get")
        .expect("record");
    assert!(
        matches!(record.state, State::Failed(_)),
        "{:?}",
        record.state
    );

    let would_succeed = Behavior::answer(Response::new(200, "charged")).effect("declines");
    let again = replayed(e.execute(req("t1", "charge", "c-1", b"amount=10"), &would_succeed));
    assert_eq!(again, first);
    assert!(again.is_failure());
    assert_eq!(
        begin_replayed(e.begin(req("t1", "charge", "c-1", b"amount=10"))),
        first
    );
    assert_eq!(
        (decline.runs(), would_succeed.runs(), e.effects("declines")),
        (1, 0, 1)
    );

    // The same through a lease: `fail`.
    let lease = acquired(e.begin(req("t1", "charge", "c-2", b"amount=10")));
    let failed = lease.fail(Response::new(402, "declined")).expect("fail");
    assert!(failed.is_failure());
    assert!(begin_replayed(e.begin(req("t1", "charge", "c-2", b"amount=10"))).is_failure());
}

/// The replay is the first answer, byte for byte, even after the resource row it described
/// changed (another intent bumped it): a replay never re-reads the state.
pub fn replay_is_the_first_answer_after_the_state_changed<E: Engine>(e: &mut E) {
    let first = executed(
        e.execute(
            req("t1", "deposit", "d-1", b"amount=1"),
            &Behavior::answer(Response::new(201, "balance=1").with_resource("account", "acc_1"))
                .effect("balance"),
        ),
    );
    executed(
        e.execute(
            req("t1", "deposit", "d-2", b"amount=1"),
            &Behavior::answer(Response::new(201, "balance=2").with_resource("account", "acc_1"))
                .effect("balance"),
        ),
    );
    assert_eq!(e.effects("balance"), 2, "the state changed");
    let now = Behavior::answer(Response::new(201, "balance=3")).effect("balance");
    assert_eq!(
        replayed(e.execute(req("t1", "deposit", "d-1", b"amount=1"), &now)),
        first
    );
    assert_eq!(
        replayed(e.execute(req("t1", "deposit", "d-1", b"amount=1"), &now)).body(),
        b"balance=1"
    );
    assert_eq!((now.runs(), e.effects("balance")), (0, 2));
}

/// A response over `max_response_bytes` (64 KiB by default) is refused with
/// `ResponseTooLarge`: nothing is stored, the writes roll back, the lease whose `complete`
/// was refused is released. An inbox rejection that large still consumes the message: the
/// caller gets the whole response, the mark keeps it without its body.
pub fn oversized_responses_are_refused_and_rejections_are_kept_fitted<E: Engine>(e: &mut E) {
    let big = || Response::new(200, vec![b'x'; 64 * 1024 + 1]).with_resource("blob", "b1");
    let scope = Scope::new("t1", "upload");
    let upload = Behavior::answer(big()).effect("uploads");
    let r = e.execute(req("t1", "upload", "u-1", b"p"), &upload);
    assert!(matches!(r, Err(Error::ResponseTooLarge { .. })), "{r:?}");
    assert_eq!(e.get(&scope, "u-1").expect("get"), None);
    assert_eq!(e.effects("uploads"), 0);

    let lease = acquired(e.begin(req("t1", "upload", "u-2", b"p")));
    let r = lease.complete(big());
    assert!(matches!(r, Err(Error::ResponseTooLarge { .. })), "{r:?}");
    assert_eq!(
        e.get(&scope, "u-2").expect("get"),
        None,
        "the lease was released"
    );

    let reject = Behavior::terminal(big()).effect("rejections");
    let ProcessAnswer::Rejected(whole) = e.process("billing", "m-big", &reject).expect("process")
    else {
        panic!("expected Rejected")
    };
    assert_eq!(
        whole.body().len(),
        64 * 1024 + 1,
        "the caller gets the whole response"
    );
    let kept = e
        .inbox_mark("billing", "m-big")
        .expect("mark")
        .and_then(|m| m.rejection)
        .expect("kept");
    assert_eq!(
        (kept.status(), kept.body(), kept.is_failure()),
        (200, &b""[..], true)
    );
    assert_eq!(kept.resource().map(|r| r.id.as_str()), Some("b1"));
    assert_eq!(e.effects("rejections"), 1);
}

/// The failure flag follows the stored state: a failed response passed to `complete` (or
/// answered `Ok`) is recorded and replayed as a success.
pub fn failure_flag_follows_the_stored_state<E: Engine>(e: &mut E) {
    let failed = executed(e.execute(
        req("t1", "charge", "f-1", b"p"),
        &Behavior::terminal(Response::new(402, "declined")),
    ));
    assert!(failed.is_failure());
    let lease = acquired(e.begin(req("t1", "charge", "f-2", b"p")));
    assert!(
        !lease
            .complete(failed.clone())
            .expect("complete")
            .is_failure()
    );
    assert!(!begin_replayed(e.begin(req("t1", "charge", "f-2", b"p"))).is_failure());
    let ok = executed(e.execute(req("t1", "charge", "f-3", b"p"), &Behavior::answer(failed)));
    assert!(!ok.is_failure());
    assert!(
        !replayed(e.execute(req("t1", "charge", "f-3", b"p"), &Behavior::panic())).is_failure()
    );
}

/// Concurrent callers (8 threads at a barrier, 5 rounds: the engines group-commit them) whose
/// closures end in every way: each caller gets its own outcome — the answering ones `Ran` with their
/// effect committed, the failing ones their error (or their panic) with nothing stored — and
/// no caller's failure changes a neighbour's outcome.
pub fn a_failing_caller_leaves_its_neighbours_outcomes_alone<E: Engine>(e: &mut E) {
    const THREADS: usize = 8;
    let e = &*e;
    for round in 0..5 {
        let barrier = std::sync::Barrier::new(THREADS);
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let barrier = &barrier;
                s.spawn(move || {
                    let label = format!("n-{round}-{i}");
                    let b = match (i + round) % 4 {
                        0 => Behavior::retryable(),
                        1 => Behavior::store_error(),
                        2 => Behavior::panic(),
                        _ => Behavior::answer(Response::new(200, label.clone())),
                    }
                    .effect(&label);
                    barrier.wait();
                    let request = req("t1", "batch", &label, b"p");
                    let r = catch_unwind(AssertUnwindSafe(|| e.execute(request, &b)));
                    match ((i + round) % 4, r) {
                        (0, Ok(Err(Error::Aborted { .. })))
                        | (1, Ok(Err(Error::Storage { .. })))
                        | (2, Err(_)) => {
                            assert_eq!(e.effects(&label), 0, "{label}: nothing committed");
                            assert_eq!(
                                e.get(&Scope::new("t1", "batch"), &label).expect("get"),
                                None
                            );
                        }
                        (3, Ok(Ok(idem::ExecuteAnswer::Ran(r)))) => {
                            assert_eq!(r.body(), label.as_bytes());
                            assert_eq!(e.effects(&label), 1, "{label}: committed once");
                        }
                        (kind, other) => panic!("{label} (kind {kind}): unexpected {other:?}"),
                    }
                });
            }
        });
    }
}
