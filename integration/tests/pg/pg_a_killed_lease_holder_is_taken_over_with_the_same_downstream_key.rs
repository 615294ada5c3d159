//! SIGKILL while holding leases: a process that dies holding flow-B leases blocks its keys
//! only until the leases lapse on the database server's clock; then another node takes each
//! key over with the same downstream key, so a provider that dedupes on that key shows one
//! effect per intent.
//!
//! A child process (the test binary re-run as the ignored `child_process_entry`) opens its own
//! `PgStore` (server clock, 2 s leases), `begin`s `KEYS` keys, "calls a provider" for each
//! with the lease's downstream key (a row in a provider table of the test's schema: the
//! provider dedupes on the key, `INSERT … ON CONFLICT (idem_key) DO UPDATE SET calls = calls +
//! 1 RETURNING charge_id`, so a repeated call counts a call but creates no second charge),
//! prints what it holds and is SIGKILLed before completing anything. The parent is the other
//! node, with its own store:
//! - until a key's lease deadline (the child's, on the server's clock) it gets
//!   `BeginAnswer::InFlight` — checked against the server's clock read just before each `begin` —
//!   and never before the deadline `BeginAnswer::Acquired`;
//! - after it, `begin` takes the key over: `takeover_of() == Some(1)`, attempt 2, and the SAME
//!   downstream key the killed process sent;
//! - it calls the provider again and completes: the provider holds exactly one charge per key
//!   (the charge the child made) after two calls, and every later `begin`/`execute`, from this
//!   store and from a fresh one, replays the completed answer byte for byte.
//!
//! Needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when `IDEM_REQUIRE_PG`
//! or `CI` is set).

#![cfg(feature = "postgres")]
#![cfg(unix)]

use crate::common;
use crate::pg_fleet;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use idem::postgres::{PgLease, PgStore};
use idem::{BeginAnswer, ExecuteAnswer, Request, Response, Scope};

use pg_fleet::{ChildGuard, Schema, answer_text, child_command, server_now_ms};

const KEYS: usize = 16;
const LEASE: Duration = Duration::from_secs(2);
const CHILD: &str = "child_process_entry";
const URL_ENV: &str = "IDEM_FLEET_KILL_URL";
const SCHEMA_ENV: &str = "IDEM_FLEET_KILL_SCHEMA";
/// A child never outlives this, even if the parent died without killing it.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);

fn scope() -> Scope {
    Scope::new("fleet", "charge")
}

fn key_of(i: usize) -> String {
    format!("order-{i}")
}

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(scope(), key, format!("charge for {key}").as_bytes())
}

/// The provider's side of a call: the charge for `downstream_key` (created by the first call,
/// returned again by every later one) and how many calls it has seen for that key.
fn call_provider(c: &mut postgres::Client, schema: &str, downstream_key: &str) -> (i64, i64) {
    let row = c
        .query_one(
            &format!(
                "INSERT INTO {schema}.provider AS p (idem_key, calls) VALUES ($1, 1)
                 ON CONFLICT (idem_key) DO UPDATE SET calls = p.calls + 1
                 RETURNING charge_id, calls"
            ),
            &[&downstream_key],
        )
        .expect("call the provider");
    (row.get(0), row.get(1))
}

/// What the killed child said it held for one key.
#[derive(Debug, Clone)]
struct Held {
    downstream: String,
    charge: i64,
    deadline: i64,
}

