//! I/O error loop: a small workload (a flow-A claim, a lease begin and
//! complete, an inbox message, an execute that pushes an outbox event, a sweep) runs on a
//! backend that fails its n-th I/O operation (write, `set_len` or `sync_data`), for
//! n = 0, 1, 2, … until the workload passes untouched — once failing a single time, once
//! failing persistently from n on. Each time:
//!
//! - the failing call returns a typed error (no panic): `Storage`, `OutcomeUnknown` or
//!   `FailStopped`;
//! - a failed commit latches the store (`failure().is_some()`) and later writes are refused;
//! - the durable image reopens cleanly; effects per key ≤ 1; a caller row exists iff its
//!   record / mark / outbox event does; every acknowledged step is present; the expiry index
//!   matches the records;
//! - the workload then completes on the reopened store with exactly one effect per key.
//!
//! Each test prints how many failure points it tried; run with `--nocapture` to see them.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::*;
use idem::clock::ManualClock;
use idem::format::State;
use idem::inbox::ProcessAnswer;
use idem::outbox::Event;
use idem::{Error, ExecuteAnswer, Response, Scope, Store, Timestamp};

fn open(backend: impl idem::redb::StorageBackend, clock: &ManualClock) -> Store {
    Store::builder()
        .clock(clock.clone())
        .open_with_backend(backend)
        .expect("open")
}

const STEPS: [&str; 5] = ["sweep", "claim", "lease", "inbox", "outbox"];

/// Runs step `step` of the workload; `Ok` means it was acknowledged.
fn run_step(store: &Store, clock: &ManualClock, step: &str) -> Result<(), Error> {
    match step {
        "claim" => {
            let r = store.execute(req("t", "op", "a", b"p"), |tx| {
                bump(tx, "a")?;
                Ok(Response::new(201, "a"))
            })?;
            assert!(matches!(
                r,
                ExecuteAnswer::Ran(_) | ExecuteAnswer::Replayed(_)
            ));
        }
        "lease" => match store.begin(req("t", "op", "L", b"p"))? {
            idem::BeginAnswer::Acquired(lease) => {
                lease.complete(Response::new(201, "charged"))?;
            }
            idem::BeginAnswer::Replayed(_) => {}
            other @ idem::BeginAnswer::Expired(_) => panic!("the lease key expired: {other:?}"),
            idem::BeginAnswer::InFlight { .. } => {
                // A lease whose completion was lost: take it over once it lapses.
                clock.advance(Duration::from_secs(31));
                let lease = acquired(store.begin(req("t", "op", "L", b"p")));
                lease.complete(Response::new(201, "charged"))?;
            }
        },
        "inbox" => {
            let r = store.process("sub", "m", |tx| {
                bump(tx, "m")?;
                Ok(())
            })?;
            assert!(matches!(
                r,
                ProcessAnswer::Ran(()) | ProcessAnswer::Duplicate { .. }
            ));
        }
        "outbox" => {
            let r = store.execute(req("t", "op", "o", b"p"), |tx| {
                bump(tx, "o")?;
                tx.outbox().push(Event::new("topic", b"x".to_vec()))?;
                Ok(Response::new(201, "o"))
            })?;
            assert!(matches!(
                r,
                ExecuteAnswer::Ran(_) | ExecuteAnswer::Replayed(_)
            ));
        }
        "sweep" => {
            // A claim moved past its response window and tombstone horizon gives the sweep
            // something to delete. Runs first, so no other key is ever forgotten; the clock
            // only moves forward, and only once.
            let _ = store.execute(req("t", "short", "x", b"p"), |_| {
                Ok(Response::new(200, "x"))
            })?;
            let target = Timestamp(T0.0 + 9 * 24 * 3600 * 1000);
            if store.now().0 < target.0 {
                clock.set(target);
            }
            store.sweep()?;
        }
        other => unreachable!("{other}"),
    }
    Ok(())
}

