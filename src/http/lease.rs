//! The lease the layer holds while a handler runs: its [`Slot`], the heartbeats that keep it
//! alive, how it is taken and finished, and [`blocking`], which runs every store call off the
//! async runtime.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::StatusCode;
use parking_lot::Mutex;

use super::answers::problem_response;
use super::metrics::{Counters, bump};
use super::problem;
use crate::backend::BackendLease;
use crate::{Error, Response};

/// Runs on the blocking pool: fails (`fail_stop_cause`) or completes `lease` with `stored`, letting it
/// lapse (not releasing it) if that fails.
pub(super) fn finish_lease<L: BackendLease>(
    mut lease: L,
    failure: bool,
    stored: Response,
) -> Result<Response, Error> {
    lease.lapse_on_drop(true);
    if failure {
        lease.fail(stored)
    } else {
        lease.complete(stored)
    }
}

/// Takes the lease out of its slot on the blocking pool: a heartbeat may hold the slot's lock
/// during a disk write.
pub(super) async fn take_lease<L: BackendLease>(slot: &Arc<Slot<L>>) -> Option<L> {
    let slot = Arc::clone(slot);
    blocking(move || slot.0.lock().take()).await.ok().flatten()
}

/// What one heartbeat found.
enum Beat {
    /// The lease was extended.
    Extended,
    /// The slot is empty: the lease was finished, released, or taken to be finished.
    Gone,
    /// A failure that may pass (see [`transient`]): try again soon.
    Retry,
    /// A failure no retry mends: the lease is lost, or the store refuses every write.
    Stop,
}

/// A heartbeat failure worth retrying: the store's queue was full (`Busy`), or a storage
/// error that may pass (an I/O failure latches fail-stop, so the retry then gets `FailStopped`
/// and stops). `Aborted` cannot come from a heartbeat, and would be retryable. Everything else
/// is terminal: `LeaseLost` (another attempt holds the key, or it was released), `FailStopped`
/// and `OutcomeUnknown` (the store takes no write until reopened), `CorruptStore` and
/// `CorruptRecord` (damage), and errors a heartbeat cannot meet.
fn transient(e: &Error) -> bool {
    matches!(
        e,
        Error::Busy { .. } | Error::Aborted { .. } | Error::Storage { .. }
    )
}

/// Extends the lease every `every` while the handler runs, so a handler slower than the
/// store's `lease_duration` is not taken over by a retry (a second concurrent execution).
/// A transient failure (the store's queue full, a failed blocking task) does not end this: it
/// is counted in [`LayerMetrics::heartbeat_failures`] and retried after `every / 4`, well
/// before the deadline (two thirds of the lease away after a missed beat). Stops when the
/// lease left its slot (finished or released), or on a failure no retry mends (the lease was
/// lost, the store fail-stopped or is damaged).
pub(super) fn spawn_heartbeat<L: BackendLease>(
    slot: &Arc<Slot<L>>,
    every: Duration,
    counters: Arc<Counters>,
) -> tokio::task::JoinHandle<()> {
    use crate::runtime::observe;
    let weak = Arc::downgrade(slot);
    let retry = (every / 4).max(Duration::from_millis(5));
    tokio::spawn(async move {
        let mut pause = every;
        loop {
            tokio::time::sleep(pause).await;
            let Some(slot) = weak.upgrade() else {
                return;
            };
            let beat = blocking(move || match slot.0.lock().as_mut() {
                None => Beat::Gone,
                Some(lease) => match lease.heartbeat() {
                    Ok(_) => Beat::Extended,
                    Err(e) if transient(&e) => {
                        observe::warn!(
                            "a running handler's lease heartbeat failed; retrying soon",
                            error = observe::display(observe::Redacted(&e)),
                        );
                        Beat::Retry
                    }
                    Err(e) => {
                        observe::warn!(
                            "a running handler's lease heartbeat failed for good: its answer will not be recorded",
                            error = observe::display(observe::Redacted(&e)),
                        );
                        Beat::Stop
                    }
                },
            })
            .await;
            pause = match beat {
                Ok(Beat::Extended) => every,
                Ok(Beat::Gone) => return,
                Ok(Beat::Stop) => {
                    bump(&counters.heartbeat_failures);
                    return;
                }
                // A panic or cancellation of the blocking task: the lease is still in its
                // slot (a panic unwinds through the lock guard, which does not poison).
                Ok(Beat::Retry) | Err(_) => {
                    bump(&counters.heartbeat_failures);
                    retry
                }
            };
        }
    })
}

