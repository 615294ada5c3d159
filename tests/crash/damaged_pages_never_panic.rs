//! No store file makes the library panic. A cleanly closed
//! store with 800 records gets 8 bytes flipped inside one page — the header page for
//! some seeds, the start of a page (its header, its key offsets) for others, anywhere in a page
//! for the rest — and every `Store` call on it returns `Ok` or a typed error; none panics.
//!
//! redb (5.0, as 4.6) verifies page checksums only when it repairs a file, so on a cleanly closed file it
//! trusts the damaged lengths and offsets and, for some of these seeds, indexes out of bounds or
//! unwraps a decoding error. idem contains those panics at its storage boundary (src/engine/boundary.rs)
//! and reports `Error::CorruptStore` (fail-stop once it happened inside a write). Before that
//! boundary (e693a17), 21 of these 60 seeds panicked at their first call on the damaged data:
//! `Store::open` 1, `get` 1, `stats` 4, `execute` 1, and a walk over every record (then done
//! with `Store::read_transaction`, as `idem export` did; now `Store::for_each_record`) 14.

use crate::common;
use crate::damage;

use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use damage::{PAGE, build_store, damage};
use idem::clock::ManualClock;
use idem::{Durability, Error, Request, Response, Scope, Store, Timestamp};

/// Records in the store: enough for several levels of redb's B-trees, few enough for a quick
/// test in a debug build (the CLI test, tests/cli/cli_damaged_file_never_panics.rs, uses 3,000).
const RECORDS_N: usize = 800;
const SEEDS: u64 = 60;
/// Inbox messages (each with an outbox event and a version mark) in the messaging store.
const MESSAGES_N: usize = 600;

/// The bytes of a cleanly closed store with `RECORDS_N` records (built once per test binary).
fn store_bytes() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        build_store(&dir.path().join("base.redb"), RECORDS_N)
    })
}

/// Counts panics raised inside redb (contained or not), and keeps the default report for every
/// other panic (a failing assertion of this test).
static REDB_PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_redb_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.location().is_some_and(|l| l.file().contains("redb-")) {
            REDB_PANICS.fetch_add(1, Ordering::Relaxed);
        } else {
            default(info);
        }
    }));
}

/// Runs one store call; a panic out of it fails the test with the seed and the call.
fn call<T>(ctx: &str, what: &str, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("{ctx}: {what} panicked"))
}

/// Every `Store` call on a damaged file is `Ok` or a typed error.
#[test]
fn every_store_call_on_a_damaged_page_is_ok_or_a_typed_error() {
    count_redb_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let image = store_bytes();
    let path = dir.path().join("damaged.redb");
    let (mut opened, mut errors) = (0, Vec::new());
    for seed in 0..SEEDS {
        let (damaged, at) = damage(image, seed);
        std::fs::write(&path, &damaged).expect("write");
        let ctx = format!("seed {seed} (8 bytes at {at}, page {})", at / PAGE);
        let clock = ManualClock::new(T0);
        // Durability does not matter here, time does: no fsync per commit.
        let open = call(&ctx, "Store::open", || {
            Store::builder()
                .clock(clock.clone())
                .durability(Durability::Periodic(Duration::from_secs(3600)))
                .open(&path)
        });
        let mut store = match open {
            Ok(store) => store,
            Err(e) => {
                errors.push(format!("{ctx}: open: {e}"));
                continue;
            }
        };
        opened += 1;
        let scope = Scope::new("t", "op");
        let mut results: Vec<(&str, Result<(), String>)> = Vec::new();
        let typed = |r: Result<(), Error>| r.map_err(|e| e.to_string());
        for i in [0, 1, 7, RECORDS_N / 2, RECORDS_N - 1] {
            let key = format!("key-{i:05}");
            let got = call(&ctx, "get", || store.get(&scope, &key));
            results.push(("get", typed(got.map(|_| ()))));
        }
        results.push((
            "stats",
            typed(call(&ctx, "stats", || store.stats()).map(|_| ())),
        ));
        let walk = call(&ctx, "for_each_record", || {
            store.for_each_record(|_, _| ControlFlow::Continue(()))
        });
        results.push(("for_each_record", typed(walk)));
        let replay = call(&ctx, "execute (replay)", || {
            store.execute(req("t", "op", "key-00001", b"p"), |_| {
                Ok(Response::new(500, "must not run"))
            })
        });
        results.push(("execute (replay)", typed(replay.map(|_| ()))));
        let fresh = call(&ctx, "execute (new key)", || {
            store.execute(
                Request::from_canonical_bytes(scope.clone(), "new", b"p"),
                |_| Ok(Response::new(201, "new")),
            )
        });
        results.push(("execute (new key)", typed(fresh.map(|_| ()))));
        let purged = call(&ctx, "purge", || store.purge(&scope, "key-00002"));
        results.push(("purge", typed(purged.map(|_| ()))));
        // Past every record's horizon: the sweep deletes them all (touching every page).
        clock.set(Timestamp(T0.0 + 30 * 24 * 3600 * 1000));
        let swept = call(&ctx, "sweep", || store.sweep());
        results.push(("sweep", typed(swept.map(|_| ()))));
        let checked = call(&ctx, "check_integrity", || store.check_integrity());
        results.push(("check_integrity", typed(checked.map(|_| ()))));
        let compacted = call(&ctx, "compact", || store.compact());
        results.push(("compact", typed(compacted.map(|_| ()))));
        call(&ctx, "dropping the store", || drop(store));
        for (what, r) in results {
            if let Err(e) = r {
                errors.push(format!("{ctx}: {what}: {e}"));
            }
        }
    }
    for e in &errors {
        eprintln!("{e}");
    }
    eprintln!(
        "{SEEDS} damaged files: {opened} opened, {} typed errors, {} redb panics contained",
        errors.len(),
        REDB_PANICS.load(Ordering::Relaxed)
    );
    assert!(!errors.is_empty(), "the damage was never noticed");
}

