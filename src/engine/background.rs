//! The store's background threads: the relaxed-durability flusher and the sweeper. Both run
//! the same tick loop ([`tick_loop`]): every interval, one tick with a strong handle to the
//! store, held for that tick only, so dropping the last [`Store`] clone closes the file and
//! ends them. They stay two threads: a sweep pass may take long, and a flush waiting behind it
//! would widen the loss window of [`Durability::Periodic`].

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use crate::engine::builder::Durability;
use crate::engine::commit::{Durable, Step};
use crate::engine::store::{Store, WeakStore};
use crate::error::Error;
use crate::runtime::observe;

/// The background threads of one store.
#[derive(Default)]
pub(crate) struct Background {
    threads: Mutex<Threads>,
}

#[derive(Default)]
struct Threads {
    /// Dropping a sender stops its thread at once.
    stops: Vec<crossbeam_channel::Sender<()>>,
    handles: Vec<JoinHandle<()>>,
    /// Upgradable exactly while the sweeper thread runs.
    sweeper_alive: Option<Weak<()>>,
}

impl Threads {
    /// Starts a thread named `name` running [`tick_loop`]; its stop sender is kept here.
    fn spawn(
        &mut self,
        name: &'static str,
        weak: WeakStore,
        interval: Duration,
        tick: impl FnMut(&Store) + Send + 'static,
    ) -> Result<(), Error> {
        let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || tick_loop(weak, interval, stopped, tick))
            .map_err(|source| Error::Spawn { what: name, source })?;
        self.stops.push(stop);
        self.handles.push(handle);
        Ok(())
    }
}

impl Background {
    /// Stops the threads and waits for them to end (they hold no handle between ticks, so this
    /// is immediate unless a sweep pass or a flush is running).
    pub(crate) fn stop(&self) {
        let handles = {
            let mut threads = self.threads.lock();
            threads.stops.clear();
            threads.sweeper_alive = None;
            std::mem::take(&mut threads.handles)
        };
        let me = std::thread::current().id();
        for t in handles {
            // The last handle may be dropped by a background thread itself; it ends on its own.
            if t.thread().id() != me && t.join().is_err() {
                observe::warn!("a background thread of the store (flusher or sweeper) panicked");
            }
        }
    }
}

impl Store {
    /// Starts the flusher (relaxed durability) and the sweeper (if configured). Each holds only
    /// a [`WeakStore`] between ticks and stops when its channel's sender, kept in the store's
    /// [`Background`], is dropped.
    pub(crate) fn start_background(&self) -> Result<(), Error> {
        // Journal mode's applier first: the sweeper's batches need it.
        self.start_applier()?;
        let mut threads = self.background().threads.lock();
        if let Durability::Periodic(interval) = self.durability() {
            threads.spawn("idem-flusher", self.downgrade(), interval, flush)?;
        }
        if let Some(interval) = self.config().sweep_interval {
            let alive = Arc::new(());
            threads.sweeper_alive = Some(Arc::downgrade(&alive));
            threads.spawn("idem-sweeper", self.downgrade(), interval, move |store| {
                let _alive = &alive;
                // A failure is counted in the metrics; a fail-stopped store fails every pass
                // until it is reopened.
                if let Err(e) = store.sweep() {
                    observe::warn!(
                        "a background sweep pass failed; the next runs at the next interval",
                        error = observe::display(observe::Redacted(&e)),
                    );
                }
            })?;
        }
        Ok(())
    }

    /// Stops the background threads and waits for them to end.
    pub(crate) fn stop_background(&self) {
        self.background().stop();
        self.suspend_applier();
    }

    /// A token that can be upgraded exactly while this store's background sweeper thread runs
    /// (`None` without one): lets tests see the thread end when the store is dropped.
    #[doc(hidden)]
    #[cfg(feature = "__internal_whitebox")]
    pub fn sweeper_liveness(&self) -> Option<Weak<()>> {
        self.background().threads.lock().sweeper_alive.clone()
    }
}

/// The loop of every background thread: waits `interval`, then runs `tick` on the store.
/// Ends when the store stops its threads or is dropped (the stop channel disconnects), or
/// when no [`Store`] clone is left to upgrade to. `tick` owns what the thread keeps until it
/// ends (the sweeper's liveness token).
fn tick_loop(
    weak: WeakStore,
    interval: Duration,
    stop: crossbeam_channel::Receiver<()>,
    mut tick: impl FnMut(&Store),
) {
    loop {
        match stop.recv_timeout(interval) {
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let Some(store) = weak.upgrade() else { return };
        tick(&store);
    }
}

/// The flusher's tick: one durable (fsync) commit if anything was committed without one.
fn flush(store: &Store) {
    // The durable commit clears the flag (in `commit_txn`) only if it succeeds; a failure
    // latches the store and later ticks find it fail-stopped.
    // Once fail-stopped, every tick fails alike: only the failure itself is worth a warning.
    if store.unflushed()
        && let Err(e) = store.write(Durable::Forced, |_, _| Step::Clean(()))
        && !matches!(e, Error::FailStopped { .. })
    {
        observe::warn!(
            "the flusher's durable commit failed: commits since the last one may not be durable",
            error = observe::display(observe::Redacted(&e)),
        );
    }
}
