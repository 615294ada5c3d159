//! A crash in journal mode (the default) leaves answers in `<store>.journal` that the store file
//! lacks. `idem check` checks a copy of both files (its copy's open replays the journal), `idem
//! recover` replays the journal into the file and closes it cleanly, and a journal holding
//! writes to a table whose types the CLI cannot know is refused by both (and by the writing
//! commands' check of a copy), the journal left as it was, with the message an open in the
//! service gives: which table, which builder call, what to do.
#![cfg(feature = "cli")]

use crate::common;
use crate::idem_cli;

use std::path::Path;

use common::*;
use idem::redb::TableDefinition;
use idem::store::journal_path;
use idem::{Response, Store, StoreBuilder};
use idem_cli::idem;

/// A caller's table of a compound key type: not one of the types recovery knows without
/// registration.
const NOTES: TableDefinition<(&str, u64), u64> = TableDefinition::new("notes");

/// Claims `keys` on a journal-mode store on simulated disks (each claim's closure also writes
/// `NOTES` when `notes`), crashes both disks, and writes what the crash left at `path` and its
/// journal's path: the journal's checkpoints are far apart, so its entries are live.
fn crash_leaving_a_live_journal(path: &Path, keys: &[&str], notes: bool) {
    let builder: StoreBuilder = Store::builder()
        .journal_capacity(1 << 20)
        .checkpoint_bytes(512 << 10);
    let builder = if notes {
        builder.journal_table(NOTES)
    } else {
        builder
    };
    files_a_crash_leaves(path, builder, |store| {
        for k in keys {
            executed(store.execute(req("t", "op", k, b"x"), |tx| {
                bump(tx, k)?;
                if notes {
                    tx.open_table(NOTES)?.insert((*k, 1), 1)?;
                }
                Ok(Response::new(201, k.to_string()))
            }));
        }
        assert_eq!(store.metrics().journal.unjournaled, 0, "journaled claims");
    });
}

fn get(path: &Path, key: &str) -> std::process::Output {
    idem(path, &["get", "--tenant", "t", "--op", "op", "--key", key])
}

#[test]
fn check_and_recover_replay_a_live_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    crash_leaving_a_live_journal(&path, &["a", "b"], false);

    let o = idem(&path, &["check"]);
    assert!(o.status.success(), "{o:?}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "the copy and its journal are removed: {names:?}"
    );

    let o = get(&path, "a");
    assert!(
        !o.status.success(),
        "a read command recovers nothing: {o:?}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("idem recover"),
        "{o:?}"
    );

    let o = idem(&path, &["recover"]);
    assert!(o.status.success(), "{o:?}");
    for k in ["a", "b"] {
        let o = get(&path, k);
        assert!(o.status.success(), "{k} was replayed into the file: {o:?}");
    }
    // The service's next open (journal mode) finds every answer.
    let store = Store::open(&path).expect("open");
    for k in ["a", "b"] {
        assert_eq!(effects(&store, k), 1, "{k}");
    }
}

#[test]
fn a_journal_with_a_table_the_cli_cannot_know_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.redb");
    crash_leaving_a_live_journal(&path, &["a"], true);
    let (file, journal) = (
        std::fs::read(&path).unwrap(),
        std::fs::read(journal_path(&path)).unwrap(),
    );
    // What the service's own open says when it does not register the table.
    let Err(service) = Store::builder().journal(false).open_existing({
        let copy = dir.path().join("copy.redb");
        std::fs::write(&copy, &file).unwrap();
        std::fs::write(journal_path(&copy), &journal).unwrap();
        copy
    }) else {
        panic!("an open that does not register `notes` replays nothing")
    };
    let said = service.to_string();
    for needle in ["`notes`", "StoreBuilder::journal_table", "idem"] {
        assert!(said.contains(needle), "{needle}: {said}");
    }
    // `sweep` stands for the writing commands, which check a copy before they write.
    for args in [&["check"][..], &["sweep"], &["recover"]] {
        let o = idem(&path, args);
        assert!(!o.status.success(), "{args:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("`notes`") && err.contains("StoreBuilder::journal_table"),
            "{args:?}: {err}"
        );
        // `check` works on a copy; `recover`'s open for writing may let redb repair the file
        // a crash left (its allocator state) before the journal is read, but replays nothing.
        if args != ["recover"] {
            assert!(
                std::fs::read(&path).unwrap() == file,
                "{args:?}: the file is untouched"
            );
        }
        assert!(
            std::fs::read(journal_path(&path)).unwrap() == journal,
            "{args:?}: the journal is untouched"
        );
    }
    // The program that registers the table replays it.
    let store = Store::builder()
        .journal_table(NOTES)
        .open(&path)
        .expect("the service's open");
    assert_eq!(effects(&store, "a"), 1);
}
