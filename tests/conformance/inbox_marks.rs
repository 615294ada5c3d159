//! The inbox: what each way a handler ends leaves behind (a mark with its writes, a mark
//! keeping the rejection, or nothing), and how long a mark answers `Duplicate`.

use std::time::Duration;

use idem::Error;
use idem::Response;
use idem::inbox::ProcessAnswer;

use super::*;
use crate::common::T0;

/// `Ok` → `ProcessAnswer` with the writes, and the redelivery is a `Duplicate` without a
/// rejection. `Terminal` → `Rejected`, its writes committed and the mark keeps the rejection,
/// which the redelivery carries. `Retryable` → `Aborted`, no mark and no writes, and the
/// redelivery runs.
pub fn inbox_ok_terminal_and_retryable<E: Engine>(e: &mut E) {
    let ok = Behavior::answer(Response::new(200, "applied")).effect("ok");
    assert_eq!(
        e.process("billing", "m-ok", &ok).expect("process"),
        ProcessAnswer::Ran(Response::new(200, "applied"))
    );
    let mark = e
        .inbox_mark("billing", "m-ok")
        .expect("mark")
        .expect("a mark");
    assert_eq!((mark.processed_at, mark.rejection), (T0, None));
    assert!(matches!(
        e.process("billing", "m-ok", &ok).expect("redelivery"),
        ProcessAnswer::Duplicate { processed_at, rejection: None } if processed_at == T0
    ));
    assert_eq!((ok.runs(), e.effects("ok")), (1, 1));

    let reject = Behavior::terminal(
        Response::new(422, "amount must be positive").with_resource("order", "o-7"),
    )
    .effect("audit");
    let ProcessAnswer::Rejected(rejected) =
        e.process("billing", "m-bad", &reject).expect("process")
    else {
        panic!("expected Rejected")
    };
    assert!(rejected.is_failure());
    assert_eq!(
        (rejected.status(), rejected.body()),
        (422, &b"amount must be positive"[..])
    );
    assert_eq!(e.effects("audit"), 1, "a rejection's writes commit");
    assert_eq!(
        e.inbox_mark("billing", "m-bad")
            .expect("mark")
            .and_then(|m| m.rejection),
        Some(rejected.clone())
    );
    match e.process("billing", "m-bad", &ok).expect("redelivery") {
        ProcessAnswer::Duplicate {
            rejection: Some(r), ..
        } => assert_eq!(r, rejected),
        other => panic!("expected a Duplicate carrying the rejection, got {other:?}"),
    }
    assert_eq!(reject.runs(), 1);

    let flaky = Behavior::retryable().effect("flaky");
    assert!(matches!(
        e.process("billing", "m-retry", &flaky),
        Err(Error::Aborted { .. })
    ));
    assert_eq!(
        e.inbox_mark("billing", "m-retry").expect("mark"),
        None,
        "no mark"
    );
    assert_eq!(e.effects("flaky"), 0, "no writes");
    let fixed = Behavior::answer(Response::new(200, "applied")).effect("flaky");
    assert!(matches!(
        e.process("billing", "m-retry", &fixed),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert_eq!((fixed.runs(), e.effects("flaky")), (1, 1));
}

/// A mark answers `Duplicate` until `processed_at + inbox_retention` (exclusive); from then on
/// the message counts as never seen, with or without a sweep, and the sweep deletes the mark.
pub fn inbox_mark_is_forgotten_after_the_inbox_retention<E: Engine>(e: &mut E) {
    let handle = Behavior::answer(Response::new(200, "applied")).effect("applied");
    for id in ["swept", "swept-too"] {
        assert!(matches!(
            e.process("billing", id, &handle),
            Ok(ProcessAnswer::Ran(_))
        ));
        let mark = e.inbox_mark("billing", id).expect("mark").expect("a mark");
        assert_eq!(mark.forget_at, T0.saturating_add(INBOX_RETENTION));
    }

    e.advance(INBOX_RETENTION - MS);
    assert!(matches!(
        e.process("billing", "swept", &handle),
        Ok(ProcessAnswer::Duplicate { .. })
    ));
    assert_eq!(
        e.sweep().expect("sweep").deleted,
        0,
        "a live mark is not swept"
    );
    assert!(e.inbox_mark("billing", "swept").expect("mark").is_some());

    e.advance(MS);
    assert_eq!(
        e.sweep().expect("sweep").deleted,
        2,
        "both marks are past their retention"
    );
    assert_eq!(e.inbox_mark("billing", "swept").expect("mark"), None);
    assert!(matches!(
        e.process("billing", "swept", &handle),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert_eq!(
        (handle.runs(), e.effects("applied")),
        (3, 3),
        "the forgotten message ran again"
    );

    // A mark past its retention that no sweep removed counts as absent as well.
    let late = Behavior::answer(Response::new(200, "late")).effect("late");
    assert!(matches!(
        e.process("billing", "late-1", &late),
        Ok(ProcessAnswer::Ran(_))
    ));
    e.advance(INBOX_RETENTION + Duration::from_secs(1));
    assert!(
        e.inbox_mark("billing", "late-1").expect("mark").is_some(),
        "not swept yet"
    );
    assert!(matches!(
        e.process("billing", "late-1", &late),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert_eq!(e.effects("late"), 2);
}

/// Purging a mark lets the message run again (once more), and marks are not records: stats
/// count none of them.
pub fn purging_an_inbox_mark_lets_the_message_run_again<E: Engine>(e: &mut E) {
    let handle = Behavior::answer(Response::new(200, "applied")).effect("applied");
    assert!(matches!(
        e.process("billing", "m-1", &handle),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert!(matches!(
        e.receive("github", "m-1", &handle),
        Ok(idem::inbox::ReceiveAnswer::Ran(_))
    ));
    assert_eq!(
        e.stats().expect("stats").records,
        0,
        "marks and receipts are not records"
    );
    assert!(e.purge_inbox_mark("billing", "m-1").expect("purge"));
    assert!(!e.purge_inbox_mark("billing", "m-1").expect("purge again"));
    assert!(matches!(
        e.process("billing", "m-1", &handle),
        Ok(ProcessAnswer::Ran(_))
    ));
    assert!(matches!(
        e.process("billing", "m-1", &handle),
        Ok(ProcessAnswer::Duplicate { .. })
    ));
    assert!(
        matches!(
            e.receive("github", "m-1", &handle),
            Ok(idem::inbox::ReceiveAnswer::Duplicate { .. })
        ),
        "a webhook receipt is not an inbox mark"
    );
    assert_eq!((handle.runs(), e.effects("applied")), (3, 3));
}
