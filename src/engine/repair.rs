//! A reopen's repair of a file that was not closed cleanly: what the caller's
//! [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair) callback sees while it runs, and
//! how long it took ([`Store::repair_time`](crate::Store::repair_time)).
//!
//! A process that dies with the store open (a crash, a SIGKILL, a power cut) leaves a file whose
//! last commit is intact but whose allocator state (which pages are free) was never written:
//! redb rebuilds it on the next open for writing by walking every page of the file, seconds per
//! GB (BENCHMARKS.md, "The scale curve, memory and recovery": 25 s at 10M records), unless the
//! last commit saved that state (`quick_repair`). redb calls a repair callback before each pass
//! of that walk with an estimate of the progress, and abandons the open if the callback asks.
//!
//! Invariants: the caller's callback never unwinds through redb (its panic is caught here, the
//! repair is abandoned and the panic resumes on the opening thread once redb has returned); an
//! abandoned repair has written nothing (redb calls the callback only before the rebuild's own
//! commit), so the file still needs it and the next open repairs it.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::runtime::observe;

/// The progress of the repair a reopen makes of a file that was not closed cleanly, as the
/// [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair) callback sees it.
#[derive(Debug)]
pub struct RepairProgress {
    fraction: f64,
    elapsed: Duration,
    abort: bool,
}

impl RepairProgress {
    /// redb's estimate of the work done, in `[0.0, 1.0)`: 0.0 when the repair begins, then
    /// coarse steps (0.3, 0.6, 0.9: redb walks the file up to three times).
    pub fn fraction(&self) -> f64 {
        self.fraction
    }

    /// The time since the repair began (zero at the first call).
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Abandons the repair: the open returns [`Error::RepairAborted`](crate::Error::RepairAborted)
    /// and the file is left as it was, still to be repaired by the next open. For a service
    /// that would rather fail its start than be down for longer than some bound.
    pub fn abort(&mut self) {
        self.abort = true;
    }
}

/// The caller's callback, shareable by the builder's clones.
#[derive(Clone)]
pub(crate) struct RepairHook(Arc<dyn Fn(&mut RepairProgress) + Send + Sync>);

impl RepairHook {
    pub(crate) fn new(f: impl Fn(&mut RepairProgress) + Send + Sync + 'static) -> Self {
        RepairHook(Arc::new(f))
    }
}

impl std::fmt::Debug for RepairHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RepairHook(..)")
    }
}

/// What one open saw of redb's repair callbacks.
#[derive(Default)]
struct Seen {
    /// When redb first called back: the repair began.
    began: Option<Instant>,
    /// The caller's callback asked to abandon the repair (or panicked).
    aborted: bool,
    /// The caller's callback panicked: its payload, resumed after the open.
    panic: Option<Box<dyn Any + Send>>,
}

/// One open's watch over redb's repair: installed as redb's callback, read after the open.
#[derive(Clone, Default)]
pub(crate) struct Watch {
    hook: Option<RepairHook>,
    seen: Arc<Mutex<Seen>>,
}

/// What a watched open reports once redb has returned.
pub(crate) struct Watched {
    /// How long the repair took, if the open repaired the file.
    pub(crate) repair_time: Option<Duration>,
    /// The caller's callback abandoned the repair (or panicked).
    pub(crate) aborted: bool,
}

impl Watch {
    pub(crate) fn new(hook: Option<RepairHook>) -> Self {
        Watch {
            hook,
            seen: Arc::default(),
        }
    }

    /// redb's repair callback.
    pub(crate) fn install(&self, builder: &mut redb::Builder) {
        let watch = self.clone();
        builder.set_repair_callback(move |session| watch.called(session));
    }

    fn called(&self, session: &mut redb::RepairSession) {
        let now = Instant::now();
        let began = {
            let mut seen = self.seen.lock();
            if seen.aborted {
                session.abort();
                return;
            }
            *seen.began.get_or_insert(now)
        };
        if began == now {
            observe::warn!(
                "the store file was not closed cleanly: redb is rebuilding its allocator state by walking the whole file (StoreBuilder::quick_repair makes this near-instant)"
            );
        }
        let Some(hook) = &self.hook else { return };
        let mut progress = RepairProgress {
            fraction: session.progress(),
            elapsed: now.saturating_duration_since(began),
            abort: false,
        };
        // The caller's code must not unwind through redb: catch it, abandon the repair, and
        // let the open resume the panic.
        let ran = catch_unwind(AssertUnwindSafe(|| (hook.0)(&mut progress)));
        let mut seen = self.seen.lock();
        match ran {
            Ok(()) if !progress.abort => {}
            Ok(()) => seen.aborted = true,
            Err(payload) => {
                seen.aborted = true;
                seen.panic = Some(payload);
            }
        }
        if seen.aborted {
            session.abort();
        }
    }

    /// What the open saw, read once redb's open has returned.
    pub(crate) fn finish(&self) -> Watched {
        let seen = self.seen.lock();
        let repair_time = match (seen.began, seen.aborted) {
            (Some(began), false) => Some(began.elapsed()),
            _ => None,
        };
        Watched {
            repair_time,
            aborted: seen.aborted,
        }
    }

    /// Continues the caller's panic, if its callback panicked: called by the open once
    /// nothing of redb's or idem's is on the stack between it and the caller.
    pub(crate) fn resume_caller_panic(&self) {
        let panic = self.seen.lock().panic.take();
        if let Some(payload) = panic {
            std::panic::resume_unwind(payload);
        }
    }
}
