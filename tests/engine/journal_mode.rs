//! Journal mode (the default; `StoreBuilder::journal`): answers are made durable by the journal's sync,
//! redb commits without one, and an open after a crash replays what redb lacks. Every answered
//! claim survives a crash of both files at any instant, its effect exactly once, whether the
//! closure's table is registered (journaled) or not (its batches commit durably).

use crate::common;

use std::collections::BTreeSet;
use std::sync::Mutex;

use common::*;
use idem::store::journal_path;
use idem::{Error, ExecuteAnswer, Response, Store, StoreBuilder};

fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true).journal_table(EFFECTS)
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "pay", key, key.as_bytes()), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

#[test]
fn answers_survive_a_reopen_and_the_journal_sits_beside_the_file() {
    let mut h = Harness::with(journaled);
    for i in 0..50 {
        executed(claim(h.store(), &format!("k{i}")));
    }
    assert!(
        journal_path(&h.path).exists(),
        "the journal beside the store"
    );
    h.reopen();
    for i in 0..50 {
        let k = format!("k{i}");
        assert_eq!(replayed(claim(h.store(), &k)).body(), k.as_bytes());
        assert_eq!(effects(h.store(), &k), 1, "{k} ran once");
    }
}

#[test]
fn a_table_that_is_not_registered_still_works_and_replays() {
    let mut h = Harness::with(|b| b.journal(true));
    executed(claim(h.store(), "k"));
    h.reopen();
    assert_eq!(replayed(claim(h.store(), "k")).body(), b"k");
    assert_eq!(effects(h.store(), "k"), 1);
}

#[test]
fn batches_that_write_an_unregistered_table_are_counted_and_registered_ones_are_not() {
    // A table of its own (`journaled` registers EFFECTS), with a
    // compound key: leaf-typed tables need no registration.
    const NOTES: idem::redb::TableDefinition<(&str, u64), u64> =
        idem::redb::TableDefinition::new("unregistered_notes");
    let note = |store: &Store, key: &str| {
        store.execute(req("t", "note", key, key.as_bytes()), |tx| {
            tx.open_table(NOTES)?.insert((key, 1), 1)?;
            Ok(Response::new(201, key.to_owned()))
        })
    };
    let h = Harness::with(journaled);
    executed(note(h.store(), "a"));
    executed(note(h.store(), "b"));
    let m = h.store().metrics().journal;
    assert_eq!(
        m.unjournaled, 2,
        "two batches wrote the unregistered table: {m:?}"
    );
    assert_eq!(m.frames, 0, "{m:?}");

    let h = Harness::with(journaled);
    executed(claim(h.store(), "a"));
    let m = h.store().metrics().journal;
    assert_eq!(m.unjournaled, 0, "{m:?}");
    assert_eq!(m.frames, 1, "{m:?}");
}

#[test]
fn journal_mode_refuses_settings_it_cannot_keep() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.redb");
    for b in [
        Store::builder().journal(true).multi_process(true),
        Store::builder().journal(true).journal_capacity(1000),
        Store::builder()
            .journal(true)
            .journal_capacity(1 << 20)
            .checkpoint_bytes(1 << 20),
    ] {
        let opened = b.open(&path);
        assert!(matches!(opened, Err(Error::Config { .. })), "{opened:?}");
    }
}

/// Opens journal mode on the two simulated disks.
fn open_pair(store: &CrashBackend, journal: &CrashBackend, b: StoreBuilder) -> Store {
    b.open_with_backends(store.clone(), journal.clone())
        .expect("open on the simulated disks")
}

#[test]
fn every_answered_claim_survives_a_crash_of_both_files_at_any_instant() {
    // Small journal and checkpoints: the run wraps the journal and checkpoints many times.
    crash_rounds(|b| {
        journaled(b)
            .journal_capacity(64 << 10)
            .checkpoint_bytes(16 << 10)
    });
}

#[test]
fn every_answered_claim_survives_a_crash_when_its_table_is_not_registered() {
    crash_rounds(|b| {
        b.journal(true)
            .journal_capacity(64 << 10)
            .checkpoint_bytes(16 << 10)
    });
}

fn crash_rounds(settings: impl Fn(StoreBuilder) -> StoreBuilder) {
    for round in 0..6u64 {
        let (db, jr) = (CrashBackend::default(), CrashBackend::default());
        let store = open_pair(&db, &jr, settings(Store::builder()));
        let answered = Mutex::new(BTreeSet::new());
        let crashed = std::thread::scope(|s| {
            for t in 0..4 {
                let (store, answered) = (&store, &answered);
                s.spawn(move || {
                    for i in 0..150 {
                        let k = format!("r{round}-t{t}-{i}");
                        if claim(store, &k).is_ok() {
                            answered.lock().unwrap().insert(k);
                        }
                    }
                });
            }
            // Crash while claims run, once more than ten were answered (a loaded machine may
            // take longer to get there): what was answered before the images is the promise.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while answered.lock().unwrap().len() <= 10 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(20 + 15 * round));
            let promised = answered.lock().unwrap().clone();
            // The journal first: a store image taken after it can only be newer.
            let jr_crashed = jr.crash();
            let db_crashed = db.crash();
            (promised, db_crashed, jr_crashed)
        });
        drop(store);
        let (promised, db_crashed, jr_crashed) = crashed;
        let reopened = open_pair(&db_crashed, &jr_crashed, settings(Store::builder()));
        for k in &promised {
            assert_eq!(
                replayed(claim(&reopened, k)).body(),
                k.as_bytes(),
                "round {round}: {k} was answered before the crash"
            );
        }
        for (label, n) in all_effects(&reopened) {
            assert_eq!(n, 1, "round {round}: {label} ran {n} times");
        }
        assert!(
            promised.len() > 10,
            "round {round}: the crash came after some answers"
        );
    }
}

