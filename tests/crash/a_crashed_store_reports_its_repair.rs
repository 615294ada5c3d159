//! A file left by a crash (the durable image of a store that was never closed) is repaired by
//! the next open for writing: `StoreBuilder::on_repair` sees that repair's progress while it
//! runs and `Store::repair_time` says afterwards how long it took; a callback that aborts it
//! gets `Error::RepairAborted` with none of the repair written (this file stays byte for byte
//! the same), for the next open to repair; a callback's panic abandons the repair the same way and reaches the caller as its own
//! panic. A clean file, a new file and a file whose last commit saved the allocator state
//! (quick-repair) need no repair: the callback is never called. Every acknowledged answer
//! replays after the repair.

use crate::common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem::{Error, ExecuteAnswer, Request, Response, Scope, Store, StoreBuilder};

const CLAIMS: usize = 40;

fn request(i: usize) -> Request {
    Request::from_canonical_bytes(Scope::new("t", "op"), format!("key-{i:03}"), b"p")
}

/// A file holding what a crash leaves of a store that claimed `CLAIMS` keys.
fn crashed_file(dir: &Path, builder: StoreBuilder) -> std::path::PathBuf {
    let image = common::crash_image(builder, |store| {
        for i in 0..CLAIMS {
            let outcome = store
                .execute(request(i), |_| Ok(Response::new(201, format!("order {i}"))))
                .expect("claim");
            assert!(matches!(outcome, ExecuteAnswer::Ran(_)), "{outcome:?}");
        }
    });
    let path = dir.join("idem.redb");
    std::fs::write(&path, image).expect("write the image");
    path
}

/// Every claim of the crashed process replays its first answer.
fn every_answer_replays(store: &Store) {
    for i in 0..CLAIMS {
        let outcome = store
            .execute(request(i), |_| panic!("a replay runs nothing"))
            .expect("replay");
        match outcome {
            ExecuteAnswer::Replayed(r) => assert_eq!(r.body(), format!("order {i}").as_bytes()),
            other => panic!("key {i}: {other:?}"),
        }
    }
}

/// What a recording callback was shown: (fraction, elapsed) per call.
type Shown = Arc<Mutex<Vec<(f64, Duration)>>>;

/// A callback that records what it was shown.
fn recording() -> (
    Shown,
    impl Fn(&mut idem::store::RepairProgress) + Send + Sync + 'static,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    (seen, move |p: &mut idem::store::RepairProgress| {
        log.lock().unwrap().push((p.fraction(), p.elapsed()));
    })
}

#[test]
fn a_crashed_file_is_repaired_with_its_progress_shown_and_its_time_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_file(dir.path(), Store::builder());
    let (seen, callback) = recording();
    let store = Store::builder()
        .on_repair(callback)
        .open(&path)
        .expect("the crashed file opens");
    let calls = seen.lock().unwrap().clone();
    assert!(!calls.is_empty(), "the repair was shown");
    assert_eq!(
        calls[0],
        (0.0, Duration::ZERO),
        "the first call opens the repair"
    );
    for pair in calls.windows(2) {
        assert!(pair[0].0 <= pair[1].0, "progress only grows: {calls:?}");
        assert!(pair[0].1 <= pair[1].1, "time only grows: {calls:?}");
    }
    assert!(
        calls.iter().all(|&(f, _)| (0.0..1.0).contains(&f)),
        "{calls:?}"
    );
    let took = store.repair_time().expect("the open repaired the file");
    assert!(took >= calls.last().unwrap().1, "{took:?} {calls:?}");
    every_answer_replays(&store);
    drop(store);

    // Closed cleanly now: the next open needs no repair.
    let (seen, callback) = recording();
    let store = Store::builder().on_repair(callback).open(&path).unwrap();
    assert!(seen.lock().unwrap().is_empty());
    assert_eq!(store.repair_time(), None);
    every_answer_replays(&store);
}

#[test]
fn an_aborted_repair_is_a_typed_error_and_leaves_the_file_for_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_file(dir.path(), Store::builder());
    let before = std::fs::read(&path).unwrap();
    let calls = Arc::new(Mutex::new(0));
    let count = Arc::clone(&calls);
    let abort = move |p: &mut idem::store::RepairProgress| {
        *count.lock().unwrap() += 1;
        p.abort();
    };
    let opened = Store::builder().on_repair(abort.clone()).open(&path);
    assert!(matches!(opened, Err(Error::RepairAborted)), "{opened:?}");
    // The operators' open, which never creates, abandons it the same way.
    let opened = Store::builder().on_repair(abort).open_existing(&path);
    assert!(matches!(opened, Err(Error::RepairAborted)), "{opened:?}");
    assert_eq!(
        *calls.lock().unwrap(),
        2,
        "asked once per open, then abandoned"
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "nothing was written"
    );
    let message = Error::RepairAborted.to_string();
    assert!(message.contains("open it again"), "{message}");

    // A read-only open never repairs, callback or not.
    let (seen, callback) = recording();
    let read = Store::builder().on_repair(callback).open_read_only(&path);
    assert!(matches!(read, Err(Error::NeedsRecovery)), "{read:?}");
    assert!(seen.lock().unwrap().is_empty());

    // The next open repairs it, and every answer is there.
    let store = Store::open(&path).expect("repaired");
    assert!(store.repair_time().is_some());
    every_answer_replays(&store);
}

#[test]
fn a_panicking_callback_abandons_the_repair_and_the_panic_is_the_callers() {
    let dir = tempfile::tempdir().unwrap();
    let path = crashed_file(dir.path(), Store::builder());
    let before = std::fs::read(&path).unwrap();
    let opened = catch_unwind(AssertUnwindSafe(|| {
        Store::builder()
            .on_repair(|_| panic!("the callback's own panic"))
            .open(&path)
    }));
    let payload = opened.expect_err("the callback's panic reaches the caller");
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"the callback's own panic"),
        "the caller's payload, not a CorruptStore"
    );
    assert!(
        std::fs::read(&path).unwrap() == before,
        "nothing was written"
    );
    let store = Store::open(&path).expect("repaired by the next open");
    every_answer_replays(&store);
}

#[test]
fn a_new_file_and_a_quick_repair_file_need_no_repair() {
    let dir = tempfile::tempdir().unwrap();
    let (seen, callback) = recording();
    let store = Store::builder()
        .on_repair(callback)
        .open(dir.path().join("new.redb"))
        .unwrap();
    assert_eq!(store.repair_time(), None);
    drop(store);
    assert!(seen.lock().unwrap().is_empty());

    // The same crash with quick-repair: the last commit saved the allocator state. (Without
    // the open-time check of every page, which would walk the file anyway.)
    let quick = dir.path().join("quick");
    std::fs::create_dir(&quick).unwrap();
    let path = crashed_file(&quick, Store::builder().quick_repair(true));
    let (seen, callback) = recording();
    let store = Store::builder()
        .quick_repair(true)
        .verify_on_open(false)
        .on_repair(callback)
        .open(&path)
        .expect("opens");
    assert!(
        seen.lock().unwrap().is_empty(),
        "no repair: the state was loaded"
    );
    assert_eq!(store.repair_time(), None);
    every_answer_replays(&store);
}
