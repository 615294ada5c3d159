//! Sweeps and stats on PostgreSQL: bounded batches on the `due` index, never a table-wide
//! `DELETE`, and a background sweeper any number of fleet nodes may run at once.
//!
//! A batch is one transaction: it locks up to `sweep_batch` records whose `due` instant has
//! come (`ORDER BY due LIMIT n FOR UPDATE SKIP LOCKED`: rows another node's sweep or a claim
//! holds are skipped, never waited for), asks the model's `sweep_action` for each, and deletes
//! or shrinks them in two statements; then the same for inbox marks. A pass fixes its cutoff
//! when it starts and repeats batches until a batch finds fewer than `sweep_batch` due rows
//! (or makes no progress: rows that do not decode are never swept).

use std::sync::Weak;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::marks::Mark;
use crate::model::record::Record;
use crate::model::reports::{Stats, SweepReport};
use crate::model::rules::inbox::is_mark_forgotten;
use crate::model::rules::{SweepAction, sweep_action, sweep_due};
use crate::postgres::commit::rollback;
use crate::postgres::conn::{NOW_MS, at_commit, storage};
use crate::postgres::store::{Inner, PgStore};
use crate::runtime::observe;

impl PgStore {
    /// Runs one sweep pass: shrinks records past their response window to tombstones, deletes
    /// records and inbox marks past their horizon, in transactions of at most
    /// `sweep_batch` rows each, and forgets the ordering keys of the outbox that no event uses
    /// any more. Live leases are never touched (a Pending record is due only past its
    /// `forget_at`). Several nodes may sweep at once.
    pub fn sweep(&self) -> Result<SweepReport, Error> {
        let started = Instant::now();
        let mut report = SweepReport::default();
        let cutoff = self.current_time()?;
        loop {
            let (swept, found) = self.sweep_records(cutoff, &mut report)?;
            report.batches += 1;
            if found < self.config().sweep_batch || swept == 0 {
                break;
            }
        }
        loop {
            let (swept, found) = self.sweep_marks(cutoff, &mut report)?;
            report.batches += 1;
            if found < self.config().sweep_batch || swept == 0 {
                break;
            }
        }
        self.prune_ordering_keys()?;
        report.duration = started.elapsed();
        // `idem_records{state}` after every pass (one counting statement).
        observe::with_metrics(|| {
            let _ = self.stats();
        });
        Ok(report)
    }

    /// Counts the records by stored state, and those due for a sweep, in one statement.
    pub fn stats(&self) -> Result<Stats, Error> {
        let now = self.current_time()?;
        let q = format!(
            "SELECT count(*), count(*) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 1),
                    count(*) FILTER (WHERE state = 2), count(*) FILTER (WHERE state = 3),
                    count(*) FILTER (WHERE due <= $1)
             FROM {}",
            self.sql().records
        );
        let mut conn = self.connection()?;
        let now_ms = i64::try_from(now.0).unwrap_or(i64::MAX);
        let row = conn.client.query_one(q.as_str(), &[&now_ms]).map_err(|e| {
            conn.saw(&e);
            storage(e)
        })?;
        let n = |i: usize| u64::try_from(row.get::<_, i64>(i)).unwrap_or(0);
        let stats = Stats {
            records: n(0),
            pending: n(1),
            completed: n(2),
            failed: n(3),
            tombstones: n(4),
            due: n(5),
        };
        observe::records(&stats);
        Ok(stats)
    }

    /// The store's time, read from the server now (or the injected clock).
    pub(crate) fn current_time(&self) -> Result<Timestamp, Error> {
        let mut conn = self.connection()?;
        let ms: i64 = conn
            .client
            .query_one(&format!("SELECT {NOW_MS}"), &[])
            .map_err(|e| {
                conn.saw(&e);
                storage(e)
            })?
            .get(0);
        Ok(self.batch_time(ms))
    }

    /// One batch of due records; returns (rows swept, due rows found).
    fn sweep_records(
        &self,
        cutoff: Timestamp,
        report: &mut SweepReport,
    ) -> Result<(u64, usize), Error> {
        let sql = self.sql();
        let cutoff_ms = i64::try_from(cutoff.0).unwrap_or(i64::MAX);
        let limit = i64::try_from(self.config().sweep_batch).unwrap_or(i64::MAX);
        let mut conn = self.connection()?;
        let result = (|| -> Result<(u64, usize), Error> {
            let mut txn = conn.client.transaction().map_err(storage)?;
            let rows = txn
                .query(
                    &format!(
                        "SELECT record_key, record FROM {} WHERE due <= $1 ORDER BY due LIMIT $2 FOR UPDATE SKIP LOCKED",
                        sql.records
                    ),
                    &[&cutoff_ms, &limit],
                )
                .map_err(storage)?;
            let found = rows.len();
            let mut delete: Vec<Vec<u8>> = Vec::new();
            let mut shrink: Vec<(Vec<u8>, i64, Vec<u8>)> = Vec::new();
            for r in &rows {
                let key: Vec<u8> = r.get(0);
                let bytes: Vec<u8> = r.get(1);
                // A record that does not decode is never swept (purge it).
                let Ok(record) = Record::decode(&bytes) else {
                    continue;
                };
                match sweep_action(&record, cutoff) {
                    SweepAction::Delete => delete.push(key),
                    SweepAction::Shrink(tombstone) => {
                        let due = i64::try_from(sweep_due(&tombstone).0).unwrap_or(i64::MAX);
                        shrink.push((key, due, tombstone.encode()));
                    }
                    SweepAction::Keep => {}
                }
            }
            if !delete.is_empty() {
                txn.execute(
                    &format!("DELETE FROM {} WHERE record_key = ANY($1)", sql.records),
                    &[&delete],
                )
                .map_err(storage)?;
            }
            if !shrink.is_empty() {
                let keys: Vec<&[u8]> = shrink.iter().map(|s| s.0.as_slice()).collect();
                let dues: Vec<i64> = shrink.iter().map(|s| s.1).collect();
                let values: Vec<&[u8]> = shrink.iter().map(|s| s.2.as_slice()).collect();
                txn.execute(
                    &format!(
                        "UPDATE {} t SET state = 3, due = u.due, holder = NULL, record = u.v
                         FROM unnest($1::bytea[], $2::int8[], $3::bytea[]) AS u(k, due, v)
                         WHERE t.record_key = u.k",
                        sql.records
                    ),
                    &[&keys, &dues, &values],
                )
                .map_err(storage)?;
            }
            txn.commit().map_err(at_commit)?;
            report.deleted += delete.len() as u64;
            report.tombstoned += shrink.len() as u64;
            Ok(((delete.len() + shrink.len()) as u64, found))
        })();
        if result.is_err() {
            rollback(&mut conn);
        }
        result
    }

