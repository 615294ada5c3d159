//! The conformance suite: one set of cases, written once against the [`Engine`] trait, run
//! against every engine (`conformance_redb`, `conformance_postgres`: modules of this binary).
//!
//! The trait states the operations at the level the cases need; what a closure does is a
//! [`Behavior`] (write one effect row, push outbox events, then answer, abort, fail a statement
//! or panic), which each engine turns into a closure over its own transaction handle (`&Tx` on
//! redb, `&mut PgTx` on PostgreSQL). Each engine's implementation lives next to this file
//! (`redb_engine.rs`, `pg_engine.rs`; the PostgreSQL one only with the `postgres` feature). [`conformance_tests!`] expands into one `#[test]` per
//! case; every case runs on a fresh store with a manual clock at `common::T0` and the settings
//! below.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use idem::clock::{Clock, ManualClock};
use idem::format::Record;
use idem::inbox::{HighWaterMark, Mark, ProcessAnswer, ReceiveAnswer};
use idem::keys::DownstreamKey;
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, Event, EventId, OutboxMetrics, OutboxStats,
    Publisher, StoredEvent,
};
use idem::rules::VersionCheck;
use idem::store::{Stats, SweepReport};
use idem::{
    BeginAnswer, Claim, Error, ExecuteAnswer, Request, Response, Scope, Timestamp, Tombstone,
};

mod closure_endings;
mod derived_values_are_engine_independent;
mod failure_cases;
mod inbox_marks;
mod keys_are_scoped_and_bound;
mod leases_are_fenced;
mod outbox_order;
mod retention_boundaries;
mod stale_versions_are_skipped;

pub use closure_endings::*;
pub use derived_values_are_engine_independent::*;
pub use failure_cases::*;
pub use inbox_marks::*;
pub use keys_are_scoped_and_bound::*;
pub use leases_are_fenced::*;
pub use outbox_order::*;
pub use retention_boundaries::*;
pub use stale_versions_are_skipped::*;

/// The response window every engine is opened with.
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// The tombstone horizon every engine is opened with.
pub const HORIZON: Duration = Duration::from_secs(7 * 24 * 3600);
/// The lease duration every engine is opened with.
pub const LEASE: Duration = Duration::from_secs(30);
/// How long inbox marks and webhook receipts live.
pub const INBOX_RETENTION: Duration = Duration::from_secs(3 * 24 * 3600);
/// One millisecond, the clock's resolution.
pub const MS: Duration = Duration::from_millis(1);
/// How long a case waits for another thread's progress (a dispatcher, a waiter).
pub const WAIT: Duration = Duration::from_secs(20);

/// How a closure given to the store ends, after its writes.
#[derive(Debug, Clone)]
pub enum End {
    /// `Ok(response)`.
    Answer(Response),
    /// `Err(Abort::Terminal(response))`.
    Terminal(Response),
    /// `Err(Abort::Retryable(..))`.
    Retryable,
    /// A statement of the caller's own storage fails and the closure returns its error with
    /// `?` (redb: a table opened with the wrong types; PostgreSQL: a query on a missing table).
    StoreError,
    /// The closure panics.
    Panic,
}

/// What a closure does: optionally check a version against its entity's high-water mark
/// (`tx.versions().advance`), bump one effect counter in the caller's own table (skipped when
/// the version is stale) and push outbox events, then end as [`End`] says. Counts its runs and
/// remembers what the last run's version check answered and the event ids its pushes returned.
#[derive(Debug)]
pub struct Behavior {
    version: Option<(String, u64)>,
    effect: Option<String>,
    events: Vec<Event>,
    end: End,
    runs: AtomicU32,
    checked: Mutex<Option<VersionCheck>>,
    pushed: Mutex<Vec<EventId>>,
}

impl Behavior {
    fn ending(end: End) -> Self {
        Behavior {
            version: None,
            effect: None,
            events: Vec::new(),
            end,
            runs: AtomicU32::new(0),
            checked: Mutex::new(None),
            pushed: Mutex::new(Vec::new()),
        }
    }

    /// Answers `Ok(response)`.
    pub fn answer(response: Response) -> Self {
        Self::ending(End::Answer(response))
    }

    /// Answers `Err(Abort::Terminal(response))`.
    pub fn terminal(response: Response) -> Self {
        Self::ending(End::Terminal(response))
    }

    /// Answers `Err(Abort::Retryable(..))`.
    pub fn retryable() -> Self {
        Self::ending(End::Retryable)
    }

    /// Fails one of the caller's own statements and returns its error.
    pub fn store_error() -> Self {
        Self::ending(End::StoreError)
    }

    /// Panics.
    pub fn panic() -> Self {
        Self::ending(End::Panic)
    }

