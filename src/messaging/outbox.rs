//! The transactional outbox: events pushed from inside a closure's [`Tx`] commit with the
//! closure's writes, or not at all; the dispatcher ([`crate::Store::start_dispatcher`])
//! publishes them afterwards.
//!
//! Storage: `idem.outbox.v1` maps a commit sequence number (assigned inside the write
//! transaction, so sequence order is commit order) to the encoded event; `idem.outbox_dead.v1`
//! holds dead letters under their original sequence number, so a requeued event goes back to
//! its original place in its ordering key's stream.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};
use serde::{Deserialize, Serialize};

use crate::engine::boundary::unlatched;
use crate::engine::commit::{Durable, Step};
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::store::Store;
use crate::engine::tables::{META, META_OUTBOX_SEQ, OUTBOX, OUTBOX_DEAD, open_optional};
use crate::engine::tx::{Origin, OriginKind, Tx};
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::keys::hex;

/// blake3 `derive_key` context of event ids pushed by a transaction that commits an
/// idempotency record (`execute`, a lease's completion). One context per origin kind, so a
/// record key and an inbox mark key with the same bytes never give the same id.
const CTX_EVENT_ID_RECORD: &str = "idem 2026-11-30 outbox event id from an idempotency record v2";
/// blake3 `derive_key` context of event ids pushed by a transaction that commits an inbox mark
/// or webhook receipt (`process`, `receive`).
const CTX_EVENT_ID_MARK: &str = "idem 2026-11-30 outbox event id from an inbox mark v2";
/// blake3 `derive_key` context of event ids derived from a caller-supplied identity.
const CTX_EVENT_ID_CALLER: &str = "idem 2026-11-30 outbox event id from caller identity v1";

/// Version byte in front of every stored event.
const EVENT_FORMAT: u8 = 1;

/// The stable id of an outbox event: the same on every publish of the event (retries,
/// republishes after a crash, requeues). Consumers deduplicate on it, e.g. as the message id of
/// [`Store::process`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId([u8; 32]);

impl EventId {
    /// The raw 32 bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// 64 lowercase hex characters.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl std::fmt::Debug for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EventId({})", self.to_hex())
    }
}

impl std::fmt::Display for EventId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// An event to push into the outbox (a builder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    topic: String,
    ordering_key: Option<String>,
    payload: Vec<u8>,
    headers: Vec<(String, String)>,
    identity: Option<Vec<u8>>,
}

impl Event {
    /// An event for `topic` carrying `payload`, with no ordering key and no headers.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        Event {
            topic: topic.into(),
            ordering_key: None,
            payload: payload.into(),
            headers: Vec::new(),
            identity: None,
        }
    }

    /// Events with the same ordering key are published in commit order, each only after the
    /// one before it was delivered (e.g. the aggregate id). Events without one are unordered.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// Adds a header (passed to the publisher as is).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Derives the event id from `identity` instead of from the pushing transaction: two
    /// pushes with the same identity get the same id (consumers then drop the second). By
    /// default the id is derived from what the transaction commits — the kind of row
    /// (idempotency record or inbox mark), its key, the instant its intent began (the record's
    /// `created_at`, the mark's `processed_at`) — and the push's position in the closure. So
    /// the committed events of one intent keep their ids across a lease takeover and are
    /// recomputable from the stored record, while a new intent that re-uses the key after the
    /// old one was forgotten or purged gets new ids.
    pub fn identity(mut self, identity: impl AsRef<[u8]>) -> Self {
        self.identity = Some(identity.as_ref().to_vec());
        self
    }
}

/// An event as stored and published.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxEvent {
    /// Commit sequence number: commit order across the whole store.
    pub seq: u64,
    /// The stable id (send it along: consumers deduplicate on it).
    pub id: EventId,
    /// The topic given to [`Event::new`].
    pub topic: String,
    /// The ordering key, if any.
    pub ordering_key: Option<String>,
    /// The payload bytes.
    pub payload: Vec<u8>,
    /// The headers, in push order.
    pub headers: Vec<(String, String)>,
    /// When the pushing transaction ran.
    pub created_at: Timestamp,
    /// Publish attempts that failed so far (0 on the first publish).
    pub failed_attempts: u32,
}

