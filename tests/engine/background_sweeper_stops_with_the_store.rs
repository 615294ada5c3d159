//! The optional background sweeper runs passes on its own (here every 2 ms of real time, while
//! the manual clock decides what is due), and its thread ends when the last handle to the
//! store — clones and leases included — is dropped: no thread is left behind.
//!
//! The waits below are bounded polls for another thread, never sleeps that make simulated time
//! pass.

// White-box hooks (`Store::check_expiry_index`, `Store::sweeper_liveness`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::sync::Weak;
use std::time::{Duration, Instant};

use common::*;
use idem::{Response, Store};

const HOUR: Duration = Duration::from_secs(3600);
const PATIENCE: Duration = Duration::from_secs(20);

fn sweeping() -> Harness {
    Harness::with(|b| {
        b.retention(HOUR)
            .tombstone_horizon(HOUR)
            .sweep_interval(Duration::from_millis(2))
    })
}

/// Polls `done` until it holds or `PATIENCE` runs out.
#[track_caller]
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn claim(store: &Store, key: &str) {
    executed(store.execute(req("t", "op", key, b"p"), |_| Ok(Response::new(201, "ok"))));
}

#[test]
fn the_background_sweeper_deletes_what_is_due_without_being_asked() {
    let h = sweeping();
    let store = h.store();
    for i in 0..50 {
        claim(store, &format!("k{i}"));
    }
    // Nothing is due yet: passes run, and sweep nothing.
    eventually("a first pass", || store.metrics().sweep_passes >= 1);
    assert_eq!(store.stats().expect("stats").records, 50);

    h.clock.advance(HOUR);
    // The pass's counters are published when the pass ends, after its last batch commits: wait
    // for both, or the check races the end of the pass.
    eventually("the records to be swept and the pass counted", || {
        store.stats().expect("stats").records == 0 && store.metrics().swept_records >= 50
    });
    let m = store.metrics();
    assert_eq!(m.swept_records, 50, "{m:?}");
    assert_eq!(m.sweep_failures, 0);
    store.check_expiry_index().expect("index matches");
}

#[test]
fn the_sweeper_thread_ends_when_the_last_handle_drops() {
    let mut h = sweeping();
    let store = h.store().clone();
    let alive: Weak<()> = store.sweeper_liveness().expect("a sweeper runs");
    assert!(alive.upgrade().is_some());
    let lease = acquired(store.begin(req("t", "op", "leased", b"p")));

    // The harness's handle goes; a clone and a lease still hold the store.
    h.close();
    eventually("one more pass", || store.metrics().sweep_passes >= 2);
    assert!(alive.upgrade().is_some(), "the store is still in use");
    drop(store);
    assert!(alive.upgrade().is_some(), "the lease still holds the store");

    drop(lease); // releases the key, then drops the last handle
    eventually("the sweeper thread to end", || alive.upgrade().is_none());
}

#[test]
fn without_a_sweep_interval_there_is_no_thread() {
    let h = Harness::new();
    assert!(h.store().sweeper_liveness().is_none());
}
