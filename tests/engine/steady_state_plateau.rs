//! At a constant claim rate with hourly sweeps, the record count and the file size stop growing:
//! sweeps delete what expired and redb reuses the freed pages.
//!
//! 20 claims per simulated hour (512-byte responses, so the file outgrows redb's initial
//! allocation), for 10 simulated days, retention 24 h and tombstones until 36 h, one sweep pass
//! per simulated hour. Without the sweeps the file quadruples by day 6 (it doubles in steps);
//! with them, record count and file size after day 2 stay within ±10% of day 2's. Claims are
//! made one at a time, so the run (and the file) is the same every time. Relaxed durability keeps
//! it fast; the file is a real redb file on disk.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::time::Duration;

use common::*;
use idem::store::Stats;
use idem::{Durability, Response};

const HOUR: Duration = Duration::from_secs(3600);
const CLAIMS_PER_HOUR: u32 = 20;
const DAYS: usize = 10;

#[test]
fn record_count_and_file_size_plateau_after_day_two() {
    let h = Harness::with(|b| {
        b.retention(24 * HOUR)
            .tombstone_horizon(36 * HOUR)
            .durability(Durability::Periodic(HOUR))
    });
    let store = h.store();
    let body = vec![b'x'; 512];
    // (day, stats, file bytes) at the end of each simulated day.
    let mut days: Vec<(usize, Stats, u64)> = Vec::new();
    for hour in 0..DAYS * 24 {
        for i in 0..CLAIMS_PER_HOUR {
            let key = format!("order-{hour:04}-{i:02}");
            executed(
                store.execute(req("tenant", "create_order", &key, key.as_bytes()), |_| {
                    Ok(Response::new(201, body.clone()).with_resource("order", key.clone()))
                }),
            );
            h.clock.advance(HOUR / CLAIMS_PER_HOUR);
        }
        store.sweep().expect("hourly sweep");
        if hour % 24 == 23 {
            let stats = store.stats().expect("stats");
            let size = std::fs::metadata(&h.path).expect("file size").len();
            days.push((hour / 24 + 1, stats, size));
        }
    }
    store
        .check_expiry_index()
        .expect("index matches the records");

    let (_, day2, size2) = days[1];
    // Records of the last 36 h are kept: 24 h in full, then 12 h as tombstones (a claim made
    // exactly 36 h before a sweep is already gone).
    let expected = u64::from(CLAIMS_PER_HOUR) * 36 - 1;
    assert_eq!(day2.records, expected, "day 2: {day2:?}");
    for (day, stats, size) in &days[2..] {
        let within = |v: u64, of: u64| v.abs_diff(of) * 10 <= of;
        assert!(
            within(stats.records, day2.records),
            "day {day}: {} records vs {} on day 2",
            stats.records,
            day2.records
        );
        assert!(
            within(*size, size2),
            "day {day}: the file is {size} bytes vs {size2} on day 2 (days: {:?})",
            days.iter().map(|d| d.2).collect::<Vec<_>>()
        );
        // Both tiers are there: the last 24 h in full (the claim made exactly 24 h before the
        // sweep has just become a tombstone), the 12 h before as tombstones.
        assert_eq!(
            stats.completed,
            u64::from(CLAIMS_PER_HOUR) * 24 - 1,
            "day {day}"
        );
        assert_eq!(
            stats.tombstones,
            stats.records - stats.completed,
            "day {day}"
        );
        assert_eq!(stats.due, 0, "day {day}: the sweep left nothing due");
    }
}
