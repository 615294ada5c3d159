//! Crash-point enumeration: for each operation, count the `sync_data` calls
//! S it makes, then for every k in 0..=S take the durable image as it was right after sync k
//! (k = 0: before the operation), open a store on it and check the invariants:
//!
//! - the file opens;
//! - effects per key ≤ 1 (and a retry after the crash brings every key to exactly 1);
//! - a caller row exists iff its record (or inbox mark, or outbox event) exists: nothing is
//!   half-applied;
//! - an operation acknowledged by sync k is present in image k;
//! - `Store::check_expiry_index` is Ok.
//!
//! Besides the sync images, every write the operation makes is a torn-commit crash point: the
//! image where every write so far reached the disk (in order) but the next sync never ran. The
//! same invariants hold there, with "acknowledged" meaning acknowledged by the syncs done.
//!
//! The outbox delivery mark (the dispatcher's commit after `Publisher::publish` returned Ok)
//! is enumerated the same way: each event is either still pending (it will be published again,
//! with the same id: at-least-once) or gone because the whole round's mark committed.
//!
//! Journal mode (`journal_*`): the same operations, and the journal's own (appends pipelined
//! behind a sync, a wrap, a checkpoint under load, an unregistered table, an oversized entry, the
//! close, recovery), on a [`CountingPair`]: the store file and its journal under one counter, so
//! a crash point freezes both (see the section below). The `a_broken_recovery_is_caught_*` tests
//! turn on a white-box switch that breaks one step and assert the enumeration then fails.
//!
//! Each test prints its figure (`crash points: <op>: S=…`); run with `--nocapture` to see them.

// White-box hooks (`Store::check_expiry_index`): compiled only with the internal feature, which
// this repository's own tests always have (Cargo.toml's dev-dependency on the package itself).
#![cfg(feature = "__internal_whitebox")]

use crate::common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use idem::clock::ManualClock;
use idem::error::BoxError;
use idem::format::State;
use idem::inbox::ProcessAnswer;
use idem::outbox::{DispatcherOptions, Event, EventId, StoredEvent};
use idem::{BeginAnswer, ExecuteAnswer, Response, Scope, Store, StoreBuilder};

fn open(backend: impl idem::redb::StorageBackend, clock: &ManualClock) -> Store {
    Store::builder()
        .clock(clock.clone())
        .sweep_batch(2)
        .open_with_backend(backend)
        .expect("the crash image opens")
}

fn scope() -> Scope {
    Scope::new("t", "op")
}

fn claim(store: &Store, key: &str) -> Result<ExecuteAnswer, idem::Error> {
    store.execute(req("t", "op", key, b"p"), |tx| {
        bump(tx, key)?;
        Ok(Response::new(201, key.to_owned()))
    })
}

fn has_record(store: &Store, key: &str) -> bool {
    store.get(&scope(), key).expect("get").is_some()
}

/// Runs `setup`, then `op` while counting syncs, then checks every crash image with the
/// common invariants and `check(store, k, S, &ack)`. Returns S.
fn enumerate<P, A>(
    disk: Disk,
    name: &str,
    setup: impl FnOnce(&Store, &ManualClock) -> P,
    op: impl FnOnce(&Store, &dyn Syncs, P) -> A,
    check: impl Fn(&Store, usize, usize, bool, &A),
) -> usize {
    let check = |store: &Store, _: &ManualClock, k, s, torn, ack: &A| check(store, k, s, torn, ack);
    match disk {
        Disk::Direct => enumerate_with_clock(name, setup, op, check),
        Disk::Journal(settings) => enumerate_journal(
            &format!("journal: {name}"),
            settings,
            |store, clock, _| setup(store, clock),
            |slot, pair, p| op(slot.as_ref().expect("the store is open"), pair, p),
            check,
        ),
    }
}

/// Counts the syncs of the disk an enumeration runs on.
trait Syncs: Sync {
    /// Syncs since the mark.
    fn syncs(&self) -> usize;
}

impl Syncs for CountingBackend {
    fn syncs(&self) -> usize {
        CountingBackend::syncs(self)
    }
}

impl Syncs for CountingPair {
    fn syncs(&self) -> usize {
        CountingPair::syncs(self)
    }
}

/// Where an operation is enumerated.
#[derive(Clone, Copy)]
enum Disk {
    /// Direct mode (durable redb commits) on one counting file.
    Direct,
    /// Journal mode on a [`CountingPair`], the builder configured by the function.
    Journal(fn(StoreBuilder) -> StoreBuilder),
}

/// [`enumerate`], with the (shared, manual) clock passed to `check` too.
fn enumerate_with_clock<P, A>(
    name: &str,
    setup: impl FnOnce(&Store, &ManualClock) -> P,
    op: impl FnOnce(&Store, &dyn Syncs, P) -> A,
    check: impl Fn(&Store, &ManualClock, usize, usize, bool, &A),
) -> usize {
    let backend = CountingBackend::default();
    let clock = ManualClock::new(T0);
    let store = open(backend.clone(), &clock);
    let prepared = setup(&store, &clock);
    backend.mark();
    let ack = op(&store, &backend as &dyn Syncs, prepared);
    let s = backend.syncs();
    let images: Vec<(usize, Vec<u8>)> = (0..=s).map(|k| (k, backend.image_at_sync(k))).collect();
    let torn = backend.torn_images();
    assert!(s >= 1, "{name}: the operation never synced");
    let n_torn = torn.len();
    for (torn_image, (k, image)) in images
        .into_iter()
        .map(|i| (false, i))
        .chain(torn.into_iter().map(|i| (true, i)))
    {
        let kind = if torn_image {
            "torn commit after sync"
        } else {
            "crash after sync"
        };
        let ctx = format!("{name}, {kind} {k}/{s}");
        let reopened = open(crash_backend_from_image(image), &clock);
        for (label, n) in all_effects(&reopened) {
            assert!(n <= 1, "{ctx}: {label} has {n} effects");
        }
        reopened
            .check_expiry_index()
            .unwrap_or_else(|e| panic!("{ctx}: expiry index: {e}"));
        check(&reopened, &clock, k, s, torn_image, &ack);
        assert!(reopened.fail_stop_cause().is_none(), "{ctx}");
    }
    eprintln!(
        "crash points: {name}: S={s} syncs, {} sync images + {n_torn} torn-write images checked",
        s + 1
    );
    drop(ack);
    drop(store);
    s
}

#[test]
fn flow_a_claim() {
    flow_a_claim_on(Disk::Direct);
}

#[test]
fn journal_flow_a_claim() {
    flow_a_claim_on(Disk::Journal(journaled));
}