const ROWS: idem::redb::TableDefinition<u64, &str> = idem::redb::TableDefinition::new("test.rows");

/// The rows of `ROWS` through a fresh read.
fn rows(store: &Store) -> Vec<(u64, String)> {
    use idem::redb::ReadableTable;
    let read = store.read_transaction().expect("read");
    let table = read.open_table(ROWS).expect("rows table");
    table
        .iter()
        .expect("iter")
        .map(|r| {
            let (k, v) = r.expect("row");
            (k.value(), v.value().to_owned())
        })
        .collect()
}

#[test]
fn every_write_method_of_a_table_is_replayed_after_a_crash() {
    let (db, jr) = (CrashBackend::default(), CrashBackend::default());
    let builder = || {
        Store::builder()
            .journal(true)
            .journal_table(ROWS)
            .journal_capacity(1 << 20)
            .checkpoint_bytes(256 << 10)
    };
    let store = open_pair(&db, &jr, builder());
    let write = |key: &str, f: &dyn Fn(&mut idem::store::Table<'_, u64, &str>)| {
        executed(store.execute(req("t", "rows", key, key.as_bytes()), |tx| {
            let mut t = tx.open_table(ROWS)?;
            f(&mut t);
            Ok(Response::new(200, "ok"))
        }));
    };
    write("insert", &|t| {
        for i in 0..20u64 {
            t.insert(i, format!("v{i}").as_str()).expect("insert");
        }
    });
    write("remove", &|t| {
        t.remove(3).expect("remove");
    });
    write("pop", &|t| {
        t.pop_first().expect("pop_first");
        t.pop_last().expect("pop_last");
    });
    write("retain", &|t| t.retain(|k, _| k % 2 == 0).expect("retain"));
    write("retain_in", &|t| {
        t.retain_in(10..16, |k, _| k != 12).expect("retain_in")
    });
    write("overwrite", &|t| {
        t.insert(2, "two").expect("insert");
    });
    let before = rows(&store);
    assert_eq!(
        before.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
        vec![2, 4, 6, 8, 10, 14, 16, 18]
    );
    // Everything above is in the journal only: redb's state is its checkpoint before it.
    let (jr_crashed, db_crashed) = (jr.crash(), db.crash());
    drop(store);
    let reopened = open_pair(&db_crashed, &jr_crashed, builder());
    assert!(
        reopened.metrics().journal.replayed > 0,
        "the writes came from the journal"
    );
    assert_eq!(rows(&reopened), before);
}

/// Journal mode with a journal that fills again and again (64 KiB, checkpoints every
/// 32 KiB, eight callers): a seal that finds no space waits for the applier's checkpoint, and the
/// two never wait for each other. A watchdog turns a deadlock into a failure.
#[test]
fn a_full_journal_waits_for_the_applier_and_never_deadlocks() {
    let h = Harness::with(|b| {
        journaled(b)
            .journal_capacity(64 << 10)
            .checkpoint_bytes(32 << 10)
    });
    callers_under_watchdog(
        h.store(),
        8,
        "a seal and the applier waited for each other?",
        |store, t| {
            for i in 0..250 {
                executed(claim(store, &format!("f{t}-{i}")));
            }
        },
    );
    let m = h.store().metrics().journal;
    assert!(
        m.checkpoints >= 10,
        "the journal filled and was checkpointed many times: {m:?}"
    );
    assert!(
        m.checkpoint_time > std::time::Duration::ZERO,
        "the checkpoints' durable commits are timed: {m:?}"
    );
    for t in 0..8 {
        assert_eq!(effects(h.store(), &format!("f{t}-249")), 1);
    }
}

/// What a newcomer gets: `Store::open` (and the builder's `open`, `open_existing`) is journal
/// mode. It creates `<file>.journal`, and its claims, whose closure writes a table of its own
/// without registering it, are journaled frames made durable by the journal's syncs.
#[test]
fn a_newcomers_store_open_is_journal_mode() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let store = Store::open(&path).expect("open");
    assert!(journal_path(&path).exists(), "the journal beside the store");
    for i in 0..3 {
        executed(claim(&store, &format!("k{i}")));
    }
    let m = store.metrics().journal;
    assert_eq!(m.frames, 3, "every claim a journal frame: {m:?}");
    assert!(m.syncs >= 1, "answered after the journal's sync: {m:?}");
    assert_eq!(m.unjournaled, 0, "{m:?}");
    drop(store);

    let store = Store::builder()
        .open_existing(&path)
        .expect("open_existing");
    executed(claim(&store, "k3"));
    assert_eq!(store.metrics().journal.frames, 1);
    assert_eq!(replayed(claim(&store, "k0")).body(), b"k0");
}