/// The same damage through the record walk and the read-only store (the CLI's paths): `Ok` or a
/// typed error, and a damaged page is `CorruptStore`, never a panic.
#[test]
fn the_record_walk_and_the_read_only_store_contain_damaged_pages() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = store_bytes();
    let path = dir.path().join("damaged.redb");
    let mut corrupt = 0;
    for seed in 0..SEEDS {
        let (damaged, at) = damage(image, seed);
        std::fs::write(&path, &damaged).expect("write");
        let ctx = format!("seed {seed} (8 bytes at {at})");
        let ro = call(&ctx, "open_read_only", || {
            Store::builder()
                .clock(ManualClock::new(T0))
                .open_read_only(&path)
        });
        if let Ok(ro) = ro {
            let scope = Scope::new("t", "op");
            let mut results = vec![
                call(&ctx, "get", || ro.get(&scope, "key-00001")).map(|_| ()),
                call(&ctx, "stats", || ro.stats()).map(|_| ()),
                call(&ctx, "outbox_stats", || ro.outbox_stats()).map(|_| ()),
                call(&ctx, "dead_letters", || ro.dead_letters(10)).map(|_| ()),
                call(&ctx, "pending_events", || ro.pending_events(10)).map(|_| ()),
            ];
            results.push(call(&ctx, "for_each_record", || {
                ro.for_each_record(|_, _| ControlFlow::Continue(()))
            }));
            corrupt += results
                .iter()
                .filter(|r| matches!(r, Err(Error::CorruptStore { .. })))
                .count();
        }
        // The read-only open wrote nothing.
        assert_eq!(std::fs::read(&path).expect("read"), damaged, "{ctx}");
        // Without the open-time check, so the walk meets the damaged pages itself (it only
        // reads: no commit, which is where an unchecked damaged file can abort the process).
        if let Ok(store) = call(&ctx, "open", || {
            Store::builder()
                .clock(ManualClock::new(T0))
                .verify_on_open(false)
                .open(&path)
        }) {
            let walk = call(&ctx, "Store::for_each_record", || {
                store.for_each_record(|_, _| ControlFlow::Continue(()))
            });
            corrupt += usize::from(matches!(walk, Err(Error::CorruptStore { .. })));
        }
    }
    assert!(corrupt > 0, "no seed gave CorruptStore");
}

