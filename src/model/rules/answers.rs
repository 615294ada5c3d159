//! The answers a request gets without running anything, and what a closure's result records:
//! pure functions every engine applies after [`decide`](super::decide) and after running a
//! closure, so both engines answer alike.

use std::time::Duration;

use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::record::State;
use crate::model::response::{Abort, BeginAnswer, ExecuteAnswer, Response, Tombstone};
use crate::model::rules::decide::Decision;
use crate::model::scope::Request;

/// An answer reached without running anything.
pub(crate) enum Early {
    /// The intent finished: its stored response.
    Replay(Response),
    /// The intent finished and its response window is over.
    Expired(Tombstone),
    /// The request is refused (a different payload).
    Error(Error),
    /// Another attempt holds a live lease.
    InFlight {
        /// The hint: the lease's remaining time, capped, never below 1 ms.
        retry_after: Duration,
    },
}

impl Early {
    /// The answer of flow A.
    pub(crate) fn into_outcome(self) -> Result<ExecuteAnswer, Error> {
        match self {
            Early::Replay(r) => Ok(ExecuteAnswer::Replayed(r)),
            Early::Expired(t) => Ok(ExecuteAnswer::Expired(t)),
            Early::Error(e) => Err(e),
            Early::InFlight { retry_after } => Ok(ExecuteAnswer::InFlight { retry_after }),
        }
    }

    /// The answer of a flow-B claim.
    pub(crate) fn into_begin<L>(self) -> Result<BeginAnswer<L>, Error> {
        match self {
            Early::Replay(r) => Ok(BeginAnswer::Replayed(r)),
            Early::Expired(t) => Ok(BeginAnswer::Expired(t)),
            Early::Error(e) => Err(e),
            Early::InFlight { retry_after } => Ok(BeginAnswer::InFlight { retry_after }),
        }
    }
}

/// The answer `decision` (made at `now`) gives without a claim, if any: a replay, the
/// tombstone, a mismatch naming the request's scope and key, or "in flight" with a hint of the
/// lease's remaining time capped at `retry_after_cap` (and never below 1 ms). `None` for a
/// claim, a takeover or a resume.
pub(crate) fn early(
    decision: Decision<'_>,
    request: &Request,
    now: Timestamp,
    retry_after_cap: Duration,
) -> Option<Early> {
    match decision {
        Decision::Claim | Decision::Takeover { .. } | Decision::Resume { .. } => None,
        Decision::Replay(r) => Some(Early::Replay(r.clone())),
        expired @ Decision::Expired { .. } => expired.tombstone().map(Early::Expired),
        Decision::Mismatch => Some(Early::Error(Error::PayloadMismatch {
            tenant: request.scope().tenant().to_owned(),
            operation: request.scope().operation().to_owned(),
            key: request.key_display(),
        })),
        Decision::InFlight { lease_deadline } => Some(Early::InFlight {
            retry_after: lease_deadline
                .saturating_since(now)
                .min(retry_after_cap)
                .max(Duration::from_millis(1)),
        }),
    }
}

/// What a closure's result records (flow A and a lease's completion share the rule): `Ok` →
/// Completed, [`Abort::Terminal`] → Failed, both within the response cap `max`
/// ([`Error::ResponseTooLarge`] otherwise); anything else is the error that rolls the caller's
/// writes back ([`Error::Aborted`] for [`Abort::Retryable`]).
pub(crate) fn settle(
    result: Result<Response, Abort>,
    max: usize,
) -> Result<(State, Response), Error> {
    let (state, response) = match result {
        Ok(response) => {
            let response = response.mark_succeeded();
            (State::Completed(response.clone()), response)
        }
        Err(Abort::Terminal(response)) => {
            let response = response.mark_failed();
            (State::Failed(response.clone()), response)
        }
        Err(Abort::Retryable(source)) => return Err(Error::Aborted { source }),
        Err(Abort::Store(e)) => return Err(e),
    };
    let len = response.stored_len();
    if len > max {
        return Err(Error::ResponseTooLarge { len, max });
    }
    Ok((state, response))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scope::Scope;

    fn request() -> Request {
        Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"p")
    }

    #[test]
    fn in_flight_hints_are_capped_and_never_zero() {
        let at = |deadline: u64, now: u64, cap: u64| {
            let d = Decision::InFlight {
                lease_deadline: Timestamp(deadline),
            };
            match early(d, &request(), Timestamp(now), Duration::from_millis(cap)) {
                Some(Early::InFlight { retry_after }) => retry_after.as_millis(),
                _ => panic!("in flight answers InFlight"),
            }
        };
        assert_eq!(at(1_500, 1_000, 1_000), 500);
        assert_eq!(at(9_000, 1_000, 1_000), 1_000, "capped");
        assert_eq!(at(1_000, 1_000, 1_000), 1, "never zero");
        assert_eq!(at(900, 1_000, 1_000), 1, "a deadline in the past");
    }

    #[test]
    fn claims_have_no_early_answer_and_mismatches_name_the_key() {
        let now = Timestamp(1);
        let cap = Duration::from_secs(1);
        assert!(early(Decision::Claim, &request(), now, cap).is_none());
        assert!(early(Decision::Takeover { attempt: 2 }, &request(), now, cap).is_none());
        match early(Decision::Mismatch, &request(), now, cap) {
            Some(Early::Error(Error::PayloadMismatch {
                tenant,
                operation,
                key,
            })) => {
                assert_eq!(
                    (tenant.as_str(), operation.as_str(), key.as_str()),
                    ("t", "op", "k")
                );
            }
            _ => panic!("a mismatch is PayloadMismatch"),
        }
    }

    #[test]
    fn settle_records_successes_and_terminal_failures_within_the_cap() {
        let (state, r) = settle(Ok(Response::new(201, "ok")), 1024).unwrap();
        assert!(matches!(state, State::Completed(_)) && !r.is_failure());
        let (state, r) = settle(Err(Abort::Terminal(Response::new(402, "no"))), 1024).unwrap();
        assert!(matches!(state, State::Failed(_)) && r.is_failure());
        assert!(matches!(
            settle(Ok(Response::new(200, vec![0u8; 2048])), 1024),
            Err(Error::ResponseTooLarge { max: 1024, .. })
        ));
        assert!(matches!(
            settle(Err(Abort::Retryable("later".into())), 1024),
            Err(Error::Aborted { .. })
        ));
    }
}
