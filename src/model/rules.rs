//! The decision logic, as pure functions of (stored record, request fingerprint, time).
//!
//! No I/O happens here: the store reads the record inside its write transaction, asks
//! [`decide`], and acts; a heartbeat asks [`heartbeat_deadline`]; the sweep asks [`sweep_due`]
//! where a record belongs in the expiry index and [`sweep_action`] what to do with it once due.
//! The fuzzer's reference model, the tests and any future backend use the same functions, so
//! the rules live in exactly one place.

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::keys::Fingerprint;
use crate::model::record::{HolderToken, Record, State};
use crate::model::response::{Resource, Response, Tombstone};

/// What to do with a request, given what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'r> {
    /// No live record (none stored, or the stored one is past `forget_at`): claim the key.
    Claim,
    /// A Pending record with the same fingerprint whose lease has lapsed: take it over as
    /// attempt number `attempt`. The old holder is fenced out by its token.
    Takeover {
        /// The new attempt's number (previous + 1).
        attempt: u32,
    },
    /// The intent finished and its response window is open: replay this response (Completed
    /// or Failed).
    Replay(&'r Response),
    /// The intent finished, but its response window is over (past `expires_at`, or already
    /// shrunk to a tombstone by a sweep): answer "already done" with what is left. Nothing runs.
    Expired {
        /// The original status code.
        status: u16,
        /// The original resource pointer.
        resource: Option<&'r Resource>,
        /// True when the intent ended in a terminal failure.
        failed: bool,
    },
    /// Another attempt holds a live lease until `lease_deadline`.
    InFlight {
        /// When that lease lapses unless heartbeated.
        lease_deadline: Timestamp,
    },
    /// The key is live but was used with a different payload.
    Mismatch,
}

impl Decision<'_> {
    /// The owned tombstone of an [`Decision::Expired`] decision.
    pub fn tombstone(&self) -> Option<Tombstone> {
        match self {
            Decision::Expired {
                status,
                resource,
                failed,
            } => Some(Tombstone::new(*status, resource.cloned(), *failed)),
            _ => None,
        }
    }
}

/// True when `record`'s response window is over at `now` (`now ≥ expires_at`): a finished
/// record answers as a tombstone from then on. See [`is_forgotten`] for when it is absent.
pub fn is_expired(record: &Record, now: Timestamp) -> bool {
    now >= record.expires_at
}

/// True when `record` is past `forget_at` at `now` and must be treated as absent: its key is
/// free, whether or not a sweep has deleted it.
pub fn is_forgotten(record: &Record, now: Timestamp) -> bool {
    now >= record.forget_at
}

/// Decides what a request with `fingerprint` may do at `now`, given the stored record.
///
/// Order of the rules (each one is an invariant, see docs/design.md):
/// 1. no record, or one past `forget_at` → `Claim` (a record is never trusted past its times);
/// 2. a different fingerprint → `Mismatch`, whatever the state (the key is bound to its first
///    payload for as long as the record lives, tombstone included);
/// 3. Completed / Failed with `now < expires_at` → `Replay`; past `expires_at`, or a
///    Tombstone → `Expired`;
/// 4. Pending with `now < lease_deadline` → `InFlight`; otherwise → `Takeover`.
pub fn decide<'r>(
    stored: Option<&'r Record>,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Decision<'r> {
    let record = match stored {
        Some(r) if !is_forgotten(r, now) => r,
        _ => return Decision::Claim,
    };
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match &record.state {
        State::Completed(r) | State::Failed(r) if is_expired(record, now) => Decision::Expired {
            status: r.status(),
            resource: r.resource(),
            // The state, not the in-memory flag, says whether it failed.
            failed: matches!(record.state, State::Failed(_)),
        },
        State::Completed(r) | State::Failed(r) => Decision::Replay(r),
        State::Tombstone(t) => Decision::Expired {
            status: t.status(),
            resource: t.resource(),
            failed: t.is_failure(),
        },
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            if now < *lease_deadline {
                Decision::InFlight {
                    lease_deadline: *lease_deadline,
                }
            } else {
                Decision::Takeover {
                    attempt: attempt.saturating_add(1),
                }
            }
        }
    }
}

/// True when `holder` still owns the key at `now`: the record is live (before `forget_at`),
/// Pending, and carries `holder`'s token. A lapsed lease that nobody has taken over is still
/// held (nobody else can have acted); once another attempt takes over, the token differs and
/// this is false forever.
pub fn holds_lease(stored: Option<&Record>, holder: &HolderToken, now: Timestamp) -> bool {
    match stored {
        Some(r) if !is_forgotten(r, now) => {
            matches!(&r.state, State::Pending { holder: h, .. } if h == holder)
        }
        _ => false,
    }
}

