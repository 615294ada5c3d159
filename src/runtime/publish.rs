//! What every engine's outbox dispatcher does between reading its rows and recording what
//! happened: publish the rows in commit order, holding back a key after its event failed
//! ([`publish_in_order`]); decide each failure's retry or dead letter with jitter; count; and
//! the dispatcher thread's loop of rounds and waits ([`dispatch_loop`]). The engines read and
//! write their own tables.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::{
    AfterFailure, DispatcherOptions, OutboxMetrics, Publisher, Stored, after_failure,
};
use crate::runtime::observe;
use crate::runtime::signal::Signal;

/// One failed attempt, for the engine to record.
pub(crate) struct Failed {
    /// The event's sequence number.
    pub seq: u64,
    /// The publisher's error, as text.
    pub error: String,
    /// Retry after a delay, or dead-letter.
    pub action: AfterFailure,
}

/// What a round published.
#[derive(Default)]
pub(crate) struct Published {
    /// Sequence numbers of the events the publisher accepted.
    pub delivered: Vec<u64>,
    /// The failed attempts.
    pub failed: Vec<Failed>,
}

impl Published {
    /// Nothing was published.
    pub(crate) fn is_empty(&self) -> bool {
        self.delivered.is_empty() && self.failed.is_empty()
    }

    /// The earliest retry instant: `current`, or one of this round's retries from `now`.
    pub(crate) fn next_due(&self, now: Timestamp, current: Option<Timestamp>) -> Option<Timestamp> {
        let mut next = current;
        for f in &self.failed {
            if let AfterFailure::Retry(delay) = f.action {
                let due = now.saturating_add(delay);
                next = Some(next.map_or(due, |d| d.min(due)));
            }
        }
        next
    }
}

/// Publishes `rows` (in commit order) through `publisher`, skipping the rows of `held` keys; a
/// failed (or panicking) publish holds its key for the rest of the round, so no later event of
/// that key goes out before it. Stops early when `stopping` says so.
pub(crate) fn publish_in_order(
    publisher: &mut impl Publisher,
    rows: Vec<(u64, Stored)>,
    mut held: HashSet<String>,
    options: &DispatcherOptions,
    jitter: &mut Jitter,
    stopping: impl Fn() -> bool,
) -> Published {
    let mut out = Published::default();
    for (seq, stored) in rows {
        if stopping() {
            break;
        }
        if let Some(key) = &stored.ordering_key
            && held.contains(key)
        {
            continue;
        }
        let event = stored.public(seq);
        let error = match catch_unwind(AssertUnwindSafe(|| publisher.publish(&event))) {
            Ok(Ok(())) => {
                out.delivered.push(seq);
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the publisher panicked".to_owned(),
        };
        if let Some(key) = &stored.ordering_key {
            held.insert(key.clone());
        }
        let attempts = stored.attempts.saturating_add(1);
        out.failed.push(Failed {
            seq,
            error,
            action: after_failure(
                attempts,
                options.max_attempts,
                options.backoff_base,
                options.backoff_max,
                jitter.next(),
            ),
        });
    }
    out
}

/// The retry jitter's generator: xorshift64*, seeded from the OS (jitter only, never security).
pub(crate) struct Jitter(u64);

impl Jitter {
    /// A generator seeded from the OS.
    pub(crate) fn seeded() -> Result<Self, Error> {
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        Ok(Jitter(u64::from_le_bytes(seed) | 1))
    }

    /// The next number of this thread's generator, seeded from std's per-process random hash
    /// keys: no failure path, for jitter that cannot report one (a re-run's pause).
    #[cfg(feature = "postgres")]
    pub(crate) fn next_on_this_thread() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        thread_local! {
            static STATE: std::cell::Cell<u64> = std::cell::Cell::new(
                std::collections::hash_map::RandomState::new().build_hasher().finish() | 1,
            );
        }
        STATE.with(|state| {
            let mut jitter = Jitter(state.get());
            let x = jitter.next();
            state.set(jitter.0);
            x
        })
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A dispatcher's counters since the store opened, and its one-dispatcher guard.
#[derive(Default)]
pub(crate) struct DispatchCounters {
    delivered: AtomicU64,
    failures: AtomicU64,
    dead_lettered: AtomicU64,
    /// True while a dispatcher runs for this store (at most one may).
    pub running: std::sync::Arc<AtomicBool>,
}

impl DispatchCounters {
    /// Counts what a recorded round did.
    pub(crate) fn add(&self, round: &Published) {
        self.delivered
            .fetch_add(round.delivered.len() as u64, Ordering::Relaxed);
        self.failures
            .fetch_add(round.failed.len() as u64, Ordering::Relaxed);
        let dead = round
            .failed
            .iter()
            .filter(|f| f.action == AfterFailure::DeadLetter)
            .inspect(|f| {
                observe::warn!(
                    "an outbox event became a dead letter: it holds back its ordering key until requeued or discarded",
                    seq = f.seq,
                )
            })
            .count();
        self.dead_lettered.fetch_add(dead as u64, Ordering::Relaxed);
    }

    /// The counters as the public figures.
    pub(crate) fn metrics(&self) -> OutboxMetrics {
        OutboxMetrics {
            delivered: self.delivered.load(Ordering::Relaxed),
            publish_failures: self.failures.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
        }
    }
}

/// What a round found.
pub(crate) struct Round {
    /// Publish again at once (more rows, or deliveries that may unblock keys).
    pub more: bool,
    /// The earliest retry instant among held-back events.
    pub next_due: Option<Timestamp>,
}

/// The dispatcher thread's loop: a round, then (unless it asks for more at once) a wait on
/// `signal` until the earliest due retry, at most `idle_recheck`, or a stop. `round` returns
/// `None` when the store is gone (the thread ends), else the round's result and the store's
/// time after it. A failed round is retried after the idle period; the events stay.
pub(crate) fn dispatch_loop(
    stop: &AtomicBool,
    signal: &Signal,
    idle_recheck: Duration,
    mut round: impl FnMut() -> Option<(Result<Round, Error>, Timestamp)>,
) {
    let stopping = || stop.load(Ordering::Acquire);
    while !stopping() {
        let seen = signal.seen();
        let Some((result, now)) = round() else {
            return;
        };
        let wait = match result {
            Ok(Round { more: true, .. }) => continue,
            Ok(Round {
                next_due: Some(due),
                ..
            }) => due
                .saturating_since(now)
                .min(idle_recheck)
                .max(Duration::from_millis(1)),
            Ok(_) => idle_recheck,
            Err(e) => {
                observe::warn!(
                    "an outbox dispatcher round failed; its events stay and the next round runs after the idle period",
                    error = observe::display(observe::Redacted(&e)),
                );
                idle_recheck
            }
        };
        signal.wait_unless_changed(seen, wait, stopping);
    }
}

/// Clears the one-dispatcher flag when the thread ends, however it ends.
pub(crate) struct Running(pub std::sync::Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