    /// First checks `version` against `entity`'s high-water mark; a stale version skips the
    /// effect.
    pub fn version(mut self, entity: &str, version: u64) -> Self {
        self.version = Some((entity.to_owned(), version));
        self
    }

    /// Also bumps the effect counter `label` (before it ends).
    pub fn effect(mut self, label: &str) -> Self {
        self.effect = Some(label.to_owned());
        self
    }

    /// Also pushes `event` into the outbox (before it ends).
    pub fn push(mut self, event: Event) -> Self {
        self.events.push(event);
        self
    }

    /// How many times a closure of this behavior started.
    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }

    /// What the last run's version check answered.
    pub fn checked(&self) -> Option<VersionCheck> {
        *self.checked.lock().expect("checked")
    }

    /// The ids the pushes of the last run returned.
    pub fn pushed(&self) -> Vec<EventId> {
        self.pushed.lock().expect("pushed").clone()
    }

    // ---- for the engines' closures ----

    /// Counts a run; the engine calls it first thing in the closure.
    pub fn started(&self) {
        self.runs.fetch_add(1, Ordering::SeqCst);
        self.pushed.lock().expect("pushed").clear();
        *self.checked.lock().expect("checked") = None;
    }

    /// The version to check, if any.
    pub fn version_to_check(&self) -> Option<(&str, u64)> {
        self.version.as_ref().map(|(e, v)| (e.as_str(), *v))
    }

    /// Notes what the version check answered.
    pub fn note_checked(&self, check: VersionCheck) {
        *self.checked.lock().expect("checked") = Some(check);
    }

    /// The effect label to bump, if any (none after a stale version check).
    pub fn effect_label(&self) -> Option<&str> {
        let stale = self.checked().is_some_and(|c| !c.should_apply());
        self.effect.as_deref().filter(|_| !stale)
    }

    /// The events to push.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Notes the id a push returned.
    pub fn note_pushed(&self, id: EventId) {
        self.pushed.lock().expect("pushed").push(id);
    }

    /// How the closure ends.
    pub fn end(&self) -> &End {
        &self.end
    }
}

/// What the conformance cases do with a store, whatever the engine.
pub trait Engine: Sync + Sized {
    /// The engine's flow-B lease.
    type Lease: EngineLease;

