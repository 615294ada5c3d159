//! Typed answers for work that is not HTTP (queue workers, activities): the closure returns a
//! serde value, which is stored as the response body (postcard, the crate's record encoding)
//! and given back, decoded, on every replay — `execute_typed` of each engine. A terminal failure
//! stays a [`Response`] (the closure's `Abort::Terminal`), replayed as it was.

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::model::response::{Abort, ExecuteAnswer, Response, Tombstone};

/// The status a typed answer is stored with.
const TYPED_STATUS: u16 = 200;

/// The answer of `execute_typed`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub enum ExecuteTypedAnswer<T> {
    /// The closure ran now and its value committed with its writes.
    Ran(T),
    /// The intent had already finished: the value it returned then, decoded again. The closure
    /// did not run.
    Replayed(T),
    /// The closure ended with `Abort::Terminal` (now, or when the intent first ran:
    /// `replayed`); its writes committed and the failure is what every retry gets.
    Rejected {
        /// The terminal failure's response.
        response: Response,
        /// True when this is a replay of an earlier run's rejection.
        replayed: bool,
    },
    /// Another attempt holds a live lease on this key.
    InFlight {
        /// Suggested wait before retrying.
        retry_after: Duration,
    },
    /// The intent finished longer ago than its retention: only its tombstone is left (the value
    /// is gone). Never run it again.
    Expired(Tombstone),
}

impl<T> ExecuteTypedAnswer<T> {
    /// The value, for an executed or replayed intent.
    pub fn value(&self) -> Option<&T> {
        match self {
            ExecuteTypedAnswer::Ran(v) | ExecuteTypedAnswer::Replayed(v) => Some(v),
            _ => None,
        }
    }

    /// The value, for an executed or replayed intent.
    pub fn into_value(self) -> Option<T> {
        match self {
            ExecuteTypedAnswer::Ran(v) | ExecuteTypedAnswer::Replayed(v) => Some(v),
            _ => None,
        }
    }
}

/// The response a typed closure's value is stored as.
pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Response, Abort> {
    let body = postcard::to_allocvec(value)
        .map_err(|source| Abort::Store(Error::AnswerEncoding { source }))?;
    Ok(Response::new(TYPED_STATUS, body))
}

/// The typed answer of an engine's outcome for a typed closure.
pub(crate) fn decode<T: DeserializeOwned>(
    outcome: ExecuteAnswer,
) -> Result<ExecuteTypedAnswer<T>, Error> {
    let value = |r: &Response| -> Result<T, Error> {
        postcard::from_bytes(r.body()).map_err(|e| Error::CorruptRecord {
            reason: format!(
                "the stored answer of this intent does not decode as the requested type ({e}): the operation's answer type changed since it was stored; give a new answer type a new operation name"
            ),
        })
    };
    Ok(match outcome {
        ExecuteAnswer::Ran(r) if r.is_failure() => ExecuteTypedAnswer::Rejected {
            response: r,
            replayed: false,
        },
        ExecuteAnswer::Replayed(r) if r.is_failure() => ExecuteTypedAnswer::Rejected {
            response: r,
            replayed: true,
        },
        ExecuteAnswer::Ran(r) => ExecuteTypedAnswer::Ran(value(&r)?),
        ExecuteAnswer::Replayed(r) => ExecuteTypedAnswer::Replayed(value(&r)?),
        ExecuteAnswer::InFlight { retry_after } => ExecuteTypedAnswer::InFlight { retry_after },
        ExecuteAnswer::Expired(t) => ExecuteTypedAnswer::Expired(t),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Charge {
        id: String,
        cents: u64,
    }

    #[test]
    fn values_round_trip_and_a_changed_type_is_a_typed_error() {
        let charge = Charge {
            id: "ch_1".into(),
            cents: 4200,
        };
        let stored = encode(&charge).map_err(|_| ()).unwrap();
        let back: ExecuteTypedAnswer<Charge> =
            decode(ExecuteAnswer::Replayed(stored.clone())).unwrap();
        assert_eq!(back, ExecuteTypedAnswer::Replayed(charge));
        let wrong: Result<ExecuteTypedAnswer<Vec<u64>>, Error> =
            decode(ExecuteAnswer::Replayed(Response::new(
                200,
                vec![
                    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                ],
            )));
        assert!(matches!(wrong, Err(Error::CorruptRecord { .. })));
        let rejected: ExecuteTypedAnswer<Charge> = decode(ExecuteAnswer::Replayed(
            Response::new(402, "declined").mark_failed(),
        ))
        .unwrap();
        assert!(matches!(
            rejected,
            ExecuteTypedAnswer::Rejected { replayed: true, .. }
        ));
    }
}
