//! Retention costs: how fast a sweep goes, what a sweep of 100,000 expired records does to
//! concurrent claims, and how many bytes on disk a record costs before and after compaction.
//!
//! ```text
//! cargo bench -p idem-benches --bench retention                              # 100,000 records
//! IDEM_BENCH_RECORDS=20000 cargo bench -p idem-benches --bench retention     # a quicker run
//! ```
//!
//! Optional: `IDEM_BENCH_DIR` (parent of the temp dir; default the system temp dir),
//! `IDEM_BENCH_RECORDS` (records to sweep, default 100,000).
//!
//! Steps, on one real file, with time driven by a manual clock so "expired" is exact:
//! 1. fill: 8 threads claim N new keys (flow A, no caller write, so the file holds idem's own
//!    bytes only; relaxed durability to fill quickly). The store is closed and the file measured:
//!    **bytes per record, live**, with the share of the records table and the expiry index
//!    (redb's own table statistics);
//! 2. compact (`Store::compact`) and measure again: **bytes per record after compaction**;
//! 3. reopen with `Durability::Immediate` (an fsync per commit, the default), move the clock past
//!    the retention, and sweep alone: the N records shrink to tombstones (**sweep throughput,
//!    shrinking**);
//! 4. 4 claimer threads claim new keys (with a one-row caller write each) for 4 s, nothing
//!    sweeping: **baseline claim latency** (median, p99, max);
//! 5. move the clock past the tombstone horizon and run the same claimers while `Store::sweep`
//!    deletes the N tombstones in batches of 1,000: **latency of the claims that overlapped the
//!    sweep**, and **sweep throughput, deleting, with claimers**. Every claim must succeed;
//! 6. the file after the sweep (freed pages stay in the file for reuse) and after compacting again.
//!
//! Claimers use an operation with a longer retention, so nothing they write becomes due. A custom
//! harness (std threads) because criterion measures one caller at a time. One run on whatever
//! machine runs it: other load on the machine shows up in the tails.

use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bench_common::{bench_parent, env_parse, percentile};
use idem::clock::ManualClock;
use idem::redb::{ReadableTableMetadata, TableDefinition, TableStats};
use idem::{Durability, ExecuteAnswer, Request, Response, Scope, Store, Timestamp};

/// The caller's own table: one tiny write per claim of the claimers, in the claim's transaction.
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");
/// idem's tables, as docs/FORMAT.md gives them (read-only here, for their statistics).
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");
const HOUR: Duration = Duration::from_secs(3600);
const PAGE: u64 = 4096;
const FILL_THREADS: usize = 8;
const CLAIMERS: usize = 4;
const BASELINE: Duration = Duration::from_secs(4);
/// The swept records' operation (retention 1 h, tombstones until 2 h) and the claimers' (24 h).
const SWEPT_OP: &str = "create_order";
const LIVE_OP: &str = "live_order";

fn request(op: &str, key: &str) -> Request {
    Request::from_canonical_bytes(
        Scope::new("tenant-0042", op),
        key,
        format!("sku=sku-1&qty=2&ref={key}").as_bytes(),
    )
}

