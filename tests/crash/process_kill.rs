//! A process running flow-A claims is killed with SIGKILL at random moments, again and again, on
//! the same store file: every claim it acknowledged is stored, no key has more than one effect,
//! nothing is half applied, and the file opens every time.
//!
//! The test re-executes its own binary as the child. The child opens the store (default
//! `Durability::Immediate`), prints `ready`, and runs four threads of `Store::execute` over a
//! shared key space, each closure bumping the key's row in the caller table `test.effects`; after
//! each `Ok` outcome it prints `ack <key>` (a complete line is an acknowledgement). The parent
//! waits for `ready`, sleeps a random 5–80 ms, SIGKILLs the child, reopens the store and checks
//! it. Each round starts a little before the highest key acknowledged so far, so the child
//! claims again keys an earlier child may or may not have committed when it died.
//!
//! `IDEM_KILL_ROUNDS` sets the number of kills (default 40; a slow machine stops the default run
//! after 60 s, never below 20 kills; e.g. 200 for a long run, which has no time limit), and
//! `IDEM_KILL_SEED` the seed of the random delays (default: from the clock; printed).

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]
#![cfg(unix)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::common;

use common::{EFFECTS, XorShift};
use idem::format::State;
use idem::{ExecuteAnswer, Request, Response, Scope, Store};

const CHILD_ENV: &str = "IDEM_KILL_CHILD";
const START_ENV: &str = "IDEM_KILL_START";
/// The child's test function, by its full name (`--exact`).
fn child_name() -> String {
    crate::common::test_name(module_path!(), "process_kill_child_entry")
}
const DEFAULT_ROUNDS: usize = 40;
/// The fewest kills of any run.
const MIN_KILLS: usize = 20;
/// The default run stops early (never below [`MIN_KILLS`] kills) past this budget.
const DEFAULT_BUDGET: Duration = Duration::from_secs(60);
/// How far below the highest acknowledged key the next child starts.
const OVERLAP: u64 = 64;
const THREADS: u64 = 4;
/// A child never outlives this, even if the parent died without killing it.
const CHILD_LIFETIME: Duration = Duration::from_secs(60);

fn scope() -> Scope {
    Scope::new("t", "kill")
}

fn key_of(i: u64) -> String {
    format!("k{i}")
}

/// Kills and reaps the child on every path out of a round, panics included: no zombies, no
/// orphan left writing to the file.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one child round produced, as seen by the parent.
struct Round {
    ready: bool,
    /// The child had exited before the kill (it must run until killed).
    exited_early: bool,
    acked: Vec<u64>,
    stderr: String,
}

/// Spawns a child claiming from key `start`, kills it `delay` after it printed `ready`, and
/// returns the acknowledgements it sent (complete lines only).
fn run_child(exe: &Path, path: &Path, start: u64, delay: Duration) -> Round {
    let mut child = ChildGuard(
        Command::new(exe)
            .args(["--exact", &child_name(), "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, path)
            .env(START_ENV, start.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child"),
    );
    let stdout = child.0.stdout.take().expect("child stdout");
    let mut stderr = child.0.stderr.take().expect("child stderr");
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    // Forwards complete lines; a line cut by the kill (no newline) is not an acknowledgement.
    let reader = thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        loop {
            let mut line = Vec::new();
            match stdout.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) if line.last() == Some(&b'\n') => {
                    line.pop();
                    if tx.send(line).is_err() {
                        break;
                    }
                }
                Ok(_) => break,
            }
        }
    });
    // Drained concurrently so the child never blocks on a full stderr pipe.
    let err_reader = thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    });

    let mut early = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ready = false;
    while !ready {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line == b"ready" => ready = true,
            Ok(line) => early.push(line),
            // Timed out, or the child closed stdout (exited) without getting ready.
            Err(_) => break,
        }
    }
    let mut exited_early = true;
    if ready {
        thread::sleep(delay);
        exited_early = child.0.try_wait().expect("try_wait").is_some();
    }
    child.0.kill().expect("SIGKILL the child");
    child.0.wait().expect("reap the child");
    drop(child);
    reader.join().expect("stdout reader");
    let stderr = err_reader.join().expect("stderr reader");
    let acked = early
        .into_iter()
        .chain(rx.try_iter())
        .filter_map(|line| {
            let line = String::from_utf8(line).ok()?;
            let i = line.strip_prefix("ack k")?.parse().ok()?;
            Some(i)
        })
        .collect();
    Round {
        ready,
        exited_early,
        acked,
        stderr,
    }
}

