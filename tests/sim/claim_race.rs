//! `claim_race`: K logical clients race over a few intents on one thread, deterministically,
//! against a reference model.
//!
//! The input is a schedule: which client does what to which intent — flow-A `execute` with a
//! side effect (succeeding, failing terminally or retryably), flow-B `begin`, `complete_with`
//! (with a side effect), `fail`, `heartbeat`, `release`, dropping a lease, `purge` — plus
//! moving the manual clock (forwards, across the lease / retention / horizon boundaries, and
//! backwards), `sweep`, a clean reopen, a crash (the store dropped without finishing; its
//! leases die with the process), and a crash inside an executing closure.
//!
//! The model keeps, per intent, the record the store must hold, written by rules stated here
//! independently of `src/` (it does not call [`idem::rules::decide`] to predict; it checks that
//! `decide` agrees with it). After every step it checks:
//! - the store's record equals the model's, field for field (holder tokens included);
//! - effects (the caller's table) equal the model's count, and an intent never executes twice
//!   while its record is live: effects ≤ 1 per intent per record lifetime, and = 1 once any
//!   attempt saw it completed;
//! - a finished intent's replay is byte-for-byte its first response;
//! - a different payload on a live key is always `PayloadMismatch`;
//! - at most one live lease per key, and a stale lease's calls always get `LeaseLost`;
//! - `downstream_key()` never changes for an intent, across takeovers, crashes and reopens;
//! - the expiry index matches the records (`check_expiry_index`);
//! - no panic, no unexpected error.

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use idem::clock::{Clock, ManualClock};
use idem::format::{Record, State};
use idem::keys::{DownstreamKey, Fingerprint};
use idem::{
    Abort, Begin, Error, Lease, Outcome, Request, Response, Scope, Store, Timestamp, Tombstone,
};

use super::backend::CrashBackend;
use super::effects::{all_effects, bump};

const T0: Timestamp = Timestamp(1_700_000_000_000);
const LEASE_MS: u64 = 10_000;
const RESPONSE_MS: u64 = 60_000;
const FORGET_MS: u64 = 120_000;
const RETRY_AFTER_CAP: Duration = Duration::from_secs(1);
const CLIENTS: usize = 3;
const MAX_STEPS: usize = 64;

/// (tenant, operation, key): two tenants share a key name, two operations share a tenant.
const INTENTS: [(&str, &str, &str); 4] = [
    ("t1", "pay", "k1"),
    ("t1", "pay", "k2"),
    ("t2", "pay", "k1"),
    ("t1", "refund", "k1"),
];

/// Clock moves, in milliseconds: around every boundary of the lease, response window and horizon.
const FORWARD_MS: [u64; 16] = [
    1, 500, 999, 1_000, 5_000, 9_999, 10_000, 10_001, 30_000, 59_999, 60_000, 60_001, 119_999,
    120_000, 120_001, 200_000,
];
const BACKWARD_MS: [u64; 3] = [1, 1_000, 10_000];

/// How a closure ends.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum End {
    Ok,
    Terminal,
    Retryable,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Op {
    Execute {
        client: u8,
        intent: u8,
        payload: bool,
        end: End,
    },
    Begin {
        client: u8,
        intent: u8,
        payload: bool,
    },
    Complete {
        client: u8,
        end: End,
    },
    Fail {
        client: u8,
    },
    Heartbeat {
        client: u8,
    },
    Release {
        client: u8,
    },
    DropLease {
        client: u8,
    },
    Purge {
        intent: u8,
    },
    Forward(u8),
    Backward(u8),
    Sweep,
    Reopen,
    Crash,
    /// The process dies while an executing closure runs: nothing of it may survive.
    CrashInClosure {
        intent: u8,
        payload: bool,
    },
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut sim = Sim::new();
    for _ in 0..MAX_STEPS {
        if u.is_empty() {
            break;
        }
        let Ok(op) = Op::arbitrary(&mut u) else {
            break;
        };
        sim.step(op);
        sim.check();
    }
    sim.close();
}

