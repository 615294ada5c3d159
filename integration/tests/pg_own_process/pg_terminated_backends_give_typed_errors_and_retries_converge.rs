//! `pg_terminate_backend` mid-commit: concurrent flow-A callers run while another connection
//! terminates the store's backends again and again (`SELECT pg_terminate_backend(pid) FROM
//! pg_stat_activity WHERE application_name = 'idem' AND pid <> pg_backend_pid()`, narrowed to
//! this process's client ports so other tests sharing the server keep theirs), and the callers
//! retry with the same key on errors.
//!
//! Proves: every error a caller sees is a typed `Error::OutcomeUnknown` or
//! `Error::Storage` (no panic, no other variant); retries with the same key converge to
//! `Ran` or `Replayed`; every key ends with exactly one effect (a commit that landed
//! behind an `OutcomeUnknown` is replayed on retry, never run again), at most one caller saw
//! `Ran` and every caller got the same answer for a key; and the store keeps working once
//! the terminations stop (it reconnects by itself).
//!
//! A second test terminates every pooled backend of an idle store at once (nothing in flight,
//! the server up) and expects its next call to be answered. It is ignored: the engine fails
//! the next calls (see its `ignore` reason).
//!
//! Needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when `IDEM_REQUIRE_PG`
//! or `CI` is set). Linux only (a process finds its own sockets in /proc).

#![cfg(feature = "postgres")]
#![cfg(target_os = "linux")]

use crate::common;
use crate::pg_fleet;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::XorShift;
use idem::{ExecuteAnswer, Request, Response, Scope};

use pg_fleet::{
    Calls, Converged, Load, Met, Schema, bump, check_converged, execute_until_settled,
    own_client_ports, terminate_own_backends, url_port,
};

const KEYS: usize = 300;
const CALLERS: usize = 6;
const PAUSE: Duration = Duration::from_millis(10);
const SETTLE_WITHIN: Duration = Duration::from_secs(60);
/// The default pool: `writers` (2) + 8 connections.
const POOL_SIZE: u64 = 10;

/// The tests of this file terminate every idem backend of this process: they must not run at
/// the same time (libtest runs the tests of one binary on several threads).
static SERIAL: Mutex<()> = Mutex::new(());

fn scope() -> Scope {
    Scope::new("fleet", "terminated")
}

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(scope(), key, key.as_bytes())
}

#[test]
fn terminated_backends_give_typed_errors_and_retries_converge() {
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let began = Instant::now();
    let port = url_port(&url);
    let schema = Schema::create(&url, "terminated");
    let store = schema.open();
    let done = AtomicBool::new(false);
    let terminated = AtomicI64::new(0);
    let rounds = AtomicI64::new(0);
    let settled = AtomicUsize::new(0);
    let load = Load {
        store: &store,
        schema: &schema.name,
        request,
        keys: KEYS,
        pause: PAUSE,
        settle_within: SETTLE_WITHIN,
        settled: &settled,
    };

    let results: Vec<Calls> = thread::scope(|s| {
        s.spawn(|| {
            let mut killer = common::pg::client(&url);
            let mut rng = XorShift(0x5eed_1dea);
            while !done.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(rng.range(5, 30)));
                terminated.fetch_add(terminate_own_backends(&mut killer, port), Ordering::Relaxed);
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        let callers: Vec<_> = (0..CALLERS)
            .map(|c| {
                let load = &load;
                s.spawn(move || load.run_caller(c, 77 + c as u64))
            })
            .collect();
        let joined: Vec<_> = callers.into_iter().map(|h| h.join()).collect();
        // Stops the terminations even if a caller panicked (the scope waits for the thread).
        done.store(true, Ordering::Relaxed);
        joined
            .into_iter()
            .map(|r| r.expect("a caller panicked"))
            .collect()
    });

    let terminated = terminated.into_inner();
    assert!(terminated > 0, "no backend was ever terminated");
    let Converged { met, unheard } = check_converged(&schema, request, KEYS, results);
    assert!(
        met.total() > 0,
        "{terminated} backends were terminated, yet no caller saw an error: the test proves nothing"
    );

    // The terminations have stopped: the store reconnects by itself, new keys converge. Each
    // error now costs a connection terminated before the stop, still idle in the pool (the
    // ignored test below): no more errors than the pool has connections.
    let mut after = Met::default();
    for i in 0..50 {
        let key = format!("after-{i}");
        let (outcome, m) = execute_until_settled(
            &store,
            &request(&key),
            |tx| {
                bump(tx, &schema.name, &key)?;
                Ok(Response::new(201, key.clone()))
            },
            PAUSE,
            Instant::now() + SETTLE_WITHIN,
        );
        after.add(m);
        assert!(
            matches!(outcome, ExecuteAnswer::Ran(_)),
            "{key}: {outcome:?}"
        );
    }
    let effects = schema.effects();
    assert!((0..50).all(|i| effects[&format!("after-{i}")] == 1));
    assert!(
        after.total() <= POOL_SIZE,
        "{after:?} errors after the terminations stopped, more than the {POOL_SIZE} pooled connections that may have been dead"
    );
    println!(
        "terminated backends: {terminated} terminated in {} rounds; callers met {} OutcomeUnknown and {} Storage errors, all converged ({unheard} keys executed by a call that got OutcomeUnknown, then replayed); after the terminations stopped {} errors; {:.1} s",
        rounds.into_inner(),
        met.outcome_unknown,
        met.storage,
        after.total(),
        began.elapsed().as_secs_f64()
    );
}

/// The store's backends on the server (by this process's client ports).
fn own_backends(c: &mut postgres::Client, port: u16) -> i64 {
    let ports = own_client_ports(port);
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'idem' AND client_port = ANY($1)",
        &[&ports],
    )
    .expect("count backends")
    .get(0)
}