/// Every effect row of the caller table (key index → count).
fn effect_rows(store: &Store) -> HashMap<u64, u64> {
    common::all_effects(store)
        .into_iter()
        .map(|(k, v)| {
            let i = k
                .strip_prefix('k')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("unexpected effect row {k:?}"));
            (i, v)
        })
        .collect()
}

/// What [`check_store`] found.
struct Checked {
    /// Keys stored (record and effect).
    stored: usize,
    /// The largest effect count of any key.
    max_effects: u64,
    /// Keys stored but never acknowledged: claims a kill cut between their commit and their
    /// acknowledgement line (they replay, not run again, when claimed next).
    unacknowledged: Vec<u64>,
}

/// The checks after each kill.
fn check_store(store: &Store, acked: &HashMap<u64, usize>, round: usize) -> Checked {
    let rows = effect_rows(store);
    let max_effects = rows.values().copied().max().unwrap_or(0);
    // No key has more than one effect, and no effect row exists without its record: the record
    // and the effect commit together or not at all.
    for (&i, &n) in &rows {
        assert_eq!(n, 1, "round {round}: key k{i} has {n} effects");
        let record = store
            .get(&scope(), key_of(i))
            .expect("get")
            .unwrap_or_else(|| panic!("round {round}: k{i} has an effect but no record"));
        match &record.state {
            State::Completed(r) => {
                assert_eq!(r.status(), 200, "round {round}: k{i}");
                assert_eq!(r.body(), key_of(i).as_bytes(), "round {round}: k{i}");
            }
            other => panic!("round {round}: k{i} is stored as {other:?}"),
        }
    }
    // ... and no record exists without its effect.
    let stats = store.stats().expect("stats");
    assert_eq!(
        stats.records,
        rows.len() as u64,
        "round {round}: records vs effect rows ({stats:?})"
    );
    assert_eq!(stats.completed, stats.records, "round {round}: {stats:?}");
    // Acknowledged ⊆ stored.
    let lost: Vec<_> = acked.keys().filter(|i| !rows.contains_key(i)).collect();
    assert!(
        lost.is_empty(),
        "round {round}: {} acknowledged claims lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    store
        .check_expiry_index()
        .unwrap_or_else(|e| panic!("round {round}: expiry index: {e}"));
    Checked {
        stored: rows.len(),
        max_effects,
        unacknowledged: rows
            .keys()
            .copied()
            .filter(|i| !acked.contains_key(i))
            .collect(),
    }
}

#[test]
fn sigkill_loses_no_acknowledged_claim() {
    let overridden: Option<usize> = std::env::var("IDEM_KILL_ROUNDS")
        .ok()
        .map(|s| s.parse().expect("IDEM_KILL_ROUNDS is a number"));
    let rounds = overridden.unwrap_or(DEFAULT_ROUNDS);
    let seed: u64 = std::env::var("IDEM_KILL_SEED").map_or_else(
        |_| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
        },
        |s| s.parse().expect("IDEM_KILL_SEED is a number"),
    );
    println!("process kill: seed {seed} (IDEM_KILL_SEED={seed} repeats the delays)");
    let mut rng = XorShift(seed | 1);

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kill.redb");
    let exe = std::env::current_exe().expect("test binary");
    let began = Instant::now();

    // key index → in how many rounds it was acknowledged.
    let mut acked: HashMap<u64, usize> = HashMap::new();
    let mut high = 0u64; // one past the highest acknowledged key index
    let mut kills = 0;
    let mut rounds_with_acks = 0;
    let mut acks_total = 0;
    let mut max_effects = 0;
    let mut stored = 0;
    let mut rounds_cut_after_commit = 0;
    let mut seen_unacknowledged = HashSet::new();
    for round in 0..rounds {
        if overridden.is_none() && kills >= MIN_KILLS && began.elapsed() > DEFAULT_BUDGET {
            println!("process kill: time budget spent, stopping after {kills} kills");
            break;
        }
        let start = high.saturating_sub(OVERLAP);
        let delay = Duration::from_millis(rng.range(5, 80));
        let r = run_child(&exe, &path, start, delay);
        kills += 1;
        assert!(
            r.ready,
            "round {round}: the child never got ready (did its Store::open fail?):\n{}",
            r.stderr
        );
        assert!(
            !r.exited_early,
            "round {round}: the child exited on its own before the kill:\n{}",
            r.stderr
        );
        if !r.acked.is_empty() {
            rounds_with_acks += 1;
        }
        acks_total += r.acked.len();
        for &i in &r.acked {
            *acked.entry(i).or_default() += 1;
            high = high.max(i + 1);
        }

        // The file opens after every kill (redb recovers it), and holds what was acknowledged.
        let store = common::journal_from_env(Store::builder())
            .open(&path)
            .unwrap_or_else(|e| panic!("round {round}: the store does not open after a kill: {e}"));
        let checked = check_store(&store, &acked, round);
        stored = checked.stored;
        max_effects = max_effects.max(checked.max_effects);
        let mut cut = false;
        for i in checked.unacknowledged {
            cut |= seen_unacknowledged.insert(i);
        }
        rounds_cut_after_commit += usize::from(cut);
        drop(store);
    }

    // The only handle: redb's full integrity check, then every acknowledged claim replays its
    // first answer without running again.
    let mut store = common::journal_from_env(Store::builder())
        .open(&path)
        .expect("final open");
    assert!(
        store.check_integrity().expect("integrity check"),
        "redb found damage and had to repair the file"
    );
    for &i in acked.keys() {
        let key = key_of(i);
        let req = Request::from_canonical_bytes(scope(), key.as_str(), key.as_bytes());
        match store.execute(req, |_| panic!("k{i} was acknowledged, yet runs again")) {
            Ok(ExecuteAnswer::Replayed(r)) => assert_eq!(r.body(), key.as_bytes()),
            other => panic!("k{i}: expected a replay, got {other:?}"),
        }
    }
    max_effects = max_effects.max(check_store(&store, &acked, kills).max_effects);

    assert!(
        rounds_with_acks * 2 >= kills,
        "only {rounds_with_acks} of {kills} rounds acknowledged anything: the kills land too early"
    );
    println!(
        "process kill: {kills} kills ({rounds_with_acks} with acknowledgements, \
         {rounds_cut_after_commit} with a claim committed but not yet acknowledged), {acks_total} \
         acknowledged claims ({} distinct keys, {stored} stored), 0 lost, max effects per key \
         {max_effects}, {:.1} s",
        acked.len(),
        began.elapsed().as_secs_f64()
    );
}

