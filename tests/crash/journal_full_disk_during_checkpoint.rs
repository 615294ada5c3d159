//! A full disk in journal mode, on the simulated disk (docs/design.md, "What shipped", the
//! crash argument's full disk): the journal never grows, but redb's file does, at a checkpoint's
//! durable commit and inside ordinary batches when redb grows it; either write failing latches
//! fail-stop. No answered claim is lost: a reopen while the disk is still full fails and changes
//! nothing; once there is space, every answered key replays.

// White-box hooks (`idem::__journal`, `StoreBuilder::__break_journal`, `check_expiry_index`):
// compiled only with the internal feature, which this repository's own tests always have.
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use common::*;
use idem::{Error, ExecuteAnswer, Response, Store, StoreBuilder};

/// Frames of this many bytes make a checkpoint due.
const CHECKPOINT: u64 = 16 << 10;

/// Journal mode with a small journal: the applier thread writes the store file, with
/// non-durable commits and a checkpoint every [`CHECKPOINT`] bytes of frames.
fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true)
        .journal_capacity(64 << 10)
        .checkpoint_bytes(CHECKPOINT)
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

/// The store file fills once the first claims are done: the applier thread meets the full
/// disk (at its next commit, durable or not), latches fail-stop, and the claims after it fail;
/// nothing answered is lost.
#[test]
fn journal_full_disk_under_the_applier_loses_no_answered_claim() {
    full_disk(3);
}

/// The store file fills right after the open, before the applier's first commit: redb must
/// grow its file for the first entries it applies (the journal never grows, but redb's
/// non-durable commits may still need the store file to grow: a full disk is not only met by
/// checkpoints). The store fail-stops there, and nothing answered is lost either.
#[test]
fn journal_full_disk_right_after_the_open_loses_no_answered_claim() {
    full_disk(0);
}

/// Claims `warm` keys, then fills the store file's disk (every write and sync of it fails from
/// then on) and claims until one fails.
fn full_disk(warm: usize) {
    let pair = CountingPair::new();
    let store = journaled(Store::builder())
        .open_with_backends(pair.store.clone(), pair.journal.clone())
        .expect("open");
    // With `warm` > 1: redb grows and syncs the store file once early on (inside the second
    // batch after the open), before any checkpoint is due; after that only checkpoints write it.
    let mut answered = Vec::new();
    for i in 0..warm {
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
    let cause = store.fail_stop_cause().expect("the store fail-stopped");
    let later = claim(&store, "later");
    assert!(later.is_err(), "a claim after the fail-stop: {later:?}");
    eprintln!(
        "full disk after {warm} claims: {} claims answered, {key} failed after {frame_bytes} frame bytes ({error:?}); fail-stop: {cause}",
        answered.len()
    );
    assert!(!answered.is_empty(), "no claim answered");

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
    if matches!(error, Error::FailStopped { .. }) {
        // A definite "not done": the failing batch was never sealed.
        assert_eq!(
            effects(&reopened, &key),
            0,
            "{key} was answered FailStopped"
        );
    }
    assert!(effects(&reopened, &key) <= 1, "{key}");
    for (label, n) in all_effects(&reopened) {
        assert!(n <= 1, "{label}: {n} effects");
    }
    reopened.check_expiry_index().expect("expiry index");
}
