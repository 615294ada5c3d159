//! The bench's settings: `IDEM_BENCH_QUICK`, `IDEM_BENCH_PREFILL`, `IDEM_BENCH_RUNS`,
//! `IDEM_BENCH_RUN_SECS`, `IDEM_BENCH_DIR` and `IDEM_BENCH_FILTER` (`IDEM_BENCH_CSV`: report.rs).

use std::path::PathBuf;

use bench_common::{bench_parent, env_parse, quick};

use crate::data::SMALL;

/// How long and on what the bench runs (benches/README.md lists every variable).
pub struct Settings {
    /// `IDEM_BENCH_QUICK`: the quick mode's defaults.
    pub quick: bool,
    pub prefill: usize,
    pub runs: usize,
    pub run_secs: f64,
    pub probe_secs: f64,
    pub parent: PathBuf,
    /// `IDEM_BENCH_FILTER`: comma-separated, case-insensitive pieces of workload names; only
    /// matching rows run (the disk's rate always does).
    pub filter: Vec<String>,
}

/// The settings from the environment, each with its mode's default.
pub fn settings() -> Settings {
    let quick = quick();
    let prefill =
        env_parse("IDEM_BENCH_PREFILL").unwrap_or(if quick { 100_000 } else { 1_000_000 });
    Settings {
        quick,
        prefill: prefill.max(SMALL),
        runs: env_parse("IDEM_BENCH_RUNS")
            .unwrap_or(if quick { 3 } else { 5 })
            .max(1),
        run_secs: env_parse("IDEM_BENCH_RUN_SECS").unwrap_or(if quick { 0.3 } else { 1.5 }),
        probe_secs: if quick { 0.05 } else { 0.2 },
        parent: bench_parent(),
        filter: std::env::var("IDEM_BENCH_FILTER")
            .unwrap_or_default()
            .split(',')
            .map(|f| f.trim().to_lowercase())
            .filter(|f| !f.is_empty())
            .collect(),
    }
}
