//! A load generator for profiling idem's claim path: `callers` threads claim new keys through
//! `Store::execute_on_writer` (or `Store::execute`) on one store file for a number of seconds, each
//! claim writing one row to the caller's own table, and the rate is printed at the end.
//! `benches/claim_throughput/` is the benchmark (baselines, ratios, targets); this is the
//! smallest process to put under a profiler:
//!
//! ```sh
//! cargo build --release -p idem-benches --bin claim_load
//! target/release/claim_load /tmp/load.redb 64 25 send     # fill: ~300k records
//! cp /tmp/load.redb /tmp/run.redb
//! perf record -F 2000 -g --call-graph dwarf,16384 \
//!     target/release/claim_load /tmp/run.redb 64 6 send
//! perf report --children --sort symbol
//! ```
//!
//! Arguments: the store file (created if missing), the number of callers, the seconds to run,
//! and `send` (default) or `execute`, or `replay`: the callers replay 10,000 keys claimed first
//! (untimed), the lookups of finished keys. The store opens with a 1 GiB page cache
//! (`IDEM_CACHE_MB=N`: N MiB) in the default mode, journal mode, with `IDEM_JOURNAL_KIB` and
//! `IDEM_CHECKPOINT_KIB` setting the journal's capacity and checkpoint bytes; `IDEM_JOURNAL=0`
//! opens it in direct mode (`StoreBuilder::journal(false)`). The file sizes are printed with the rate (bytes per claim are
//! the run's when the file was new). Claimed keys are sequential per caller; `IDEM_RANDOM_KEYS=1`
//! spreads them over the key space, as `bench-peers`' keys are (every claim then writes a
//! random leaf of the caller's table, not the last one).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bench_common::env_parse;
use idem::redb::TableDefinition;
use idem::{ExecuteAnswer, Request, Response, Scope, Store};

/// The caller's own table: one row per claim, as in the benchmark.
const EFFECTS: TableDefinition<&[u8], u64> = TableDefinition::new("effects");

fn request(key: &str) -> Request {
    let payload = format!("sku=sku-1&qty=2&ref={key}");
    Request::from_canonical_bytes(
        Scope::new("tenant-a", "create-order"),
        key,
        payload.as_bytes(),
    )
}