fn flow_a_claim_on(disk: Disk) {
    enumerate(
        disk,
        "flow-A claim",
        |_, _| (),
        |store, _, ()| {
            assert!(matches!(claim(store, "a"), Ok(ExecuteAnswer::Ran(_))));
        },
        |store, k, s, _, _| {
            let rec = has_record(store, "a");
            assert_eq!(rec, effects(store, "a") == 1, "k={k}: half-applied");
            if k == s {
                assert!(rec, "the acknowledged claim was lost");
            }
            // The retry after the crash: exactly one effect, whichever side of the crash.
            let again = claim(store, "a").expect("retry");
            assert_eq!(again.is_replay(), rec, "k={k}");
            assert_eq!(effects(store, "a"), 1);
        },
    );
}

#[test]
fn lease_begin() {
    lease_begin_on(Disk::Direct);
}

#[test]
fn journal_lease_begin() {
    lease_begin_on(Disk::Journal(journaled));
}

fn lease_begin_on(disk: Disk) {
    enumerate(
        disk,
        "lease begin",
        |_, _| (),
        |store, _, ()| acquired(store.begin(req("t", "op", "L", b"p"))),
        |store, k, s, _, _| {
            let rec = store.get(&scope(), "L").expect("get");
            match &rec {
                None => assert!(k < s, "the acknowledged lease was lost"),
                Some(r) => assert!(matches!(r.state, State::Pending { .. }), "{r:?}"),
            }
            // A lease that landed was granted by the crashed store: the reopened store takes
            // it over at once (attempt 2); one that did not land is claimed afresh.
            match store.begin(req("t", "op", "L", b"p")) {
                Ok(BeginAnswer::Acquired(lease)) => assert_eq!(
                    lease.takeover_of(),
                    rec.as_ref().map(|_| 1),
                    "k={k}: {rec:?}"
                ),
                other => panic!("k={k}: {other:?}"),
            }
        },
    );
}

#[test]
fn lease_complete() {
    lease_complete_on(Disk::Direct);
}

#[test]
fn journal_lease_complete() {
    lease_complete_on(Disk::Journal(journaled));
}

fn lease_complete_on(disk: Disk) {
    enumerate(
        disk,
        "lease complete",
        |store, _| acquired(store.begin(req("t", "op", "L", b"p"))),
        |_, _, lease| {
            lease
                .complete(Response::new(201, "charged"))
                .expect("complete")
        },
        |store, k, s, _, _| {
            let rec = store
                .get(&scope(), "L")
                .expect("get")
                .expect("the lease record was durable before the completion");
            match &rec.state {
                State::Pending { .. } => assert!(k < s, "the acknowledged completion was lost"),
                State::Completed(r) => assert_eq!(r.body(), b"charged"),
                other => panic!("k={k}: unexpected state {other:?}"),
            }
        },
    );
}

#[test]
fn inbox_process() {
    inbox_process_on(Disk::Direct);
}

#[test]
fn journal_inbox_process() {
    inbox_process_on(Disk::Journal(journaled));
}

fn inbox_process_on(disk: Disk) {
    enumerate(
        disk,
        "inbox process",
        |_, _| (),
        |store, _, ()| {
            let r = store.process("sub", "m1", |tx| {
                bump(tx, "m1")?;
                Ok(())
            });
            assert!(matches!(r, Ok(ProcessAnswer::Ran(()))), "{r:?}");
        },
        |store, k, s, _, _| {
            let marked = store.inbox_mark("sub", "m1").expect("mark").is_some();
            assert_eq!(marked, effects(store, "m1") == 1, "k={k}: half-applied");
            if k == s {
                assert!(marked, "the acknowledged message was lost");
            }
            let again = store
                .process("sub", "m1", |tx| {
                    bump(tx, "m1")?;
                    Ok(())
                })
                .expect("redelivery");
            assert_eq!(
                matches!(again, ProcessAnswer::Duplicate { .. }),
                marked,
                "k={k}"
            );
            assert_eq!(effects(store, "m1"), 1);
        },
    );
}

#[test]
fn execute_with_outbox_event() {
    execute_with_outbox_event_on(Disk::Direct);
}

#[test]
fn journal_execute_with_outbox_event() {
    execute_with_outbox_event_on(Disk::Journal(journaled));
}

fn execute_with_outbox_event_on(disk: Disk) {
    enumerate(
        disk,
        "execute + outbox push",
        |_, _| (),
        |store, _, ()| {
            let r = store.execute(req("t", "op", "o", b"p"), |tx| {
                bump(tx, "o")?;
                tx.outbox().push(Event::new("topic", b"x".to_vec()))?;
                Ok(Response::new(201, "o"))
            });
            assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
        },
        |store, k, s, _, _| {
            let rec = has_record(store, "o");
            let pending = store.outbox_stats().expect("stats").pending;
            assert!(pending <= 1, "k={k}: {pending} events");
            assert_eq!(rec, effects(store, "o") == 1, "k={k}: record vs caller row");
            assert_eq!(rec, pending == 1, "k={k}: record vs outbox event");
            if k == s {
                assert!(rec, "the acknowledged execute was lost");
            }
        },
    );
}

#[test]
fn sweep_of_expired_records() {
    sweep_of_expired_records_on(Disk::Direct);
}

#[test]
fn journal_sweep_of_expired_records() {
    sweep_of_expired_records_on(Disk::Journal(journaled));
}

fn sweep_of_expired_records_on(disk: Disk) {
    const N: usize = 5;
    let s = enumerate(
        disk,
        "sweep (5 expired records, batches of 2)",
        |store, clock| {
            for i in 0..N {
                assert!(matches!(
                    claim(store, &format!("s{i}")),
                    Ok(ExecuteAnswer::Ran(_))
                ));
            }
            // Past the response window and the tombstone horizon: every record is forgotten.
            clock.advance(Duration::from_secs(30 * 24 * 3600));
        },
        |store, _, ()| {
            let report = store.sweep().expect("sweep");
            assert_eq!(report.deleted, N as u64, "{report:?}");
            assert_eq!(report.batches, 3, "{report:?}");
        },
        |store, k, s, torn, _| {
            let rows = record_rows(store);
            // Batches of 2 are all-or-nothing. A torn image may already hold a commit whose
            // sync had not returned (its header write reached the disk): not acknowledged, so
            // allowed; a sync image before the first sync holds none.
            assert!(
                [5, 3, 1, 0].contains(&rows),
                "k={k}: {rows} rows: a torn batch"
            );
            if k == 0 && !torn {
                assert_eq!(rows, N as u64, "nothing was swept before the first sync");
            }
            if k == s {
                assert_eq!(rows, 0, "the acknowledged sweep was lost");
            }
            // Each record is either whole or gone; the caller's rows are never touched.
            for i in 0..N {
                let key = format!("s{i}");
                if let Some(r) = store.get(&scope(), &key).expect("get") {
                    assert!(matches!(r.state, State::Completed(_)), "{r:?}");
                }
                assert_eq!(effects(store, &key), 1);
            }
        },
    );
    assert!(s >= 3, "one sync per batch at least, got {s}");
}

