//! What the sweep does, as pure functions of (stored record, time): [`sweep_due`] says where a
//! record belongs in the expiry index, [`sweep_action`] what to do with it once due. Both agree
//! with [`decide`](fn@super::decide): a sweep never changes an answer.

use crate::model::clock::Timestamp;
use crate::model::record::{Record, State};
use crate::model::rules::decide::{is_expired, is_forgotten};
use crate::model::rules::instants::shrink;

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
    /// instants, the response reduced to a
    /// [`Tombstone`](crate::model::response::Tombstone)), indexed at its `forget_at`.
    Shrink(Record),
    /// Past `forget_at`: delete it and its index entry; the key is free.
    Delete,
}

/// Decides what the sweep does with `record` at `now`. Agrees with
/// [`decide`](fn@super::decide): it deletes only what `decide` treats as absent, and shrinks
/// only what `decide` answers as `Expired`, so a sweep never changes an answer.
pub fn sweep_action(record: &Record, now: Timestamp) -> SweepAction {
    if is_forgotten(record, now) {
        return SweepAction::Delete;
    }
    if !is_expired(record, now) {
        return SweepAction::Keep;
    }
    // Only a finished record shrinks; a Pending one or a tombstone waits for `forget_at`.
    shrink(record).map_or(SweepAction::Keep, SweepAction::Shrink)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rules::decide::decide;
    use crate::model::rules::table::{FP, KINDS, Kind, ME, OTHER, PHASES, Phase, name, record};

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
