//! Two OS processes, one database: two processes each open their own `PgStore` on the same
//! PostgreSQL schema (the server's clock, no manual clock; both opens race to create the
//! schema's tables), and race 8 threads each over the same 1,000 keys. Every thread walks all
//! keys in its own shuffled order and calls `execute` with a closure that bumps the key's row
//! in an effect table of the test's schema (in the transaction that records the answer) and
//! answers a body naming the key and the process that ran it.
//!
//! Proves, across processes: exactly 1,000 closures committed (every key's effect count is 1,
//! and exactly one `Ran` per key over both processes), and every answer any thread of
//! either process got for a key, executed or replayed, is byte for byte the answer of the one
//! run that executed it (and the one a third store replays afterwards).
//!
//! The test re-runs its own binary as the two children (the ignored `child_process_entry`,
//! driven by environment variables); each writes one line per answer to a file the parent
//! compares. Needs `IDEM_PG_URL` (tests/common/pg.rs: skipped without it, failing when
//! `IDEM_REQUIRE_PG` or `CI` is set).

#![cfg(feature = "postgres")]

use crate::common;
use crate::pg_fleet;

use std::collections::HashMap;
use std::io::Write;
use std::process::Stdio;
use std::thread;
use std::time::Instant;

use idem::postgres::PgStore;
use idem::{ExecuteAnswer, Request, Response, Scope};

use pg_fleet::{ChildGuard, Schema, answer_text, bump, child_command, shuffled};

const KEYS: usize = 1000;
const THREADS: usize = 8;
const CHILD: &str = "child_process_entry";
const URL_ENV: &str = "IDEM_FLEET_CHILD_URL";
const SCHEMA_ENV: &str = "IDEM_FLEET_CHILD_SCHEMA";
const OUT_ENV: &str = "IDEM_FLEET_CHILD_OUT";
const SEED_ENV: &str = "IDEM_FLEET_CHILD_SEED";

fn scope() -> Scope {
    Scope::new("fleet", "two_processes")
}

fn key_of(i: usize) -> String {
    format!("k{i}")
}

fn request(key: &str) -> Request {
    Request::from_canonical_bytes(scope(), key, key.as_bytes())
}

/// One answer a child got: `<key> <E|R> <pid> <answer text>`.
struct Line {
    key: String,
    executed: bool,
    pid: u32,
    answer: String,
}

fn parse(line: &str) -> Line {
    let mut parts = line.splitn(4, ' ');
    let (Some(key), Some(kind), Some(pid), Some(answer)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        panic!("malformed answer line {line:?}");
    };
    Line {
        key: key.to_owned(),
        executed: match kind {
            "E" => true,
            "R" => false,
            _ => panic!("malformed outcome in {line:?}"),
        },
        pid: pid.parse().expect("pid"),
        answer: answer.to_owned(),
    }
}