#[test]
fn group_commit_batch() {
    group_commit_batch_on(Disk::Direct);
}

#[test]
fn journal_group_commit_batch() {
    group_commit_batch_on(Disk::Journal(journaled));
}

fn group_commit_batch_on(disk: Disk) {
    const N: usize = 6;
    enumerate(
        disk,
        "group-commit batch (gate + 6 threads)",
        |_, _| (),
        |store, backend, ()| {
            let (held_tx, held_rx) = mpsc::channel::<()>();
            let (release_tx, release_rx) = mpsc::channel::<()>();
            let (done_tx, done_rx) = mpsc::channel();
            let commits_before = store.metrics().commits;
            thread::scope(|sc| {
                let gate_done = done_tx.clone();
                sc.spawn(move || {
                    let r = store.execute(req("t", "op", "gate", b"p"), |tx| {
                        bump(tx, "gate")?;
                        held_tx.send(()).expect("test alive");
                        release_rx.recv().expect("released");
                        Ok(Response::new(200, "gate"))
                    });
                    assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
                    gate_done
                        .send(("gate".to_owned(), backend.syncs()))
                        .expect("test alive");
                });
                held_rx.recv().expect("gate holds the writer");
                for i in 0..N {
                    let done = done_tx.clone();
                    sc.spawn(move || {
                        let key = format!("g{i}");
                        let r = claim(store, &key);
                        assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
                        // Read after the answer: an upper bound on the sync that made it durable.
                        done.send((key, backend.syncs())).expect("test alive");
                    });
                    wait_for_queue(store, i + 1);
                }
                release_tx.send(()).expect("gate alive");
            });
            let acks: Vec<(String, usize)> = done_rx.try_iter().collect();
            assert_eq!(acks.len(), N + 1);
            let commits = store.metrics().commits - commits_before;
            assert!(
                commits < (N + 1) as u64,
                "the queued callers were not batched ({commits} commits)"
            );
            acks
        },
        |store, k, _, _, acks| {
            for (key, acked_by) in acks {
                let rec = has_record(store, key);
                assert_eq!(rec, effects(store, key) == 1, "k={k}, {key}: half-applied");
                if *acked_by <= k {
                    assert!(
                        rec,
                        "k={k}: {key}, acknowledged by sync {acked_by}, was lost"
                    );
                }
            }
        },
    );
}

/// Waits (bounded, real time) for a background dispatcher's progress.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        thread::sleep(Duration::from_millis(2));
    }
}

/// The pending outbox events as (payload, id, failed attempts), in commit order.
fn pending(store: &Store) -> Vec<(String, EventId, u32)> {
    store
        .pending_events(100)
        .expect("pending events")
        .into_iter()
        .map(|e| {
            (
                String::from_utf8_lossy(&e.payload).into_owned(),
                e.id,
                e.failed_attempts,
            )
        })
        .collect()
}

