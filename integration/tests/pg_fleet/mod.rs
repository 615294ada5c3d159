//! What the fleet tests (`integration/tests/pg/pg_*.rs`) share on top of
//! `tests/common/pg.rs`: a schema of the test's own for stores on the server's clock (the
//! harness's `PgHarness` injects a manual clock), the test's effect table, answers written as
//! comparable text, child processes that re-run the test binary, the server's clock, the
//! backends of this process, and the retry loop a caller of a fleet runs on connection failures.

#![allow(dead_code)] // Not every test uses every helper.

use std::collections::HashSet;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use idem::postgres::{PgStore, PgStoreBuilder, PgTx};
use idem::{Abort, Error, ExecuteAnswer, Request, Response};

use crate::common::pg::{client, fresh_schema};

/// A PostgreSQL schema of the test's own, dropped (with everything in it) when this is.
pub struct Schema {
    pub url: String,
    pub name: String,
}

impl Schema {
    /// Creates a fresh, empty schema with the test's effect table (`effects`: one row per key,
    /// `n` = how many committed runs of a closure touched it).
    pub fn create(url: &str, label: &str) -> Schema {
        let name = fresh_schema(label);
        let mut c = client(url);
        c.batch_execute(&format!(
            "CREATE SCHEMA {name};
             CREATE TABLE {name}.effects (key text PRIMARY KEY, n int8 NOT NULL);"
        ))
        .expect("create the test's schema");
        Schema {
            url: url.to_owned(),
            name,
        }
    }

    /// `{schema}.{table}`.
    pub fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.name)
    }

    /// A builder for a store on this schema, on the server's clock.
    pub fn builder(&self) -> PgStoreBuilder {
        PgStore::builder(&self.url).schema(&self.name)
    }

    /// A store on this schema with the default settings, on the server's clock.
    pub fn open(&self) -> PgStore {
        self.builder()
            .open()
            .expect("open a store on the test's schema")
    }

    /// The effect counts, key → committed runs.
    pub fn effects(&self) -> std::collections::HashMap<String, i64> {
        client(&self.url)
            .query(
                &format!("SELECT key, n FROM {}", self.table("effects")),
                &[],
            )
            .expect("read effects")
            .into_iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name));
        }
    }
}

/// Bumps the effect row of `key` in `schema`'s effect table, in the closure's transaction.
pub fn bump(tx: &mut PgTx<'_>, schema: &str, key: &str) -> Result<(), postgres::Error> {
    let statement = tx.prepare(&format!(
        "INSERT INTO {schema}.effects AS e (key, n) VALUES ($1, 1) \
         ON CONFLICT (key) DO UPDATE SET n = e.n + 1"
    ))?;
    tx.execute(&statement, &[&key])?;
    Ok(())
}

/// A response as one line of text holding every byte of it (status, failure flag, resource,
/// body in hex): two answers are byte-identical exactly when their texts are equal.
pub fn answer_text(r: &Response) -> String {
    let resource = r
        .resource()
        .map_or_else(|| "-".to_owned(), |res| format!("{}:{}", res.kind, res.id));
    format!(
        "status={} failed={} resource={} body={}",
        r.status(),
        r.is_failure(),
        resource,
        idem::format::to_hex(r.body())
    )
}

/// The server's clock, in milliseconds since the Unix epoch (the clock the engine decides by).
pub fn server_now_ms(c: &mut postgres::Client) -> i64 {
    c.query_one(
        "SELECT (extract(epoch from clock_timestamp()) * 1000)::int8",
        &[],
    )
    .expect("read the server's clock")
    .get(0)
}

/// The test binary re-run with only the ignored test `entry` (a child process's body).
pub fn child_command(entry: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = Command::new(exe);
    command
        .args(["--exact", entry, "--ignored", "--nocapture"])
        .args(["--test-threads", "1"]);
    command
}