#[test]
fn an_idle_store_whose_backends_were_all_terminated_answers_its_next_call() {
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let port = url_port(&url);
    let schema = Schema::create(&url, "idleterminated");
    let store = schema.open();
    let mut c = common::pg::client(&url);
    // Concurrent callers make the pool open several connections, left idle afterwards.
    thread::scope(|s| {
        for t in 0..8 {
            let store = &store;
            let schema = schema.name.as_str();
            s.spawn(move || {
                for i in 0..20 {
                    let key = format!("warm-{t}-{i}");
                    let outcome = store.execute(request(&key), |tx| {
                        bump(tx, schema, &key)?;
                        Ok(Response::new(201, key.clone()))
                    });
                    assert!(matches!(outcome, Ok(ExecuteAnswer::Ran(_))), "{outcome:?}");
                }
            });
        }
    });
    // Writes share the store's writer connections; holding several connections at once makes
    // the pool open more, all idle afterwards.
    let held: Vec<_> = (0..6)
        .map(|_| store.client().expect("a pooled connection"))
        .collect();
    drop(held);
    let idle = own_backends(&mut c, port);
    assert!(idle >= 3, "the warm-up left only {idle} pooled connections");
    let terminated = terminate_own_backends(&mut c, port);
    assert_eq!(terminated, idle);
    let waited = Instant::now();
    while own_backends(&mut c, port) > 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "backends did not exit"
        );
        thread::sleep(Duration::from_millis(10));
    }
    // Nothing was in flight: every pooled connection is dead, none is busy, the server is up.
    // The next call must be answered (the store replaces dead connections), not fail: count
    // the calls that fail before one is answered.
    let key = "next";
    let mut failed = Vec::new();
    let outcome = loop {
        let outcome = store.execute(request(key), |tx| {
            bump(tx, &schema.name, key)?;
            Ok(Response::new(201, key))
        });
        match outcome {
            Err(e) if failed.len() < 20 => failed.push(e),
            other => break other,
        }
    };
    assert!(
        matches!(outcome, Ok(ExecuteAnswer::Ran(_))),
        "after {} failures: {outcome:?}",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} calls failed after all {idle} idle pooled connections were terminated (the server was up): {:?}",
        failed.len(),
        failed
    );
    match store.execute(request("warm-0-0"), |_| panic!("runs again")) {
        Ok(ExecuteAnswer::Replayed(r)) => assert_eq!(r.body(), b"warm-0-0"),
        other => panic!("expected a replay, got {other:?}"),
    }
}
