//! A sweep pass handles everything due in write transactions of at most `sweep_batch` records,
//! each through the same commit path as claims; an idle pass writes nothing; the metrics report
//! every pass. Claims made while a pass runs in the background all complete.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use idem::{Durability, Response, Store};

const HOUR: Duration = Duration::from_secs(3600);

fn fill(store: &Store, prefix: &str, n: usize) {
    // Concurrent callers share commits, which keeps filling fast.
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                for i in (t..n).step_by(4) {
                    executed(
                        store.execute(req("t", "op", &format!("{prefix}{i}"), b"p"), |_| {
                            Ok(Response::new(201, "ok"))
                        }),
                    );
                }
            });
        }
    });
}

#[test]
fn a_pass_uses_batches_of_at_most_sweep_batch_records() {
    let h = Harness::with(|b| {
        b.retention(HOUR)
            .tombstone_horizon(2 * HOUR)
            .sweep_batch(1000)
            .durability(Durability::Periodic(HOUR))
    });
    let store = h.store();
    fill(store, "k", 2500);

    // Nothing due: no write transaction at all.
    let commits = store.metrics().commits;
    let idle = store.sweep().expect("idle sweep");
    assert_eq!((idle.swept(), idle.batches), (0, 0), "{idle:?}");
    assert_eq!(
        store.metrics().commits,
        commits,
        "an idle pass writes nothing"
    );

    h.clock.advance(HOUR);
    let shrink = store.sweep().expect("sweep");
    assert_eq!((shrink.tombstoned, shrink.deleted), (2500, 0), "{shrink:?}");
    assert_eq!(shrink.batches, 3, "2,500 records in batches of 1,000");

    h.clock.advance(HOUR);
    let delete = store.sweep().expect("sweep");
    assert_eq!(
        (delete.tombstoned, delete.deleted, delete.batches),
        (0, 2500, 3)
    );

    let m = store.metrics();
    assert_eq!(m.sweep_passes, 3);
    assert_eq!(m.swept_records, 5000);
    assert_eq!(m.last_sweep, delete);
    assert_eq!(m.sweep_failures, 0);
    assert_eq!(store.stats().expect("stats").records, 0);
    store.check_expiry_index().expect("index matches");
}

#[test]
fn claims_made_during_a_pass_all_complete() {
    let h = Harness::with(|b| {
        b.retention(HOUR)
            .tombstone_horizon(HOUR)
            .sweep_batch(100)
            .durability(Durability::Periodic(HOUR))
    });
    let store = h.store();
    fill(store, "old", 2000);
    h.clock.advance(HOUR);
    let sweeping = AtomicBool::new(true);
    let (report, claimed) = std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let r = store.sweep().expect("sweep");
            sweeping.store(false, Ordering::SeqCst);
            r
        });
        let claimers: Vec<_> = (0..3)
            .map(|t| {
                let sweeping = &sweeping;
                s.spawn(move || {
                    let mut n = 0;
                    while sweeping.load(Ordering::SeqCst) || n < 10 {
                        executed(
                            store.execute(req("t", "op", &format!("new-{t}-{n}"), b"p"), |_| {
                                Ok(Response::new(201, "ok"))
                            }),
                        );
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let report = sweeper.join().expect("sweeper");
        let claimed: usize = claimers
            .into_iter()
            .map(|c| c.join().expect("claimer"))
            .sum();
        (report, claimed)
    });
    assert_eq!(report.deleted, 2000, "{report:?}");
    assert!(report.batches >= 20, "{report:?}");
    assert_eq!(store.stats().expect("stats").records, claimed as u64);
    store.check_expiry_index().expect("index matches");
}

#[test]
fn sweep_with_progress_reports_after_every_batch() {
    let h = Harness::with(|b| b.sweep_batch(10));
    let store = h.store();
    for i in 0..35 {
        executed(store.execute(req("t", "op", &format!("k{i}"), b"p"), |_| {
            Ok(idem::Response::new(201, "ok"))
        }));
    }
    h.clock
        .advance(std::time::Duration::from_secs(30 * 24 * 3600));
    let mut seen = Vec::new();
    let report = store
        .sweep_with_progress(|r| seen.push((r.batches, r.swept())))
        .expect("sweep");
    assert_eq!(seen.len() as u64, report.batches);
    assert_eq!(seen.last().map(|s| s.1), Some(report.swept()));
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
    assert_eq!(report.swept(), 35);
}