/// Kills and reaps the child on every path out of the test, panics included: no orphan keeps
/// writing to the shared database.
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Waits for the child to exit, reading its stdout and stderr meanwhile (so it never
    /// blocks on a full pipe); returns its status and both texts.
    pub fn finish(&mut self) -> (std::process::ExitStatus, String, String) {
        use std::io::Read;
        let drain = |pipe: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut pipe) = pipe {
                    let _ = pipe.read_to_end(&mut buf);
                }
                String::from_utf8_lossy(&buf).into_owned()
            })
        };
        let out = drain(
            self.0
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let err = drain(
            self.0
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let status = self.0.wait().expect("wait for the child");
        (
            status,
            out.join().expect("stdout reader"),
            err.join().expect("stderr reader"),
        )
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The client ports of this process's TCP connections to `server_port` (Linux: the sockets
/// among /proc/self/fd, looked up in /proc/self/net/tcp{,6}). They name this process's backends
/// in `pg_stat_activity.client_port`, so a test can terminate its own store's backends without
/// touching those of other tests that share the server.
pub fn own_client_ports(server_port: u16) -> Vec<i32> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                let target = target.to_string_lossy().into_owned();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.insert(inode.to_owned());
                }
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 || !inodes.contains(fields[9]) {
                continue;
            }
            let port = |addr: &str| {
                addr.rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            };
            if port(fields[2]) == Some(server_port)
                && let Some(local) = port(fields[1])
            {
                ports.push(i32::from(local));
            }
        }
    }
    ports
}

/// The port of the server in a `postgresql://user@host:port/db` URL (5432 if none).
pub fn url_port(url: &str) -> u16 {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let host = host.split(['/', '?']).next().unwrap_or(host);
    host.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(5432)
}

/// Terminates the backends of this process's idem stores (`application_name = 'idem'`, the
/// engine's, on a client port of this process): the query of the issue, narrowed to this
/// process so other tests on the shared server keep their connections. Returns how many were
/// terminated.
pub fn terminate_own_backends(c: &mut postgres::Client, server_port: u16) -> i64 {
    let ports = own_client_ports(server_port);
    if ports.is_empty() {
        return 0;
    }
    c.query_one(
        "SELECT count(*) FILTER (WHERE t) FROM (
            SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity
            WHERE application_name = 'idem' AND pid <> pg_backend_pid()
              AND client_port = ANY($1)
         ) terminated",
        &[&ports],
    )
    .expect("terminate the store's backends")
    .get(0)
}

/// The errors a caller met before its call settled.
#[derive(Debug, Default, Clone, Copy)]
pub struct Met {
    pub outcome_unknown: u64,
    pub storage: u64,
}

impl Met {
    pub fn add(&mut self, other: Met) {
        self.outcome_unknown += other.outcome_unknown;
        self.storage += other.storage;
    }

    pub fn total(&self) -> u64 {
        self.outcome_unknown + self.storage
    }
}

/// Runs `execute` with the same request until it settles (`Ran` or `Replayed`), as a
/// caller of a fleet does: an [`Error::OutcomeUnknown`] or [`Error::Storage`] is retried
/// after `pause` (same key, same payload), any other error or outcome fails the test, and so
/// does a call that has not settled by `give_up`. Returns the settled outcome and the errors
/// met on the way.
pub fn execute_until_settled<F>(
    store: &PgStore,
    request: &Request,
    mut f: F,
    pause: Duration,
    give_up: Instant,
) -> (ExecuteAnswer, Met)
where
    F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<Response, Abort>,
{
    let mut met = Met::default();
    loop {
        match store.execute(request.clone(), &mut f) {
            Ok(o @ (ExecuteAnswer::Ran(_) | ExecuteAnswer::Replayed(_))) => return (o, met),
            Ok(other) => panic!("flow A on a live store answered {other:?}"),
            Err(Error::OutcomeUnknown { .. }) => met.outcome_unknown += 1,
            Err(Error::Storage { .. }) => met.storage += 1,
            Err(other) => panic!(
                "a connection failure surfaced as an error other than OutcomeUnknown or Storage: {other:?}"
            ),
        }
        assert!(
            Instant::now() < give_up,
            "the call for {:?} did not settle in time (errors so far: {met:?})",
            String::from_utf8_lossy(request.key())
        );
        std::thread::sleep(pause);
    }
}

/// `0..n` in an order drawn from `seed` (Fisher–Yates on xorshift64).
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = crate::common::XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        order.swap(i, j);
    }
    order
}