/// Four committed events (a1, a2 with ordering key "a", b1 with key "b", c1 with no key),
/// each pushed by a flow-A claim that also bumps its caller row. The dispatcher's first round
/// publishes all four: a1, a2 and b1 succeed, c1 fails once. The round's delivery marks (three
/// deletions) and c1's failure record (attempts 1, a retry time) commit in one write
/// transaction. Every crash image holds all four events untouched (the mark was lost: all four
/// are published again) or only c1 with one failed attempt (the mark committed) — never a
/// subset of the deletions, nor the deletions without the failure record or the reverse. The
/// business rows and records are never touched; a dispatcher on the reopened store publishes
/// exactly the events still pending, with their original ids, a1 before a2.
#[test]
fn outbox_delivered_mark() {
    const EVENTS: [(&str, Option<&str>); 4] = [
        ("a1", Some("a")),
        ("a2", Some("a")),
        ("b1", Some("b")),
        ("c1", None),
    ];
    enumerate_with_clock(
        "outbox delivered mark (dispatcher round: 3 delivered, 1 failed)",
        |store, _| {
            for (name, key) in EVENTS {
                let r = store.execute(req("t", "op", name, b"p"), |tx| {
                    bump(tx, name)?;
                    let mut event = Event::new("topic", name.as_bytes().to_vec());
                    if let Some(key) = key {
                        event = event.ordering_key(key);
                    }
                    tx.outbox().push(event)?;
                    Ok(Response::new(201, name.to_owned()))
                });
                assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
            }
            let before = pending(store);
            assert_eq!(before.len(), EVENTS.len());
            assert!(before.iter().all(|(_, _, failed)| *failed == 0));
            before
        },
        |store, backend, before| {
            let (tx, calls) = mpsc::channel::<(String, EventId)>();
            let handle = store
                .start_dispatcher(
                    move |e: &StoredEvent| -> Result<(), BoxError> {
                        let name = String::from_utf8_lossy(&e.payload).into_owned();
                        let _ = tx.send((name.clone(), e.id));
                        if name == "c1" {
                            Err("broker refused c1".into())
                        } else {
                            Ok(())
                        }
                    },
                    // The failed event's retry is a minute away on the manual clock, which
                    // does not move: the round's mark is the only commit.
                    DispatcherOptions::new()
                        .backoff(Duration::from_secs(60), Duration::from_secs(120))
                        .idle_recheck(Duration::from_secs(3600)),
                )
                .expect("start dispatcher");
            wait_until("the round's delivery mark", || {
                let m = store.outbox_metrics();
                m.delivered == 3 && m.publish_failures == 1
            });
            handle.shutdown().expect("shutdown");
            let published: Vec<(String, EventId)> = calls.try_iter().collect();
            let names: Vec<&str> = published.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["a1", "a2", "b1", "c1"], "one round, commit order");
            let after = pending(store);
            assert_eq!(after.len(), 1, "{after:?}");
            assert_eq!((after[0].0.as_str(), after[0].2), ("c1", 1));
            // Only the mark committed since the mark() in enumerate.
            assert_eq!(backend.syncs(), 1, "the delivery mark is one commit");
            before
        },
        |store, clock, k, s, torn, before| {
            let now = pending(store);
            let untouched = now == *before;
            let marked =
                now.len() == 1 && now[0].0 == "c1" && now[0].1 == before[3].1 && now[0].2 == 1;
            assert!(
                untouched || marked,
                "k={k}/{s} torn={torn}: half-applied delivery mark: {now:?}"
            );
            if k == 0 && !torn {
                assert!(untouched, "marked before its commit");
            }
            if k == s && !torn {
                assert!(marked, "the acknowledged delivery mark was lost");
            }
            assert_eq!(store.outbox_stats().expect("stats").dead, 0);
            // Business rows and records untouched.
            for (name, _) in EVENTS {
                assert_eq!(effects(store, name), 1, "k={k}: {name}");
                let rec = store.get(&scope(), name).expect("get").expect("record");
                assert!(matches!(rec.state, State::Completed(_)), "{rec:?}");
            }
            // At-least-once: a dispatcher on the reopened store publishes exactly what is
            // still pending, with the original ids, in per-key commit order. The failed
            // event's retry (at most two minutes away) is made due by moving the clock.
            let (tx, calls) = mpsc::channel::<(String, EventId)>();
            let handle = store
                .start_dispatcher(
                    move |e: &StoredEvent| -> Result<(), BoxError> {
                        let _ = tx.send((String::from_utf8_lossy(&e.payload).into_owned(), e.id));
                        Ok(())
                    },
                    DispatcherOptions::new().idle_recheck(Duration::from_millis(20)),
                )
                .expect("start dispatcher");
            if marked {
                // Records keep a day: three minutes per image changes no answer.
                clock.advance(Duration::from_secs(180));
                handle.wake();
            }
            wait_until("redelivery", || {
                store.outbox_stats().expect("stats").pending == 0
            });
            handle.shutdown().expect("shutdown");
            let redelivered: Vec<(String, EventId)> = calls.try_iter().collect();
            let expected: Vec<(String, EventId)> =
                now.iter().map(|(n, id, _)| (n.clone(), *id)).collect();
            assert_eq!(redelivered, expected, "k={k}: redelivery");
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Journal mode (the default, `StoreBuilder::journal`; docs/design.md "Claims at the speed of a log",
// "### Tests", "Crash points"): the store file and its journal on one [`CountingPair`], so every
// crash point freezes both files at the same instant. Every sync of either file is a crash
// point (both durable images), and every write of either file a torn one (the file written:
// every write so far; the other: its durable image; and, when the other also holds unsynced
// writes, both files' live images) and a process kill (the reopen reads every write, a power
// loss after it keeps only what was synced). Each image is reopened with the invariants above,
// plus one: a second crash right after the reopen (its durable images, taken while it is still
// open) and a third after the operation's own checks (which retry and read) keep every answer
// the reopened store gave.
// ---------------------------------------------------------------------------------------------

/// Journal mode: batches decide against the published snapshot plus the entries not yet
/// applied, and the applier thread applies durable entries to redb with non-durable commits
/// and makes the checkpoints, which land wherever the thread runs them among the operation's
/// syncs. A small journal (its capacity is copied at every crash point) whose checkpoints are
/// far apart.
fn journaled(b: StoreBuilder) -> StoreBuilder {
    b.journal(true)
        .journal_capacity(64 << 10)
        .checkpoint_bytes(32 << 10)
}

/// [`journaled`] with a checkpoint every 16 KiB of frames.
fn journaled_checkpoints(b: StoreBuilder) -> StoreBuilder {
    journaled(b).checkpoint_bytes(16 << 10)
}

fn open_journaled(
    settings: fn(StoreBuilder) -> StoreBuilder,
    store: impl idem::redb::StorageBackend,
    journal: impl idem::redb::StorageBackend,
    clock: &ManualClock,
) -> Result<Store, idem::Error> {
    settings(Store::builder().clock(clock.clone()).sweep_batch(2))
        .open_with_backends(store, journal)
}

/// Everything a reopened store answers about the keys the operations use: each effect counter,
/// the record rows, each key's record and inbox mark, the pending outbox events.
fn answers(store: &Store) -> String {
    use std::fmt::Write as _;
    let effects = all_effects(store);
    let mut out = format!("effects {effects:?}\nrecord rows {}\n", record_rows(store));
    let mut keys: std::collections::BTreeSet<String> =
        effects.into_iter().map(|(k, _)| k).collect();
    keys.extend(["L", "a", "o", "m1"].map(str::to_owned));
    for key in keys {
        let record = store.get(&scope(), &key).expect("get");
        let mark = store.inbox_mark("sub", &key).expect("inbox mark").is_some();
        let _ = writeln!(out, "{key}: {record:?}, inbox mark {mark}");
    }
    let _ = write!(out, "outbox {:?}", pending(store));
    out
}

/// The invariants every reopened image keeps, whatever the operation.
fn common_invariants(store: &Store, ctx: &str) {
    for (label, n) in all_effects(store) {
        assert!(n <= 1, "{ctx}: {label} has {n} effects");
    }
    store
        .check_expiry_index()
        .unwrap_or_else(|e| panic!("{ctx}: expiry index: {e}"));
}

/// Opens the pair of images a crash of `live` (two backends, their store still open) leaves,
/// and checks it answers as `expected` did.
fn crash_again(
    settings: fn(StoreBuilder) -> StoreBuilder,
    live: &(CrashBackend, CrashBackend),
    clock: &ManualClock,
    expected: &str,
    ctx: &str,
) {
    let again = open_journaled(settings, live.0.crash(), live.1.crash(), clock)
        .unwrap_or_else(|e| panic!("{ctx}: the second crash's images do not open: {e}"));
    common_invariants(&again, ctx);
    let now = answers(&again);
    assert_eq!(now, expected, "{ctx}: an answer changed");
}

/// [`enumerate_with_clock`] in journal mode, on a [`CountingPair`]. `op` gets the store's slot
/// (it may close the store) and the pair. Returns S, the syncs of both files.
fn enumerate_journal<P, A>(
    name: &str,
    settings: fn(StoreBuilder) -> StoreBuilder,
    setup: impl FnOnce(&Store, &ManualClock, &CountingPair) -> P,
    op: impl FnOnce(&mut Option<Store>, &CountingPair, P) -> A,
    check: impl Fn(&Store, &ManualClock, usize, usize, bool, &A),
) -> usize {
    let pair = CountingPair::new();
    let clock = ManualClock::new(T0);
    let mut slot = Some(
        open_journaled(settings, pair.store.clone(), pair.journal.clone(), &clock)
            .expect("open on the counting pair"),
    );
    let prepared = setup(slot.as_ref().expect("open"), &clock, &pair);
    pair.mark();
    let ack = op(&mut slot, &pair, prepared);
    let s = pair.syncs();
    let store_syncs = pair.store_syncs();
    let images: Vec<(usize, PairImage)> = (0..=s).map(|k| (k, pair.image_at_sync(k))).collect();
    let torn = pair.torn_images();
    let torn_both = pair.torn_both_images();
    let kills = pair.kill_images();
    pair.stop();
    drop(slot);
    let (n_torn, n_both) = (torn.len(), torn_both.len());
    for (kind, (k, (store_image, journal_image))) in images
        .into_iter()
        .map(|i| ("crash after sync", i))
        .chain(torn.into_iter().map(|i| ("torn write after sync", i)))
        .chain(
            torn_both
                .into_iter()
                .map(|i| ("torn writes of both files after sync", i)),
        )
    {
        let torn_image = kind != "crash after sync";
        let ctx = format!("{name}, {kind} {k}/{s}");
        let live = (
            crash_backend_from_image(store_image.to_vec()),
            crash_backend_from_image(journal_image.to_vec()),
        );
        let reopened = open_journaled(settings, live.0.clone(), live.1.clone(), &clock)
            .unwrap_or_else(|e| panic!("{ctx}: the crash images do not open: {e}"));
        common_invariants(&reopened, &ctx);
        // A second crash right after the reopen: what it answers holds.
        let first = answers(&reopened);
        crash_again(
            settings,
            &live,
            &clock,
            &first,
            &format!("{ctx}, crashed again after the reopen"),
        );
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&reopened, &clock, k, s, torn_image, &ack)
        }));
        if let Err(payload) = checked {
            panic!("{ctx}: {}", panic_message(&*payload));
        }
        // And after the checks (retries, reads): every answer they got holds.
        let after = answers(&reopened);
        crash_again(
            settings,
            &live,
            &clock,
            &after,
            &format!("{ctx}, crashed again after the checks"),
        );
        assert!(reopened.fail_stop_cause().is_none(), "{ctx}");
    }
    // Process kills: the reopen reads what the OS kept (every write), and a power loss after it
    // leaves only what was synced, by the crashed process or by the reopen. What the reopen
    // answered must hold after that power loss (docs/design.md, "Opening and recovery", step 5).
    for (k, (store_live, store_durable), (journal_live, journal_durable)) in &kills {
        let ctx = format!("{name}, process kill after sync {k}/{s}");
        let live = (
            crash_backend_from_images(store_live.to_vec(), store_durable.to_vec()),
            crash_backend_from_images(journal_live.to_vec(), journal_durable.to_vec()),
        );
        let reopened = open_journaled(settings, live.0.clone(), live.1.clone(), &clock)
            .unwrap_or_else(|e| panic!("{ctx}: does not open: {e}"));
        common_invariants(&reopened, &ctx);
        let first = answers(&reopened);
        crash_again(
            settings,
            &live,
            &clock,
            &first,
            &format!("{ctx}, power lost after the reopen"),
        );
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check(&reopened, &clock, *k, s, true, &ack)
        }));
        if let Err(payload) = checked {
            panic!("{ctx}: {}", panic_message(&*payload));
        }
        let after = answers(&reopened);
        crash_again(
            settings,
            &live,
            &clock,
            &after,
            &format!("{ctx}, power lost after the checks"),
        );
    }
    assert!(s >= 1, "{name}: the operation never synced");
    eprintln!(
        "crash points: {name}: S={s} syncs ({store_syncs} of the store file), {} sync images + {n_torn} torn-write images + {n_both} with both files' writes + {} process kills checked, each reopened, crashed again and reopened twice",
        s + 1,
        kills.len()
    );
    drop(ack);
    s
}

