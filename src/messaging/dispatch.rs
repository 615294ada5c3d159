//! The outbox dispatcher: one background thread that publishes committed outbox events.
//!
//! Crash argument (docs/design.md, "Outbox"): an event row is written in the business
//! transaction and deleted only in a later transaction that runs after `Publisher::publish`
//! returned Ok for it. A crash anywhere leaves either the row (the event is published again,
//! with the same id: at-least-once) or no row (it was delivered). Per ordering key, the
//! dispatcher publishes only the oldest undelivered event of the key, so a later event of the
//! key is never published before an earlier one was delivered.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::commit::{Durable, Step};
use crate::engine::store::{Store, WeakStore};
use crate::engine::tables::{OUTBOX, OUTBOX_DEAD, open_optional};
use crate::error::Error;
use crate::messaging::outbox::OutboxShared;
use crate::model::clock::Timestamp;
use crate::model::outbox::{AfterFailure, DispatcherOptions, Publisher, Stored, after_failure};
use crate::runtime::signal::Signal;

/// The running dispatcher. [`DispatcherHandle::shutdown`] (or dropping the handle) stops it
/// after the publish in progress and its delivery mark, and joins the thread.
#[derive(Debug)]
pub struct DispatcherHandle {
    stop: Arc<AtomicBool>,
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl DispatcherHandle {
    /// Stops the dispatcher and waits for its thread to end. Undelivered events stay in the
    /// outbox for the next dispatcher.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop_and_join()
    }

    /// Wakes the dispatcher now (e.g. after moving a manual clock in a test).
    pub fn wake(&self) {
        self.signal.notify();
    }

    fn stop_and_join(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        self.signal.notify();
        match self.thread.take() {
            Some(t) if t.thread().id() != std::thread::current().id() => {
                t.join().map_err(|_| Error::Internal {
                    what: "the outbox dispatcher thread panicked",
                })
            }
            _ => Ok(()),
        }
    }
}

impl Drop for DispatcherHandle {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

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
    pub fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error> {
        options.validate()?;
        let shared = self.extension::<OutboxShared>();
        if shared.running.swap(true, Ordering::AcqRel) {
            return Err(Error::InUse {
                operation: "start_dispatcher",
                reason: "an outbox dispatcher is already running for this store".into(),
            });
        }
        let stop = Arc::new(AtomicBool::new(false));
        let signal = self.work_signal();
        let running = shared.running.clone();
        let weak = self.downgrade();
        let thread_stop = stop.clone();
        let thread_signal = signal.clone();
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        let spawned = std::thread::Builder::new()
            .name("idem-dispatcher".into())
            .spawn(move || {
                let _running = Running(running);
                let mut d = Dispatcher {
                    weak,
                    publisher,
                    options,
                    stop: thread_stop,
                    signal: thread_signal,
                    rng: u64::from_le_bytes(seed) | 1,
                };
                d.run();
            });
        match spawned {
            Ok(t) => Ok(DispatcherHandle {
                stop,
                signal,
                thread: Some(t),
            }),
            Err(source) => {
                shared.running.store(false, Ordering::Release);
                Err(Error::Spawn {
                    what: "idem-dispatcher",
                    source,
                })
            }
        }
    }
}

/// Clears the one-dispatcher flag when the thread ends, however it ends.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

struct Dispatcher<P> {
    weak: WeakStore,
    publisher: P,
    options: DispatcherOptions,
    stop: Arc<AtomicBool>,
    signal: Arc<Signal>,
    rng: u64,
}

/// The result of one failed attempt, applied in the round's write transaction.
struct Failed {
    seq: u64,
    error: String,
    action: AfterFailure,
}

