//! What idem tells the `metrics` facade (feature `metrics`): the outcome counters of each
//! observed call, the group-commit histograms, the queue wait, the busy and repair counts, the
//! outbox and record gauges, and their descriptions, given to the installed recorder once.
//! Without the feature the same names exist and do nothing: a [`CallMeter`] and a
//! [`QueueWait`] hold nothing, [`Every`] is never due, [`with_metrics`] does not run its
//! closure.

#[cfg(feature = "metrics")]
mod imp {
    use std::time::{Duration, Instant};

    use crate::model::outbox::OutboxStats;
    use crate::model::reports::Stats;
    use crate::runtime::observe::{Decision, Kind};

    /// The outcome counter of one observed call.
    pub(crate) struct CallMeter {
        kind: Kind,
        operation: String,
    }

    impl CallMeter {
        #[inline]
        pub(crate) fn start(kind: Kind, operation: &str) -> CallMeter {
            describe();
            CallMeter {
                kind,
                operation: operation.to_owned(),
            }
        }

        /// Counts the call's `decision`: `idem_outcomes_total`, and the takeover, mismatch and
        /// lost-lease counters.
        pub(crate) fn record(self, decision: Decision) {
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

    /// `idem_lease_lost_total`.
    #[inline]
    pub(crate) fn lease_lost() {
        metrics::counter!("idem_lease_lost_total").increment(1);
    }

    /// `idem_busy_total`.
    #[inline]
    pub(crate) fn busy() {
        metrics::counter!("idem_busy_total").increment(1);
    }

    /// `idem_commit_batch_size`, and `idem_commit_seconds` when the batch committed.
    #[inline]
    pub(crate) fn batch(size: usize, commit: Option<Duration>) {
        describe();
        metrics::histogram!("idem_commit_batch_size").record(size as f64);
        if let Some(d) = commit {
            metrics::histogram!("idem_commit_seconds").record(d.as_secs_f64());
        }
    }

    /// How long a write call waited for its turn in a batch: `idem_queue_wait_seconds`,
    /// recorded once, when its work first runs.
    #[derive(Debug)]
    pub(crate) struct QueueWait {
        since: Option<Instant>,
    }

    impl QueueWait {
        #[inline]
        pub(crate) fn start() -> QueueWait {
            QueueWait {
                since: Some(Instant::now()),
            }
        }

        /// The call's work runs now.
        #[inline]
        pub(crate) fn ended(&mut self) {
            if let Some(since) = self.since.take() {
                metrics::histogram!("idem_queue_wait_seconds")
                    .record(since.elapsed().as_secs_f64());
            }
        }
    }

    /// `idem_outbox_pending` and `idem_outbox_dead_letters`.
    #[inline]
    pub(crate) fn outbox(stats: &OutboxStats) {
        describe();
        metrics::gauge!("idem_outbox_pending").set(stats.pending as f64);
        metrics::gauge!("idem_outbox_dead_letters").set(stats.dead as f64);
    }

    /// `idem_records{state}`.
    #[inline]
    pub(crate) fn records(stats: &Stats) {
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

    /// `idem_repairs_total` and `idem_repair_seconds`.
    #[inline]
    pub(crate) fn repaired(took: Duration) {
        describe();
        metrics::counter!("idem_repairs_total").increment(1);
        metrics::histogram!("idem_repair_seconds").record(took.as_secs_f64());
    }

    /// Runs `f` (a read whose only use is a gauge: the records after a sweep pass).
    #[inline]
    pub(crate) fn with_metrics(f: impl FnOnce()) {
        f();
    }

    /// True at most once per `period`: how often a dispatcher refreshes the outbox gauges.
    #[derive(Debug)]
    pub(crate) struct Every {
        period: Duration,
        last: Option<Instant>,
    }

    impl Every {
        #[inline]
        pub(crate) fn new(period: Duration) -> Every {
            Every { period, last: None }
        }

        /// Whether the period has passed since the last time this said so.
        #[inline]
        pub(crate) fn due(&mut self) -> bool {
            let now = Instant::now();
            let due = self
                .last
                .is_none_or(|at| now.duration_since(at) >= self.period);
            if due {
                self.last = Some(now);
            }
            due
        }
    }

    /// The metrics' descriptions (help texts and units), given to the installed recorder once.
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
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    use crate::model::outbox::OutboxStats;
    use crate::model::reports::Stats;
    use crate::runtime::observe::{Decision, Kind};

    /// No counter.
    pub(crate) struct CallMeter;

    impl CallMeter {
        #[inline]
        pub(crate) fn start(_kind: Kind, _operation: &str) -> CallMeter {
            CallMeter
        }

        #[inline]
        pub(crate) fn record(self, _decision: Decision) {}
    }

    #[inline]
    pub(crate) fn lease_lost() {}

    #[inline]
    pub(crate) fn busy() {}

    #[inline]
    pub(crate) fn batch(_size: usize, _commit: Option<Duration>) {}

    /// Holds nothing.
    #[derive(Debug)]
    pub(crate) struct QueueWait;

    impl QueueWait {
        #[inline]
        pub(crate) fn start() -> QueueWait {
            QueueWait
        }

        #[inline]
        pub(crate) fn ended(&mut self) {}
    }

    #[inline]
    pub(crate) fn outbox(_stats: &OutboxStats) {}

    #[inline]
    pub(crate) fn records(_stats: &Stats) {}

    #[inline]
    pub(crate) fn repaired(_took: Duration) {}

    /// Does not run `f`.
    #[inline]
    pub(crate) fn with_metrics(_f: impl FnOnce()) {}

    /// Never due.
    #[derive(Debug)]
    pub(crate) struct Every;

    impl Every {
        #[inline]
        pub(crate) fn new(_period: Duration) -> Every {
            Every
        }

        #[inline]
        pub(crate) fn due(&mut self) -> bool {
            false
        }
    }
}

pub(crate) use imp::{
    CallMeter, Every, QueueWait, batch, busy, lease_lost, outbox, records, repaired, with_metrics,
};
