//! The work-announced signal: an engine's hook for background workers of the layers above.
//!
//! A closure announces work on its transaction handle (an outbox push is one piece); after a
//! write call commits a transaction whose closure announced work, the engine notifies its
//! signal, and a worker waiting on it (the outbox dispatcher) wakes.
//! A worker reads the count before it looks for work and waits only while the count is
//! unchanged, so no notification between the two is lost.

use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// A wake-up counter and its condition variable.
#[derive(Default, Debug)]
pub(crate) struct Signal {
    count: Mutex<u64>,
    cv: Condvar,
}

impl Signal {
    /// Bumps the count and wakes every waiter.
    pub(crate) fn notify(&self) {
        let mut c = self.count.lock();
        *c = c.wrapping_add(1);
        self.cv.notify_all();
    }

    /// The count now: pass it to [`Signal::wait_unless_changed`].
    pub(crate) fn seen(&self) -> u64 {
        *self.count.lock()
    }

    /// Waits up to `timeout` for a notification after the count was `seen`; returns at once if
    /// one came already, or if `give_up` says so (checked under the lock, so a stop request
    /// that notifies is never missed).
    pub(crate) fn wait_unless_changed(
        &self,
        seen: u64,
        timeout: Duration,
        give_up: impl Fn() -> bool,
    ) {
        let mut count = self.count.lock();
        if *count == seen && !give_up() {
            let _ = self.cv.wait_for(&mut count, timeout);
        }
    }
}