/// The same damage under the messaging tables: every inbox, outbox and version read of a
/// `Store` (and a new message processed on it) is `Ok` or a typed error, never a panic.
#[test]
fn messaging_reads_on_a_damaged_page_are_ok_or_a_typed_error() {
    count_redb_panics();
    let dir = tempfile::tempdir().expect("tempdir");
    let image = damage::build_messaging_store(&dir.path().join("base.redb"), MESSAGES_N);
    let path = dir.path().join("damaged.redb");
    let mut errors = 0;
    for seed in 0..SEEDS {
        let (damaged, at) = damage(&image, seed);
        std::fs::write(&path, &damaged).expect("write");
        let ctx = format!("seed {seed} (8 bytes at {at}, page {})", at / PAGE);
        let open = call(&ctx, "Store::open", || {
            Store::builder()
                .clock(ManualClock::new(T0))
                .durability(Durability::Periodic(Duration::from_secs(3600)))
                .open(&path)
        });
        let Ok(store) = open else {
            errors += 1;
            continue;
        };
        let mut results: Vec<Result<(), Error>> = vec![
            call(&ctx, "outbox_stats", || store.outbox_stats()).map(|_| ()),
            call(&ctx, "pending_events", || store.pending_events(usize::MAX)).map(|_| ()),
            call(&ctx, "dead_letters", || store.dead_letters(usize::MAX)).map(|_| ()),
        ];
        for i in [0, 1, MESSAGES_N / 2, MESSAGES_N - 1] {
            results.push(
                call(&ctx, "inbox_mark", || {
                    store.inbox_mark("sub", damage::key(i))
                })
                .map(|_| ()),
            );
            results.push(
                call(&ctx, "high_water_mark", || {
                    store.high_water_mark(format!("entity-{i:05}"))
                })
                .map(|_| ()),
            );
            // A redelivery reads the mark before it writes anything.
            results.push(
                call(&ctx, "process (redelivery)", || {
                    store.process("sub", damage::key(i), |_| -> Result<(), idem::Abort> {
                        Ok(())
                    })
                })
                .map(|_| ()),
            );
        }
        call(&ctx, "dropping the store", || drop(store));
        errors += results.iter().filter(|r| r.is_err()).count();
    }
    assert!(errors > 0, "the damage was never noticed");
}

/// A panic in the caller's own closure is still the caller's, also on a store whose file is
/// damaged elsewhere: it reaches the caller, and the store keeps working (no fail-stop).
#[test]
fn a_closure_panic_is_still_the_callers() {
    let h = Harness::new();
    let store = h.store();
    let r = catch_unwind(AssertUnwindSafe(|| {
        store.execute(req("t", "op", "k", b"p"), |_| -> Result<Response, _> {
            panic!("caller bug")
        })
    }));
    let payload = r.expect_err("the closure's panic reaches its caller");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"caller bug"));
    assert_eq!(store.fail_stop_cause(), None);
    executed(store.execute(req("t", "op", "k", b"p"), |_| Ok(Response::new(201, "ok"))));
    let walk = catch_unwind(AssertUnwindSafe(|| {
        store.for_each_record(|_, _| -> ControlFlow<()> { panic!("walker bug") })
    }));
    assert!(
        walk.is_err(),
        "a panic in the walk's callback is the caller's"
    );
    assert_eq!(store.fail_stop_cause(), None);
}

/// A contained panic may be damage or a bug, and the message says so: it sends the operator to
/// `idem check` on a copy, and warns against restoring an older copy of an idempotency store
/// (every intent completed since would run again). No `CorruptStore` message advises a restore
/// without that warning.
#[test]
fn a_contained_panic_says_it_may_be_a_bug_and_warns_against_restoring_an_older_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("damaged.redb");
    let mut contained = 0;
    for seed in 0..SEEDS {
        let (damaged, _) = damage(store_bytes(), seed);
        std::fs::write(&path, &damaged).expect("write");
        // Read-only: no open-time check, so the walk meets the damaged pages itself.
        let Ok(store) = Store::builder()
            .clock(ManualClock::new(T0))
            .open_read_only(&path)
        else {
            continue;
        };
        let Err(e) = store.for_each_record(|_, _| ControlFlow::Continue(())) else {
            continue;
        };
        let Error::CorruptStore { reason } = &e else {
            continue;
        };
        // The walk's own contained panics (not a damage redb reported as an error).
        if !reason.contains("while reading the records") {
            continue;
        }
        contained += 1;
        assert!(
            reason.contains("redb or idem panicked while reading the records"),
            "{reason}"
        );
        assert!(reason.contains("a damaged page, or a bug"), "{reason}");
        assert!(reason.contains("idem check"), "{reason}");
        assert!(reason.contains("if it passes, this is a bug"), "{reason}");
        assert!(reason.contains("do not restore an older copy"), "{reason}");
        assert!(
            e.to_string().contains("would run again"),
            "the advice to restore a backup warns: {e}"
        );
    }
    assert!(contained > 0, "no walk hit a contained panic");
    let plain = Error::CorruptStore {
        reason: "any".into(),
    }
    .to_string();
    assert!(plain.contains("would run again"), "{plain}");
    let record = Error::CorruptRecord {
        reason: "any".into(),
    }
    .to_string();
    assert!(record.contains("would run again"), "{record}");
}