/// The lease deadline a heartbeat at `now` grants, given the deadline `current` already
/// granted: `now + lease`, but never earlier than `current`. A heartbeat only ever extends a
/// lease: under a clock that moved backwards, `now + lease` is earlier than the deadline the
/// holder was promised, and lowering it would let another attempt take the key over while the
/// holder still counts on its lease (the holder's clock-free promise is "until the deadline I
/// was given").
pub fn heartbeat_deadline(current: Timestamp, now: Timestamp, lease: Duration) -> Timestamp {
    current.max(now.saturating_add(lease))
}

/// The instant from which the sweep has work on `record`, i.e. its place in the expiry index:
/// `expires_at` for a Completed or Failed record (it then shrinks to a tombstone), `forget_at`
/// for everything else (it is then deleted). A Pending record's `forget_at` is never before its
/// lease deadline, so a live lease is never due.
pub fn sweep_due(record: &Record) -> Timestamp {
    match record.state {
        State::Completed(_) | State::Failed(_) => record.expires_at.min(record.forget_at),
        State::Pending { .. } | State::Tombstone(_) => record.forget_at,
    }
}

/// What a sweep does with a record at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepAction {
    /// Not due yet: leave it (its index entry is at [`sweep_due`], after `now`).
    Keep,
    /// Past its response window: replace it with this tombstone record (same fingerprint and
    /// instants, the response reduced to a [`Tombstone`]), indexed at its `forget_at`.
    Shrink(Record),
    /// Past `forget_at`: delete it and its index entry; the key is free.
    Delete,
}

