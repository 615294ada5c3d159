//! A background worker's handle: the outbox dispatcher's, of every engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::error::Error;
use crate::runtime::signal::Signal;

/// The running dispatcher. [`DispatcherHandle::shutdown`] (or dropping the handle) stops it
/// after the publish in progress and its delivery mark, and joins the thread.
#[derive(Debug)]
pub struct DispatcherHandle {
    stop: Arc<AtomicBool>,
    signal: Arc<Signal>,
    thread: Option<JoinHandle<()>>,
}

impl DispatcherHandle {
    /// The handle of a dispatcher thread that stops when `stop` is set and `signal` notified.
    pub(crate) fn new(stop: Arc<AtomicBool>, signal: Arc<Signal>, thread: JoinHandle<()>) -> Self {
        DispatcherHandle {
            stop,
            signal,
            thread: Some(thread),
        }
    }

    /// Stops the dispatcher and waits for its thread to end. Undelivered events stay in the
    /// outbox for the next dispatcher.
    pub fn shutdown(mut self) -> Result<(), Error> {
        self.stop_and_join()
    }

    /// Wakes the dispatcher now (e.g. after moving a manual clock in a test).
    pub fn wake(&self) {
        self.signal.notify();
    }

    fn stop_and_join(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        self.signal.notify();
        match self.thread.take() {
            Some(t) if t.thread().id() != std::thread::current().id() => {
                t.join().map_err(|_| Error::Internal {
                    what: "the outbox dispatcher thread panicked",
                })
            }
            _ => Ok(()),
        }
    }
}

impl Drop for DispatcherHandle {
    fn drop(&mut self) {
        if let Err(e) = self.stop_and_join() {
            crate::runtime::observe::warn!(
                "stopping the outbox dispatcher on drop",
                error = crate::runtime::observe::display(e),
            );
        }
    }
}

/// Starts a dispatcher thread (`idem-dispatcher`) running `body` with its stop flag, unless one
/// already runs for the store whose `counters` these are ([`Error::InUse`]); the flag is
/// cleared when the thread ends, however it ends. `signal` wakes it (commits that pushed
/// events, [`DispatcherHandle::wake`], shutdown).
pub(crate) fn spawn_dispatcher(
    counters: &crate::runtime::publish::DispatchCounters,
    signal: Arc<Signal>,
    body: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
) -> Result<DispatcherHandle, Error> {
    if counters.running.swap(true, Ordering::AcqRel) {
        return Err(Error::InUse {
            operation: "start_dispatcher",
            reason: "an outbox dispatcher is already running for this store".into(),
        });
    }
    let stop = Arc::new(AtomicBool::new(false));
    let running = counters.running.clone();
    let thread_stop = stop.clone();
    let spawned = std::thread::Builder::new()
        .name("idem-dispatcher".into())
        .spawn(move || {
            let _running = crate::runtime::publish::Running(running);
            body(thread_stop);
        });
    match spawned {
        Ok(t) => Ok(DispatcherHandle::new(stop, signal, t)),
        Err(source) => {
            counters.running.store(false, Ordering::Release);
            Err(Error::Spawn {
                what: "idem-dispatcher",
                source,
            })
        }
    }
}