impl<P: Publisher> Dispatcher<P> {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    fn run(&mut self) {
        while !self.stopping() {
            let seen = self.signal.seen();
            let Some(store) = self.weak.upgrade() else {
                return;
            };
            // A failed round (storage trouble, a fail-stopped store) is retried after the
            // idle period; the events stay in the table.
            let round = self.round(&store);
            let now = store.now();
            drop(store);
            let wait = match round {
                Ok(Round { more: true, .. }) => continue,
                Ok(Round {
                    next_due: Some(due),
                    ..
                }) => due
                    .saturating_since(now)
                    .min(self.options.idle_recheck)
                    .max(Duration::from_millis(1)),
                _ => self.options.idle_recheck,
            };
            self.signal
                .wait_unless_changed(seen, wait, || self.stopping());
        }
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*: jitter only, never security.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// One round: reads up to `batch` undelivered events in commit order, publishes each one
    /// whose key is not held back by an earlier undelivered event, then commits the delivery
    /// marks and failure records in one write transaction.
    fn round(&mut self, store: &Store) -> Result<Round, Error> {
        let now = store.now();
        let Loaded {
            rows,
            held: mut blocked,
            mut next_due,
            more,
        } = self.load(store, now)?;
        let mut delivered: Vec<u64> = Vec::new();
        let mut failed: Vec<Failed> = Vec::new();
        for (seq, stored) in rows {
            if self.stopping() {
                break;
            }
            if let Some(key) = &stored.ordering_key
                && blocked.contains(key)
            {
                continue;
            }
            let hold = |blocked: &mut HashSet<String>| {
                if let Some(key) = &stored.ordering_key {
                    blocked.insert(key.clone());
                }
            };
            let event = stored.public(seq);
            let publisher = &mut self.publisher;
            let result = catch_unwind(AssertUnwindSafe(|| publisher.publish(&event)));
            match result {
                Ok(Ok(())) => delivered.push(seq),
                Ok(Err(e)) => {
                    hold(&mut blocked);
                    failed.push(self.failure(seq, stored.attempts, e.to_string()));
                }
                Err(_) => {
                    hold(&mut blocked);
                    failed.push(self.failure(
                        seq,
                        stored.attempts,
                        "the publisher panicked".into(),
                    ));
                }
            }
        }
        if delivered.is_empty() && failed.is_empty() {
            return Ok(Round {
                more: false,
                next_due,
            });
        }
        self.record(store, &delivered, &failed)?;
        let shared = store.extension::<OutboxShared>();
        shared
            .delivered
            .fetch_add(delivered.len() as u64, Ordering::Relaxed);
        shared
            .failures
            .fetch_add(failed.len() as u64, Ordering::Relaxed);
        let dead = failed
            .iter()
            .filter(|f| f.action == AfterFailure::DeadLetter)
            .count();
        shared
            .dead_lettered
            .fetch_add(dead as u64, Ordering::Relaxed);
        for f in &failed {
            if let AfterFailure::Retry(delay) = f.action {
                let due = now.saturating_add(delay);
                next_due = Some(next_due.map_or(due, |d| d.min(due)));
            }
        }
        // Something was delivered: later events of those keys may be publishable right away.
        Ok(Round {
            more: more || !delivered.is_empty(),
            next_due,
        })
    }

    fn failure(&mut self, seq: u64, attempts_before: u32, error: String) -> Failed {
        let attempts = attempts_before.saturating_add(1);
        let random = self.next_random();
        let o = &self.options;
        Failed {
            seq,
            error,
            action: after_failure(
                attempts,
                o.max_attempts,
                o.backoff_base,
                o.backoff_max,
                random,
            ),
        }
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
    fn record(&self, store: &Store, delivered: &[u64], failed: &[Failed]) -> Result<(), Error> {
        store.write(Durable::AsConfigured, |txn, now| {
            let opening = |e: redb::TableError| store.storage(e);
            let storage = |e: redb::StorageError| store.storage(e);
            let result = (|| -> Result<(), Error> {
                let mut outbox = txn.open_table(OUTBOX).map_err(opening)?;
                for seq in delivered {
                    outbox.remove(*seq).map_err(storage)?;
                }
                let mut dead = txn.open_table(OUTBOX_DEAD).map_err(opening)?;
                for f in failed {
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

struct Round {
    /// Publish again at once (more rows, or deliveries that may unblock keys).
    more: bool,
    /// The earliest retry instant among held-back events.
    next_due: Option<Timestamp>,
}
