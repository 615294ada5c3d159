//! The inbox (processed-message marks) and webhook receipts.
//!
//! A mark is a row of `idem.inbox.v2` keyed by (namespace, subscriber or source, message or
//! delivery id), written in the same write transaction as the consumer's own writes. Each mark
//! has an entry of kind [`KIND_INBOX`] in the expiry index at its `forget_at`, so
//! [`Store::sweep`] removes it after the inbox retention like any expired record.

use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use crate::engine::commit::Step;
use crate::engine::expiry::{ExpiryTable, entry_key};
use crate::engine::store::{Store, contained};
use crate::engine::tables::{EXPIRY, INBOX};
use crate::engine::tx::Tx;
use crate::error::{Abort, Error, Field};
use crate::messaging::outbox::{Origin, open_optional};
use crate::model::clock::Timestamp;
use crate::model::marks::Mark;
use crate::model::response::Response;
use crate::model::rules::inbox::{is_mark_forgotten, processed_mark};
use crate::model::rules::{InboxDecision, inbox_decide};

/// Expiry-index entry kind of an inbox mark or webhook receipt (its key is in
/// `idem.inbox.v2`).
pub(crate) const KIND_INBOX: u8 = 0x02;

/// The state tag stored with an inbox entry in the expiry index.
const INBOX_TAG: u8 = 0;

/// Key namespace of consumer inbox marks.
const NS_INBOX: u8 = 0x01;
/// Key namespace of webhook receipts.
const NS_WEBHOOK: u8 = 0x02;

/// The answer of [`Store::process`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Processed<T> {
    /// The closure ran; its writes and the mark committed together. Ack the message.
    Processed(T),
    /// The closure returned [`Abort::Terminal`]: the mark (keeping this response) and the
    /// closure's writes committed (the message is consumed, a redelivery is a duplicate that
    /// carries the same response); the response says why.
    Rejected(Response),
    /// The message was processed before: the closure did not run. Ack the message.
    Duplicate {
        /// When it was processed.
        processed_at: Timestamp,
        /// `Some(response)` when the first handling was a terminal rejection: the response it
        /// returned then ([`Processed::Rejected`]), so a redelivery can be answered the same
        /// way (e.g. the same dead-letter reason). `None` when the first handling succeeded
        /// (the closure's value is not kept: keep what a redelivery needs in your own tables,
        /// written in the same transaction), and for marks written before rejections were kept.
        rejection: Option<Response>,
    },
}

/// The answer of [`Store::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Receipt<T> {
    /// First delivery: the receipt and the closure's writes committed together (answer 2xx).
    Accepted(T),
    /// The closure returned [`Abort::Terminal`]: the receipt (keeping this response) and the
    /// closure's writes committed; answer the sender with this response (a redelivery is a
    /// duplicate that carries the same response).
    Rejected(Response),
    /// This delivery id was received before: nothing ran.
    Duplicate {
        /// When the first delivery was received.
        received_at: Timestamp,
        /// `Some(response)` when the first delivery was rejected ([`Receipt::Rejected`]):
        /// answer the redelivery with that same response, not with a 2xx. `None` when the
        /// first delivery was accepted: answer 2xx so the sender stops (and for receipts
        /// written before rejections were kept).
        rejection: Option<Response>,
    },
}

enum Consumed<T> {
    Ran(T),
    Rejected(Response),
    Duplicate(Timestamp, Option<Response>),
}

