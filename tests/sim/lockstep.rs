//! The runner of the schedule language (`schedule.rs`): one or more engines ([`Engine`]) and
//! the reference model (`model.rs`) driven step by step, in lockstep. Each call goes to every
//! engine in turn (engine 0 first) with the same arguments; their answers, mapped to one
//! comparable shape ([`Answer`]), must be equal, and the common answer must be the model's.
//! After every step each engine's records (`get`) must equal the model's, and so must its
//! effect counts, and the engine's own invariants must hold ([`Engine::observe`]).
//!
//! Holder tokens are random per store instance, so they differ between engines: the model
//! holds engine 0's, and each engine's tokens are mapped to engine 0's token of the same lease
//! (granted in the same step) before anything is compared. A token an engine hands out twice
//! fails the run.
//!
//! Time: one `ManualClock`, shared by the model and every engine (each store is opened with
//! it), moved only between steps; so every decision of one step, in every engine, is made at
//! the same instant.

use std::collections::HashMap;
use std::time::Duration;

use idem::clock::{Clock, ManualClock};
use idem::format::{HolderToken, Record, State};
use idem::keys::DownstreamKey;
use idem::{BeginAnswer, Error, ExecuteAnswer, Request, Response, Timestamp, Tombstone};

use super::model::{Early, Expect, Model, View, live};
use super::schedule::{
    CLIENTS, End, Op, backward, client_index, forward, intent_index, label, request,
};

/// One call's answer, in a shape every engine's answer maps to.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Executed(Response),
    Acquired {
        attempt: u32,
        deadline: Timestamp,
        downstream: DownstreamKey,
        holder: HolderToken,
    },
    /// A lease's `complete_with` committed this answer.
    Finished(Response),
    /// A heartbeat's answer, and the lease's deadline afterwards.
    Extended {
        answered: Timestamp,
        lease_deadline: Timestamp,
    },
    Released,
    Purged(bool),
    Swept {
        deleted: u64,
        tombstoned: u64,
        repaired: u64,
    },
    Replayed(Response),
    Expired(Tombstone),
    InFlight(Duration),
    Mismatch,
    Aborted,
    LeaseLost,
    /// The process died at the commit: nothing was acknowledged (the engine checked that it
    /// failed as its documentation says it does there).
    Unacknowledged,
    /// Anything else, as text for the failure message.
    Other(String),
}

impl Answer {
    pub fn of_error(e: Error) -> Answer {
        match e {
            Error::PayloadMismatch { .. } => Answer::Mismatch,
            Error::Aborted { .. } => Answer::Aborted,
            Error::LeaseLost { .. } => Answer::LeaseLost,
            other => Answer::Other(format!("{other:?}")),
        }
    }

    pub fn of_outcome(result: Result<ExecuteAnswer, Error>) -> Answer {
        match result {
            Ok(ExecuteAnswer::Ran(r)) => Answer::Executed(r),
            Ok(ExecuteAnswer::Replayed(r)) => Answer::Replayed(r),
            Ok(ExecuteAnswer::Expired(t)) => Answer::Expired(t),
            Ok(ExecuteAnswer::InFlight { retry_after }) => Answer::InFlight(retry_after),
            Err(e) => Answer::of_error(e),
        }
    }

    /// `begin`'s answer; `acquired` keeps the lease and describes it.
    pub fn of_begin<L>(
        result: Result<BeginAnswer<L>, Error>,
        acquired: impl FnOnce(L) -> Answer,
    ) -> Answer {
        match result {
            Ok(BeginAnswer::Acquired(lease)) => acquired(lease),
            Ok(BeginAnswer::Replayed(r)) => Answer::Replayed(r),
            Ok(BeginAnswer::Expired(t)) => Answer::Expired(t),
            Ok(BeginAnswer::InFlight { retry_after }) => Answer::InFlight(retry_after),
            Err(e) => Answer::of_error(e),
        }
    }

    pub fn of_finish(result: Result<Response, Error>) -> Answer {
        match result {
            Ok(r) => Answer::Finished(r),
            Err(e) => Answer::of_error(e),
        }
    }

