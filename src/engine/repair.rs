//! A reopen's repair of a file that was not closed cleanly: what the caller's
//! [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair) callback sees while it runs, and
//! how long it took ([`Store::repair_time`](crate::Store::repair_time)); and the verification
//! of a file closed cleanly ([`StoreBuilder::verify_on_open`](crate::StoreBuilder::verify_on_open)),
//! which redb runs as the same walk and reports through the same callbacks ([`Mode`]).
//!
//! A process that dies with the store open (a crash, a SIGKILL, a power cut) leaves a file whose
//! last commit is intact but whose allocator state (which pages are free) was never written:
//! redb rebuilds it on the next open for writing by walking every page of the file, seconds per
//! GB (benches/results/2026-12-02-0de0621-scale.md: 25 s at 10M records), unless the
//! last commit saved that state (`quick_repair`). redb calls a repair callback before each pass
//! of that walk with an estimate of the progress, and abandons the open if the callback asks.
//!
//! Before the walk, the open reads the file once front to back (`prefetch_on_repair`, on by
//! default): redb's walk follows the trees, whose pages lie scattered over the file, and on a
//! cold OS page cache those scattered reads cost more than one sequential read of the whole
//! file followed by a walk from memory (benches/results/2026-12-04-a83961b-reopen-after-crash.md:
//! a 2.9 GB file,
//! 7.2–10.4 s without, 5.3–6.7 s with). The read is a hint: a file larger than the memory the
//! OS reports available is not read (it would evict itself), and a failed read stops it.
//!
//! Invariants: the caller's callback never unwinds through redb (its panic is caught here, the
//! repair is abandoned and the panic resumes on the opening thread once redb has returned); an
//! abandoned repair has written none of its work (redb calls the callback only before the
//! rebuild's own commit; before the first call it may only have rewritten its header in place,
//! with the same commit slots), so the file still holds the same commits, still needs the
//! repair, and the next open makes it.

use std::any::Any;
use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
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
    /// and the file keeps the same commits, still to be repaired by the next open. For a service
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

/// What redb's repair callbacks are, for one open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Mode {
    /// The repair of a file a crash left: the caller's callback sees it, it is logged and
    /// counted, and [`Store::repair_time`](crate::Store::repair_time) reports it.
    #[default]
    Repair,
    /// The check of a file closed cleanly: nothing to repair and nothing to report but its
    /// time (a `tracing` debug event).
    Verify,
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
    mode: Mode,
    hook: Option<RepairHook>,
    /// The file to read through once when a repair begins (`prefetch_on_repair`).
    prefetch: Option<PathBuf>,
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
    pub(crate) fn new(mode: Mode, hook: Option<RepairHook>, prefetch: Option<PathBuf>) -> Self {
        Watch {
            mode,
            hook,
            prefetch,
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
        // `first`: this call opens the repair (redb makes it before its first pass).
        let (began, first) = {
            let mut seen = self.seen.lock();
            if seen.aborted {
                session.abort();
                return;
            }
            match seen.began {
                Some(began) => (began, false),
                None => {
                    seen.began = Some(now);
                    (now, true)
                }
            }
        };
        if self.mode == Mode::Verify {
            if first {
                self.prefetch_once();
            }
            return;
        }
        if first {
            observe::warn!(
                "the store file was not closed cleanly: redb is rebuilding its allocator state by walking the whole file (StoreBuilder::quick_repair makes this near-instant)"
            );
        }
        if let Some(hook) = &self.hook {
            let mut progress = RepairProgress {
                fraction: session.progress(),
                elapsed: now.saturating_duration_since(began),
                abort: false,
            };
            // The caller's code must not unwind through redb: catch it, abandon the repair,
            // and let the open resume the panic.
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
                return;
            }
        }
        if first {
            self.prefetch_once();
        }
    }

    /// Reads the file through before redb's walk, if asked to.
    fn prefetch_once(&self) {
        if let Some(path) = &self.prefetch {
            let started = Instant::now();
            let read = prefetch(path);
            observe::debug!(
                "read the store file through before its repair",
                bytes = read,
                seconds = started.elapsed().as_secs_f64()
            );
        }
    }

    /// What the open saw, read once redb's open has returned.
    pub(crate) fn finish(&self) -> Watched {
        let seen = self.seen.lock();
        let walked = match (seen.began, seen.aborted) {
            (Some(began), false) => Some(began.elapsed()),
            _ => None,
        };
        if let (Mode::Verify, Some(took)) = (self.mode, walked) {
            observe::debug!(
                "verified every page of the store file",
                seconds = took.as_secs_f64()
            );
        }
        Watched {
            repair_time: walked.filter(|_| self.mode == Mode::Repair),
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

/// Reads the file at `path` front to back once, into the OS page cache, unless it is larger than
/// the memory the OS reports available: the bytes read (0 if skipped). A failed read ends it
/// (it is only a hint).
fn prefetch(path: &Path) -> u64 {
    let Ok(mut file) = std::fs::File::open(path) else {
        return 0;
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
    if available_memory().is_some_and(|available| len > available) {
        return 0;
    }
    let mut buf = vec![0u8; PREFETCH_CHUNK];
    let mut total = 0u64;
    while let Ok(n) = file.read(&mut buf) {
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    total
}

/// One read of the prefetch: large enough that the kernel's readahead streams the file.
const PREFETCH_CHUNK: usize = 8 << 20;

/// The memory the OS reports available (Linux: `MemAvailable` in `/proc/meminfo`), if known.
/// Elsewhere unknown, and the file is read whatever its size: a read of a file that does not
/// fit costs at most one sequential pass, less than the scattered walk that follows.
fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&meminfo)
}

/// `MemAvailable:  123456 kB` → bytes.
fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::parse_mem_available;

    #[test]
    fn mem_available_is_read_in_bytes_and_anything_else_is_unknown() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   23456789 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(23_456_789 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
        assert_eq!(
            parse_mem_available("MemAvailable: 99999999999999999999 kB\n"),
            None
        );
        assert_eq!(
            parse_mem_available("MemAvailable: 18446744073709551615 kB\n"),
            None
        );
    }
}
