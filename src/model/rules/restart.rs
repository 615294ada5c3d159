//! Which lease holders can still be running, and what that changes in a decision: a lease whose
//! holder is known to be dead is lapsed at once, whatever its deadline says.
//!
//! A store whose file admits one open instance at a time (the file engine outside
//! `multi_process` mode) knows every live holder: a lease is held only by a `Lease` of the store instance that
//! granted it, a `Lease` keeps that instance (and so the file) open, and the file admits one
//! open instance at a time. So when an instance opens the file, every Pending record granted
//! by an earlier instance belongs to a holder that is gone — a process that was killed, or
//! an instance that was dropped — and that can never present its token again. Waiting out its
//! lease would only block the key. Its token's first 8 bytes name the instance that granted it
//! (docs/FORMAT.md, "Holder tokens").
//!
//! With several processes on one file, or on a database server, a holder of another instance
//! may be alive and working: its lease must lapse first ([`Holders::Any`]).

use crate::model::clock::Timestamp;
use crate::model::keys::Fingerprint;
use crate::model::record::{HolderToken, Record, State};
use crate::model::rules::decide::{Decision, decide_claim};

/// Which lease holders may still be running, as the engine knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holders {
    /// Any holder may be running until its lease lapses: several processes share the store, or
    /// the engine cannot tell.
    Any,
    /// Only holders whose token names this store instance (its 8 bytes): the store is the only
    /// one open on its file, so every other holder died with an earlier instance.
    Instance([u8; 8]),
}

impl Holders {
    /// Whether `holder` may still be running.
    pub fn may_be_running(&self, holder: &HolderToken) -> bool {
        match self {
            Holders::Any => true,
            Holders::Instance(instance) => holder.instance() == *instance,
        }
    }
}

/// [`decide_claim`] (a request whose claim drew the tokens `own`; none for flow A or a plain
/// `begin`), knowing which holders may still be running: a live lease whose holder cannot be
/// running is taken over at once (`Takeover`, the next attempt, as when a lease lapses),
/// instead of answering `InFlight` until its deadline. Every other decision is
/// `decide_claim`'s (a claim's own lease is resumed before this rule is asked).
pub fn decide_among<'r>(
    stored: Option<&'r Record>,
    fingerprint: &Fingerprint,
    own: &[HolderToken],
    now: Timestamp,
    holders: Holders,
) -> Decision<'r> {
    let decision = decide_claim(stored, fingerprint, own, now);
    match (&decision, stored.map(|r| &r.state)) {
        (
            Decision::InFlight { .. },
            Some(State::Pending {
                holder, attempt, ..
            }),
        ) if !holders.may_be_running(holder) => Decision::Takeover {
            attempt: attempt.saturating_add(1),
        },
        _ => decision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rules::decide::decide;
    use crate::model::rules::table::{FP, KINDS, Kind, ME, OTHER, PHASES, name, record};

    /// [`ME`]'s instance: the first 8 bytes of its token.
    const MINE: [u8; 8] = [7; 8];
    const ANOTHER: [u8; 8] = [9; 8];

    /// Every case of `decide`'s table, under every view of the holders: only a live lease of
    /// a holder that cannot be running changes (to the takeover `decide` gives a lapsed one).
    #[test]
    fn only_a_live_lease_of_a_dead_holder_changes() {
        let now = 1_000_000;
        for kind in KINDS {
            for fp in [FP, OTHER] {
                for lease_alive in [true, false] {
                    for phase in PHASES {
                        let rec = record(kind, lease_alive, phase, now);
                        let plain = decide(rec.as_ref(), &fp, Timestamp(now));
                        for holders in [
                            Holders::Any,
                            Holders::Instance(MINE),
                            Holders::Instance(ANOTHER),
                        ] {
                            let got = decide_among(rec.as_ref(), &fp, &[], Timestamp(now), holders);
                            let case = format!(
                                "{kind:?} fp={} alive={lease_alive} {phase:?} {holders:?}",
                                fp == FP
                            );
                            if name(&plain) == "inflight" && holders == Holders::Instance(ANOTHER) {
                                assert_eq!(kind, Kind::Pending, "{case}");
                                assert_eq!(got, Decision::Takeover { attempt: 4 }, "{case}");
                            } else {
                                assert_eq!(got, plain, "{case}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn a_token_names_the_instance_that_granted_it() {
        assert!(Holders::Instance(MINE).may_be_running(&ME));
        assert!(!Holders::Instance(ANOTHER).may_be_running(&ME));
        assert!(Holders::Any.may_be_running(&ME));
    }
}
