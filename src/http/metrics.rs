//! What the layer counts: [`LayerMetrics`], the snapshot an operator reads, and the counters
//! behind it, shared by a layer's clones.

use std::sync::atomic::{AtomicU64, Ordering};

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
