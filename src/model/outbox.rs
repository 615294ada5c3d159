//! The outbox's values and rules, apart from any storage: an [`Event`] to push, its stable
//! [`EventId`] (derived from what the pushing transaction commits, its [`Origin`], or from a
//! caller identity), the stored layout of an event ([`Stored`], docs/FORMAT.md), what a
//! dispatcher does after a failed publish ([`after_failure`], [`backoff`]), and the
//! [`Publisher`] contract with its [`DispatcherOptions`]. Every engine stores these bytes and
//! applies these rules.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{BoxError, Error};
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
/// `Store::process`.
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
pub struct StoredEvent {
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
/// ordering key until it is requeued (`Store::requeue_dead_letter`) or discarded
/// (`Store::discard_dead_letter`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The event (its `seq` names the dead letter).
    pub event: StoredEvent,
    /// The publisher's last error, as text.
    pub error: String,
    /// When the last attempt failed.
    pub failed_at: Timestamp,
}

/// Outbox row counts (see `Store::outbox_stats`).
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

    pub(crate) fn public(&self, seq: u64) -> StoredEvent {
        StoredEvent {
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

impl Event {
    /// The caller identity the id is derived from, if any ([`Event::identity`]).
    pub(crate) fn identity_bytes(&self) -> Option<&[u8]> {
        self.identity.as_deref()
    }

    /// The row a push of this event stores: its id, what the caller gave, `created_at` (the
    /// pushing transaction's time), no attempt yet.
    pub(crate) fn into_stored(self, id: EventId, created_at: Timestamp) -> Stored {
        Stored {
            id: id.0,
            topic: self.topic,
            ordering_key: self.ordering_key,
            payload: self.payload,
            headers: self.headers,
            created_at: created_at.0,
            attempts: 0,
            next_attempt_at: 0,
            last_error: None,
            failed_at: 0,
        }
    }

    /// The ordering key, if any.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn ordering_key_str(&self) -> Option<&str> {
        self.ordering_key.as_deref()
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

/// The outbox dispatcher's counters since the store was opened (`Store::outbox_metrics`).
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

/// What a transaction commits, as the root of the ids of the events it pushes: the kind of
/// row, its key, and the instant that names this generation of the row. The generation is
/// fixed for the life of one intent (a record's `created_at`, kept by takeovers and by
/// finishing; a mark's `processed_at`) and differs for a new intent that re-uses a key after the
/// old one was forgotten or purged, so a consumer that still remembers the old intent's event
/// ids does not drop the new intent's events.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    kind: OriginKind,
    key: &'a [u8],
    generation: Timestamp,
}

/// The kind of row a transaction commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OriginKind {
    /// An idempotency record (`execute`, `Lease::complete_with`).
    Record,
    /// An inbox mark or a webhook receipt (`process`, `receive`).
    Mark,
}

impl<'a> Origin<'a> {
    /// The record under `key`, of the intent created at `created_at`.
    pub(crate) fn record(key: &'a [u8], created_at: Timestamp) -> Self {
        Origin {
            kind: OriginKind::Record,
            key,
            generation: created_at,
        }
    }

    /// The mark (inbox mark or webhook receipt) under `key`, processed at `processed_at`.
    pub(crate) fn mark(key: &'a [u8], processed_at: Timestamp) -> Self {
        Origin {
            kind: OriginKind::Mark,
            key,
            generation: processed_at,
        }
    }

    pub(crate) fn kind(&self) -> OriginKind {
        self.kind
    }

    pub(crate) fn key(&self) -> &'a [u8] {
        self.key
    }

    pub(crate) fn generation(&self) -> Timestamp {
        self.generation
    }
}

/// Publishes outbox events to a broker (Kafka, NATS, an HTTP endpoint…). Return `Ok` only once
/// the broker has accepted the event: the event is then marked delivered and never published
/// again (unless the process dies before the mark is committed, in which case it is published
/// again with the same [`EventId`]). An `Err` (or a panic) counts as a failed attempt.
///
/// A closure `FnMut(&StoredEvent) -> Result<(), BoxError>` is a publisher.
pub trait Publisher: Send + 'static {
    /// Publishes one event.
    fn publish(&mut self, event: &StoredEvent) -> Result<(), BoxError>;
}

impl<F> Publisher for F
where
    F: FnMut(&StoredEvent) -> Result<(), BoxError> + Send + 'static,
{
    fn publish(&mut self, event: &StoredEvent) -> Result<(), BoxError> {
        self(event)
    }
}

/// Dispatcher settings (a builder). Defaults: 10 attempts, backoff from 100 ms doubling up to
/// 60 s with jitter, 256 events per round, an idle re-check every second.
#[derive(Debug, Clone)]
pub struct DispatcherOptions {
    pub(crate) max_attempts: u32,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_max: Duration,
    pub(crate) batch: usize,
    pub(crate) idle_recheck: Duration,
}

impl Default for DispatcherOptions {
    fn default() -> Self {
        DispatcherOptions {
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(60),
            batch: 256,
            idle_recheck: Duration::from_secs(1),
        }
    }
}

impl DispatcherOptions {
    /// The defaults above.
    pub fn new() -> Self {
        Self::default()
    }

    /// Failed attempts after which an event moves to the dead-letter table (at least 1).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The first retry waits about `base` (half to all of it); each further one doubles, up to
    /// `max`.
    pub fn backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// Events read and published per round; their delivery marks share one write
    /// transaction (so a crash republishes at most this many delivered events).
    pub fn batch(mut self, events: usize) -> Self {
        self.batch = events;
        self
    }

    /// How often an idle dispatcher looks at the table without being woken (catches commits
    /// of other processes sharing the file, and clock jumps). Commits of this store wake it
    /// at once.
    pub fn idle_recheck(mut self, every: Duration) -> Self {
        self.idle_recheck = every;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |reason: &str| {
            Err(Error::Config {
                reason: reason.into(),
            })
        };
        if self.max_attempts == 0 {
            return bad("dispatcher max_attempts is 0; allow at least one attempt (default 10)");
        }
        if self.batch == 0 {
            return bad(
                "dispatcher batch is 0; publish at least one event per round (default 256)",
            );
        }
        if self.idle_recheck.is_zero() {
            return bad("dispatcher idle_recheck is zero; give it a period (default 1 s)");
        }
        if self.backoff_base.is_zero() || self.backoff_max < self.backoff_base {
            return bad(
                "dispatcher backoff needs 0 < base ≤ max (default 100 ms doubling up to 60 s)",
            );
        }
        Ok(())
    }
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
    /// (docs/FORMAT.md, "Outbox event ids"; tests/format/record_format.rs derives them independently).
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
