//! The transactional outbox: events pushed from inside a closure's [`Tx`] commit with the
//! closure's writes, or not at all; the dispatcher ([`crate::Store::start_dispatcher`])
//! publishes them afterwards.
//!
//! Storage: `idem.outbox.v1` maps a commit sequence number (assigned inside the write
//! transaction, so sequence order is commit order) to the encoded event; `idem.outbox_dead.v1`
//! holds dead letters under their original sequence number, so a requeued event goes back to
//! its original place in its ordering key's stream.

use redb::{ReadableTable, ReadableTableMetadata};

use crate::engine::boundary::unlatched;
use crate::engine::commit::{Durable, Step};
use crate::engine::journal::Wtx;
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::store::Store;
use crate::engine::tables::{META, META_OUTBOX_SEQ, OUTBOX, OUTBOX_DEAD, open_optional};
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::{
    DeadLetter, Event, EventId, OutboxMetrics, OutboxStats, Stored, StoredEvent,
    event_id_from_identity, event_id_from_origin,
};
use crate::runtime::observe;
use crate::runtime::publish::DispatchCounters;

/// The outbox of one transaction; see [`Tx::outbox`].
pub struct Outbox<'a, 't> {
    tx: &'a Tx<'t>,
}

impl<'t> Tx<'t> {
    /// The transactional outbox: events pushed here commit with this transaction's writes, or
    /// not at all. See [`Outbox`].
    ///
    /// # Example
    ///
    /// The `order.created` event commits with the order; a closure that aborts leaves neither.
    /// [`Store::start_dispatcher`] publishes what committed.
    ///
    /// ```
    /// use idem::outbox::Event;
    /// use idem::redb::TableDefinition;
    /// use idem::{Abort, Request, Response, Scope, Store};
    ///
    /// const ORDERS: TableDefinition<&str, u32> = TableDefinition::new("orders");
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let order = |key: &str, in_stock: bool| {
    ///     let request = Request::new(Scope::new("tenant-42", "create_order"), key, &2u32)?;
    ///     store.execute(request, |tx| {
    ///         tx.open_table(ORDERS)?.insert(key, 2)?;
    ///         tx.outbox().push(
    ///             Event::new("order.created", format!(r#"{{"id":"{key}"}}"#))
    ///                 .ordering_key(key) // this order's events are published in order
    ///                 .header("content-type", "application/json"),
    ///         )?;
    ///         if !in_stock {
    ///             return Err(Abort::retryable("out of stock")); // the row and the event roll back
    ///         }
    ///         Ok(Response::new(201, key))
    ///     })
    /// };
    ///
    /// assert!(order("order-1", false).is_err());
    /// assert_eq!(store.outbox_stats()?.pending, 0);
    /// order("order-2", true)?;
    /// order("order-2", true)?; // a replay pushes nothing
    /// let pending = store.pending_events(10)?;
    /// assert_eq!(pending.len(), 1);
    /// assert_eq!(pending[0].topic, "order.created");
    /// assert_eq!(pending[0].payload, br#"{"id":"order-2"}"#);
    /// # Ok(())
    /// # }
    /// ```
    pub fn outbox(&self) -> Outbox<'_, 't> {
        Outbox { tx: self }
    }
}

impl<'a, 't> Outbox<'a, 't> {
    /// Appends `event`; it commits with this transaction's other writes or not at all, and
    /// the dispatcher is woken as soon as the transaction commits. Returns its stable id.
    pub fn push(&self, event: Event) -> Result<EventId, Error> {
        // Each push is work announced to the dispatcher, numbered within this closure's run.
        let n = self.tx.announce();
        let id = match event.identity_bytes() {
            Some(identity) => event_id_from_identity(identity),
            None => event_id_from_origin(self.tx.origin(), n),
        };
        let seq = next_seq(self.tx)?;
        let stored = event.into_stored(id, self.tx.now());
        let mut outbox = self
            .tx
            .raw()
            .open_table(OUTBOX)
            .map_err(|e| self.tx.storage(e))?;
        outbox
            .insert(seq, stored.encode()?.as_slice())
            .map_err(|e| self.tx.storage(e))?;
        Ok(id)
    }
}

/// Takes the next sequence number from the store's metadata, in `tx`'s transaction.
fn next_seq(tx: &Tx<'_>) -> Result<u64, Error> {
    let mut meta = tx.raw().open_table(META).map_err(|e| tx.storage(e))?;
    let current = match meta.get(META_OUTBOX_SEQ).map_err(|e| tx.storage(e))? {
        Some(v) => match <[u8; 8]>::try_from(v.value()) {
            Ok(b) => u64::from_be_bytes(b),
            Err(_) => {
                return Err(Error::CorruptStore {
                    reason: "the outbox sequence number is not 8 bytes".into(),
                });
            }
        },
        None => 0,
    };
    meta.insert(
        META_OUTBOX_SEQ,
        current.saturating_add(1).to_be_bytes().as_slice(),
    )
    .map_err(|e| tx.storage(e))?;
    Ok(current)
}

/// Undelivered events and dead letters in `read` (redb keeps the counts: no scan). Shared by
/// [`Store`] and the read-only store, each behind the storage boundary.
pub(crate) fn outbox_stats_in(read: &redb::ReadTransaction) -> Result<OutboxStats, Error> {
    let count = |def| -> Result<u64, Error> {
        match open_optional(read, def).map_err(unlatched)? {
            Some(t) => t.len().map_err(unlatched),
            None => Ok(0),
        }
    };
    Ok(OutboxStats {
        pending: count(OUTBOX)?,
        dead: count(OUTBOX_DEAD)?,
    })
}

/// The first `limit` undelivered events in `read`, in commit order.
pub(crate) fn pending_events_in(
    read: &redb::ReadTransaction,
    limit: usize,
) -> Result<Vec<StoredEvent>, Error> {
    let Some(table) = open_optional(read, OUTBOX).map_err(unlatched)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for row in table.iter().map_err(unlatched)?.take(limit) {
        let (seq, v) = row.map_err(unlatched)?;
        out.push(Stored::decode(v.value())?.public(seq.value()));
    }
    Ok(out)
}

/// The first `limit` dead letters in `read`, oldest event first.
pub(crate) fn dead_letters_in(
    read: &redb::ReadTransaction,
    limit: usize,
) -> Result<Vec<DeadLetter>, Error> {
    let Some(table) = open_optional(read, OUTBOX_DEAD).map_err(unlatched)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for row in table.iter().map_err(unlatched)?.take(limit) {
        let (seq, v) = row.map_err(unlatched)?;
        let stored = Stored::decode(v.value())?;
        out.push(DeadLetter {
            event: stored.public(seq.value()),
            error: stored.last_error.clone().unwrap_or_default(),
            failed_at: Timestamp(stored.failed_at),
        });
    }
    Ok(out)
}

impl Store {
    /// The outbox dispatcher's counters since open: events delivered, publish attempts that
    /// failed, events dead-lettered. In-memory counters only, no I/O. For the rows waiting in
    /// the tables see [`Store::outbox_stats`].
    pub fn outbox_metrics(&self) -> OutboxMetrics {
        self.extension::<DispatchCounters>().metrics()
    }

