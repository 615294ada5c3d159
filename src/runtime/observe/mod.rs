//! What idem tells `tracing` (feature `tracing`) and the `metrics` facade (feature `metrics`),
//! for both engines. Call sites stay one line each, and without the features every item here is
//! empty or constant (a [`Call`] keeps one flag, never set), so nothing of `tracing` or
//! `metrics` is compiled and the calls compile to nothing:
//!
//! - [`Call::observe`]: one span per `execute`, `begin`, lease finish, `process` and `receive`
//!   (`engine`, `tenant`, `operation`, then `decision` and, on an error, `error`: the error's
//!   kind), and the counter `idem_outcomes_total{call, operation, outcome}` with
//!   `idem_lease_takeovers_total`, `idem_payload_mismatch_total` and `idem_lease_lost_total`;
//! - [`batch`]: a `debug!` per group-commit batch (size, re-runs, commit time) and the
//!   histograms `idem_commit_batch_size` and `idem_commit_seconds`; [`QueueWait`]:
//!   `idem_queue_wait_seconds`; [`busy`]: `idem_busy_total`; [`repaired`]: a warning,
//!   `idem_repairs_total` and `idem_repair_seconds`;
//! - [`outbox`] and [`records`]: the gauges `idem_outbox_pending`, `idem_outbox_dead_letters`
//!   and `idem_records{state}`;
//! - [`debug!`]: a debug event (the read of a file before its repair), fields as for `warn!`;
//! - [`warn!`]: a warning for a failure idem handles without returning it to a caller, with
//!   fields `name = value` (`value` a `tracing` value: a number, a `&str`, or [`display`] of
//!   anything else).
//!
//! Keys and payloads are never recorded, in a field, a label or a message: an error is shown
//! through [`Redacted`]. Labels have bounded cardinality as long as operations (and inbox
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the face every call site uses, the same with or without the features: what a call decided ([`Decision`], [`Decided`]), [`Call`], the batch, lease, queue and gauge reports, [`Stopwatch`], [`Redacted`] |
//! | `tracing.rs` | what goes to `tracing`: the call spans, the batch event, `warn!`, `debug!`, [`display`], the error kinds; without feature `tracing`, the same names doing nothing |
//! | `metrics.rs` | what goes to the `metrics` facade: the counters, gauges and histograms and their descriptions, [`QueueWait`], [`Every`]; without feature `metrics`, the same names doing nothing |
//!
//! The two feature files are the only places that name `tracing` or `metrics`; this file
//! decides nothing per feature beyond [`ENABLED`].

mod metrics;
mod tracing;

use std::cell::Cell;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::model::marks::Consumed;
use crate::model::outbox::OutboxStats;
use crate::model::reports::Stats;
use crate::model::response::{BeginAnswer, ExecuteAnswer, Response};
use crate::model::scope::Scope;

pub(crate) use self::metrics::{Every, QueueWait, with_metrics};
pub(crate) use self::tracing::{debug, display, warn};

/// Whether anything is reported (feature `tracing` or `metrics`): without either, no call's
/// decision is worked out and no clock is read for a report.
const ENABLED: bool = cfg!(any(feature = "tracing", feature = "metrics"));

/// Which engine a call ran on: the `engine` field. Each engine names itself (`ENGINE` in its
/// store's file): this layer names no engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Engine(pub(crate) &'static str);

impl Engine {
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) const fn name(self) -> &'static str {
        self.0
    }
}

/// Which call: the span's name and the `call` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Flow A (`execute`).
    Execute,
    /// Flow B's claim (`begin`).
    Begin,
    /// A lease's finish (`complete`, `fail`, `complete_with`).
    Finish,
    /// The inbox (`process`).
    Process,
    /// Webhook receipts (`receive`).
    Receive,
}

impl Kind {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Kind::Execute => "execute",
            Kind::Begin => "begin",
            Kind::Finish => "finish",
            Kind::Process => "process",
            Kind::Receive => "receive",
        }
    }
}

/// What a call decided: the span's `decision` field and the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The closure ran and its result was recorded (flow A, a lease's finish, an inbox message
    /// or webhook processed).
    Executed,
    /// A finished intent's stored answer.
    Replayed,
    /// Another attempt holds a live lease.
    InFlight,
    /// Only the tombstone is left.
    Expired,
    /// Flow B claimed a free key.
    Acquired,
    /// A lapsed lease was taken over (flow B's claim, or flow A running over it).
    Takeover,
    /// An inbox message or webhook delivery already processed.
    Duplicate,
    /// An inbox message or webhook delivery rejected (`Abort::Terminal`), and recorded so.
    Rejected,
    /// The key was used with a different payload.
    Mismatch,
    /// The lease was lost.
    LeaseLost,
    /// The store's queue was full.
    Busy,
    /// The closure asked for a retry: nothing was recorded.
    Aborted,
    /// Any other error.
    Error,
}

