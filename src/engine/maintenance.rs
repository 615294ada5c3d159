//! Maintenance and monitoring: the performance counters ([`Metrics`]), compaction and redb's
//! integrity check (both need the only handle to the store).

use std::sync::atomic::Ordering;

use crate::engine::boundary::catch_storage_panic;
#[cfg(doc)]
use crate::engine::lease::Lease;
use crate::engine::store::Store;
use crate::error::Error;
use crate::model::reports::SweepReport;

/// Performance counters since the store was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Metrics {
    /// Write transactions committed by the group-commit path.
    pub commits: u64,
    /// Requests answered by those commits (claims, completions, heartbeats, releases, …).
    pub committed_requests: u64,
    /// Batches re-run because one member's closure failed after writing.
    pub reruns: u64,
    /// Callers turned away with [`Error::Busy`].
    pub busy: u64,
    /// Callers waiting for the next commit at the moment of the snapshot.
    pub queued: usize,
    /// Sweep passes run (by [`Store::sweep`] or the background sweeper), failed ones included.
    pub sweep_passes: u64,
    /// Records deleted or shrunk to tombstones by all passes.
    pub swept_records: u64,
    /// Sweep passes that returned an error.
    pub sweep_failures: u64,
    /// The last pass: records swept by it, its batches and its duration.
    pub last_sweep: SweepReport,
    /// Journal mode ([`crate::StoreBuilder::journal`]): the journal's figures; all zero otherwise.
    pub journal: JournalMetrics,
}

/// The journal's counters since open (journal mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct JournalMetrics {
    /// Entries written as frames (batches that wrote and were journaled).
    pub frames: u64,
    /// Bytes of frames written, padding and wrap frames included.
    pub frame_bytes: u64,
    /// `fdatasync` calls on the journal that returned Ok.
    pub syncs: u64,
    /// Checkpoints: durable redb commits (by size, for an entry the journal cannot hold, for a
    /// batch that wrote a table it cannot replay, or forced).
    pub checkpoints: u64,
    /// Entries the open replayed from the journal (those a crash left outside redb).
    pub replayed: u64,
    /// Batches committed durably instead of journaled because they opened a table recovery
    /// cannot replay: a caller's table not registered with
    /// [`StoreBuilder::journal_table`](crate::StoreBuilder::journal_table) (or registered with
    /// other types), or a multimap table. Each costs an fsync of the store file instead of a
    /// journal append; register the table to journal its writes (the first such table is
    /// also logged as a warning, feature `tracing`).
    pub unjournaled: u64,
    /// Batches that waited for the applier before sealing their entry, because the journaled
    /// writes not yet in redb's file exceeded
    /// [`StoreBuilder::journal_pending_bytes`](crate::StoreBuilder::journal_pending_bytes).
    pub pending_waits: u64,
    /// Time spent in the checkpoints' durable commits, summed. Each flushes the store file's
    /// pages written since the one before, and a journal sync beside it waits for the disk:
    /// divided by the time since open, it is the share of time a claim may wait behind one,
    /// which makes the latency tail of a busy store (docs/design.md, "Where the rest of the gap
    /// is").
    pub checkpoint_time: std::time::Duration,
}

impl Metrics {
    /// Average requests per commit (0 before the first commit).
    pub fn average_batch(&self) -> f64 {
        if self.commits == 0 {
            0.0
        } else {
            self.committed_requests as f64 / self.commits as f64
        }
    }
}
impl Store {
    /// Counters since open: the commit path (commits, requests per commit, re-runs, callers
    /// turned away, queue length) and the sweeps (passes, records swept, failures, the last
    /// pass's figures and duration). Reads in-memory counters only, no I/O. For record counts by
    /// state see [`Store::stats`].
    pub fn metrics(&self) -> Metrics {
        let c = &self.group().counters;
        let sweeps = self.sweep_totals();
        Metrics {
            commits: c.commits.load(Ordering::Relaxed),
            committed_requests: c.committed_ops.load(Ordering::Relaxed),
            reruns: c.reruns.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            queued: self.group().queued(),
            sweep_passes: sweeps.passes,
            swept_records: sweeps.swept,
            sweep_failures: sweeps.failures,
            last_sweep: sweeps.last,
            journal: self
                .journal()
                .map(|j| JournalMetrics {
                    pending_waits: self.applier().map_or(0, |a| a.pending_waits()),
                    ..j.metrics()
                })
                .unwrap_or_default(),
        }
    }

