//! The blocking primitives of the group-commit protocol (`group.rs`, `driver.rs`) and of journal
//! mode's journal and applier (`engine/journal/log.rs`, `applier.rs`): parking_lot's `Mutex`,
//! `Condvar` and `RwLock` and std's atomics in every build, loom's when the crate's unit tests
//! are built with `--cfg idem_loom`, so that the model checkers (`model_check.rs`,
//! `engine/journal/model_check.rs`) explore every interleaving of the shipped code, not of a
//! copy. The switch is idem's own cfg, not
//! the customary `loom`: tokio (a dev-dependency) reads `--cfg loom` too and builds without its
//! networking, which the PostgreSQL client among the dev-dependencies needs.
//!
//! Only the primitives a thread blocks on, or hands protocol state through, are swapped. `Arc`
//! (which keeps members alive while the state moves through their mutexes) and the commit
//! counters (relaxed statistics) stay std's: loom's would add a scheduling point to every clone
//! and every count without modelling any state the protocol decides on.

#[cfg(not(all(idem_loom, test)))]
pub(crate) use parking_lot::{Condvar, Mutex, RwLock};

/// The atomics the journal and the applier decide on (their statistics stay std's).
pub(crate) mod atomic {
    #[cfg(all(idem_loom, test))]
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64};
    #[cfg(not(all(idem_loom, test)))]
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};
}

/// Asserts an invariant of the protocol in debug builds and under the model checker (which
/// runs in release); compiled out of release builds. Not while the thread unwinds: a second
/// panic there would abort the process before the first is reported.
macro_rules! protocol_invariant {
    ($cond:expr, $($msg:tt)+) => {
        if cfg!(any(debug_assertions, all(idem_loom, test))) && !std::thread::panicking() {
            assert!($cond, $($msg)+);
        }
    };
}
pub(crate) use protocol_invariant;

#[cfg(all(idem_loom, test))]
pub(crate) use self::model::{Condvar, Mutex, RwLock};

/// parking_lot's API (no poisoning, `wait(&mut guard)`) over loom's primitives.
#[cfg(all(idem_loom, test))]
mod model {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;
    use std::time::Instant;

    /// A loom mutex with parking_lot's `lock`.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }

        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// A loom read-write lock with parking_lot's `read` and `write`.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(PoisonError::into_inner)
        }

        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(PoisonError::into_inner)
        }
    }

    /// Holds the lock; `None` only while a condition variable waits with it released.
    pub(crate) struct MutexGuard<'a, T>(Option<loom::sync::MutexGuard<'a, T>>);

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0
                .as_deref()
                .expect("the guard holds its lock outside a wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0
                .as_deref_mut()
                .expect("the guard holds its lock outside a wait")
        }
    }

    /// Whether a timed wait gave up.
    pub(crate) struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub(crate) fn timed_out(&self) -> bool {
            self.0
        }
    }

    /// A loom condition variable with parking_lot's `wait(&mut guard)`.
    #[derive(Debug)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }

        pub(crate) fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let held = guard.0.take().expect("the guard holds its lock");
            guard.0 = Some(self.0.wait(held).unwrap_or_else(PoisonError::into_inner));
        }

        /// loom has no timed wait. A deadline already past times out at once (as parking_lot's
        /// does); any other deadline waits for a notification only, so the model checks that a
        /// waiter is woken without its timeout. A model's `queue_timeout` is zero (every wait
        /// for room times out) or far beyond any run (none does).
        pub(crate) fn wait_until<T>(
            &self,
            guard: &mut MutexGuard<'_, T>,
            deadline: Instant,
        ) -> WaitTimeoutResult {
            if Instant::now() >= deadline {
                return WaitTimeoutResult(true);
            }
            self.wait(guard);
            WaitTimeoutResult(false)
        }
    }
}
