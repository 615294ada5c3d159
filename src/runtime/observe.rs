//! What idem tells `tracing` (feature `tracing`) and the `metrics` facade (feature `metrics`),
//! for both engines. Call sites stay one line each, and without the features every item here is
//! empty or constant, so nothing of `tracing` or `metrics` is compiled and the calls compile to
//! nothing:
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
//! subscribers, webhook sources) are a small fixed set; tenants are never a label.

// Without the features, the decisions are computed by nothing.
#![cfg_attr(not(any(feature = "tracing", feature = "metrics")), allow(dead_code))]

use std::time::Duration;

use crate::error::Error;
use crate::model::marks::Consumed;
use crate::model::outbox::OutboxStats;
use crate::model::reports::Stats;
use crate::model::response::{Begin, Outcome, Response};
use crate::model::scope::Scope;

/// A `tracing::warn!` event with feature `tracing`; nothing otherwise (its values are still
/// type-checked, never evaluated).
#[cfg(feature = "tracing")]
macro_rules! warn_event {
    ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {
        ::tracing::warn!($($k = $v,)* $msg)
    };
}
#[cfg(not(feature = "tracing"))]
macro_rules! warn_event {
    ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {{
        $(let _ = || {
            let _ = &$v;
        };)*
    }};
}

pub(crate) use warn_event as warn;

/// A `tracing::debug!` event with feature `tracing`; nothing otherwise (its values are still
/// type-checked, never evaluated).
#[cfg(feature = "tracing")]
macro_rules! debug_event {
    ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {
        ::tracing::debug!($($k = $v,)* $msg)
    };
}
#[cfg(not(feature = "tracing"))]
macro_rules! debug_event {
    ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {{
        $(let _ = || {
            let _ = &$v;
        };)*
    }};
}

pub(crate) use debug_event as debug;

/// A field value shown with its `Display` (`tracing::field::display`); the value itself without
/// feature `tracing`.
#[cfg(feature = "tracing")]
pub(crate) fn display<T: std::fmt::Display>(value: T) -> tracing::field::DisplayValue<T> {
    tracing::field::display(value)
}
/// A field value shown with its `Display`; the value itself without feature `tracing`.
#[cfg(not(feature = "tracing"))]
pub(crate) fn display<T>(value: T) -> T {
    value
}

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

impl Decided for Outcome {
    fn decision(&self) -> Decision {
        match self {
            Outcome::Executed(_) => Decision::Executed,
            Outcome::Replayed(_) => Decision::Replayed,
            Outcome::InFlight { .. } => Decision::InFlight,
            Outcome::Expired(_) => Decision::Expired,
        }
    }
}

