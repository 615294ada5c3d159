//! Inbox: a consumer that committed its work and crashed before the ack gets `Duplicate` on
//! redelivery (one effect); a failing closure leaves neither the mark nor its writes; marks
//! expire through the sweep.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::{Harness, bump, effects};
use idem::inbox::ProcessAnswer;
use idem::{Abort, Error};

#[test]
fn redelivery_after_a_crash_before_the_ack_is_a_duplicate() {
    let mut h = Harness::new();
    let first = h
        .store()
        .process("billing", "msg-1", |tx| {
            bump(tx, "charge")?;
            Ok("charged")
        })
        .unwrap();
    assert_eq!(first, ProcessAnswer::Ran("charged"));
    // The consumer dies before acking; the broker redelivers to a restarted process.
    h.reopen();
    let mut ran = false;
    let again = h
        .store()
        .process("billing", "msg-1", |tx| {
            ran = true;
            bump(tx, "charge")?;
            Ok("charged")
        })
        .unwrap();
    assert!(!ran, "the closure must not run for a duplicate");
    assert!(
        matches!(again, ProcessAnswer::Duplicate { processed_at, rejection: None } if processed_at == common::T0)
    );
    assert_eq!(effects(h.store(), "charge"), 1);
}

#[test]
fn subscribers_are_independent() {
    let h = Harness::new();
    for sub in ["billing", "shipping"] {
        let r = h
            .store()
            .process(sub, "msg-1", |tx| bump(tx, sub).map(|_| ()))
            .unwrap();
        assert_eq!(r, ProcessAnswer::Ran(()));
    }
    assert_eq!(effects(h.store(), "billing"), 1);
    assert_eq!(effects(h.store(), "shipping"), 1);
}

#[test]
fn a_failing_closure_leaves_neither_mark_nor_writes() {
    let h = Harness::new();
    let err = h
        .store()
        .process("billing", "msg-2", |tx| -> Result<(), Abort> {
            bump(tx, "charge")?;
            Err(Abort::retryable("broker hiccup"))
        })
        .unwrap_err();
    assert!(matches!(err, Error::Aborted { .. }));
    assert_eq!(effects(h.store(), "charge"), 0);
    assert_eq!(h.store().inbox_mark("billing", "msg-2").unwrap(), None);
    // The redelivery runs.
    let r = h
        .store()
        .process("billing", "msg-2", |tx| bump(tx, "charge"))
        .unwrap();
    assert_eq!(r, ProcessAnswer::Ran(()));
    assert_eq!(effects(h.store(), "charge"), 1);
}

/// A redelivered message whose first handling was a terminal rejection only
/// said `Duplicate`; it now carries the first handling's response (status, body, resource
/// pointer, failure flag), also after a restart, so the consumer can answer it the same way
/// (e.g. the same dead-letter reason). A successfully processed message's duplicate carries
/// none.
#[test]
fn a_redelivered_rejected_message_answers_with_the_first_rejection() {
    let mut h = Harness::new();
    let first = h
        .store()
        .process("billing", "msg-r", |tx| -> Result<(), Abort> {
            bump(tx, "audit")?;
            Err(Abort::terminal(
                idem::Response::new(422, "amount must be positive").with_resource("order", "o-7"),
            ))
        })
        .unwrap();
    let ProcessAnswer::Rejected(rejected) = first else {
        panic!("expected Rejected, got {first:?}")
    };
    assert!(rejected.is_failure());
    assert_eq!(
        h.store()
            .inbox_mark("billing", "msg-r")
            .unwrap()
            .and_then(|m| m.rejection),
        Some(rejected.clone()),
        "the mark keeps the rejection"
    );
    for restart in [false, true] {
        if restart {
            h.reopen();
        }
        let again = h
            .store()
            .process("billing", "msg-r", |tx| bump(tx, "audit"))
            .unwrap();
        assert_eq!(
            again,
            ProcessAnswer::Duplicate {
                processed_at: common::T0,
                rejection: Some(rejected.clone()),
            },
            "restart: {restart}"
        );
    }
    assert_eq!(effects(h.store(), "audit"), 1);
    // A processed message: its duplicate carries no rejection.
    h.store()
        .process("billing", "msg-ok", |tx| bump(tx, "ok"))
        .unwrap();
    let dup = h
        .store()
        .process("billing", "msg-ok", |tx| bump(tx, "ok"))
        .unwrap();
    assert!(
        matches!(
            dup,
            ProcessAnswer::Duplicate {
                rejection: None,
                ..
            }
        ),
        "{dup:?}"
    );
    h.store().check_expiry_index().unwrap();
}

