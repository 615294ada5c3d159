//! `crash_recovery`: a small workload (flow-A claims, flow-B leases, inbox messages, executes
//! that push outbox events, claims of a short-retention operation, sweeps after moving the
//! manual clock) runs on an in-memory disk that keeps a live and a durable image and injects
//! one fault: a crash at I/O operation n (reopening the durable image, or the torn live image:
//! every write so far reached the disk in order), or a failure of I/O operation n (once, or
//! from n on). Then every handle is dropped and the store is reopened — optionally first with a
//! crash or an I/O failure injected into the open (recovery) itself, which must give a typed
//! error or succeed, never panic — and on the reopened store:
//!
//! - it opens and is not latched;
//! - every effect counter is ≤ 1;
//! - nothing is half-applied: a caller row exists iff its record is Completed (flow A, flow B),
//!   iff its inbox mark exists, iff its record and exactly one outbox event exist (execute +
//!   push); a short-retention key's current record always has its row, and a row without a
//!   record belongs to an intent past its horizon (swept);
//! - every acknowledged answer is still there (record, mark, event, row);
//! - `Store::check_expiry_index` and `Store::check_integrity` pass;
//! - the whole workload then re-runs successfully: acknowledged intents replay the same body
//!   (or answer `Expired` past their response window), and afterwards every effect counter of a
//!   key the workload used is exactly 1.
//!
//! The outbox delivered mark is not exercised: only the dispatcher thread deletes a delivered
//! event, and this target starts no threads.
//!
//! Deterministic and single-threaded: a `ManualClock`, no background threads, no sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::effects::bump;
use arbitrary::{Arbitrary, Unstructured};
use idem::clock::ManualClock;
use idem::format::State;
use idem::inbox::ProcessAnswer;
use idem::outbox::Event;
use idem::redb::StorageBackend;
use idem::{
    BeginAnswer, Error, ExecuteAnswer, Request, Response, RetentionPolicy, Scope, Store,
    StoreBuilder, Timestamp,
};

/// The manual clock's start (2023-11-14).
const T0: Timestamp = Timestamp(1_700_000_000_000);
/// Lease duration of flow B.
const LEASE: Duration = Duration::from_secs(10);
/// Response window and tombstone horizon of the short-retention operation `s`.
const SHORT_RESPONSE: Duration = Duration::from_secs(20);
const SHORT_HORIZON: Duration = Duration::from_secs(40);
/// Clock moves of a sweep step: past the short response window (records shrink to
/// tombstones), or past the short horizon (records are deleted).
const SHRINK_STEP: Duration = Duration::from_secs(30);
const FORGET_STEP: Duration = Duration::from_secs(50);
/// Keys per kind: a small set, so repeats and replays happen.
const KEYS: u8 = 3;
const MAX_OPS: usize = 12;
/// Bounds of a fault's I/O operation index, in the workload and in an open.
const WORKLOAD_OPS: u8 = 128;
const OPEN_OPS: u8 = 16;
const SUBSCRIBER: &str = "sub";
const TOPIC: &str = "topic";

// ---------------------------------------------------------------------------------------------
// The disk

/// One fault, counted in I/O operations (write, `set_len`, `sync_data`) from arming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
enum Fault {
    None,
    /// The process dies at I/O operation `at`: that operation and every later one fail, and
    /// the image to reopen is frozen at that moment (the durable image, or with `torn` the
    /// live one: every write so far reached the disk, in order).
    Crash {
        at: u8,
        torn: bool,
    },
    /// I/O operation `at` fails (and with `persistent` every later one); the process goes on.
    Fail {
        at: u8,
        persistent: bool,
    },
}

enum Unsynced {
    Write(usize, Vec<u8>),
    SetLen(usize),
}

struct DiskState {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last sync, applied to `durable` by the next sync (cheaper than copying
    /// the live image on every sync).
    unsynced: Vec<Unsynced>,
    ops: u64,
    fault: Fault,
    /// A fault was injected.
    fired: bool,
    /// The crash image, once the process "died".
    frozen: Option<Vec<u8>>,
}

/// An in-memory redb backend with a live and a durable image and one injected fault.
#[derive(Clone)]
struct Disk(Arc<Mutex<DiskState>>);

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Disk")
    }
}

