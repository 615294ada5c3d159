//! The reference model of the schedule language (`schedule.rs`): per intent, the record a
//! store must hold, written by rules stated here independently of `src/` (it does not call
//! [`idem::rules::decide`] to predict; it checks that `decide` agrees with it), and the answers
//! every call must get. `lockstep.rs` runs it next to one or more engines.

use std::collections::HashSet;
use std::time::Duration;

use idem::format::{HolderToken, Record, State};
use idem::keys::{DownstreamKey, Fingerprint};
use idem::{Response, Timestamp, Tombstone};

use super::schedule::{FORGET_MS, INTENTS, LEASE_MS, RESPONSE_MS, label, retry_after, ts};

/// Which lease holders the engines under test know may still be running, i.e. which engine
/// the model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    /// The file engine alone on its file (docs/design.md, "A restart frees the leases of the
    /// dead"): only the leases the open store granted can have a running holder; a lease
    /// granted before the last reopen or crash is taken over at once.
    OpenInstance,
    /// Any holder may be running until its lease lapses (PostgreSQL; the file engine in
    /// `multi_process` mode): a reopen or a crash changes no decision.
    Any,
}

/// What the model holds for one intent.
#[derive(Debug, Default)]
pub struct Intent {
    /// The record the store must hold.
    pub record: Option<Record>,
    /// Effects the caller's table must show (all record lifetimes together).
    pub effects: u64,
    /// The current record lifetime already finished (Completed or Failed): it must never run
    /// again until the record is gone or forgotten.
    pub finished: bool,
    /// The first response of the current record lifetime; every replay must equal it.
    pub first: Option<Response>,
    /// The downstream key seen on the first lease ever; every lease must show the same.
    pub downstream: Option<DownstreamKey>,
}

/// The model's own rule (docs/design.md, decision order), written independently of `decide`.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect {
    Claim,
    Takeover(u32),
    Replay(Response),
    Expired(Tombstone),
    InFlight(Timestamp),
    Mismatch,
}

pub fn live(record: &Option<Record>, now: Timestamp) -> Option<&Record> {
    record.as_ref().filter(|r| now < r.forget_at)
}