    fn early(self) -> Early {
        match self {
            Answer::Replayed(r) => Early::Replayed(r),
            Answer::Expired(t) => Early::Expired(t),
            Answer::InFlight(d) => Early::InFlight(d),
            Answer::Mismatch => Early::Mismatch,
            other => Early::Other(format!("{other:?}")),
        }
    }
}

/// One engine under a schedule: its store (opened with the shared clock and the settings of
/// `schedule.rs`), one lease slot per client, and the caller's effect counters, which every
/// closure bumps by its intent's label in the store's transaction. Calls that run a closure
/// return how many times it ran.
pub trait Engine {
    fn name(&self) -> &'static str;
    /// `execute(request)` with a closure that bumps `label` and answers `response` (`Ok`),
    /// fails terminally with it, or aborts retryably, as `end` says.
    fn execute(
        &mut self,
        request: Request,
        label: &str,
        end: End,
        response: &Response,
    ) -> (Answer, u32);
    /// `begin(request)`; an acquired lease goes into `client`'s slot, which is empty.
    fn begin(&mut self, client: usize, request: Request) -> Answer;
    /// `complete_with` of the lease in `client`'s slot (taken out), closure as in `execute`.
    fn complete(
        &mut self,
        client: usize,
        label: &str,
        end: End,
        response: &Response,
    ) -> (Answer, u32);
    /// `heartbeat` of the lease in `client`'s slot (kept there).
    fn heartbeat(&mut self, client: usize) -> Answer;
    /// `release` of the lease in `client`'s slot (taken out).
    fn release(&mut self, client: usize) -> Answer;
    /// Drops whatever lease `client`'s slot holds.
    fn drop_lease(&mut self, client: usize);
    fn purge(&mut self, intent: usize) -> Answer;
    fn sweep(&mut self) -> Answer;
    /// A clean restart (every lease slot is empty): a new store instance on the same data.
    fn reopen(&mut self);
    /// The process dies: its leases die unreleased, nothing more is written, and a new store
    /// instance opens on what was committed.
    fn crash(&mut self);
    /// `execute(request)` whose closure bumps `label`, then the process dies before the
    /// commit is acknowledged (`Answer::Unacknowledged`). The runner then calls `crash`.
    fn crash_in_closure(&mut self, request: Request, label: &str) -> (Answer, u32);
    /// What the engine holds now (every intent's record as `get` returns it, and every
    /// effect counter), after checking its own invariants (indexes, latches, derived columns).
    fn observe(&self) -> Observed;
    /// The end of the schedule: every lease dropped, the engine's closing checks.
    fn close(self: Box<Self>);
}

/// What an engine holds after a step.
pub struct Observed {
    /// Per intent (`schedule::INTENTS`), its record.
    pub records: Vec<Option<Record>>,
    /// (label, count) of every effect counter.
    pub effects: Vec<(String, u64)>,
}

struct Held {
    /// Engine 0's token of the lease.
    holder: HolderToken,
    intent: usize,
}

pub struct Sim {
    clock: ManualClock,
    engines: Vec<Box<dyn Engine>>,
    /// Per engine: each token it handed out → engine 0's token of the same lease.
    tokens: Vec<HashMap<HolderToken, HolderToken>>,
    model: Model,
    clients: Vec<Option<Held>>,
    /// Per engine, what it held after the last step that called it. A step that calls no
    /// engine changes nothing they hold (nothing runs in the background), so it is not read
    /// again then.
    observed: Vec<Observed>,
    /// An engine was called since `observed` was read.
    stale: bool,
    /// The step being run (from 1) and its op, for failure messages.
    step: usize,
    op: Option<Op>,
}

impl Sim {
    /// `engines` must have been opened with `clock`, and answer as `view` says.
    pub fn new(clock: ManualClock, view: View, engines: Vec<Box<dyn Engine>>) -> Self {
        assert!(!engines.is_empty());
        Sim {
            clock,
            tokens: engines.iter().map(|_| HashMap::new()).collect(),
            engines,
            model: Model::new(view),
            clients: (0..CLIENTS).map(|_| None).collect(),
            observed: Vec::new(),
            stale: true,
            step: 0,
            op: None,
        }
    }