#[test]
fn two_processes_racing_on_one_database_cause_one_effect_per_key() {
    let Some(url) = common::pg::pg_url() else {
        return;
    };
    let began = Instant::now();
    let schema = Schema::create(&url, "twoprocs");
    let dir = tempfile::tempdir().expect("tempdir");
    let outs: Vec<_> = (0..2)
        .map(|n| dir.path().join(format!("answers-{n}")))
        .collect();
    // Both children are started before either is waited for: they open and race at once.
    let children: Vec<_> = outs
        .iter()
        .enumerate()
        .map(|(n, out)| {
            ChildGuard(
                child_command(&crate::common::test_name(module_path!(), CHILD))
                    .env(URL_ENV, &url)
                    .env(SCHEMA_ENV, &schema.name)
                    .env(OUT_ENV, out)
                    .env(SEED_ENV, n.to_string())
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn child"),
            )
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(|c| c.0.id()).collect();
    for mut child in children {
        let (status, stdout, stderr) = child.finish();
        assert!(
            status.success(),
            "child failed: {status}\n{stdout}\n{stderr}"
        );
        print!("{stdout}");
    }

    // Every answer of both processes, grouped by key.
    let mut by_key: HashMap<String, Vec<Line>> = HashMap::new();
    for out in &outs {
        let text = std::fs::read_to_string(out).expect("a child's answers");
        let mut n = 0;
        for line in text.lines() {
            let line = parse(line);
            assert!(
                pids.contains(&line.pid),
                "an answer from an unknown process"
            );
            by_key.entry(line.key.clone()).or_default().push(line);
            n += 1;
        }
        assert_eq!(n, KEYS * THREADS, "{out:?}: one answer per key and thread");
    }
    assert_eq!(by_key.len(), KEYS);

    let effects = schema.effects();
    assert_eq!(effects.len(), KEYS, "one effect row per key");
    let third = schema.open();
    let mut executed_by = [0usize; 2];
    for i in 0..KEYS {
        let key = key_of(i);
        assert_eq!(effects.get(&key), Some(&1), "{key}: effect count");
        let lines = &by_key[&key];
        assert_eq!(lines.len(), 2 * THREADS, "{key}: answers");
        let executed: Vec<&Line> = lines.iter().filter(|l| l.executed).collect();
        assert_eq!(
            executed.len(),
            1,
            "{key}: exactly one execution over both processes"
        );
        let first = executed[0];
        executed_by[pids
            .iter()
            .position(|&p| p == first.pid)
            .expect("known pid")] += 1;
        // The body names the process that ran the closure: the one that says Executed.
        let expected = answer_text(&Response::new(201, format!("{key} by {}", first.pid)));
        assert_eq!(first.answer, expected, "{key}");
        for l in lines {
            assert_eq!(
                l.answer, first.answer,
                "{key}: an answer of process {} differs from the executed one",
                l.pid
            );
        }
        match third.execute(request(&key), |_| panic!("{key} runs again")) {
            Ok(ExecuteAnswer::Replayed(r)) => assert_eq!(answer_text(&r), first.answer, "{key}"),
            other => panic!("{key}: expected a replay, got {other:?}"),
        }
    }
    println!(
        "two processes: executions per process {executed_by:?}, {} answers compared, {:.1} s",
        2 * THREADS * KEYS,
        began.elapsed().as_secs_f64()
    );
}

/// The body of each child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child processes of the two-process test"]
fn child_process_entry() {
    let (Ok(url), Ok(schema), Some(out)) = (
        std::env::var(URL_ENV),
        std::env::var(SCHEMA_ENV),
        std::env::var_os(OUT_ENV),
    ) else {
        return;
    };
    let seed: u64 = std::env::var(SEED_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let pid = std::process::id();
    let store: PgStore = PgStore::builder(&url)
        .schema(&schema)
        .open()
        .expect("child opens its own store");
    let lines: Vec<String> = thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = &store;
                let schema = schema.as_str();
                s.spawn(move || {
                    let mut lines = Vec::with_capacity(KEYS);
                    for i in shuffled(KEYS, seed * 1000 + t as u64 + 1) {
                        let key = key_of(i);
                        let outcome = store
                            .execute(request(&key), |tx| {
                                bump(tx, schema, &key)?;
                                Ok(Response::new(201, format!("{key} by {pid}")))
                            })
                            .unwrap_or_else(|e| panic!("{key}: execute: {e:?}"));
                        let (kind, r) = match &outcome {
                            ExecuteAnswer::Ran(r) => ("E", r),
                            ExecuteAnswer::Replayed(r) => ("R", r),
                            other => panic!("{key}: flow A answered {other:?}"),
                        };
                        lines.push(format!("{key} {kind} {pid} {}", answer_text(r)));
                    }
                    lines
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a child's thread"))
            .collect()
    });
    let mut file = std::fs::File::create(out).expect("create the answers file");
    for line in &lines {
        writeln!(file, "{line}").expect("write an answer");
    }
    file.sync_all().expect("sync the answers file");
    println!("\nchild {pid}: {} answers", lines.len());
}