/// A terminal rejection whose response is over `max_response_bytes` is still a consumed
/// message: the mark and the closure's writes commit, the first call gets the whole response,
/// and a redelivery is a duplicate answered with the rejection's status and resource pointer
/// (its body was not kept) — never a second run. (Refusing to commit it made the message a
/// poison loop: every redelivery ran the closure, and its outside effects, again.)
#[test]
fn an_oversized_rejection_is_kept_without_its_body_and_never_runs_again() {
    let h = Harness::with(|b| b.max_response_bytes(16));
    let store = h.store();
    let big = idem::Response::new(422, vec![b'x'; 17]).with_resource("order", "o-1");
    let first = store
        .process("billing", "big", |tx| -> Result<(), Abort> {
            bump(tx, "audit")?;
            Err(Abort::terminal(big.clone()))
        })
        .unwrap();
    match &first {
        ProcessAnswer::Rejected(r) => {
            assert_eq!((r.status(), r.body()), (422, &[b'x'; 17][..]));
            assert!(r.is_failure());
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(effects(store, "audit"), 1);
    for _ in 0..2 {
        let again = store
            .process("billing", "big", |tx| -> Result<(), Abort> {
                bump(tx, "audit")?;
                Ok(())
            })
            .unwrap();
        match again {
            ProcessAnswer::Duplicate {
                rejection: Some(r), ..
            } => {
                assert_eq!(r.status(), 422);
                assert!(r.body().is_empty());
                assert!(r.is_failure());
                let resource = r.resource().expect("the resource pointer is kept");
                assert_eq!(
                    (resource.kind.as_str(), resource.id.as_str()),
                    ("order", "o-1")
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(effects(store, "audit"), 1);
}

/// A mark in the 24-byte layout (what every mark was before rejections were kept, and what a
/// processed message's mark still is) reads as before: a duplicate, with no rejection.
#[test]
fn a_mark_written_before_rejections_were_kept_still_reads() {
    const INBOX: idem::redb::TableDefinition<&[u8], &[u8]> =
        idem::redb::TableDefinition::new("idem.inbox.v2");
    let mut h = Harness::new();
    h.store()
        .process("billing", "msg-old", |tx| -> Result<(), Abort> {
            bump(tx, "audit")?;
            Err(Abort::terminal(idem::Response::new(422, "bad")))
        })
        .unwrap();
    let forget_at = h
        .store()
        .inbox_mark("billing", "msg-old")
        .unwrap()
        .expect("mark")
        .forget_at;
    h.close();
    // Replace it with the mark the previous release wrote for the same rejection (docs/FORMAT.md,
    // "Inbox marks": two instants and their checksum, no response).
    {
        let mut old = Vec::new();
        old.extend_from_slice(&common::T0.as_millis().to_be_bytes());
        old.extend_from_slice(&forget_at.as_millis().to_be_bytes());
        let sum = blake3::derive_key("idem 2026-11-30 inbox mark checksum", &old);
        old.extend_from_slice(&sum[..8]);
        let db = idem::redb::Database::open(&h.path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(INBOX).unwrap();
            let key = [&[0x01u8, 0, 7][..], b"billing", b"msg-old"].concat();
            assert!(t.insert(key.as_slice(), old.as_slice()).unwrap().is_some());
        }
        txn.commit().unwrap();
    }
    h.reopen();
    let store = h.store();
    let mark = store
        .inbox_mark("billing", "msg-old")
        .unwrap()
        .expect("mark");
    assert_eq!(
        (mark.processed_at, mark.forget_at, mark.rejection),
        (common::T0, forget_at, None)
    );
    let again = store
        .process("billing", "msg-old", |tx| bump(tx, "audit"))
        .unwrap();
    assert_eq!(
        again,
        ProcessAnswer::Duplicate {
            processed_at: common::T0,
            rejection: None
        }
    );
    assert_eq!(effects(store, "audit"), 1);
    store.check_expiry_index().unwrap();
}

#[test]
fn a_terminal_rejection_consumes_the_message() {
    let h = Harness::new();
    let r = h
        .store()
        .process("billing", "msg-3", |tx| -> Result<(), Abort> {
            bump(tx, "audit")?;
            Err(Abort::terminal(idem::Response::new(422, "bad order")))
        })
        .unwrap();
    assert!(matches!(r, ProcessAnswer::Rejected(ref resp) if resp.status() == 422));
    assert_eq!(effects(h.store(), "audit"), 1);
    let again = h
        .store()
        .process("billing", "msg-3", |tx| bump(tx, "audit"))
        .unwrap();
    assert!(matches!(again, ProcessAnswer::Duplicate { .. }));
}

#[test]
fn marks_are_swept_after_the_inbox_retention() {
    let h = Harness::with(|b| b.inbox_retention(Duration::from_secs(3600)));
    let store = h.store();
    store.process("billing", "old", |tx| bump(tx, "e")).unwrap();
    store.check_expiry_index().unwrap();
    h.clock.advance(Duration::from_secs(3599));
    assert_eq!(store.sweep().unwrap().deleted, 0);
    assert!(store.inbox_mark("billing", "old").unwrap().is_some());
    h.clock.advance(Duration::from_secs(1));
    let report = store.sweep().unwrap();
    assert_eq!(report.deleted, 1);
    assert_eq!(store.inbox_mark("billing", "old").unwrap(), None);
    store.check_expiry_index().unwrap();
    // Past the retention the message counts as new again.
    let r = store.process("billing", "old", |tx| bump(tx, "e")).unwrap();
    assert_eq!(r, ProcessAnswer::Ran(()));
}

#[test]
fn concurrent_redeliveries_have_one_effect() {
    let h = Harness::new();
    let store = h.store();
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    store
                        .process("billing", "hot", |tx| bump(tx, "hot"))
                        .unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let processed = outcomes
        .iter()
        .filter(|o| matches!(o, ProcessAnswer::Ran(())))
        .count();
    assert_eq!(processed, 1);
    assert_eq!(effects(store, "hot"), 1);
}

#[test]
fn subscriber_and_message_id_are_validated() {
    let h = Harness::new();
    let e = h.store().process("", "m", |_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::Empty { .. }));
    let e = h.store().process("s", "", |_| Ok(())).unwrap_err();
    assert!(matches!(e, Error::Empty { .. }));
    let e = h
        .store()
        .process("s", vec![b'x'; 300], |_| Ok(()))
        .unwrap_err();
    assert!(matches!(e, Error::TooLong { .. }));
}

/// A mark whose bytes changed on disk (or of the wrong length) is `CorruptRecord`: the message
/// is neither processed again nor acknowledged as a duplicate. `purge_inbox_mark` is the
/// operator's way out: the message then runs again, once.
#[test]
fn a_damaged_mark_is_an_error_not_a_second_processing() {
    use idem::redb::ReadableTable;
    const INBOX: idem::redb::TableDefinition<&[u8], &[u8]> =
        idem::redb::TableDefinition::new("idem.inbox.v2");
    let mut h = Harness::new();
    h.store()
        .process("billing", "msg-1", |tx| {
            bump(tx, "charge").map(|()| "charged")
        })
        .unwrap();
    h.store()
        .process("billing", "msg-2", |tx| {
            bump(tx, "other").map(|()| "charged")
        })
        .unwrap();
    h.close();
    // Flip one bit of msg-1's mark, behind the store's back.
    {
        let db = idem::redb::Database::open(&h.path).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(INBOX).unwrap();
            let key = [&[0x01u8, 0, 7][..], b"billing", b"msg-1"].concat();
            let mut value = t.get(key.as_slice()).unwrap().unwrap().value().to_vec();
            assert_eq!(value.len(), 24, "two instants and a checksum");
            value[9] ^= 0x01;
            t.insert(key.as_slice(), value.as_slice()).unwrap();
        }
        txn.commit().unwrap();
    }
    h.reopen();
    let store = h.store();
    let mut ran = false;
    let got = store.process("billing", "msg-1", |tx| {
        ran = true;
        bump(tx, "charge").map(|()| "charged")
    });
    assert!(matches!(got, Err(Error::CorruptRecord { .. })), "{got:?}");
    assert!(!ran, "a damaged mark must not let the message run again");
    assert!(matches!(
        store.inbox_mark("billing", "msg-1"),
        Err(Error::CorruptRecord { .. })
    ));
    // Other messages are unaffected; a sweep leaves the damaged mark in place.
    assert!(matches!(
        store.process("billing", "msg-2", |_| Ok("again")).unwrap(),
        ProcessAnswer::Duplicate { .. }
    ));
    store.sweep().unwrap();
    assert!(store.process("billing", "msg-1", |_| Ok("x")).is_err());
    store.check_expiry_index().unwrap();
    // The operator decides the message may run again.
    assert!(store.purge_inbox_mark("billing", "msg-1").unwrap());
    assert!(!store.purge_inbox_mark("billing", "msg-1").unwrap());
    let again = store
        .process("billing", "msg-1", |tx| {
            bump(tx, "charge").map(|()| "charged")
        })
        .unwrap();
    assert_eq!(again, ProcessAnswer::Ran("charged"));
    assert_eq!(effects(store, "charge"), 2);
    // (The clock did not move, so the new mark's index entry is the one the damaged mark left;
    // otherwise that entry would be an orphan until a sweep repairs it, as for a purged record.)
    store.check_expiry_index().unwrap();
}

/// The webhook twin of `purge_inbox_mark`: a purged receipt lets the delivery run again.
#[test]
fn a_purged_webhook_receipt_runs_again() {
    let h = Harness::new();
    let s = h.store();
    let hook = |tx: &idem::Tx<'_>| bump(tx, "hook");
    assert!(matches!(
        s.receive("github", "d-1", hook).unwrap(),
        idem::inbox::ReceiveAnswer::Ran(())
    ));
    assert!(matches!(
        s.receive("github", "d-1", hook).unwrap(),
        idem::inbox::ReceiveAnswer::Duplicate { .. }
    ));
    assert!(s.purge_webhook_receipt("github", "d-1").unwrap());
    assert!(
        !s.purge_inbox_mark("github", "d-1").unwrap(),
        "namespaces differ"
    );
    assert!(matches!(
        s.receive("github", "d-1", hook).unwrap(),
        idem::inbox::ReceiveAnswer::Ran(())
    ));
    assert_eq!(effects(s, "hook"), 2);
    s.check_expiry_index().unwrap();
}