impl<L: Attempted> Decided for Begin<L> {
    fn decision(&self) -> Decision {
        match self {
            Begin::Acquired(lease) if lease.attempt_number() > 1 => Decision::Takeover,
            Begin::Acquired(_) => Decision::Acquired,
            Begin::Replayed(_) => Decision::Replayed,
            Begin::InFlight { .. } => Decision::InFlight,
            Begin::Expired(_) => Decision::Expired,
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
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    #[cfg(feature = "metrics")]
    kind: Kind,
    #[cfg(feature = "metrics")]
    operation: String,
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    took_over: std::cell::Cell<bool>,
}

/// The span of a call of `kind` (its name must be a literal, hence one arm per kind).
#[cfg(feature = "tracing")]
fn span(engine: Engine, kind: Kind, tenant: Option<&str>, operation: &str) -> tracing::Span {
    macro_rules! call_span {
        ($name:literal) => {
            tracing::info_span!(
                $name,
                engine = engine.name(),
                tenant = tenant,
                operation = operation,
                decision = tracing::field::Empty,
                error = tracing::field::Empty,
            )
        };
    }
    match kind {
        Kind::Execute => call_span!("execute"),
        Kind::Begin => call_span!("begin"),
        Kind::Finish => call_span!("finish"),
        Kind::Process => call_span!("process"),
        Kind::Receive => call_span!("receive"),
    }
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
    #[allow(unused_variables)]
    fn start(engine: Engine, kind: Kind, tenant: Option<&str>, operation: &str) -> Call {
        #[cfg(feature = "metrics")]
        describe();
        Call {
            #[cfg(feature = "tracing")]
            span: span(engine, kind, tenant, operation),
            #[cfg(feature = "metrics")]
            kind,
            #[cfg(feature = "metrics")]
            operation: operation.to_owned(),
            #[cfg(any(feature = "tracing", feature = "metrics"))]
            took_over: std::cell::Cell::new(false),
        }
    }

    /// Runs the call `f` inside its span, records its decision, and returns its result.
    #[inline]
    pub(crate) fn observe<T: Decided>(
        self,
        f: impl FnOnce(&Call) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let result = {
            #[cfg(feature = "tracing")]
            let _entered = self.span.enter();
            f(&self)
        };
        self.finish(result)
    }

    /// The call ran over a lapsed lease: an `Executed` answer is recorded as a takeover.
    #[inline]
    pub(crate) fn took_over(&self) {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        self.took_over.set(true);
    }

    /// Records the call's decision, and returns its result.
    #[inline]
    fn finish<T: Decided>(self, result: Result<T, Error>) -> Result<T, Error> {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        self.record(&result);
        result
    }

    #[cfg(any(feature = "tracing", feature = "metrics"))]
    fn record<T: Decided>(self, result: &Result<T, Error>) {
        let decision = match result {
            Ok(v) => match v.decision() {
                Decision::Executed if self.took_over.get() => Decision::Takeover,
                d => d,
            },
            Err(e) => Decision::of_error(e),
        };
        #[cfg(feature = "tracing")]
        {
            self.span.record("decision", decision.name());
            if let Err(e) = result {
                self.span.record("error", error_kind(e));
            }
            tracing::debug!(parent: &self.span, decision = decision.name(), "decided");
        }
        #[cfg(feature = "metrics")]
        {
            metrics::counter!(
                "idem_outcomes_total",
                "call" => self.kind.name(),
                "operation" => self.operation,
                "outcome" => decision.name(),
            )
            .increment(1);
            match decision {
                Decision::Takeover => metrics::counter!("idem_lease_takeovers_total").increment(1),
                Decision::Mismatch => metrics::counter!("idem_payload_mismatch_total").increment(1),
                Decision::LeaseLost => metrics::counter!("idem_lease_lost_total").increment(1),
                _ => {}
            }
        }
    }
}

/// Counts a lease call (a heartbeat) answered [`Error::LeaseLost`]: `idem_lease_lost_total`.
/// For `Result::inspect_err`.
#[inline]
pub(crate) fn lease_error(e: &Error) {
    #[cfg(feature = "metrics")]
    if let Error::LeaseLost { .. } = e {
        metrics::counter!("idem_lease_lost_total").increment(1);
    }
    let _ = e;
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
    #[cfg(feature = "metrics")]
    metrics::counter!("idem_busy_total").increment(1);
}

/// Times what the features report (a commit, a queue wait); holds nothing without them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stopwatch {
    #[cfg(any(feature = "tracing", feature = "metrics"))]
    at: std::time::Instant,
}

impl Stopwatch {
    #[inline]
    pub(crate) fn start() -> Stopwatch {
        Stopwatch {
            #[cfg(any(feature = "tracing", feature = "metrics"))]
            at: std::time::Instant::now(),
        }
    }

    /// The time since [`Stopwatch::start`] (zero without the features).
    #[inline]
    pub(crate) fn elapsed(&self) -> Duration {
        #[cfg(any(feature = "tracing", feature = "metrics"))]
        let elapsed = self.at.elapsed();
        #[cfg(not(any(feature = "tracing", feature = "metrics")))]
        let elapsed = Duration::ZERO;
        elapsed
    }
}

/// A group-commit batch ended: `size` members, `reruns` re-runs before it ended, and the time
/// its commit took (`None`: nobody wrote, nothing was committed), on `engine`.
#[inline]
#[allow(unused_variables)]
pub(crate) fn batch(engine: Engine, size: usize, reruns: u32, commit: Option<Duration>) {
    #[cfg(feature = "tracing")]
    tracing::debug!(
        engine = engine.name(),
        size,
        reruns,
        committed = commit.is_some(),
        commit_us = commit.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        "group commit batch"
    );
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::histogram!("idem_commit_batch_size").record(size as f64);
        if let Some(d) = commit {
            metrics::histogram!("idem_commit_seconds").record(d.as_secs_f64());
        }
    }
}

