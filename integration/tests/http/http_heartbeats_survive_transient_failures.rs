//! While a handler runs, the layer heartbeats its lease, and a transient heartbeat failure
//! does not end that: a heartbeat turned away because the store's queue is full
//! (`Error::Busy`), or whose store call failed on the blocking pool, is retried and counted in
//! `LayerMetrics::heartbeat_failures`. So the lease never lapses under a running handler, and
//! a retry with the key is told "in flight" instead of running the handler a second time.
//!
//! Determinism: the store's clock is a manual one, so a lease lapses only when the test moves
//! it; real time only paces the heartbeats (every third of a 300 ms lease), and every wait is
//! for an event, bounded by a guard against a hang.
#![cfg(feature = "http")]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use idem::clock::{Clock, ManualClock};
use idem::format::State;
use idem::http::IdempotencyLayer;
use idem::{Request, Response, Scope, Store, Timestamp};
use tokio::sync::Notify;
use tower::ServiceExt;

use crate::http_fixtures;
use http_fixtures::{body_of, hold_route, post_req, send, slow_route};

/// The stores' lease: the layer heartbeats every 100 ms of real time.
const LEASE: Duration = Duration::from_millis(300);

/// Polls `done` every 5 ms until it holds; a guard of 20 s against a hang, not a time bound.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..4_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never happened: {what}");
}

/// The app under test: `POST /slow` runs until the test lets it finish; `POST /hold` records
/// its answer in a transaction that waits for the test, holding the store's writer meanwhile.
struct App {
    router: Router,
    layer: IdempotencyLayer,
    /// Notified when `/slow`'s handler started.
    entered: Arc<Notify>,
    /// Lets `/slow`'s handler answer.
    finish: Arc<Notify>,
    /// `/slow`'s executions.
    calls: Arc<AtomicU32>,
    /// Notified when `/hold`'s transaction holds the writer.
    holding: Arc<Notify>,
    /// One message lets one `/hold` transaction end.
    release: mpsc::Sender<()>,
}

fn app(store: Store) -> App {
    let layer = IdempotencyLayer::tenant_header(store, "x-tenant-id").max_in_flight(16);
    let (entered, finish, calls, holding) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::new(AtomicU32::new(0)),
        Arc::new(Notify::new()),
    );
    let (hold, release) = hold_route("/hold", &holding);
    let router = slow_route("/slow", &entered, &finish, &calls)
        .merge(hold)
        .route_layer(layer.clone());
    App {
        router,
        layer,
        entered,
        finish,
        calls,
        holding,
        release,
    }
}

/// The lease deadline of `/slow`'s key as stored.
fn deadline(store: &Store) -> Timestamp {
    match store
        .get(&Scope::new("t1", "POST /slow"), "k")
        .unwrap()
        .expect("the key is claimed")
        .state
    {
        State::Pending { lease_deadline, .. } => lease_deadline,
        other => panic!("expected a lease, found {other:?}"),
    }
}