/// An event that failed its last allowed attempt. It holds back later events with its
/// ordering key until it is requeued ([`Store::requeue_dead_letter`]) or discarded
/// ([`Store::discard_dead_letter`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The event (its `seq` names the dead letter).
    pub event: OutboxEvent,
    /// The publisher's last error, as text.
    pub error: String,
    /// When the last attempt failed.
    pub failed_at: Timestamp,
}

/// Outbox row counts (see [`Store::outbox_stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Events committed and not yet delivered (including ones waiting for a retry).
    pub pending: u64,
    /// Dead letters.
    pub dead: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    pub id: [u8; 32],
    pub topic: String,
    pub ordering_key: Option<String>,
    pub payload: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub created_at: u64,
    pub attempts: u32,
    pub next_attempt_at: u64,
    pub last_error: Option<String>,
    pub failed_at: u64,
}

impl Stored {
    pub(crate) fn encode(&self) -> Result<Vec<u8>, Error> {
        let mut out = vec![EVENT_FORMAT];
        postcard::to_io(self, &mut out).map_err(|_| Error::Internal {
            what: "an outbox event could not be encoded",
        })?;
        Ok(out)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, Error> {
        match bytes.split_first() {
            Some((&EVENT_FORMAT, rest)) => {
                postcard::from_bytes(rest).map_err(|e| Error::CorruptRecord {
                    reason: format!("outbox event does not decode: {e}"),
                })
            }
            Some((&v, _)) => Err(Error::UnsupportedFormat {
                found: v,
                supported: EVENT_FORMAT,
            }),
            None => Err(Error::CorruptRecord {
                reason: "empty outbox event".into(),
            }),
        }
    }

    pub(crate) fn public(&self, seq: u64) -> OutboxEvent {
        OutboxEvent {
            seq,
            id: EventId(self.id),
            topic: self.topic.clone(),
            ordering_key: self.ordering_key.clone(),
            payload: self.payload.clone(),
            headers: self.headers.clone(),
            created_at: Timestamp(self.created_at),
            failed_attempts: self.attempts,
        }
    }
}

/// The outbox of one transaction; see [`Tx::outbox`].
pub struct Outbox<'a, 't> {
    tx: &'a Tx<'t>,
}

impl<'t> Tx<'t> {
    /// The transactional outbox: events pushed here commit with this transaction's writes, or
    /// not at all. See [`Outbox`].
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
        let id = match &event.identity {
            Some(identity) => event_id_from_identity(identity),
            None => event_id_from_origin(self.tx.origin(), n),
        };
        let seq = next_seq(self.tx)?;
        let stored = Stored {
            id: id.0,
            topic: event.topic,
            ordering_key: event.ordering_key,
            payload: event.payload,
            headers: event.headers,
            created_at: self.tx.now().0,
            attempts: 0,
            next_attempt_at: 0,
            last_error: None,
            failed_at: 0,
        };
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

/// The id of the `n`-th event (0-based) pushed by a transaction committing `origin`:
/// `derive_key(context of its kind, u64be(len key) ‖ key ‖ u64be(generation) ‖ u32be(n))`
/// (docs/FORMAT.md, "Outbox event ids"). The context separates the kinds; the length prefix
/// and the fixed widths make the input unambiguous within a kind.
pub(crate) fn event_id_from_origin(origin: Origin<'_>, n: u32) -> EventId {
    let context = match origin.kind() {
        OriginKind::Record => CTX_EVENT_ID_RECORD,
        OriginKind::Mark => CTX_EVENT_ID_MARK,
    };
    let key = origin.key();
    let mut h = blake3::Hasher::new_derive_key(context);
    h.update(&(key.len() as u64).to_be_bytes());
    h.update(key);
    h.update(&origin.generation().0.to_be_bytes());
    h.update(&n.to_be_bytes());
    EventId(*h.finalize().as_bytes())
}

/// The id of an event pushed with [`Event::identity`].
pub(crate) fn event_id_from_identity(identity: &[u8]) -> EventId {
    EventId(blake3::derive_key(CTX_EVENT_ID_CALLER, identity))
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
) -> Result<Vec<OutboxEvent>, Error> {
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

/// The outbox's state in memory, one per store ([`Store::extension`]): the dispatcher's counters
/// and the one-dispatcher guard.
#[derive(Default)]
pub(crate) struct OutboxShared {
    pub delivered: AtomicU64,
    pub failures: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// True while a dispatcher runs for this store (at most one may). Shared with the
    /// dispatcher thread, which clears it when it ends.
    pub running: std::sync::Arc<AtomicBool>,
}

/// The outbox dispatcher's counters since the store was opened ([`Store::outbox_metrics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OutboxMetrics {
    /// Outbox events published and marked delivered by the dispatcher.
    pub delivered: u64,
    /// Publish attempts that failed (the event was retried later or dead-lettered).
    pub publish_failures: u64,
    /// Events moved to the dead-letter table after their last attempt failed.
    pub dead_lettered: u64,
}

impl Store {
    /// The outbox dispatcher's counters since open: events delivered, publish attempts that
    /// failed, events dead-lettered. In-memory counters only, no I/O. For the rows waiting in
    /// the tables see [`Store::outbox_stats`].
    pub fn outbox_metrics(&self) -> OutboxMetrics {
        let shared = self.extension::<OutboxShared>();
        OutboxMetrics {
            delivered: shared.delivered.load(Ordering::Relaxed),
            publish_failures: shared.failures.load(Ordering::Relaxed),
            dead_lettered: shared.dead_lettered.load(Ordering::Relaxed),
        }
    }

