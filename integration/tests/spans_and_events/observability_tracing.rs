//! Feature `tracing`: every `execute`, `begin`, lease finish, `process` and `receive` is a span
//! with `engine`, `tenant` and `operation`, and records its decision (`executed`, `replayed`,
//! `acquired`, `duplicate`, `mismatch`, ...); every group-commit batch is a `debug!` event; a
//! failure idem handles without returning it (here: an outbox event that became a dead letter,
//! in the dispatcher's thread) is a `warn!`. No key and no payload appears in any span or event:
//! not as a field name, a value or a message, as text or as hex.
//!
//! A capturing `Layer` (on tracing-subscriber's registry) is the process's global subscriber, so
//! background threads are seen too; each test tells its own spans apart by its operation. The
//! PostgreSQL cases run when `IDEM_PG_URL` is set (tests/common/pg.rs), and are skipped
//! otherwise.

#![cfg(feature = "tracing")]

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use idem::error::BoxError;
use idem::inbox::ProcessAnswer;
use idem::outbox::{DispatcherOptions, Event, StoredEvent};
use idem::{Abort, BeginAnswer, Error, ExecuteAnswer, Request, Response, Scope};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event as TracingEvent, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// A key and a payload no span or event may show.
const KEY: &str = "key-7f3a9c-never-logged";
const PAYLOAD: &str = "payload-d41e-never-logged";

/// Fields as recorded: (name, value as text), in order.
type FieldList = Vec<(String, String)>;

/// What the subscriber saw.
#[derive(Default)]
struct Seen {
    /// Every span, in creation order: its name and fields (as recorded, in order; a field
    /// recorded later is appended).
    spans: Vec<(String, FieldList)>,
    /// The index in `spans` of each span id in use (the registry reuses the ids of closed
    /// spans).
    live: HashMap<u64, usize>,
    /// Every event: its level, its fields (the message is the field `message`) and the fields
    /// of its span and the span's parents.
    events: Vec<(Level, FieldList, FieldList)>,
}

struct Collect<'a>(&'a mut FieldList);

impl Visit for Collect<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
}

struct Capture(Arc<Mutex<Seen>>);

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        attrs.record(&mut Collect(&mut fields));
        let name = attrs.metadata().name().to_owned();
        let mut seen = self.0.lock().unwrap();
        let index = seen.spans.len();
        seen.spans.push((name, fields));
        seen.live.insert(id.into_u64(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some(&index) = seen.live.get(&id.into_u64()) {
            values.record(&mut Collect(&mut seen.spans[index].1));
        }
    }

    fn on_event(&self, event: &TracingEvent<'_>, ctx: Context<'_, S>) {
        let mut fields = Vec::new();
        event.record(&mut Collect(&mut fields));
        let mut seen = self.0.lock().unwrap();
        let mut scope = Vec::new();
        if let Some(span) = ctx.event_span(event) {
            for s in span.scope() {
                if let Some(&index) = seen.live.get(&s.id().into_u64()) {
                    scope.extend(seen.spans[index].1.iter().cloned());
                }
            }
        }
        seen.events.push((*event.metadata().level(), fields, scope));
    }
}

/// The global capture, installed once for the whole test binary.
fn seen() -> &'static Arc<Mutex<Seen>> {
    static SEEN: OnceLock<Arc<Mutex<Seen>>> = OnceLock::new();
    SEEN.get_or_init(|| {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let subscriber = tracing_subscriber::registry().with(Capture(Arc::clone(&seen)));
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        seen
    })
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    // The last recording of a field wins.
    fields
        .iter()
        .rev()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The spans of `operation`, in creation order: (name, engine, tenant, decision).
fn spans_of(operation: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
    let seen = seen().lock().unwrap();
    seen.spans
        .iter()
        .filter(|(_, f)| field(f, "operation") == Some(operation))
        .map(|(name, f)| {
            (
                name.clone(),
                field(f, "engine").unwrap_or_default().to_owned(),
                field(f, "tenant").map(str::to_owned),
                field(f, "decision").map(str::to_owned),
            )
        })
        .collect()
}

fn span(
    name: &str,
    engine: &str,
    tenant: Option<&str>,
    decision: &str,
) -> (String, String, Option<String>, Option<String>) {
    (
        name.to_owned(),
        engine.to_owned(),
        tenant.map(str::to_owned),
        Some(decision.to_owned()),
    )
}

/// No key or payload in anything the subscriber saw (names, values, messages), as text or hex.
fn assert_nothing_leaked(secrets: &[&str]) {
    let seen = seen().lock().unwrap();
    let mut all: Vec<&(String, String)> = Vec::new();
    for (name, fields) in &seen.spans {
        assert!(!secrets.iter().any(|s| name.contains(s)));
        all.extend(fields);
    }
    for (_, fields, scope) in &seen.events {
        all.extend(fields);
        all.extend(scope);
    }
    assert!(!all.is_empty());
    for secret in secrets {
        let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
        for (name, value) in &all {
            for shown in [name, value] {
                assert!(
                    !shown.contains(secret) && !shown.contains(&hex),
                    "{secret:?} appears in a field: {name} = {value}"
                );
            }
        }
    }
}

