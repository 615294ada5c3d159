//! The pre-filled stores: idem's and SQLite's, small and large, their read-only replay copies and
//! the copy with the expiry index in the records tree, built once and copied for every run that
//! writes.

use std::path::{Path, PathBuf};

use bench_common::copy_synced;

use crate::baselines::naive::colocate_copy;
use crate::baselines::sqlite::prefill_sqlite;
use crate::data::{PREFILL_THREADS, SMALL};
use crate::fmt::with_commas;
use crate::idem_ops::prefill_idem;

/// The stores every run starts from, built once in the bench's temp dir.
pub struct Masters {
    pub idem_small: PathBuf,
    pub idem_large: PathBuf,
    pub sqlite_small: PathBuf,
    pub sqlite_large: PathBuf,
    /// Shared read-only copies for the replay workloads (replays write no keys).
    pub idem_small_replay: PathBuf,
    pub idem_large_replay: PathBuf,
    /// The pre-filled store with its expiry index inside the records tree (`colocate_copy`).
    pub colocated_large: PathBuf,
    pub sqlite_small_replay: PathBuf,
    pub sqlite_large_replay: PathBuf,
}

impl Masters {
    /// Builds every master in `dir` (the large ones with `prefill` records) and prints how long
    /// the pre-fill took and the bytes per record on disk.
    pub fn build(dir: &Path, prefill: usize) -> Masters {
        let masters = Masters {
            idem_small: dir.join("master-small.redb"),
            idem_large: dir.join("master-large.redb"),
            sqlite_small: dir.join("master-small.db"),
            sqlite_large: dir.join("master-large.db"),
            idem_small_replay: dir.join("replay-small.redb"),
            idem_large_replay: dir.join("replay-large.redb"),
            colocated_large: dir.join("colocated-large.redb"),
            sqlite_small_replay: dir.join("replay-small.db"),
            sqlite_large_replay: dir.join("replay-large.db"),
        };
        eprintln!("pre-filling the stores ...");
        let t_small = prefill_idem(&masters.idem_small, SMALL);
        let t_idem = prefill_idem(&masters.idem_large, prefill);
        prefill_sqlite(&masters.sqlite_small, SMALL);
        let t_sqlite = prefill_sqlite(&masters.sqlite_large, prefill);
        for (from, to) in [
            (&masters.idem_small, &masters.idem_small_replay),
            (&masters.idem_large, &masters.idem_large_replay),
            (&masters.sqlite_small, &masters.sqlite_small_replay),
            (&masters.sqlite_large, &masters.sqlite_large_replay),
        ] {
            copy_synced(from, to);
        }
        colocate_copy(&masters.idem_large, &masters.colocated_large);
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        let (idem_size, sqlite_size) = (size(&masters.idem_large), size(&masters.sqlite_large));
        println!(
            "prefill     idem: {} records via Store::execute on {PREFILL_THREADS} threads (group commit, fsync per commit) in {:.1} s ({:.0}/s; the {}-record store: {:.1} s)",
            with_commas(prefill as u64),
            t_idem.as_secs_f64(),
            prefill as f64 / t_idem.as_secs_f64(),
            with_commas(SMALL as u64),
            t_small.as_secs_f64()
        );
        println!(
            "            SQLite: the same records in one transaction in {:.1} s",
            t_sqlite.as_secs_f64()
        );
        println!(
            "on disk     pre-filled, {} records + their caller rows: redb file {:.1} MiB = {:.0} B/record; \
             SQLite file {:.1} MiB = {:.0} B/record (WAL checkpointed)",
            with_commas(prefill as u64),
            idem_size as f64 / 1048576.0,
            idem_size as f64 / prefill as f64,
            sqlite_size as f64 / 1048576.0,
            sqlite_size as f64 / prefill as f64
        );
        println!();
        masters
    }
}