/// The body of the child process; does nothing when run directly.
#[test]
#[ignore = "entry point of the child process of the process-kill test"]
fn process_kill_child_entry() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let start: u64 = std::env::var(START_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // The parent's environment, `IDEM_TEST_JOURNAL` included: a direct-mode run
    // (`IDEM_TEST_JOURNAL=0`) kills direct-mode children.
    let store = common::journal_from_env(Store::builder())
        .open(path)
        .expect("child opens the store");
    // On a line of its own: libtest's `test ... ` has no newline yet.
    say("\nready");
    let began = Instant::now();
    thread::scope(|s| {
        for t in 0..THREADS {
            let store = &store;
            s.spawn(move || {
                // Threads 0 and 1 claim the same keys in lockstep (a race on every key);
                // threads 2 and 3 run ahead over the even and the odd keys, so 0 and 1 mostly
                // replay what they committed, and the kill finds claims of every kind in flight.
                for j in 0.. {
                    if began.elapsed() > CHILD_LIFETIME {
                        std::process::exit(3);
                    }
                    let i = match t {
                        0 | 1 => start + j,
                        2 => start + 2 * j,
                        _ => start + 2 * j + 1,
                    };
                    let key = key_of(i);
                    let req = Request::from_canonical_bytes(scope(), key.as_str(), key.as_bytes());
                    let outcome = store
                        .execute(req, |tx| {
                            let mut table = tx.open_table(EFFECTS)?;
                            let n = table.get(key.as_str())?.map_or(0, |v| v.value());
                            table.insert(key.as_str(), n + 1)?;
                            Ok(Response::new(200, key.clone()))
                        })
                        .expect("execute");
                    match outcome {
                        ExecuteAnswer::Ran(r) | ExecuteAnswer::Replayed(r) => {
                            assert_eq!(r.body(), key.as_bytes());
                        }
                        other => panic!("flow A on a fresh clock gives {other:?}"),
                    }
                    say(&format!("ack {key}"));
                }
            });
        }
    });
}

/// One line to the parent, flushed; exits if the parent is gone (a broken pipe), so a child
/// never outlives a parent that died without killing it.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(2);
    }
}
