//! Sweeps: shrinking records past their response window to tombstones and deleting records past
//! `forget_at`, by range scans of the expiry index, in bounded write transactions that go
//! through group commit like every other write.
//!
//! A sweep never changes an answer: [`crate::rules::decide`] already treats every record by its stored
//! instants, and [`crate::model::rules::sweep_action`] only deletes what `decide` treats as absent
//! and only shrinks what it answers as `Expired`. Sweeps free space; correctness never waits
//! for them.

use std::time::{Duration, Instant};

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::commit::{Durable, Step};
use crate::engine::expiry::{KIND_RECORD, parse_entry, put_in, record_entry, remove_in};
use crate::engine::journal::Wtx;
use crate::engine::marks::{KIND_MARK, MarkSweep, sweep_mark_entry};
use crate::engine::store::Store;
use crate::engine::tables::{EXPIRY, RECORDS};
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::record::Record;
use crate::model::reports::SweepReport;
use crate::model::rules::{SweepAction, sweep_action, sweep_due};
use crate::runtime::observe;

/// Totals over every pass since open, for [`crate::store::Metrics`].
#[derive(Debug, Default)]
pub(crate) struct SweepTotals {
    pub passes: u64,
    pub swept: u64,
    pub failures: u64,
    pub last: SweepReport,
}

/// Pause between two batches of a pass, so claims get the writer between sweep batches.
const PAUSE_BETWEEN_BATCHES: Duration = Duration::from_millis(1);

/// What one batch did.
#[derive(Debug, Default)]
struct Batch {
    deleted: u64,
    tombstoned: u64,
    repaired: u64,
    /// More entries are due at the pass's cutoff.
    more: bool,
}

impl Store {
    /// Runs one sweep pass now and reports what it did: every expiry-index entry due at the
    /// current time is handled — records past their response window shrink to tombstones,
    /// records past `forget_at` are deleted — in write transactions of at most
    /// [`sweep_batch`](crate::StoreBuilder::sweep_batch) records each. Each batch goes through
    /// the same commit path as claims, and the pass lets waiting callers commit between batches,
    /// so a claim waits behind at most one batch. Live leases are never due, so never touched.
    ///
    /// Answers never depend on sweeps (every decision reads the stored instants); sweeping
    /// bounds the file. Passes on one store run one at a time. Without a background sweeper
    /// ([`sweep_interval`](crate::StoreBuilder::sweep_interval)), call this periodically. A
    /// failure is returned (and counted in [`crate::store::Metrics::sweep_failures`]); what the
    /// committed batches did stays done.
    pub fn sweep(&self) -> Result<SweepReport, Error> {
        self.sweep_with_progress(|_| {})
    }

    /// [`Store::sweep`], calling `progress` with the running totals after every committed
    /// batch (for an operator's progress display on a long pass).
    pub fn sweep_with_progress(
        &self,
        mut progress: impl FnMut(&SweepReport),
    ) -> Result<SweepReport, Error> {
        let mut report = SweepReport::default();
        let result = self.sweep_pass(&mut report, &mut progress);
        // `idem_records{state}` after every pass that ran (one read of the expiry index).
        observe::with_metrics(|| {
            if result.is_ok() {
                let _ = self.stats();
            }
        });
        let mut totals = self.sweep_totals();
        totals.passes += 1;
        totals.swept += report.swept();
        totals.last = report;
        if result.is_err() {
            totals.failures += 1;
        }
        result.map(|()| report)
    }