fn apply(image: &mut Vec<u8>, change: &Unsynced) {
    match change {
        Unsynced::Write(start, data) => {
            let end = start + data.len();
            if end > image.len() {
                image.resize(end, 0);
            }
            image[*start..end].copy_from_slice(data);
        }
        Unsynced::SetLen(len) => image.resize(*len, 0),
    }
}

impl Disk {
    fn new(image: Vec<u8>, fault: Fault) -> Disk {
        Disk(Arc::new(Mutex::new(DiskState {
            live: image.clone(),
            durable: image,
            unsynced: Vec::new(),
            ops: 0,
            fault,
            fired: false,
            frozen: None,
        })))
    }

    fn state(&self) -> MutexGuard<'_, DiskState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-arms the countdown from now.
    fn arm(&self, fault: Fault) {
        let mut s = self.state();
        s.ops = 0;
        s.fault = fault;
    }

    fn fired(&self) -> bool {
        self.state().fired
    }

    fn crashed(&self) -> bool {
        self.state().frozen.is_some()
    }

    /// What a reopen sees: the crash image if the process died, else the durable image (power
    /// loss now) or the live one (the process ended, the OS kept every write).
    fn image(&self, live: bool) -> Vec<u8> {
        let s = self.state();
        match (&s.frozen, live) {
            (Some(frozen), _) => frozen.clone(),
            (None, true) => s.live.clone(),
            (None, false) => s.durable.clone(),
        }
    }

    /// Counts one I/O operation and decides whether it fails.
    fn io(&self) -> std::io::Result<MutexGuard<'_, DiskState>> {
        let mut s = self.state();
        let n = s.ops;
        s.ops += 1;
        if s.frozen.is_some() {
            return Err(std::io::Error::other("injected crash: the process is dead"));
        }
        match s.fault {
            Fault::None => {}
            Fault::Crash { at, torn } if n == u64::from(at) => {
                let image = if torn {
                    s.live.clone()
                } else {
                    s.durable.clone()
                };
                s.frozen = Some(image);
                s.fired = true;
                return Err(std::io::Error::other("injected crash"));
            }
            Fault::Crash { .. } => {}
            Fault::Fail { at, persistent } => {
                if n == u64::from(at) || (persistent && n > u64::from(at)) {
                    s.fired = true;
                    return Err(std::io::Error::other("injected I/O failure"));
                }
            }
        }
        Ok(s)
    }
}

impl StorageBackend for Disk {
    fn len(&self) -> Result<u64, idem::redb::BackendError> {
        Ok(self.state().live.len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), idem::redb::BackendError> {
        let s = self.state();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + out.len();
        if end > s.live.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end",
            )
            .into());
        }
        out.copy_from_slice(&s.live[start..end]);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), idem::redb::BackendError> {
        let mut s = self.io()?;
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        let change = Unsynced::SetLen(len);
        apply(&mut s.live, &change);
        s.unsynced.push(change);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), idem::redb::BackendError> {
        let mut s = self.io()?;
        let s = &mut *s;
        for change in s.unsynced.drain(..) {
            apply(&mut s.durable, &change);
        }
        debug_assert!(s.durable == s.live);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), idem::redb::BackendError> {
        let mut s = self.io()?;
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let change = Unsynced::Write(start, data.to_vec());
        apply(&mut s.live, &change);
        s.unsynced.push(change);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The input

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Op {
    /// Flow A: `execute` + effect row `a:<k>`.
    ClaimA(u8),
    /// Flow A on the short-retention operation: effect row `s:<k>@<ms>` (the claim's time).
    ClaimShort(u8),
    /// Flow B: `begin` + `complete_with` + effect row `b:<k>`.
    FlowB(u8),
    /// Inbox: `process` of message `m<k>` + effect row `i:<k>`.
    Inbox(u8),
    /// `execute` + effect row `o:<k>` + an outbox event with payload `o:<k>`.
    Outbox(u8),
    /// Moves the clock past the short response window (or horizon), then `sweep`.
    Sweep { forget: bool },
}

#[derive(Debug)]
struct Input {
    ops: Vec<Op>,
    fault: Fault,
    /// Without a crash: reopen the live image (else the durable one).
    reopen_live: bool,
    /// A fault injected into the first reopen (recovery), then a clean reopen.
    open_fault: Fault,
    open_fault_live: bool,
}

fn decode(data: &[u8]) -> arbitrary::Result<Input> {
    let mut u = Unstructured::new(data);
    let n = u.int_in_range(0..=MAX_OPS)?;
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let op = match u.arbitrary()? {
            Op::ClaimA(k) => Op::ClaimA(k % KEYS),
            Op::ClaimShort(k) => Op::ClaimShort(k % KEYS),
            Op::FlowB(k) => Op::FlowB(k % KEYS),
            Op::Inbox(k) => Op::Inbox(k % KEYS),
            Op::Outbox(k) => Op::Outbox(k % KEYS),
            sweep @ Op::Sweep { .. } => sweep,
        };
        ops.push(op);
    }
    Ok(Input {
        ops,
        fault: bounded(u.arbitrary()?, WORKLOAD_OPS),
        reopen_live: u.arbitrary()?,
        open_fault: bounded(u.arbitrary()?, OPEN_OPS),
        open_fault_live: u.arbitrary()?,
    })
}

