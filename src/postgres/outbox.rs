//! The transactional outbox and version high-water marks on PostgreSQL.
//!
//! A push inserts the model's event row into `outbox_v1` in the closure's transaction; an event
//! with an ordering key first takes that key's row lock in `outbox_keys_v1` (an upsert), so the
//! pushes of one key take their sequence numbers in the order their transactions commit, and
//! `seq` order within a key is commit order, across every process of the fleet.

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::marks::HighWaterMark;
use crate::model::outbox::{
    DeadLetter, Event, EventId, OutboxMetrics, OutboxStats, Stored, StoredEvent,
    event_id_from_identity, event_id_from_origin,
};
use crate::model::rules::VersionCheck;
use crate::model::rules::versions::advance;
use crate::postgres::conn::storage;
use crate::postgres::store::PgStore;
use crate::postgres::tx::PgTx;
use crate::runtime::observe;
use crate::runtime::publish::DispatchCounters;

/// The outbox of one PostgreSQL transaction; see [`PgTx::outbox`].
pub struct PgOutbox<'a, 't> {
    tx: &'a mut PgTx<'t>,
}

/// The version high-water marks of one PostgreSQL transaction; see [`PgTx::versions`].
pub struct PgVersions<'a, 't> {
    tx: &'a mut PgTx<'t>,
}

impl<'t> PgTx<'t> {
    /// The transactional outbox: events pushed here commit with this transaction's writes, or
    /// not at all.
    pub fn outbox(&mut self) -> PgOutbox<'_, 't> {
        PgOutbox { tx: self }
    }

    /// Per-entity version high-water marks, updated in this transaction.
    pub fn versions(&mut self) -> PgVersions<'_, 't> {
        PgVersions { tx: self }
    }
}

impl PgOutbox<'_, '_> {
    /// Appends `event`; it commits with this transaction's other writes or not at all, and this
    /// store's dispatcher is woken as soon as the transaction commits (other processes'
    /// dispatchers find it at their next look). Returns its stable id, derived exactly as the
    /// file store derives it.
    pub fn push(&mut self, event: Event) -> Result<EventId, Error> {
        let n = self.tx.announce();
        let id = match event.identity_bytes() {
            Some(identity) => event_id_from_identity(identity),
            None => event_id_from_origin(self.tx.origin(), n),
        };
        let ordering_key = event.ordering_key_str().map(str::to_owned);
        let bytes = event.into_stored(id, self.tx.now()).encode()?;
        let sql = self.tx.sql().clone();
        self.tx.own(|conn| {
            match &ordering_key {
                Some(key) => {
                    let q = format!(
                        "WITH k AS (INSERT INTO {keys} (ordering_key, pushes) VALUES ($1, 1) \
                         ON CONFLICT (ordering_key) DO UPDATE SET pushes = {keys}.pushes + 1 RETURNING 1) \
                         INSERT INTO {outbox} (ordering_key, next_attempt_at, event) SELECT $1, 0, $2 FROM k",
                        keys = sql.outbox_keys,
                        outbox = sql.outbox
                    );
                    let s = conn.prepared(&q)?;
                    conn.client.execute(&s, &[key, &bytes])?;
                }
                None => {
                    let q = format!(
                        "INSERT INTO {} (ordering_key, next_attempt_at, event) VALUES (NULL, 0, $1)",
                        sql.outbox
                    );
                    let s = conn.prepared(&q)?;
                    conn.client.execute(&s, &[&bytes])?;
                }
            }
            Ok(())
        })?;
        Ok(id)
    }
}

impl PgVersions<'_, '_> {
    /// Checks `version` against `entity`'s high-water mark in this transaction (the row
    /// locked): a newer version moves the mark and answers [`VersionCheck::Apply`]; an older or
    /// equal one answers [`VersionCheck::Stale`] and counts the skip. Both commit with the
    /// closure's other writes, or not at all.
    pub fn advance(
        &mut self,
        entity: impl AsRef<[u8]>,
        version: u64,
    ) -> Result<VersionCheck, Error> {
        let entity = entity.as_ref();
        let table = self.tx.sql().versions.clone();
        let select = format!("SELECT mark FROM {table} WHERE entity = $1 FOR UPDATE");
        let insert = format!(
            "INSERT INTO {table} (entity, mark) VALUES ($1, $2) ON CONFLICT (entity) DO NOTHING"
        );
        let update = format!("UPDATE {table} SET mark = $2 WHERE entity = $1");
        loop {
            let stored: Option<Vec<u8>> = self.tx.own(|conn| {
                let s = conn.prepared(&select)?;
                Ok(conn.client.query_opt(&s, &[&entity])?.map(|r| r.get(0)))
            })?;
            let stored = stored.map(|b| HighWaterMark::decode(&b)).transpose()?;
            let existed = stored.is_some();
            let (check, next) = advance(stored, version);
            let bytes = next.encode().to_vec();
            let written = self.tx.own(|conn| {
                let s = conn.prepared(if existed { &update } else { &insert })?;
                conn.client.execute(&s, &[&entity, &bytes])
            })?;
            // An insert that found the row (another transaction created it meanwhile): lock it
            // and decide again from what it holds.
            if written == 1 {
                return Ok(check);
            }
        }
    }
}

