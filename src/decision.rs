//! The decision logic, as pure functions of (stored record, request fingerprint, time).
//!
//! No I/O happens here: the store reads the record inside its write transaction, asks
//! [`decide`], and acts. The fuzzer's reference model, the tests and any future backend use the
//! same functions, so the rules live in exactly one place.

use crate::clock::Timestamp;
use crate::fingerprint::Fingerprint;
use crate::record::{HolderToken, Record, State};
use crate::response::Response;

/// What to do with a request, given what is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<'r> {
    /// No live record (none stored, or the stored one is past `expires_at`): claim the key.
    Claim,
    /// A Pending record with the same fingerprint whose lease has lapsed: take it over as
    /// attempt number `attempt`. The old holder is fenced out by its token.
    Takeover {
        /// The new attempt's number (previous + 1).
        attempt: u32,
    },
    /// The intent finished: replay this response (Completed or Failed).
    Replay(&'r Response),
    /// Another attempt holds a live lease until `lease_deadline`.
    InFlight {
        /// When that lease lapses unless heartbeated.
        lease_deadline: Timestamp,
    },
    /// The key is live but was used with a different payload.
    Mismatch,
}

/// True when `record` is past its expiry at `now` and must be treated as absent.
pub fn is_expired(record: &Record, now: Timestamp) -> bool {
    now >= record.expires_at
}

/// Decides what a request with `fingerprint` may do at `now`, given the stored record.
///
/// Order of the rules (each one is an invariant, see docs/design.md):
/// 1. no record, or an expired one → `Claim` (a record is never trusted past `expires_at`);
/// 2. a different fingerprint → `Mismatch`, whatever the state (the key is bound to its first
///    payload for as long as the record lives, including while Pending);
/// 3. Completed / Failed → `Replay`;
/// 4. Pending with `now < lease_deadline` → `InFlight`; otherwise → `Takeover`.
pub fn decide<'r>(
    stored: Option<&'r Record>,
    fingerprint: &Fingerprint,
    now: Timestamp,
) -> Decision<'r> {
    let record = match stored {
        Some(r) if !is_expired(r, now) => r,
        _ => return Decision::Claim,
    };
    if record.fingerprint != *fingerprint {
        return Decision::Mismatch;
    }
    match &record.state {
        State::Completed(r) | State::Failed(r) => Decision::Replay(r),
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

/// True when `holder` still owns the key at `now`: the record is live, Pending, and carries
/// `holder`'s token. A lapsed lease that nobody has taken over is still held (nobody else can
/// have acted); once another attempt takes over, the token differs and this is false forever.
pub fn holds_lease(stored: Option<&Record>, holder: &HolderToken, now: Timestamp) -> bool {
    match stored {
        Some(r) if !is_expired(r, now) => {
            matches!(&r.state, State::Pending { holder: h, .. } if h == holder)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FP: Fingerprint = Fingerprint([1; 32]);
    const OTHER: Fingerprint = Fingerprint([2; 32]);
    const ME: HolderToken = HolderToken([7; 16]);
    const YOU: HolderToken = HolderToken([8; 16]);

    #[derive(Debug, Clone, Copy)]
    enum Kind {
        Absent,
        Pending,
        Completed,
        Failed,
    }

    fn record(kind: Kind, lease_alive: bool, record_expired: bool, now: u64) -> Option<Record> {
        let expires_at = if record_expired { now } else { now + 1_000 };
        let lease_deadline = if lease_alive { now + 10 } else { now };
        let state = match kind {
            Kind::Absent => return None,
            Kind::Pending => State::Pending {
                holder: ME,
                lease_deadline: Timestamp(lease_deadline),
                attempt: 3,
            },
            Kind::Completed => State::Completed(Response::new(201, "ok")),
            Kind::Failed => State::Failed(Response::new(402, "declined").mark_failed()),
        };
        Some(Record {
            fingerprint: FP,
            created_at: Timestamp(now.saturating_sub(5)),
            expires_at: Timestamp(expires_at),
            state,
        })
    }

    /// Every combination of state × fingerprint match × lease alive/expired × record
    /// alive/expired, with the expected decision written out independently of `decide`.
    #[test]
    fn exhaustive_decision_table() {
        let now = 1_000_000;
        let mut cases = 0;
        for kind in [Kind::Absent, Kind::Pending, Kind::Completed, Kind::Failed] {
            for fp_matches in [true, false] {
                for lease_alive in [true, false] {
                    for record_expired in [true, false] {
                        cases += 1;
                        let rec = record(kind, lease_alive, record_expired, now);
                        let fp = if fp_matches { FP } else { OTHER };
                        let got = decide(rec.as_ref(), &fp, Timestamp(now));
                        let expected = match (kind, record_expired, fp_matches, lease_alive) {
                            (Kind::Absent, ..) => "claim",
                            (_, true, _, _) => "claim",
                            (_, false, false, _) => "mismatch",
                            (Kind::Completed | Kind::Failed, false, true, _) => "replay",
                            (Kind::Pending, false, true, true) => "inflight",
                            (Kind::Pending, false, true, false) => "takeover",
                        };
                        let got_name = match &got {
                            Decision::Claim => "claim",
                            Decision::Takeover { attempt } => {
                                assert_eq!(*attempt, 4, "takeover numbers the next attempt");
                                "takeover"
                            }
                            Decision::Replay(r) => {
                                assert_eq!(
                                    r.is_failure(),
                                    matches!(kind, Kind::Failed),
                                    "replay keeps Completed vs Failed"
                                );
                                "replay"
                            }
                            Decision::InFlight { lease_deadline } => {
                                assert_eq!(lease_deadline.0, now + 10);
                                "inflight"
                            }
                            Decision::Mismatch => "mismatch",
                        };
                        assert_eq!(
                            got_name, expected,
                            "kind={kind:?} fp_matches={fp_matches} lease_alive={lease_alive} record_expired={record_expired}"
                        );
                    }
                }
            }
        }
        assert_eq!(cases, 32);
    }

    #[test]
    fn lease_boundary_is_exclusive() {
        let rec = record(Kind::Pending, true, false, 100);
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
    fn expiry_boundary_is_inclusive() {
        let rec = record(Kind::Completed, true, false, 100);
        // expires_at = 1100.
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(1099)),
            Decision::Replay(_)
        ));
        assert_eq!(decide(rec.as_ref(), &FP, Timestamp(1100)), Decision::Claim);
    }

    #[test]
    fn clock_going_backwards_does_not_free_a_key() {
        let rec = record(Kind::Completed, true, false, 1_000);
        assert!(matches!(
            decide(rec.as_ref(), &FP, Timestamp(0)),
            Decision::Replay(_)
        ));
    }

    #[test]
    fn holder_check_over_all_states() {
        let now = Timestamp(500);
        for kind in [Kind::Absent, Kind::Pending, Kind::Completed, Kind::Failed] {
            for lease_alive in [true, false] {
                for record_expired in [true, false] {
                    let rec = record(kind, lease_alive, record_expired, now.0);
                    let expect_me = matches!(kind, Kind::Pending) && !record_expired;
                    assert_eq!(holds_lease(rec.as_ref(), &ME, now), expect_me);
                    assert!(!holds_lease(rec.as_ref(), &YOU, now));
                }
            }
        }
    }
}