fn response() -> Response {
    Response::new(201, r#"{"ok":true}"#).with_resource("order", "o1")
}

/// One replay of a finished key; an answer other than `Replayed` is an error.
fn replayed(store: &Store, key: String) -> Result<(), String> {
    match store.execute(request(&key), |_| {
        Err(idem::Abort::retryable("must not run"))
    }) {
        Ok(ExecuteAnswer::Replayed(_)) => Ok(()),
        other => Err(format!("replay {key}: expected Replayed, got {other:?}")),
    }
}

/// One claim of a new key; an answer other than `Executed` is an error.
fn claim(store: &Store, key: String, send: bool) -> Result<(), String> {
    let outcome = if send {
        let owned = key.clone();
        store.execute_on_writer(request(&key), move |tx| {
            tx.open_table(EFFECTS)?.insert(owned.as_bytes(), 1)?;
            Ok(response())
        })
    } else {
        store.execute(request(&key), |tx| {
            tx.open_table(EFFECTS)?.insert(key.as_bytes(), 1)?;
            Ok(response())
        })
    };
    match outcome {
        Ok(ExecuteAnswer::Ran(_)) => Ok(()),
        other => Err(format!("claim {key}: expected Executed, got {other:?}")),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: claim_load <store file> <callers> <seconds> [send|execute|replay]";
    let (Some(path), Some(callers), Some(secs)) = (
        args.get(1),
        args.get(2).and_then(|a| a.parse::<usize>().ok()),
        args.get(3).and_then(|a| a.parse::<f64>().ok()),
    ) else {
        eprintln!("{usage}");
        return ExitCode::FAILURE;
    };
    let replay = args.get(4).is_some_and(|a| a == "replay");
    let send = match args.get(4).map(String::as_str) {
        None | Some("send") | Some("replay") => true,
        Some("execute") => false,
        Some(other) => {
            eprintln!("unknown mode {other:?}; {usage}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(run_for) = Duration::try_from_secs_f64(secs) else {
        eprintln!("seconds must be a non-negative number; {usage}");
        return ExitCode::FAILURE;
    };
    let cache_mb: usize = env_parse("IDEM_CACHE_MB").unwrap_or(1024);
    let mut builder = Store::builder().cache_size(cache_mb << 20);
    if std::env::var("IDEM_JOURNAL").is_ok_and(|v| v == "0") {
        builder = builder.journal(false);
    } else {
        if let Some(kib) = env_parse::<u64>("IDEM_JOURNAL_KIB") {
            builder = builder.journal_capacity(kib << 10);
        }
        if let Some(kib) = env_parse::<u64>("IDEM_CHECKPOINT_KIB") {
            builder = builder.checkpoint_bytes(kib << 10);
        }
    }
    let store = match builder.open(path) {
        Ok(store) => store,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Keys unique to this process, so a store can be loaded again and again.
    let tag = u64::from(std::process::id());
    let random = std::env::var("IDEM_RANDOM_KEYS").is_ok_and(|v| v == "1");
    const REPLAYED: u64 = 10_000;
    if replay {
        let filled: Result<(), String> = std::thread::scope(|s| {
            let fills: Vec<_> = (0..16u64)
                .map(|t| {
                    let store = &store;
                    s.spawn(move || {
                        (t..REPLAYED)
                            .step_by(16)
                            .try_for_each(|i| claim(store, format!("r-{tag}-{i:08}"), true))
                    })
                })
                .collect();
            fills
                .into_iter()
                .try_for_each(|f| f.join().unwrap_or(Err("a filler panicked".into())))
        });
        if let Err(e) = filled {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    let stop = AtomicBool::new(false);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let failures: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..callers)
            .map(|c| {
                let (store, stop, done) = (&store, &stop, &done);
                s.spawn(move || {
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if replay {
                            // A step through the keys coprime with their count: every key, in
                            // an order that is not the claim order.
                            let k = (i * 7_919 + c as u64) % REPLAYED;
                            replayed(store, format!("r-{tag}-{k:08}"))?;
                        } else {
                            let key = if random {
                                // Spread over the key space, as the peers benchmark's keys are.
                                let h = (tag << 40 | (c as u64) << 32 | i)
                                    .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                                format!("{h:016x}")
                            } else {
                                format!("new-{tag}-{c:02}-{i:08}")
                            };
                            claim(store, key, send)?;
                        }
                        i += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok::<(), String>(())
                })
            })
            .collect();
        std::thread::sleep(run_for);
        stop.store(true, Ordering::Relaxed);
        workers
            .into_iter()
            .filter_map(|w| match w.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("a caller panicked".to_owned()),
            })
            .collect()
    });
    let elapsed = started.elapsed().as_secs_f64();
    let n = done.load(Ordering::Relaxed);
    let mode = if replay {
        "replay"
    } else if send {
        "execute_on_writer"
    } else {
        "execute"
    };
    let what = if replay { "replays" } else { "claims" };
    println!(
        "{callers} callers, {mode}: {n} {what} in {elapsed:.2} s = {:.0} {what}/s",
        n as f64 / elapsed
    );
    let m = store.metrics();
    if m.journal.frames + m.journal.checkpoints > 0 {
        let per = |x: u64| x as f64 / n.max(1) as f64;
        println!(
            "journal: {} frames ({:.0} B per claim), {} syncs ({:.3} per claim), {} checkpoints ({:.0} ms, {:.1}% of the run); {} commits",
            m.journal.frames,
            per(m.journal.frame_bytes),
            m.journal.syncs,
            per(m.journal.syncs),
            m.journal.checkpoints,
            m.journal.checkpoint_time.as_secs_f64() * 1000.0,
            m.journal.checkpoint_time.as_secs_f64() * 100.0 / elapsed,
            m.commits
        );
    }
    // Sizes at rest: after the close's checkpoint.
    drop(store);
    let path = std::path::Path::new(path);
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let (file, journal) = (size(path), size(&idem::store::journal_path(path)));
    println!(
        "on disk: store file {file} B, journal {journal} B; {:.0} B per claim of this run (with the journal {:.0})",
        file as f64 / n.max(1) as f64,
        (file + journal) as f64 / n.max(1) as f64
    );
    for f in &failures {
        eprintln!("{f}");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
