//! What idem tells `tracing` (feature `tracing`): a span per observed call with its decision
//! and the kind of its error, a `debug!` per group-commit batch, and the `warn!` and `debug!`
//! events of the crate. Without the feature the same names exist and do nothing: the macros
//! type-check their values and never evaluate them, [`display`] is the value itself, a
//! [`CallSpan`] holds nothing.

#[cfg(feature = "tracing")]
mod imp {
    use std::time::Duration;

    use crate::error::Error;
    use crate::runtime::observe::{Decision, Engine, Kind};

    /// A `tracing::warn!` event.
    macro_rules! warn_event {
        ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {
            ::tracing::warn!($($k = $v,)* $msg)
        };
    }
    pub(crate) use warn_event as warn;

    /// A `tracing::debug!` event.
    macro_rules! debug_event {
        ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {
            ::tracing::debug!($($k = $v,)* $msg)
        };
    }
    pub(crate) use debug_event as debug;

    /// A field value shown with its `Display` (`tracing::field::display`).
    pub(crate) fn display<T: std::fmt::Display>(value: T) -> ::tracing::field::DisplayValue<T> {
        ::tracing::field::display(value)
    }

    /// The span of one observed call.
    pub(crate) struct CallSpan(::tracing::Span);

    impl CallSpan {
        /// The span of a call of `kind` (its name must be a literal, hence one arm per kind).
        pub(crate) fn start(
            engine: Engine,
            kind: Kind,
            tenant: Option<&str>,
            operation: &str,
        ) -> CallSpan {
            macro_rules! call_span {
                ($name:literal) => {
                    ::tracing::info_span!(
                        $name,
                        engine = engine.name(),
                        tenant = tenant,
                        operation = operation,
                        decision = ::tracing::field::Empty,
                        error = ::tracing::field::Empty,
                    )
                };
            }
            CallSpan(match kind {
                Kind::Execute => call_span!("execute"),
                Kind::Begin => call_span!("begin"),
                Kind::Finish => call_span!("finish"),
                Kind::Process => call_span!("process"),
                Kind::Receive => call_span!("receive"),
            })
        }

        /// Enters the span until the guard drops.
        #[inline]
        pub(crate) fn enter(&self) -> ::tracing::span::Entered<'_> {
            self.0.enter()
        }

        /// Records the call's `decision`, and the kind of its `error` if it failed.
        pub(crate) fn record(&self, decision: Decision, error: Option<&Error>) {
            self.0.record("decision", decision.name());
            if let Some(e) = error {
                self.0.record("error", error_kind(e));
            }
            ::tracing::debug!(parent: &self.0, decision = decision.name(), "decided");
        }
    }

    /// A group-commit batch ended (see `observe::batch`): its `debug!` event.
    pub(crate) fn batch(engine: Engine, size: usize, reruns: u32, commit: Option<Duration>) {
        ::tracing::debug!(
            engine = engine.name(),
            size,
            reruns,
            committed = commit.is_some(),
            commit_us = commit.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
            "group commit batch"
        );
    }

    /// The kind of an error, as the span's `error` field: the variant, never its text.
    fn error_kind(e: &Error) -> &'static str {
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
            Error::UnsupportedJournal { .. } => "unsupported_journal",
            Error::CorruptStore { .. } => "corrupt_store",
            Error::ExpiryIndexMismatch { .. } => "expiry_index_mismatch",
            Error::NeedsRecovery => "needs_recovery",
            Error::JournalNeedsReplay => "journal_needs_replay",
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
}

#[cfg(not(feature = "tracing"))]
mod imp {
    use std::time::Duration;

    use crate::error::Error;
    use crate::runtime::observe::{Decision, Engine, Kind};

    /// Nothing: its values are type-checked, never evaluated.
    macro_rules! warn_event {
        ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {{
            $(let _ = || {
                let _ = &$v;
            };)*
        }};
    }
    pub(crate) use warn_event as warn;

    /// Nothing: its values are type-checked, never evaluated.
    macro_rules! debug_event {
        ($msg:literal $(, $k:ident = $v:expr)* $(,)?) => {{
            $(let _ = || {
                let _ = &$v;
            };)*
        }};
    }
    pub(crate) use debug_event as debug;

    /// The value itself.
    pub(crate) fn display<T>(value: T) -> T {
        value
    }

    /// No span.
    pub(crate) struct CallSpan;

    /// The guard of no span.
    pub(crate) struct Entered;

    impl CallSpan {
        #[inline]
        pub(crate) fn start(
            _engine: Engine,
            _kind: Kind,
            _tenant: Option<&str>,
            _operation: &str,
        ) -> CallSpan {
            CallSpan
        }

        /// Enters nothing.
        #[inline]
        pub(crate) fn enter(&self) -> Entered {
            Entered
        }

        #[inline]
        pub(crate) fn record(&self, _decision: Decision, _error: Option<&Error>) {}
    }

    #[inline]
    pub(crate) fn batch(_engine: Engine, _size: usize, _reruns: u32, _commit: Option<Duration>) {}
}

pub(crate) use imp::{CallSpan, batch, debug, display, warn};