/// Decides what the sweep does with `record` at `now`. Agrees with [`decide`]: it deletes only
/// what `decide` treats as absent, and shrinks only what `decide` answers as `Expired`, so a
/// sweep never changes an answer.
pub fn sweep_action(record: &Record, now: Timestamp) -> SweepAction {
    if is_forgotten(record, now) {
        return SweepAction::Delete;
    }
    match &record.state {
        State::Completed(r) | State::Failed(r) if is_expired(record, now) => {
            let failed = matches!(record.state, State::Failed(_));
            SweepAction::Shrink(Record {
                fingerprint: record.fingerprint,
                created_at: record.created_at,
                expires_at: record.expires_at,
                forget_at: record.forget_at,
                state: State::Tombstone(Tombstone::new(r.status(), r.resource().cloned(), failed)),
            })
        }
        _ => SweepAction::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: Fingerprint = Fingerprint([1; 32]);
    const OTHER: Fingerprint = Fingerprint([2; 32]);
    const ME: HolderToken = HolderToken([7; 16]);
    const YOU: HolderToken = HolderToken([8; 16]);

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Kind {
        Absent,
        Pending,
        Completed,
        Failed,
        Tombstone,
    }

    const KINDS: [Kind; 5] = [
        Kind::Absent,
        Kind::Pending,
        Kind::Completed,
        Kind::Failed,
        Kind::Tombstone,
    ];

    /// Where `now` falls in the record's life.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Phase {
        /// `now < expires_at`: the response window is open.
        Window,
        /// `expires_at ≤ now < forget_at`: the tombstone tier.
        Horizon,
        /// `forget_at ≤ now`: the record counts as absent.
        Forgotten,
    }

    const PHASES: [Phase; 3] = [Phase::Window, Phase::Horizon, Phase::Forgotten];

    fn record(kind: Kind, lease_alive: bool, phase: Phase, now: u64) -> Option<Record> {
        // Boundaries sit exactly at `now` so the inclusive ends are exercised.
        let (expires_at, forget_at) = match phase {
            Phase::Window => (now + 1_000, now + 2_000),
            Phase::Horizon => (now, now + 1_000),
            Phase::Forgotten => (now - 1_000, now),
        };
        let lease_deadline = if lease_alive { now + 10 } else { now };
        let state = match kind {
            Kind::Absent => return None,
            Kind::Pending => State::Pending {
                holder: ME,
                lease_deadline: Timestamp(lease_deadline),
                attempt: 3,
            },
            Kind::Completed => {
                State::Completed(Response::new(201, "ok").with_resource("order", "o1"))
            }
            Kind::Failed => State::Failed(Response::new(402, "declined").mark_failed()),
            Kind::Tombstone => State::Tombstone(Tombstone::new(
                409,
                Some(Resource {
                    kind: "order".into(),
                    id: "o2".into(),
                }),
                true,
            )),
        };
        Some(Record {
            fingerprint: FP,
            created_at: Timestamp(now.saturating_sub(5_000)),
            expires_at: Timestamp(expires_at),
            forget_at: Timestamp(forget_at),
            state,
        })
    }

    fn name(d: &Decision<'_>) -> &'static str {
        match d {
            Decision::Claim => "claim",
            Decision::Takeover { .. } => "takeover",
            Decision::Replay(_) => "replay",
            Decision::Expired { .. } => "expired",
            Decision::InFlight { .. } => "inflight",
            Decision::Mismatch => "mismatch",
        }
    }

    /// Every combination of state × fingerprint match × lease alive/lapsed × phase of the
    /// record's life (response window, tombstone horizon, forgotten), with the expected decision
    /// written out independently of `decide`.
    #[test]
    fn exhaustive_decision_table() {
        let now = 1_000_000;
        let mut cases = 0;
        for kind in KINDS {
            for fp_matches in [true, false] {
                for lease_alive in [true, false] {
                    for phase in PHASES {
                        cases += 1;
                        let rec = record(kind, lease_alive, phase, now);
                        let fp = if fp_matches { FP } else { OTHER };
                        let got = decide(rec.as_ref(), &fp, Timestamp(now));
                        let expected = match (kind, phase, fp_matches, lease_alive) {
                            (Kind::Absent, ..) => "claim",
                            (_, Phase::Forgotten, _, _) => "claim",
                            (_, _, false, _) => "mismatch",
                            (Kind::Completed | Kind::Failed, Phase::Window, true, _) => "replay",
                            (Kind::Completed | Kind::Failed, Phase::Horizon, true, _) => "expired",
                            (Kind::Tombstone, _, true, _) => "expired",
                            (Kind::Pending, _, true, true) => "inflight",
                            (Kind::Pending, _, true, false) => "takeover",
                        };
                        let case = format!(
                            "kind={kind:?} fp_matches={fp_matches} lease_alive={lease_alive} phase={phase:?}"
                        );
                        assert_eq!(name(&got), expected, "{case}");
                        match &got {
                            Decision::Takeover { attempt } => {
                                assert_eq!(*attempt, 4, "takeover numbers the next attempt")
                            }
                            Decision::Replay(r) => assert_eq!(
                                r.is_failure(),
                                kind == Kind::Failed,
                                "replay keeps Completed vs Failed: {case}"
                            ),
                            Decision::InFlight { lease_deadline } => {
                                assert_eq!(lease_deadline.0, now + 10)
                            }
                            Decision::Expired {
                                status,
                                resource,
                                failed,
                            } => {
                                let (want_status, want_id, want_failed) = match kind {
                                    Kind::Completed => (201, "o1", false),
                                    Kind::Failed => (402, "", true),
                                    Kind::Tombstone => (409, "o2", true),
                                    _ => unreachable!("{case}"),
                                };
                                assert_eq!(*status, want_status, "{case}");
                                assert_eq!(
                                    resource.map_or("", |r| r.id.as_str()),
                                    want_id,
                                    "{case}"
                                );
                                assert_eq!(*failed, want_failed, "{case}");
                                let t = got.tombstone().expect("an expired decision has one");
                                assert_eq!(t.status(), want_status);
                            }
                            Decision::Claim | Decision::Mismatch => {
                                assert_eq!(got.tombstone(), None)
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 60);
    }

    #[test]
    fn lease_boundary_is_exclusive() {
        let rec = record(Kind::Pending, true, Phase::Window, 100);
        // deadline = 110: alive at 109, lapsed at 110.
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(109)),
            Decision::InFlight { .. }
        ));
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(110)),
            Decision::Takeover { .. }
        ));
    }

    #[test]
    fn expiry_and_forget_boundaries_are_inclusive() {
        let rec = record(Kind::Completed, true, Phase::Window, 100);
        // expires_at = 1100, forget_at = 2100.
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(1099)),
            Decision::Replay(_)
        ));
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(1100)),
            Decision::Expired { .. }
        ));
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(2099)),
            Decision::Expired { .. }
        ));
        assert_eq!(decide(rec.as_ref(), &FP, Timestamp(2100)), Decision::Claim);
    }

    #[test]
    fn without_a_horizon_the_record_goes_from_replay_to_absent() {
        let mut rec = record(Kind::Completed, true, Phase::Window, 100).expect("record");
        rec.forget_at = rec.expires_at;
        assert!(matches!(
            decide(Some(&rec), &FP, Timestamp(1099)),
            Decision::Replay(_)
        ));
        assert_eq!(decide(Some(&rec), &FP, Timestamp(1100)), Decision::Claim);
    }

    #[test]
    fn clock_going_backwards_does_not_free_a_key() {
        let rec = record(Kind::Completed, true, Phase::Window, 1_000);
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(0)),
            Decision::Replay(_)
        ));
    }

    #[test]
    fn a_heartbeat_never_lowers_a_deadline() {
        let lease = Duration::from_millis(30);
        // The clock moves forwards: the deadline follows it.
        assert_eq!(
            heartbeat_deadline(Timestamp(130), Timestamp(120), lease),
            Timestamp(150)
        );
        // At the same instant, or with the clock moved back (by a little, by a lot, to the
        // epoch), the deadline already granted stays.
        for now in [100, 99, 50, 0] {
            assert_eq!(
                heartbeat_deadline(Timestamp(130), Timestamp(now), lease),
                Timestamp(130),
                "now = {now}"
            );
        }
        // A lapsed lease nobody took over is extended from now.
        assert_eq!(
            heartbeat_deadline(Timestamp(130), Timestamp(500), lease),
            Timestamp(530)
        );
        // Saturates at the end of time instead of wrapping.
        assert_eq!(
            heartbeat_deadline(Timestamp(5), Timestamp(u64::MAX - 1), lease),
            Timestamp(u64::MAX)
        );
    }

    #[test]
    fn holder_check_over_all_states() {
        let now = Timestamp(5_000);
        for kind in KINDS {
            for lease_alive in [true, false] {
                for phase in PHASES {
                    let rec = record(kind, lease_alive, phase, now.0);
                    let expect_me = kind == Kind::Pending && phase != Phase::Forgotten;
                    assert_eq!(holds_lease(rec.as_ref(), &ME, now), expect_me);
                    assert!(!holds_lease(rec.as_ref(), &YOU, now));
                }
            }
        }
    }

    /// The sweep over every state × phase: what it does, where the record sits in the index,
    /// and that no sweep action changes the answer `decide` gives, for either fingerprint.
    #[test]
    fn exhaustive_sweep_table() {
        let now = 1_000_000;
        for kind in KINDS {
            for lease_alive in [true, false] {
                for phase in PHASES {
                    let Some(rec) = record(kind, lease_alive, phase, now) else {
                        continue;
                    };
                    let case = format!("kind={kind:?} lease_alive={lease_alive} phase={phase:?}");
                    let action = sweep_action(&rec, Timestamp(now));
                    let expected = match (kind, phase) {
                        (_, Phase::Forgotten) => "delete",
                        (Kind::Completed | Kind::Failed, Phase::Horizon) => "shrink",
                        _ => "keep",
                    };
                    let after = match &action {
                        SweepAction::Keep => {
                            assert_eq!(expected, "keep", "{case}");
                            assert!(sweep_due(&rec).0 > now, "{case}: kept but due");
                            Some(rec.clone())
                        }
                        SweepAction::Shrink(t) => {
                            assert_eq!(expected, "shrink", "{case}");
                            assert!(sweep_due(&rec).0 <= now, "{case}: shrunk but not due");
                            assert!(matches!(t.state, State::Tombstone(_)), "{case}");
                            assert_eq!(
                                (t.fingerprint, t.created_at, t.expires_at, t.forget_at),
                                (
                                    rec.fingerprint,
                                    rec.created_at,
                                    rec.expires_at,
                                    rec.forget_at
                                ),
                                "{case}: a tombstone keeps the fingerprint and the instants"
                            );
                            assert!(sweep_due(t).0 > now, "{case}: a tombstone is due later");
                            Some(t.clone())
                        }
                        SweepAction::Delete => {
                            assert_eq!(expected, "delete", "{case}");
                            assert!(sweep_due(&rec).0 <= now, "{case}: deleted but not due");
                            None
                        }
                    };
                    for fp in [FP, OTHER] {
                        let before = decide(Some(&rec), &fp, Timestamp(now));
                        let then = decide(after.as_ref(), &fp, Timestamp(now));
                        assert_eq!(
                            (name(&before), before.tombstone()),
                            (name(&then), then.tombstone()),
                            "{case}: the sweep changed an answer"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_live_lease_is_never_due() {
        // As the store writes it: forget_at = expires_at ≥ lease_deadline.
        let rec = Record {
            fingerprint: FP,
            created_at: Timestamp(0),
            expires_at: Timestamp(30),
            forget_at: Timestamp(30),
            state: State::Pending {
                holder: ME,
                lease_deadline: Timestamp(30),
                attempt: 1,
            },
        };
        for now in 0..30 {
            assert_eq!(sweep_action(&rec, Timestamp(now)), SweepAction::Keep);
        }
        assert_eq!(sweep_action(&rec, Timestamp(30)), SweepAction::Delete);
    }
}
