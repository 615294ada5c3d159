//! Feature `metrics`: what idem records through the `metrics` facade, read back from
//! metrics-util's `DebuggingRecorder` (installed for the test's thread only, so tests running in
//! parallel do not see each other's figures; every call here runs and commits on that thread).
//!
//! - `idem_outcomes_total{call, operation, outcome}` counts executed vs replayed (the dedupe hit
//!   rate), mismatches, flow B's acquired / in-flight / takeover and a lease's finish;
//! - `idem_payload_mismatch_total`, `idem_lease_takeovers_total`, `idem_lease_lost_total`;
//! - the histograms `idem_commit_batch_size` (one sample per batch), `idem_commit_seconds`,
//!   `idem_queue_wait_seconds`;
//! - the gauges `idem_outbox_pending`, `idem_outbox_dead_letters`, `idem_records{state}`;
//! - `idem_repairs_total` and `idem_repair_seconds` for an open that repaired a crashed file.
//!
//! The PostgreSQL case runs when `IDEM_PG_URL` is set (tests/common/pg.rs), and is skipped
//! otherwise.

#![cfg(feature = "metrics")]

use crate::common;

use std::time::Duration;

use idem::{BeginAnswer, Error, ExecuteAnswer, Request, Response, Scope};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Runs `f` with a fresh recorder on this thread, and returns what was recorded.
fn recorded(f: impl FnOnce()) -> Figures {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    Figures(
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(k, _, _, v)| (k, v))
            .collect(),
    )
}

struct Figures(Vec<(CompositeKey, DebugValue)>);

impl Figures {
    fn find(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        self.0
            .iter()
            .find(|(k, _)| {
                k.kind() == kind
                    && k.key().name() == name
                    && labels.iter().all(|(l, v)| {
                        k.key()
                            .labels()
                            .any(|label| label.key() == *l && label.value() == *v)
                    })
                    && k.key().labels().count() == labels.len()
            })
            .map(|(_, v)| v)
    }

    /// A counter's value (0 if it was never incremented).
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(MetricKind::Counter, name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            Some(other) => panic!("{name} is a counter, not {other:?}"),
        }
    }

    fn outcome(&self, call: &str, operation: &str, outcome: &str) -> u64 {
        self.counter(
            "idem_outcomes_total",
            &[
                ("call", call),
                ("operation", operation),
                ("outcome", outcome),
            ],
        )
    }

    fn histogram(&self, name: &str) -> Vec<f64> {
        match self.find(MetricKind::Histogram, name, &[]) {
            Some(DebugValue::Histogram(values)) => values.iter().map(|v| v.into_inner()).collect(),
            other => panic!("{name} is a recorded histogram: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(MetricKind::Gauge, name, labels) {
            Some(DebugValue::Gauge(v)) => v.into_inner(),
            other => panic!("{name} {labels:?} is a recorded gauge: {other:?}"),
        }
    }
}

fn request(operation: &str, key: &str, payload: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("tenant-m", operation), key, payload.as_bytes())
}

/// What both engines must show for the same calls (see each engine's test).
fn check(figures: &Figures, batches: usize, commits: usize) {
    // Flow A: two intents, one retried, one reused with another payload.
    assert_eq!(figures.outcome("execute", "create_order", "executed"), 2);
    assert_eq!(figures.outcome("execute", "create_order", "replayed"), 1);
    assert_eq!(figures.outcome("execute", "create_order", "mismatch"), 1);
    assert_eq!(figures.counter("idem_payload_mismatch_total", &[]), 1);
    // Flow B: a claim, a caller told "in flight", a takeover after the lease lapsed, the old
    // holder refused, the new one finishing.
    assert_eq!(figures.outcome("begin", "charge", "acquired"), 1);
    assert_eq!(figures.outcome("begin", "charge", "in_flight"), 1);
    assert_eq!(figures.outcome("begin", "charge", "takeover"), 1);
    assert_eq!(figures.counter("idem_lease_takeovers_total", &[]), 1);
    assert_eq!(figures.outcome("finish", "charge", "lease_lost"), 1);
    assert_eq!(figures.outcome("finish", "charge", "executed"), 1);
    assert_eq!(
        figures.counter("idem_lease_lost_total", &[]),
        2,
        "the stale holder's heartbeat and its finish"
    );
    assert_eq!(figures.outcome("begin", "charge", "replayed"), 1);
    // No outcome counts tenants.
    assert!(
        figures
            .0
            .iter()
            .all(|(k, _)| k.key().labels().all(|l| l.key() != "tenant")),
        "tenants are never a label"
    );

    // One batch-size sample per batch (a batch in which nobody wrote ends without a commit);
    // one commit-time sample per commit. Every call here ran alone.
    let sizes = figures.histogram("idem_commit_batch_size");
    assert_eq!(sizes, vec![1.0; batches]);
    let seconds = figures.histogram("idem_commit_seconds");
    assert_eq!(seconds.len(), commits, "{seconds:?}");
    assert!(seconds.iter().all(|&s| s > 0.0 && s < 60.0), "{seconds:?}");
    assert!(!figures.histogram("idem_queue_wait_seconds").is_empty());

    assert_eq!(figures.gauge("idem_outbox_pending", &[]), 0.0);
    assert_eq!(figures.gauge("idem_outbox_dead_letters", &[]), 0.0);
    // Two orders and the charge are completed; nothing else is stored.
    assert_eq!(
        figures.gauge("idem_records", &[("state", "completed")]),
        3.0
    );
    assert_eq!(figures.gauge("idem_records", &[("state", "pending")]), 0.0);
    assert_eq!(figures.gauge("idem_records", &[("state", "failed")]), 0.0);
    assert_eq!(
        figures.gauge("idem_records", &[("state", "tombstone")]),
        0.0
    );
}