    /// Counts undelivered events and dead letters (redb keeps the counts: no scan).
    pub fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.read("counting the outbox", outbox_stats_in)
            .inspect(observe::outbox)
    }

    /// The first `limit` undelivered events, in commit order.
    pub fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        self.read("reading the outbox", |read| pending_events_in(read, limit))
    }

    /// The first `limit` dead letters, oldest event first.
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        self.read("reading the dead letters", |read| {
            dead_letters_in(read, limit)
        })
    }

    /// Moves the dead letter `seq` back into the outbox at its original place in commit order,
    /// with its attempts reset, and wakes the dispatcher. Returns whether it existed.
    pub fn requeue_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        let moved = self.write(Durable::AsConfigured, |txn, _| {
            match self.requeue_in(txn, seq) {
                Ok(true) => Step::Done(true),
                Ok(false) => Step::Clean(false),
                Err(e) => Step::Abort(e),
            }
        })?;
        if moved {
            self.announce_work();
        }
        Ok(moved)
    }

    /// Deletes the dead letter `seq` for good (it is never published; later events with its
    /// ordering key are no longer held back). Returns whether it existed.
    pub fn discard_dead_letter(&self, seq: u64) -> Result<bool, Error> {
        let removed = self.write(Durable::AsConfigured, |txn, _| {
            let removed = txn
                .open_table(OUTBOX_DEAD)
                .and_then(|mut t| Ok(t.remove(seq)?.is_some()));
            match removed {
                Ok(true) => Step::Done(true),
                Ok(false) => Step::Clean(false),
                Err(e) => Step::Abort(self.storage(e)),
            }
        })?;
        if removed {
            self.announce_work();
        }
        Ok(removed)
    }
}

impl ReadOnlyStore {
    /// Undelivered outbox events and dead letters (like [`Store::outbox_stats`]).
    pub fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.read("counting the outbox", outbox_stats_in)
    }

    /// The first `limit` undelivered events, in commit order (like [`Store::pending_events`]).
    pub fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error> {
        self.read("reading the outbox", |read| pending_events_in(read, limit))
    }

    /// The first `limit` dead letters, oldest event first (like [`Store::dead_letters`]).
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error> {
        self.read("reading the dead letters", |read| {
            dead_letters_in(read, limit)
        })
    }
}

impl Store {
    /// Moves the dead letter `seq` back into the outbox, inside `txn`.
    fn requeue_in(&self, txn: &Wtx<'_>, seq: u64) -> Result<bool, Error> {
        let mut dead = txn.open_table(OUTBOX_DEAD).map_err(|e| self.storage(e))?;
        let removed = dead.remove(seq).map_err(|e| self.storage(e))?;
        let Some(bytes) = removed.map(|v| v.value().to_vec()) else {
            return Ok(false);
        };
        let mut stored = Stored::decode(&bytes)?;
        stored.attempts = 0;
        stored.next_attempt_at = 0;
        let mut outbox = txn.open_table(OUTBOX).map_err(|e| self.storage(e))?;
        outbox
            .insert(seq, stored.encode()?.as_slice())
            .map_err(|e| self.storage(e))?;
        Ok(true)
    }
}