#[test]
fn a_killed_lease_holder_is_taken_over_with_the_same_downstream_key() {
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let began = Instant::now();
    let schema = Schema::create(&url, "killedholder");
    let mut provider = common::pg::client(&url);
    provider
        .batch_execute(&format!(
            "CREATE TABLE {} (
                idem_key text PRIMARY KEY,
                charge_id int8 GENERATED ALWAYS AS IDENTITY,
                calls int8 NOT NULL
             )",
            schema.table("provider")
        ))
        .expect("create the provider table");
    // This node's store is open before the child starts, so its first look comes right after
    // the kill, well inside the child's leases.
    let store = schema.builder().lease_duration(LEASE).open().expect("open");
    let mut clock = common::pg::client(&url);

    let mut child = ChildGuard(
        child_command(&crate::common::test_name(module_path!(), CHILD))
            .env(URL_ENV, &url)
            .env(SCHEMA_ENV, &schema.name)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut held: HashMap<String, Held> = HashMap::new();
    let wait_until = Instant::now() + Duration::from_secs(30);
    loop {
        let left = wait_until.saturating_duration_since(Instant::now());
        let line = match rx.recv_timeout(left) {
            Ok(line) => line,
            Err(_) => {
                let (status, _, stderr) = child.finish();
                panic!("the child never said it holds its leases ({status}):\n{stderr}");
            }
        };
        if line == "holding" {
            break;
        }
        if let Some(rest) = line.strip_prefix("holds ") {
            let f: Vec<&str> = rest.split(' ').collect();
            assert_eq!(f.len(), 4, "malformed line {line:?}");
            held.insert(
                f[0].to_owned(),
                Held {
                    downstream: f[1].to_owned(),
                    charge: f[2].parse().expect("charge id"),
                    deadline: f[3].parse().expect("deadline"),
                },
            );
        }
    }
    // SIGKILL: no destructor runs, no lease is released; the leases stay in the database.
    child.0.kill().expect("SIGKILL the child");
    let status = child.0.wait().expect("reap the child");
    assert_eq!(status.signal(), Some(9), "the child died of SIGKILL");
    let killed_at = Instant::now();
    reader.join().expect("stdout reader");
    assert_eq!(held.len(), KEYS, "the child held every key");

    // Poll every key with `begin` until this node takes it over.
    let mut in_flight_seen: HashMap<String, u32> = HashMap::new();
    let mut taken: HashMap<String, PgLease> = HashMap::new();
    let last_deadline = held.values().map(|h| h.deadline).max().expect("keys");
    while taken.len() < KEYS {
        for i in 0..KEYS {
            let key = key_of(i);
            if taken.contains_key(&key) {
                continue;
            }
            let h = &held[&key];
            let before = server_now_ms(&mut clock);
            let begin = store.begin(request(&key)).expect("begin");
            let after = server_now_ms(&mut clock);
            match begin {
                BeginAnswer::InFlight { .. } => {
                    assert!(
                        before < h.deadline,
                        "{key}: still in flight at {before} ms, past its lease deadline {}",
                        h.deadline
                    );
                    *in_flight_seen.entry(key.clone()).or_default() += 1;
                }
                BeginAnswer::Acquired(lease) => {
                    assert!(
                        after >= h.deadline,
                        "{key}: taken over at {after} ms, before its lease deadline {}",
                        h.deadline
                    );
                    assert_eq!(
                        lease.takeover_of(),
                        Some(1),
                        "{key}: a takeover of attempt 1"
                    );
                    assert_eq!(lease.attempt(), 2, "{key}");
                    assert_eq!(
                        lease.downstream_key().to_hex(),
                        h.downstream,
                        "{key}: the takeover sends the killed attempt's downstream key"
                    );
                    taken.insert(key, lease);
                }
                other => panic!("{key}: expected InFlight or Acquired, got {other:?}"),
            }
        }
        let now = server_now_ms(&mut clock);
        assert!(
            now < last_deadline + 15_000,
            "keys still not taken over 15 s after their leases lapsed"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let waited = killed_at.elapsed();
    for i in 0..KEYS {
        let key = key_of(i);
        assert!(
            in_flight_seen.get(&key).is_some_and(|&n| n > 0),
            "{key}: never seen in flight after the kill (the machine took longer than the {LEASE:?} lease to look)"
        );
    }

    // This node calls the provider again with the same key and completes.
    let mut answers = HashMap::new();
    for i in 0..KEYS {
        let key = key_of(i);
        let lease = taken.remove(&key).expect("taken");
        let (charge, calls) = call_provider(&mut provider, &schema.name, &held[&key].downstream);
        assert_eq!(
            charge, held[&key].charge,
            "{key}: the provider deduped the second call onto the first charge"
        );
        assert_eq!(calls, 2, "{key}");
        let response = lease
            .complete(
                Response::new(200, format!("charged {charge}"))
                    .with_resource("charge", charge.to_string()),
            )
            .expect("complete the taken-over lease");
        answers.insert(key, answer_text(&response));
    }

    // The provider: one charge per key, two calls each.
    let rows = provider
        .query(
            &format!(
                "SELECT idem_key, charge_id, calls FROM {}",
                schema.table("provider")
            ),
            &[],
        )
        .expect("read the provider");
    assert_eq!(
        rows.len(),
        KEYS,
        "exactly one effect per key at the provider"
    );
    for row in rows {
        let (k, charge, calls): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
        let h = held
            .values()
            .find(|h| h.downstream == k)
            .unwrap_or_else(|| panic!("a provider row for an unknown key {k}"));
        assert_eq!(charge, h.charge);
        assert_eq!(calls, 2, "{k}: the killed call and the takeover's");
    }

    // Replays, from this node and from a fresh one, are the completed answer.
    let fresh: PgStore = schema.open();
    for i in 0..KEYS {
        let key = key_of(i);
        for s in [&store, &fresh] {
            match s.begin(request(&key)).expect("begin") {
                BeginAnswer::Replayed(r) => assert_eq!(answer_text(&r), answers[&key], "{key}"),
                other => panic!("{key}: expected a replay, got {other:?}"),
            }
            match s.execute(request(&key), |_| panic!("{key} runs again")) {
                Ok(ExecuteAnswer::Replayed(r)) => {
                    assert_eq!(answer_text(&r), answers[&key], "{key}")
                }
                other => panic!("{key}: expected a replay, got {other:?}"),
            }
        }
    }
    println!(
        "killed holder: {KEYS} keys taken over {:.2} s after the kill ({} in-flight answers before), {:.1} s in all",
        waited.as_secs_f64(),
        in_flight_seen.values().sum::<u32>(),
        began.elapsed().as_secs_f64()
    );
}

/// The body of the child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child process of the killed-holder test"]
fn child_process_entry() {
    let (Ok(url), Ok(schema)) = (std::env::var(URL_ENV), std::env::var(SCHEMA_ENV)) else {
        return;
    };
    let store = PgStore::builder(&url)
        .schema(&schema)
        .lease_duration(LEASE)
        .open()
        .expect("child opens its own store");
    let mut provider = common::pg::client(&url);
    let mut leases = Vec::new();
    for i in 0..KEYS {
        let key = key_of(i);
        let lease = match store.begin(request(&key)).expect("begin") {
            BeginAnswer::Acquired(lease) => lease,
            other => panic!("{key}: expected Acquired, got {other:?}"),
        };
        assert_eq!(lease.attempt(), 1);
        let downstream = lease.downstream_key().to_hex();
        let (charge, calls) = call_provider(&mut provider, &schema, &downstream);
        assert_eq!(calls, 1);
        say(&format!(
            "holds {key} {downstream} {charge} {}",
            lease.deadline().0
        ));
        leases.push(lease);
    }
    say("holding");
    // Holds the leases until SIGKILLed (a drop would release them).
    let began = Instant::now();
    while began.elapsed() < CHILD_LIFETIME {
        thread::sleep(Duration::from_millis(100));
    }
    std::process::exit(3);
}

/// One line to the parent (on a line of its own: libtest's `test … ` has no newline yet),
/// flushed; exits if the parent is gone.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "\n{line}")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(2);
    }
}
