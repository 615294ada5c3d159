//! The markdown the run prints: per caller count, each row's claims/s, p50 and p99 with their
//! ratios to the RocksDB TransactionDB row, the process's CPU time per claim, how busy the
//! machine's cores were and the bytes written to the stores' disk per claim; then each store's bytes
//! on disk per record.

use std::fmt::Write as _;

use crate::harness::Sample;

/// The row every ratio is taken against.
pub const BASELINE: &str = "rocksdb txn";

/// One row's samples at one caller count, one per rep.
pub struct Cell<'a> {
    /// The row's label.
    pub label: &'a str,
    /// The caller count.
    pub callers: usize,
    /// The reps' samples.
    pub samples: Vec<&'a Sample>,
}

/// One cell's figures over all its reps.
pub struct Summary {
    /// Claims/s: total claims over total window time.
    pub rate: f64,
    /// Each rep's claims/s.
    pub per_rep: Vec<f64>,
    /// The median latency in µs over all the cell's claims.
    pub p50: f64,
    /// The 99th percentile latency in µs over all the cell's claims.
    pub p99: f64,
    /// The process's CPU time per claim, in µs.
    pub cpu_us: f64,
    /// The machine's busy share over the windows (1.0: every core busy).
    pub busy: f64,
    /// Bytes written to the stores' disk per claim ([`Sample::written`]), in KiB.
    pub written_kib: f64,
}

/// The cell's [`Summary`].
pub fn summarize(cell: &Cell<'_>) -> Summary {
    let claims: u64 = cell.samples.iter().map(|s| s.claims).sum();
    let secs: f64 = cell.samples.iter().map(|s| s.elapsed.as_secs_f64()).sum();
    let per_rep = cell
        .samples
        .iter()
        .map(|s| s.claims as f64 / s.elapsed.as_secs_f64())
        .collect();
    let mut lat: Vec<u64> = cell
        .samples
        .iter()
        .flat_map(|s| s.latencies_ns.iter().copied())
        .collect();
    lat.sort_unstable();
    let pct = |p: f64| -> f64 {
        if lat.is_empty() {
            return f64::NAN;
        }
        let i = ((lat.len() as f64 * p).ceil() as usize).clamp(1, lat.len()) - 1;
        lat[i] as f64 / 1000.0
    };
    let cpu: f64 = cell.samples.iter().map(|s| s.cpu.as_secs_f64()).sum();
    let busy = cell
        .samples
        .iter()
        .map(|s| s.machine_busy * s.elapsed.as_secs_f64())
        .sum::<f64>()
        / secs;
    let written: u64 = cell.samples.iter().map(|s| s.written).sum();
    Summary {
        rate: claims as f64 / secs,
        per_rep,
        p50: pct(0.50),
        p99: pct(0.99),
        cpu_us: cpu * 1e6 / claims.max(1) as f64,
        busy,
        written_kib: written as f64 / 1024.0 / claims.max(1) as f64,
    }
}

fn fmt_us(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn ratio(x: f64, base: Option<f64>) -> String {
    match base {
        Some(b) if b > 0.0 && x.is_finite() => format!("{:.2}x", x / b),
        _ => "-".into(),
    }
}

/// The results table: one line per caller count and row.
pub fn table(cells: &[Cell<'_>], callers: &[usize]) -> String {
    let mut out = String::new();
    out.push_str(
        "| callers | row | claims/s | per rep | p50 | p99 | claims/s vs txn | p50 vs txn | p99 vs txn | CPU µs/claim | machine busy | disk KiB/claim |\n",
    );
    out.push_str("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &c in callers {
        let base = cells
            .iter()
            .find(|cell| cell.callers == c && cell.label == BASELINE)
            .map(summarize);
        for cell in cells.iter().filter(|cell| cell.callers == c) {
            let Summary {
                rate,
                per_rep,
                p50,
                p99,
                cpu_us,
                busy,
                written_kib,
            } = summarize(cell);
            let reps: Vec<String> = per_rep.iter().map(|r| format!("{r:.0}")).collect();
            let _ = writeln!(
                out,
                "| {c} | {} | {rate:.0} | {} | {} | {} | {} | {} | {} | {cpu_us:.0} | {:.0}% | {written_kib:.1} |",
                cell.label,
                reps.join(", "),
                fmt_us(p50),
                fmt_us(p99),
                ratio(rate, base.as_ref().map(|b| b.rate)),
                ratio(p50, base.as_ref().map(|b| b.p50)),
                ratio(p99, base.as_ref().map(|b| b.p99)),
                busy * 100.0,
            );
        }
    }
    out
}

/// One store's size after the run.
pub struct Size<'a> {
    /// The row's label.
    pub label: &'a str,
    /// Records in the store: the pre-fill's plus every claim of the run.
    pub records: u64,
    /// Sum of the store's file sizes (apparent) right after the pre-fill.
    pub after_prefill: u64,
    /// Sum of the store's file sizes (apparent) after the run.
    pub apparent: u64,
    /// Sum of the store's files' allocated blocks after the run.
    pub allocated: u64,
}

/// The bytes-on-disk table.
pub fn sizes(rows: &[Size<'_>], prefilled: u64) -> String {
    let mut out = String::new();
    out.push_str("| row | records | bytes/record after pre-fill | bytes/record after run | allocated bytes/record after run | store MiB after run |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|\n");
    for s in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {:.0} | {:.1} |",
            s.label,
            s.records,
            s.after_prefill as f64 / prefilled.max(1) as f64,
            s.apparent as f64 / s.records.max(1) as f64,
            s.allocated as f64 / s.records.max(1) as f64,
            s.apparent as f64 / (1u64 << 20) as f64,
        );
    }
    out
}
