//! Nothing of a batch commits once a member latched the store fail-stop: a caller whose closure
//! reports an I/O failure on its own thread (`Store::execute`) latches the store before the
//! members ahead of it in its batch would re-run, so they are answered `FailStopped` and their
//! work is not committed after the latch. The model checker found the schedule in which they
//! re-ran and committed after it (src/runtime/model_check.rs, docs/design.md "Group commit").

use crate::common;

use common::*;
use idem::error::StorageError;
use idem::{Abort, Error};

#[test]
fn an_io_failure_reported_on_its_own_thread_fails_the_members_ahead_of_it() {
    let mut h = Harness::new();
    let (gate, failing) = std::thread::scope(|s| {
        let store = h.store();
        let (release, gate) = gate_answered(s, store);
        let failing = queue_callers(s, store, 1, |_| {
            store.execute(req("t", "op", "io", b"p"), |_| {
                Err(Abort::Store(Error::Storage {
                    source: StorageError::new(idem::redb::Error::Io(std::io::Error::other(
                        "the disk went away",
                    ))),
                }))
            })
        });
        release.send(()).expect("the gate is alive");
        let gate = gate.join().expect("the gate's thread");
        let failing = failing
            .into_iter()
            .map(|c| c.join().expect("the failing caller's thread"))
            .collect::<Vec<_>>();
        (gate, failing)
    });
    assert!(
        matches!(failing[..], [Err(Error::Storage { .. })]),
        "the failing caller gets its own error: {failing:?}"
    );
    assert!(h.store().fail_stop_cause().is_some(), "the store latched");
    assert!(
        matches!(gate, Err(Error::FailStopped { .. })),
        "the member ahead of it is answered FailStopped, not re-run and committed: {gate:?}"
    );
    // Nothing of the batch reached the file: after the reopen the gate's intent runs anew.
    h.reopen();
    executed(h.store().execute(req("t", "op", "gate", b"p"), |_| {
        Ok(idem::Response::new(200, "gate"))
    }));
}