impl PgStore {
    /// This process's dispatcher counters since open (events delivered, failed attempts, events
    /// dead-lettered). In-memory counters, no I/O.
    pub fn outbox_metrics(&self) -> OutboxMetrics {
        self.extension::<DispatchCounters>().metrics()
    }

    /// Counts undelivered events and dead letters (of the whole fleet).
    pub fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        let sql = self.sql();
        let q = format!(
            "SELECT (SELECT count(*) FROM {}), (SELECT count(*) FROM {})",
            sql.outbox, sql.outbox_dead
        );
        let mut conn = self.connection()?;
        let row = conn.client.query_one(q.as_str(), &[]).map_err(storage)?;
        let stats = OutboxStats {
            pending: u64::try_from(row.get::<_, i64>(0)).unwrap_or(0),
            dead: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
        };
        observe::outbox(&stats);
        Ok(stats)
    }

    /// The first `limit` undelivered events, in commit order.
    pub fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        let q = format!(
            "SELECT seq, event FROM {} ORDER BY seq LIMIT $1",
            self.sql().outbox
        );
        self.events(&q, limit)?
            .into_iter()
            .map(|(seq, stored)| Ok(stored.public(seq)))
            .collect()
    }

    /// The first `limit` dead letters, oldest event first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        let q = format!(
            "SELECT seq, event FROM {} ORDER BY seq LIMIT $1",
            self.sql().outbox_dead
        );
        Ok(self
            .events(&q, limit)?
            .into_iter()
            .map(|(seq, stored)| dead_letter(seq, &stored))
            .collect())
    }

    fn events(&self, q: &str, limit: usize) -> Result<Vec<(u64, Stored)>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut conn = self.connection()?;
        let rows = conn.client.query(q, &[&limit]).map_err(storage)?;
        rows.iter()
            .map(|r| {
                let seq = u64::try_from(r.get::<_, i64>(0)).unwrap_or(0);
                let bytes: Vec<u8> = r.get(1);
                Ok((seq, Stored::decode(&bytes)?))
            })
            .collect()
    }

    /// Moves the dead letter `seq` back into the outbox at its original place in commit order,
    /// with its attempts reset, and wakes this store's dispatcher. Returns whether it existed.
    pub fn requeue_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        let sql = self.sql().clone();
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        let mut conn = self.connection()?;
        let moved = (|| -> Result<bool, Error> {
            let mut txn = conn.client.transaction().map_err(storage)?;
            let row = txn
                .query_opt(
                    &format!(
                        "DELETE FROM {} WHERE seq = $1 RETURNING ordering_key, event",
                        sql.outbox_dead
                    ),
                    &[&seq],
                )
                .map_err(storage)?;
            let Some(row) = row else {
                return Ok(false);
            };
            let key: Option<String> = row.get(0);
            let bytes: Vec<u8> = row.get(1);
            let mut stored = Stored::decode(&bytes)?;
            stored.attempts = 0;
            stored.next_attempt_at = 0;
            txn.execute(
                &format!(
                    "INSERT INTO {} (seq, ordering_key, next_attempt_at, event) VALUES ($1, $2, 0, $3)",
                    sql.outbox
                ),
                &[&seq, &key, &stored.encode()?],
            )
            .map_err(storage)?;
            txn.commit().map_err(crate::postgres::conn::at_commit)?;
            Ok(true)
        })();
        if moved.is_err() {
            conn.retire();
        }
        let moved = moved?;
        if moved {
            self.announce_work();
        }
        Ok(moved)
    }

    /// Deletes the dead letter `seq` for good (later events of its key are no longer held
    /// back). Returns whether it existed.
    pub fn discard_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        let seq = i64::try_from(seq).unwrap_or(i64::MAX);
        let q = format!("DELETE FROM {} WHERE seq = $1", self.sql().outbox_dead);
        let mut conn = self.connection()?;
        let removed = conn.client.execute(q.as_str(), &[&seq]).map_err(|e| {
            conn.saw(&e);
            storage(e)
        })? > 0;
        if removed {
            self.announce_work();
        }
        Ok(removed)
    }

    /// `entity`'s version high-water mark, if any event was applied for it.
    pub fn high_water_mark(
        &self,
        entity: impl AsRef<[u8]>,
    ) -> Result<Option<HighWaterMark>, Error> {
        let q = format!(
            "SELECT {}, (SELECT mark FROM {} WHERE entity = $1)",
            crate::postgres::conn::NOW_MS,
            self.sql().versions
        );
        let (_, bytes) = self.read_row(&q, entity.as_ref())?;
        bytes.map(|b| HighWaterMark::decode(&b)).transpose()
    }
}

/// A dead letter from its stored row.
pub(crate) fn dead_letter(seq: u64, stored: &Stored) -> DeadLetter {
    DeadLetter {
        event: stored.public(seq),
        error: stored.last_error.clone().unwrap_or_default(),
        failed_at: Timestamp(stored.failed_at),
    }
}
