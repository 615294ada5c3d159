//! The inbox (processed-message marks) and webhook receipts on PostgreSQL: the same contract as
//! the file store's (`Store::process`, `Store::receive`), the mark written in the transaction
//! of the consumer's own writes.

use crate::error::Error;
use crate::model::marks::{
    Consumed, Mark, NS_INBOX, NS_WEBHOOK, ProcessAnswer, ReceiveAnswer, duplicate, mark_key,
};
use crate::model::outbox::Origin;
use crate::model::response::Abort;
use crate::model::rules::inbox::processed_mark;
use crate::postgres::commit::{Locks, Step};
use crate::postgres::conn::NOW_MS;
use crate::postgres::store::ENGINE;
use crate::postgres::store::PgStore;
use crate::postgres::tx::PgTx;
use crate::runtime::observe::Call;

impl PgStore {
    /// Inbox: processes the message `message_id` for `subscriber` at most once, across every
    /// process sharing the database. `f` runs inside the transaction that also writes the
    /// processed mark; same contract as [`crate::Store::process`]: `Ok(v)` → the mark and `f`'s
    /// writes commit together ([`ProcessAnswer::Ran`]); [`Abort::Terminal`] → the same,
    /// answered [`ProcessAnswer::Rejected`] (a redelivery carries the same response);
    /// [`Abort::Retryable`] / [`Abort::Store`] → nothing is written ([`Error::Aborted`] or the
    /// error): do not ack; a live mark → [`ProcessAnswer::Duplicate`] without running `f`.
    ///
    /// # Example
    ///
    /// (`no_run`: it needs a server.) A consumer that credits an account once per message,
    /// whichever node of the fleet the broker redelivers it to.
    ///
    /// ```no_run
    /// use idem::inbox::ProcessAnswer;
    /// use idem::postgres::PgStore;
    /// use idem::{Abort, Response};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PgStore::open("postgresql://app@db.internal/billing")?;
    /// let (message_id, account, cents) = ("msg-81", "acct-1", 250i64); // from the broker
    /// let processed = store.process("billing-consumer", message_id, |tx| {
    ///     let updated = tx.execute(
    ///         "UPDATE balances SET cents = cents + $2 WHERE account = $1",
    ///         &[&account, &cents],
    ///     )?;
    ///     if updated == 0 {
    ///         // Consumed, never retried; a redelivery gets the same answer.
    ///         return Err(Abort::terminal(Response::new(404, "no such account")));
    ///     }
    ///     Ok(updated)
    /// })?; // an `Err` (a failed statement, a retryable abort): nothing written, do not ack
    /// match processed {
    ///     ProcessAnswer::Ran(_) | ProcessAnswer::Duplicate { rejection: None, .. } => { /* ack */ }
    ///     ProcessAnswer::Rejected(why) | ProcessAnswer::Duplicate { rejection: Some(why), .. } => {
    ///         println!("ack and dead-letter: {}", String::from_utf8_lossy(why.body()));
    ///     }
    ///     _ => {}
    /// }
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
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
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

    /// Webhooks: records the receipt of delivery `delivery_id` from `source` together with
    /// `f`'s writes, before any side effect (call it only after the signature was verified).
    /// Same contract as [`PgStore::process`] and [`crate::Store::receive`].
    pub fn receive<T, F>(
        &self,
        source: &str,
        delivery_id: impl AsRef<[u8]>,
        f: F,
    ) -> Result<ReceiveAnswer<T>, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
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

    /// The stored mark of `message_id` for `subscriber`, as stored. For inspection and tests.
    pub fn inbox_mark(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
    ) -> Result<Option<Mark>, Error> {
        let key = mark_key(
            NS_INBOX,
            subscriber,
            message_id.as_ref(),
            &self.config().limits,
        )?;
        Ok(self.read_mark(&key)?.1)
    }

