//! One count-bounded run: many callers, each on its own thread, all started together, every
//! call timed; and the deterministic key picker of the replay workloads.

use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use idem::store::Metrics;

use crate::written::WriteCounter;

/// One count-bounded run: `callers` threads, `per_caller` operations each.
pub struct Sample {
    pub ops: usize,
    pub elapsed: Duration,
    pub lat_ns: Vec<u64>,
    pub written: Option<u64>,
    /// idem only: the store's commit counters over the run (`Store::metrics` delta).
    pub commits: Option<Commits>,
}

/// A difference of two `Store::metrics` snapshots.
#[derive(Clone, Copy, Default)]
pub struct Commits {
    pub commits: u64,
    pub requests: u64,
    pub reruns: u64,
    pub busy: u64,
}

impl Commits {
    /// The counters' growth from snapshot `a` to snapshot `b`.
    pub fn between(a: &Metrics, b: &Metrics) -> Self {
        Commits {
            commits: b.commits.saturating_sub(a.commits),
            requests: b.committed_requests.saturating_sub(a.committed_requests),
            reruns: b.reruns.saturating_sub(a.reruns),
            busy: b.busy.saturating_sub(a.busy),
        }
    }

    /// Both differences together.
    pub fn add(self, o: Commits) -> Self {
        Commits {
            commits: self.commits + o.commits,
            requests: self.requests + o.requests,
            reruns: self.reruns + o.reruns,
            busy: self.busy + o.busy,
        }
    }
}

/// Runs `callers` threads; each builds its worker with `make(caller)` (untimed), then all start
/// together and call it `per_caller` times. Workers are dropped only after the I/O counter was
/// read, so closing connections is not counted.
pub fn run_callers<M, W>(
    counter: &WriteCounter,
    callers: usize,
    per_caller: usize,
    make: M,
) -> Sample
where
    M: Fn(usize) -> W + Sync,
    W: FnMut(usize) + Send,
{
    let ready = Barrier::new(callers + 1);
    let go = Barrier::new(callers + 1);
    thread::scope(|s| {
        let handles: Vec<_> = (0..callers)
            .map(|caller| {
                let (make, ready, go) = (&make, &ready, &go);
                s.spawn(move || {
                    let mut work = make(caller);
                    let mut lat = Vec::with_capacity(per_caller);
                    ready.wait();
                    go.wait();
                    // Each caller reads its own start: the main thread may not be scheduled
                    // again until the callers are done (2 cores, CPU-bound callers).
                    let started = Instant::now();
                    for i in 0..per_caller {
                        let t = Instant::now();
                        work(i);
                        lat.push(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX));
                    }
                    (lat, started, Instant::now(), work)
                })
            })
            .collect();
        ready.wait();
        let io_before = counter.read();
        go.wait();
        let mut start: Option<Instant> = None;
        let mut end: Option<Instant> = None;
        let mut lat_ns = Vec::with_capacity(callers * per_caller);
        let mut workers = Vec::with_capacity(callers);
        for h in handles {
            let (lat, started, done, work) =
                h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            start = Some(start.map_or(started, |s| s.min(started)));
            end = Some(end.map_or(done, |e| e.max(done)));
            lat_ns.extend(lat);
            workers.push(work);
        }
        let io_after = counter.read();
        drop(workers);
        Sample {
            ops: callers * per_caller,
            elapsed: end
                .zip(start)
                .map_or(Duration::ZERO, |(e, s)| e.saturating_duration_since(s))
                .max(Duration::from_nanos(1)),
            lat_ns,
            written: io_before.zip(io_after).map(|(a, b)| b.saturating_sub(a)),
            commits: None,
        }
    })
}

/// splitmix64: a deterministic key picker per (run, caller).
pub struct Rng(u64);

impl Rng {
    /// The picker of caller `caller` in run `tag`.
    pub fn new(tag: usize, caller: usize) -> Self {
        Rng(((tag as u64) << 32) ^ (caller as u64) ^ 0x9e37_79b9_7f4a_7c15)
    }
    /// The next index in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z % n as u64) as usize
    }
}