    fn sweep_pass(
        &self,
        report: &mut SweepReport,
        progress: &mut dyn FnMut(&SweepReport),
    ) -> Result<(), Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        self.check_writable()?;
        let _one_pass_at_a_time = self.one_sweep_at_a_time();
        let started = Instant::now();
        let cutoff = self.now();
        let limit = self.config().sweep_batch;
        let mut more = self.anything_due(cutoff)?;
        while more {
            let batch = self.write(Durable::AsConfigured, |txn, now| {
                match self.sweep_batch(txn, cutoff, now, limit) {
                    Ok(batch) => Step::Done(batch),
                    Err(e) => Step::Abort(e),
                }
            });
            report.duration = started.elapsed();
            let batch = batch?;
            report.batches += 1;
            report.deleted += batch.deleted;
            report.tombstoned += batch.tombstoned;
            report.repaired += batch.repaired;
            progress(report);
            // The commit queue is first come, first served, so callers that queued while this
            // batch ran commit before the sweep's next batch. The pause also leaves callers that
            // arrive right after it a window without a sweep batch ahead of them, at the cost of
            // the pause per batch (benches/retention.rs reports claim latency during a sweep).
            more = batch.more;
            if more {
                std::thread::sleep(PAUSE_BETWEEN_BATCHES);
            }
        }
        report.duration = started.elapsed();
        Ok(())
    }

    /// Whether any index entry is due at `cutoff`, from a read transaction: an idle pass costs
    /// no write transaction and no fsync.
    fn anything_due(&self, cutoff: Timestamp) -> Result<bool, Error> {
        self.read("looking for records due for a sweep", |read| {
            let expiry = read.open_table(EXPIRY).map_err(unlatched)?;
            let first = expiry.first().map_err(unlatched)?;
            Ok(first.is_some_and(|(k, _)| parse_entry(k.value()).is_none_or(|e| e.due <= cutoff)))
        })
    }

    /// One batch: the first `limit` index entries due at `cutoff`, acted on at `now`.
    fn sweep_batch(
        &self,
        txn: &Wtx<'_>,
        cutoff: Timestamp,
        now: Timestamp,
        limit: usize,
    ) -> Result<Batch, Error> {
        let storage = |e: redb::StorageError| self.storage(e);
        let mut records = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let mut expiry = txn.open_table(EXPIRY).map_err(|e| self.storage(e))?;
        let due: Vec<Vec<u8>> = {
            // Entries due at `cutoff` are exactly those before `u64be(cutoff + 1)`.
            let range = match cutoff.0.checked_add(1) {
                Some(end) => expiry.range::<&[u8]>(..end.to_be_bytes().as_slice()),
                None => expiry.range::<&[u8]>(..),
            }
            .map_err(storage)?;
            range
                .take(limit.saturating_add(1))
                .map(|row| row.map(|(k, _)| k.value().to_vec()))
                .collect::<Result<_, _>>()
                .map_err(storage)?
        };
        let mut batch = Batch {
            more: due.len() > limit,
            ..Batch::default()
        };
        for raw in due.iter().take(limit) {
            let entry = match parse_entry(raw) {
                Some(e) if e.kind == KIND_RECORD => e,
                Some(e) if e.kind == KIND_MARK => {
                    match sweep_mark_entry(txn, &mut expiry, raw, e.key, now)
                        .map_err(|e| self.storage(e))?
                    {
                        MarkSweep::Deleted => batch.deleted += 1,
                        MarkSweep::Repaired => batch.repaired += 1,
                        MarkSweep::Keep => {
                            batch.more = false;
                            break;
                        }
                    }
                    continue;
                }
                // Damage: nothing this build wrote. Drop it so it cannot clog the index.
                _ => {
                    expiry.remove(raw.as_slice()).map_err(storage)?;
                    batch.repaired += 1;
                    continue;
                }
            };
            let stored = records
                .get(entry.key)
                .map_err(storage)?
                .map(|v| Record::decode(v.value()));
            let record = match stored {
                Some(Ok(r)) => r,
                // No record, or one that no longer decodes (it does not expire: its instants
                // cannot be read, docs/FORMAT.md): the entry is an orphan.
                None | Some(Err(_)) => {
                    expiry.remove(raw.as_slice()).map_err(storage)?;
                    batch.repaired += 1;
                    continue;
                }
            };
            let expected = record_entry(&record, entry.key);
            if expected != *raw {
                // The record belongs at another instant; keep exactly one entry for it.
                expiry.remove(raw.as_slice()).map_err(storage)?;
                expiry
                    .insert(expected.as_slice(), record.state.tag())
                    .map_err(storage)?;
                batch.repaired += 1;
                batch.more |= sweep_due(&record) <= cutoff;
                continue;
            }
            match sweep_action(&record, now) {
                SweepAction::Delete => {
                    remove_in(&mut records, &mut expiry, entry.key).map_err(storage)?;
                    batch.deleted += 1;
                }
                SweepAction::Shrink(tombstone) => {
                    put_in(&mut records, &mut expiry, entry.key, &tombstone).map_err(storage)?;
                    batch.tombstoned += 1;
                }
                SweepAction::Keep => {
                    // Due at the cutoff but not at `now`: the clock went back during the pass.
                    // Later entries are due later still; the next pass picks them up.
                    batch.more = false;
                    break;
                }
            }
        }
        Ok(batch)
    }
}
