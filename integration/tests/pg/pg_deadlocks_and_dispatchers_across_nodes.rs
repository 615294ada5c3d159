//! Two nodes (two `PgStore`s on one schema, as two processes would open it):
//!
//! - closures of the two nodes that lock the same rows in opposite orders deadlock on the
//!   server; PostgreSQL aborts one transaction (40P01), the engine re-runs that batch inside, and
//!   both intents finish with one effect each, no error reaching a caller;
//! - a dispatcher on each node drains one outbox together, and per ordering key every event is
//!   published only after the earlier ones of its key were, in commit order, each at least once.
#![cfg(feature = "postgres")]

use crate::common;

use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::pg::{PgHarness, pg_url};
use idem::outbox::{DispatcherOptions, Event, StoredEvent};
use idem::postgres::PgStore;
use idem::{ExecuteAnswer, Request, Response, Scope};

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("t", "transfer"), key, key.as_bytes())
}

#[test]
fn opposite_lock_orders_across_nodes_are_retried_inside_and_finish_once() {
    let Some(h) = PgHarness::with("deadlock", |b| b.writers(1)) else {
        return;
    };
    let accounts = h.table("accounts");
    let effects = h.table("effects");
    h.client()
        .batch_execute(&format!(
            "CREATE TABLE {accounts} (id text PRIMARY KEY, balance int8 NOT NULL);
             INSERT INTO {accounts} VALUES ('x', 0), ('y', 0);
             CREATE TABLE {effects} (k text PRIMARY KEY, n int8 NOT NULL);"
        ))
        .unwrap();
    let node_a = h.store().clone();
    let node_b = h.open_another();
    let both_locked_first = Arc::new(Barrier::new(2));
    let runs = Arc::new(Mutex::new(Vec::new()));
    // What the deadlock's victims' statements said.
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let transfer = |node: &PgStore,
                    key: &'static str,
                    first: &'static str,
                    second: &'static str| {
        let barrier = Arc::clone(&both_locked_first);
        let runs = Arc::clone(&runs);
        let refusals = Arc::clone(&refusals);
        let (accounts, effects) = (accounts.clone(), effects.clone());
        let mut first_run = true;
        node.execute(request(key), move |tx| {
            runs.lock().unwrap().push(key);
            tx.execute(
                &format!("UPDATE {accounts} SET balance = balance + 1 WHERE id = $1"),
                &[&first],
            )?;
            if first_run {
                // Both transactions hold their first row before either asks for its second:
                // a deadlock, which the server breaks by aborting one of them.
                first_run = false;
                barrier.wait();
            }
            if let Err(e) = tx.execute(
                &format!("UPDATE {accounts} SET balance = balance - 1 WHERE id = $1"),
                &[&second],
            ) {
                refusals.lock().unwrap().push(format!("{key}: {e:?}"));
                return Err(e.into());
            }
            tx.execute(
                &format!("INSERT INTO {effects} (k, n) VALUES ($1, 1) ON CONFLICT (k) DO UPDATE SET n = {effects}.n + 1"),
                &[&key],
            )?;
            Ok(Response::new(200, key))
        })
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| transfer(&node_a, "t1", "x", "y"));
        let b = s.spawn(|| transfer(&node_b, "t2", "y", "x"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(matches!(a, Ok(ExecuteAnswer::Ran(_))), "{a:?}");
    assert!(matches!(b, Ok(ExecuteAnswer::Ran(_))), "{b:?}");
    let runs = runs.lock().unwrap().clone();
    let refusals = refusals.lock().unwrap().clone();
    // The first runs deadlock (the barrier holds both until each has its first row), so one of
    // them is the victim and runs again; a victim's re-run may meet the other once more before
    // it finished (the engine pauses, with jitter, before each re-run to make that rare), and
    // each such meeting re-runs one closure again: one run more than the refusals, never an
    // error reaching a caller.
    assert!(!refusals.is_empty(), "no deadlock happened: {runs:?}");
    assert!(
        refusals.iter().all(|r| r.contains("E40P01")),
        "the server refused with something other than a deadlock: {refusals:?}"
    );
    assert_eq!(
        runs.len(),
        2 + refusals.len(),
        "a closure ran without its previous run being refused: {runs:?} {refusals:?}"
    );
    let mut c = h.client();
    for key in ["t1", "t2"] {
        let n: i64 = c
            .query_one(&format!("SELECT n FROM {effects} WHERE k = $1"), &[&key])
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "{key}: one effect");
    }
    let total: i64 = c
        .query_one(&format!("SELECT sum(balance)::int8 FROM {accounts}"), &[])
        .unwrap()
        .get(0);
    assert_eq!(
        total, 0,
        "both transfers applied once, nothing of the aborted run"
    );
}

