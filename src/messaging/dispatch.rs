//! The outbox dispatcher on redb: one background thread that publishes committed outbox
//! events.
//!
//! Crash argument (docs/design.md, "Outbox"): an event row is written in the business
//! transaction and deleted only in a later transaction that runs after `Publisher::publish`
//! returned Ok for it. A crash anywhere leaves either the row (the event is published again,
//! with the same id: at-least-once) or no row (it was delivered). Per ordering key, the
//! dispatcher publishes only the oldest undelivered event of the key, so a later event of the
//! key is never published before an earlier one was delivered. Publishing in order, the retry
//! decisions and the thread's loop are `runtime/publish.rs`, shared with every engine.

use std::collections::HashSet;

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::commit::{Durable, Step};
use crate::engine::store::{Store, WeakStore};
use crate::engine::tables::{OUTBOX, OUTBOX_DEAD, open_optional};
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::{AfterFailure, DispatcherOptions, Publisher, Stored};
use crate::runtime::observe::Every;
use crate::runtime::publish::{
    DispatchCounters, Jitter, Published, Round, dispatch_loop, publish_in_order,
};
use crate::runtime::worker::{DispatcherHandle, spawn_dispatcher};

impl Store {
    /// Starts the outbox dispatcher: a background thread that publishes committed outbox
    /// events through `publisher`, in commit order per ordering key, at least once each. It is
    /// woken at once by every commit of this store that pushed events, and by a timer for
    /// retries. An event is deleted (delivered) only after `publish` returned Ok. A failed
    /// attempt is retried with exponential backoff and jitter; after
    /// [`DispatcherOptions::max_attempts`] failures the event moves to the dead-letter table
    /// ([`Store::dead_letters`]), counted in [`Store::outbox_metrics`], and holds
    /// back later events of its ordering key until requeued or discarded; other keys go on.
    ///
    /// One dispatcher per store at a time ([`Error::InUse`] otherwise); with
    /// [`crate::StoreBuilder::multi_process`], run it in one process only (two dispatchers on
    /// one file would publish events twice and out of order). The thread holds no strong
    /// handle to the store between rounds: it ends when the handle is shut down or dropped, or
    /// when the last `Store` clone is dropped. [`Store::compact`] answers [`Error::InUse`]
    /// while it runs. A publisher that never returns blocks shutdown: give its calls a
    /// timeout.
    ///
    /// # Example
    ///
    /// A closure publisher (here a channel standing in for a broker client). A publish that
    /// fails is retried with backoff; the event keeps its id, the key consumers deduplicate
    /// on. Shutting down waits for the publish in progress and its delivery mark.
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use std::time::Duration;
    /// use idem::error::BoxError;
    /// use idem::outbox::{DispatcherOptions, Event, StoredEvent};
    /// use idem::{Request, Response, Scope, Store};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let (broker, published) = mpsc::channel::<StoredEvent>();
    /// let mut broker_down_once = true;
    /// let publisher = move |event: &StoredEvent| -> Result<(), BoxError> {
    ///     if std::mem::take(&mut broker_down_once) {
    ///         return Err("broker unavailable".into()); // a failed attempt: retried later
    ///     }
    ///     broker.send(event.clone())?; // Ok only once the broker has the event
    ///     Ok(())
    /// };
    /// let options = DispatcherOptions::new().backoff(Duration::from_millis(10), Duration::from_secs(1));
    /// let dispatcher = store.start_dispatcher(publisher, options)?;
    ///
    /// let mut pushed = None;
    /// let request = Request::new(Scope::new("tenant-42", "create_order"), "order-9", &1u32)?;
    /// store.execute(request, |tx| {
    ///     pushed = Some(tx.outbox().push(Event::new("order.created", "order-9"))?);
    ///     Ok(Response::new(201, "order-9"))
    /// })?;
    ///
    /// // The commit wakes the dispatcher; the second attempt reaches the broker.
    /// let event = published.recv_timeout(Duration::from_secs(10))?;
    /// assert_eq!((event.topic.as_str(), &event.payload[..]), ("order.created", &b"order-9"[..]));
    /// assert_eq!(Some(event.id), pushed); // the id the push returned
    /// assert_eq!(event.failed_attempts, 1);
    ///
    /// dispatcher.shutdown()?;
    /// assert_eq!(store.outbox_stats()?.pending, 0); // marked delivered
    /// assert_eq!(store.outbox_metrics().delivered, 1);
    /// # Ok(())
    /// # }
    /// ```
    pub fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        options.validate()?;
        let counters = self.extension::<DispatchCounters>();
        let signal = self.work_signal();
        let weak = self.downgrade();
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
                let store = d.weak.upgrade()?;
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

/// How often the dispatcher refreshes the outbox gauges (feature `metrics`): redb keeps the
/// counts, so reading them is cheap.
const OUTBOX_GAUGES_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

struct Dispatcher<P> {
    weak: WeakStore,
    publisher: P,
    options: DispatcherOptions,
}

impl<P: Publisher> Dispatcher<P> {
    /// One round: reads up to `batch` undelivered events in commit order, publishes each one
    /// whose key is not held back by an earlier undelivered event, then commits the delivery
    /// marks and failure records in one write transaction.
    fn round(
        &mut self,
        store: &Store,
        jitter: &mut Jitter,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Result<Round, Error> {
        let now = store.now();
        let Loaded {
            rows,
            held,
            next_due,
            more,
        } = self.load(store, now)?;
        let stopping = || stop.load(std::sync::atomic::Ordering::Acquire);
        let published = publish_in_order(
            &mut self.publisher,
            rows,
            held,
            &self.options,
            jitter,
            stopping,
        );
        if published.is_empty() {
            return Ok(Round {
                more: false,
                next_due,
            });
        }
        self.record(store, &published)?;
        store.extension::<DispatchCounters>().add(&published);
        // Something was delivered: later events of those keys may be publishable right away.
        Ok(Round {
            more: more || !published.delivered.is_empty(),
            next_due: published.next_due(now, next_due),
        })
    }

    /// Reads, in commit order, up to `batch` events that may be published at `now`: rows of
    /// keys held back (by a dead letter, or by an earlier row whose retry is not due) are
    /// skipped without counting, so a held key never starves the others (the scan reads past
    /// its backlog each round).
    fn load(&self, store: &Store, now: Timestamp) -> Result<Loaded, Error> {
        // Behind the storage boundary: a damaged page is `CorruptStore` for this round, never
        // a panic that ends the dispatcher thread.
        store.read("reading the outbox", |read| self.load_rows(read, now))
    }

    fn load_rows(&self, read: &redb::ReadTransaction, now: Timestamp) -> Result<Loaded, Error> {
        let mut loaded = Loaded {
            rows: Vec::new(),
            held: HashSet::new(),
            next_due: None,
            more: false,
        };
        let Some(outbox) = open_optional(read, OUTBOX).map_err(unlatched)? else {
            return Ok(loaded);
        };
        let dead_keys = &mut loaded.held;
        if let Some(dead) = open_optional(read, OUTBOX_DEAD).map_err(unlatched)? {
            for row in dead.iter().map_err(unlatched)? {
                let (_, v) = row.map_err(unlatched)?;
                if let Ok(s) = Stored::decode(v.value())
                    && let Some(k) = s.ordering_key
                {
                    dead_keys.insert(k);
                }
            }
        }
        for row in outbox.iter().map_err(unlatched)? {
            let (seq, v) = row.map_err(unlatched)?;
            // A row that does not decode is left in place (inspect it with pending_events).
            let Ok(s) = Stored::decode(v.value()) else {
                continue;
            };
            if let Some(key) = &s.ordering_key
                && loaded.held.contains(key)
            {
                continue;
            }
            if s.next_attempt_at > now.0 {
                let due = Timestamp(s.next_attempt_at);
                loaded.next_due = Some(loaded.next_due.map_or(due, |d| d.min(due)));
                if let Some(key) = s.ordering_key {
                    loaded.held.insert(key);
                }
                continue;
            }
            if loaded.rows.len() >= self.options.batch {
                loaded.more = true;
                break;
            }
            loaded.rows.push((seq.value(), s));
        }
        Ok(loaded)
    }

    /// Deletes delivered rows and records failures, in one write transaction.
    fn record(&self, store: &Store, published: &Published) -> Result<(), Error> {
        let Published { delivered, failed } = published;
        store.write(Durable::AsConfigured, |txn, now| {
            let opening = |e: redb::TableError| store.storage(e);
            let storage = |e: redb::StorageError| store.storage(e);
            let result = (|| -> Result<(), Error> {
                let mut outbox = txn.open_table(OUTBOX).map_err(opening)?;
                for seq in delivered {
                    outbox.remove(*seq).map_err(storage)?;
                }
                let mut dead = txn.open_table(OUTBOX_DEAD).map_err(opening)?;
                for f in failed.iter() {
                    let row = outbox.get(f.seq).map_err(storage)?;
                    let Some(bytes) = row.map(|v| v.value().to_vec()) else {
                        continue;
                    };
                    let mut stored = Stored::decode(&bytes)?;
                    stored.attempts = stored.attempts.saturating_add(1);
                    stored.last_error = Some(f.error.clone());
                    stored.failed_at = now.0;
                    match f.action {
                        AfterFailure::Retry(delay) => {
                            stored.next_attempt_at = now.saturating_add(delay).0;
                            outbox
                                .insert(f.seq, stored.encode()?.as_slice())
                                .map_err(storage)?;
                        }
                        AfterFailure::DeadLetter => {
                            outbox.remove(f.seq).map_err(storage)?;
                            dead.insert(f.seq, stored.encode()?.as_slice())
                                .map_err(storage)?;
                        }
                    }
                }
                Ok(())
            })();
            match result {
                Ok(()) => Step::Done(()),
                // The write observes the error (and latches an I/O failure).
                Err(e) => Step::Abort(e),
            }
        })
    }
}

/// What a round may publish.
struct Loaded {
    /// Publishable rows, in commit order.
    rows: Vec<(u64, Stored)>,
    /// Ordering keys held back at load time.
    held: HashSet<String>,
    /// The earliest retry instant among rows not yet due.
    next_due: Option<Timestamp>,
    /// More publishable rows than `batch`.
    more: bool,
}
