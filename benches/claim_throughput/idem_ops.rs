//! The idem rows' calls (flow A through `execute` and `execute_on_writer`, a replay, flow B) on a
//! store opened with the same page cache as the baselines, and the pre-fill through the public API.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use bench_common::sync_file;
use bench_common::workload::{request, response};
use idem::{BeginAnswer, ExecuteAnswer, Store};

use crate::data::{EFFECTS, PREFILL_THREADS, existing_key};

/// The page cache of every idem store here: redb's default (1 GiB), the cache the naive redb
/// baselines open with and the size SQLite gets, so the rows compare commit paths, not cache
/// sizes. idem's own default is 64 MiB (`idem::store::DEFAULT_CACHE_SIZE`); what that costs is
/// measured by `benches/scale.rs` (benches/results/2026-12-02-0bd18d7-scale-page-cache-sizes.md).
pub const CACHE: usize = 1 << 30;

/// An idem store at `path` with the baselines' page cache (`CACHE`), otherwise idem's defaults.
pub fn open_idem(path: &Path) -> Store {
    Store::builder()
        .cache_size(CACHE)
        .open(path)
        .expect("open idem store")
}

/// Flow A on a new key: `execute` whose closure writes the caller's row; must be `Executed`.
pub fn idem_claim(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            effects.insert(key.as_bytes(), 1)?;
            Ok(response())
        })
        .unwrap_or_else(|e| panic!("idem claim {key}: {e}"));
    assert!(
        matches!(outcome, ExecuteAnswer::Ran(_)),
        "idem claim {key}: {outcome:?}"
    );
}

/// `idem_claim` through `Store::execute_on_writer`: the closure is `Send + 'static` (it owns its
/// key), so the thread holding the batch runs it without a hand-off.
pub fn idem_claim_send(store: &Store, key: &str) {
    let owned = key.to_owned();
    let outcome = store
        .execute_on_writer(request(key), move |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            effects.insert(owned.as_bytes(), 1)?;
            Ok(response())
        })
        .unwrap_or_else(|e| panic!("idem claim {key}: {e}"));
    assert!(
        matches!(outcome, ExecuteAnswer::Ran(_)),
        "idem claim {key}: {outcome:?}"
    );
}

/// `execute` on an existing key: must be a replay, the closure never runs.
pub fn idem_replay(store: &Store, key: &str) {
    let outcome = store
        .execute(request(key), |_| {
            unreachable!("a replay never runs the closure")
        })
        .unwrap_or_else(|e| panic!("idem replay {key}: {e}"));
    assert!(outcome.is_replay(), "idem replay {key}: {outcome:?}");
}

/// Flow B on a new key: `begin` must acquire a lease, which `complete` then records (two commits).
pub fn idem_lease(store: &Store, key: &str) {
    match store.begin(request(key)) {
        Ok(BeginAnswer::Acquired(lease)) => {
            lease
                .complete(response())
                .unwrap_or_else(|e| panic!("idem complete {key}: {e}"));
        }
        other => panic!("idem begin {key}: expected a lease, got {other:?}"),
    }
}

/// Writes `n` completed records (`existing_key(0..n)`, each with its caller write) through
/// `Store::execute` on `PREFILL_THREADS` threads: the default store (`Durability::Immediate`),
/// so group commit batches the callers and the file is laid out as a busy durable store's is.
pub fn prefill_idem(path: &Path, n: usize) -> Duration {
    let t = Instant::now();
    let store = open_idem(path);
    thread::scope(|s| {
        for t in 0..PREFILL_THREADS {
            let store = &store;
            s.spawn(move || {
                for i in (t..n).step_by(PREFILL_THREADS) {
                    idem_claim(store, &existing_key(i));
                }
            });
        }
    });
    drop(store);
    sync_file(path);
    t.elapsed()
}