/// The frames (journal writes at or after the header) written since write `from` of the pair's
/// log: (offset, bytes).
fn frames_since(pair: &CountingPair, from: usize) -> Vec<(u64, Vec<u8>)> {
    pair.journal_writes().split_off(from)
}

/// A wrap frame's kind byte (docs/FORMAT.md, "Frames").
const KIND_WRAP: u8 = 0x02;

/// Claims `keys` one after the other; each answer is paired with the syncs done when it came
/// (an upper bound on the sync that made it durable).
fn claim_all(store: &Store, pair: &CountingPair, keys: impl IntoIterator<Item = String>) -> Acks {
    keys.into_iter()
        .map(|key| {
            let r = claim(store, &key);
            assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{key}: {r:?}");
            (key, pair.syncs())
        })
        .collect()
}

/// Claims from `threads` threads at once, `each` keys each (`<prefix><t>-<i>`).
fn claim_concurrently(
    store: &Store,
    pair: &CountingPair,
    prefix: &str,
    threads: usize,
    each: usize,
) -> Acks {
    let acks = std::sync::Mutex::new(Vec::new());
    thread::scope(|sc| {
        for t in 0..threads {
            let acks = &acks;
            sc.spawn(move || {
                for i in 0..each {
                    let key = format!("{prefix}{t}-{i}");
                    let r = claim(store, &key);
                    assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{key}: {r:?}");
                    let synced = pair.syncs();
                    acks.lock().expect("acks").push((key, synced));
                }
            });
        }
    });
    acks.into_inner().expect("acks")
}

/// Keys with the syncs done when each was answered.
type Acks = Vec<(String, usize)>;

/// Every key answered by sync `k` is present with exactly one effect; every other key is whole
/// or absent; then a retry of each replays exactly when the key was present, one effect each.
fn check_acks(store: &Store, k: usize, acks: &Acks, retry: bool) {
    for (key, acked_by) in acks {
        let rec = has_record(store, key);
        assert_eq!(rec, effects(store, key) == 1, "k={k}, {key}: half-applied");
        if *acked_by <= k {
            assert!(
                rec,
                "k={k}: {key}, acknowledged by sync {acked_by}, was lost"
            );
        }
        if retry {
            let again = claim(store, key).expect("retry");
            assert_eq!(again.is_replay(), rec, "k={k}: {key}");
            assert_eq!(effects(store, key), 1, "k={k}: {key}");
        }
    }
}

/// The claims answered before the mark (setup): present in every image.
fn check_setup(store: &Store, k: usize, keys: &[String]) {
    for key in keys {
        assert!(
            has_record(store, key),
            "k={k}: {key}, answered before the operation, was lost"
        );
        assert_eq!(effects(store, key), 1, "k={k}: {key}");
    }
}

/// Claims `prefix<i>` until the journal's frames since the open reach `bytes`; returns the keys.
fn claim_until_journal_bytes(
    store: &Store,
    pair: &CountingPair,
    prefix: &str,
    bytes: u64,
) -> Vec<String> {
    let mut keys = Vec::new();
    while pair
        .journal_writes()
        .iter()
        .map(|(_, b)| b.len() as u64)
        .sum::<u64>()
        < bytes
    {
        let key = format!("{prefix}{}", keys.len());
        assert!(matches!(claim(store, &key), Ok(ExecuteAnswer::Ran(_))));
        keys.push(key);
    }
    keys
}

/// [`journaled`] with one caller per batch: queued callers commit one batch each, in turn.
fn journaled_one_per_batch(b: StoreBuilder) -> StoreBuilder {
    journaled(b).max_batch(1)
}

/// Releases a [`PairFile`]'s held syncs when dropped (also when a check panics).
struct Release<'a>(&'a PairFile);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.release_syncs();
    }
}