fn claim(store: &Store, op: &str, key: &str, caller_write: bool) {
    let outcome = store
        .execute(request(op, key), |tx| {
            if caller_write {
                let mut effects = tx.open_table(EFFECTS)?;
                effects.insert(key.as_bytes(), 1)?;
            }
            Ok(Response::new(201, r#"{"ok":true}"#).with_resource("order", "o1"))
        })
        .unwrap_or_else(|e| panic!("claim {key}: {e}"));
    assert!(
        matches!(outcome, ExecuteAnswer::Ran(_)),
        "claim {key}: {outcome:?}"
    );
}

fn builder(clock: &ManualClock, durability: Durability) -> idem::StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .retention(HOUR)
        .tombstone_horizon(2 * HOUR)
        .retention_for(LIVE_OP, 24 * HOUR)
        .sweep_batch(1000)
        .durability(durability)
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Pages of a table, in bytes, and the bytes of its entries.
fn table_bytes(s: &TableStats) -> (u64, u64) {
    ((s.leaf_pages() + s.branch_pages()) * PAGE, s.stored_bytes())
}

fn table_report(store: &Store, n: usize) -> String {
    let read = store.read_transaction().expect("read");
    let records = read
        .open_table(RECORDS)
        .expect("records")
        .stats()
        .expect("stats");
    let expiry = read
        .open_table(EXPIRY)
        .expect("expiry")
        .stats()
        .expect("stats");
    let per = |b: u64| b as f64 / n as f64;
    let (rp, rs) = table_bytes(&records);
    let (ep, es) = table_bytes(&expiry);
    format!(
        "records table {:.0} B/record in pages ({:.0} B of entries), expiry index {:.0} B/record in pages ({:.0} B of entries)",
        per(rp),
        per(rs),
        per(ep),
        per(es)
    )
}

/// Claims by `CLAIMERS` threads until `stop` is set, returning each claim's start and latency.
fn claim_until(store: &Store, tag: &str, stop: &AtomicBool) -> Vec<(Instant, Duration)> {
    let all = Mutex::new(Vec::new());
    thread::scope(|s| {
        for t in 0..CLAIMERS {
            let all = &all;
            s.spawn(move || {
                let mut mine = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{tag}-{t}-{i:08}");
                    let started = Instant::now();
                    claim(store, LIVE_OP, &key, true);
                    mine.push((started, started.elapsed()));
                    i += 1;
                }
                all.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
            });
        }
    });
    all.into_inner().unwrap_or_else(|e| e.into_inner())
}

fn summary(name: &str, mut lat: Vec<Duration>) {
    assert!(!lat.is_empty(), "{name}: no claims");
    lat.sort();
    let at = |q: f64| percentile(&lat, q);
    println!(
        "{name:<40} {:>7} claims  median {:>8.2?}  p99 {:>8.2?}  max {:>8.2?}",
        lat.len(),
        at(0.5),
        at(0.99),
        lat[lat.len() - 1]
    );
}

fn main() {
    let n: usize = env_parse("IDEM_BENCH_RECORDS").unwrap_or(100_000);
    let dir = tempfile::Builder::new()
        .prefix("idem-retention-bench-")
        .tempdir_in(bench_parent())
        .expect("tempdir");
    let path = dir.path().join("retention.redb");
    let clock = ManualClock::new(Timestamp(1_767_225_600_000));
    println!("idem retention: {n} records, {CLAIMERS} claimer threads, file {path:?}");

    // 1. Fill.
    let started = Instant::now();
    {
        let store = builder(&clock, Durability::Periodic(HOUR))
            .open(&path)
            .expect("open");
        thread::scope(|s| {
            for t in 0..FILL_THREADS {
                let store = &store;
                s.spawn(move || {
                    for i in (t..n).step_by(FILL_THREADS) {
                        claim(store, SWEPT_OP, &format!("old-{i:09}"), false);
                    }
                });
            }
        });
    } // closed: the last handle flushes
    let live = file_size(&path);
    let mut store = builder(&clock, Durability::Immediate)
        .open(&path)
        .expect("reopen");
    println!(
        "fill: {n} records in {:.1?}; file {live} B = {:.0} B/record (live, not compacted)",
        started.elapsed(),
        live as f64 / n as f64
    );
    println!("      {}", table_report(&store, n));

    // 2. Compact.
    let started = Instant::now();
    store.compact().expect("compact");
    let compacted = file_size(&path);
    println!(
        "compact: {:.1?}; file {compacted} B = {:.0} B/record (live, compacted)",
        started.elapsed(),
        compacted as f64 / n as f64
    );
    println!("      {}", table_report(&store, n));

    // 3. A sweep alone: the N records shrink to tombstones.
    clock.advance(HOUR);
    let shrink = store.sweep().expect("shrinking sweep");
    assert_eq!(shrink.tombstoned, n as u64, "{shrink:?}");
    println!(
        "sweep alone: {} records shrunk to tombstones in {} batches in {:.2?} = {:.0} records/s",
        shrink.tombstoned,
        shrink.batches,
        shrink.duration,
        shrink.tombstoned as f64 / shrink.duration.as_secs_f64()
    );

    // 4. Baseline: claims with no sweep running.
    let stop = AtomicBool::new(false);
    let baseline = thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(BASELINE);
            stop.store(true, Ordering::Relaxed);
        });
        claim_until(&store, "base", &stop)
    });

    // 5. The same claimers while a sweep deletes the N tombstones.
    clock.advance(HOUR);
    let stop = AtomicBool::new(false);
    let (report, window, claims) = thread::scope(|s| {
        let sweeper = s.spawn(|| {
            // Let the claimers get going first.
            thread::sleep(Duration::from_millis(200));
            let from = Instant::now();
            let report = store.sweep().expect("deleting sweep");
            let to = Instant::now();
            stop.store(true, Ordering::Relaxed);
            (report, (from, to))
        });
        let claims = claim_until(&store, "during", &stop);
        let (report, window) = sweeper.join().expect("sweeper");
        (report, window, claims)
    });
    assert_eq!(report.deleted, n as u64, "{report:?}");
    let overlapping: Vec<Duration> = claims
        .iter()
        .filter(|(start, lat)| *start < window.1 && *start + *lat > window.0)
        .map(|(_, lat)| *lat)
        .collect();
    summary(
        "claims, no sweep running",
        baseline.into_iter().map(|c| c.1).collect(),
    );
    summary("claims overlapping the deleting sweep", overlapping);
    println!(
        "sweep with {CLAIMERS} claimers: {} tombstones deleted in {} batches in {:.2?} = {:.0} records/s",
        report.deleted,
        report.batches,
        report.duration,
        report.deleted as f64 / report.duration.as_secs_f64()
    );

    // 6. Space after the sweep, and after compacting again.
    let left = store.stats().expect("stats").records;
    // A white-box check (benches/Cargo.toml turns on idem's internal feature).
    store.check_expiry_index().expect("index matches");
    let swept = file_size(&path);
    store.compact().expect("compact");
    let recompacted = file_size(&path);
    println!(
        "after the sweep: {left} records left (the claimers'); file {swept} B (freed pages stay for reuse), {recompacted} B after compact"
    );
}
