//! What the layer counts: [`LayerMetrics`], the snapshot an operator reads, and the counters
//! behind it, shared by a layer's clones.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;
use crate::runtime::observe;

/// The layer's counters (monotonic since it was built), shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) bodies_not_kept: AtomicU64,
    pub(super) overloaded: AtomicU64,
    pub(super) handler_failures: AtomicU64,
    pub(super) not_recorded: AtomicU64,
    pub(super) heartbeat_failures: AtomicU64,
}

pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Counts an answer the layer could not record after the handler ran (`error`: why, when the
/// store said), with a warning (feature `tracing`).
pub(super) fn not_recorded(counters: &Counters, error: Option<&Error>) {
    bump(&counters.not_recorded);
    observe::warn!(
        "an answer could not be recorded after its handler ran: the key stays claimed until its lease lapses, and only then may a retry run the handler again",
        error = observe::display(Why(error)),
    );
}

/// Counts a handler that failed after it started and was recorded as a terminal `500`, with a
/// warning (feature `tracing`).
pub(super) fn handler_failure(counters: &Counters) {
    bump(&counters.handler_failures);
    observe::warn!(
        "a handler failed after it started (it panicked, its body failed, or the service returned an error): recorded as a terminal 500"
    );
}

/// Warns (feature `tracing`) when giving a key up failed: its lease then lapses at its deadline.
pub(super) fn released(result: &Result<(), Error>) {
    if let Err(e) = result {
        observe::warn!(
            "a lease could not be released: its key stays claimed until the lease lapses",
            error = observe::display(observe::Redacted(e)),
        );
    }
}

/// A failure as a warning shows it: the store's error (redacted: never the key), or a store call
/// that did not return (it panicked, or its task was cancelled).
struct Why<'a>(Option<&'a Error>);

impl std::fmt::Display for Why<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(e) => observe::Redacted(e).fmt(f),
            None => f.write_str("the store call did not return (it panicked or was cancelled)"),
        }
    }
}

/// What one [`IdempotencyLayer`](super::IdempotencyLayer) (with its clones and the services they built) has seen since
/// it was built: [`IdempotencyLayer::metrics`](super::IdempotencyLayer::metrics). The counters that should stay at zero in a
/// healthy service are warnings worth an alert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct LayerMetrics {
    /// Answers recorded without their body because they were over the store's
    /// `max_response_bytes`; their replays carry [`IDEMPOTENT_BODY_OMITTED`](super::IDEMPOTENT_BODY_OMITTED). Raise the cap or
    /// answer with a pointer (`Location`) instead of a large body.
    pub bodies_not_kept: u64,
    /// Covered requests answered `503` + `Retry-After` because [`LayerMetrics::max_in_flight`]
    /// store admissions were already running. Nothing ran for them.
    pub overloaded: u64,
    /// Handlers that failed after they started (panicked, their response body failed, or the
    /// inner service returned an error) and were recorded as a terminal `500`.
    pub handler_failures: u64,
    /// Answers the layer could not record after the handler ran (a store failure, a lost
    /// lease). The key was not released: its lease lapses at its deadline, and only then may a
    /// retry run the handler again.
    pub not_recorded: u64,
    /// Heartbeats of a running handler's lease that failed. A transient failure (the store's
    /// queue full, a failed store call) is retried at once after a short pause, so the lease
    /// does not lapse under the handler; only a failure no retry mends ends the heartbeats (the
    /// lease was lost, the store fail-stopped), and the answer is then not recorded. A few
    /// under a load peak are harmless; a steady rise means the store is saturated.
    pub heartbeat_failures: u64,
    /// Store admissions running at the moment of the snapshot.
    pub in_flight: usize,
    /// The bound on them ([`IdempotencyLayer::max_in_flight`](super::IdempotencyLayer::max_in_flight)).
    pub max_in_flight: usize,
}