    /// The manual clock the store decides by.
    fn clock(&self) -> &ManualClock;
    /// Flow A with a closure that does `behavior`.
    fn execute(&self, request: Request, behavior: &Behavior) -> Result<ExecuteAnswer, Error>;
    /// Flow B's claim.
    fn begin(&self, request: Request) -> Result<BeginAnswer<Self::Lease>, Error>;
    /// Flow B's claim for a [`Claim`] whose retries recognise the lease it already took.
    fn begin_claim(&self, claim: &mut Claim) -> Result<BeginAnswer<Self::Lease>, Error>;
    /// Flow B's claim, waiting up to `max_wait` for another attempt to finish.
    fn begin_wait(
        &self,
        request: Request,
        max_wait: Duration,
    ) -> Result<BeginAnswer<Self::Lease>, Error>;
    /// The inbox, with a closure that does `behavior` (its response is the processed value).
    fn process(
        &self,
        subscriber: &str,
        message_id: &str,
        behavior: &Behavior,
    ) -> Result<ProcessAnswer<Response>, Error>;
    /// Webhook receipts, with a closure that does `behavior`.
    fn receive(
        &self,
        source: &str,
        delivery_id: &str,
        behavior: &Behavior,
    ) -> Result<ReceiveAnswer<Response>, Error>;
    /// The stored inbox mark.
    fn inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<Option<Mark>, Error>;
    /// Removes an inbox mark.
    fn purge_inbox_mark(&self, subscriber: &str, message_id: &str) -> Result<bool, Error>;
    /// An entity's version high-water mark.
    fn high_water_mark(&self, entity: &str) -> Result<Option<HighWaterMark>, Error>;
    /// The committed value of the effect counter `label` in the caller's own table (0 if none).
    fn effects(&self, label: &str) -> u64;
    /// The stored record.
    fn get(&self, scope: &Scope, key: &str) -> Result<Option<Record>, Error>;
    /// Removes the record.
    fn purge(&self, scope: &Scope, key: &str) -> Result<bool, Error>;
    /// One sweep pass.
    fn sweep(&self) -> Result<SweepReport, Error>;
    /// Records by state.
    fn stats(&self) -> Result<Stats, Error>;
    /// Starts the outbox dispatcher.
    fn start_dispatcher<P: Publisher>(
        &self,
        publisher: P,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, Error>;
    /// Undelivered events in commit order.
    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, Error>;
    /// Dead letters, oldest first.
    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, Error>;
    /// Moves a dead letter back into the outbox.
    fn requeue_dead_letter(&self, seq: u64) -> Result<bool, Error>;
    /// Undelivered events and dead letters.
    fn outbox_stats(&self) -> Result<OutboxStats, Error>;
    /// This process's dispatcher counters.
    fn outbox_metrics(&self) -> OutboxMetrics;
    /// Replaces the store by a new one on the same storage and clock, as a restarted process
    /// opens it (nothing in memory survives).
    fn restart(&mut self);

    /// Moves the clock forward.
    fn advance(&self, d: Duration) {
        self.clock().advance(d);
    }
    /// Sets the clock.
    fn set_time(&self, t: Timestamp) {
        self.clock().set(t);
    }
    /// The clock's time.
    fn now(&self) -> Timestamp {
        self.clock().now()
    }
}

/// What the cases do with an engine's lease.
pub trait EngineLease: Sized + Send + std::fmt::Debug {
    /// The key for the provider.
    fn downstream_key(&self) -> DownstreamKey;
    /// 1 for the first attempt, +1 per takeover.
    fn attempt(&self) -> u32;
    /// `Some(previous attempt)` after a takeover.
    fn takeover_of(&self) -> Option<u32>;
    /// When the lease lapses.
    fn deadline(&self) -> Timestamp;
    /// Extends the lease.
    fn heartbeat(&mut self) -> Result<Timestamp, Error>;
    /// Records success.
    fn complete(self, response: Response) -> Result<Response, Error>;
    /// Records a terminal failure.
    fn fail(self, response: Response) -> Result<Response, Error>;
    /// Records the result of a closure that does `behavior`, with its writes.
    fn complete_with(self, behavior: &Behavior) -> Result<Response, Error>;
    /// Frees the key now.
    fn release(self) -> Result<(), Error>;
    /// The process holding the lease dies: nothing is released, the lease lapses at its
    /// deadline.
    fn crash(self) {
        std::mem::forget(self);
    }
}

/// Expands into one `#[test]` per conformance case, each opening a fresh engine with
/// `$open(case_name) -> Option<E>` (`None`: the engine is not available here, the case is
/// skipped).
macro_rules! conformance_tests {
    ($open:path) => {
        $crate::conformance::conformance_tests!(@cases $open;
            // The article's eight failure cases.
            lost_response_retry_replays_byte_for_byte,
            racing_identical_requests_cause_one_effect_and_one_answer,
            racing_begins_grant_one_lease,
            same_key_different_payload_is_a_mismatch_and_changes_nothing,
            consumer_crash_before_ack_redelivery_is_a_duplicate,
            webhook_replayed_with_the_same_delivery_id_is_a_duplicate,
            dispatcher_republish_keeps_the_event_id_and_the_inbox_applies_once,
            activity_crash_before_reporting_is_taken_over_with_the_same_downstream_key,
            late_retry_is_expired_within_the_horizon_and_runs_again_past_it,
            // Keys.
            same_key_under_another_tenant_or_operation_is_another_intent,
            composite_key_is_length_prefixed,
            mismatch_against_a_tombstone,
            // Leases.
            stale_holder_is_fenced_after_a_takeover,
            heartbeat_extends_and_release_frees_at_once,
            begin_wait_returns_the_result_another_attempt_finished,
            a_lapsed_lease_nobody_took_over_can_still_finish,
            execute_takes_over_a_lapsed_lease_and_fences_the_old_holder,
            begin_wait_takes_over_a_lease_that_lapses_while_waiting,
            in_flight_hint_is_the_remaining_lease_capped,
            a_heartbeat_under_a_backward_clock_keeps_the_granted_deadline,
            a_begin_retried_with_its_claim_takes_its_own_lease_at_once,
            // Retention.
            retention_boundaries_are_exact,
            sweep_shrinks_then_deletes_and_stats_count_states,
            purge_frees_the_key_and_fences_its_lease,
            sweep_spares_a_live_lease,
            // Inbox.
            inbox_ok_terminal_and_retryable,
            inbox_mark_is_forgotten_after_the_inbox_retention,
            purging_an_inbox_mark_lets_the_message_run_again,
            stale_versions_are_skipped_and_a_rollback_keeps_the_mark,
            // Outbox.
            outbox_publishes_each_key_in_commit_order_through_a_retry,
            dead_letter_holds_its_key_until_requeued_and_other_keys_go_on,
            undelivered_events_are_published_by_the_next_process,
            // Closures.
            retryable_and_store_errors_store_nothing_and_free_the_key,
            panic_unwinds_to_the_caller_and_stores_nothing,
            terminal_abort_is_a_failure_with_its_writes_committed,
            replay_is_the_first_answer_after_the_state_changed,
            oversized_responses_are_refused_and_rejections_are_kept_fitted,
            failure_flag_follows_the_stored_state,
            a_failing_caller_leaves_its_neighbours_outcomes_alone,
            // Derived values.
            ids_keys_and_encodings_are_the_same_on_every_engine,
            a_takeover_pushes_the_event_id_of_its_intent,
        );
    };
    (@cases $open:path; $($case:ident),+ $(,)?) => {
        $(
            #[test]
            fn $case() {
                if let Some(mut engine) = $open(stringify!($case)) {
                    $crate::conformance::$case(&mut engine);
                }
            }
        )+
    };
}
pub(crate) use conformance_tests;

// ---- helpers shared by the cases ----

/// A request whose payload is canonical bytes.
pub fn req(tenant: &str, operation: &str, key: &str, payload: &[u8]) -> Request {
    Request::from_canonical_bytes(Scope::new(tenant, operation), key, payload)
}

/// The response of `ExecuteAnswer::Ran`.
#[track_caller]
pub fn executed(outcome: Result<ExecuteAnswer, Error>) -> Response {
    match outcome {
        Ok(ExecuteAnswer::Ran(r)) => r,
        other => panic!("expected ExecuteAnswer::Ran, got {other:?}"),
    }
}

/// The response of `ExecuteAnswer::Replayed`.
#[track_caller]
pub fn replayed(outcome: Result<ExecuteAnswer, Error>) -> Response {
    match outcome {
        Ok(ExecuteAnswer::Replayed(r)) => r,
        other => panic!("expected ExecuteAnswer::Replayed, got {other:?}"),
    }
}

/// The tombstone of `ExecuteAnswer::Expired`.
#[track_caller]
pub fn expired(outcome: Result<ExecuteAnswer, Error>) -> Tombstone {
    match outcome {
        Ok(ExecuteAnswer::Expired(t)) => t,
        other => panic!("expected ExecuteAnswer::Expired, got {other:?}"),
    }
}

/// The `retry_after` hint of `ExecuteAnswer::InFlight`.
#[track_caller]
pub fn in_flight(outcome: Result<ExecuteAnswer, Error>) -> Duration {
    match outcome {
        Ok(ExecuteAnswer::InFlight { retry_after }) => retry_after,
        other => panic!("expected ExecuteAnswer::InFlight, got {other:?}"),
    }
}

/// The lease of `BeginAnswer::Acquired`.
#[track_caller]
pub fn acquired<L: std::fmt::Debug>(begin: Result<BeginAnswer<L>, Error>) -> L {
    match begin {
        Ok(BeginAnswer::Acquired(lease)) => lease,
        other => panic!("expected BeginAnswer::Acquired, got {other:?}"),
    }
}

/// The response of `BeginAnswer::Replayed`.
#[track_caller]
pub fn begin_replayed<L: std::fmt::Debug>(begin: Result<BeginAnswer<L>, Error>) -> Response {
    match begin {
        Ok(BeginAnswer::Replayed(r)) => r,
        other => panic!("expected BeginAnswer::Replayed, got {other:?}"),
    }
}

/// The `retry_after` hint of `BeginAnswer::InFlight`.
#[track_caller]
pub fn begin_in_flight<L: std::fmt::Debug>(begin: Result<BeginAnswer<L>, Error>) -> Duration {
    match begin {
        Ok(BeginAnswer::InFlight { retry_after }) => retry_after,
        other => panic!("expected BeginAnswer::InFlight, got {other:?}"),
    }
}

/// The tombstone of `BeginAnswer::Expired`.
#[track_caller]
pub fn begin_expired<L: std::fmt::Debug>(begin: Result<BeginAnswer<L>, Error>) -> Tombstone {
    match begin {
        Ok(BeginAnswer::Expired(t)) => t,
        other => panic!("expected BeginAnswer::Expired, got {other:?}"),
    }
}

/// Asserts `Error::PayloadMismatch`.
#[track_caller]
pub fn mismatch<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::PayloadMismatch { .. }) => {}
        other => panic!("expected Error::PayloadMismatch, got {other:?}"),
    }
}

/// Asserts `Error::LeaseLost`.
#[track_caller]
pub fn lease_lost<T: std::fmt::Debug>(result: Result<T, Error>) {
    match result {
        Err(Error::LeaseLost { .. }) => {}
        other => panic!("expected Error::LeaseLost, got {other:?}"),
    }
}

/// Waits (bounded by [`WAIT`]) until `done` holds.
#[track_caller]
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}