/// The modes without a journal: `multi_process` (the journal belongs to one process),
/// `journal(false)`, and `open_with_backend` (no path to put it beside). None creates one.
#[test]
fn multi_process_and_journal_false_open_without_a_journal() {
    let dir = tempfile::tempdir().unwrap();
    for (name, builder) in [
        ("multi", Store::builder().multi_process(true)),
        ("direct", Store::builder().journal(false)),
    ] {
        let path = dir.path().join(format!("{name}.redb"));
        let store = builder.open(&path).expect("open");
        executed(claim(&store, "k"));
        assert_eq!(store.metrics().journal.frames, 0, "{name}");
        assert!(!journal_path(&path).exists(), "{name}: no journal");
    }
    let store = Store::builder()
        .open_with_backend(CrashBackend::default())
        .expect("open on a backend");
    executed(claim(&store, "k"));
    assert_eq!(store.metrics().journal.frames, 0);
    let explicit = Store::builder()
        .journal(true)
        .open_with_backend(CrashBackend::default());
    assert!(
        matches!(explicit, Err(Error::Config { .. })),
        "journal(true) without a journal's place: {explicit:?}"
    );
}

/// A store written in one mode opens in the other, both ways, with every answer: direct mode's
/// file in journal mode (a journal is created), and journal mode's file, closed cleanly, in
/// direct mode and with `multi_process`.
#[test]
fn a_store_opens_in_the_other_mode_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    let direct = Store::builder().journal(false).open(&path).expect("direct");
    executed(claim(&direct, "d"));
    drop(direct);
    let journaled = Store::open(&path).expect("journal mode on a direct-mode file");
    assert_eq!(replayed(claim(&journaled, "d")).body(), b"d");
    executed(claim(&journaled, "j"));
    drop(journaled);
    for builder in [
        Store::builder().journal(false),
        Store::builder().multi_process(true),
    ] {
        let store = builder
            .open(&path)
            .expect("a cleanly closed journal-mode file");
        for k in ["d", "j"] {
            assert_eq!(replayed(claim(&store, k)).body(), k.as_bytes());
            assert_eq!(effects(&store, k), 1, "{k}");
        }
    }
}

/// Claims `keys` on a journal-mode store on simulated disks, then crashes both: the files a
/// crash leaves, written out at `path` and its journal's path, whose journal holds answers the
/// store file lacks (the journal's checkpoints are far apart).
fn crashed_files_with_a_live_journal(path: &std::path::Path, keys: &[&str]) {
    let builder = Store::builder()
        .journal_capacity(1 << 20)
        .checkpoint_bytes(512 << 10);
    files_a_crash_leaves(path, builder, |store| {
        for k in keys {
            executed(claim(store, k));
        }
    });
}

/// A crash left a live journal: an open in direct mode (`journal(false)`) replays it first and
/// keeps every answer.
#[test]
fn a_direct_mode_open_replays_a_live_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    crashed_files_with_a_live_journal(&path, &["a", "b", "c"]);
    let read_only = Store::builder().open_read_only(&path);
    assert!(
        matches!(read_only, Err(Error::NeedsRecovery)),
        "the crash left answers in the journal only: {read_only:?}"
    );
    let store = Store::builder().journal(false).open(&path).expect("direct");
    for k in ["a", "b", "c"] {
        assert_eq!(replayed(claim(&store, k)).body(), k.as_bytes());
        assert_eq!(effects(&store, k), 1, "{k}");
    }
}

/// A crash left a live journal: a `multi_process` open never replays it (the journal belongs to
/// one process) and never ignores it either: it refuses with a typed error that says what to
/// do, and changes nothing. Done as it says (one open without `multi_process`), the
/// `multi_process` open then has every answer.
#[test]
fn a_multi_process_open_refuses_a_live_journal_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    crashed_files_with_a_live_journal(&path, &["a", "b"]);
    let journal_before = std::fs::read(journal_path(&path)).unwrap();
    let refused = Store::builder().multi_process(true).open(&path);
    let Err(e @ Error::JournalNeedsReplay) = refused else {
        panic!("expected JournalNeedsReplay, got {refused:?}");
    };
    let message = e.to_string();
    assert!(
        message.contains("without multi_process") && message.contains("idem recover"),
        "{message}"
    );
    assert_eq!(
        std::fs::read(journal_path(&path)).unwrap(),
        journal_before,
        "the journal is untouched"
    );
    drop(Store::open(&path).expect("the open that replays the journal"));
    let store = Store::builder()
        .multi_process(true)
        .open(&path)
        .expect("multi_process after the replay");
    for k in ["a", "b"] {
        assert_eq!(replayed(claim(&store, k)).body(), k.as_bytes());
        assert_eq!(effects(&store, k), 1, "{k}");
    }
}