/// With the clock moved past the deadline the lease had, a heartbeat extends it from the new
/// time, a retry is answered 409 (no second execution), and the handler's answer is recorded
/// once.
async fn the_lease_is_still_heartbeated(app: &App, store: &Store, time: &ManualClock) {
    let before = deadline(store);
    time.advance(LEASE * 10);
    let now = time.now();
    assert!(now > before, "the clock is past the deadline the lease had");
    until("a heartbeat after the failure extends the lease", || {
        deadline(store) >= now.saturating_add(LEASE)
    })
    .await;
    let (s, _, _) = send(&app.router, post_req("/slow", Some("k"), "")).await;
    assert_eq!(
        s,
        StatusCode::CONFLICT,
        "the key is still held: no takeover"
    );
    app.finish.notify_one();
    until("the handler's answer is recorded", || {
        matches!(
            store
                .get(&Scope::new("t1", "POST /slow"), "k")
                .unwrap()
                .map(|r| r.state),
            Some(State::Completed(_))
        )
    })
    .await;
    let (s, h, body) = send(&app.router, post_req("/slow", Some("k"), "")).await;
    assert_eq!((s, &body[..]), (StatusCode::CREATED, &b"done"[..]));
    assert_eq!(h["idempotent-replayed"], "true");
    assert_eq!(app.calls.load(Ordering::SeqCst), 1, "one execution");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_that_finds_the_store_queue_full_is_retried_and_the_lease_kept() {
    let dir = tempfile::tempdir().unwrap();
    let time = ManualClock::new(Timestamp(1_000_000));
    // One place in the write queue, and a short wait for it: a heartbeat that finds the writer
    // busy and the place taken is turned away with `Error::Busy`.
    let store = Store::builder()
        .clock(time.clone())
        .lease_duration(LEASE)
        .max_queue(1)
        .queue_timeout(Duration::from_millis(30))
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let app = app(store.clone());
    let first = tokio::spawn(app.router.clone().oneshot(post_req("/slow", Some("k"), "")));
    app.entered.notified().await;

    // Block the writer with `/hold`, and take the queue's one place with another write. If a
    // heartbeat took the place first, that write is the one turned away: then try again.
    let mut heartbeat_turned_away = false;
    for round in 0..10 {
        let busy = store.metrics().busy;
        let hold = tokio::spawn(app.router.clone().oneshot(post_req(
            "/hold",
            Some(&format!("h{round}")),
            "",
        )));
        app.holding.notified().await;
        let s = store.clone();
        let filler = tokio::task::spawn_blocking(move || {
            let req =
                Request::from_canonical_bytes(Scope::new("t", "fill"), round.to_string(), b"");
            s.execute(req, |_| Ok(Response::new(200, "filled")))
        });
        until("a writer is turned away with Busy", || {
            store.metrics().busy > busy
        })
        .await;
        app.release.send(()).unwrap();
        let (s, _, _) = body_of(hold.await.unwrap().unwrap()).await;
        assert_eq!(s, StatusCode::CREATED);
        match filler.await.unwrap() {
            // The filler waited in the queue: the writer turned away was the heartbeat.
            Ok(_) => {
                heartbeat_turned_away = true;
                break;
            }
            Err(idem::Error::Busy { .. }) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(heartbeat_turned_away, "no heartbeat was ever turned away");
    until("the failed heartbeat is counted", || {
        app.layer.metrics().heartbeat_failures >= 1
    })
    .await;

    the_lease_is_still_heartbeated(&app, &store, &time).await;
    let (s, _, _) = body_of(first.await.unwrap().unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
}

/// A clock that panics on its next `fail` reads (a failing store call on the blocking pool).
#[derive(Debug, Clone)]
struct FailingClock {
    time: ManualClock,
    fail: Arc<AtomicU32>,
    failed: Arc<AtomicU32>,
}

impl Clock for FailingClock {
    fn now(&self) -> Timestamp {
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            self.failed.fetch_add(1, Ordering::SeqCst);
            panic!("the test's clock fails once");
        }
        self.time.now()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_whose_store_call_fails_on_the_blocking_pool_is_retried_and_the_lease_kept() {
    let dir = tempfile::tempdir().unwrap();
    let clock = FailingClock {
        time: ManualClock::new(Timestamp(1_000_000)),
        fail: Arc::new(AtomicU32::new(0)),
        failed: Arc::new(AtomicU32::new(0)),
    };
    let store = Store::builder()
        .clock(clock.clone())
        .lease_duration(LEASE)
        .open(dir.path().join("idem.redb"))
        .unwrap();
    let app = app(store.clone());
    let first = tokio::spawn(app.router.clone().oneshot(post_req("/slow", Some("k"), "")));
    app.entered.notified().await;
    // While the handler waits, only heartbeats read the clock: the next one panics inside its
    // store call, and its blocking task fails.
    clock.fail.store(1, Ordering::SeqCst);
    until("a heartbeat's store call failed", || {
        clock.failed.load(Ordering::SeqCst) == 1
    })
    .await;
    until("the failed heartbeat is counted", || {
        app.layer.metrics().heartbeat_failures >= 1
    })
    .await;

    the_lease_is_still_heartbeated(&app, &store, &clock.time).await;
    let (s, _, _) = body_of(first.await.unwrap().unwrap()).await;
    assert_eq!(s, StatusCode::CREATED);
}
