//! The instant rules: what each write of a record stores, as pure functions of the record it
//! replaces, the time and the configured durations. An engine loads, applies one of these, and
//! puts the result; it never computes an instant itself.
//!
//! | write | rule | instants it stores |
//! |---|---|---|
//! | claim (flow A or B) | [`attempt`] | `created_at = now`, attempt 1; a takeover keeps the intent's `created_at` and numbers the next attempt |
//! | flow-B claim | [`claim`] | Pending until `now + lease`; `expires_at = forget_at = max(now + response, lease deadline)` |
//! | heartbeat | [`heartbeat`] | deadline [`heartbeat_deadline`] (never lowered); `expires_at`, `forget_at` raised to at least it |
//! | finish (flow A, `Lease::complete`, `Lease::fail`) | [`finish`] | `expires_at = now + response`, `forget_at = now + forget` ([`Windows`]); `created_at` kept |
//! | sweep shrink | [`shrink`] | every instant kept, the response reduced to a tombstone |
//!
//! Releasing a lease and the sweep's delete remove the record: they store no instant.

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::keys::Fingerprint;
use crate::model::record::{HolderToken, Record, State};
use crate::model::response::Tombstone;
use crate::model::retention::Windows;
use crate::model::rules::decide::Decision;

/// Which attempt at an intent a claim starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// When the intent's first attempt claimed the key; every takeover keeps it (so every
    /// attempt derives the same event ids from it).
    pub created_at: Timestamp,
    /// 1 for the first attempt, +1 on every takeover.
    pub number: u32,
}

/// The attempt a claim at `now` starts, given the stored record and what [`decide`] answered
/// for it: a [`Decision::Takeover`] or a [`Decision::Resume`] keeps the intent's original
/// `created_at` and takes the decision's attempt number (the next one for a takeover, the
/// stored one for a resume); a [`Decision::Claim`] (no record, or a forgotten one) starts the
/// intent afresh at `now` as attempt 1. The engine asks only after a `Claim`, a `Takeover` or a
/// `Resume` (every other decision claims nothing); for those it answers the fresh attempt too.
///
/// [`decide`]: fn@super::decide
pub(crate) fn attempt(decision: &Decision<'_>, stored: Option<&Record>, now: Timestamp) -> Attempt {
    match (decision, stored) {
        (Decision::Takeover { attempt } | Decision::Resume { attempt }, Some(r)) => Attempt {
            created_at: r.created_at,
            number: *attempt,
        },
        _ => Attempt {
            created_at: now,
            number: 1,
        },
    }
}