/// What a publisher saw: the event's ordering key, its position in that key, which node.
type Published = (String, usize, &'static str);

#[test]
fn two_dispatchers_share_the_outbox_and_keep_each_keys_order() {
    let Some(url) = pg_url() else { return };
    // The server's clock (no manual clock): dispatchers' retries are real time.
    let schema = common::pg::fresh_schema("twodispatch");
    let open = || PgStore::builder(&url).schema(&schema).open().unwrap();
    let (node_a, node_b) = (open(), open());
    const KEYS: usize = 6;
    const PER_KEY: usize = 15;
    // Commit order per key: event i of key k is pushed by intent (k, i), one after another.
    for i in 0..PER_KEY {
        for k in 0..KEYS {
            let node = if (i + k) % 2 == 0 { &node_a } else { &node_b };
            let key = format!("push-{k}-{i}");
            let outcome = node
                .execute(request(&key), |tx| {
                    tx.outbox()
                        .push(Event::new("t", format!("{k}:{i}")).ordering_key(format!("k{k}")))?;
                    Ok(Response::new(201, "ok"))
                })
                .unwrap();
            assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
        }
    }
    let published: Arc<Mutex<Vec<Published>>> = Arc::default();
    let publisher = |name: &'static str| {
        let published = Arc::clone(&published);
        let mut calls = 0u64;
        move |e: &StoredEvent| -> Result<(), idem::error::BoxError> {
            calls += 1;
            // Each node fails now and then: retries must not let a later event of the key out
            // before the one that failed.
            if calls % 7 == 3 {
                return Err("broker busy".into());
            }
            std::thread::sleep(Duration::from_millis(1));
            let text = String::from_utf8_lossy(&e.payload).to_string();
            let (_, i) = text.split_once(':').unwrap();
            published.lock().unwrap().push((
                e.ordering_key.clone().unwrap(),
                i.parse().unwrap(),
                name,
            ));
            Ok(())
        }
    };
    let options = || {
        DispatcherOptions::new()
            .batch(4)
            .backoff(Duration::from_millis(5), Duration::from_millis(20))
            .idle_recheck(Duration::from_millis(20))
    };
    let da = node_a.start_dispatcher(publisher("a"), options()).unwrap();
    let db = node_b.start_dispatcher(publisher("b"), options()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while node_a.outbox_stats().unwrap().pending > 0 {
        assert!(Instant::now() < deadline, "the outbox did not drain");
        std::thread::sleep(Duration::from_millis(20));
    }
    da.shutdown().unwrap();
    db.shutdown().unwrap();
    let published = published.lock().unwrap().clone();
    let nodes: std::collections::HashSet<&str> = published.iter().map(|p| p.2).collect();
    assert_eq!(nodes.len(), 2, "both dispatchers published: {published:?}");
    for k in 0..KEYS {
        let key = format!("k{k}");
        let order: Vec<usize> = published
            .iter()
            .filter(|p| p.0 == key)
            .map(|p| p.1)
            .collect();
        // At least once, in commit order: a republish may repeat an event, never go back
        // before an earlier one of its key.
        let mut highest = None;
        for &i in &order {
            if let Some(h) = highest {
                assert!(i >= h, "{key}: event {i} published after {h}: {order:?}");
            }
            highest = Some(i);
        }
        let mut seen: Vec<usize> = order.clone();
        seen.dedup();
        assert_eq!(
            seen,
            (0..PER_KEY).collect::<Vec<_>>(),
            "{key}: every event, in order"
        );
    }
    assert_eq!(node_b.outbox_stats().unwrap().dead, 0);
    drop((node_a, node_b));
    let _ =
        common::pg::client(&url).batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
}
