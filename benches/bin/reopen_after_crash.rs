//! How long a store takes to come back after a crash: builds a store, crashes a process that is
//! claiming on it, and times the reopen (redb's repair of a file that was not closed cleanly),
//! with or without idem's read-through of the file before the repair
//! (`StoreBuilder::prefetch_on_repair`). `scripts/reopen-after-crash` drives it with a cold OS
//! page cache; benches/results/2026-12-04-a83961b-reopen-after-crash.md has its figures.
//!
//! ```text
//! cargo run --release -p idem-benches --bin reopen_after_crash -- build FILE RECORDS  # RECORDS claims, 8 threads
//! cargo run --release -p idem-benches --bin reopen_after_crash -- crash FILE [--quick-repair] [--journal]  # claims on 8 threads, aborts after 0.7 s
//! cargo run --release -p idem-benches --bin reopen_after_crash -- reopen FILE [--no-prefetch] [--no-verify] [--journal]
//! ```
//!
//! `--journal` claims and reopens in journal mode (`StoreBuilder::journal`): the crash leaves
//! redb at its last checkpoint (saved with quick-repair) and the journal's live entries, which
//! the reopen replays; its line gives the entries replayed.
//!
//! `build` commits with `Durability::Periodic(200 ms)` (a bulk load; the store is closed cleanly
//! at the end); `crash` commits with the default `Immediate` durability and ends with
//! `std::process::abort()`, which, like a SIGKILL, leaves the file without its clean-close mark;
//! `reopen` prints the open's time and `Store::repair_time()`; on a cleanly closed file (the built
//! one) it times the open-time check of every page (`StoreBuilder::verify_on_open`, off with
//! `--no-verify`).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bench_common::workload::{request, response as answer};
use idem::{Durability, Store};

const USAGE: &str = "usage: reopen_after_crash build FILE RECORDS | crash FILE [--quick-repair] [--journal] | reopen FILE [--no-prefetch] [--no-verify] [--journal]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(command), Some(path)) = (args.first(), args.get(1)) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let result = match command.as_str() {
        "build" => match args.get(2).and_then(|n| n.parse().ok()) {
            Some(records) => build(path, records),
            None => Err(USAGE.into()),
        },
        "crash" => crash(
            path,
            args.iter().any(|a| a == "--quick-repair"),
            args.iter().any(|a| a == "--journal"),
        ),
        "reopen" => reopen(
            path,
            !args.iter().any(|a| a == "--no-prefetch"),
            !args.iter().any(|a| a == "--no-verify"),
            args.iter().any(|a| a == "--journal"),
        ),
        _ => Err(USAGE.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("reopen_after_crash: {e}");
            ExitCode::FAILURE
        }
    }
}

type Failure = Box<dyn std::error::Error + Send + Sync>;

fn build(path: &str, records: u64) -> Result<(), Failure> {
    let store = Store::builder()
        .durability(Durability::Periodic(Duration::from_millis(200)))
        .open(path)?;
    let started = Instant::now();
    std::thread::scope(|s| -> Result<(), Failure> {
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let store = &store;
                s.spawn(move || -> Result<(), idem::Error> {
                    for i in (t..records).step_by(8) {
                        // A re-run build replays the records it already holds.
                        let _ = store.execute(request(&format!("k{i:012}")), |_| Ok(answer()))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for t in threads {
            t.join().map_err(|_| "a claimer panicked")??;
        }
        Ok(())
    })?;
    drop(store);
    let bytes = std::fs::metadata(path)?.len();
    println!(
        "built {records} records in {:.1} s: {bytes} B",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn crash(path: &str, quick_repair: bool, journal: bool) -> Result<(), Failure> {
    let store = Store::builder()
        .quick_repair(quick_repair)
        .journal(journal)
        .open(path)?;
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0u64.. {
                    // Claims until the process dies; a failed claim changes nothing here.
                    let _ = store.execute(request(&format!("crash-{t}-{i:010}")), |_| Ok(answer()));
                }
            });
        }
        std::thread::sleep(Duration::from_millis(700));
        // No destructor runs: the file keeps no clean-close mark, as after a SIGKILL.
        std::process::abort();
    })
}

fn reopen(path: &str, prefetch: bool, verify: bool, journal: bool) -> Result<(), Failure> {
    let journal_bytes = std::fs::metadata(idem::store::journal_path(path.as_ref()))
        .map(|m| m.len())
        .unwrap_or(0);
    let started = Instant::now();
    let store = Store::builder()
        .prefetch_on_repair(prefetch)
        .verify_on_open(verify)
        .journal(journal)
        .open(path)?;
    let took = started.elapsed();
    println!(
        "reopen {:.3} s, repair {} (prefetch_on_repair {prefetch}, verify_on_open {verify}, journal {journal}: {journal_bytes} B file, {} entries replayed)",
        took.as_secs_f64(),
        match store.repair_time() {
            Some(t) => format!("{:.3} s", t.as_secs_f64()),
            None => "none".into(),
        },
        store.metrics().journal.replayed
    );
    Ok(())
}