/// What the model holds for one intent.
#[derive(Debug, Default)]
struct Intent {
    /// The record the store must hold.
    record: Option<Record>,
    /// Effects the caller's table must show (all record lifetimes together).
    effects: u64,
    /// The current record lifetime already finished (Completed or Failed): it must never run
    /// again until the record is gone or forgotten.
    finished: bool,
    /// The first response of the current record lifetime; every replay must equal it.
    first: Option<Response>,
    /// The downstream key seen on the first lease ever; every lease must show the same.
    downstream: Option<DownstreamKey>,
}

struct Held {
    lease: Lease,
    intent: usize,
}

struct Sim {
    clock: ManualClock,
    backend: CrashBackend,
    store: Option<Store>,
    clients: Vec<Option<Held>>,
    intents: Vec<Intent>,
    seq: u64,
    /// Every holder token ever handed out: fencing needs each attempt's to be new.
    holders: std::collections::HashSet<idem::format::HolderToken>,
    /// The tokens the open store granted: a lease granted before the last reopen or crash has
    /// no holder left (the file admits one store at a time), and is taken over at once.
    granted_here: std::collections::HashSet<idem::format::HolderToken>,
}

/// The model's own rule (docs/design.md, decision order), written independently of `decide`.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Claim,
    Takeover(u32),
    Replay(Response),
    Expired(Tombstone),
    InFlight(Timestamp),
    Mismatch,
}

/// An answer of `execute` or `begin` that ran nothing, in one shape for both flows; anything
/// else (an execution, a lease, another error) is kept as text for the failure message.
#[derive(Debug)]
enum Early {
    Replayed(Response),
    Expired(Tombstone),
    InFlight(Duration),
    Mismatch,
    Other(String),
}

impl Early {
    fn of_outcome(result: Result<Outcome, Error>) -> Early {
        match result {
            Ok(Outcome::Replayed(r)) => Early::Replayed(r),
            Ok(Outcome::Expired(t)) => Early::Expired(t),
            Ok(Outcome::InFlight { retry_after }) => Early::InFlight(retry_after),
            Err(Error::PayloadMismatch { .. }) => Early::Mismatch,
            other => Early::Other(format!("{other:?}")),
        }
    }

    fn of_begin(result: Result<Begin, Error>) -> Early {
        match result {
            Ok(Begin::Replayed(r)) => Early::Replayed(r),
            Ok(Begin::Expired(t)) => Early::Expired(t),
            Ok(Begin::InFlight { retry_after }) => Early::InFlight(retry_after),
            Err(Error::PayloadMismatch { .. }) => Early::Mismatch,
            other => Early::Other(format!("{other:?}")),
        }
    }
}

fn live(record: &Option<Record>, now: Timestamp) -> Option<&Record> {
    record.as_ref().filter(|r| now < r.forget_at)
}

/// `granted_here`: the tokens whose holders may still be running (`None`: any holder may be,
/// `decide`'s view; the store's view is the tokens it granted itself).
fn expect(
    record: &Option<Record>,
    fp: &Fingerprint,
    now: Timestamp,
    granted_here: Option<&std::collections::HashSet<idem::format::HolderToken>>,
) -> Expect {
    let Some(r) = live(record, now) else {
        return Expect::Claim;
    };
    if r.fingerprint != *fp {
        return Expect::Mismatch;
    }
    match &r.state {
        State::Completed(resp) | State::Failed(resp) => {
            if now < r.expires_at {
                Expect::Replay(resp.clone())
            } else {
                Expect::Expired(Tombstone::new(
                    resp.status(),
                    resp.resource().cloned(),
                    matches!(r.state, State::Failed(_)),
                ))
            }
        }
        State::Tombstone(t) => Expect::Expired(t.clone()),
        State::Pending {
            lease_deadline,
            attempt,
            holder,
        } => {
            let running = granted_here.is_none_or(|granted| granted.contains(holder));
            if now < *lease_deadline && running {
                Expect::InFlight(*lease_deadline)
            } else {
                Expect::Takeover(attempt.saturating_add(1))
            }
        }
    }
}