/// Owns the lease while the handler runs. The lease was marked to lapse when dropped
/// unfinished, so if the last reference goes away with the lease still in it (the handler's
/// task was cancelled), nothing is released: the key stays claimed until the deadline.
pub(super) struct Slot<L>(pub(super) Mutex<Option<L>>);

/// Runs a store call on the blocking pool, through the async face
/// (`crate::asynchronous::run_blocking`); a panic there becomes a `500` problem.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, http::Response<Body>> {
    crate::asynchronous::run_blocking(f)
        .await
        .map_err(|_| store_call_failed())
}

/// The `500` problem of a store call that panicked (or an internal error of the store).
pub(super) fn store_call_failed() -> http::Response<Body> {
    problem_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        problem::STORE_FAILED,
        "Store call failed",
        "a store call failed unexpectedly; retry with the same key",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::StorageError;
    use crate::{BeginAnswer, Lease, Request, Scope, Store};

    fn claimed(store: &Store) -> Lease {
        let req = Request::from_canonical_bytes(Scope::new("t", "POST /x"), "k", b"");
        match store.begin(req).unwrap() {
            BeginAnswer::Acquired(lease) => lease,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn in_flight_now(store: &Store) -> bool {
        let req = Request::from_canonical_bytes(Scope::new("t", "POST /x"), "k", b"");
        matches!(store.begin(req).unwrap(), BeginAnswer::InFlight { .. })
    }

    #[test]
    fn a_recording_that_fails_after_the_handler_ran_lets_the_lease_lapse() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::builder()
            .max_response_bytes(16)
            .open(dir.path().join("idem.redb"))
            .unwrap();
        // A recording the store refuses (here: over its cap, bypassing `fit_response`).
        let lease = claimed(&store);
        let too_big = Response::new(200, vec![0; 64]);
        assert!(matches!(
            finish_lease(lease, false, too_big),
            Err(Error::ResponseTooLarge { .. })
        ));
        // Not released: a retry is told "in flight" until the lease lapses.
        assert!(in_flight_now(&store));
    }

    #[test]
    fn heartbeat_failures_are_retried_unless_no_retry_mends_them() {
        let io = || redb::Error::Io(std::io::Error::other("disk"));
        let key = || "k".to_owned();
        for e in [
            Error::Busy {
                queued: 1,
                waited: Duration::from_millis(1),
            },
            Error::Aborted {
                source: "retry".into(),
            },
            Error::Storage {
                source: StorageError::new(io()),
            },
        ] {
            assert!(transient(&e), "{e}");
        }
        for e in [
            Error::LeaseLost { key: key() },
            Error::FailStopped {
                cause: "disk".into(),
            },
            Error::OutcomeUnknown {
                source: StorageError::new(io()),
            },
            Error::CorruptStore {
                reason: "page".into(),
            },
            Error::CorruptRecord {
                reason: "bytes".into(),
            },
            Error::Internal { what: "bug" },
        ] {
            assert!(!transient(&e), "{e}");
        }
    }

    #[test]
    fn a_slot_dropped_with_its_lease_lets_the_lease_lapse() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("idem.redb")).unwrap();
        let mut lease = claimed(&store);
        lease.lapse_on_drop(true);
        // The handler's task was cancelled with the slot still holding the lease.
        drop(Slot(Mutex::new(Some(lease))));
        assert!(in_flight_now(&store));
    }
}
