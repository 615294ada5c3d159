//! The async face (feature `tokio`) on both engines, on a single-threaded runtime, where any
//! blocked worker would stall the test: flow A replays; `begin_wait` sleeps (it never blocks the
//! thread) while another task on the same thread finishes the lease, then returns its answer;
//! overload beyond `max_in_flight` is `Busy` at once, not a queue; an `AsyncLease` dropped inside
//! the runtime releases its key off the worker (the PostgreSQL client would panic on it); a
//! claim's retry (`begin_claim`) takes back its own lease; the dispatcher publishes through an
//! async publisher.
#![cfg(feature = "tokio")]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use idem::asynchronous::{AsyncPublisher, AsyncStore, start_dispatcher};
use idem::backend::Backend;
use idem::error::BoxError;
use idem::outbox::{DispatcherOptions, Event, StoredEvent};
use idem::{BeginAnswer, Claim, Error, ExecuteAnswer, Request, Response, Scope, Store};

fn req(key: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("t", "op"), key, b"p")
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The same checks on either engine (closures that write nothing: they are engine-neutral).
async fn flows<B: Backend>(store: AsyncStore<B>) {
    // Flow A: executed, then replayed.
    let first = store
        .execute(req("a"), |_| Ok(Response::new(201, "one")))
        .await
        .unwrap();
    assert!(matches!(first, ExecuteAnswer::Ran(_)));
    let again = store
        .execute(req("a"), |_| Ok(Response::new(201, "two")))
        .await
        .unwrap();
    assert_eq!(again.response().map(Response::body), Some(&b"one"[..]));

    // begin_wait on one thread: the waiter sleeps while the holder's task completes.
    let BeginAnswer::Acquired(lease) = store.begin(req("b")).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    let holder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lease.complete(Response::new(200, "done")).await.unwrap();
    });
    let waited = store
        .begin_wait(req("b"), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        matches!(&waited, BeginAnswer::Replayed(r) if r.body() == b"done"),
        "{waited:?}"
    );
    holder.await.unwrap();

    // Dropped inside the runtime: released off the worker, the key free again soon.
    let BeginAnswer::Acquired(lease) = store.begin(req("c")).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    drop(lease);
    let mut freed = false;
    for _ in 0..200 {
        if let BeginAnswer::Acquired(l) = store.begin(req("c")).await.unwrap() {
            l.release().await.unwrap();
            freed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(freed, "the dropped lease was released");

    // A claim's retry takes back the lease its earlier call took (whose answer is forgotten
    // here, as if it never arrived); anyone else sees the key in flight.
    let mut claim = Claim::new(req("d"));
    let BeginAnswer::Acquired(lost) = store.begin_claim(&mut claim).await.unwrap() else {
        panic!("a fresh key is acquired");
    };
    std::mem::forget(lost);
    assert!(matches!(
        store.begin(req("d")).await.unwrap(),
        BeginAnswer::InFlight { .. }
    ));
    let BeginAnswer::Acquired(lease) = store.begin_claim(&mut claim).await.unwrap() else {
        panic!("the claim's retry takes its own lease at once");
    };
    lease.complete(Response::new(200, "d")).await.unwrap();
}

#[test]
fn the_file_store_from_one_async_thread() {
    let dir = tempfile::tempdir().unwrap();
    let store = AsyncStore::new(Store::open(dir.path().join("idem.redb")).unwrap());
    current_thread().block_on(flows(store));
}

#[cfg(feature = "postgres")]
#[test]
fn the_postgres_store_from_one_async_thread() {
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let schema = common::pg::fresh_schema("asyncface");
    let rt = current_thread();
    // Opening connects: on the blocking pool too.
    let pg = {
        let (url, schema) = (url.clone(), schema.clone());
        let opening = rt.spawn_blocking(move || {
            idem::postgres::PgStore::builder(&url)
                .schema(&schema)
                .open()
                .unwrap()
        });
        rt.block_on(opening).unwrap()
    };
    rt.block_on(flows(AsyncStore::new(pg.clone())));
    // Dropped inside the runtime: closing its connections must not panic.
    rt.block_on(async move { drop(pg) });
    let _ =
        common::pg::client(&url).batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}

#[test]
fn admissions_beyond_the_bound_are_busy_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        AsyncStore::new(Store::open(dir.path().join("idem.redb")).unwrap()).with_max_in_flight(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (entered_tx, entered_rx) = std::sync::mpsc::channel::<()>();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let slow = {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .execute(req("slow"), move |_| {
                        let _ = entered_tx.send(());
                        let _ = release_rx.recv();
                        Ok(Response::new(200, "slow"))
                    })
                    .await
            })
        };
        tokio::task::spawn_blocking(move || entered_rx.recv().unwrap())
            .await
            .unwrap();
        assert_eq!(store.in_flight(), 1);
        let started = std::time::Instant::now();
        let refused = store
            .execute(req("other"), |_| Ok(Response::new(200, "x")))
            .await;
        assert!(matches!(refused, Err(Error::Busy { .. })), "{refused:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused at once"
        );
        release_tx.send(()).unwrap();
        assert!(matches!(slow.await.unwrap(), Ok(ExecuteAnswer::Ran(_))));
        // The permit is back.
        let after = store
            .execute(req("other"), |_| Ok(Response::new(200, "x")))
            .await;
        assert!(matches!(after, Ok(ExecuteAnswer::Ran(_))));
    });
}

/// An async broker client stand-in: a tokio channel.
struct Channel(tokio::sync::mpsc::UnboundedSender<String>);

impl AsyncPublisher for Channel {
    async fn publish(&mut self, event: &StoredEvent) -> Result<(), BoxError> {
        tokio::task::yield_now().await;
        self.0
            .send(String::from_utf8_lossy(&event.payload).into_owned())?;
        Ok(())
    }
}

#[test]
fn the_dispatcher_publishes_through_an_async_publisher() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("idem.redb")).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let handle = start_dispatcher(
        &store,
        Channel(tx),
        DispatcherOptions::new(),
        rt.handle().clone(),
    )
    .unwrap();
    let store = Arc::new(store);
    for i in 0..3 {
        let outcome = store
            .execute(req(&format!("e{i}")), |tx| {
                tx.outbox().push(Event::new("t", format!("event {i}")))?;
                Ok(Response::new(201, "ok"))
            })
            .unwrap();
        assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
    }
    let got: Vec<String> = rt.block_on(async {
        let mut got = Vec::new();
        while got.len() < 3 {
            let next = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("published in time")
                .expect("channel open");
            got.push(next);
        }
        got
    });
    assert_eq!(got, ["event 0", "event 1", "event 2"]);
    handle.shutdown().unwrap();
}
