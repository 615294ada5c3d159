//! Failures during open and recovery, which `io_error_loop` leaves out (it arms its countdown
//! after `open`).
//!
//! A store image with committed state — five flow-A claims (each with a caller row), a live
//! lease (a Pending record), an inbox mark, an outbox event — is taken in several shapes:
//!
//! - **crash**: the durable image while the store was still open (no clean shutdown, so redb
//!   runs its recovery on the next open);
//! - **clean**: the crash image opened once and closed cleanly;
//! - **torn**: every torn-commit image of one more claim made on top of the state (the writes
//!   of a commit reached the disk in order, its sync never ran), and the durable image after
//!   its sync.
//!
//! For each image, `Store::builder()…open_with_backend(..)` runs on a backend that fails its
//! n-th I/O operation (write, `set_len` or `sync_data`, counted from just before `open`), once
//! or persistently from n on, for n = 0, 1, 2, … until the open passes untouched. Each attempt:
//!
//! - returns `Ok` or a typed `idem::Error` (never a panic);
//! - then a clean reopen of what was durable succeeds, every committed claim replays with its
//!   body and exactly one effect, the lease's record is still there (and, its holder gone with
//!   the store that granted it, taken over at once by the next `begin`), the inbox mark and the outbox
//!   event are there, the optional extra claim is whole or absent, and the expiry index matches.
//!
//! The test prints, per image, the I/O operations a clean open makes (redb's recovery writes,
//! or the commit of its open-time check of every page) and how many failure points were tried; run with
//! `--nocapture` to see them.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};

use common::*;
use idem::clock::ManualClock;
use idem::format::State;
use idem::inbox::ProcessAnswer;
use idem::outbox::Event;
use idem::{BeginAnswer, Error, ExecuteAnswer, Response, Scope, Store};

const CLAIMS: usize = 5;

fn builder(clock: &ManualClock) -> idem::StoreBuilder {
    Store::builder().clock(clock.clone())
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, Error> {
    store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, format!("{key} created")))
    })
}

/// The base images to open, with their names, and whether the "extra" claim may be present.
fn base_images(clock: &ManualClock) -> Vec<(String, Vec<u8>)> {
    let backend = CountingBackend::default();
    let store = builder(clock)
        .open_with_backend(backend.clone())
        .expect("open");
    for i in 0..CLAIMS {
        assert!(matches!(
            claim(&store, &format!("c{i}")),
            Ok(ExecuteAnswer::Ran(_))
        ));
    }
    let lease = acquired(store.begin(req("t", "op", "L", b"p")));
    let r = store.process("sub", "m", |tx| {
        bump(tx, "m")?;
        Ok(())
    });
    assert!(matches!(r, Ok(ProcessAnswer::Ran(()))), "{r:?}");
    let r = store.execute(req("t", "op", "o", b"p"), |tx| {
        bump(tx, "o")?;
        tx.outbox().push(Event::new("topic", b"x".to_vec()))?;
        Ok(Response::new(201, "o created"))
    });
    assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");

    let mut images = Vec::new();
    let crash = backend.inner.durable_image();
    images.push(("crash".to_owned(), crash.clone()));

    // One more claim: its torn-commit images and its sync image.
    backend.mark();
    assert!(matches!(claim(&store, "extra"), Ok(ExecuteAnswer::Ran(_))));
    for (i, (_, image)) in backend.torn_images().into_iter().enumerate() {
        images.push((format!("torn write {i}"), image));
    }
    images.push((
        "after the extra claim's sync".to_owned(),
        backend.image_at_sync(backend.syncs()),
    ));
    // The lease is never released (the process "died" holding it).
    std::mem::forget(lease);

    // The crash image, recovered once and closed cleanly (the lease record stays Pending).
    let clean = crash_backend_from_image(crash);
    let reopened = builder(clock)
        .open_with_backend(clean.clone())
        .expect("reopen the crash image");
    drop(reopened);
    assert_eq!(
        clean.live_image(),
        clean.durable_image(),
        "a clean close leaves nothing unsynced"
    );
    images.insert(1, ("clean".to_owned(), clean.durable_image()));
    images
}

/// The lease's holder died with the store that granted it, so `store` takes it over at once
/// (attempt 2). Writes: the last check made of a store.
fn check_takeover(store: &Store, ctx: &str) {
    match store.begin(req("t", "op", "L", b"p")) {
        Ok(BeginAnswer::Acquired(lease)) => assert_eq!(lease.takeover_of(), Some(1), "{ctx}"),
        other => panic!("{ctx}: the dead holder's lease was not taken over: {other:?}"),
    }
}