    /// One batch of due inbox marks; returns (marks deleted, due marks found).
    fn sweep_marks(
        &self,
        cutoff: Timestamp,
        report: &mut SweepReport,
    ) -> Result<(u64, usize), Error> {
        let sql = self.sql();
        let cutoff_ms = i64::try_from(cutoff.0).unwrap_or(i64::MAX);
        let limit = i64::try_from(self.config().sweep_batch).unwrap_or(i64::MAX);
        let mut conn = self.connection()?;
        let result = (|| -> Result<(u64, usize), Error> {
            let mut txn = conn.client.transaction().map_err(storage)?;
            let rows = txn
                .query(
                    &format!(
                        "SELECT mark_key, mark FROM {} WHERE due <= $1 ORDER BY due LIMIT $2 FOR UPDATE SKIP LOCKED",
                        sql.marks
                    ),
                    &[&cutoff_ms, &limit],
                )
                .map_err(storage)?;
            let found = rows.len();
            let delete: Vec<Vec<u8>> = rows
                .iter()
                .filter_map(|r| {
                    let bytes: Vec<u8> = r.get(1);
                    let mark = Mark::decode(&bytes).ok()?;
                    is_mark_forgotten(&mark, cutoff).then(|| r.get::<_, Vec<u8>>(0))
                })
                .collect();
            if !delete.is_empty() {
                txn.execute(
                    &format!("DELETE FROM {} WHERE mark_key = ANY($1)", sql.marks),
                    &[&delete],
                )
                .map_err(storage)?;
            }
            txn.commit().map_err(at_commit)?;
            report.deleted += delete.len() as u64;
            Ok((delete.len() as u64, found))
        })();
        if result.is_err() {
            rollback(&mut conn);
        }
        result
    }

    /// Forgets ordering keys no outbox event or dead letter uses (a bounded batch per pass; the
    /// key's next push creates its row again).
    fn prune_ordering_keys(&self) -> Result<(), Error> {
        let sql = self.sql();
        let limit = i64::try_from(self.config().sweep_batch).unwrap_or(i64::MAX);
        let q = format!(
            "DELETE FROM {keys} WHERE ordering_key IN (
                SELECT k.ordering_key FROM {keys} k
                WHERE NOT EXISTS (SELECT 1 FROM {outbox} o WHERE o.ordering_key = k.ordering_key)
                  AND NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.ordering_key = k.ordering_key)
                LIMIT $1 FOR UPDATE SKIP LOCKED)",
            keys = sql.outbox_keys,
            outbox = sql.outbox,
            dead = sql.outbox_dead
        );
        let mut conn = self.connection()?;
        conn.client.execute(q.as_str(), &[&limit]).map_err(|e| {
            conn.saw(&e);
            storage(e)
        })?;
        Ok(())
    }
}

/// The background sweeper: a thread that runs a pass every interval while the store is open.
pub(crate) struct Sweeper {
    stop: crossbeam_channel::Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Sweeper {
    /// Starts the sweeper of `store`, one pass every `every`.
    pub(crate) fn start(store: &PgStore, every: Duration) -> Result<Sweeper, Error> {
        let weak: Weak<Inner> = std::sync::Arc::downgrade(&store.inner);
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("idem-pg-sweeper".into())
            .spawn(move || {
                while let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(every)
                {
                    let Some(inner) = weak.upgrade() else {
                        return;
                    };
                    // A failed pass (the server unreachable) is tried again next interval.
                    if let Err(e) = (PgStore { inner }).sweep() {
                        observe::warn!(
                            "a background sweep pass failed; the next runs at the next interval",
                            error = observe::display(observe::Redacted(&e)),
                        );
                    }
                }
            })
            .map_err(|source| Error::Spawn {
                what: "idem-pg-sweeper",
                source,
            })?;
        Ok(Sweeper {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (unless it is the caller: the last handle may be
    /// dropped by the sweeper itself).
    pub(crate) fn stop(mut self) {
        drop(self.stop);
        if let Some(t) = self.thread.take()
            && t.thread().id() != std::thread::current().id()
            && t.join().is_err()
        {
            observe::warn!("the background sweeper thread panicked");
        }
    }
}
