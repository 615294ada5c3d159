//! The expiry index holds exactly one entry per record — at the instant its next sweep action
//! is due, with its state — and nothing else, after every kind of write: claims, replays,
//! leases begun, heartbeated, completed, failed, released, dropped and taken over, purges,
//! re-claims of forgotten keys, and sweeps. (`Store::check_expiry_index` is the invariant a
//! fuzzer checks too.) A damaged record's entry that can no longer be located is dropped by the
//! sweep.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::*;
use idem::store::Stats;
use idem::{Abort, BeginAnswer, Response, Scope, Store};

const SECOND: Duration = Duration::from_secs(1);

#[track_caller]
fn check(store: &Store, step: &str) {
    if let Err(e) = store.check_expiry_index() {
        panic!("after {step}: {e}");
    }
    let s: Stats = store.stats().expect("stats");
    assert_eq!(
        s.pending + s.completed + s.failed + s.tombstones,
        s.records,
        "after {step}: {s:?}"
    );
}

#[test]
fn every_record_has_exactly_one_entry_after_a_mixed_workload() {
    let h = Harness::with(|b| {
        b.lease_duration(10 * SECOND)
            .retention(60 * SECOND)
            .retention_for("short", 20 * SECOND)
            .tombstone_horizon(120 * SECOND)
            .sweep_batch(7)
    });
    let store = h.store();
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let ops = ["create", "short"];
    let mut leases = Vec::new();
    let (mut takeovers, mut tombstoned, mut deleted) = (0, 0, 0);
    for step in 0..1500 {
        let op = ops[rng.below(2) as usize];
        let key = format!("k{}", rng.below(40));
        let payload: &[u8] = if rng.below(10) == 0 { b"other" } else { b"p" };
        let what = rng.below(12);
        let request = req("t", op, &key, payload);
        let label = match what {
            0..=2 => {
                let _ = store.execute(request, |tx| {
                    bump(tx, "effects")?;
                    Ok(Response::new(201, "ok").with_resource("thing", "1"))
                });
                "execute"
            }
            3 => {
                let _ = store.execute(request, |_| Err(Abort::terminal(Response::new(409, "no"))));
                "execute terminal"
            }
            4 => {
                let _ = store.execute(request, |_| Err(Abort::retryable("later")));
                "execute retryable"
            }
            5 | 6 => {
                if let Ok(BeginAnswer::Acquired(lease)) = store.begin(request) {
                    takeovers += u32::from(lease.takeover_of().is_some());
                    leases.push(lease);
                }
                "begin"
            }
            7 => {
                if let Some(mut lease) = take(&mut leases, &mut rng) {
                    let _ = lease.heartbeat();
                    leases.push(lease);
                }
                "heartbeat"
            }
            8 => {
                if let Some(lease) = take(&mut leases, &mut rng) {
                    let _ = match rng.below(3) {
                        0 => lease.complete(Response::new(200, "done")),
                        1 => lease.fail(Response::new(402, "declined")),
                        _ => lease.complete_with(|tx| {
                            bump(tx, "effects")?;
                            Ok(Response::new(200, "with writes"))
                        }),
                    };
                }
                "finish"
            }
            9 => {
                match take(&mut leases, &mut rng) {
                    Some(lease) if rng.below(2) == 0 => {
                        let _ = lease.release();
                    }
                    Some(lease) => drop(lease),
                    None => {}
                }
                "release or drop"
            }
            10 => {
                store.purge(&Scope::new("t", op), &key).expect("purge");
                "purge"
            }
            _ => {
                let report = store.sweep().expect("sweep");
                assert!(report.batches <= report.swept().div_ceil(7) + 1);
                tombstoned += report.tombstoned;
                deleted += report.deleted;
                "sweep"
            }
        };
        h.clock.advance(Duration::from_millis(rng.below(4_000)));
        check(store, &format!("step {step} ({label})"));
    }
    // The workload reached every path it is meant to.
    assert!(takeovers > 0 && tombstoned > 0 && deleted > 0);
    drop(leases);
    check(store, "dropping the remaining leases");
    h.clock.advance(200 * SECOND);
    store.sweep().expect("final sweep");
    check(store, "the final sweep");
    let s = store.stats().expect("stats");
    assert_eq!(s.records, 0, "everything was forgotten and swept: {s:?}");
}

fn take<T>(v: &mut Vec<T>, rng: &mut XorShift) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    let i = rng.below(v.len() as u64) as usize;
    Some(v.swap_remove(i))
}

#[test]
fn a_sweep_drops_the_entry_of_a_damaged_record_removed_by_purge() {
    let mut h = Harness::with(|b| b.retention(60 * SECOND).tombstone_horizon(60 * SECOND));
    executed(
        h.store()
            .execute(req("t", "op", "k", b"p"), |_| Ok(Response::new(201, "ok"))),
    );
    h.close();
    // Damage the record: its instants can no longer be read, so its entry cannot be located.
    overwrite_record(&h.path, &record_key("t", "op", b"k"), b"\x02garbage");
    h.reopen();
    let store = h.store();
    store
        .check_expiry_index()
        .expect("a damaged record's entry is tolerated");
    assert!(store.purge(&Scope::new("t", "op"), "k").expect("purge"));
    let orphan = store
        .check_expiry_index()
        .expect_err("the entry is now an orphan");
    assert!(orphan.contains("orphan"), "{orphan}");

    h.clock.advance(60 * SECOND);
    let report = store.sweep().expect("sweep");
    assert_eq!((report.repaired, report.swept()), (1, 0), "{report:?}");
    store.check_expiry_index().expect("repaired");
}
