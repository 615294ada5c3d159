//! The summary: one line per row with its rate, latencies, bytes written, batch size and its
//! ratios to the baselines, and the same rows as CSV (`IDEM_BENCH_CSV`).

use std::path::{Path, PathBuf};

use bench_common::{median, percentile};

use crate::bench::Bench;
use crate::data::SMALL;
use crate::fmt::{fmt_bytes, fmt_ns, fmt_ratio, with_commas};
use crate::rows::{Fill, Row, System, Work, fill_name};
use crate::targets;

/// Where the CSV copy of the summary goes: `IDEM_BENCH_CSV`, or
/// `<target dir>/bench-results/claim_throughput.csv` (the bench binary is
/// `<target dir>/<profile>/deps/claim_throughput-<hash>`).
pub fn csv_path() -> PathBuf {
    if let Some(path) = std::env::var_os("IDEM_BENCH_CSV") {
        return PathBuf::from(path);
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")))
        .join("bench-results")
        .join("claim_throughput.csv")
}

/// Prints the summary, rows in `display` order (those that ran), then the targets; writes the
/// summary's rows as CSV too (`csv_path`; `scripts/claims-chart` reads its columns by name).
pub fn report(b: &Bench, display: &[Row]) {
    let disk = median(
        &b.results[&Row {
            system: System::Disk,
            work: Work::Fsync,
            fill: Fill::Empty,
            callers: 1,
        }]
            .rates,
    );
    let rate = |r: &Row| b.rate(r);
    let runs = b.cfg.runs;
    println!(
        "SUMMARY — ops/s: median of {runs} runs (min – max); p50/p99/max: latency per call over all runs' calls; \
         written: bytes per op (see 'written' above); batch: idem requests per commit (Store::metrics)"
    );
    println!(
        "ratios: idem ÷ the baseline measured in this run with the same store and callers (replays: ÷ SQLite's 1-thread lookups); \
         ×SQLite-mx: ÷ SQLite with writers behind a Mutex; ×fsync: ÷ the disk's pwrite + fdatasync rate"
    );
    let header = format!(
        "{:<10} {:<40} {:>7} {:>9} {:>21} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8}",
        "store",
        "workload",
        "callers",
        "ops/s",
        "(min – max)",
        "p50",
        "p99",
        "max",
        "written",
        "batch",
        "×naive",
        "×group",
        "×SQLite",
        "×SQLite-mx",
        "×fsync"
    );
    println!("{header}");
    println!("{}", "-".repeat(header.chars().count()));
    // The same rows, machine-readable: `scripts/claims-chart` draws claims/s against callers
    // from it. Latencies in µs, written in bytes per call; an empty field was not measured.
    let mut csv: String = b.csv_header.iter().map(|l| format!("# {l}\n")).collect();
    csv.push_str(
        "store,system,workload,callers,ops_per_s,ops_min,ops_max,p50_us,p99_us,max_us,written_bytes_per_op,batch\n",
    );
    let mut last_fill = None;
    let mut reruns = 0;
    let mut busy = 0;
    for r in display.iter().filter(|r| b.results.contains_key(r)) {
        let res = &b.results[r];
        if r.system != System::Disk && last_fill.is_some() && last_fill != Some(r.fill) {
            println!();
        }
        if r.system != System::Disk {
            last_fill = Some(r.fill);
        }
        let mut sorted = res.rates.clone();
        sorted.sort_by(f64::total_cmp);
        let med = median(&res.rates);
        let mut lat_sorted = res.lat_ns.clone();
        lat_sorted.sort_unstable();
        let written = res
            .written
            .map(|w| fmt_bytes(w as f64 / res.ops as f64))
            .unwrap_or_else(|| "n/a".into());
        let batch = match res.commits {
            Some(c) if c.commits > 0 => format!("{:.1}", c.requests as f64 / c.commits as f64),
            Some(_) => "-".into(),
            None => "".into(),
        };
        if let Some(c) = res.commits {
            reruns += c.reruns;
            busy += c.busy;
        }
        let same = |system| Row {
            system,
            work: Work::NewKeys,
            ..*r
        };
        let (vs_naive, vs_group, vs_sqlite, vs_serial) = match (r.system, r.work) {
            (System::Idem | System::IdemSend, Work::NewKeys) => (
                rate(&same(System::Naive)).map(|x| med / x),
                rate(&same(System::NaiveGroup)).map(|x| med / x),
                rate(&same(System::Sqlite)).map(|x| med / x),
                rate(&same(System::SqliteSerial)).map(|x| med / x),
            ),
            (System::Idem, Work::Replay) => (
                None,
                None,
                rate(&Row {
                    system: System::Sqlite,
                    callers: 1,
                    ..*r
                })
                .map(|x| med / x),
                None,
            ),
            _ => (None, None, None, None),
        };
        let store = match r.system {
            System::Disk => "-".to_owned(),
            System::Memory => "in memory".to_owned(),
            _ => fill_name(r.fill, b.cfg.prefill),
        };
        let us = |ns: u64| ns as f64 / 1000.0;
        csv.push_str(&format!(
            "{store},{},\"{}\",{},{med:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{}\n",
            r.id(),
            r.label(),
            r.callers,
            sorted[0],
            sorted[sorted.len() - 1],
            us(percentile(&lat_sorted, 0.50)),
            us(percentile(&lat_sorted, 0.99)),
            us(lat_sorted.last().copied().unwrap_or(0)),
            res.written
                .map(|w| format!("{:.0}", w as f64 / res.ops as f64))
                .unwrap_or_default(),
            match res.commits {
                Some(c) if c.commits > 0 => format!("{:.1}", c.requests as f64 / c.commits as f64),
                _ => String::new(),
            },
        ));
        println!(
            "{:<10} {:<40} {:>7} {:>9.0} {:>21} {:>8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>10} {:>8}",
            store,
            r.label(),
            r.callers,
            med,
            format!("({:.0} – {:.0})", sorted[0], sorted[sorted.len() - 1]),
            fmt_ns(percentile(&lat_sorted, 0.50)),
            fmt_ns(percentile(&lat_sorted, 0.99)),
            fmt_ns(lat_sorted.last().copied().unwrap_or(0)),
            written,
            batch,
            fmt_ratio(vs_naive),
            fmt_ratio(vs_group),
            fmt_ratio(vs_sqlite),
            fmt_ratio(vs_serial),
            fmt_ratio(Some(med / disk)),
        );
    }
    println!();
    println!(
        "store 'empty': new keys start from a new file; replays and mixed read a {}-record store. \
         idem batch re-runs during the runs: {reruns}; Error::Busy: {busy}.",
        with_commas(SMALL as u64)
    );
    let path = csv_path();
    let written = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&path, &csv));
    match written {
        Ok(()) => println!(
            "csv         {} (the chart: scripts/claims-chart {})",
            path.display(),
            path.display()
        ),
        Err(e) => println!("csv         not written to {} ({e})", path.display()),
    }

    targets::print(b);
}