/// How long a write call waited for its turn in a batch: `idem_queue_wait_seconds`, recorded
/// once, when its work first runs.
#[derive(Debug)]
pub(crate) struct QueueWait {
    #[cfg(feature = "metrics")]
    since: Option<std::time::Instant>,
}

impl QueueWait {
    #[inline]
    pub(crate) fn start() -> QueueWait {
        QueueWait {
            #[cfg(feature = "metrics")]
            since: Some(std::time::Instant::now()),
        }
    }

    /// The call's work runs now.
    #[inline]
    pub(crate) fn ended(&mut self) {
        #[cfg(feature = "metrics")]
        if let Some(since) = self.since.take() {
            metrics::histogram!("idem_queue_wait_seconds").record(since.elapsed().as_secs_f64());
        }
    }
}

/// The outbox's backlog: the gauges `idem_outbox_pending` and `idem_outbox_dead_letters`.
/// For `Result::inspect` on `outbox_stats`.
#[inline]
pub(crate) fn outbox(stats: &OutboxStats) {
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::gauge!("idem_outbox_pending").set(stats.pending as f64);
        metrics::gauge!("idem_outbox_dead_letters").set(stats.dead as f64);
    }
    let _ = stats;
}

/// The records by stored state: the gauge `idem_records{state}` (`pending`, `completed`,
/// `failed`, `tombstone`). For `Result::inspect` on `stats`.
#[inline]
pub(crate) fn records(stats: &Stats) {
    #[cfg(feature = "metrics")]
    {
        describe();
        for (state, n) in [
            ("pending", stats.pending),
            ("completed", stats.completed),
            ("failed", stats.failed),
            ("tombstone", stats.tombstones),
        ] {
            metrics::gauge!("idem_records", "state" => state).set(n as f64);
        }
    }
    let _ = stats;
}

/// An open repaired a file that was not closed cleanly, in `took`: a warning with its
/// `seconds`, the counter `idem_repairs_total` and the histogram `idem_repair_seconds`.
#[inline]
pub(crate) fn repaired(took: Duration) {
    warn!(
        "the store file was repaired after an unclean shutdown",
        seconds = took.as_secs_f64()
    );
    #[cfg(feature = "metrics")]
    {
        describe();
        metrics::counter!("idem_repairs_total").increment(1);
        metrics::histogram!("idem_repair_seconds").record(took.as_secs_f64());
    }
}

/// Runs `f` with feature `metrics` only (a read whose only use is a gauge: the records after a
/// sweep pass).
#[inline]
#[allow(unused_variables)]
pub(crate) fn with_metrics(f: impl FnOnce()) {
    #[cfg(feature = "metrics")]
    f();
}

/// True at most once per `period` with feature `metrics` (never without): how often a
/// dispatcher refreshes the outbox gauges.
#[derive(Debug)]
pub(crate) struct Every {
    #[cfg(feature = "metrics")]
    period: Duration,
    #[cfg(feature = "metrics")]
    last: Option<std::time::Instant>,
}

impl Every {
    #[inline]
    #[allow(unused_variables)]
    pub(crate) fn new(period: Duration) -> Every {
        Every {
            #[cfg(feature = "metrics")]
            period,
            #[cfg(feature = "metrics")]
            last: None,
        }
    }

