//! The run's header: mode, date, machine, kernel, load, temp dir and filesystem, versions, page
//! cache, record sizes, settings and the bytes-written counter. Its lines that say which run a
//! chart shows also head the CSV file.

use std::path::Path;
use std::thread;

use bench_common::{
    cpu_model, filesystem_of, kernel, loadavg, locked_version, mem_total_gib, utc_now,
};

use crate::data::{SMALL, new_key, now_ms, record_key, record_value};
use crate::fmt::with_commas;
use crate::idem_ops::CACHE;
use crate::settings::Settings;
use crate::written::WriteCounter;

/// Prints the header of a run in `dir` (the bench's temp dir) and returns the lines the CSV
/// file repeats as `# ` comments.
pub fn print(cfg: &Settings, dir: &Path, counter: &WriteCounter) -> Vec<String> {
    println!(
        "idem claim_throughput — {} mode{}",
        if cfg.quick { "quick" } else { "full" },
        if cfg.quick {
            " (IDEM_BENCH_QUICK=1)"
        } else {
            ""
        }
    );
    // The header lines that also head the CSV file (as `# ` comments), so a chart made from it
    // can say which run it shows.
    let mut csv_header = vec![format!(
        "idem claim_throughput — {} mode",
        if cfg.quick { "quick" } else { "full" }
    )];
    let mut head = |line: String| {
        println!("{line}");
        csv_header.push(line);
    };
    head(format!("date        {}", utc_now()));
    head(format!(
        "machine     nproc {}, {}, {:.1} GiB RAM",
        thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model().unwrap_or_else(|| "cpu unknown".into()),
        mem_total_gib().unwrap_or(f64::NAN)
    ));
    head(format!("kernel      {} (uname -r)", kernel()));
    println!(
        "load        {} (1/5/15-min load average at start)",
        loadavg()
    );
    match filesystem_of(dir) {
        Some((dev, fs, mnt)) => println!(
            "temp dir    {} — {fs} on {dev} (mounted at {mnt})",
            dir.display()
        ),
        None => println!("temp dir    {} — filesystem unknown", dir.display()),
    }
    head(format!(
        "versions    idem {}, redb {}, SQLite {} (rusqlite {}, bundled){}",
        locked_version("idem-store"),
        locked_version("redb"),
        rusqlite::version(),
        locked_version("rusqlite"),
        if cfg!(debug_assertions) {
            " — DEBUG BUILD, numbers meaningless"
        } else {
            ""
        }
    ));
    println!(
        "page cache  {} MiB for every redb store, idem's included (redb's default; idem's own default is {} MiB: benches/scale.rs); SQLite 1 GiB",
        CACHE >> 20,
        idem::store::DEFAULT_CACHE_SIZE >> 20
    );
    let sample_key = new_key(0, 0, 0);
    println!(
        "record      key {} B, value {} B (a completed record in idem's encoding); caller write: effects[key] = 1",
        record_key(&sample_key).len(),
        record_value(&sample_key, now_ms()).len()
    );
    head(format!(
        "settings    {} runs per workload, ~{:.1} s per run (count-bounded); pre-filled store {} records; \
         'empty' replays and mixed read a {}-record store{}",
        cfg.runs,
        cfg.run_secs,
        with_commas(cfg.prefill as u64),
        with_commas(SMALL as u64),
        if cfg.filter.is_empty() {
            String::new()
        } else {
            format!("; IDEM_BENCH_FILTER={}", cfg.filter.join(","))
        }
    ));
    println!("written     {}", counter.describe());
    println!();
    csv_header
}
