//! The outbox dispatcher on PostgreSQL: every process of a fleet may run one at once.
//!
//! A round is one transaction on one connection: it locks the publishable head events —
//! due, and with no earlier undelivered event of their ordering key and no dead letter of
//! it — with `FOR UPDATE SKIP LOCKED` (another node's round skips what this one holds, and can
//! never pick the event behind a locked head: the head is still there in its view), publishes
//! them in commit order (`runtime/publish.rs`), then deletes the delivered rows, records the
//! failures (or moves them to the dead letters) and commits. The crash argument is the file
//! store's: a row is deleted only by a transaction that starts after its publish returned Ok, so
//! a crash (or a lost connection: the server rolls the round back and releases its locks)
//! republishes it with the same id, never loses it, never publishes a later event of its key
//! before it.

use std::sync::Weak;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::{AfterFailure, DispatcherOptions, Publisher, Stored};
use crate::postgres::commit::rollback;
use crate::postgres::conn::{NOW_MS, at_commit, storage};
use crate::postgres::store::{Inner, PgStore};
use crate::runtime::observe::Every;
use crate::runtime::publish::{DispatchCounters, Jitter, Round, dispatch_loop, publish_in_order};
use crate::runtime::worker::{DispatcherHandle, spawn_dispatcher};

impl PgStore {
    /// Starts this process's outbox dispatcher: a background thread that publishes committed
    /// outbox events through `publisher`, in commit order per ordering key, at least once each.
    /// Several processes sharing the database may each run one: they share the work, and the
    /// per-key order holds across them. It is woken at once by this store's commits that pushed
    /// events, and finds other processes' events at least every
    /// [`DispatcherOptions::idle_recheck`]. Failures retry with backoff and jitter; after
    /// `max_attempts` an event becomes a dead letter ([`PgStore::dead_letters`]) that holds back
    /// its key until requeued or discarded.
    ///
    /// One dispatcher per store handle at a time ([`Error::InUse`] otherwise). A publish runs
    /// while the round's transaction holds its rows: give the publisher's calls a timeout.
    pub fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        options.validate()?;
        let counters = self.extension::<DispatchCounters>();
        let signal = self.work_signal();
        let weak = std::sync::Arc::downgrade(&self.inner);
        let mut jitter = Jitter::seeded()?;
        let thread_signal = signal.clone();
        spawn_dispatcher(&counters, signal, move |stop| {
            let mut d = Dispatcher {
                weak,
                publisher,
                options,
            };
            let idle = d.options.idle_recheck;
            let mut gauges = Every::new(OUTBOX_GAUGES_EVERY);
            dispatch_loop(&stop, &thread_signal, idle, || {
                let store = PgStore {
                    inner: d.weak.upgrade()?,
                };
                let round = d.round(&store, &mut jitter, &stop);
                if gauges.due() {
                    // `outbox_stats` sets the outbox gauges (feature `metrics`); a failure
                    // leaves them as they were.
                    let _ = store.outbox_stats();
                }
                Some((round, store.now()))
            });
        })
    }
}

/// How often the dispatcher refreshes the outbox gauges (feature `metrics`): each refresh counts
/// the outbox's rows on the server, so not every round.
const OUTBOX_GAUGES_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

struct Dispatcher<P> {
    weak: Weak<Inner>,
    publisher: P,
    options: DispatcherOptions,
}