/// Appends pipelined behind a sync: with one caller per batch, a gate claim holds the writer
/// while three claims queue behind it; the journal's syncs are held, so once the gate's batch
/// writes its frame and waits in its sync, the next batch seals and writes its frame behind that
/// sync (leadership is handed on before the wait), and its leader then waits for the gate's
/// entry before handing on (at most two batches in flight); the last two wait in the queue.
/// Then the syncs run. Each claim is in every image from the sync that answered it; frames
/// written behind an unfinished sync are torn-write crash points like any other.
#[test]
fn journal_appends_pipelined_behind_a_sync() {
    enumerate_journal(
        "journal: appends pipelined behind a held sync (gate + 3 queued, one per batch)",
        journaled_one_per_batch,
        |_, _, _| (),
        |slot, pair, ()| {
            let store = slot.as_ref().expect("open");
            let acks = std::sync::Mutex::new(Vec::new());
            let frames_before = pair.journal_writes().len();
            pair.journal.hold_syncs();
            let _release = Release(&pair.journal);
            let (held_tx, held_rx) = mpsc::channel::<()>();
            let (release_tx, release_rx) = mpsc::channel::<()>();
            thread::scope(|sc| {
                let acks = &acks;
                sc.spawn(move || {
                    let r = store.execute(req("t", "op", "p0", b"p"), |tx| {
                        bump(tx, "p0")?;
                        held_tx.send(()).expect("test alive");
                        release_rx.recv().expect("released");
                        Ok(Response::new(201, "p0"))
                    });
                    assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
                    acks.lock()
                        .expect("acks")
                        .push(("p0".to_owned(), pair.syncs()));
                });
                held_rx.recv().expect("the gate holds the writer");
                for i in 1..4 {
                    sc.spawn(move || {
                        let key = format!("p{i}");
                        let r = claim(store, &key);
                        assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{key}: {r:?}");
                        acks.lock().expect("acks").push((key, pair.syncs()));
                    });
                    wait_for_queue(store, i);
                }
                release_tx.send(()).expect("gate alive");
                wait_until("the gate's sync", || pair.journal.syncs_waiting() == 1);
                // The gate's frame and the one batch allowed behind it.
                wait_until("the frames behind the held sync", || {
                    pair.journal_writes().len() >= frames_before + 2
                });
                assert_eq!(
                    pair.journal_writes().len(),
                    frames_before + 2,
                    "at most two batches in flight"
                );
                assert!(
                    acks.lock().expect("acks").is_empty(),
                    "answered before a sync"
                );
                pair.journal.release_syncs();
            });
            let acks = acks.into_inner().expect("acks");
            assert_eq!(acks.len(), 4);
            acks
        },
        |store, _, k, _, _, acks| check_acks(store, k, acks, true),
    );
}

/// A wrap: a 64 KiB journal filled to its last frames before the operation, whose claims write
/// the wrap frame and continue at the area's start.
#[test]
fn journal_wrap() {
    journal_wrap_on(journaled_checkpoints);
}

fn journal_wrap_on(settings: fn(StoreBuilder) -> StoreBuilder) {
    const CAPACITY: u64 = 64 << 10;
    enumerate_journal(
        "journal: a wrap (64 KiB journal, a checkpoint every 16 KiB)",
        settings,
        |store, _, pair| {
            // Fill until the head is within three frames of the end.
            let mut keys = Vec::new();
            loop {
                let key = format!("w{}", keys.len());
                assert!(matches!(claim(store, &key), Ok(ExecuteAnswer::Ran(_))));
                keys.push(key);
                let writes = pair.journal_writes();
                let (at, frame) = writes.last().expect("a frame");
                let head = at + frame.len() as u64;
                if head + 3 * frame.len() as u64 >= CAPACITY {
                    break keys;
                }
                assert!(keys.len() < 2_000, "the journal never neared its end");
            }
        },
        |slot, pair, setup| {
            let store = slot.as_ref().expect("open");
            let from = pair.journal_writes().len();
            let acks = claim_all(store, pair, (0..8).map(|i| format!("x{i}")));
            let frames = frames_since(pair, from);
            assert!(
                frames.iter().any(|(_, f)| f[5] == KIND_WRAP),
                "the operation wrote no wrap frame: {:?}",
                frames
                    .iter()
                    .map(|(at, f)| (*at, f.len()))
                    .collect::<Vec<_>>()
            );
            (setup, acks)
        },
        |store, _, k, _, _, (setup, acks)| {
            check_setup(store, k, setup);
            check_acks(store, k, acks, true);
        },
    );
}

/// A batch that writes a caller's table of redb's leaf types (`&str` → `u64`) that was never
/// registered is journaled all the same: recovery applies its records from the type names the
/// entry records, at every crash point.
#[test]
fn journal_leaf_table_needs_no_registration() {
    enumerate_journal(
        "journal: claims writing an unregistered leaf-typed table (journaled)",
        journaled,
        |_, _, _| (),
        |slot, pair, ()| {
            let store = slot.as_ref().expect("open");
            let frames = pair.journal_writes().len();
            let acks = claim_all(store, pair, ["a".to_owned(), "b".to_owned()]);
            assert!(
                pair.journal_writes().len() > frames,
                "the batches were not journaled"
            );
            acks
        },
        |store, _, k, _, _, acks| check_acks(store, k, acks, true),
    );
}

/// A batch that writes a table the journal cannot replay (the caller's table of a compound
/// type, not registered; leaf-typed tables need no registration) is not framed: it commits
/// durably (a checkpoint).
#[test]
fn journal_unregistered_table() {
    unregistered_table_on(
        "journal: a claim writing an unregistered table (a durable commit)",
        journaled,
    );
}

fn unregistered_table_on(name: &str, settings: fn(StoreBuilder) -> StoreBuilder) {
    const NOTES: idem::redb::TableDefinition<(&str, u64), u64> =
        idem::redb::TableDefinition::new("test.notes");
    enumerate_journal(
        name,
        settings,
        |_, _, _| (),
        |slot, pair, ()| {
            let store = slot.as_ref().expect("open");
            let r = store.execute(req("t", "op", "a", b"p"), |tx| {
                bump(tx, "a")?;
                tx.open_table(NOTES)?.insert(("a", 1), 1)?;
                Ok(Response::new(201, "a".to_owned()))
            });
            assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "a: {r:?}");
            let acks: Acks = vec![("a".to_owned(), pair.syncs())];
            assert!(
                pair.store_syncs() >= 1,
                "the batch was not committed durably"
            );
            acks
        },
        |store, _, k, _, _, acks| check_acks(store, k, acks, true),
    );
}

/// An oversized entry (over a quarter of the journal: a 20 KiB response body in a 64 KiB
/// journal) is not framed: its batch commits durably.
#[test]
fn journal_oversized_entry() {
    oversized_entry_on(
        "journal: an oversized entry (20 KiB in a 64 KiB journal: a durable commit)",
        journaled,
    );
}