/// Keeps a fault's operation index where it can fire: a 12-step workload makes about 100 I/O
/// operations, an open (with recovery) about 5 to 15.
fn bounded(fault: Fault, ops: u8) -> Fault {
    match fault {
        Fault::None => Fault::None,
        Fault::Crash { at, torn } => Fault::Crash { at: at % ops, torn },
        Fault::Fail { at, persistent } => Fault::Fail {
            at: at % ops,
            persistent,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The workload

fn builder(clock: &ManualClock) -> StoreBuilder {
    Store::builder()
        .clock(clock.clone())
        .lease_duration(LEASE)
        .sweep_batch(2)
        .retention_policy_for(
            "s",
            RetentionPolicy::new()
                .client_retry(SHORT_RESPONSE)
                .tombstone_horizon(SHORT_HORIZON),
        )
}

fn req(operation: &str, k: u8) -> Request {
    Request::from_canonical_bytes(Scope::new("t", operation), format!("k{k}"), b"payload")
}

fn all_effects(store: &Store) -> BTreeMap<String, u64> {
    super::effects::all_effects(store).into_iter().collect()
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The creation time encoded in a short-retention label `s:<k>@<ms>`.
fn short_time(label: &str) -> u64 {
    label
        .rsplit_once('@')
        .and_then(|(_, t)| t.parse().ok())
        .unwrap_or_else(|| panic!("not a short label: {label:?}"))
}

/// What the caller was told.
#[derive(Default, Debug)]
struct Model {
    /// Labels whose effect an acknowledged answer promised (a/b/i/o kinds).
    acked: BTreeSet<String>,
    /// Per short key: the latest acknowledged label.
    short: BTreeMap<u8, String>,
}

/// What one step answered, besides Ok.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Done,
    /// Flow B found a live lease (left by a completion that failed).
    InFlight(u8),
}

fn label(kind: char, k: u8) -> String {
    format!("{kind}:{k}")
}

/// Runs one step; `Ok` is an acknowledgement (recorded in `model`). Panics on an answer that
/// breaks the contract whatever the faults.
fn step(
    store: &Store,
    clock: &ManualClock,
    op: Op,
    model: &mut Model,
    advance: bool,
) -> Result<Answer, Error> {
    match op {
        Op::ClaimA(k) | Op::Outbox(k) => {
            let (op_name, kind) = match op {
                Op::ClaimA(_) => ("a", 'a'),
                _ => ("o", 'o'),
            };
            let l = label(kind, k);
            let out = store.execute(req(op_name, k), |tx| {
                bump(tx, &l)?;
                if kind == 'o' {
                    tx.outbox().push(Event::new(TOPIC, l.as_bytes().to_vec()))?;
                }
                Ok(Response::new(200, l.clone()))
            })?;
            match out {
                ExecuteAnswer::Ran(r) => {
                    assert!(
                        !model.acked.contains(&l),
                        "{l}: executed again after an acknowledged answer"
                    );
                    assert_eq!(r.body(), l.as_bytes(), "{l}: executed body");
                }
                ExecuteAnswer::Replayed(r) => {
                    assert_eq!(r.body(), l.as_bytes(), "{l}: replayed body")
                }
                other => panic!("{l}: unexpected outcome {other:?}"),
            }
            model.acked.insert(l);
        }
        Op::ClaimShort(k) => {
            let now = store.now().0;
            let out = store.execute(req("s", k), |tx| {
                let l = format!("s:{k}@{}", tx.now().0);
                bump(tx, &l)?;
                Ok(Response::new(200, l))
            })?;
            // The latest acknowledged intent of this key, while it is bound, decides the answer.
            let bound = model.short.get(&k).map(|l| (l.clone(), short_time(l)));
            match (&out, &bound) {
                (ExecuteAnswer::Replayed(r) | ExecuteAnswer::Ran(r), _) => {
                    let l = String::from_utf8(r.body().to_vec()).expect("utf-8 label");
                    assert!(l.starts_with(&format!("s:{k}@")), "{l}");
                    let t = short_time(&l);
                    if let Some((acked, at)) = &bound {
                        if now < at + ms(SHORT_RESPONSE) {
                            assert!(
                                matches!(out, ExecuteAnswer::Replayed(_)) && &l == acked,
                                "s:{k}: {out:?} within the response window of acknowledged {acked}"
                            );
                        } else if now < at + ms(SHORT_HORIZON) {
                            panic!("s:{k}: {out:?} within the horizon of acknowledged {acked}");
                        }
                    }
                    if matches!(out, ExecuteAnswer::Replayed(_)) {
                        assert!(now < t + ms(SHORT_RESPONSE), "{l} replayed at {now}");
                    } else {
                        assert_eq!(t, now, "{l}: executed now");
                    }
                    model.short.insert(k, l);
                }
                (ExecuteAnswer::Expired(_), Some((acked, at))) => {
                    assert!(
                        now >= at + ms(SHORT_RESPONSE),
                        "s:{k}: expired within the response window of {acked}"
                    );
                }
                (ExecuteAnswer::Expired(_), None) => {}
                (other, _) => panic!("s:{k}: unexpected outcome {other:?}"),
            }
        }
        Op::FlowB(k) => {
            let l = label('b', k);
            match store.begin(req("b", k))? {
                BeginAnswer::Acquired(lease) => {
                    assert!(
                        !model.acked.contains(&l),
                        "{l}: lease acquired after an acknowledged completion"
                    );
                    let r = lease.complete_with(|tx| {
                        bump(tx, &l)?;
                        Ok(Response::new(200, l.clone()))
                    })?;
                    assert_eq!(r.body(), l.as_bytes(), "{l}: completed body");
                }
                BeginAnswer::Replayed(r) => {
                    assert_eq!(r.body(), l.as_bytes(), "{l}: replayed body")
                }
                BeginAnswer::InFlight { .. } => {
                    assert!(
                        !model.acked.contains(&l),
                        "{l}: in flight after an acknowledged completion"
                    );
                    return Ok(Answer::InFlight(k));
                }
                other => panic!("{l}: unexpected begin {other:?}"),
            }
            model.acked.insert(l);
        }
        Op::Inbox(k) => {
            let l = label('i', k);
            match store.process(SUBSCRIBER, format!("m{k}"), |tx| bump(tx, &l))? {
                ProcessAnswer::Ran(()) => assert!(
                    !model.acked.contains(&l),
                    "{l}: processed again after an acknowledged answer"
                ),
                ProcessAnswer::Duplicate { .. } => {}
                other => panic!("{l}: unexpected {other:?}"),
            }
            model.acked.insert(l);
        }
        Op::Sweep { forget } => {
            if advance {
                clock.advance(if forget { FORGET_STEP } else { SHRINK_STEP });
            }
            store.sweep()?;
        }
    }
    Ok(Answer::Done)
}

fn expected_fault_error(e: &Error) -> bool {
    matches!(
        e,
        Error::Storage { .. } | Error::OutcomeUnknown { .. } | Error::FailStopped { .. }
    )
}

// ---------------------------------------------------------------------------------------------
// The invariants

fn check(store: &Store, model: &Model, ctx: &str) {
    assert!(
        store.fail_stop_cause().is_none(),
        "{ctx}: latched after open"
    );
    let now = store.now().0;
    let effects = all_effects(store);
    for (l, n) in &effects {
        assert!(*n <= 1, "{ctx}: {l} has {n} effects");
    }
    let eff = |l: &str| effects.get(l).copied().unwrap_or(0);
    let events = store.pending_events(usize::MAX).expect("pending events");
    let mut records_o = 0;
    for k in 0..KEYS {
        let key = format!("k{k}");
        let get = |op: &str| store.get(&Scope::new("t", op), &key).expect("get");

        let l = label('a', k);
        let rec = get("a");
        assert_eq!(
            rec.is_some(),
            eff(&l) == 1,
            "{ctx}: {l} half-applied: {rec:?}"
        );
        if let Some(r) = &rec {
            assert!(
                matches!(&r.state, State::Completed(resp) if resp.body() == l.as_bytes()),
                "{ctx}: {l}: {r:?}"
            );
        }
        assert!(
            !model.acked.contains(&l) || rec.is_some(),
            "{ctx}: acknowledged {l} lost"
        );

        let l = label('b', k);
        let rec = get("b");
        let completed = match rec.as_ref().map(|r| &r.state) {
            None | Some(State::Pending { .. }) => false,
            Some(State::Completed(resp)) if resp.body() == l.as_bytes() => true,
            other => panic!("{ctx}: {l}: {other:?}"),
        };
        assert_eq!(completed, eff(&l) == 1, "{ctx}: {l} half-applied: {rec:?}");
        assert!(
            !model.acked.contains(&l) || completed,
            "{ctx}: acknowledged {l} lost: {rec:?}"
        );

        let l = label('i', k);
        let mark = store.inbox_mark(SUBSCRIBER, format!("m{k}")).expect("mark");
        assert_eq!(mark.is_some(), eff(&l) == 1, "{ctx}: {l} half-applied");
        assert!(
            !model.acked.contains(&l) || mark.is_some(),
            "{ctx}: acknowledged {l} lost"
        );

        let l = label('o', k);
        let rec = get("o");
        let n_events = events.iter().filter(|e| e.payload == l.as_bytes()).count();
        assert_eq!(
            rec.is_some(),
            eff(&l) == 1,
            "{ctx}: {l}: record vs caller row"
        );
        assert_eq!(
            usize::from(rec.is_some()),
            n_events,
            "{ctx}: {l}: record vs outbox events"
        );
        if let Some(r) = &rec {
            records_o += 1;
            assert!(
                matches!(&r.state, State::Completed(resp) if resp.body() == l.as_bytes()),
                "{ctx}: {l}: {r:?}"
            );
        }
        assert!(
            !model.acked.contains(&l) || rec.is_some(),
            "{ctx}: acknowledged {l} lost"
        );

        // Short-retention key: every row is an intent; the current record has its row; an
        // older row is from an intent past its horizon (it may have been swept).
        let prefix = format!("s:{k}@");
        let times: Vec<u64> = effects
            .keys()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| short_time(l))
            .collect();
        let rec = get("s");
        match &rec {
            Some(r) => {
                let c = r.created_at.0;
                let l = format!("{prefix}{c}");
                assert_eq!(eff(&l), 1, "{ctx}: {l}: record without its row: {r:?}");
                match &r.state {
                    State::Completed(resp) => {
                        assert_eq!(resp.body(), l.as_bytes(), "{ctx}: {l}: body")
                    }
                    State::Tombstone(_) => {}
                    other => panic!("{ctx}: {l}: {other:?}"),
                }
                for t in &times {
                    assert!(
                        *t == c || t + ms(SHORT_HORIZON) <= c,
                        "{ctx}: s:{k}: row @{t} beside the record @{c}: a second effect within the horizon"
                    );
                }
            }
            None => {
                for t in &times {
                    assert!(
                        t + ms(SHORT_HORIZON) <= now,
                        "{ctx}: s:{k}@{t}: row without its record within the horizon"
                    );
                }
            }
        }
        if let Some(acked) = model.short.get(&k) {
            let t = short_time(acked);
            assert_eq!(eff(acked), 1, "{ctx}: acknowledged {acked} lost its row");
            if now < t + ms(SHORT_HORIZON) {
                assert_eq!(
                    rec.as_ref().map(|r| r.created_at.0),
                    Some(t),
                    "{ctx}: acknowledged {acked} lost its record"
                );
            }
        }
    }
    assert_eq!(
        events.len(),
        records_o,
        "{ctx}: outbox events without their execute: {events:?}"
    );
    store
        .check_expiry_index()
        .unwrap_or_else(|e| panic!("{ctx}: expiry index: {e}"));
}

// ---------------------------------------------------------------------------------------------

/// Runs one input.
pub fn run(data: &[u8]) {
    let Ok(input) = decode(data) else {
        return;
    };
    let clock = ManualClock::new(T0);

    // The workload, with the fault armed after the store opened.
    let disk = Disk::new(Vec::new(), Fault::None);
    let store = builder(&clock)
        .open_with_backend(disk.clone())
        .expect("open a fresh store");
    disk.arm(input.fault);
    let mut model = Model::default();
    for (i, op) in input.ops.iter().enumerate() {
        let fired_before = disk.fired();
        match step(&store, &clock, *op, &mut model, true) {
            Ok(Answer::Done) => {}
            Ok(Answer::InFlight(k)) => assert!(
                fired_before,
                "op {i} {op:?}: b:{k} in flight without a failed completion"
            ),
            Err(e) => {
                assert!(
                    disk.fired(),
                    "op {i} {op:?}: error without an injected fault: {e:?}"
                );
                assert!(
                    expected_fault_error(&e),
                    "op {i} {op:?}: unexpected error after an injected fault: {e:?}"
                );
                if !disk.crashed() {
                    assert!(
                        store.fail_stop_cause().is_some(),
                        "op {i} {op:?}: failed ({e:?}) but the store did not latch"
                    );
                }
            }
        }
    }
    drop(store);
    let mut image = disk.image(input.reopen_live);
    drop(disk);

    // A fault inside the reopen (recovery): a typed error or a store, never a panic.
    if input.open_fault != Fault::None {
        let disk = Disk::new(image, input.open_fault);
        let opened = builder(&clock).open_with_backend(disk.clone());
        if let Err(e) = &opened {
            assert!(
                disk.fired(),
                "reopen failed without an injected fault: {e:?}"
            );
            assert!(
                expected_fault_error(e),
                "reopen with an injected fault ({:?}): untyped error {e:?}",
                input.open_fault
            );
        }
        drop(opened);
        image = disk.image(input.open_fault_live);
    }

    let ctx = format!("{:?}", input.fault);
    let disk = Disk::new(image, Fault::None);
    let mut store = builder(&clock)
        .open_with_backend(disk.clone())
        .unwrap_or_else(|e| panic!("{ctx}: the image does not reopen: {e:?}"));
    check(&store, &model, &format!("{ctx}: after the reopen"));
    match store.check_integrity() {
        Ok(true) => {}
        other => panic!("{ctx}: check_integrity: {other:?}"),
    }

    // The workload again: every step succeeds; acknowledged intents replay.
    let mut in_flight = BTreeSet::new();
    for (i, op) in input.ops.iter().enumerate() {
        match step(&store, &clock, *op, &mut model, false) {
            Ok(Answer::Done) => {}
            Ok(Answer::InFlight(k)) => {
                in_flight.insert(k);
            }
            Err(e) => panic!("{ctx}: retry of op {i} {op:?}: {e:?}"),
        }
    }
    if !in_flight.is_empty() {
        // A lease left by a completion that never committed: take it over once it lapses.
        clock.advance(LEASE + Duration::from_secs(1));
        for k in in_flight {
            match step(&store, &clock, Op::FlowB(k), &mut model, false) {
                Ok(Answer::Done) => {}
                other => panic!("{ctx}: takeover of b:{k}: {other:?}"),
            }
        }
    }
    check(&store, &model, &format!("{ctx}: after the retry"));
    let effects = all_effects(&store);
    for op in &input.ops {
        let l = match *op {
            Op::ClaimA(k) => label('a', k),
            Op::FlowB(k) => label('b', k),
            Op::Inbox(k) => label('i', k),
            Op::Outbox(k) => label('o', k),
            Op::ClaimShort(k) => {
                let r = store
                    .get(&Scope::new("t", "s"), format!("k{k}"))
                    .expect("get");
                let r = r.unwrap_or_else(|| panic!("{ctx}: s:{k}: no record after the retry"));
                format!("s:{k}@{}", r.created_at.0)
            }
            Op::Sweep { .. } => continue,
        };
        assert_eq!(
            effects.get(&l).copied(),
            Some(1),
            "{ctx}: {l}: effects after the retry"
        );
    }
}