/// The invariants on a (reopened) store, given which steps were acknowledged.
fn check_invariants(store: &Store, acked: &[&str], ctx: &str) {
    for (label, n) in all_effects(store) {
        assert!(n <= 1, "{ctx}: {label} has {n} effects");
    }
    store
        .check_expiry_index()
        .unwrap_or_else(|e| panic!("{ctx}: expiry index: {e}"));
    let scope = Scope::new("t", "op");
    let a = store.get(&scope, "a").expect("get").is_some();
    assert_eq!(a, effects(store, "a") == 1, "{ctx}: claim half-applied");
    let m = store.inbox_mark("sub", "m").expect("mark").is_some();
    assert_eq!(m, effects(store, "m") == 1, "{ctx}: inbox half-applied");
    let o = store.get(&scope, "o").expect("get").is_some();
    let pending = store.outbox_stats().expect("stats").pending;
    assert!(pending <= 1, "{ctx}: {pending} outbox events");
    assert_eq!(
        o,
        effects(store, "o") == 1,
        "{ctx}: outbox execute half-applied"
    );
    assert_eq!(o, pending == 1, "{ctx}: record vs outbox event");
    let lease = store.get(&scope, "L").expect("get");
    for step in acked {
        match *step {
            "claim" => assert!(a, "{ctx}: acknowledged claim lost"),
            "inbox" => assert!(m, "{ctx}: acknowledged inbox mark lost"),
            "outbox" => assert!(o, "{ctx}: acknowledged outbox execute lost"),
            "lease" => assert!(
                matches!(lease.as_ref().map(|r| &r.state), Some(State::Completed(_))),
                "{ctx}: acknowledged completion lost: {lease:?}"
            ),
            _ => {}
        }
    }
}

/// Fails I/O operation n (once, or from n on) for n = 0, 1, … until the workload runs
/// untouched; returns the number of failure points tried.
fn error_loop(persistent: bool) -> u64 {
    let mut n = 0;
    let mut seen = std::collections::BTreeMap::<String, u64>::new();
    loop {
        let ctx = format!(
            "{} failure at I/O op {n}",
            if persistent { "persistent" } else { "single" }
        );
        let backend = CountingBackend::default();
        let clock = ManualClock::new(T0);
        let store = open(backend.clone(), &clock);
        backend.fail_at(n, persistent);
        let mut acked = Vec::new();
        let mut failed = None;
        for step in STEPS {
            match run_step(&store, &clock, step) {
                Ok(()) => acked.push(step),
                Err(e) => {
                    failed = Some((step, e));
                    break;
                }
            }
        }
        let injected = backend.disarm();
        if injected == 0 {
            assert!(
                failed.is_none(),
                "{ctx}: {failed:?} without an injected fault"
            );
            eprintln!("errors seen (persistent={persistent}): {seen:?}");
            return n;
        }
        let (step, err) = failed.unwrap_or_else(|| {
            panic!("{ctx}: {injected} faults injected but every step succeeded")
        });
        assert!(
            matches!(
                err,
                Error::Storage { .. } | Error::OutcomeUnknown { .. } | Error::FailStopped { .. }
            ),
            "{ctx}: {step}: untyped or unexpected error {err:?}"
        );
        assert!(
            store.fail_stop_cause().is_some(),
            "{ctx}: {step} failed ({err:?}) but the store did not latch"
        );
        // Latched: the disk works again, the store still refuses writes.
        let refused = store.execute(req("t", "op", "after", b"p"), |_| {
            Ok(Response::new(200, "x"))
        });
        assert!(
            matches!(refused, Err(Error::FailStopped { .. })),
            "{ctx}: {refused:?}"
        );
        drop(store);
        let variant = format!("{step}: {err:?}");
        let variant = variant
            .split(['{', '('])
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        *seen.entry(variant).or_default() += 1;

        let reopened = open(backend.crash(), &clock);
        assert!(reopened.fail_stop_cause().is_none(), "{ctx}");
        check_invariants(&reopened, &acked, &ctx);
        // The workload finishes after the reopen, with exactly one effect per key.
        for step in STEPS {
            run_step(&reopened, &clock, step)
                .unwrap_or_else(|e| panic!("{ctx}: rerun {step}: {e:?}"));
        }
        check_invariants(&reopened, &STEPS, &format!("{ctx}, after the rerun"));
        for key in ["a", "m", "o"] {
            assert_eq!(effects(&reopened, key), 1, "{ctx}: {key}");
        }
        n += 1;
    }
}

#[test]
fn a_single_io_failure_at_every_point() {
    let points = error_loop(false);
    eprintln!("I/O failure points tried (single failure): {points}");
    assert!(points >= STEPS.len() as u64);
}

#[test]
fn a_persistent_io_failure_from_every_point() {
    let points = error_loop(true);
    eprintln!("I/O failure points tried (persistent failure): {points}");
    assert!(points >= STEPS.len() as u64);
}