fn oversized_entry_on(name: &str, settings: fn(StoreBuilder) -> StoreBuilder) {
    let body = "b".repeat(20 << 10);
    enumerate_journal(
        name,
        settings,
        |_, _, _| (),
        |slot, pair, ()| {
            let store = slot.as_ref().expect("open");
            let frames = pair.journal_writes().len();
            let r = store.execute(req("t", "op", "big", b"p"), |tx| {
                bump(tx, "big")?;
                Ok(Response::new(201, body.clone()))
            });
            assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{r:?}");
            assert!(
                pair.store_syncs() >= 1,
                "the batch was not committed durably"
            );
            assert_eq!(pair.journal_writes().len(), frames, "the entry was framed");
            pair.syncs()
        },
        |store, _, k, _, _, acked_by| {
            let rec = store.get(&scope(), "big").expect("get");
            assert_eq!(
                rec.is_some(),
                effects(store, "big") == 1,
                "k={k}: half-applied"
            );
            match &rec {
                None => assert!(k < *acked_by, "k={k}: the acknowledged claim was lost"),
                Some(r) => match &r.state {
                    State::Completed(resp) => assert_eq!(resp.body().len(), 20 << 10),
                    other => panic!("k={k}: {other:?}"),
                },
            }
        },
    );
}

/// The close: the last handle dropped writes the closing checkpoint (every entry, the clean
/// flag) in a durable commit. Every claim answered before it is in every image.
#[test]
fn journal_close() {
    journal_close_on("journal: the close (the closing checkpoint)", journaled);
}

fn journal_close_on(name: &str, settings: fn(StoreBuilder) -> StoreBuilder) {
    enumerate_journal(
        name,
        settings,
        |store, _, _| {
            let keys: Vec<String> = (0..5).map(|i| format!("z{i}")).collect();
            for key in &keys {
                assert!(matches!(claim(store, key), Ok(ExecuteAnswer::Ran(_))));
            }
            keys
        },
        |slot, pair, keys| {
            drop(slot.take());
            assert!(pair.store_syncs() >= 1, "the close made nothing durable");
            keys
        },
        |store, _, k, _, _, keys| {
            check_setup(store, k, keys);
            for key in keys {
                assert_eq!(replayed(claim(store, key)).body(), key.as_bytes(), "k={k}");
            }
        },
    );
}

/// Recovery itself: a crash left five answered claims in the journal only (redb's durable state
/// is the open's checkpoint); the reopen on a counting pair replays them in one durable commit.
/// Every write and sync of that open is a crash point, and each of its images opens with the
/// five claims.
#[test]
fn journal_recovery() {
    let pair = CountingPair::new();
    let clock = ManualClock::new(T0);
    let keys: Vec<String> = (0..5).map(|i| format!("r{i}")).collect();
    let store =
        open_journaled(journaled, pair.store.clone(), pair.journal.clone(), &clock).expect("open");
    for key in &keys {
        assert!(matches!(claim(&store, key), Ok(ExecuteAnswer::Ran(_))));
    }
    let (db, jr) = pair.crash();
    drop(store);
    let recovering = CountingPair::from_images(db.durable_image(), jr.durable_image());
    recovering.mark();
    let reopened = open_journaled(
        journaled,
        recovering.store.clone(),
        recovering.journal.clone(),
        &clock,
    )
    .expect("the crash images open");
    let s = recovering.syncs();
    let images: Vec<(usize, PairImage)> =
        (0..=s).map(|k| (k, recovering.image_at_sync(k))).collect();
    let mut torn = recovering.torn_images();
    torn.extend(recovering.torn_both_images());
    let kills = recovering.kill_images();
    recovering.stop();
    check_setup(&reopened, s, &keys);
    drop(reopened);
    let (n_torn, n_kills) = (torn.len(), kills.len());
    let power_losses = images
        .into_iter()
        .chain(torn)
        .map(|(k, (store, journal))| (k, (store.clone(), store), (journal.clone(), journal)));
    for (k, (store_live, store_durable), (journal_live, journal_durable)) in
        power_losses.chain(kills)
    {
        let ctx = format!("recovery, crash point after sync {k}/{s}");
        let live = (
            crash_backend_from_images(store_live.to_vec(), store_durable.to_vec()),
            crash_backend_from_images(journal_live.to_vec(), journal_durable.to_vec()),
        );
        let again = open_journaled(journaled, live.0.clone(), live.1.clone(), &clock)
            .unwrap_or_else(|e| panic!("{ctx}: does not open: {e}"));
        common_invariants(&again, &ctx);
        check_setup(&again, k, &keys);
        let first = answers(&again);
        crash_again(journaled, &live, &clock, &first, &ctx);
    }
    assert!(s >= 1, "the recovery made nothing durable");
    eprintln!(
        "crash points: journal: recovery (an open replaying 5 entries): S={s} syncs, {} sync images + {n_torn} torn-write images + {n_kills} process kills checked, each reopened, crashed again and reopened",
        s + 1
    );
}

// ---------------------------------------------------------------------------------------------
// A deliberately broken recovery is caught (docs/design.md, "### Tests"): each white-box switch
// (`StoreBuilder::__break_journal`) breaks one step; the test runs the check that exists for that
// step, first with nothing broken (it passes: the check is sound), then with the switch on, and
// asserts the check fails, for the reason it exists for.
// ---------------------------------------------------------------------------------------------

use idem::__journal::BrokenJournal;

/// Runs `check`, which must fail (panic); returns its panic message.
pub(crate) fn caught(what: &str, check: impl FnOnce()) -> String {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(check)) {
        Ok(()) => panic!("{what}: the broken step was not caught: the check passed"),
        Err(payload) => panic_message(&*payload),
    }
}

/// A panic's message.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// Whether a failure of the crash enumeration is an acknowledged answer missing from a crash
/// image: one the operation got (`was lost`), or one the reopened store gave and a second crash
/// took back (`an answer changed`).
fn an_answer_was_lost(why: &str) -> bool {
    why.contains("journal: ") && (why.contains("was lost") || why.contains("an answer changed"))
}

fn journaled_no_replay(b: StoreBuilder) -> StoreBuilder {
    journaled(b).__break_journal(BrokenJournal::NoReplay)
}

fn journaled_answer_before_sync(b: StoreBuilder) -> StoreBuilder {
    journaled(b).__break_journal(BrokenJournal::AnswerBeforeSync)
}

fn journaled_stop_at_wrap(b: StoreBuilder) -> StoreBuilder {
    journaled_checkpoints(b).__break_journal(BrokenJournal::StopAtWrap)
}