/// The model's lease rule: the record is live, Pending, and carries the holder's token.
fn holds(record: &Option<Record>, lease: &Lease, now: Timestamp) -> bool {
    matches!(live(record, now),
        Some(Record { state: State::Pending { holder, .. }, .. }) if *holder == lease.holder())
}

fn ts(t: Timestamp, ms: u64) -> Timestamp {
    Timestamp(t.0.saturating_add(ms))
}

fn request(intent: usize, payload: bool) -> Request {
    let (tenant, operation, key) = INTENTS[intent];
    Request::from_canonical_bytes(Scope::new(tenant, operation), key, &[u8::from(payload)])
}

fn label(intent: usize) -> String {
    let (tenant, operation, key) = INTENTS[intent];
    format!("{tenant}/{operation}/{key}")
}

fn open(backend: &CrashBackend, clock: &ManualClock) -> Store {
    Store::builder()
        .clock(clock.clone())
        .lease_duration(Duration::from_millis(LEASE_MS))
        .retention(Duration::from_millis(RESPONSE_MS))
        .tombstone_horizon(Duration::from_millis(FORGET_MS))
        .retry_after_cap(RETRY_AFTER_CAP)
        .sweep_batch(2)
        .open_with_backend(backend.clone())
        .unwrap_or_else(|e| panic!("the store must open: {e}"))
}

fn retry_after(deadline: Timestamp, now: Timestamp) -> Duration {
    Duration::from_millis(deadline.0.saturating_sub(now.0))
        .min(RETRY_AFTER_CAP)
        .max(Duration::from_millis(1))
}

impl Sim {
    fn new() -> Self {
        let clock = ManualClock::new(T0);
        let backend = CrashBackend::default();
        let store = open(&backend, &clock);
        Sim {
            clock,
            backend,
            store: Some(store),
            clients: (0..CLIENTS).map(|_| None).collect(),
            intents: (0..INTENTS.len()).map(|_| Intent::default()).collect(),
            seq: 0,
            holders: Default::default(),
            granted_here: Default::default(),
        }
    }

    fn store(&self) -> &Store {
        // Invariant: `store` is None only inside `reopen`/`crash`.
        self.store.as_ref().expect("store is open between steps")
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    fn response(&mut self, who: &str, intent: usize, end: End) -> Response {
        self.seq += 1;
        let status = match end {
            End::Terminal => 402,
            _ => 201,
        };
        Response::new(status, format!("{who}:{intent}:{}", self.seq))
            .with_resource("intent", format!("{intent}"))
    }

    /// A new record lifetime begins when a claim replaces an absent or forgotten record.
    fn claimed(&mut self, intent: usize) {
        let i = &mut self.intents[intent];
        i.finished = false;
        i.first = None;
    }

    /// The model's record after an intent finished at `now` with `response`.
    fn finished_with(
        &mut self,
        intent: usize,
        previous: &Record,
        response: &Response,
        failed: bool,
    ) {
        let now = self.now();
        let i = &mut self.intents[intent];
        assert!(
            !i.finished,
            "intent {} finished twice in one record lifetime",
            label(intent)
        );
        i.finished = true;
        i.first = Some(response.clone());
        i.record = Some(Record {
            fingerprint: previous.fingerprint,
            created_at: previous.created_at,
            expires_at: ts(now, RESPONSE_MS),
            forget_at: ts(now, FORGET_MS),
            state: if failed {
                State::Failed(response.clone())
            } else {
                State::Completed(response.clone())
            },
        });
    }

    fn check_replay(&self, intent: usize, got: &Response) {
        let first = self.intents[intent].first.as_ref();
        assert_eq!(
            Some(got),
            first,
            "a replay of {} must equal its first response",
            label(intent)
        );
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Execute {
                client,
                intent,
                payload,
                end,
            } => self.execute(client, intent, payload, end),
            Op::Begin {
                client,
                intent,
                payload,
            } => self.begin(client, intent, payload),
            Op::Complete { client, end } => self.complete(client, end),
            Op::Fail { client } => self.complete(client, End::Terminal),
            Op::Heartbeat { client } => self.heartbeat(client),
            Op::Release { client } => self.release(client, true),
            Op::DropLease { client } => self.release(client, false),
            Op::Purge { intent } => self.purge(intent),
            Op::Forward(i) => self.clock.advance(Duration::from_millis(
                FORWARD_MS[usize::from(i) % FORWARD_MS.len()],
            )),
            Op::Backward(i) => {
                let back = BACKWARD_MS[usize::from(i) % BACKWARD_MS.len()];
                self.clock.set(Timestamp(self.now().0.saturating_sub(back)));
            }
            Op::Sweep => self.sweep(),
            Op::Reopen => self.reopen(),
            Op::Crash => self.crash(),
            Op::CrashInClosure { intent, payload } => self.crash_in_closure(intent, payload),
        }
    }