/// The Pending record a flow-B claim at `now` writes for `holder`, and the lease deadline it
/// grants (`now + lease`). Its response window is counted like a finished record's, but never
/// ends before the lease deadline, and it has no tombstone tier (`forget_at = expires_at`): a
/// live lease is never absent nor due for a sweep, and a lease that never finishes leaves
/// nothing behind once its window is over.
pub(crate) fn claim(
    fingerprint: Fingerprint,
    attempt: Attempt,
    holder: HolderToken,
    now: Timestamp,
    lease: Duration,
    windows: &Windows,
) -> (Record, Timestamp) {
    let lease_deadline = now.saturating_add(lease);
    let expires_at = now.saturating_add(windows.response).max(lease_deadline);
    let record = Record {
        fingerprint,
        created_at: attempt.created_at,
        expires_at,
        forget_at: expires_at,
        state: State::Pending {
            holder,
            lease_deadline,
            attempt: attempt.number,
        },
    };
    (record, lease_deadline)
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

/// The record a heartbeat at `now` writes over the held Pending `record`, and the deadline it
/// grants ([`heartbeat_deadline`]). Only the deadline, `expires_at` and `forget_at` change, and
/// none of them ever moves earlier: `expires_at` is raised to at least the deadline (a Pending
/// record stays, and is not due for a sweep, until its lease lapses) and `forget_at` follows
/// it (a lease leaves no tombstone). `None` when `record` is not Pending: there is no lease to
/// extend.
pub(crate) fn heartbeat(
    record: &Record,
    now: Timestamp,
    lease: Duration,
) -> Option<(Record, Timestamp)> {
    let State::Pending {
        holder,
        lease_deadline,
        attempt,
    } = &record.state
    else {
        return None;
    };
    let deadline = heartbeat_deadline(*lease_deadline, now, lease);
    let expires_at = record.expires_at.max(deadline);
    let extended = Record {
        fingerprint: record.fingerprint,
        created_at: record.created_at,
        expires_at,
        forget_at: record.forget_at.max(expires_at),
        state: State::Pending {
            holder: *holder,
            lease_deadline: deadline,
            attempt: *attempt,
        },
    };
    Some((extended, deadline))
}

/// The record a finish at `now` writes (flow A's closure, or a lease's `complete`/`fail`):
/// the intent's `fingerprint` and `created_at`, the finished `state` (Completed or Failed), its
/// response window and its forget horizon both counted from `now` ([`Windows`]).
pub(crate) fn finish(
    fingerprint: Fingerprint,
    created_at: Timestamp,
    state: State,
    now: Timestamp,
    windows: &Windows,
) -> Record {
    Record {
        fingerprint,
        created_at,
        expires_at: now.saturating_add(windows.response),
        forget_at: now.saturating_add(windows.forget),
        state,
    }
}

/// The tombstone record the sweep writes over a finished (Completed or Failed) `record` whose
/// response window is over: the same fingerprint and instants, the response reduced to a
/// [`Tombstone`] (status, resource pointer, whether it failed). `None` for any other state:
/// nothing to shrink.
pub(crate) fn shrink(record: &Record) -> Option<Record> {
    let (State::Completed(r) | State::Failed(r)) = &record.state else {
        return None;
    };
    let failed = matches!(record.state, State::Failed(_));
    Some(Record {
        fingerprint: record.fingerprint,
        created_at: record.created_at,
        expires_at: record.expires_at,
        forget_at: record.forget_at,
        state: State::Tombstone(Tombstone::new(r.status(), r.resource().cloned(), failed)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::response::Response;
    use crate::model::rules::decide::{decide, decide_claim, holds_lease};
    use crate::model::rules::sweep::{SweepAction, sweep_action, sweep_due};
    use crate::model::rules::table::{
        FP, KINDS, Kind, ME, OTHER, PHASES, Phase, YOU, name, record,
    };

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// Lease durations and windows around each other: zero, shorter, equal, longer.
    const LEASES: [u64; 3] = [0, 30, 5_000];
    const WINDOWS: [(u64, u64); 5] = [(0, 0), (10, 10), (30, 30), (30, 9_000), (5_000, 5_000)];

    fn windows((response, forget): (u64, u64)) -> Windows {
        Windows {
            response: MS(response),
            forget: MS(forget),
        }
    }

    /// Every stored state × phase × lease alive/lapsed × fingerprint: whenever `decide` lets
    /// the request claim, the attempt is a fresh one at `now` or, for a takeover, the stored
    /// intent's `created_at` with the next attempt number, and never starts in the future.
    #[test]
    fn exhaustive_attempt_table() {
        let now = 1_000_000;
        let mut claims = 0;
        for kind in KINDS {
            for lease_alive in [true, false] {
                for phase in PHASES {
                    for fp in [FP, OTHER] {
                        let rec = record(kind, lease_alive, phase, now);
                        let case = format!(
                            "kind={kind:?} lease_alive={lease_alive} phase={phase:?} fp={:?}",
                            fp.0[0]
                        );
                        let decision = decide(rec.as_ref(), &fp, Timestamp(now));
                        let got = attempt(&decision, rec.as_ref(), Timestamp(now));
                        let want = match name(&decision) {
                            "takeover" => Attempt {
                                created_at: Timestamp(now - 5_000),
                                number: 4,
                            },
                            "claim" => Attempt {
                                created_at: Timestamp(now),
                                number: 1,
                            },
                            // Claims nothing; the engine never asks.
                            _ => continue,
                        };
                        claims += 1;
                        assert_eq!(got, want, "{case}");
                        assert!(got.created_at.0 <= now, "{case}: created in the future");
                    }
                }
            }
        }
        // Absent (2 × 3 × 2), every kind forgotten (4 × 2 × 2), a lapsed lease (2 phases).
        assert_eq!(claims, 12 + 16 + 2);
    }

    /// A claim for a fresh and a taken-over attempt, at the start and the end of time, under
    /// every lease and window: the exact instants, in order, and what they mean to the other
    /// rules (held, in flight until the deadline, free from it, never due before it).
    #[test]
    fn exhaustive_claim_table() {
        for now in [1_000_000, u64::MAX - 40] {
            let attempts = [
                Attempt {
                    created_at: Timestamp(now),
                    number: 1,
                },
                Attempt {
                    created_at: Timestamp(now - 700),
                    number: 4,
                },
            ];
            for a in attempts {
                for lease in LEASES {
                    for w in WINDOWS {
                        let case = format!("now={now} attempt={a:?} lease={lease} windows={w:?}");
                        let at = Timestamp(now);
                        let (r, deadline) = claim(FP, a, ME, at, MS(lease), &windows(w));
                        assert_eq!(deadline, at.saturating_add(MS(lease)), "{case}");
                        assert_eq!(
                            r.state,
                            State::Pending {
                                holder: ME,
                                lease_deadline: deadline,
                                attempt: a.number
                            },
                            "{case}"
                        );
                        assert_eq!((r.fingerprint, r.created_at), (FP, a.created_at), "{case}");
                        let expires = at.saturating_add(MS(w.0)).max(deadline);
                        assert_eq!(r.expires_at, expires, "{case}");
                        assert_eq!(r.forget_at, expires, "{case}: a lease has no tombstone");
                        assert!(
                            r.created_at <= at && at <= deadline && deadline <= r.expires_at,
                            "{case}: instants out of order"
                        );
                        // Held from the claim on, unless the lease and the window are both
                        // zero: then the record is forgotten at once.
                        assert_eq!(holds_lease(Some(&r), &ME, at), r.forget_at > at, "{case}");
                        assert!(!holds_lease(Some(&r), &YOU, at), "{case}");
                        assert!(sweep_due(&r) >= deadline, "{case}: due before the deadline");
                        if lease > 0 {
                            assert_eq!(
                                decide(Some(&r), &FP, at),
                                Decision::InFlight {
                                    lease_deadline: deadline
                                },
                                "{case}"
                            );
                            assert_eq!(sweep_action(&r, at), SweepAction::Keep, "{case}");
                            assert_eq!(decide(Some(&r), &OTHER, at), Decision::Mismatch, "{case}");
                        }
                        // From the deadline on, the key is free: taken over while the
                        // record lives, claimed afresh once it is forgotten.
                        let then = decide(Some(&r), &FP, deadline);
                        let want = if r.forget_at > deadline {
                            Decision::Takeover {
                                attempt: a.number + 1,
                            }
                        } else {
                            Decision::Claim
                        };
                        assert_eq!(then, want, "{case}");
                    }
                }
            }
        }
    }

    /// A claim whose earlier call's answer was lost resumes its own Pending record, live or
    /// lapsed: the intent's `created_at` and the attempt number are kept, the new token holds
    /// the lease and the old one is fenced out; another claim's record is not resumed.
    #[test]
    fn a_resume_keeps_the_attempt_and_fences_the_old_token() {
        let now = 1_000_000;
        for lease_alive in [true, false] {
            let stored =
                record(Kind::Pending, lease_alive, Phase::Window, now).expect("a pending record");
            let at = Timestamp(now);
            let decision = decide_claim(Some(&stored), &FP, &[ME], at);
            assert_eq!(decision, Decision::Resume { attempt: 3 });
            let a = attempt(&decision, Some(&stored), at);
            assert_eq!(
                a,
                Attempt {
                    created_at: stored.created_at,
                    number: 3
                }
            );
            let (resumed, deadline) = claim(FP, a, YOU, at, MS(30), &windows((30, 30)));
            assert_eq!(deadline, Timestamp(now + 30));
            assert!(holds_lease(Some(&resumed), &YOU, at));
            assert!(
                !holds_lease(Some(&resumed), &ME, at),
                "the old token is fenced"
            );
            // Only the claim's own tokens resume: the stored holder's (ME) is not YOU's.
            assert_ne!(
                name(&decide_claim(Some(&stored), &FP, &[YOU], at)),
                "resume"
            );
        }
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

    /// A heartbeat over every stored state × phase × lease alive/lapsed, at instants before
    /// (the clock moved back), at and after the record's, under every lease: only a Pending
    /// record is extended; its deadline is `heartbeat_deadline`'s; no instant ever moves earlier;
    /// everything but the deadline, `expires_at` and `forget_at` is kept.
    #[test]
    fn exhaustive_heartbeat_table() {
        let t = 1_000_000;
        for kind in KINDS {
            for lease_alive in [true, false] {
                for phase in PHASES {
                    let Some(rec) = record(kind, lease_alive, phase, t) else {
                        continue;
                    };
                    for now in [0, t - 500_000, t - 1, t, t + 5, t + 10, t + 50_000] {
                        for lease in LEASES {
                            let case = format!(
                                "kind={kind:?} lease_alive={lease_alive} phase={phase:?} now={now} lease={lease}"
                            );
                            let got = heartbeat(&rec, Timestamp(now), MS(lease));
                            let State::Pending {
                                holder,
                                lease_deadline,
                                attempt,
                            } = rec.state
                            else {
                                assert_eq!(got, None, "{case}: only a lease is extended");
                                continue;
                            };
                            let (r, deadline) = got.expect("a Pending record is extended");
                            let want =
                                heartbeat_deadline(lease_deadline, Timestamp(now), MS(lease));
                            assert_eq!(deadline, want, "{case}");
                            assert_eq!(
                                r.state,
                                State::Pending {
                                    holder,
                                    lease_deadline: deadline,
                                    attempt
                                },
                                "{case}"
                            );
                            assert_eq!(
                                (r.fingerprint, r.created_at),
                                (rec.fingerprint, rec.created_at),
                                "{case}"
                            );
                            assert_eq!(r.expires_at, rec.expires_at.max(deadline), "{case}");
                            assert_eq!(r.forget_at, rec.forget_at.max(r.expires_at), "{case}");
                            assert!(
                                deadline >= lease_deadline
                                    && r.expires_at >= rec.expires_at
                                    && r.forget_at >= rec.forget_at,
                                "{case}: an instant moved earlier"
                            );
                            assert!(
                                deadline <= r.expires_at && r.expires_at <= r.forget_at,
                                "{case}: instants out of order"
                            );
                        }
                    }
                }
            }
        }
    }

    /// A finish over every stored state × phase (the engine finishes only what it holds, but
    /// the rule reads nothing but the identity it is given), for both finished states, every
    /// window and the start and end of time: the exact instants, the identity kept, and what
    /// `decide` answers at each boundary.
    #[test]
    fn exhaustive_finish_table() {
        let t = 1_000_000;
        let done = [
            State::Completed(Response::new(201, "ok").mark_succeeded()),
            State::Failed(Response::new(402, "declined").mark_failed()),
        ];
        for kind in KINDS {
            for phase in PHASES {
                // Absent: flow A's fresh claim finishes with the request's identity at `now`.
                let prior = record(kind, false, phase, t);
                let (fp, created_at) = prior
                    .as_ref()
                    .map_or((FP, Timestamp(t)), |r| (r.fingerprint, r.created_at));
                for state in &done {
                    for w in WINDOWS {
                        for now in [t, t + 1_000, u64::MAX - 1] {
                            let case = format!(
                                "kind={kind:?} phase={phase:?} state={} windows={w:?} now={now}",
                                state.tag()
                            );
                            let at = Timestamp(now);
                            let r = finish(fp, created_at, state.clone(), at, &windows(w));
                            assert_eq!(
                                (r.fingerprint, r.created_at, &r.state),
                                (fp, created_at, state),
                                "{case}"
                            );
                            assert_eq!(r.expires_at, at.saturating_add(MS(w.0)), "{case}");
                            assert_eq!(r.forget_at, at.saturating_add(MS(w.1)), "{case}");
                            assert!(
                                r.created_at <= at
                                    && at <= r.expires_at
                                    && r.expires_at <= r.forget_at,
                                "{case}: instants out of order"
                            );
                            if r.expires_at > at {
                                assert_eq!(name(&decide(Some(&r), &fp, at)), "replay", "{case}");
                            }
                            if r.forget_at > r.expires_at {
                                assert_eq!(
                                    name(&decide(Some(&r), &fp, r.expires_at)),
                                    "expired",
                                    "{case}"
                                );
                            }
                            if now < u64::MAX - 1 {
                                assert_eq!(decide(Some(&r), &fp, r.forget_at), Decision::Claim);
                            }
                        }
                    }
                }
            }
        }
    }

    /// A shrink over every stored state: only a finished record shrinks, to a tombstone that
    /// keeps its identity, its instants, its status, its resource and whether it failed.
    #[test]
    fn exhaustive_shrink_table() {
        for kind in KINDS {
            for phase in PHASES {
                let Some(rec) = record(kind, true, phase, 1_000_000) else {
                    continue;
                };
                let case = format!("kind={kind:?} phase={phase:?}");
                let got = shrink(&rec);
                let (State::Completed(r) | State::Failed(r)) = &rec.state else {
                    assert_eq!(got, None, "{case}");
                    continue;
                };
                let t = got.expect("a finished record shrinks");
                let want = Tombstone::new(r.status(), r.resource().cloned(), kind == Kind::Failed);
                assert_eq!(t.state, State::Tombstone(want), "{case}");
                assert_eq!(
                    (t.fingerprint, t.created_at, t.expires_at, t.forget_at),
                    (
                        rec.fingerprint,
                        rec.created_at,
                        rec.expires_at,
                        rec.forget_at
                    ),
                    "{case}"
                );
            }
        }
    }

    /// A record's life as the engine writes it — claim, heartbeats with the clock going
    /// forwards and backwards, a finish — keeps the Pending invariants (no tombstone tier, the
    /// window never ends before the deadline) and the intent's `created_at`.
    #[test]
    fn a_lease_keeps_its_invariants_from_claim_to_finish() {
        let w = windows((1_000, 9_000));
        let lease = MS(30);
        let start = Attempt {
            created_at: Timestamp(100),
            number: 1,
        };
        let (mut r, _) = claim(FP, start, ME, Timestamp(100), lease, &w);
        for now in [110, 125, 90, 0, 200, 5_000, 4_000] {
            let before = r.clone();
            let (next, deadline) = heartbeat(&r, Timestamp(now), lease).expect("still Pending");
            r = next;
            assert_eq!(
                r.forget_at, r.expires_at,
                "now={now}: a lease has no tombstone"
            );
            assert!(deadline <= r.expires_at, "now={now}");
            assert!(r.expires_at >= before.expires_at, "now={now}");
            assert_eq!(r.created_at, Timestamp(100), "now={now}");
            assert!(holds_lease(Some(&r), &ME, Timestamp(now)), "now={now}");
        }
        let done = finish(
            r.fingerprint,
            r.created_at,
            State::Completed(Response::new(200, "done")),
            Timestamp(5_010),
            &w,
        );
        assert_eq!(
            (done.created_at, done.expires_at, done.forget_at),
            (Timestamp(100), Timestamp(6_010), Timestamp(14_010))
        );
    }
}
