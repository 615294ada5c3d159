//! `claim_peers`: idem's claim beside RocksDB (TransactionDB and plain DB) and fjall, each on its
//! own warm pre-filled store, every claim durable before it is acknowledged; rows interleaved rep
//! by rep in one run. bench-peers/README.md says how to run it and what each row does.

mod harness;
mod report;
mod rows;

use std::path::PathBuf;
use std::process::exit;
use std::thread;
use std::time::Duration;

use harness::{Sample, device_of, dir_size, measure, strace_mark};
use report::{Cell, Size};

/// The command line.
struct Args {
    records: usize,
    secs: f64,
    callers: Vec<usize>,
    reps: usize,
    dir: Option<PathBuf>,
    only: Vec<String>,
    settle: f64,
}

const USAGE: &str = "claim_peers [--records N] [--secs S] [--callers 1,8,64] [--reps R] [--dir PATH] [--only ROW[,ROW..]] [--settle S]";

fn parse() -> Args {
    let mut args = Args {
        records: 1_000_000,
        secs: 3.0,
        callers: vec![1, 8, 64],
        reps: 1,
        dir: None,
        only: Vec::new(),
        settle: 5.0,
    };
    let mut it = std::env::args().skip(1);
    let bad = |what: &str| -> ! {
        eprintln!("claim_peers: {what}\nusage: {USAGE}");
        exit(2)
    };
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("usage: {USAGE}");
            exit(0);
        }
        let Some(value) = it.next() else {
            bad(&format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--records" => args.records = value.parse().unwrap_or_else(|_| bad("--records")),
            "--secs" => args.secs = value.parse().unwrap_or_else(|_| bad("--secs")),
            "--reps" => args.reps = value.parse().unwrap_or_else(|_| bad("--reps")),
            "--settle" => args.settle = value.parse().unwrap_or_else(|_| bad("--settle")),
            "--dir" => args.dir = Some(PathBuf::from(value)),
            "--callers" => {
                args.callers = value
                    .split(',')
                    .map(|c| c.trim().parse().unwrap_or_else(|_| bad("--callers")))
                    .collect()
            }
            "--only" => args
                .only
                .extend(value.split(',').map(|s| s.trim().to_owned())),
            other => bad(&format!("unknown flag {other}")),
        }
    }
    if args.callers.contains(&0) || args.reps == 0 {
        bad("callers and reps must be positive");
    }
    args
}

fn main() {
    let args = parse();
    let specs: Vec<_> = rows::all()
        .into_iter()
        .filter(|s| {
            (args.only.is_empty() && !s.diagnostic) || args.only.iter().any(|o| o == s.label)
        })
        .collect();
    if specs.is_empty() {
        let labels: Vec<_> = rows::all().iter().map(|s| s.label).collect();
        eprintln!(
            "claim_peers: --only matches no row; rows: {}",
            labels.join(", ")
        );
        exit(2);
    }
    let temp = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d).expect("create --dir");
            tempfile::tempdir_in(d).expect("tempdir in --dir")
        }
        None => tempfile::tempdir().expect("tempdir"),
    };

    println!(
        "# claim_peers: {} records per store, {} s per cell, callers {:?}, {} rep(s), stores under {}\n",
        args.records,
        args.secs,
        args.callers,
        args.reps,
        temp.path().display()
    );
    println!("Rows:\n");
    for s in &specs {
        println!("- **{}**: {}", s.label, s.what);
    }
    println!();

    // Pre-fill every row's store, one after the other; all stay open for the run.
    let mut open = Vec::new();
    for s in &specs {
        let dir = temp.path().join(s.label.replace(' ', "-"));
        std::fs::create_dir_all(&dir).expect("row dir");
        eprintln!("pre-filling {} ({} records)...", s.label, args.records);
        let (row, took) = (s.open)(&dir, args.records);
        let size = dir_size(&dir).0;
        println!(
            "pre-fill {}: {} records in {:.1} s ({:.0} records/s), {:.1} MiB",
            s.label,
            args.records,
            took.as_secs_f64(),
            args.records as f64 / took.as_secs_f64(),
            size as f64 / (1u64 << 20) as f64
        );
        open.push((s.label, dir, row, size));
    }
    println!();
    thread::sleep(Duration::from_secs_f64(args.settle));

    // rep -> callers -> row: each row's cells at a caller count are measured next to each other.
    // Each window is bracketed by strace markers (`getppid`) for the syncs-per-claim count.
    let mut samples: Vec<(usize, usize, usize, Sample)> = Vec::new();
    let mut seed = 1u64;
    let device = device_of(temp.path());
    for rep in 1..=args.reps {
        for &callers in &args.callers {
            for (i, (label, _, row, _)) in open.iter().enumerate() {
                strace_mark();
                let sample = measure(row.as_ref(), callers, args.secs, seed, device);
                strace_mark();
                seed += 1;
                println!(
                    "window rep={rep} callers={callers} row=\"{label}\": {} claims in {:.3} s = {:.0} claims/s",
                    sample.claims,
                    sample.elapsed.as_secs_f64(),
                    sample.claims as f64 / sample.elapsed.as_secs_f64()
                );
                samples.push((rep, callers, i, sample));
            }
        }
    }
    println!();

    let cells: Vec<Cell<'_>> = args
        .callers
        .iter()
        .flat_map(|&c| {
            let samples = &samples;
            open.iter().enumerate().map(move |(i, (label, ..))| Cell {
                label,
                callers: c,
                samples: samples
                    .iter()
                    .filter(|(_, sc, si, _)| *sc == c && *si == i)
                    .map(|(.., s)| s)
                    .collect(),
            })
        })
        .collect();
    println!("## Claims (new key, durable), all reps\n");
    println!("{}", report::table(&cells, &args.callers));

    // Close every store (idem, RocksDB and fjall flush what they buffer) before sizing them.
    let closed: Vec<_> = open
        .into_iter()
        .map(|(label, dir, row, prefilled)| {
            drop(row);
            (label, dir, prefilled)
        })
        .collect();
    let sizes: Vec<Size<'_>> = closed
        .iter()
        .enumerate()
        .map(|(i, (label, dir, prefilled))| {
            let claims: u64 = samples
                .iter()
                .filter(|(_, _, si, _)| *si == i)
                .map(|(.., s)| s.claims)
                .sum();
            let (apparent, allocated) = dir_size(dir);
            Size {
                label,
                records: args.records as u64 + claims,
                after_prefill: *prefilled,
                apparent,
                allocated,
            }
        })
        .collect();
    println!("## Bytes on disk per record (stores closed after the run)\n");
    println!("{}", report::sizes(&sizes, args.records as u64));
}