    /// Runs the schedule, checking every invariant after every step, then closes the engines.
    pub fn run(mut self, ops: &[Op]) {
        for &op in ops {
            self.step += 1;
            self.op = Some(op);
            self.apply(op);
            self.check();
        }
        let Sim { engines, .. } = self;
        for engine in engines {
            engine.close();
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Every engine's answer to one call (made by `call`, engine 0 first), with their holder
    /// tokens mapped to engine 0's; they must all be equal. Returns the common answer.
    fn agree(&mut self, mut call: impl FnMut(&mut dyn Engine) -> (Answer, u32)) -> (Answer, u32) {
        self.stale = true;
        let mut answers: Vec<(Answer, u32)> =
            self.engines.iter_mut().map(|e| call(e.as_mut())).collect();
        let canonical = match &answers[0].0 {
            Answer::Acquired { holder, .. } => Some(*holder),
            _ => None,
        };
        for (n, (answer, _)) in answers.iter_mut().enumerate() {
            if let (Some(canonical), Answer::Acquired { holder, .. }) = (canonical, answer) {
                assert!(
                    self.tokens[n].insert(*holder, canonical).is_none(),
                    "{}: a holder token was handed out twice: {holder:?}",
                    self.engines[n].name()
                );
                *holder = canonical;
            }
        }
        for (n, answer) in answers.iter().enumerate().skip(1) {
            assert!(
                *answer == answers[0],
                "the engines disagree at step {} ({:?}): {} answered {:?} (closure runs), {} answered {:?}",
                self.step,
                self.op,
                self.engines[0].name(),
                answers[0],
                self.engines[n].name(),
                answer,
            );
        }
        answers.swap_remove(0)
    }

    /// Engine `n`'s record with its holder token mapped to engine 0's.
    fn canonical(&self, n: usize, mut record: Record) -> Record {
        if let State::Pending { holder, .. } = &mut record.state
            && let Some(canonical) = self.tokens[n].get(holder)
        {
            *holder = *canonical;
        }
        record
    }

    fn apply(&mut self, op: Op) {
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
            Op::Release { client } => self.release(client_index(client), true),
            Op::DropLease { client } => self.release(client_index(client), false),
            Op::Purge { intent } => self.purge(intent),
            Op::Forward(i) => self.clock.advance(forward(i)),
            Op::Backward(i) => {
                let back = backward(i);
                self.clock.set(Timestamp(self.now().0.saturating_sub(back)));
            }
            Op::Sweep => self.sweep(),
            Op::Reopen => self.reopen(),
            Op::Crash => self.crash(),
            Op::CrashInClosure { intent, payload } => self.crash_in_closure(intent, payload),
        }
    }

    fn execute(&mut self, client: u8, intent: u8, payload: bool, end: End) {
        let intent = intent_index(intent);
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.model.expect(intent, req.fingerprint(), now);
        self.model
            .agrees_with_decide(intent, req.fingerprint(), now);
        let response =
            self.model
                .response(&format!("a{client}"), intent, matches!(end, End::Terminal));
        let label = label(intent);
        let (result, runs) = self.agree(|e| e.execute(req.clone(), &label, end, &response));
        let runs_expected = u32::from(matches!(expected, Expect::Claim | Expect::Takeover(_)));
        assert_eq!(runs, runs_expected, "closure runs for {expected:?}");
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                assert!(
                    !live(&self.model.intents[intent].record, now)
                        .is_some_and(|r| !matches!(r.state, State::Pending { .. })),
                    "model: a finished live intent can never be claimed"
                );
                if let End::Retryable = end {
                    assert!(
                        matches!(result, Answer::Aborted),
                        "a retryable abort returns Aborted, got {result:?}"
                    );
                    return;
                }
                let got = match result {
                    Answer::Executed(r) => r,
                    other => panic!("{expected:?} must execute, got {other:?}"),
                };
                assert_eq!(got.status(), response.status());
                assert_eq!(got.body(), response.body());
                assert_eq!(got.resource(), response.resource());
                assert_eq!(got.is_failure(), matches!(end, End::Terminal));
                let previous = match expected {
                    Expect::Takeover(_) => self.model.intents[intent]
                        .record
                        .clone()
                        .expect("a takeover has a record"),
                    _ => {
                        self.model.claimed(intent);
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
                    self.model.intents[intent].effects += 1;
                }
                self.model.finished_with(
                    intent,
                    &previous,
                    &got,
                    matches!(end, End::Terminal),
                    now,
                );
            }
            early => self.model.check_early(intent, early, result.early(), now),
        }
    }

