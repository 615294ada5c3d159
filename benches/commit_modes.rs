//! What redb's commit modes cost a group-commit batch (issue 14's reopen goal: ≤ 5 % of the claims/s): one writer thread
//! committing batches of 1, 8 and 64 claims (each a record insert and an expiry-index insert,
//! the bytes and tables of an idem store) into a store pre-filled through idem, with
//!
//! - `default`: redb's one-phase durable commit (what idem does by default);
//! - `two-phase`: `set_two_phase_commit(true)`: a second fsync per commit, nothing else;
//! - `quick-repair`: `set_quick_repair(true)`: two-phase *and* the allocator state of every
//!   region saved in each commit (what `StoreBuilder::quick_repair(true)` does).
//!
//! So `quick-repair ÷ default` is the whole price idem pays per batch for a near-instant
//! reopen after a crash, and `two-phase ÷ default` the part of it that is the second fsync. The
//! modes run on one file, interleaved rep by rep (the disk's drift hits all three); medians.
//!
//! ```text
//! cargo bench -p idem-benches --bench commit_modes              # 100k and 1M records, 3 s, 3 reps
//! IDEM_BENCH_RECORDS=100000 IDEM_BENCH_SECS=1 cargo bench -p idem-benches --bench commit_modes
//! ```
//!
//! `IDEM_BENCH_DIR` chooses the filesystem (default the system temp dir).

use std::path::Path;
use std::time::{Duration, Instant};

use bench_common::workload::{request, response};
use bench_common::{bench_parent, env_parse, git_commit, median};
use idem::redb::{self, ReadableDatabase, TableDefinition};
use idem::{Durability, ExecuteAnswer, Store};

const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");
const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Default,
    TwoPhase,
    QuickRepair,
}

impl Mode {
    const ALL: [Mode; 3] = [Mode::Default, Mode::TwoPhase, Mode::QuickRepair];
}

/// Fills a new store at `path` with `n` claims through idem (bulk: `Durability::Periodic`, 8
/// threads), then closes it.
fn build(path: &Path, n: u64) {
    let store = Store::builder()
        .durability(Durability::Periodic(Duration::from_millis(200)))
        .open(path)
        .expect("open the store to fill");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            s.spawn(move || {
                for i in (t..n).step_by(8) {
                    let key = format!("k{i:012}");
                    let outcome = store
                        .execute(request(&key), |_| Ok(response()))
                        .expect("fill");
                    assert!(matches!(outcome, ExecuteAnswer::Ran(_)), "{key}: a new key");
                }
            });
        }
    });
}

/// Commits batches of `batch` claims in `mode` for `secs`: (claims/s, median commit time).
fn run(db: &redb::Database, mode: Mode, batch: usize, secs: f64, tag: &str) -> (f64, Duration) {
    // Value sizes of an idem record (~117 B of entry) and its expiry-index key (~53 B).
    let value = [0x5au8; 96];
    let started = Instant::now();
    let mut commits: Vec<Duration> = Vec::new();
    let mut n = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        let t = Instant::now();
        let mut txn = db.begin_write().expect("begin_write");
        match mode {
            Mode::Default => {}
            Mode::TwoPhase => txn.set_two_phase_commit(true),
            Mode::QuickRepair => txn.set_quick_repair(true),
        }
        {
            let mut records = txn.open_table(RECORDS).expect("records");
            let mut expiry = txn.open_table(EXPIRY).expect("expiry");
            for _ in 0..batch {
                // Random record keys (as idempotency keys are); expiry keys in time order.
                let key = format!("{tag}-{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                records
                    .insert(key.as_bytes(), value.as_slice())
                    .expect("insert");
                let due = format!("{:020}{key}", started.elapsed().as_nanos());
                expiry.insert(due.as_bytes(), 1).expect("index");
                n += 1;
            }
        }
        txn.commit().expect("commit");
        commits.push(t.elapsed());
    }
    commits.sort();
    let median = commits.get(commits.len() / 2).copied().unwrap_or_default();
    (n as f64 / started.elapsed().as_secs_f64(), median)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read from the command line.
    let sizes: Vec<u64> = std::env::var("IDEM_BENCH_RECORDS")
        .map(|l| l.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|_| vec![100_000, 1_000_000]);
    let secs: f64 = env_parse("IDEM_BENCH_SECS").unwrap_or(3.0);
    let reps: usize = env_parse("IDEM_BENCH_REPS").unwrap_or(3);
    let dir = tempfile::tempdir_in(bench_parent()).expect("bench dir");
    let commit = git_commit();
    println!(
        "commit_modes: commit {commit}, {} cores, {secs} s per cell, medians of {reps}, dir {:?}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        dir.path()
    );
    println!(
        "\n| records | batch | default claims/s (commit) | two-phase | quick-repair | two-phase ÷ default | quick-repair ÷ default |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &n in &sizes {
        let path = dir.path().join(format!("store-{n}.redb"));
        build(&path, n);
        let db = redb::Database::builder()
            .set_cache_size(idem::store::DEFAULT_CACHE_SIZE)
            .open(&path)
            .expect("open the filled store");
        // A read first, so that every mode starts from the same warm upper tree.
        drop(db.begin_read().expect("read"));
        for batch in [1usize, 8, 64] {
            let mut rates = [Vec::new(), Vec::new(), Vec::new()];
            let mut times = [Vec::new(), Vec::new(), Vec::new()];
            for rep in 0..reps {
                for (j, &mode) in Mode::ALL.iter().enumerate() {
                    let (rate, commit) = run(&db, mode, batch, secs, &format!("{rep}-{batch}-{j}"));
                    rates[j].push(rate);
                    times[j].push(commit.as_secs_f64() * 1e3);
                }
            }
            let [d, t, q] = rates.map(|v| median(&v));
            let [dt, tt, qt] = times.map(|v| median(&v));
            println!(
                "| {n} | {batch} | {d:.0} ({dt:.2} ms) | {t:.0} ({tt:.2} ms) | {q:.0} ({qt:.2} ms) | {:.2}× | {:.2}× |",
                t / d,
                q / d
            );
        }
        drop(db);
        let _ = std::fs::remove_file(&path);
    }
}