/// `granted_here`: the tokens whose holders may still be running (`None`: any holder may be,
/// `decide`'s view; the single file store's view is the tokens it granted itself).
pub fn expect(
    record: &Option<Record>,
    fp: &Fingerprint,
    now: Timestamp,
    granted_here: Option<&HashSet<HolderToken>>,
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
pub fn holds(record: &Option<Record>, holder: &HolderToken, now: Timestamp) -> bool {
    matches!(live(record, now),
        Some(Record { state: State::Pending { holder: h, .. }, .. }) if h == holder)
}

/// The model: every intent's record and effects, and which leases may have running holders.
pub struct Model {
    pub intents: Vec<Intent>,
    view: View,
    /// The tokens the open store granted (meaningful in [`View::OpenInstance`]).
    granted_here: HashSet<HolderToken>,
    /// Responses made so far (each response body is unique).
    seq: u64,
}

impl Model {
    pub fn new(view: View) -> Self {
        Model {
            intents: (0..INTENTS.len()).map(|_| Intent::default()).collect(),
            view,
            granted_here: HashSet::new(),
            seq: 0,
        }
    }

    /// A new response of client `who` for `intent`, ending as `terminal` says.
    pub fn response(&mut self, who: &str, intent: usize, terminal: bool) -> Response {
        self.seq += 1;
        let status = if terminal { 402 } else { 201 };
        Response::new(status, format!("{who}:{intent}:{}", self.seq))
            .with_resource("intent", format!("{intent}"))
    }

    /// What the open store must answer for `intent`: the model's rule, knowing which leases'
    /// holders may still be running.
    pub fn expect(&self, intent: usize, fp: &Fingerprint, now: Timestamp) -> Expect {
        let granted = match self.view {
            View::OpenInstance => Some(&self.granted_here),
            View::Any => None,
        };
        expect(&self.intents[intent].record, fp, now, granted)
    }

    /// `idem::rules::decide` (which assumes any holder may be running) against the model's rule
    /// under the same assumption.
    pub fn agrees_with_decide(&self, intent: usize, fp: &Fingerprint, now: Timestamp) {
        let expected = &expect(&self.intents[intent].record, fp, now, None);
        let record = self.intents[intent].record.as_ref();
        let decided = match idem::rules::decide(record, fp, now) {
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

    pub fn holds(&self, intent: usize, holder: &HolderToken, now: Timestamp) -> bool {
        holds(&self.intents[intent].record, holder, now)
    }

    /// A new record lifetime begins when a claim replaces an absent or forgotten record.
    pub fn claimed(&mut self, intent: usize) {
        let i = &mut self.intents[intent];
        i.finished = false;
        i.first = None;
    }

    /// The model's record after an intent finished at `now` with `response`.
    pub fn finished_with(
        &mut self,
        intent: usize,
        previous: &Record,
        response: &Response,
        failed: bool,
        now: Timestamp,
    ) {
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

    /// A lease granted at `now` for `intent` (a claim or a takeover, as `expected` says):
    /// checks its attempt, deadline and downstream key, and writes its Pending record.
    pub fn granted(
        &mut self,
        intent: usize,
        expected: &Expect,
        fingerprint: Fingerprint,
        lease: (u32, Timestamp, DownstreamKey, HolderToken),
        now: Timestamp,
    ) {
        let (got_attempt, got_deadline, key, holder) = lease;
        let (attempt, created_at) = match expected {
            Expect::Takeover(n) => (
                *n,
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
        assert_eq!(got_attempt, attempt);
        self.granted_here.insert(holder);
        let deadline = ts(now, LEASE_MS);
        assert_eq!(got_deadline, deadline);
        let seen = self.intents[intent].downstream.get_or_insert(key);
        assert_eq!(
            *seen,
            key,
            "downstream_key of {} changed across attempts",
            label(intent)
        );
        let expires_at = ts(now, RESPONSE_MS).max(deadline);
        self.intents[intent].record = Some(Record {
            fingerprint,
            created_at,
            expires_at,
            forget_at: expires_at,
            state: State::Pending {
                holder,
                lease_deadline: deadline,
                attempt,
            },
        });
    }

    /// The holder's heartbeat at `now`: the record's new deadline (never lower than before).
    pub fn heartbeat(&mut self, intent: usize, now: Timestamp) -> Timestamp {
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
        record.expires_at = record.expires_at.max(deadline);
        record.forget_at = record.forget_at.max(record.expires_at);
        deadline
    }

    /// A sweep at `now`: the records it deletes and shrinks; returns (deleted, tombstoned).
    pub fn sweep(&mut self, now: Timestamp) -> (u64, u64) {
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
        (deleted, tombstoned)
    }

    /// A new store instance opened: in [`View::OpenInstance`], no lease granted before it has
    /// a running holder.
    pub fn restarted(&mut self) {
        self.granted_here.clear();
    }

    pub fn check_replay(&self, intent: usize, got: &Response) {
        let first = self.intents[intent].first.as_ref();
        assert_eq!(
            Some(got),
            first,
            "a replay of {} must equal its first response",
            label(intent)
        );
    }

    /// Checks an answer that ran nothing (from either flow) against the model's expectation.
    pub fn check_early(&self, intent: usize, expected: Expect, got: Early, now: Timestamp) {
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
}

/// An answer of `execute` or `begin` that ran nothing, in one shape for both flows; anything
/// else (an execution, a lease, another error) is kept as text for the failure message.
#[derive(Debug)]
pub enum Early {
    Replayed(Response),
    Expired(Tombstone),
    InFlight(Duration),
    Mismatch,
    Other(String),
}
