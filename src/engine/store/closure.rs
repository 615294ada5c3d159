//! The closure boundary: the caller's closure runs marked as inside this store's write
//! transaction (a nested write call fails fast with [`Error::Reentrant`]), on a [`Tx`]; its
//! result is settled into what the record stores; the work it announced wakes the layers
//! above once the write committed.

use std::sync::Arc;

use crate::engine::boundary::caller_code;
use crate::engine::journal::Wtx;
use crate::engine::store::Store;
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::Origin;
use crate::model::record::State;
use crate::model::response::{Abort, Response};
use crate::model::rules::answers;
use crate::runtime::signal::Signal;

impl Store {
    /// Runs the caller's closure, marking this thread as inside this store's write
    /// transaction so a nested write call fails fast with [`Error::Reentrant`] instead of
    /// waiting forever on redb's writer lock.
    pub(crate) fn run_closure<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Unmark(usize);
        impl Drop for Unmark {
            fn drop(&mut self) {
                let _ = IN_CLOSURE.try_with(|v| {
                    let mut v = v.borrow_mut();
                    if let Some(i) = v.iter().rposition(|&p| p == self.0) {
                        v.remove(i);
                    }
                });
            }
        }
        let id = self.id();
        // `try_with`: during thread teardown the thread-local may be gone; then there is
        // nothing to mark (no closure can be running on a thread that is being destroyed).
        let _ = IN_CLOSURE.try_with(|v| v.borrow_mut().push(id));
        let _unmark = Unmark(id);
        caller_code(f)
    }

    /// Runs the caller's closure (see `run_closure`) on a [`Tx`] over `txn`, and says whether
    /// it announced work: the write call that ran it calls [`Store::announce_work`] once it
    /// committed.
    pub(crate) fn run_on_tx<R>(
        &self,
        txn: &Wtx<'_>,
        now: Timestamp,
        origin: Origin<'_>,
        f: impl FnOnce(&Tx<'_>) -> R,
    ) -> (R, bool) {
        let tx = Tx::new(self, *txn, now, origin);
        let result = self.run_closure(|| f(&tx));
        (result, tx.announced())
    }

    pub(crate) fn in_closure(&self) -> bool {
        let id = self.id();
        IN_CLOSURE
            .try_with(|v| v.borrow().contains(&id))
            .unwrap_or(false)
    }

    /// What a closure's result records (flow A and lease completion share the rule,
    /// [`answers::settle`]), within this store's response cap.
    pub(crate) fn settle(
        &self,
        result: Result<Response, Abort>,
    ) -> Result<(State, Response), Error> {
        answers::settle(result, self.inner.config.max_response_bytes)
    }

    /// Wakes whoever waits for announced work (the outbox dispatcher): called after a commit
    /// whose closure announced work, and by the layers above when they make work available
    /// outside a closure (a requeued dead letter). A wake-up with nothing to do is harmless.
    pub(crate) fn announce_work(&self) {
        self.inner.work.notify();
    }

    /// The work-announced signal, for a worker to wait on ([`crate::runtime::signal`]).
    pub(crate) fn work_signal(&self) -> Arc<Signal> {
        self.inner.work.clone()
    }
}

thread_local! {
    /// Stores whose write transaction is running a caller closure on this thread.
    static IN_CLOSURE: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}
