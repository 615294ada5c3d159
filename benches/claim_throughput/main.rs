//! Multi-caller claim throughput: idem side by side with its baselines, in one run, on one
//! machine, with the same keys — naive redb (one durable write transaction per claim, same
//! key/value layout), SQLite (the common SQL flow, `INSERT ... ON CONFLICT DO NOTHING` then
//! `UPDATE`, WAL, `synchronous=FULL`), the disk's own `pwrite` + `fdatasync` rate, and an
//! in-memory `Mutex<HashMap>` (not durable: the CPU ceiling).
//!
//! ```text
//! cargo bench -p idem-benches --bench claim_throughput                      # full: 1,000,000-record store, 5 runs
//! IDEM_BENCH_QUICK=1 cargo bench -p idem-benches --bench claim_throughput   # quick: 100,000 records, 3 runs
//! ```
//!
//! Optional: `IDEM_BENCH_DIR` (parent of the temp dir; default the system temp dir),
//! `IDEM_BENCH_PREFILL` (records in the pre-filled store), `IDEM_BENCH_RUNS`,
//! `IDEM_BENCH_RUN_SECS` (target seconds per run), `IDEM_BENCH_FILTER` (comma-separated pieces
//! of workload names, e.g. `naive,mutex`: only those rows run), `IDEM_BENCH_CSV` (where the
//! summary's CSV copy goes; default `target/bench-results/claim_throughput.csv`, which
//! `scripts/claims-chart` turns into the chart of BENCHMARKS.md). BENCHMARKS.md and
//! benches/README.md explain every workload and column. A custom harness (std threads,
//! count-bounded runs) because criterion measures one caller at a time.
//!
//! | file | owns |
//! |---|---|
//! | `main.rs` | one invocation: settings, header, masters, the planned rows group by group, the report |
//! | `settings.rs` | the `IDEM_BENCH_*` settings and their quick and full defaults |
//! | `header.rs` | the run's header (machine, versions, settings), whose key lines head the CSV |
//! | `data.rs` | what every system stores: tables, keys, idem's record key and value bytes |
//! | `idem_ops.rs` | idem's calls (execute, execute_on_writer, replay, flow B) and its pre-fill |
//! | `baselines/` | naive redb and its expiry variants, the group-commit writer, SQLite, the in-memory map, the disk |
//! | `masters.rs` | the pre-filled stores, built once, copied for every run that writes |
//! | `rows.rs` | the rows (system, workload, store, callers), their labels and CSV names, the plan |
//! | `harness.rs` | one count-bounded run of many callers; the replays' key picker |
//! | `written.rs` | where "bytes written per op" comes from |
//! | `bench.rs` | per row: a fresh target, calibration, runs interleaved within a group |
//! | `report.rs` | the summary table and its CSV copy |
//! | `targets.rs` | the issues' goals, met or not |
//! | `fmt.rs` | how the summary prints numbers |

mod baselines;
mod bench;
mod data;
mod fmt;
mod harness;
mod header;
mod idem_ops;
mod masters;
mod report;
mod rows;
mod settings;
mod targets;
mod written;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use bench_common::loadavg;

use crate::bench::Bench;
use crate::data::make_template;
use crate::masters::Masters;
use crate::report::report;
use crate::settings::settings;
use crate::written::WriteCounter;

/// The bench's temp dir, for the panic hook to remove.
static ROOT: OnceLock<PathBuf> = OnceLock::new();

fn main() {
    // Any panic (a failed claim, a worker thread) ends the bench at once, removing its files:
    // a stuck barrier must never leave the run hanging.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        if let Some(root) = ROOT.get() {
            let _ = std::fs::remove_dir_all(root);
        }
        std::process::exit(101);
    }));

    let wall = Instant::now();
    let cfg = settings();
    let root = tempfile::Builder::new()
        .prefix("idem-claim-bench-")
        .tempdir_in(&cfg.parent)
        .expect("bench temp dir");
    let _ = ROOT.set(root.path().to_owned());
    let counter = WriteCounter::detect(root.path());
    make_template(root.path());

    let csv_header = header::print(&cfg, root.path(), &counter);
    let masters = Masters::build(root.path(), cfg.prefill);
    // The rows, in groups whose runs interleave.
    let (groups, display) = rows::plan(&cfg.filter);

    let mut bench = Bench {
        total_rows: groups.iter().map(Vec::len).sum(),
        cfg,
        counter,
        root,
        masters,
        results: HashMap::new(),
        order: Vec::new(),
        counts: HashMap::new(),
        csv_header,
    };
    for g in &groups {
        bench.group(g);
    }
    report(&bench, &display);
    println!();
    println!(
        "wall time {:.0} s (pre-fill, calibration and setup included); load average at the end: {}",
        wall.elapsed().as_secs_f64(),
        loadavg()
    );
    let _ = bench.root.close();
}
