//! What each durability mode promises about a crash, checked on a backend that keeps the
//! durable image apart from what was merely written, in direct mode and in journal mode.
//!
//! - `Immediate`: an answer you received survives a crash.
//! - `Periodic(interval)`: answers of the last `interval` may be lost, but whole: a lost intent
//!   lost its caller writes too, and a retry runs it once more (never a second effect).
//! - Dropping the store makes everything durable.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use idem::{Durability, Response, Store};

/// A store's disks: its file, and in journal mode (the default for a file) its journal.
#[derive(Clone)]
struct Disks {
    file: CrashBackend,
    journal: Option<CrashBackend>,
}

impl Disks {
    /// Direct mode (`journal == false`) or journal mode.
    fn new(journal: bool) -> Disks {
        Disks {
            file: CrashBackend::default(),
            journal: journal.then(CrashBackend::default),
        }
    }

    /// What a crash leaves of both: their durable images.
    fn crash(&self) -> Disks {
        Disks {
            journal: self.journal.as_ref().map(CrashBackend::crash),
            file: self.file.crash(),
        }
    }

    fn mode(&self) -> &'static str {
        if self.journal.is_some() {
            "journal mode"
        } else {
            "direct mode"
        }
    }
}

fn open(disks: &Disks, durability: Durability) -> Store {
    let builder = Store::builder().durability(durability);
    match &disks.journal {
        Some(journal) => builder.open_with_backends(disks.file.clone(), journal.clone()),
        None => builder.open_with_backend(disks.file.clone()),
    }
    .expect("open")
}

/// Syncs so far: direct mode's commits (the flusher's is the durable one), journal mode's
/// journal syncs (its batches under `Periodic` sync nothing; the flusher's batch syncs).
fn syncs(store: &Store) -> u64 {
    let m = store.metrics();
    if m.journal.frames > 0 {
        m.journal.syncs
    } else {
        m.commits
    }
}

/// Waits (bounded) for the flusher's next sync after this call; returns the syncs then.
fn wait_for_a_flush(store: &Store, disks: &Disks) -> u64 {
    let before = syncs(store);
    let give_up = Instant::now() + Duration::from_secs(10);
    while syncs(store) == before {
        assert!(
            Instant::now() < give_up,
            "{}: the flusher never ran",
            disks.mode()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    syncs(store)
}

fn claim(store: &Store, key: &str) -> idem::ExecuteAnswer {
    store
        .execute(req("t", "op", key, b"p"), |tx| {
            bump(tx, key)?;
            Ok(Response::new(201, key.to_owned()))
        })
        .expect("execute")
}

/// Each test runs in both modes: direct, and journal mode (where answers wait for the
/// journal's sync, or under `Periodic` for the flusher's).
fn both_modes(test: impl Fn(Disks)) {
    for journal in [false, true] {
        test(Disks::new(journal));
    }
}

#[test]
fn immediate_answers_survive_a_crash() {
    both_modes(|disks| {
        let store = open(&disks, Durability::Immediate);
        assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
        let after_crash = open(&disks.crash(), Durability::Immediate);
        std::mem::forget(store); // the crashed process never closes its store
        assert!(
            matches!(claim(&after_crash, "k"), idem::ExecuteAnswer::Replayed(_)),
            "{}",
            disks.mode()
        );
        assert_eq!(effects(&after_crash, "k"), 1, "{}", disks.mode());
    });
}

#[test]
fn periodic_loses_recent_answers_whole_never_half() {
    both_modes(|disks| {
        let store = open(&disks, Durability::Periodic(Duration::from_secs(3600)));
        assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
        let after_crash = open(&disks.crash(), Durability::Immediate);
        std::mem::forget(store);
        // The answer was lost, and so was its effect: the retry runs it, and there is one
        // effect.
        assert_eq!(effects(&after_crash, "k"), 0, "{}", disks.mode());
        assert!(matches!(
            claim(&after_crash, "k"),
            idem::ExecuteAnswer::Ran(_)
        ));
        assert_eq!(effects(&after_crash, "k"), 1, "{}", disks.mode());
    });
}

#[test]
fn periodic_flushes_within_its_interval() {
    both_modes(|disks| {
        let store = open(&disks, Durability::Periodic(Duration::from_millis(10)));
        assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
        wait_for_a_flush(&store, &disks);
        let after_crash = open(&disks.crash(), Durability::Immediate);
        std::mem::forget(store);
        assert!(
            matches!(claim(&after_crash, "k"), idem::ExecuteAnswer::Replayed(_)),
            "{}",
            disks.mode()
        );
    });
}

#[test]
fn dropping_a_periodic_store_makes_everything_durable() {
    both_modes(|disks| {
        let store = open(&disks, Durability::Periodic(Duration::from_secs(3600)));
        assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
        drop(store);
        let reopened = open(&disks.crash(), Durability::Immediate);
        assert!(
            matches!(claim(&reopened, "k"), idem::ExecuteAnswer::Replayed(_)),
            "{}",
            disks.mode()
        );
    });
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
    both_modes(|disks| {
        let store = open(&disks, Durability::Periodic(Duration::from_millis(5)));
        assert!(matches!(claim(&store, "k"), idem::ExecuteAnswer::Ran(_)));
        let after_flush = wait_for_a_flush(&store, &disks);
        // Twenty intervals of idleness: nothing is unflushed, so no further sync happens.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            syncs(&store),
            after_flush,
            "{}: an idle store kept syncing",
            disks.mode()
        );
    });
}