/// `BrokenJournal::NoReplay` (an open applies nothing from the journal) is caught by the crash
/// enumeration (`journal_flow_a_claim`): an acknowledged claim that is only in the journal is
/// missing after the reopen (the operation's at the crash right after its sync; the reopened
/// store's own retry after the second crash, which comes first, at sync image 0).
#[test]
fn a_broken_recovery_is_caught_when_the_journal_is_not_replayed() {
    flow_a_claim_on(Disk::Journal(journaled));
    let why = caught("NoReplay", || {
        flow_a_claim_on(Disk::Journal(journaled_no_replay));
    });
    assert!(an_answer_was_lost(&why), "caught for another reason: {why}");
}

/// `BrokenJournal::AnswerBeforeSync` (members answered before the journal's sync covers their
/// entry) is caught by the crash enumeration (`journal_flow_a_claim`): the claim is answered
/// with no sync done, and the crash image of that instant (sync image 0) lacks it.
#[test]
fn a_broken_recovery_is_caught_when_the_journal_answers_before_its_sync() {
    flow_a_claim_on(Disk::Journal(journaled));
    let why = caught("AnswerBeforeSync", || {
        flow_a_claim_on(Disk::Journal(journaled_answer_before_sync));
    });
    assert!(
        why.contains("crash after sync 0/0") && why.contains("the acknowledged claim was lost"),
        "caught for another reason: {why}"
    );
}

/// `BrokenJournal::StopAtWrap` (recovery stops at the first wrap frame) is caught by the crash
/// enumeration's wrap (`journal_wrap`): claims acknowledged after the wrap frame, only in the
/// journal, are missing after a reopen (the first found: the reopened store's retries of the
/// operation's claims at sync image 0, which follow the wrap, lost by the second crash).
#[test]
fn a_broken_recovery_is_caught_when_the_journal_stops_at_a_wrap() {
    journal_wrap_on(journaled_checkpoints);
    let why = caught("StopAtWrap", || journal_wrap_on(journaled_stop_at_wrap));
    assert!(an_answer_was_lost(&why), "caught for another reason: {why}");
}

// ---- The applier's checkpoints among the crash points. ----

/// Claims from four threads while the applier applies and checkpoints behind them: the
/// checkpoint (a durable commit of the applier's, quick-repair) is among the crash points.
#[test]
fn journal_checkpoint_under_load() {
    applier_checkpoint_under_load_on(journaled_checkpoints);
}

fn applier_checkpoint_under_load_on(settings: fn(StoreBuilder) -> StoreBuilder) {
    enumerate_journal(
        "journal: a checkpoint under load (4 threads, a checkpoint every 16 KiB)",
        settings,
        |store, _, pair| claim_until_journal_bytes(store, pair, "c", (16 << 10) - 4 * 288),
        |slot, pair, setup| {
            let store = slot.as_ref().expect("open");
            let acks = claim_concurrently(store, pair, "l", 4, 4);
            // The applier checkpoints on its own thread: wait for it.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while pair.store_syncs() == 0 && std::time::Instant::now() < deadline {
                thread::sleep(std::time::Duration::from_millis(5));
            }
            assert!(
                pair.store_syncs() >= 1,
                "no checkpoint during the operation"
            );
            (setup, acks)
        },
        |store, _, k, _, _, (setup, acks)| {
            check_setup(store, k, setup);
            check_acks(store, k, acks, true);
        },
    );
}

/// A checkpoint while entries wait for a held sync: the journal's sync is held, claims from
/// three threads seal frames past `checkpoint_bytes` and wait, and the applier checkpoints
/// meanwhile; its row must be that of its last applied entry, not of the sealed ones.
#[test]
fn applier_checkpoint_while_entries_wait_for_their_sync() {
    applier_checkpoint_behind_a_held_sync_on(journaled_checkpoints);
}

fn applier_checkpoint_behind_a_held_sync_on(settings: fn(StoreBuilder) -> StoreBuilder) {
    enumerate_journal(
        "journal: a checkpoint while entries wait for a held sync (3 threads)",
        settings,
        |store, _, pair| claim_until_journal_bytes(store, pair, "c", (16 << 10) - 288),
        |slot, pair, setup| {
            let store = slot.as_ref().expect("open");
            let store_syncs = pair.store_syncs();
            let acks = std::sync::Mutex::new(Vec::new());
            pair.journal.hold_syncs();
            let _release = Release(&pair.journal);
            thread::scope(|sc| {
                let acks = &acks;
                for t in 0..3 {
                    sc.spawn(move || {
                        let key = format!("h{t}");
                        let r = claim(store, &key);
                        assert!(matches!(r, Ok(ExecuteAnswer::Ran(_))), "{key}: {r:?}");
                        acks.lock().expect("acks").push((key, pair.syncs()));
                    });
                }
                wait_until("the applier's checkpoint behind the held sync", || {
                    pair.store_syncs() > store_syncs
                });
                assert!(
                    acks.lock().expect("acks").is_empty(),
                    "answered before a sync"
                );
                pair.journal.release_syncs();
            });
            let acks = acks.into_inner().expect("acks");
            assert_eq!(acks.len(), 3);
            (setup, acks)
        },
        |store, _, k, _, _, (setup, acks)| {
            check_setup(store, k, setup);
            check_acks(store, k, acks, true);
        },
    );
}

fn applier_row_ahead(b: StoreBuilder) -> StoreBuilder {
    journaled_checkpoints(b).__break_journal(BrokenJournal::ApplierRowAhead)
}

/// `BrokenJournal::ApplierRowAhead` (the applier's checkpoints write the row of the last sealed
/// entry, not of the last one they applied: the design's "a checkpoint that records j instead
/// of a") is caught by the checkpoint behind a held sync
/// (`applier_checkpoint_while_entries_wait_for_their_sync`): the checkpoint says redb holds the
/// waiting entries, so recovery skips them, and the claims acknowledged once the sync is released
/// are lost. The checkpoint falls behind the held sync only when the setup's last frames did not
/// already make it due, which depends on frame sizes and the applier's timing: the broken run is
/// tried up to twenty times, and the first catch ends it.
#[test]
fn a_broken_applier_is_caught_when_its_row_runs_ahead() {
    applier_checkpoint_behind_a_held_sync_on(journaled_checkpoints);
    for attempt in 0..20 {
        let run = std::panic::catch_unwind(|| {
            applier_checkpoint_behind_a_held_sync_on(applier_row_ahead)
        });
        if let Err(payload) = run {
            let why = panic_message(&*payload);
            assert!(
                why.contains("journal: ")
                    && (why.contains("was lost") || why.contains("an answer changed")),
                "caught for another reason: {why}"
            );
            eprintln!("ApplierRowAhead caught at attempt {attempt}");
            return;
        }
    }
    panic!("ApplierRowAhead: the broken step was not caught in twenty runs");
}