impl Decision {
    #[cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Decision::Executed => "executed",
            Decision::Replayed => "replayed",
            Decision::InFlight => "in_flight",
            Decision::Expired => "expired",
            Decision::Acquired => "acquired",
            Decision::Takeover => "takeover",
            Decision::Duplicate => "duplicate",
            Decision::Rejected => "rejected",
            Decision::Mismatch => "mismatch",
            Decision::LeaseLost => "lease_lost",
            Decision::Busy => "busy",
            Decision::Aborted => "aborted",
            Decision::Error => "error",
        }
    }

    fn of_error(e: &Error) -> Decision {
        match e {
            Error::PayloadMismatch { .. } => Decision::Mismatch,
            Error::LeaseLost { .. } => Decision::LeaseLost,
            Error::Busy { .. } => Decision::Busy,
            Error::Aborted { .. } => Decision::Aborted,
            _ => Decision::Error,
        }
    }
}

/// An answer a call's decision can be read from.
pub(crate) trait Decided {
    fn decision(&self) -> Decision;
}

/// A lease, as far as its claim's decision goes: its attempt number (above 1 after a takeover).
pub(crate) trait Attempted {
    fn attempt_number(&self) -> u32;
}

impl Decided for ExecuteAnswer {
    fn decision(&self) -> Decision {
        match self {
            ExecuteAnswer::Ran(_) => Decision::Executed,
            ExecuteAnswer::Replayed(_) => Decision::Replayed,
            ExecuteAnswer::InFlight { .. } => Decision::InFlight,
            ExecuteAnswer::Expired(_) => Decision::Expired,
        }
    }
}

impl<L: Attempted> Decided for BeginAnswer<L> {
    fn decision(&self) -> Decision {
        match self {
            BeginAnswer::Acquired(lease) if lease.attempt_number() > 1 => Decision::Takeover,
            BeginAnswer::Acquired(_) => Decision::Acquired,
            BeginAnswer::Replayed(_) => Decision::Replayed,
            BeginAnswer::InFlight { .. } => Decision::InFlight,
            BeginAnswer::Expired(_) => Decision::Expired,
        }
    }
}

impl<T> Decided for Consumed<T> {
    fn decision(&self) -> Decision {
        match self {
            Consumed::Ran(_) => Decision::Executed,
            Consumed::Rejected(_) => Decision::Rejected,
            Consumed::Duplicate(..) => Decision::Duplicate,
        }
    }
}

impl Decided for Response {
    fn decision(&self) -> Decision {
        Decision::Executed
    }
}

/// One observed call: its span (feature `tracing`) and its outcome counter (feature `metrics`).
/// [`Call::observe`] runs the call inside the span and records its decision.
#[must_use]
pub(crate) struct Call {
    span: tracing::CallSpan,
    meter: metrics::CallMeter,
    took_over: Cell<bool>,
}

impl Call {
    /// A call of `kind` on `engine` for `scope` (its tenant and operation are recorded).
    #[inline]
    pub(crate) fn of(engine: Engine, kind: Kind, scope: &Scope) -> Call {
        Call::start(engine, kind, Some(scope.tenant()), scope.operation())
    }

    /// A call with no tenant: an inbox message (`operation` is the subscriber) or a webhook
    /// delivery (`operation` is the source).
    #[inline]
    pub(crate) fn consume(engine: Engine, webhook: bool, operation: &str) -> Call {
        let kind = if webhook {
            Kind::Receive
        } else {
            Kind::Process
        };
        Call::start(engine, kind, None, operation)
    }

    #[inline]
    fn start(engine: Engine, kind: Kind, tenant: Option<&str>, operation: &str) -> Call {
        let meter = metrics::CallMeter::start(kind, operation);
        Call {
            span: tracing::CallSpan::start(engine, kind, tenant, operation),
            meter,
            took_over: Cell::new(false),
        }
    }

    /// Runs the call `f` inside its span, records its decision, and returns its result.
    #[inline]
    pub(crate) fn observe<T: Decided>(
        self,
        f: impl FnOnce(&Call) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let result = {
            let _entered = self.span.enter();
            f(&self)
        };
        self.finish(result)
    }

    /// The call ran over a lapsed lease: an `Ran` answer is recorded as a takeover.
    #[inline]
    pub(crate) fn took_over(&self) {
        if ENABLED {
            self.took_over.set(true);
        }
    }

    /// Records the call's decision, and returns its result.
    #[inline]
    fn finish<T: Decided>(self, result: Result<T, Error>) -> Result<T, Error> {
        if ENABLED {
            self.record(&result);
        }
        result
    }