/// The `debug!` events of group-commit batches: (engine, size).
fn batches(engine: &str) -> Vec<u64> {
    let seen = seen().lock().unwrap();
    seen.events
        .iter()
        .filter(|(level, f, _)| {
            *level == Level::DEBUG
                && field(f, "message") == Some("group commit batch")
                && field(f, "engine") == Some(engine)
        })
        .filter_map(|(_, f, _)| field(f, "size")?.parse().ok())
        .collect()
}

fn request(operation: &str, payload: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("tenant-a", operation), KEY, payload.as_bytes())
}

#[test]
fn a_replay_is_recorded_as_replayed_and_no_key_or_payload_is_recorded() {
    seen();
    let h = common::Harness::new();
    let store = h.store();
    let op = "trace_flow_a";
    let run = |payload: &str| {
        store.execute(request(op, payload), |_| {
            Ok(Response::new(201, format!("created {PAYLOAD}")))
        })
    };
    assert!(matches!(run(PAYLOAD).unwrap(), ExecuteAnswer::Ran(_)));
    assert!(matches!(run(PAYLOAD).unwrap(), ExecuteAnswer::Replayed(_)));
    assert!(matches!(
        run("another payload"),
        Err(Error::PayloadMismatch { .. })
    ));
    assert_eq!(
        spans_of(op),
        [
            span("execute", "redb", Some("tenant-a"), "executed"),
            span("execute", "redb", Some("tenant-a"), "replayed"),
            span("execute", "redb", Some("tenant-a"), "mismatch"),
        ]
    );
    assert!(
        batches("redb").iter().any(|&size| size >= 1),
        "a debug event per group-commit batch, with its size"
    );
    assert_nothing_leaked(&[KEY, PAYLOAD]);
}

#[test]
fn flow_b_and_the_inbox_record_their_decisions() {
    seen();
    let h = common::Harness::new();
    let store = h.store();
    let op = "trace_flow_b";
    let BeginAnswer::Acquired(lease) = store.begin(request(op, PAYLOAD)).unwrap() else {
        panic!("a first claim acquires the key");
    };
    assert!(matches!(
        store.begin(request(op, PAYLOAD)).unwrap(),
        BeginAnswer::InFlight { .. }
    ));
    lease.complete(Response::new(200, PAYLOAD)).unwrap();
    assert!(matches!(
        store.begin(request(op, PAYLOAD)).unwrap(),
        BeginAnswer::Replayed(_)
    ));
    assert_eq!(
        spans_of(op),
        [
            span("begin", "redb", Some("tenant-a"), "acquired"),
            span("begin", "redb", Some("tenant-a"), "in_flight"),
            span("finish", "redb", Some("tenant-a"), "executed"),
            span("begin", "redb", Some("tenant-a"), "replayed"),
        ]
    );

    let subscriber = "trace_inbox";
    let process = || store.process(subscriber, KEY, |_| Ok::<_, Abort>(()));
    assert!(matches!(process().unwrap(), ProcessAnswer::Ran(())));
    assert!(matches!(
        process().unwrap(),
        ProcessAnswer::Duplicate { .. }
    ));
    assert!(matches!(
        store
            .receive("trace_webhooks", KEY, |_| Err::<(), _>(Abort::Terminal(
                Response::new(400, "bad")
            )))
            .unwrap(),
        idem::inbox::ReceiveAnswer::Rejected(_)
    ));
    assert_eq!(
        spans_of(subscriber),
        [
            span("process", "redb", None, "executed"),
            span("process", "redb", None, "duplicate"),
        ]
    );
    assert_eq!(
        spans_of("trace_webhooks"),
        [span("receive", "redb", None, "rejected")]
    );
    assert_nothing_leaked(&[KEY, PAYLOAD]);
}

#[test]
fn a_dead_letter_in_the_dispatcher_thread_is_a_warning() {
    seen();
    let h = common::Harness::new();
    let store = h.store();
    let pushed = store.execute(request("trace_outbox", PAYLOAD), |tx| {
        tx.outbox()
            .push(Event::new("topic", PAYLOAD.as_bytes().to_vec()).ordering_key(KEY))?;
        Ok(Response::new(200, ""))
    });
    assert!(matches!(pushed.unwrap(), ExecuteAnswer::Ran(_)));
    let publisher = |_: &StoredEvent| -> Result<(), BoxError> { Err("broker down".into()) };
    let dispatcher = store
        .start_dispatcher(publisher, DispatcherOptions::new().max_attempts(1))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.outbox_stats().unwrap().dead == 0 {
        assert!(Instant::now() < deadline, "the event becomes a dead letter");
        std::thread::sleep(Duration::from_millis(5));
    }
    dispatcher.shutdown().unwrap();
    let warned = seen().lock().unwrap().events.iter().any(|(level, f, _)| {
        *level == Level::WARN
            && field(f, "message").is_some_and(|m| m.contains("dead letter"))
            && field(f, "seq").is_some()
    });
    assert!(warned, "a warning names the dead letter's sequence number");
    assert_nothing_leaked(&[KEY, PAYLOAD]);
}