impl<P: Publisher> Dispatcher<P> {
    fn round(
        &mut self,
        store: &PgStore,
        jitter: &mut Jitter,
        stop: &AtomicBool,
    ) -> Result<Round, Error> {
        let sql = store.sql();
        let mut conn = store.connection()?;
        let result = (|| -> Result<Round, Error> {
            let begin = conn
                .client
                .simple_query(&format!("BEGIN; SELECT {NOW_MS}"))
                .map_err(storage)?;
            let server_now = begin
                .iter()
                .find_map(|m| match m {
                    postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse::<i64>().ok(),
                    _ => None,
                })
                .ok_or(Error::Internal {
                    what: "the PostgreSQL server did not answer its time",
                })?;
            let now = store.batch_time(server_now);
            let now_ms = i64::try_from(now.0).unwrap_or(i64::MAX);
            let limit = i64::try_from(self.options.batch).unwrap_or(i64::MAX);
            let heads = format!(
                "SELECT o.seq, o.event FROM {outbox} o
                 WHERE o.next_attempt_at <= $1
                   AND NOT EXISTS (SELECT 1 FROM {outbox} p WHERE p.ordering_key = o.ordering_key AND p.seq < o.seq)
                   AND NOT EXISTS (SELECT 1 FROM {dead} d WHERE d.ordering_key = o.ordering_key)
                 ORDER BY o.seq LIMIT $2 FOR UPDATE OF o SKIP LOCKED",
                outbox = sql.outbox,
                dead = sql.outbox_dead
            );
            let statement = conn.prepared(&heads).map_err(storage)?;
            let found = conn
                .client
                .query(&statement, &[&now_ms, &limit])
                .map_err(storage)?;
            let more = found.len() as u64 >= self.options.batch as u64;
            let mut rows = Vec::with_capacity(found.len());
            for r in &found {
                let seq = u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
                let bytes: Vec<u8> = r.get(1);
                // A row that does not decode is left in place (inspect it with pending_events).
                if let Ok(stored) = Stored::decode(&bytes) {
                    rows.push((seq, stored));
                }
            }
            let stopping = || stop.load(Ordering::Acquire);
            let by_seq: std::collections::HashMap<u64, Stored> =
                rows.iter().map(|(s, e)| (*s, e.clone())).collect();
            let published = publish_in_order(
                &mut self.publisher,
                rows,
                Default::default(),
                &self.options,
                jitter,
                stopping,
            );
            if published.is_empty() {
                let next: Option<i64> = conn
                    .client
                    .query_one(
                        &format!(
                            "SELECT min(next_attempt_at) FROM {} WHERE next_attempt_at > $1",
                            sql.outbox
                        ),
                        &[&now_ms],
                    )
                    .map_err(storage)?
                    .get(0);
                rollback(&mut conn);
                return Ok(Round {
                    more: false,
                    next_due: next.map(|n| Timestamp(u64::try_from(n).unwrap_or(0))),
                });
            }
            let delivered: Vec<i64> = published
                .delivered
                .iter()
                .map(|s| i64::try_from(*s).unwrap_or(i64::MAX))
                .collect();
            if !delivered.is_empty() {
                conn.client
                    .execute(
                        &format!("DELETE FROM {} WHERE seq = ANY($1)", sql.outbox),
                        &[&delivered],
                    )
                    .map_err(storage)?;
            }
            for f in &published.failed {
                let Some(mut stored) = by_seq.get(&f.seq).cloned() else {
                    continue;
                };
                stored.attempts = stored.attempts.saturating_add(1);
                stored.last_error = Some(f.error.clone());
                stored.failed_at = now.0;
                let seq = i64::try_from(f.seq).unwrap_or(i64::MAX);
                match f.action {
                    AfterFailure::Retry(delay) => {
                        stored.next_attempt_at = now.saturating_add(delay).0;
                        let next = i64::try_from(stored.next_attempt_at).unwrap_or(i64::MAX);
                        conn.client
                            .execute(
                                &format!(
                                    "UPDATE {} SET next_attempt_at = $2, event = $3 WHERE seq = $1",
                                    sql.outbox
                                ),
                                &[&seq, &next, &stored.encode()?],
                            )
                            .map_err(storage)?;
                    }
                    AfterFailure::DeadLetter => {
                        conn.client
                            .execute(
                                &format!(
                                    "WITH moved AS (DELETE FROM {} WHERE seq = $1 RETURNING seq, ordering_key)
                                     INSERT INTO {} (seq, ordering_key, event) SELECT seq, ordering_key, $2 FROM moved",
                                    sql.outbox, sql.outbox_dead
                                ),
                                &[&seq, &stored.encode()?],
                            )
                            .map_err(storage)?;
                    }
                }
            }
            conn.client.batch_execute("COMMIT").map_err(at_commit)?;
            store.extension::<DispatchCounters>().add(&published);
            Ok(Round {
                more: more || !published.delivered.is_empty(),
                next_due: published.next_due(now, None),
            })
        })();
        if result.is_err() {
            // Whatever failed, the round's transaction ends here; a broken connection is dropped.
            rollback(&mut conn);
        }
        result
    }
}