impl Store {
    /// Inbox: processes the message `message_id` for `subscriber` at most once. `f` runs inside
    /// the write transaction that also writes the processed mark:
    ///
    /// - `Ok(v)` → the mark and `f`'s writes (including outbox pushes) commit together:
    ///   [`Processed::Processed`];
    /// - [`Abort::Terminal`] → the same, answered [`Processed::Rejected`];
    /// - [`Abort::Retryable`] / [`Abort::Store`] → nothing is written, neither the mark nor
    ///   `f`'s writes: the error is returned ([`Error::Aborted`]), do not ack, the redelivery
    ///   runs again;
    /// - a message whose mark is live → [`Processed::Duplicate`] without running `f` (read
    ///   from a read transaction first, re-checked inside the write transaction), with the
    ///   first handling's rejection response if it was rejected.
    ///
    /// A rejection's response is kept in the mark under
    /// [`crate::StoreBuilder::max_response_bytes`], like a record's: a larger one is kept
    /// without its body (its status and resource pointer), so the message is still consumed —
    /// it never runs again — and a redelivery gets that status; the first call still returns
    /// the whole response.
    ///
    /// The subscriber is limited like an operation and the message id like a key
    /// ([`crate::Limits`]; errors name them `operation` and `idempotency key`). Marks live for
    /// [`crate::StoreBuilder::inbox_retention`]; [`Store::sweep`] removes older ones. `f` may
    /// run more than once per call (same contract as [`Store::execute`]).
    pub fn process<T, F>(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
        f: F,
    ) -> Result<Processed<T>, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        Ok(
            match self.consume(NS_INBOX, subscriber, message_id.as_ref(), f)? {
                Consumed::Ran(v) => Processed::Processed(v),
                Consumed::Rejected(r) => Processed::Rejected(r),
                Consumed::Duplicate(processed_at, rejection) => Processed::Duplicate {
                    processed_at,
                    rejection,
                },
            },
        )
    }

    /// Webhooks: records the receipt of delivery `delivery_id` from `source` (the delivery id
    /// is the dedupe key, scoped by source) together with `f`'s writes, before any side effect.
    /// Call it only after the signature was verified (see the `webhook` module with the
    /// `webhooks` feature), so nothing is persisted for a forged request. Keep `f` short: push
    /// heavy work into the outbox ([`Tx::outbox`]). Same contract as [`Store::process`];
    /// receipts live for [`crate::StoreBuilder::inbox_retention`].
    pub fn receive<T, F>(
        &self,
        source: &str,
        delivery_id: impl AsRef<[u8]>,
        f: F,
    ) -> Result<Receipt<T>, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        Ok(
            match self.consume(NS_WEBHOOK, source, delivery_id.as_ref(), f)? {
                Consumed::Ran(v) => Receipt::Accepted(v),
                Consumed::Rejected(r) => Receipt::Rejected(r),
                Consumed::Duplicate(received_at, rejection) => Receipt::Duplicate {
                    received_at,
                    rejection,
                },
            },
        )
    }

    /// The stored mark of `message_id` for `subscriber`, as stored (it may be past its
    /// `forget_at` if no sweep ran since). For inspection and tests.
    pub fn inbox_mark(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
    ) -> Result<Option<Mark>, Error> {
        let key = self.inbox_key(NS_INBOX, subscriber, message_id.as_ref())?;
        self.read_mark(&key)
    }

    /// Removes the mark of `message_id` for `subscriber` (whatever it holds, e.g. one that
    /// fails its checksum: [`Error::CorruptRecord`]) and returns whether one existed. An
    /// operator's tool: the message then counts as never processed, so its next delivery
    /// **runs again**.
    pub fn purge_inbox_mark(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
    ) -> Result<bool, Error> {
        let key = self.inbox_key(NS_INBOX, subscriber, message_id.as_ref())?;
        self.purge_mark(key)
    }

    /// [`Store::purge_inbox_mark`] for the receipt of webhook delivery `delivery_id` from
    /// `source` ([`Store::receive`]): its next delivery **runs again**.
    pub fn purge_webhook_receipt(
        &self,
        source: &str,
        delivery_id: impl AsRef<[u8]>,
    ) -> Result<bool, Error> {
        let key = self.inbox_key(NS_WEBHOOK, source, delivery_id.as_ref())?;
        self.purge_mark(key)
    }

    fn purge_mark(&self, key: Vec<u8>) -> Result<bool, Error> {
        self.write(false, |txn, _| {
            let removed = (|| -> Result<bool, redb::Error> {
                let mut inbox = txn.open_table(INBOX)?;
                let old = inbox.remove(key.as_slice())?.map(|v| v.value().to_vec());
                let Some(old) = old else { return Ok(false) };
                if let Ok(mark) = Mark::decode(&old) {
                    let mut expiry = txn.open_table(EXPIRY)?;
                    expiry.remove(entry_key(mark.forget_at, KIND_INBOX, &key).as_slice())?;
                }
                Ok(true)
            })();
            match removed {
                Ok(existed) => Step::Done(existed),
                Err(e) => Step::Abort(self.storage(e)),
            }
        })
    }

    fn inbox_key(&self, ns: u8, subscriber: &str, id: &[u8]) -> Result<Vec<u8>, Error> {
        let limits = &self.inner.config.limits;
        check(Field::Operation, subscriber.len(), limits.max_operation_len)?;
        check(Field::Key, id.len(), limits.max_key_len)?;
        let mut key = Vec::with_capacity(3 + subscriber.len() + id.len());
        key.push(ns);
        // Limits are ≤ u16::MAX (validated at open).
        key.extend_from_slice(&(subscriber.len() as u16).to_be_bytes());
        key.extend_from_slice(subscriber.as_bytes());
        key.extend_from_slice(id);
        Ok(key)
    }

    fn read_mark(&self, key: &[u8]) -> Result<Option<Mark>, Error> {
        contained("reading an inbox mark", || {
            let read = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
            let Some(table) = open_optional(&read, INBOX).map_err(|e| self.storage(e))? else {
                return Ok(None);
            };
            let value = table.get(key).map_err(|e| self.storage(e))?;
            value.map(|v| Mark::decode(v.value())).transpose()
        })
    }

    fn consume<T, F>(
        &self,
        ns: u8,
        subscriber: &str,
        id: &[u8],
        mut f: F,
    ) -> Result<Consumed<T>, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        let key = self.inbox_key(ns, subscriber, id)?;
        if let Some(duplicate) = duplicate(self.read_mark(&key)?, self.now()) {
            return Ok(duplicate);
        }
        let retention = self.inner.config.inbox_retention;
        let result = self.write(false, |txn, now| {
            match self.load_mark(txn, &key) {
                Ok(mark) => {
                    if let Some(duplicate) = duplicate(mark, now) {
                        return Step::Clean(Ok(duplicate));
                    }
                }
                Err(e) => return Step::Clean(Err(e)),
            }
            // The mark written below is processed at `now`: its generation.
            let origin = Origin::mark(&key, now);
            let (consumed, rejection) = match self.run_closure(|| f(&Tx::new(txn, now, origin))) {
                Ok(v) => (Consumed::Ran(v), None),
                Err(Abort::Terminal(r)) => {
                    let r = r.mark_failed();
                    // Kept in the mark under the same cap as a record's response. The rejection
                    // happened (its closure ran and may have had effects outside the
                    // transaction): an answer over the cap is kept without its body rather than
                    // not at all, so the message is consumed and never runs again.
                    let kept = r.fitted(self.inner.config.max_response_bytes);
                    (Consumed::Rejected(r), Some(kept))
                }
                Err(Abort::Retryable(source)) => {
                    return Step::Abort(Error::Aborted { source });
                }
                Err(Abort::Store(e)) => return Step::Abort(e),
            };
            let mark = processed_mark(now, retention, rejection);
            match self.put_mark(txn, &key, &mark) {
                Ok(()) => Step::Done(Ok(consumed)),
                Err(e) => Step::Abort(e),
            }
        });
        self.wake_dispatcher_if_pushed();
        result?
    }

    fn load_mark(&self, txn: &WriteTransaction, key: &[u8]) -> Result<Option<Mark>, Error> {
        let table = txn.open_table(INBOX).map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Mark::decode(v.value())).transpose()
    }

    /// Writes a mark and moves its expiry-index entry, in `txn`.
    fn put_mark(&self, txn: &WriteTransaction, key: &[u8], mark: &Mark) -> Result<(), Error> {
        let mut inbox = txn.open_table(INBOX).map_err(|e| self.storage(e))?;
        let mut expiry = txn.open_table(EXPIRY).map_err(|e| self.storage(e))?;
        let old = inbox
            .insert(key, mark.encode().as_slice())
            .map_err(|e| self.storage(e))?
            // Only reached after `load_mark` decoded the old mark (or found none).
            .and_then(|v| Mark::decode(v.value()).ok());
        if let Some(old) = old {
            expiry
                .remove(entry_key(old.forget_at, KIND_INBOX, key).as_slice())
                .map_err(|e| self.storage(e))?;
        }
        expiry
            .insert(
                entry_key(mark.forget_at, KIND_INBOX, key).as_slice(),
                INBOX_TAG,
            )
            .map_err(|e| self.storage(e))?;
        Ok(())
    }
}