    /// Counts undelivered events and dead letters (redb keeps the counts: no scan).
    pub fn outbox_stats(&self) -> Result<OutboxStats, Error> {
        self.read("counting the outbox", outbox_stats_in)
    }

    /// The first `limit` undelivered events, in commit order.
    pub fn pending_events(&self, limit: usize) -> Result<Vec<OutboxEvent>, Error> {
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
    pub fn pending_events(&self, limit: usize) -> Result<Vec<OutboxEvent>, Error> {
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
    fn requeue_in(&self, txn: &WriteTransaction, seq: u64) -> Result<bool, Error> {
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

/// What to do with an event whose publish attempt number `attempts` (1-based) just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterFailure {
    /// Try again after this delay.
    Retry(Duration),
    /// That was the last allowed attempt: move it to the dead-letter table.
    DeadLetter,
}

/// The retry decision after failed attempt number `attempts` (1-based): dead-letter once
/// `max_attempts` attempts failed, otherwise wait [`backoff`].
pub(crate) fn after_failure(
    attempts: u32,
    max_attempts: u32,
    base: Duration,
    max: Duration,
    random: u64,
) -> AfterFailure {
    if attempts >= max_attempts {
        AfterFailure::DeadLetter
    } else {
        AfterFailure::Retry(backoff(attempts, base, max, random))
    }
}

/// Exponential backoff with "equal jitter": the ceiling is `base · 2^(attempts−1)` capped at
/// `max`; the delay is uniform in `[ceiling/2, ceiling]`, driven by `random`.
pub(crate) fn backoff(attempts: u32, base: Duration, max: Duration, random: u64) -> Duration {
    let shift = attempts.saturating_sub(1).min(63);
    let ceiling = base
        .checked_mul(1u32.checked_shl(shift.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let nanos = ceiling.as_nanos().min(u128::from(u64::MAX)) as u64;
    let half = nanos / 2;
    let spread = nanos - half;
    let jitter = if spread == 0 {
        0
    } else {
        random % (spread + 1)
    };
    Duration::from_nanos(half + jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_within_jitter_bounds_and_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        for random in [0, 1, 12345, u64::MAX] {
            for attempts in 1..40 {
                let ceiling = (base * 2u32.pow((attempts - 1).min(20))).min(max);
                let d = backoff(attempts, base, max, random);
                assert!(d <= ceiling, "{d:?} > {ceiling:?}");
                assert!(d >= ceiling / 2, "{d:?} < half of {ceiling:?}");
            }
        }
        assert_eq!(backoff(1, base, max, 0), Duration::from_millis(50));
        assert_eq!(backoff(3, base, max, 0), Duration::from_millis(200));
        assert_eq!(backoff(u32::MAX, base, max, 0), Duration::from_millis(2500));
    }

    #[test]
    fn jitter_spreads_delays() {
        let base = Duration::from_millis(100);
        let a = backoff(4, base, Duration::from_secs(60), 1);
        let b = backoff(4, base, Duration::from_secs(60), 987_654_321);
        assert_ne!(a, b);
    }

    #[test]
    fn last_attempt_dead_letters() {
        let (b, m) = (Duration::from_millis(1), Duration::from_secs(1));
        assert!(matches!(
            after_failure(1, 3, b, m, 0),
            AfterFailure::Retry(_)
        ));
        assert!(matches!(
            after_failure(2, 3, b, m, 0),
            AfterFailure::Retry(_)
        ));
        assert_eq!(after_failure(3, 3, b, m, 0), AfterFailure::DeadLetter);
        assert_eq!(after_failure(1, 1, b, m, 0), AfterFailure::DeadLetter);
    }

    const T: Timestamp = Timestamp(1_000);

    #[test]
    fn event_ids_are_stable_and_distinct() {
        let rec = |key, at, n| event_id_from_origin(Origin::record(key, Timestamp(at)), n);
        let mark = |key, at, n| event_id_from_origin(Origin::mark(key, Timestamp(at)), n);
        assert_eq!(rec(b"k", 1, 0), rec(b"k", 1, 0));
        assert_ne!(rec(b"k", 1, 0), rec(b"k", 1, 1));
        assert_ne!(rec(b"k", 1, 0), rec(b"j", 1, 0));
        // Another generation of the same key.
        assert_ne!(rec(b"k", 1, 0), rec(b"k", 2, 0));
        // The same bytes as another kind of origin.
        assert_ne!(rec(b"k", 1, 0), mark(b"k", 1, 0));
        assert_ne!(rec(b"k", 1, 0), event_id_from_identity(b"k"));
        assert_ne!(mark(b"k", 1, 0), event_id_from_identity(b"k"));
        // The length prefix: a key that ends where the generation begins.
        assert_ne!(
            rec(b"k\0\0\0\0\0\0\0", 1, 0),
            rec(b"k", 1 << 56, 0),
            "unambiguous"
        );
    }

    /// Event ids are what consumers deduplicate on: a derivation never changes silently
    /// (docs/FORMAT.md, "Outbox event ids"; tests/record_format.rs derives them independently).
    #[test]
    fn event_id_derivation_is_pinned() {
        assert_eq!(
            event_id_from_origin(Origin::record(b"k", T), 0).to_hex(),
            "28539f54a256a50e1300f6cb737b9a036206ec07724aaca71793a321ead8fd16"
        );
        assert_eq!(
            event_id_from_origin(Origin::mark(b"k", T), 0).to_hex(),
            "26d0b900c49c574fab54f074ebd02f35b0d1a490ff0ae859f06854ddc9f114b7"
        );
        assert_eq!(
            event_id_from_identity(b"k").to_hex(),
            "5572147b49e8d2f394dcd18e1fd6ff9882ff9df60b73d76150efc0e6a0389e6c"
        );
    }

    #[test]
    fn stored_events_round_trip() {
        let s = Stored {
            id: [7; 32],
            topic: "t".into(),
            ordering_key: Some("k".into()),
            payload: vec![1, 2, 3],
            headers: vec![("h".into(), "v".into())],
            created_at: 5,
            attempts: 2,
            next_attempt_at: 9,
            last_error: Some("e".into()),
            failed_at: 8,
        };
        let bytes = s.encode().unwrap();
        let back = Stored::decode(&bytes).unwrap();
        assert_eq!(back.public(3), s.public(3));
        assert!(Stored::decode(&[]).is_err());
        assert!(Stored::decode(&[9, 1]).is_err());
    }
}