    fn begin(&mut self, client: u8, intent: u8, payload: bool) {
        let client = client_index(client);
        // One lease slot per client: a new begin drops what the client held.
        self.release(client, false);
        let intent = intent_index(intent);
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.model.expect(intent, req.fingerprint(), now);
        self.model
            .agrees_with_decide(intent, req.fingerprint(), now);
        let (result, _) = self.agree(|e| (e.begin(client, req.clone()), 0));
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                let Answer::Acquired {
                    attempt,
                    deadline,
                    downstream,
                    holder,
                } = result
                else {
                    panic!("{expected:?} must acquire, got {result:?}");
                };
                self.model.granted(
                    intent,
                    &expected,
                    *req.fingerprint(),
                    (attempt, deadline, downstream, holder),
                    now,
                );
                self.clients[client] = Some(Held { holder, intent });
            }
            early => self.model.check_early(intent, early, result.early(), now),
        }
    }

    fn complete(&mut self, client: u8, end: End) {
        let client = client_index(client);
        let Some(Held { holder, intent }) = self.clients[client].take() else {
            return;
        };
        let now = self.now();
        let held = self.model.holds(intent, &holder, now);
        let response =
            self.model
                .response(&format!("b{client}"), intent, matches!(end, End::Terminal));
        let label = label(intent);
        let (result, runs) = self.agree(|e| e.complete(client, &label, end, &response));
        if !held {
            assert_eq!(runs, 0, "a stale lease's closure must not run");
            assert!(
                matches!(result, Answer::LeaseLost),
                "a stale lease must get LeaseLost, got {result:?}"
            );
            return;
        }
        assert_eq!(runs, 1);
        if let End::Retryable = end {
            // Nothing written; the dropped lease released the key.
            assert!(matches!(result, Answer::Aborted), "{result:?}");
            self.model.intents[intent].record = None;
            return;
        }
        let got = match result {
            Answer::Finished(r) => r,
            other => panic!("the holder's completion must commit: {other:?}"),
        };
        assert_eq!(got.status(), response.status());
        assert_eq!(got.body(), response.body());
        assert_eq!(got.resource(), response.resource());
        assert_eq!(got.is_failure(), matches!(end, End::Terminal));
        let previous = self.model.intents[intent]
            .record
            .clone()
            .expect("a held lease has a record");
        if let End::Ok = end {
            self.model.intents[intent].effects += 1;
        }
        self.model
            .finished_with(intent, &previous, &got, matches!(end, End::Terminal), now);
    }

    fn heartbeat(&mut self, client: u8) {
        let client = client_index(client);
        let now = self.now();
        let Some(Held { holder, intent }) = self.clients[client].as_ref() else {
            return;
        };
        let (holder, intent) = (*holder, *intent);
        let held = self.model.holds(intent, &holder, now);
        let (result, _) = self.agree(|e| (e.heartbeat(client), 0));
        if !held {
            assert!(
                matches!(result, Answer::LeaseLost),
                "a stale lease's heartbeat must get LeaseLost, got {result:?}"
            );
            return;
        }
        let deadline = self.model.heartbeat(intent, now);
        assert_eq!(
            result,
            Answer::Extended {
                answered: deadline,
                lease_deadline: deadline
            },
            "heartbeat of the holder"
        );
    }

    /// `explicit`: `release`; otherwise the lease is dropped. Both free a held key.
    fn release(&mut self, client: usize, explicit: bool) {
        let Some(Held { holder, intent }) = self.clients[client].take() else {
            return;
        };
        if self.model.holds(intent, &holder, self.now()) {
            self.model.intents[intent].record = None;
        }
        if explicit {
            let (result, _) = self.agree(|e| (e.release(client), 0));
            assert!(
                matches!(result, Answer::Released),
                "release never fails here: {result:?}"
            );
        } else {
            self.stale = true;
            for engine in &mut self.engines {
                engine.drop_lease(client);
            }
        }
    }

    fn purge(&mut self, intent: u8) {
        let intent = intent_index(intent);
        let (result, _) = self.agree(|e| (e.purge(intent), 0));
        let model = self.model.intents[intent].record.take();
        assert_eq!(
            result,
            Answer::Purged(model.is_some()),
            "purge reports whether a record existed"
        );
    }

    fn sweep(&mut self) {
        let now = self.now();
        let (report, _) = self.agree(|e| (e.sweep(), 0));
        let (deleted, tombstoned) = self.model.sweep(now);
        assert_eq!(
            report,
            Answer::Swept {
                deleted,
                tombstoned,
                repaired: 0
            },
            "sweep report"
        );
    }

    /// A clean restart: every lease is dropped (releasing what it holds), then the store.
    fn reopen(&mut self) {
        for client in 0..CLIENTS {
            self.release(client, false);
        }
        self.stale = true;
        for engine in &mut self.engines {
            engine.reopen();
        }
        self.model.restarted();
    }

    /// The process dies: its leases die unreleased, and the store reopens on what was
    /// committed (the model is unchanged).
    fn crash(&mut self) {
        for slot in &mut self.clients {
            slot.take();
        }
        self.stale = true;
        for engine in &mut self.engines {
            engine.crash();
        }
        self.model.restarted();
    }

    fn crash_in_closure(&mut self, intent: u8, payload: bool) {
        let intent = intent_index(intent);
        let req = request(intent, payload);
        let now = self.now();
        let expected = self.model.expect(intent, req.fingerprint(), now);
        let label = label(intent);
        let (result, runs) = self.agree(|e| e.crash_in_closure(req.clone(), &label));
        match expected {
            Expect::Claim | Expect::Takeover(_) => {
                assert_eq!(runs, 1);
                assert!(
                    matches!(result, Answer::Unacknowledged),
                    "a commit on a dead disk must fail, got {result:?}"
                );
            }
            early => {
                assert_eq!(runs, 0, "{early:?} must not run the closure");
                self.model.check_early(intent, early, result.early(), now);
            }
        }
        // Whatever happened, the process now dies; the model is unchanged.
        self.crash();
    }

    /// The invariants that hold after every step, on every engine.
    fn check(&mut self) {
        if self.stale {
            self.observed = self.engines.iter().map(|e| e.observe()).collect();
            self.stale = false;
        }
        let now = self.now();
        for (n, (engine, observed)) in self.engines.iter().zip(&self.observed).enumerate() {
            for (i, model) in self.model.intents.iter().enumerate() {
                let stored = observed.records[i].clone().map(|r| self.canonical(n, r));
                assert_eq!(
                    stored,
                    model.record,
                    "record of {} on {} after step {} ({:?})",
                    label(i),
                    engine.name(),
                    self.step,
                    self.op
                );
                let got = observed
                    .effects
                    .iter()
                    .find(|(l, _)| *l == label(i))
                    .map_or(0, |(_, c)| *c);
                assert_eq!(
                    got,
                    model.effects,
                    "effects of {} on {}",
                    label(i),
                    engine.name()
                );
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
                    .filter(|h| h.intent == i)
                    .filter(|h| idem::rules::holds_lease(stored.as_ref(), &h.holder, now))
                    .count();
                assert!(holders <= 1, "{holders} leases hold {}", label(i));
            }
        }
    }
}