    /// Compacts the file: redb moves live pages to the front and truncates the free space at
    /// the end. Returns whether anything was moved.
    ///
    /// **When it is worth it.** Rarely. redb reuses freed pages, so under a steady load with
    /// sweeps running the file stops growing by itself and compaction gains little. Call it
    /// after the file held far more records than it does now — a traffic spike, a backlog that
    /// a first sweep cleared, a retention you shortened — and you want the disk space back:
    /// run [`Store::sweep`] first, then compact (compare the file's size before and after).
    /// It rewrites much of the file with durable commits, and nothing else can use the store
    /// meanwhile, so do it at a quiet moment (e.g. at startup, before handing out clones).
    ///
    /// It needs the store to itself: `&mut self`, no other clone of this `Store`, no live
    /// [`Lease`], and no read transaction from [`Store::read_transaction`]; otherwise it does nothing
    /// and returns [`Error::InUse`]. Background threads are stopped for its duration and
    /// restarted after. A fail-stopped store must be reopened first.
    pub fn compact(&mut self) -> Result<bool, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        self.check_writable()?;
        // Background threads hold `Weak`s, which `Arc::get_mut` refuses too.
        self.stop_background();
        let compacted = self.compact_exclusive();
        let restarted = self.start_background();
        let compacted = compacted?;
        restarted?;
        Ok(compacted)
    }

    /// Runs redb's full integrity check of the file (and repairs it if it can), plus idem's own
    /// check that the expiry index matches the records. Returns `Ok(true)` if the file passed,
    /// `Ok(false)` if redb found damage and repaired it, and [`Error::ExpiryIndexMismatch`] if
    /// redb's pages passed (or were repaired) but the expiry index disagrees with the records
    /// (no fail-stop; a damage or a panic while reading them is [`Error::CorruptStore`]). Slow:
    /// for operators who suspect the file was modified outside idem, not for normal operation
    /// (crash recovery is automatic). Like [`Store::compact`], it needs the only handle
    /// ([`Error::InUse`] otherwise), and a fail-stopped store must be reopened first
    /// ([`Error::FailStopped`]).
    ///
    /// **Run it on a copy when you suspect damage.** If redb cannot repair the file, this returns
    /// [`Error::CorruptStore`] and the store is fail-stopped; a damaged file then no longer
    /// opens with the default open-time check of every page
    /// ([`StoreBuilder::verify_on_open`](crate::StoreBuilder::verify_on_open)), which the store
    /// was presumably opened without — even when the damage was one page and every other record
    /// still read correctly before the check. `idem check` checks a copy and leaves the file
    /// untouched unless given `--in-place`. A record value that
    /// no longer matches its own checksum is found without this check: reading it gives
    /// [`Error::CorruptRecord`].
    pub fn check_integrity(&mut self) -> Result<bool, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        // After an I/O failure redb's in-memory state is stale: only a reopen rebuilds it.
        self.check_writable()?;
        self.stop_background();
        let checked = self.check_integrity_exclusive();
        let restarted = self.start_background();
        let passed = checked?;
        restarted?;
        match self.expiry_index_verdict()? {
            Ok(()) => Ok(passed),
            Err(reason) => Err(Error::ExpiryIndexMismatch {
                reason,
                repaired: !passed,
            }),
        }
    }

    fn check_integrity_exclusive(&mut self) -> Result<bool, Error> {
        let db = self.exclusive_db("check_integrity")?;
        let checked = match catch_storage_panic(|| db.check_integrity()) {
            Ok(checked) => checked,
            Err(p) => {
                // redb may have discarded its allocator state before it stopped.
                return Err(self.latch_damage(p.into_error("running the integrity check")));
            }
        };
        checked.map_err(|e| match e {
            redb::DatabaseError::TransactionInProgress => Error::InUse {
                operation: "check_integrity",
                reason: "a read transaction (Store::read_transaction) is still open".into(),
            },
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(what)) => {
                // redb discarded its allocator state: no write may follow on this handle.
                self.latch(&what);
                Error::CorruptStore {
                    reason: format!(
                        "redb's integrity check failed and could not repair the file ({what}); an open that checks its pages (the default) refuses it"
                    ),
                }
            }
            other => self.storage(other),
        })
    }

    fn compact_exclusive(&mut self) -> Result<bool, Error> {
        let db = self.exclusive_db("compact")?;
        let result = match catch_storage_panic(|| db.compact(redb::CompactionMode::Balanced)) {
            Ok(result) => result,
            Err(p) => {
                // Compaction moves pages with durable commits: stop writing after a failure.
                return Err(self.latch_damage(p.into_error("compacting the file")));
            }
        };
        if result.is_ok() {
            // Compaction commits durably, which makes every earlier commit durable too.
            self.set_unflushed(false);
        }
        result.map_err(|e| match e {
            redb::CompactionError::TransactionInProgress => Error::InUse {
                operation: "compact",
                reason: "a read transaction (Store::read_transaction) is still open".into(),
            },
            redb::CompactionError::Storage(e) => self.storage(e),
            other => self.storage(other),
        })
    }
}