#[test]
fn outcome_counters_count_executed_vs_replayed_and_batches_are_recorded() {
    let h = common::Harness::with(|b| b.lease_duration(Duration::from_secs(5)));
    let store = h.store();
    let figures = recorded(|| {
        let order = |key: &str, payload: &str| {
            store.execute(request("create_order", key, payload), |_| {
                Ok(Response::new(201, "created"))
            })
        };
        assert!(matches!(order("o-1", "p").unwrap(), ExecuteAnswer::Ran(_)));
        assert!(matches!(
            order("o-1", "p").unwrap(),
            ExecuteAnswer::Replayed(_)
        ));
        assert!(matches!(order("o-2", "p").unwrap(), ExecuteAnswer::Ran(_)));
        assert!(matches!(
            order("o-1", "other"),
            Err(Error::PayloadMismatch { .. })
        ));

        let charge = || store.begin(request("charge", "c-1", "p")).unwrap();
        let BeginAnswer::Acquired(mut stale) = charge() else {
            panic!("the first claim acquires the key");
        };
        assert!(matches!(charge(), BeginAnswer::InFlight { .. }));
        h.clock.advance(Duration::from_secs(6));
        let BeginAnswer::Acquired(fresh) = charge() else {
            panic!("a lapsed lease is taken over");
        };
        assert!(matches!(stale.heartbeat(), Err(Error::LeaseLost { .. })));
        assert!(matches!(
            stale.complete(Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
        fresh.complete(Response::new(200, "charged")).unwrap();
        assert!(matches!(charge(), BeginAnswer::Replayed(_)));

        store.outbox_stats().unwrap();
        store.sweep().unwrap();
    });
    // Commits: two orders, two claims (the acquired one and the takeover), one finish. Batches:
    // those, and the stale holder's two calls (they wrote nothing); replays, the mismatch and
    // "in flight" are answered from a read transaction, outside group commit.
    check(&figures, 7, 5);
}

#[test]
fn an_open_that_repairs_a_crashed_file_is_counted_with_its_time() {
    let image = common::crash_image(idem::Store::builder(), |store| {
        let claimed = store.execute(request("repaired", "r-1", "p"), |_| {
            Ok(Response::new(201, "created"))
        });
        assert!(matches!(claimed.unwrap(), ExecuteAnswer::Ran(_)));
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crashed.redb");
    std::fs::write(&path, image).unwrap();
    let mut took = None;
    let figures = recorded(|| {
        let store = idem::Store::open(&path).unwrap();
        took = store.repair_time();
        drop(store);
        // Closed cleanly: the second open repairs nothing.
        assert_eq!(idem::Store::open(&path).unwrap().repair_time(), None);
    });
    let took = took.expect("the first open repaired the file");
    assert_eq!(figures.counter("idem_repairs_total", &[]), 1);
    assert_eq!(
        figures.histogram("idem_repair_seconds"),
        vec![took.as_secs_f64()]
    );
}

#[cfg(feature = "postgres")]
#[test]
fn the_postgres_engine_records_the_same_figures() {
    let Some(h) =
        common::pg::PgHarness::with("metrics", |b| b.lease_duration(Duration::from_secs(5)))
    else {
        return;
    };
    let store = h.store();
    let figures = recorded(|| {
        let order = |key: &str, payload: &str| {
            store.execute(request("create_order", key, payload), |_| {
                Ok(Response::new(201, "created"))
            })
        };
        assert!(matches!(order("o-1", "p").unwrap(), ExecuteAnswer::Ran(_)));
        assert!(matches!(
            order("o-1", "p").unwrap(),
            ExecuteAnswer::Replayed(_)
        ));
        assert!(matches!(order("o-2", "p").unwrap(), ExecuteAnswer::Ran(_)));
        assert!(matches!(
            order("o-1", "other"),
            Err(Error::PayloadMismatch { .. })
        ));

        let charge = || store.begin(request("charge", "c-1", "p")).unwrap();
        let BeginAnswer::Acquired(mut stale) = charge() else {
            panic!("the first claim acquires the key");
        };
        assert!(matches!(charge(), BeginAnswer::InFlight { .. }));
        h.clock.advance(Duration::from_secs(6));
        let BeginAnswer::Acquired(fresh) = charge() else {
            panic!("a lapsed lease is taken over");
        };
        assert!(matches!(stale.heartbeat(), Err(Error::LeaseLost { .. })));
        assert!(matches!(
            stale.complete(Response::new(200, "late")),
            Err(Error::LeaseLost { .. })
        ));
        fresh.complete(Response::new(200, "charged")).unwrap();
        assert!(matches!(charge(), BeginAnswer::Replayed(_)));

        store.outbox_stats().unwrap();
        store.sweep().unwrap();
    });
    // The same commits. Every call is a batch: PostgreSQL answers replays, mismatches and "in
    // flight" from the batch's opening read (a batch with no write ends without a commit).
    check(&figures, 11, 5);
}