    fn execute(&mut self, client: u8, intent: u8, payload: bool, end: End) {
        let intent = usize::from(intent) % INTENTS.len();
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.expect(intent, req.fingerprint(), now);
        self.agrees_with_decide(intent, req.fingerprint());
        let response = self.response(&format!("a{client}"), intent, end);
        let mut runs = 0;
        let result = self.store().execute(req.clone(), |tx| {
            runs += 1;
            match end {
                End::Ok => {
                    bump(tx, &label(intent))?;
                    Ok(response.clone())
                }
                End::Terminal => Err(Abort::Terminal(response.clone())),
                End::Retryable => Err(Abort::retryable("sim: try again")),
            }
        });
        let runs_expected = u32::from(matches!(expected, Expect::Claim | Expect::Takeover(_)));
        assert_eq!(runs, runs_expected, "closure runs for {expected:?}");
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                assert!(
                    !live(&self.intents[intent].record, now)
                        .is_some_and(|r| !matches!(r.state, State::Pending { .. })),
                    "model: a finished live intent can never be claimed"
                );
                if let End::Retryable = end {
                    assert!(
                        matches!(result, Err(Error::Aborted { .. })),
                        "a retryable abort returns Aborted, got {result:?}"
                    );
                    return;
                }
                let got = match result {
                    Ok(Outcome::Executed(r)) => r,
                    other => panic!("{expected:?} must execute, got {other:?}"),
                };
                assert_eq!(got.status(), response.status());
                assert_eq!(got.body(), response.body());
                assert_eq!(got.resource(), response.resource());
                assert_eq!(got.is_failure(), matches!(end, End::Terminal));
                let previous = match expected {
                    Expect::Takeover(_) => self.intents[intent]
                        .record
                        .clone()
                        .expect("a takeover has a record"),
                    _ => {
                        self.claimed(intent);
                        Record {
                            fingerprint: *req.fingerprint(),
                            created_at: now,
                            expires_at: now,
                            forget_at: now,
                            state: State::Completed(got.clone()),
                        }
                    }
                };
                if let End::Ok = end {
                    self.intents[intent].effects += 1;
                }
                self.finished_with(intent, &previous, &got, matches!(end, End::Terminal));
            }
            early => self.check_early(intent, early, Early::of_outcome(result), now),
        }
    }

    fn begin(&mut self, client: u8, intent: u8, payload: bool) {
        let client = usize::from(client) % CLIENTS;
        // One lease slot per client: a new begin drops what the client held.
        self.release(client as u8, false);
        let intent = usize::from(intent) % INTENTS.len();
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.expect(intent, req.fingerprint(), now);
        self.agrees_with_decide(intent, req.fingerprint());
        let result = self.store().begin(req.clone());
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                let lease = match result {
                    Ok(Begin::Acquired(lease)) => lease,
                    other => panic!("{expected:?} must acquire, got {other:?}"),
                };
                let (attempt, created_at) = match expected {
                    Expect::Takeover(n) => (
                        n,
                        self.intents[intent]
                            .record
                            .as_ref()
                            .expect("a takeover has a record")
                            .created_at,
                    ),
                    _ => {
                        self.claimed(intent);
                        (1, now)
                    }
                };
                assert_eq!(lease.attempt(), attempt);
                assert!(
                    self.holders.insert(lease.holder()),
                    "a holder token was handed out twice: {:?}",
                    lease.holder()
                );
                self.granted_here.insert(lease.holder());
                let deadline = ts(now, LEASE_MS);
                assert_eq!(lease.deadline(), deadline);
                let key = lease.downstream_key();
                let seen = self.intents[intent].downstream.get_or_insert(key);
                assert_eq!(
                    *seen,
                    key,
                    "downstream_key of {} changed across attempts",
                    label(intent)
                );
                let expires_at = ts(now, RESPONSE_MS).max(deadline);
                self.intents[intent].record = Some(Record {
                    fingerprint: *req.fingerprint(),
                    created_at,
                    expires_at,
                    forget_at: expires_at,
                    state: State::Pending {
                        holder: lease.holder(),
                        lease_deadline: deadline,
                        attempt,
                    },
                });
                self.clients[client] = Some(Held { lease, intent });
            }
            early => self.check_early(intent, early, Early::of_begin(result), now),
        }
    }

    fn complete(&mut self, client: u8, end: End) {
        let client = usize::from(client) % CLIENTS;
        let Some(Held { lease, intent }) = self.clients[client].take() else {
            return;
        };
        let now = self.now();
        let held = holds(&self.intents[intent].record, &lease, now);
        let response = self.response(&format!("b{client}"), intent, end);
        let mut runs = 0;
        let result = lease.complete_with(|tx| {
            runs += 1;
            match end {
                End::Ok => {
                    bump(tx, &label(intent))?;
                    Ok(response.clone())
                }
                End::Terminal => Err(Abort::Terminal(response.clone())),
                End::Retryable => Err(Abort::retryable("sim: provider unavailable")),
            }
        });
        if !held {
            assert_eq!(runs, 0, "a stale lease's closure must not run");
            assert!(
                matches!(result, Err(Error::LeaseLost { .. })),
                "a stale lease must get LeaseLost, got {result:?}"
            );
            return;
        }
        assert_eq!(runs, 1);
        if let End::Retryable = end {
            // Nothing written; the dropped lease released the key.
            assert!(matches!(result, Err(Error::Aborted { .. })), "{result:?}");
            self.intents[intent].record = None;
            return;
        }
        let got = result.unwrap_or_else(|e| panic!("the holder's completion must commit: {e}"));
        assert_eq!(got.status(), response.status());
        assert_eq!(got.body(), response.body());
        assert_eq!(got.resource(), response.resource());
        assert_eq!(got.is_failure(), matches!(end, End::Terminal));
        let previous = self.intents[intent]
            .record
            .clone()
            .expect("a held lease has a record");
        if let End::Ok = end {
            self.intents[intent].effects += 1;
        }
        self.finished_with(intent, &previous, &got, matches!(end, End::Terminal));
    }

    fn heartbeat(&mut self, client: u8) {
        let client = usize::from(client) % CLIENTS;
        let now = self.now();
        let Some(Held { lease, intent }) = self.clients[client].as_mut() else {
            return;
        };
        let intent = *intent;
        let held = holds(&self.intents[intent].record, lease, now);
        let result = lease.heartbeat();
        if !held {
            assert!(
                matches!(result, Err(Error::LeaseLost { .. })),
                "a stale lease's heartbeat must get LeaseLost, got {result:?}"
            );
            return;
        }
        let Some(record) = self.intents[intent].record.as_mut() else {
            unreachable!("a held lease has a record");
        };
        let State::Pending { lease_deadline, .. } = &mut record.state else {
            unreachable!("a held lease's record is Pending");
        };
        // A heartbeat never lowers a deadline (the clock may have moved backwards).
        let deadline = ts(now, LEASE_MS).max(*lease_deadline);
        assert_eq!(
            idem::rules::heartbeat_deadline(*lease_deadline, now, Duration::from_millis(LEASE_MS)),
            deadline,
            "heartbeat_deadline agrees with the model"
        );
        *lease_deadline = deadline;
        assert_eq!(result.ok(), Some(deadline), "heartbeat of the holder");
        assert_eq!(lease.deadline(), deadline);
        record.expires_at = record.expires_at.max(deadline);
        record.forget_at = record.forget_at.max(record.expires_at);
    }

    /// `explicit`: `Lease::release`; otherwise the lease is dropped. Both free a held key.
    fn release(&mut self, client: u8, explicit: bool) {
        let client = usize::from(client) % CLIENTS;
        let Some(Held { lease, intent }) = self.clients[client].take() else {
            return;
        };
        if holds(&self.intents[intent].record, &lease, self.now()) {
            self.intents[intent].record = None;
        }
        if explicit {
            let result = lease.release();
            assert!(result.is_ok(), "release never fails here: {result:?}");
        } else {
            drop(lease);
        }
    }

    fn purge(&mut self, intent: u8) {
        let intent = usize::from(intent) % INTENTS.len();
        let (tenant, operation, key) = INTENTS[intent];
        let existed = self
            .store()
            .purge(&Scope::new(tenant, operation), key)
            .unwrap_or_else(|e| panic!("purge: {e}"));
        let model = self.intents[intent].record.take();
        assert_eq!(
            existed,
            model.is_some(),
            "purge reports whether a record existed"
        );
    }

    fn sweep(&mut self) {
        let now = self.now();
        let report = self
            .store()
            .sweep()
            .unwrap_or_else(|e| panic!("sweep: {e}"));
        let (mut deleted, mut tombstoned) = (0, 0);
        for i in &mut self.intents {
            let Some(r) = i.record.as_ref() else { continue };
            if now >= r.forget_at {
                i.record = None;
                deleted += 1;
            } else if now >= r.expires_at
                && let State::Completed(resp) | State::Failed(resp) = &r.state
            {
                let failed = matches!(r.state, State::Failed(_));
                let tombstone = Tombstone::new(resp.status(), resp.resource().cloned(), failed);
                let mut shrunk = r.clone();
                shrunk.state = State::Tombstone(tombstone);
                i.record = Some(shrunk);
                tombstoned += 1;
            }
        }
        assert_eq!(
            (report.deleted, report.tombstoned, report.repaired),
            (deleted, tombstoned, 0),
            "sweep report"
        );
    }

    /// A clean restart: every lease is dropped (releasing what it holds), then the store.
    fn reopen(&mut self) {
        for client in 0..CLIENTS {
            self.release(client as u8, false);
        }
        self.store = None;
        self.granted_here.clear();
        self.store = Some(open(&self.backend, &self.clock));
    }

    /// The process dies: nothing more reaches the disk (leases die unreleased), and the store
    /// reopens on what was durable.
    fn crash(&mut self) {
        self.backend
            .failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // The leases' drop tries to release through the dead backend: it must fail quietly.
        for slot in &mut self.clients {
            drop(slot.take());
        }
        self.store = None;
        self.granted_here.clear();
        self.backend = self.backend.crash();
        self.store = Some(open(&self.backend, &self.clock));
    }

    fn crash_in_closure(&mut self, intent: u8, payload: bool) {
        let intent = usize::from(intent) % INTENTS.len();
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.expect(intent, req.fingerprint(), now);
        let backend = self.backend.clone();
        let mut runs = 0;
        let result = self.store().execute(req, |tx| {
            runs += 1;
            bump(tx, &label(intent))?;
            backend
                .failing
                .store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(Response::new(201, "never acknowledged"))
        });
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                assert_eq!(runs, 1);
                // The disk may fail on a write inside the transaction (redb growing the file:
                // Storage, rolled back; or FailStopped naming it, when a later step of the same
                // call met the failure again) or at the commit (OutcomeUnknown). Either way
                // nothing was acknowledged, and the store latched.
                assert!(
                    matches!(
                        result,
                        Err(Error::OutcomeUnknown { .. }
                            | Error::Storage { .. }
                            | Error::FailStopped { .. })
                    ),
                    "a commit on a dead disk must fail, got {result:?}"
                );
                assert!(self.store().failure().is_some(), "the failure must latch");
            }
            early => {
                assert_eq!(runs, 0, "{early:?} must not run the closure");
                self.check_early(intent, early, Early::of_outcome(result), now);
            }
        }
        // Whatever happened, the process now dies; the model is unchanged.
        self.crash();
    }

    /// Checks an answer that ran nothing (from either flow) against the model's expectation.
    fn check_early(&self, intent: usize, expected: Expect, got: Early, now: Timestamp) {
        match (expected, got) {
            (Expect::Replay(stored), Early::Replayed(got)) => {
                assert_eq!(got, stored);
                self.check_replay(intent, &got);
            }
            (Expect::Expired(t), Early::Expired(got)) => assert_eq!(got, t),
            (Expect::InFlight(deadline), Early::InFlight(got)) => {
                assert_eq!(got, retry_after(deadline, now))
            }
            (Expect::Mismatch, Early::Mismatch) => {}
            (expected, got) => panic!("expected {expected:?}, got {got:?}"),
        }
    }

    /// What the open store must answer for `intent`: the model's rule, knowing which leases'
    /// holders may still be running.
    fn expect(&self, intent: usize, fp: &Fingerprint, now: Timestamp) -> Expect {
        expect(
            &self.intents[intent].record,
            fp,
            now,
            Some(&self.granted_here),
        )
    }

    /// `idem::rules::decide` (which assumes any holder may be running) against the model's rule
    /// under the same assumption.
    fn agrees_with_decide(&self, intent: usize, fp: &Fingerprint) {
        let expected = &expect(&self.intents[intent].record, fp, self.now(), None);
        let record = self.intents[intent].record.as_ref();
        let decided = match idem::rules::decide(record, fp, self.now()) {
            idem::rules::Decision::Claim => Expect::Claim,
            idem::rules::Decision::Takeover { attempt } => Expect::Takeover(attempt),
            idem::rules::Decision::Replay(r) => Expect::Replay(r.clone()),
            d @ idem::rules::Decision::Expired { .. } => {
                Expect::Expired(d.tombstone().expect("Expired has a tombstone"))
            }
            idem::rules::Decision::InFlight { lease_deadline } => Expect::InFlight(lease_deadline),
            idem::rules::Decision::Mismatch => Expect::Mismatch,
            idem::rules::Decision::Resume { .. } => {
                panic!("decide resumed a claim, but it is given no claim's tokens")
            }
        };
        assert_eq!(
            &decided, expected,
            "idem::rules::decide disagrees with the model"
        );
    }

    /// The invariants that hold after every step.
    fn check(&self) {
        let store = self.store();
        let now = self.now();
        let effects = all_effects(store);
        for (n, model) in self.intents.iter().enumerate() {
            let (tenant, operation, key) = INTENTS[n];
            let stored = store
                .get(&Scope::new(tenant, operation), key)
                .unwrap_or_else(|e| panic!("get {}: {e}", label(n)));
            assert_eq!(stored, model.record, "record of {}", label(n));
            let got = effects
                .iter()
                .find(|(l, _)| *l == label(n))
                .map_or(0, |(_, c)| *c);
            assert_eq!(got, model.effects, "effects of {}", label(n));
            if model.finished
                && let Some(r) = live(&model.record, now)
                && matches!(r.state, State::Completed(_))
            {
                assert!(got >= 1, "a completed intent has its effect");
            }
            // At most one live lease per key, checked against the store's record.
            let holders = self
                .clients
                .iter()
                .flatten()
                .filter(|h| h.intent == n)
                .filter(|h| idem::rules::holds_lease(stored.as_ref(), &h.lease.holder(), now))
                .count();
            assert!(holders <= 1, "{holders} leases hold {}", label(n));
        }
        store
            .check_expiry_index()
            .unwrap_or_else(|e| panic!("expiry index: {e}"));
        assert!(
            store.failure().is_none(),
            "the store latched: {:?}",
            store.failure()
        );
    }

    fn close(self) {
        let Sim { store, clients, .. } = self;
        drop(clients);
        let mut store = store.expect("store is open");
        assert_eq!(store.check_integrity().ok(), Some(true), "redb integrity");
    }
}