    /// Removes the mark of `message_id` for `subscriber` and returns whether one existed: its
    /// next delivery **runs again**.
    pub fn purge_inbox_mark(
        &self,
        subscriber: &str,
        message_id: impl AsRef<[u8]>,
    ) -> Result<bool, Error> {
        let key = mark_key(
            NS_INBOX,
            subscriber,
            message_id.as_ref(),
            &self.config().limits,
        )?;
        self.purge_mark(key)
    }

    /// Removes the receipt of webhook delivery `delivery_id` from `source`: its next delivery
    /// **runs again**.
    pub fn purge_webhook_receipt(
        &self,
        source: &str,
        delivery_id: impl AsRef<[u8]>,
    ) -> Result<bool, Error> {
        let key = mark_key(
            NS_WEBHOOK,
            source,
            delivery_id.as_ref(),
            &self.config().limits,
        )?;
        self.purge_mark(key)
    }

    fn purge_mark(&self, key: Vec<u8>) -> Result<bool, Error> {
        self.write(Locks::locked_mark(&key), |batch| match batch.mark(&key) {
            Ok(None) => Step::Clean(false),
            Ok(Some(_)) | Err(Error::CorruptRecord { .. }) => {
                batch.remove_mark(&key);
                Step::Done(true)
            }
            Err(e) => Step::Abort(e),
        })
    }

    /// The mark under `key` and the time, from one statement outside any transaction.
    pub(crate) fn read_mark(
        &self,
        key: &[u8],
    ) -> Result<(crate::model::clock::Timestamp, Option<Mark>), Error> {
        let q = format!(
            "SELECT {NOW_MS}, (SELECT mark FROM {} WHERE mark_key = $1)",
            self.sql().marks
        );
        let (now, bytes) = self.read_row(&q, key)?;
        Ok((now, bytes.map(|b| Mark::decode(&b)).transpose()?))
    }

    fn consume<T, F>(
        &self,
        ns: u8,
        subscriber: &str,
        id: &[u8],
        mut f: F,
    ) -> Result<Consumed<T>, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
    {
        Call::consume(ENGINE, ns == NS_WEBHOOK, subscriber)
            .observe(|_| self.consume_observed(ns, subscriber, id, &mut f))
    }

    /// [`PgStore::consume`], inside its observed call (`runtime/observe/`).
    fn consume_observed<T, F>(
        &self,
        ns: u8,
        subscriber: &str,
        id: &[u8],
        mut f: F,
    ) -> Result<Consumed<T>, Error>
    where
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
    {
        let key = mark_key(ns, subscriber, id, &self.config().limits)?;
        let retention = self.config().inbox_retention;
        let max = self.config().max_response_bytes;
        let mut announced = false;
        let result = self.write(Locks::mark(&key), |batch| {
            let now = batch.now();
            match batch.mark(&key) {
                Ok(mark) => {
                    if let Some(d) = duplicate(mark, now) {
                        return Step::Clean(Ok(d));
                    }
                }
                Err(e) => return Step::Clean(Err(e)),
            }
            let origin = Origin::mark(&key, now);
            let (result, pushed) = match self.run_on_tx(batch, origin, &mut f) {
                Ok(done) => done,
                Err(e) => return Step::Abort(e),
            };
            announced = pushed;
            let (consumed, rejection) = match result {
                Ok(v) => (Consumed::Ran(v), None),
                Err(Abort::Terminal(r)) => {
                    let r = r.mark_failed();
                    let kept = r.fitted(max);
                    (Consumed::Rejected(r), Some(kept))
                }
                Err(Abort::Retryable(source)) => return Step::Abort(Error::Aborted { source }),
                Err(Abort::Store(e)) => return Step::Abort(e),
            };
            batch.put_mark(&key, &processed_mark(now, retention, rejection));
            Step::Done(Ok(consumed))
        });
        if announced && result.is_ok() {
            self.announce_work();
        }
        result?
    }
}
