//! Journal mode's slow paths: a batch whose writes the journal cannot hold (a multimap table, a
//! table of compound types that is not registered, an entry over a quarter of the journal)
//! commits to redb's file durably instead, and the bound on writes not yet in redb's file makes
//! batches wait for the applier. Every answer is kept and every effect happens once, across a
//! reopen, whichever path a claim took.

use crate::common;

use common::*;
use idem::redb::{MultimapTableDefinition, ReadableMultimapTable, ReadableTable, TableDefinition};
use idem::{Error, ExecuteAnswer, Response, Store, StoreBuilder};

const TAGS: MultimapTableDefinition<&str, &str> = MultimapTableDefinition::new("test.tags");
/// Compound key: not one of the leaf-type pairs that need no registration.
const NOTES: TableDefinition<(&str, u64), u64> = TableDefinition::new("test.notes");

fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true).journal_table(EFFECTS)
}

fn tag(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "tag", key, key.as_bytes()), |tx| {
        bump(tx, key)?;
        let mut tags = tx.open_multimap_table(TAGS)?;
        tags.insert(key, "x")?;
        tags.insert(key, "y")?;
        Ok(Response::new(201, key.to_owned()))
    })
}

fn note(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "note", key, key.as_bytes()), |tx| {
        bump(tx, key)?;
        tx.open_table(NOTES)?.insert((key, 7), 1)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "pay", key, key.as_bytes()), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

fn tags_of(store: &Store, key: &str) -> usize {
    let read = store.read_transaction().expect("read txn");
    let table = read.open_multimap_table(TAGS).expect("tags table");
    table.get(key).expect("get").count()
}

fn noted(store: &Store, key: &str) -> bool {
    let read = store.read_transaction().expect("read txn");
    let table = read.open_table(NOTES).expect("notes table");
    table.get((key, 7)).expect("get").is_some()
}

#[test]
fn a_multimap_table_commits_with_its_claim_and_survives_a_reopen() {
    let mut h = Harness::with(journaled);
    executed(claim(h.store(), "before"));
    for k in ["a", "b"] {
        assert_eq!(executed(tag(h.store(), k)).body(), k.as_bytes());
    }
    executed(claim(h.store(), "after"));
    let m = h.store().metrics().journal;
    assert!(m.unjournaled >= 2, "the multimap batches: {m:?}");
    assert_eq!(tags_of(h.store(), "a"), 2);
    h.reopen();
    for k in ["a", "b"] {
        assert_eq!(replayed(tag(h.store(), k)).body(), k.as_bytes());
        assert_eq!(effects(h.store(), k), 1, "{k} ran once");
        assert_eq!(tags_of(h.store(), k), 2, "{k}'s tags");
    }
    for k in ["before", "after"] {
        replayed(claim(h.store(), k));
        assert_eq!(effects(h.store(), k), 1);
    }
}

/// Eight callers, a third of whose claims write a table the journal cannot replay: those run
/// on redb's own transaction, the rest are journaled, and batches of both kinds alternate. A
/// watchdog turns a deadlock into a failure.
#[test]
fn claims_mixing_journaled_and_unjournalable_tables_each_run_once() {
    let mut h = Harness::with(journaled);
    callers_under_watchdog(
        h.store(),
        8,
        "a batch on redb's transaction and the applier waited for each other?",
        |store, t| {
            for i in 0..60 {
                let key = format!("m{t}-{i}");
                if i % 3 == t % 3 {
                    executed(note(store, &key));
                } else {
                    executed(claim(store, &key));
                }
            }
        },
    );
    let check = |store: &Store| {
        for t in 0..8 {
            for i in 0..60 {
                let key = format!("m{t}-{i}");
                assert_eq!(effects(store, &key), 1, "{key} ran once");
                assert_eq!(noted(store, &key), i % 3 == t % 3, "{key}'s note");
            }
        }
    };
    check(h.store());
    h.reopen();
    check(h.store());
    assert_eq!(replayed(note(h.store(), "m0-0")).body(), b"m0-0");
}

/// A 20 KiB answer in a 64 KiB journal: its entry is over a quarter of the journal, never
/// framed, and committed durably; claims before and after it are journaled as usual.
#[test]
fn an_entry_over_a_quarter_of_the_journal_commits_durably_and_replays_byte_exact() {
    let mut h = Harness::with(|b| {
        journaled(b)
            .journal_capacity(64 << 10)
            .checkpoint_bytes(16 << 10)
    });
    let body = "b".repeat(20 << 10);
    executed(claim(h.store(), "small-1"));
    let frames = h.store().metrics().journal.frames;
    let big = |store: &Store| {
        store.execute(req("t", "big", "k", b"p"), |tx| {
            bump(tx, "big")?;
            Ok(Response::new(201, body.clone()))
        })
    };
    assert_eq!(executed(big(h.store())).body(), body.as_bytes());
    let m = h.store().metrics().journal;
    assert_eq!(m.frames, frames, "the large entry was framed: {m:?}");
    executed(claim(h.store(), "small-2"));
    assert!(h.store().metrics().journal.frames > frames);
    h.reopen();
    assert_eq!(replayed(big(h.store())).body(), body.as_bytes());
    assert_eq!(effects(h.store(), "big"), 1);
    for k in ["small-1", "small-2"] {
        replayed(claim(h.store(), k));
        assert_eq!(effects(h.store(), k), 1);
    }
}

/// A bound of one byte: nearly every batch finds the entries before it not yet applied and
/// waits for the applier before sealing its own. Nothing is lost or run twice.
#[test]
fn the_pending_bound_makes_batches_wait_for_the_applier_and_loses_nothing() {
    let mut h = Harness::with(|b| journaled(b).journal_pending_bytes(1));
    callers_under_watchdog(
        h.store(),
        8,
        "a seal waited for an applier that waited for it?",
        |store, t| {
            for i in 0..100 {
                executed(claim(store, &format!("p{t}-{i}")));
            }
        },
    );
    let m = h.store().metrics().journal;
    assert!(
        m.pending_waits > 0,
        "no batch waited for the applier: {m:?}"
    );
    h.reopen();
    for t in 0..8 {
        for i in [0, 57, 99] {
            let key = format!("p{t}-{i}");
            replayed(claim(h.store(), &key));
            assert_eq!(effects(h.store(), &key), 1, "{key}");
        }
    }
}

#[test]
fn a_pending_bound_of_zero_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opened = Store::builder()
        .journal(true)
        .journal_pending_bytes(0)
        .open(dir.path().join("s.redb"));
    match opened {
        Err(Error::Config { reason }) => {
            assert!(reason.contains("journal_pending_bytes"), "{reason}")
        }
        other => panic!("expected Config, got {other:?}"),
    }
}
