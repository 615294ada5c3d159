//! Whether a delivered message (or webhook delivery) runs, as a pure function of its stored
//! mark and the time ([`inbox_decide`]); when the sweep deletes a mark ([`is_mark_forgotten`]);
//! and what a processed delivery writes ([`processed_mark`]).

use std::time::Duration;

use crate::model::clock::Timestamp;
use crate::model::marks::Mark;
use crate::model::response::Response;

/// What to do with a delivered message, given its stored mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxDecision {
    /// No live mark: process the message (run the closure, write the mark).
    Process,
    /// Processed already at this instant: do not run anything; ack the message.
    Duplicate {
        /// When it was processed.
        processed_at: Timestamp,
    },
}

/// Decides what a delivery may do at `now`. A mark is live until its `forget_at`; after it
/// the message counts as never seen (the mark is past the inbox retention, and a sweep
/// removes it).
pub fn inbox_decide(mark: Option<&Mark>, now: Timestamp) -> InboxDecision {
    match mark {
        Some(m) if !is_mark_forgotten(m, now) => InboxDecision::Duplicate {
            processed_at: m.processed_at,
        },
        _ => InboxDecision::Process,
    }
}

/// True when `mark` is past its `forget_at` at `now` (`now ≥ forget_at`): the message counts
/// as never seen, and the sweep deletes the mark. Its expiry-index entry sits at `forget_at`.
pub(crate) fn is_mark_forgotten(mark: &Mark, now: Timestamp) -> bool {
    now >= mark.forget_at
}

/// The mark a delivery handled at `now` writes: processed at `now`, forgotten `retention`
/// later, keeping the response of a first handling that was a terminal rejection.
pub(crate) fn processed_mark(
    now: Timestamp,
    retention: Duration,
    rejection: Option<Response>,
) -> Mark {
    Mark {
        processed_at: now,
        forget_at: now.saturating_add(retention),
        rejection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_mark_is_a_duplicate_until_forget_at() {
        let m = Mark {
            processed_at: Timestamp(10),
            forget_at: Timestamp(20),
            rejection: None,
        };
        assert_eq!(inbox_decide(None, Timestamp(15)), InboxDecision::Process);
        assert_eq!(
            inbox_decide(Some(&m), Timestamp(19)),
            InboxDecision::Duplicate {
                processed_at: Timestamp(10)
            }
        );
        assert_eq!(
            inbox_decide(Some(&m), Timestamp(20)),
            InboxDecision::Process
        );
    }

    /// Every mark written at `at` with each retention, checked at every instant around its
    /// life: a duplicate exactly while it is live, processed (and swept) from `forget_at` on,
    /// and the mark keeps what it was given.
    #[test]
    fn exhaustive_mark_table() {
        let at = Timestamp(1_000);
        let rejection = Response::new(422, "bad order").mark_failed();
        for retention in [0, 1, 500] {
            for rejected in [false, true] {
                let kept = rejected.then(|| rejection.clone());
                let m = processed_mark(at, Duration::from_millis(retention), kept.clone());
                let case = format!("retention={retention} rejected={rejected}");
                assert_eq!(m.processed_at, at, "{case}");
                assert_eq!(m.forget_at, Timestamp(1_000 + retention), "{case}");
                assert_eq!(m.rejection, kept, "{case}");
                // The clock before the write (moved back), at it, inside, at and after the end.
                for now in [
                    0,
                    999,
                    1_000,
                    1_000 + retention / 2,
                    1_000 + retention,
                    9_999,
                ] {
                    let live = now < 1_000 + retention;
                    let now = Timestamp(now);
                    assert_eq!(is_mark_forgotten(&m, now), !live, "{case} now={now:?}");
                    let want = if live {
                        InboxDecision::Duplicate { processed_at: at }
                    } else {
                        InboxDecision::Process
                    };
                    assert_eq!(inbox_decide(Some(&m), now), want, "{case} now={now:?}");
                    assert_eq!(inbox_decide(None, now), InboxDecision::Process);
                }
            }
        }
        // Saturates at the end of time instead of wrapping.
        let late = processed_mark(Timestamp(u64::MAX - 1), Duration::from_millis(5), None);
        assert_eq!(late.forget_at, Timestamp(u64::MAX));
    }
}
