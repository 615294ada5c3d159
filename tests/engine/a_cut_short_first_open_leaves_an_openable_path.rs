//! A first start cut short at any step of the store's creation — an I/O error there, or a
//! process kill or a power cut that stops it there — leaves a path that the next plain
//! `Store::open` opens as a new, empty, working store, with nothing left beside it
//! (`engine/create.rs`: the store is written beside its path and linked into place once
//! durable). Both for a missing path and for an empty file a deployment created.

#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::path::Path;

use common::*;
use idem::__create::{Cut, Event, finish, plan};
use idem::store::journal_path;
use idem::{Response, Store, StoreBuilder};

/// The default builder with a small journal: the creation cut here is the same, and each of
/// the many opens writes less.
fn small(b: StoreBuilder) -> StoreBuilder {
    b.journal_capacity(1 << 20).checkpoint_bytes(256 << 10)
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read the test dir")
        .map(|e| {
            e.expect("a dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

/// The `<store>.new.*` file a creation writes, if it is there.
fn temporary(dir: &Path) -> Option<std::path::PathBuf> {
    names(dir)
        .into_iter()
        .find(|n| n.starts_with("store.redb.new."))
        .map(|n| dir.join(n))
}

/// What a power cut leaves of the new store's file: its size, but only the bytes its last sync
/// made durable (zeros where there were none); after the final full sync, all of it.
fn lose_unsynced(dir: &Path, events: &[Event]) {
    let Some(tmp) = temporary(dir) else { return };
    let fully_synced = events
        .iter()
        .any(|e| matches!(e, Event::Step(s) if s == "syncing the new store"));
    if fully_synced {
        return;
    }
    let durable = events
        .iter()
        .rev()
        .find_map(|e| match e {
            Event::Sync(image) => Some(image.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let len = std::fs::metadata(&tmp).expect("the file's size").len() as usize;
    let mut image = durable;
    image.resize(len, 0);
    std::fs::write(&tmp, image).expect("write the durable image");
}

/// After the cut: the next plain open makes a working, empty store, and leaves only the store
/// and its journal in the directory.
fn next_open_works(dir: &Path, path: &Path, what: &str) {
    let store = small(Store::builder())
        .open(path)
        .unwrap_or_else(|e| panic!("{what}: the next open failed: {e}"));
    assert_eq!(record_rows(&store), 0, "{what}: a new store is empty");
    let first = store.execute(req("t", "op", "k", b"p"), |_| {
        Ok(Response::new(201, "made"))
    });
    assert_eq!(executed(first).body(), b"made", "{what}");
    drop(store);
    assert_eq!(
        names(dir),
        ["store.redb", "store.redb.journal"],
        "{what}: nothing is left beside the store"
    );
    assert!(journal_path(path).exists());
}

fn cut_each_step(empty_file_first: bool) {
    let mut steps = Vec::new();
    for n in 0.. {
        let mut reached = false;
        for cut in [Cut::Fail, Cut::Crash] {
            // A crash cut is looked at as the process left it, as a power cut left it, and as a
            // power cut that also undid the names the directory had not synced.
            let views: &[&str] = match cut {
                Cut::Fail => &["an I/O error"],
                Cut::Crash => &[
                    "a kill",
                    "a power cut",
                    "a power cut before the directory sync",
                ],
            };
            for view in views {
                let dir = tempfile::tempdir().expect("a temp dir");
                let path = dir.path().join("store.redb");
                if empty_file_first {
                    std::fs::write(&path, b"").expect("the deployment's empty file");
                }
                let before = names(dir.path());
                plan(n, cut);
                let opened = small(Store::builder()).open(&path);
                let (events, hit) = finish();
                reached |= hit;
                let step = match events.get(n) {
                    Some(Event::Sync(_)) => "a sync of redb's file".to_owned(),
                    Some(Event::Write) => "a write of redb's file".to_owned(),
                    Some(Event::Step(s)) => s.clone(),
                    None => "none".to_owned(),
                };
                let what = format!("step {n} ({step}) cut by {view}");
                if !hit {
                    // The creation ran to its end: nothing was cut.
                    drop(opened.expect("an uncut open works"));
                    steps = events;
                    continue;
                }
                if let Ok(store) = opened {
                    // Only a failed removal of the temporary name is no failure of the open:
                    // the store is in place, and the next open removes the name.
                    assert!(
                        matches!(events.get(n), Some(Event::Step(s)) if s.starts_with("removing")),
                        "{what}: the cut open fails"
                    );
                    assert_eq!(*view, "an I/O error", "{what}: a crash ends the open");
                    drop(store);
                    next_open_works(dir.path(), &path, &what);
                    continue;
                }
                match *view {
                    "an I/O error" => assert_eq!(
                        names(dir.path()),
                        before,
                        "{what}: a failed open leaves the directory as it found it"
                    ),
                    "a kill" => {}
                    "a power cut" => lose_unsynced(dir.path(), &events),
                    _ => {
                        lose_unsynced(dir.path(), &events);
                        let dir_synced = events
                            .iter()
                            .any(|e| matches!(e, Event::Step(s) if s.contains("directory")));
                        if !dir_synced && !empty_file_first {
                            let _ = std::fs::remove_file(&path);
                        }
                    }
                }
                if let Ok(m) = std::fs::metadata(&path) {
                    let len = m.len();
                    assert!(
                        len == 0 || Store::builder().open_read_only(&path).is_ok(),
                        "{what}: the path is empty or a whole store ({len} bytes)"
                    );
                }
                next_open_works(dir.path(), &path, &what);
            }
        }
        if !reached {
            break;
        }
    }
    // The harness cut something: a creation of several steps, the link among them.
    assert!(steps.len() > 5, "a creation has its steps: {steps:?}");
    assert!(
        steps
            .iter()
            .any(|e| matches!(e, Event::Step(s) if s.starts_with("linking"))),
        "the new store is linked into place: {steps:?}"
    );
}

#[test]
fn a_missing_path() {
    cut_each_step(false);
}

#[test]
fn an_empty_file_a_deployment_created() {
    cut_each_step(true);
}

/// Opens racing to create one store: one handle holds it (the others are refused as
/// `AlreadyOpen`), no creation replaced another's file, and nothing is left beside it.
#[test]
fn racing_first_opens_make_one_store() {
    for round in 0..20 {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("store.redb");
        let barrier = std::sync::Barrier::new(4);
        let held: Vec<Option<Store>> = std::thread::scope(|s| {
            let opens: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        match small(Store::builder()).open(&path) {
                            Ok(store) => Some(store),
                            Err(idem::Error::AlreadyOpen { .. }) => None,
                            Err(e) => panic!("round {round}: a racing open failed: {e}"),
                        }
                    })
                })
                .collect();
            opens
                .into_iter()
                .map(|h| h.join().expect("no panic"))
                .collect()
        });
        let mut held: Vec<Store> = held.into_iter().flatten().collect();
        assert_eq!(held.len(), 1, "round {round}: one handle holds the store");
        let store = held.pop().expect("one handle");
        executed(store.execute(req("t", "op", "k", b"p"), |_| {
            Ok(Response::new(201, "made"))
        }));
        drop(store);
        let store = small(Store::builder()).open(&path).expect("it reopens");
        assert_eq!(
            record_rows(&store),
            1,
            "round {round}: the holder's claim is in the file"
        );
        drop(store);
        assert_eq!(names(dir.path()), ["store.redb", "store.redb.journal"]);
    }
}

/// A leftover is only a name a creation gives: a caller's file named alike stays, and so does
/// what a relative path's creation is writing.
#[test]
fn only_a_creations_leftovers_are_removed() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("store.redb");
    std::fs::write(dir.path().join("store.redb.new.bak"), b"mine").expect("a caller's file");
    std::fs::write(dir.path().join("store.redb.new.1-2"), b"left").expect("a leftover");
    drop(small(Store::builder()).open(&path).expect("it opens"));
    assert_eq!(
        names(dir.path()),
        ["store.redb", "store.redb.journal", "store.redb.new.bak"]
    );
}
