//! Single-caller costs of the core operations on a real file with durable (fsync) commits.
//!
//! ```text
//! cargo bench -p idem-benches --bench core_ops            # IDEM_BENCH_N=5000 for more claims
//! ```
//!
//! Prints, per workload, the median over 5 runs with min–max: flow-A claims of new keys (one
//! write transaction and one fsync each, with a tiny caller write), replays of existing keys
//! (read transactions only), and flow-B begin + complete (two durable commits). Group commit
//! (batching many callers into one fsync) has its own benchmark, `claim_throughput`.

use std::time::{Duration, Instant};

use bench_common::env_parse;
use idem::redb::TableDefinition;
use idem::{BeginAnswer, ExecuteAnswer, Request, Response, Scope, Store};

const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");
const RUNS: usize = 5;

fn req(i: usize) -> Request {
    let key = format!("key-{i:08}");
    Request::from_canonical_bytes(Scope::new("tenant", "op"), key, &i.to_le_bytes())
}

fn claim(store: &Store, i: usize) {
    let outcome = store
        .execute(req(i), |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            effects.insert(format!("key-{i:08}").as_bytes(), 1)?;
            Ok(Response::new(201, r#"{"ok":true}"#))
        })
        .unwrap_or_else(|e| panic!("claim {i}: {e}"));
    assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
}

fn summary(name: &str, unit: &str, mut rates: Vec<f64>) {
    rates.sort_by(f64::total_cmp);
    println!(
        "{name:<34} {:>10.0} {unit}/s  (min {:.0}, max {:.0}, {RUNS} runs)",
        rates[RUNS / 2],
        rates[0],
        rates[RUNS - 1]
    );
}

fn rate(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64()
}

fn main() {
    let n: usize = env_parse("IDEM_BENCH_N").unwrap_or(2000);
    let replays = 100_000;
    let mut claims = Vec::new();
    let mut reads = Vec::new();
    let mut leases = Vec::new();
    let mut bytes_per_record = 0.0;
    for _ in 0..RUNS {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("bench.redb");
        let store = Store::open(&path).expect("open");

        let t = Instant::now();
        for i in 0..n {
            claim(&store, i);
        }
        claims.push(rate(n, t.elapsed()));

        let t = Instant::now();
        for i in 0..replays {
            let outcome = store
                .execute(req(i % n), |_| {
                    unreachable!("a replay never runs the closure")
                })
                .expect("replay");
            assert!(outcome.is_replay());
        }
        reads.push(rate(replays, t.elapsed()));

        let t = Instant::now();
        for i in n..2 * n {
            match store.begin(req(i)).expect("begin") {
                BeginAnswer::Acquired(lease) => {
                    lease
                        .complete(Response::new(201, "charged"))
                        .expect("complete");
                }
                other => panic!("expected a lease, got {other:?}"),
            }
        }
        leases.push(rate(n, t.elapsed()));
        drop(store);
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        bytes_per_record = size as f64 / (2 * n) as f64;
    }
    println!("idem core_ops: {n} claims per run, {replays} replays per run, 1 caller");
    summary("flow A execute, new key (fsync)", "claims", claims);
    summary("flow A execute, replay", "replays", reads);
    summary("flow B begin + complete (2 fsync)", "intents", leases);
    println!(
        "file bytes per record (last run, {} records, not compacted): {bytes_per_record:.0}",
        2 * n
    );
}
