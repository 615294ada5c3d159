//! A `Lease` kept in a thread-local and dropped while the thread is torn down releases its key
//! (or leaves it to the lease deadline) without aborting the process, even after idem's own
//! thread-local state is gone.

use crate::common;

use std::cell::RefCell;

use common::*;
use idem::{BeginAnswer, Lease, Response};

thread_local! {
    static PARKED: RefCell<Option<Lease>> = const { RefCell::new(None) };
}

#[test]
fn a_lease_dropped_during_thread_teardown_does_not_abort() {
    let h = Harness::new();
    let store = h.store().clone();
    let worker = store.clone();
    std::thread::spawn(move || {
        // The user's thread-local is registered first, idem's afterwards (by the execute below),
        // so idem's is destroyed first at thread exit and the Lease's drop runs without it.
        PARKED.with(|p| {
            *p.borrow_mut() = Some(acquired(worker.begin(req("t", "charge", "k", b"p"))));
        });
        executed(worker.execute(req("t", "op", "other", b"p"), |_| {
            Ok(Response::new(200, "ok"))
        }));
    })
    .join()
    .expect("the thread ends normally; the process did not abort");
    // The lease was released on drop: the key is free at once.
    assert!(matches!(
        store.begin(req("t", "charge", "k", b"p")),
        Ok(BeginAnswer::Acquired(_))
    ));
}