/// What one caller of [`run_caller`] got: per key, whether its call executed and the answer
/// text; and the errors it retried.
pub struct Calls {
    pub seen: Vec<(String, bool, String)>,
    pub met: Met,
}

/// The body caller `caller` answers for `key` when its closure runs.
pub fn caller_body(key: &str, caller: usize) -> String {
    format!("{key} by caller {caller}")
}

/// Flow-A load on a store: callers each walk keys `k0..k{keys}` in their own order, calling
/// `execute` for each (the closure bumps the key's effect row and answers [`caller_body`])
/// until it settles ([`execute_until_settled`], retrying after `pause`, failing past
/// `settle_within`); settled calls are counted in `settled`.
pub struct Load<'a> {
    pub store: &'a PgStore,
    pub schema: &'a str,
    pub request: fn(&str) -> Request,
    pub keys: usize,
    pub pause: Duration,
    pub settle_within: Duration,
    pub settled: &'a std::sync::atomic::AtomicUsize,
}

impl Load<'_> {
    /// Runs caller number `caller`, its order drawn from `seed`.
    pub fn run_caller(&self, caller: usize, seed: u64) -> Calls {
        let mut seen = Vec::with_capacity(self.keys);
        let mut met = Met::default();
        for i in shuffled(self.keys, seed) {
            let key = format!("k{i}");
            let (outcome, m) = execute_until_settled(
                self.store,
                &(self.request)(&key),
                |tx| {
                    bump(tx, self.schema, &key)?;
                    Ok(Response::new(201, caller_body(&key, caller)))
                },
                self.pause,
                Instant::now() + self.settle_within,
            );
            met.add(m);
            self.settled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (executed, r) = match &outcome {
                ExecuteAnswer::Ran(r) => (true, r),
                ExecuteAnswer::Replayed(r) => (false, r),
                other => unreachable!("settled outcomes only, not {other:?}"),
            };
            seen.push((key, executed, answer_text(r)));
        }
        Calls { seen, met }
    }
}

/// What [`check_converged`] found.
pub struct Converged {
    /// Every caller's errors.
    pub met: Met,
    /// Keys whose one execution no caller heard of: its commit landed behind an
    /// `OutcomeUnknown`, and every later call replayed it.
    pub unheard: usize,
}

/// The checks after [`run_caller`]s converged: every key `k0..k{keys}` has exactly one effect,
/// at most one caller saw `Ran`, every caller got the same answer, a caller's, and a fresh
/// store on `schema` replays it byte for byte.
pub fn check_converged(
    schema: &Schema,
    request: fn(&str) -> Request,
    keys: usize,
    results: Vec<Calls>,
) -> Converged {
    let callers = results.len();
    let mut met = Met::default();
    let mut by_key: std::collections::HashMap<String, Vec<(bool, String)>> =
        std::collections::HashMap::new();
    for calls in results {
        met.add(calls.met);
        for (key, executed, answer) in calls.seen {
            by_key.entry(key).or_default().push((executed, answer));
        }
    }
    let effects = schema.effects();
    assert_eq!(effects.len(), keys, "one effect row per key");
    // A store of its own replays: a caller's store may still hold dead pooled connections.
    let replayer = schema.open();
    let mut unheard = 0;
    for i in 0..keys {
        let key = format!("k{i}");
        assert_eq!(effects.get(&key), Some(&1), "{key}: effects after retries");
        let answers = &by_key[&key];
        assert_eq!(answers.len(), callers, "{key}: one answer per caller");
        let executed = answers.iter().filter(|(e, _)| *e).count();
        assert!(executed <= 1, "{key}: executed {executed} times");
        unheard += usize::from(executed == 0);
        let first = &answers[0].1;
        assert!(
            (0..callers).any(|c| *first == answer_text(&Response::new(201, caller_body(&key, c)))),
            "{key}: {first} is no caller's answer"
        );
        for (_, a) in answers {
            assert_eq!(a, first, "{key}: two callers got different answers");
        }
        match replayer.execute(request(&key), |_| panic!("{key} runs again")) {
            Ok(ExecuteAnswer::Replayed(r)) => assert_eq!(&answer_text(&r), first, "{key}"),
            other => panic!("{key}: expected a replay, got {other:?}"),
        }
    }
    Converged { met, unheard }
}