    /// Whether the period has passed since the last time this said so.
    #[inline]
    pub(crate) fn due(&mut self) -> bool {
        #[cfg(feature = "metrics")]
        let due = {
            let now = std::time::Instant::now();
            let due = self
                .last
                .is_none_or(|at| now.duration_since(at) >= self.period);
            if due {
                self.last = Some(now);
            }
            due
        };
        #[cfg(not(feature = "metrics"))]
        let due = false;
        due
    }
}

/// The metrics' descriptions (help texts and units), given to the installed recorder once.
#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        describe_counter!(
            "idem_outcomes_total",
            "Calls by call (execute, begin, finish, process, receive), operation and outcome \
             (executed, replayed, in_flight, expired, acquired, takeover, duplicate, rejected, \
             mismatch, lease_lost, busy, aborted, error)"
        );
        describe_counter!(
            "idem_lease_takeovers_total",
            "Lapsed leases taken over by a new attempt"
        );
        describe_counter!(
            "idem_lease_lost_total",
            "Lease calls (heartbeat, finish) refused because the lease was lost"
        );
        describe_counter!(
            "idem_payload_mismatch_total",
            "Requests refused because their key was used with a different payload"
        );
        describe_counter!(
            "idem_busy_total",
            "Write calls turned away because the commit queue stayed full"
        );
        describe_histogram!(
            "idem_commit_batch_size",
            Unit::Count,
            "Members of each group-commit batch"
        );
        describe_histogram!(
            "idem_commit_seconds",
            Unit::Seconds,
            "Time each group commit took (the commit, with its fsync or round trip)"
        );
        describe_histogram!(
            "idem_queue_wait_seconds",
            Unit::Seconds,
            "Time a write call waited for its turn in a group-commit batch"
        );
        describe_counter!(
            "idem_repairs_total",
            "Opens that repaired a store file not closed cleanly (unclean restarts without quick-repair)"
        );
        describe_histogram!(
            "idem_repair_seconds",
            Unit::Seconds,
            "Time each such repair took (a walk of the whole file)"
        );
        describe_gauge!("idem_outbox_pending", "Outbox events not yet delivered");
        describe_gauge!(
            "idem_outbox_dead_letters",
            "Outbox events in the dead letters"
        );
        describe_gauge!(
            "idem_records",
            "Records by stored state (pending, completed, failed, tombstone), as last counted"
        );
    });
}

/// The kind of an error, as the span's `error` field: the variant, never its text.
#[cfg(feature = "tracing")]
pub(crate) fn error_kind(e: &Error) -> &'static str {
    match e {
        Error::Empty { .. } => "empty",
        Error::TooLong { .. } => "too_long",
        Error::PayloadMismatch { .. } => "payload_mismatch",
        Error::LeaseLost { .. } => "lease_lost",
        Error::ResponseTooLarge { .. } => "response_too_large",
        Error::Fingerprint { .. } => "fingerprint",
        Error::AnswerEncoding { .. } => "answer_encoding",
        Error::Aborted { .. } => "aborted",
        Error::ReservedTable { .. } => "reserved_table",
        Error::CorruptRecord { .. } => "corrupt_record",
        Error::UnsupportedFormat { .. } => "unsupported_format",
        Error::CorruptStore { .. } => "corrupt_store",
        Error::ExpiryIndexMismatch { .. } => "expiry_index_mismatch",
        Error::NeedsRecovery => "needs_recovery",
        Error::RepairAborted => "repair_aborted",
        Error::AlreadyOpen { .. } => "already_open",
        Error::Config { .. } => "config",
        Error::OutcomeUnknown { .. } => "outcome_unknown",
        Error::Busy { .. } => "busy",
        Error::Internal { .. } => "internal",
        Error::FailStopped { .. } => "fail_stopped",
        Error::Storage { .. } => "storage",
        Error::Reentrant => "reentrant",
        Error::InUse { .. } => "in_use",
        Error::Spawn { .. } => "spawn",
        Error::Random { .. } => "random",
    }
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
        assert_eq!(Begin::Acquired(Attempt(1)).decision(), Decision::Acquired);
        assert_eq!(Begin::Acquired(Attempt(2)).decision(), Decision::Takeover);
    }
}
