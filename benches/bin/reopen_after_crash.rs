//! How long a store takes to come back after a crash: builds a store, crashes a process that is
//! claiming on it, and times the reopen (redb's repair of a file that was not closed cleanly),
//! with or without idem's read-through of the file before the repair
//! (`StoreBuilder::prefetch_on_repair`). `scripts/reopen-after-crash` drives it with a cold OS
//! page cache; benches/results/2026-12-04-a83961b-reopen-after-crash.md has its figures.
//!
//! ```text
//! cargo run --release -p idem-benches --bin reopen_after_crash -- build FILE RECORDS  # RECORDS claims, 8 threads
//! cargo run --release -p idem-benches --bin reopen_after_crash -- crash FILE [--quick-repair] [--journal [--full] [--checkpoint-mib N]] [--random]  # claims on 8 threads, aborts after 0.7 s
//! cargo run --release -p idem-benches --bin reopen_after_crash -- reopen FILE [--no-prefetch] [--no-verify] [--journal]
//! ```
//!
//! `--journal` claims and reopens in journal mode (`StoreBuilder::journal`): the crash leaves
//! redb at its last checkpoint (saved with quick-repair) and the journal's live entries, which
//! the reopen replays; its line gives the entries replayed. `--full` aborts instead once the
//! journal holds 90% of `checkpoint_bytes` (8 MiB, or `--checkpoint-mib`) since the last
//! checkpoint: the most a crash can leave to replay. `--random` claims keys spread over the key
//! space (each claim then lands in a random leaf, as UUID keys do) instead of one sequence per
//! thread (which appends to a few leaves).
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

const USAGE: &str = "usage: reopen_after_crash build FILE RECORDS | crash FILE [--quick-repair] [--journal [--full] [--checkpoint-mib N]] [--random] | reopen FILE [--no-prefetch] [--no-verify] [--journal]";

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
            Crash {
                quick_repair: args.iter().any(|a| a == "--quick-repair"),
                journal: args.iter().any(|a| a == "--journal"),
                full: args.iter().any(|a| a == "--full"),
                random: args.iter().any(|a| a == "--random"),
                checkpoint_mib: args
                    .iter()
                    .position(|a| a == "--checkpoint-mib")
                    .and_then(|i| args.get(i + 1))
                    .and_then(|n| n.parse().ok()),
            },
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

/// How `crash` claims and when it aborts.
struct Crash {
    quick_repair: bool,
    journal: bool,
    /// Abort once the journal holds 90% of `checkpoint_bytes` since the last checkpoint.
    full: bool,
    /// Keys spread over the key space instead of one sequence per thread.
    random: bool,
    /// `checkpoint_bytes` in MiB (the builder's default when `None`).
    checkpoint_mib: Option<u64>,
}

fn crash(path: &str, how: Crash) -> Result<(), Failure> {
    let mut builder = Store::builder()
        .quick_repair(how.quick_repair)
        .journal(how.journal);
    let checkpoint_bytes = match how.checkpoint_mib {
        Some(mib) => {
            // At most half the journal: a larger interval takes a larger journal.
            builder = builder
                .checkpoint_bytes(mib << 20)
                .journal_capacity((mib << 21).max(idem::store::DEFAULT_JOURNAL_CAPACITY));
            mib << 20
        }
        None => idem::store::DEFAULT_CHECKPOINT_BYTES,
    };
    let store = builder.open(path)?;
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            let random = how.random;
            s.spawn(move || {
                // xorshift64: a key sequence per thread, spread over the key space.
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (t + 1);
                for i in 0u64.. {
                    let key = if random {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        format!("k{x:016x}")
                    } else {
                        format!("crash-{t}-{i:010}")
                    };
                    // Claims until the process dies; a failed claim changes nothing here.
                    let _ = store.execute(request(&key), |_| Ok(answer()));
                }
            });
        }
        if how.full {
            // The journal's bytes since the last checkpoint: frame bytes since the checkpoint
            // count last moved (the applier's checkpoint trails the entries it covers, so the
            // live region is at least this).
            let started = Instant::now();
            let (mut checkpoints, mut mark) = (u64::MAX, 0);
            loop {
                let m = store.metrics().journal;
                if m.checkpoints != checkpoints {
                    (checkpoints, mark) = (m.checkpoints, m.frame_bytes);
                }
                let since = m.frame_bytes - mark;
                if since * 10 >= checkpoint_bytes * 9
                    || started.elapsed() > Duration::from_secs(120)
                {
                    eprintln!(
                        "crash: aborting with {since} B of journal since checkpoint {checkpoints} ({} frames in all)",
                        m.frames
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        } else {
            std::thread::sleep(Duration::from_millis(700));
        }
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
