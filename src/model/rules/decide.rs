//! What a request may do, as pure functions of (stored record, request fingerprint, time): the
//! store reads the record inside its write transaction, asks [`decide`], and acts; a lease asks
//! [`holds_lease`] before every write. What each write then stores is in `instants`.

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
    /// A Pending record with the same fingerprint whose holder token is one the request's own
    /// claim drew ([`decide_claim`]): an earlier call of the same [`crate::Claim`] wrote it and
    /// its answer was lost. Take it again at once, live or lapsed, keeping its attempt number,
    /// under a new token (which fences out the old one).
    Resume {
        /// The stored attempt's number, kept.
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
///
/// The same as [`decide_claim`] for a request that holds no token of the stored record (flow
/// A, a plain `begin`): it never answers [`Decision::Resume`].
pub fn decide<'r>(
    stored: Option<&'r Record>,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Decision<'r> {
    decide_claim(stored, fingerprint, &[], now)
}

/// [`decide`] for a flow-B claim ([`crate::Claim`]) whose earlier calls drew the holder tokens
/// `own`: a Pending record carrying one of them is this claim's own, whose answer was lost, and
/// is resumed at once ([`Decision::Resume`]) whatever its lease deadline. The rule sits in
/// step 4, after forgetting and the fingerprint: a forgotten record is still absent, and a
/// record of the claim's own always has its fingerprint. Any other record decides as in
/// [`decide`].
pub fn decide_claim<'r>(
    stored: Option<&'r Record>,
    fingerprint: &Fingerprint,
    own: &[HolderToken],
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
            holder, attempt, ..
        } if own.contains(holder) => Decision::Resume { attempt: *attempt },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rules::table::{
        FP, KINDS, Kind, ME, OTHER, PHASES, Phase, YOU, name, record,
    };

    /// Every combination of state × fingerprint match × lease alive/lapsed × phase of the
    /// record's life (response window, tombstone horizon, forgotten) × the claim's own tokens
    /// (none, the stored holder's among others, only others), with the expected decision
    /// written out independently of `decide_claim`; `decide` is `decide_claim` without tokens.
    #[test]
    fn exhaustive_decision_table() {
        let now = 1_000_000;
        let mut cases = 0;
        let owns: [&[HolderToken]; 3] = [&[], &[YOU, ME], &[YOU]];
        for kind in KINDS {
            for fp_matches in [true, false] {
                for lease_alive in [true, false] {
                    for phase in PHASES {
                        for own in owns {
                            cases += 1;
                            let rec = record(kind, lease_alive, phase, now);
                            let fp = if fp_matches { FP } else { OTHER };
                            let got = decide_claim(rec.as_ref(), &fp, own, Timestamp(now));
                            if own.is_empty() {
                                assert_eq!(decide(rec.as_ref(), &fp, Timestamp(now)), got);
                            }
                            // The table's Pending records hold ME's lease.
                            let mine = own.contains(&ME);
                            let expected = match (kind, phase, fp_matches, lease_alive, mine) {
                                (Kind::Absent, ..) => "claim",
                                (_, Phase::Forgotten, ..) => "claim",
                                (_, _, false, ..) => "mismatch",
                                (Kind::Completed | Kind::Failed, Phase::Window, true, ..) => {
                                    "replay"
                                }
                                (Kind::Completed | Kind::Failed, Phase::Horizon, true, ..) => {
                                    "expired"
                                }
                                (Kind::Tombstone, _, true, ..) => "expired",
                                (Kind::Pending, _, true, _, true) => "resume",
                                (Kind::Pending, _, true, true, false) => "inflight",
                                (Kind::Pending, _, true, false, false) => "takeover",
                            };
                            let case = format!(
                                "kind={kind:?} fp_matches={fp_matches} lease_alive={lease_alive} phase={phase:?} mine={mine}"
                            );
                            check_decision(&got, expected, kind, now, &case);
                        }
                    }
                }
            }
        }
        assert_eq!(cases, 180);
    }

    /// Checks `got` against the table's `expected` name and the values each decision carries.
    fn check_decision(got: &Decision<'_>, expected: &str, kind: Kind, now: u64, case: &str) {
        assert_eq!(name(got), expected, "{case}");
        match got {
            Decision::Takeover { attempt } => {
                assert_eq!(*attempt, 4, "takeover numbers the next attempt")
            }
            Decision::Resume { attempt } => {
                assert_eq!(*attempt, 3, "a resume keeps the attempt")
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
                assert_eq!(resource.map_or("", |r| r.id.as_str()), want_id, "{case}");
                assert_eq!(*failed, want_failed, "{case}");
                let t = got.tombstone().expect("an expired decision has one");
                assert_eq!(t.status(), want_status);
            }
            Decision::Claim | Decision::Mismatch => {
                assert_eq!(got.tombstone(), None)
            }
        }
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
}
