//! The inbox (processed-message marks) and webhook receipts.
//!
//! Built on the engine's marks (`engine/marks.rs`, which stores them, indexes them for expiry
//! and sweeps them): this file chooses a mark's key — a namespace (inbox or webhook), the
//! subscriber or source, the message or delivery id — and decides, from the stored mark,
//! whether a delivery runs or is a duplicate. The mark is written in the same write
//! transaction as the consumer's own writes; [`Store::sweep`] removes it after the inbox
//! retention like any expired record.

use crate::engine::commit::{Durable, Step};
use crate::engine::store::ENGINE;
use crate::engine::store::Store;
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::marks::{
    Consumed, Mark, NS_INBOX, NS_WEBHOOK, ProcessAnswer, ReceiveAnswer, duplicate, mark_key,
};
use crate::model::outbox::Origin;
use crate::model::response::Abort;
use crate::model::rules::inbox::processed_mark;
use crate::runtime::observe::Call;

impl Store {
    /// Inbox: processes the message `message_id` for `subscriber` at most once. `f` runs inside
    /// the write transaction that also writes the processed mark:
    ///
    /// - `Ok(v)` → the mark and `f`'s writes (including outbox pushes) commit together:
    ///   [`ProcessAnswer::Ran`];
    /// - [`Abort::Terminal`] → the same, answered [`ProcessAnswer::Rejected`];
    /// - [`Abort::Retryable`] / [`Abort::Store`] → nothing is written, neither the mark nor
    ///   `f`'s writes: the error is returned ([`Error::Aborted`]), do not ack, the redelivery
    ///   runs again;
    /// - a message whose mark is live → [`ProcessAnswer::Duplicate`] without running `f` (read
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
    /// ([`crate::store::Limits`]; errors name them `operation` and `idempotency key`). Marks live for
    /// [`crate::StoreBuilder::inbox_retention`]; [`Store::sweep`] removes older ones. `f` may
    /// run more than once per call (same contract as [`Store::execute`]).
    ///
    /// # Example
    ///
    /// A queue consumer that credits an account once per message, however often the broker
    /// redelivers it. A transient failure writes nothing (do not ack: the redelivery runs
    /// again); once processed, a redelivery is a duplicate and the credit is not applied twice.
    ///
    /// ```
    /// use idem::inbox::ProcessAnswer;
    /// use idem::redb::{ReadableTable, TableDefinition};
    /// use idem::{Abort, Error, Store};
    ///
    /// const BALANCES: TableDefinition<&str, u64> = TableDefinition::new("balances");
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let consume = |message_id: &str, ledger_up: bool| {
    ///     store.process("billing-consumer", message_id, |tx| {
    ///         if !ledger_up {
    ///             return Err(Abort::retryable("the ledger is unavailable"));
    ///         }
    ///         let mut balances = tx.open_table(BALANCES)?;
    ///         let credited = balances.get("acct-1")?.map_or(0, |v| v.value()) + 250;
    ///         balances.insert("acct-1", credited)?;
    ///         Ok(credited)
    ///     })
    /// };
    ///
    /// // A transient failure: nothing written, the message is not consumed.
    /// assert!(matches!(consume("msg-1", false), Err(Error::Aborted { .. })));
    /// // The redelivery runs; the next ones are duplicates (ack them, do nothing).
    /// assert_eq!(consume("msg-1", true)?, ProcessAnswer::Ran(250));
    /// assert!(matches!(consume("msg-1", true)?, ProcessAnswer::Duplicate { rejection: None, .. }));
    ///
    /// let balances = store.read_transaction()?.open_table(BALANCES)?;
    /// assert_eq!(balances.get("acct-1")?.map(|v| v.value()), Some(250)); // credited once
    /// # Ok(())
    /// # }
    /// ```
    pub fn process<T, F>(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
        f: F,
    ) -> Result<ProcessAnswer<T>, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        Ok(
            match self.consume(NS_INBOX, subscriber, message_id.as_ref(), f)? {
                Consumed::Ran(v) => ProcessAnswer::Ran(v),
                Consumed::Rejected(r) => ProcessAnswer::Rejected(r),
                Consumed::Duplicate(processed_at, rejection) => ProcessAnswer::Duplicate {
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
    ///
    /// # Example
    ///
    /// A GitHub webhook endpoint: the signature is checked first (a forged request stores
    /// nothing), then the receipt and an outbox event for the heavy work commit together; the
    /// sender's redelivery of the same `X-GitHub-Delivery` id is a duplicate.
    ///
    #[cfg_attr(feature = "webhooks", doc = "```")]
    #[cfg_attr(not(feature = "webhooks"), doc = "```ignore")]
    /// use idem::inbox::ReceiveAnswer;
    /// use idem::outbox::Event;
    /// use idem::webhook::verify_github;
    /// use idem::Store;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let secret = b"It's a Secret to Everybody"; // from your configuration
    ///
    /// // The HTTP status to answer a delivery with.
    /// let on_delivery = |delivery_id: &str, signature: Option<&str>, body: &[u8]| -> Result<u16, idem::Error> {
    ///     if verify_github(secret, body, signature).is_err() {
    ///         return Ok(401); // forged or altered: nothing is stored
    ///     }
    ///     let receipt = store.receive("github", delivery_id, |tx| {
    ///         tx.outbox().push(Event::new("github.push", body))?;
    ///         Ok(())
    ///     })?;
    ///     Ok(match receipt {
    ///         ReceiveAnswer::Ran(()) => 202,
    ///         ReceiveAnswer::Duplicate { rejection: None, .. } => 200, // already have it: stop sending
    ///         ReceiveAnswer::Rejected(r) | ReceiveAnswer::Duplicate { rejection: Some(r), .. } => r.status(),
    ///         _ => 500,
    ///     })
    /// };
    ///
    /// // GitHub's documented example signature of this body under this secret.
    /// let signature = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    /// let delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
    /// assert_eq!(on_delivery(delivery, Some(signature), b"Hello, World!")?, 202);
    /// assert_eq!(on_delivery(delivery, Some(signature), b"Hello, World!")?, 200); // redelivery
    /// assert_eq!(on_delivery("forged-1", Some(signature), b"Hello, Mallory!")?, 401);
    /// assert_eq!(store.outbox_stats()?.pending, 1); // one event for the one delivery
    /// # Ok(())
    /// # }
    /// ```
    pub fn receive<T, F>(
        &self,
        source: &str,
        delivery_id: impl AsRef<[u8]>,
        f: F,
    ) -> Result<ReceiveAnswer<T>, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        Ok(
            match self.consume(NS_WEBHOOK, source, delivery_id.as_ref(), f)? {
                Consumed::Ran(v) => ReceiveAnswer::Ran(v),
                Consumed::Rejected(r) => ReceiveAnswer::Rejected(r),
                Consumed::Duplicate(received_at, rejection) => ReceiveAnswer::Duplicate {
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
        self.write(Durable::AsConfigured, |txn, _| {
            match self.remove_mark(txn, &key) {
                Ok(existed) => Step::Done(existed),
                Err(e) => Step::Abort(e),
            }
        })
    }

    fn inbox_key(&self, ns: u8, subscriber: &str, id: &[u8]) -> Result<Vec<u8>, Error> {
        mark_key(ns, subscriber, id, &self.config().limits)
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
        Call::consume(ENGINE, ns == NS_WEBHOOK, subscriber)
            .observe(|_| self.consume_observed(ns, subscriber, id, &mut f))
    }

    /// [`Store::consume`], inside its observed call (`runtime/observe/`).
    fn consume_observed<T, F>(
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
        // A fail-stopped store answers no delivery, duplicates included (as `execute`).
        self.check_writable()?;
        if let Some(duplicate) = duplicate(self.read_mark(&key)?, self.now()) {
            return Ok(duplicate);
        }
        let retention = self.config().inbox_retention;
        let mut announced = false;
        let result = self.write(Durable::AsConfigured, |txn, now| {
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
            let (result, pushed) = self.run_on_tx(txn, now, origin, &mut f);
            announced = pushed;
            let (consumed, rejection) = match result {
                Ok(v) => (Consumed::Ran(v), None),
                Err(Abort::Terminal(r)) => {
                    let r = r.mark_failed();
                    // Kept in the mark under the same cap as a record's response. The rejection
                    // happened (its closure ran and may have had effects outside the
                    // transaction): an answer over the cap is kept without its body rather than
                    // not at all, so the message is consumed and never runs again.
                    let kept = r.fitted(self.config().max_response_bytes);
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
        if announced && result.is_ok() {
            self.announce_work();
        }
        result?
    }
}
