//! A full disk during a checkpoint, on the simulated disk (docs/design.md, "The crash argument,
//! point by point", "A full disk during a checkpoint"): the journal never grows, so frames, syncs
//! and answers do not depend on free space; the checkpoint's durable redb commit fails when the
//! store file cannot be written, which latches fail-stop. No answered claim is lost: a reopen
//! while the disk is still full fails and changes nothing; once there is space, every answered
//! key replays.

use crate::common;

use common::*;
use idem::{Error, ExecuteAnswer, Response, Store, StoreBuilder};

/// Frames of this many bytes make a checkpoint due.
const CHECKPOINT: u64 = 16 << 10;

fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true)
        .journal_table(EFFECTS)
        .journal_capacity(64 << 10)
        .checkpoint_bytes(CHECKPOINT)
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

#[test]
fn journal_full_disk_during_checkpoint_loses_no_answered_claim() {
    let pair = CountingPair::new();
    let store = journaled(Store::builder())
        .open_with_backends(pair.store.clone(), pair.journal.clone())
        .expect("open");
    // A few claims first: redb writes the store file once early on (the second commit after the
    // open writes and syncs it), before any checkpoint is due.
    let mut answered = Vec::new();
    for i in 0..3 {
        let key = format!("w{i}");
        assert!(matches!(claim(&store, &key), Ok(ExecuteAnswer::Ran(_))));
        answered.push(key);
    }
    // The store file is full from here on: every write (and sync) of it fails. Journaled claims
    // do not write it; the first that does is the checkpoint's durable commit.
    pair.store.fail_at(0, true);
    let mut failed = None;
    for i in 0..1_000 {
        let key = format!("f{i:03}");
        let frame_bytes: u64 = pair
            .journal_writes()
            .iter()
            .map(|(_, b)| b.len() as u64)
            .sum();
        match claim(&store, &key) {
            Ok(ExecuteAnswer::Ran(_)) => answered.push(key),
            Ok(other) => panic!("{key}: {other:?}"),
            Err(e) => {
                failed = Some((key, e, frame_bytes));
                break;
            }
        }
    }
    let (key, error, frame_bytes) = failed.expect("a checkpoint met the full disk");
    assert!(
        pair.store.injected() >= 1,
        "the store file was never written"
    );
    assert!(
        frame_bytes >= CHECKPOINT,
        "{key} failed before a checkpoint was due ({frame_bytes} frame bytes): {error}"
    );
    assert!(
        matches!(error, Error::OutcomeUnknown { .. } | Error::Storage { .. }),
        "{key}: {error:?}"
    );
    let cause = store.fail_stop_cause().expect("the store fail-stopped");
    let later = claim(&store, "later");
    assert!(later.is_err(), "a claim after the fail-stop: {later:?}");
    eprintln!(
        "full disk: {} claims answered, the checkpoint's commit at {key} failed ({error}); fail-stop: {cause}",
        answered.len()
    );
    assert!(answered.len() >= 10, "{} claims answered", answered.len());

    // The crash (or the process ending) while the disk is full.
    let (db, jr) = pair.crash();
    drop(store);
    let (db_image, jr_image) = (db.durable_image(), jr.durable_image());

    // A reopen while the disk is still full fails, and changes nothing.
    let full = CountingBackend {
        inner: crash_backend_from_image(db_image.clone()),
        ..CountingBackend::default()
    };
    full.fail_at(0, true);
    let journal = crash_backend_from_image(jr_image.clone());
    let refused = journaled(Store::builder()).open_with_backends(full.clone(), journal.clone());
    assert!(refused.is_err(), "opened on a full disk");
    assert_eq!(
        full.inner.durable_image(),
        db_image,
        "the store file changed"
    );
    assert_eq!(journal.durable_image(), jr_image, "the journal changed");

    // Once there is space: every answered key replays, its effect once.
    let reopened = journaled(Store::builder())
        .open_with_backends(
            crash_backend_from_image(db_image),
            crash_backend_from_image(jr_image),
        )
        .expect("the reopen with space");
    for k in &answered {
        assert_eq!(
            replayed(claim(&reopened, k)).body(),
            k.as_bytes(),
            "{k} was answered before the disk filled"
        );
        assert_eq!(effects(&reopened, k), 1, "{k}");
    }
    assert!(effects(&reopened, &key) <= 1, "{key}");
    for (label, n) in all_effects(&reopened) {
        assert!(n <= 1, "{label}: {n} effects");
    }
    reopened.check_expiry_index().expect("expiry index");
}