    fn record<T: Decided>(self, result: &Result<T, Error>) {
        let decision = match result {
            Ok(v) => match v.decision() {
                Decision::Executed if self.took_over.get() => Decision::Takeover,
                d => d,
            },
            Err(e) => Decision::of_error(e),
        };
        self.span.record(decision, result.as_ref().err());
        self.meter.record(decision);
    }
}

/// Counts a lease call (a heartbeat) answered [`Error::LeaseLost`]: `idem_lease_lost_total`.
/// For `Result::inspect_err`.
#[inline]
pub(crate) fn lease_error(e: &Error) {
    if let Error::LeaseLost { .. } = e {
        metrics::lease_lost();
    }
}

/// Warns that a lease dropped unfinished could not be released (either engine's `Drop`): its
/// key stays claimed until the lease lapses.
pub(crate) fn unreleased_lease(operation: &str, e: &Error) {
    warn!(
        "a lease dropped unfinished could not be released: its key stays claimed until the lease lapses",
        operation = operation,
        error = display(Redacted(e)),
    );
}

/// Counts a caller turned away by a full queue: `idem_busy_total`.
#[inline]
pub(crate) fn busy() {
    metrics::busy();
}

/// Times what the features report (a commit, a queue wait); holds nothing without them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    at: Option<Instant>,
}

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Stopwatch {
        Stopwatch {
            at: ENABLED.then(Instant::now),
        }
    }

    /// The time since [`Stopwatch::start`] (zero without the features).
    #[inline]
    pub(crate) fn elapsed(&self) -> Duration {
        self.at.map_or(Duration::ZERO, |at| at.elapsed())
    }
}

/// A group-commit batch ended: `size` members, `reruns` re-runs before it ended, and the time
/// its commit took (`None`: nobody wrote, nothing was committed), on `engine`.
#[inline]
pub(crate) fn batch(engine: Engine, size: usize, reruns: u32, commit: Option<Duration>) {
    tracing::batch(engine, size, reruns, commit);
    metrics::batch(size, commit);
}

/// The outbox's backlog: the gauges `idem_outbox_pending` and `idem_outbox_dead_letters`.
/// For `Result::inspect` on `outbox_stats`.
#[inline]
pub(crate) fn outbox(stats: &OutboxStats) {
    metrics::outbox(stats);
}

/// The records by stored state: the gauge `idem_records{state}` (`pending`, `completed`,
/// `failed`, `tombstone`). For `Result::inspect` on `stats`.
#[inline]
pub(crate) fn records(stats: &Stats) {
    metrics::records(stats);
}

/// An open repaired a file that was not closed cleanly, in `took`: a warning with its
/// `seconds`, the counter `idem_repairs_total` and the histogram `idem_repair_seconds`.
#[inline]
pub(crate) fn repaired(took: Duration) {
    warn!(
        "the store file was repaired after an unclean shutdown",
        seconds = took.as_secs_f64()
    );
    metrics::repaired(took);
}

/// An error as a warning shows it: its message's first line, except for the errors that name
/// the key (a payload mismatch, a lost lease) or carry the caller's own error (an abort), which
/// are shown by their kind alone. The first line only: a server's error may add a `DETAIL` line
/// quoting row values (keys).
pub(crate) struct Redacted<'a>(pub(crate) &'a Error);

impl std::fmt::Display for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Error::PayloadMismatch { .. } => {
                f.write_str("the key was already used with a different payload")
            }
            Error::LeaseLost { .. } => f.write_str("the lease was lost"),
            Error::Aborted { .. } => f.write_str("aborted with a retryable error"),
            e => {
                let text = e.to_string();
                f.write_str(text.lines().next().unwrap_or_default())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacted_errors_never_show_the_key() {
        let key = "secret-key-123";
        for e in [
            Error::PayloadMismatch {
                tenant: "t".into(),
                operation: "op".into(),
                key: key.into(),
            },
            Error::LeaseLost { key: key.into() },
            Error::Aborted { source: key.into() },
            Error::FailStopped {
                cause: format!("disk\nDETAIL: Key (record_key)=({key})"),
            },
        ] {
            let shown = Redacted(&e).to_string();
            assert!(!shown.contains(key), "{shown}");
            assert!(!shown.is_empty());
        }
    }

    #[test]
    fn takeovers_and_errors_have_their_own_decision() {
        assert_eq!(
            Decision::of_error(&Error::Busy {
                queued: 1,
                waited: Duration::from_millis(1)
            }),
            Decision::Busy
        );
        assert_eq!(
            Decision::of_error(&Error::Internal { what: "x" }),
            Decision::Error
        );
        struct Attempt(u32);
        impl Attempted for Attempt {
            fn attempt_number(&self) -> u32 {
                self.0
            }
        }
        assert_eq!(
            BeginAnswer::Acquired(Attempt(1)).decision(),
            Decision::Acquired
        );
        assert_eq!(
            BeginAnswer::Acquired(Attempt(2)).decision(),
            Decision::Takeover
        );
    }
}