#[test]
fn the_repair_of_a_crashed_file_is_a_warning_when_it_begins_and_when_it_ends_and_the_file_is_read_through_first()
 {
    seen();
    let crashed = common::crash_image(idem::Store::builder(), |store| {
        let claimed = store.execute(request("trace_repair", PAYLOAD), |_| {
            Ok(Response::new(201, ""))
        });
        assert!(matches!(claimed.unwrap(), ExecuteAnswer::Ran(_)));
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crashed.redb");
    std::fs::write(&path, &crashed).unwrap();
    let store = idem::Store::open(&path).expect("repaired");
    let took = store.repair_time().expect("the open repaired the file");
    drop(store);
    // The same crashed file without the read-through before the walk.
    let unread = dir.path().join("crashed-unread.redb");
    std::fs::write(&unread, &crashed).unwrap();
    let store = idem::Store::builder()
        .prefetch_on_repair(false)
        .open(&unread)
        .expect("repaired");
    assert!(store.repair_time().is_some());
    let seen = seen().lock().unwrap();
    // Only the first open (prefetch_on_repair is on by default) read the file through, whole.
    let reads: Vec<u64> = seen
        .events
        .iter()
        .filter(|(level, f, _)| {
            *level == Level::DEBUG
                && field(f, "message") == Some("read the store file through before its repair")
        })
        .filter_map(|(_, f, _)| field(f, "bytes")?.parse().ok())
        .collect();
    assert_eq!(
        reads,
        vec![crashed.len() as u64],
        "one read-through of the whole file"
    );
    let warning = |text: &str| {
        seen.events
            .iter()
            .filter(|(level, f, _)| {
                *level == Level::WARN && field(f, "message").is_some_and(|m| m.contains(text))
            })
            .map(|(_, f, _)| f.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        !warning("not closed cleanly").is_empty(),
        "the repair's start"
    );
    let ended = warning("repaired after an unclean shutdown");
    let seconds: Vec<f64> = ended
        .iter()
        .filter_map(|f| field(f, "seconds")?.parse().ok())
        .collect();
    assert!(
        seconds
            .iter()
            .any(|s| (s - took.as_secs_f64()).abs() < 1e-9),
        "the end names the repair's time: {seconds:?} {took:?}"
    );
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use common::pg::PgHarness;

    #[test]
    fn postgres_calls_record_their_decisions_and_no_key_or_payload() {
        seen();
        let Some(h) = PgHarness::new("trace") else {
            return;
        };
        let store = h.store();
        let op = "trace_pg_flow_a";
        let run = || {
            store.execute(request(op, PAYLOAD), |_| {
                Ok(Response::new(201, format!("created {PAYLOAD}")))
            })
        };
        assert!(matches!(run().unwrap(), ExecuteAnswer::Ran(_)));
        assert!(matches!(run().unwrap(), ExecuteAnswer::Replayed(_)));
        assert_eq!(
            spans_of(op),
            [
                span("execute", "postgres", Some("tenant-a"), "executed"),
                span("execute", "postgres", Some("tenant-a"), "replayed"),
            ]
        );

        let op = "trace_pg_flow_b";
        let BeginAnswer::Acquired(lease) = store.begin(request(op, PAYLOAD)).unwrap() else {
            panic!("a first claim acquires the key");
        };
        lease.complete(Response::new(200, PAYLOAD)).unwrap();
        assert!(matches!(
            store.begin(request(op, PAYLOAD)).unwrap(),
            BeginAnswer::Replayed(_)
        ));
        assert_eq!(
            spans_of(op),
            [
                span("begin", "postgres", Some("tenant-a"), "acquired"),
                span("finish", "postgres", Some("tenant-a"), "executed"),
                span("begin", "postgres", Some("tenant-a"), "replayed"),
            ]
        );

        let subscriber = "trace_pg_inbox";
        let process = || store.process(subscriber, KEY, |_| Ok::<_, Abort>(()));
        assert!(matches!(process().unwrap(), ProcessAnswer::Ran(())));
        assert!(matches!(
            process().unwrap(),
            ProcessAnswer::Duplicate { .. }
        ));
        assert_eq!(
            spans_of(subscriber),
            [
                span("process", "postgres", None, "executed"),
                span("process", "postgres", None, "duplicate"),
            ]
        );
        assert!(
            !batches("postgres").is_empty(),
            "a debug event per group-commit batch"
        );
        assert_nothing_leaked(&[KEY, PAYLOAD]);
    }
}
