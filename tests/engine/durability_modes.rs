//! What each durability mode promises about a crash, checked on a backend that keeps the
//! durable image apart from what was merely written.
//!
//! - `Immediate`: an answer you received survives a crash.
//! - `Periodic(interval)`: answers of the last `interval` may be lost, but whole: a lost intent
//!   lost its caller writes too, and a retry runs it once more (never a second effect).
//! - Dropping the store makes everything durable.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use idem::{Durability, Response, Store};

fn open(backend: &CrashBackend, durability: Durability) -> Store {
    Store::builder()
        .durability(durability)
        .open_with_backend(backend.clone())
        .expect("open")
}

fn claim(store: &Store, key: &str) -> idem::ExecuteAnswer {
    store
        .execute(req("t", "op", key, b"p"), |tx| {
            bump(tx, key)?;
            Ok(Response::new(201, key.to_owned()))
        })
        .expect("execute")
}

#[test]
fn immediate_answers_survive_a_crash() {
    let backend = CrashBackend::default();
    let store = open(&backend, Durability::Immediate);
    assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
    let after_crash = open(&backend.crash(), Durability::Immediate);
    std::mem::forget(store); // the crashed process never closes its store
    assert!(matches!(
        claim(&after_crash, "k"),
        idem::ExecuteAnswer::Replayed(_)
    ));
    assert_eq!(effects(&after_crash, "k"), 1);
}

#[test]
fn periodic_loses_recent_answers_whole_never_half() {
    let backend = CrashBackend::default();
    let store = open(&backend, Durability::Periodic(Duration::from_secs(3600)));
    assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
    let after_crash = open(&backend.crash(), Durability::Immediate);
    std::mem::forget(store);
    // The answer was lost, and so was its effect: the retry runs it, and there is one effect.
    assert_eq!(effects(&after_crash, "k"), 0);
    assert!(matches!(
        claim(&after_crash, "k"),
        idem::ExecuteAnswer::Ran(_)
    ));
    assert_eq!(effects(&after_crash, "k"), 1);
}

#[test]
fn periodic_flushes_within_its_interval() {
    let backend = CrashBackend::default();
    let store = open(&backend, Durability::Periodic(Duration::from_millis(10)));
    assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
    let commits = store.metrics().commits;
    // The flusher's fsync is one more commit; wait for it (bounded).
    let give_up = Instant::now() + Duration::from_secs(10);
    while store.metrics().commits == commits {
        assert!(Instant::now() < give_up, "the flusher never ran");
        std::thread::sleep(Duration::from_millis(5));
    }
    let after_crash = open(&backend.crash(), Durability::Immediate);
    std::mem::forget(store);
    assert!(matches!(
        claim(&after_crash, "k"),
        idem::ExecuteAnswer::Replayed(_)
    ));
}

#[test]
fn dropping_a_periodic_store_makes_everything_durable() {
    let backend = CrashBackend::default();
    let store = open(&backend, Durability::Periodic(Duration::from_secs(3600)));
    assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
    drop(store);
    let reopened = open(&backend.crash(), Durability::Immediate);
    assert!(matches!(
        claim(&reopened, "k"),
        idem::ExecuteAnswer::Replayed(_)
    ));
}

#[test]
fn periodic_with_multi_process_or_a_zero_interval_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for builder in [
        Store::builder()
            .durability(Durability::Periodic(Duration::from_millis(5)))
            .multi_process(true),
        Store::builder().durability(Durability::Periodic(Duration::ZERO)),
    ] {
        let err = builder
            .open(dir.path().join("x.redb"))
            .expect_err("refused");
        assert!(matches!(err, idem::Error::Config { .. }), "{err:?}");
    }
}

#[test]
fn an_idle_periodic_store_stops_fsyncing_after_one_flush() {
    let backend = CrashBackend::default();
    let store = open(&backend, Durability::Periodic(Duration::from_millis(5)));
    assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
    let give_up = Instant::now() + Duration::from_secs(10);
    while store.metrics().commits < 2 {
        assert!(Instant::now() < give_up, "the flusher never ran");
        std::thread::sleep(Duration::from_millis(2));
    }
    let after_flush = store.metrics().commits;
    // Twenty intervals of idleness: nothing is unflushed, so no further commit (fsync) happens.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        store.metrics().commits,
        after_flush,
        "an idle store kept fsyncing"
    );
}