/// The committed state is all there on a store opened from `image`, whole.
fn check_state(store: &Store, ctx: &str) {
    for i in 0..CLAIMS {
        let key = format!("c{i}");
        let r = claim(store, &key).unwrap_or_else(|e| panic!("{ctx}: retry {key}: {e:?}"));
        match r {
            ExecuteAnswer::Replayed(resp) => {
                assert_eq!(resp.body(), format!("{key} created").as_bytes())
            }
            other => panic!("{ctx}: {key} did not replay: {other:?}"),
        }
        assert_eq!(effects(store, &key), 1, "{ctx}: {key}");
    }
    let lease = store.get(&Scope::new("t", "op"), "L").expect("get L");
    assert!(
        matches!(lease.map(|r| r.state), Some(State::Pending { .. })),
        "{ctx}: the lease's record was lost"
    );
    assert!(
        store.inbox_mark("sub", "m").expect("mark").is_some(),
        "{ctx}: inbox mark lost"
    );
    assert_eq!(effects(store, "m"), 1, "{ctx}");
    assert_eq!(
        store.outbox_stats().expect("stats").pending,
        1,
        "{ctx}: outbox event"
    );
    assert_eq!(effects(store, "o"), 1, "{ctx}");
    let extra = store
        .get(&Scope::new("t", "op"), "extra")
        .expect("get extra")
        .is_some();
    assert_eq!(
        extra,
        effects(store, "extra") == 1,
        "{ctx}: extra half-applied"
    );
    for (label, n) in all_effects(store) {
        assert!(n <= 1, "{ctx}: {label} has {n} effects");
    }
    store
        .check_expiry_index()
        .unwrap_or_else(|e| panic!("{ctx}: expiry index: {e}"));
    assert!(store.fail_stop_cause().is_none(), "{ctx}");
}

/// The I/O operations a clean open of `image` makes: (all ops, of which syncs).
fn ops_of_a_clean_open(image: &[u8], clock: &ManualClock) -> (u64, usize) {
    let backend = CountingBackend {
        inner: crash_backend_from_image(image.to_vec()),
        state: Default::default(),
    };
    backend.mark();
    backend.fail_at(u64::MAX, false);
    let store = builder(clock)
        .open_with_backend(backend.clone())
        .expect("clean open");
    let ops = backend.counting().ops;
    let syncs = backend.syncs();
    drop(store);
    (ops, syncs)
}

/// Fails I/O op n (once / from n on) during the open of `image`, for n = 0, 1, … until the
/// open passes untouched. Returns the failure points tried and the errors seen by variant.
fn open_loop(
    name: &str,
    image: &[u8],
    clock: &ManualClock,
    persistent: bool,
    errors: &mut BTreeMap<String, u64>,
) -> u64 {
    for n in 0.. {
        let ctx = format!(
            "{name}: {} failure at open I/O op {n}",
            if persistent { "persistent" } else { "single" }
        );
        let backend = CountingBackend {
            inner: crash_backend_from_image(image.to_vec()),
            state: Default::default(),
        };
        backend.fail_at(n, persistent);
        let opened = catch_unwind(AssertUnwindSafe(|| {
            builder(clock).open_with_backend(backend.clone())
        }));
        let injected = backend.disarm();
        let opened = opened.unwrap_or_else(|_| panic!("{ctx}: open panicked"));
        match opened {
            Ok(store) => {
                if injected == 0 {
                    check_state(&store, &ctx);
                    check_takeover(&store, &ctx);
                    drop(store);
                    return n;
                }
                // An I/O failure the open absorbed: the store must be usable or latched.
                *errors.entry("Ok (absorbed)".into()).or_default() += 1;
                if store.fail_stop_cause().is_none() {
                    check_state(&store, &format!("{ctx}, the store that opened"));
                }
                drop(store);
            }
            Err(e) => {
                assert!(injected > 0, "{ctx}: {e:?} without an injected fault");
                assert!(
                    matches!(
                        e,
                        Error::Storage { .. }
                            | Error::OutcomeUnknown { .. }
                            | Error::FailStopped { .. }
                    ),
                    "{ctx}: unexpected error {e:?}"
                );
                let variant = format!("{e:?}");
                let variant = variant
                    .split(['{', '(', ' '])
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                *errors.entry(variant).or_default() += 1;
            }
        }
        // Power comes back: what was durable must open cleanly and hold every commit.
        let durable = backend.crash().durable_image();
        let reopened = catch_unwind(AssertUnwindSafe(|| {
            builder(clock).open_with_backend(crash_backend_from_image(durable))
        }))
        .unwrap_or_else(|_| panic!("{ctx}: the reopen panicked"))
        .unwrap_or_else(|e| panic!("{ctx}: the durable image does not reopen: {e:?}"));
        check_state(&reopened, &format!("{ctx}, after the reopen"));
        check_takeover(&reopened, &format!("{ctx}, after the reopen"));
    }
    unreachable!()
}

fn run(persistent: bool) {
    let clock = ManualClock::new(T0);
    let images = base_images(&clock);
    let mut total = 0;
    let mut errors = BTreeMap::new();
    for (name, image) in &images {
        let (ops, syncs) = ops_of_a_clean_open(image, &clock);
        let points = open_loop(name, image, &clock, persistent, &mut errors);
        assert!(points >= 1, "{name}: the open did no I/O");
        eprintln!(
            "open of the {name} image: {ops} I/O ops ({syncs} syncs) on a clean open, {points} failure points tried"
        );
        total += points;
    }
    eprintln!(
        "open failure points tried ({} failure): {total} over {} images; outcomes: {errors:?}",
        if persistent { "persistent" } else { "single" },
        images.len()
    );
}

#[test]
fn a_single_io_failure_at_every_point_of_open() {
    run(false);
}

#[test]
fn a_persistent_io_failure_from_every_point_of_open() {
    run(true);
}