/// The duplicate answer for a live `mark` at `now`, or `None` when the message may run.
fn duplicate<T>(mark: Option<Mark>, now: Timestamp) -> Option<Consumed<T>> {
    let mark = mark?;
    match inbox_decide(Some(&mark), now) {
        InboxDecision::Duplicate { processed_at } => {
            Some(Consumed::Duplicate(processed_at, mark.rejection))
        }
        InboxDecision::Process => None,
    }
}

/// What the sweep did with one due inbox entry.
pub(crate) enum InboxSweep {
    /// The mark was past `forget_at`: mark and entry deleted.
    Deleted,
    /// The entry did not match its mark (none, undecodable, or another instant): fixed.
    Repaired,
    /// Not due at `now` (the clock went back): stop the batch.
    Keep,
}

/// Handles one due expiry-index entry of kind [`KIND_INBOX`] at `now`.
pub(crate) fn sweep_inbox_entry(
    txn: &WriteTransaction,
    expiry: &mut ExpiryTable<'_>,
    raw: &[u8],
    key: &[u8],
    now: Timestamp,
) -> Result<InboxSweep, redb::Error> {
    let mut inbox = txn.open_table(INBOX)?;
    // An undecodable mark is left in place (reading it is an error, never "absent"); only its
    // index entry is dropped, so the sweep does not revisit it.
    let mark = inbox.get(key)?.and_then(|v| Mark::decode(v.value()).ok());
    let Some(mark) = mark else {
        expiry.remove(raw)?;
        return Ok(InboxSweep::Repaired);
    };
    let expected = entry_key(mark.forget_at, KIND_INBOX, key);
    if expected != raw {
        expiry.remove(raw)?;
        expiry.insert(expected.as_slice(), INBOX_TAG)?;
        return Ok(InboxSweep::Repaired);
    }
    if !is_mark_forgotten(&mark, now) {
        return Ok(InboxSweep::Keep);
    }
    inbox.remove(key)?;
    expiry.remove(raw)?;
    Ok(InboxSweep::Deleted)
}

/// The expiry-index entries every stored inbox mark must have (for `check_expiry_index`), and
/// the keys of marks that do not decode (their entries are tolerated, like a corrupt record's).
pub(crate) type ExpectedInbox = (Vec<(Vec<u8>, u8)>, Vec<Vec<u8>>);

pub(crate) fn expected_inbox_entries(
    read: &redb::ReadTransaction,
) -> Result<ExpectedInbox, redb::Error> {
    let (mut out, mut undecodable) = (Vec::new(), Vec::new());
    let Some(inbox) = open_optional(read, INBOX)? else {
        return Ok((out, undecodable));
    };
    for row in inbox.iter()? {
        let (k, v) = row?;
        match Mark::decode(v.value()) {
            Ok(mark) => out.push((entry_key(mark.forget_at, KIND_INBOX, k.value()), INBOX_TAG)),
            Err(_) => undecodable.push(k.value().to_vec()),
        }
    }
    Ok((out, undecodable))
}

fn check(field: Field, len: usize, max: usize) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::Empty { field });
    }
    if len > max {
        return Err(Error::TooLong { field, len, max });
    }
    Ok(())
}
