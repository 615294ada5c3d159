//! Fault-injecting in-memory redb backends, shared by the integration tests (through
//! `tests/common`), the fuzz targets (`fuzz/fuzz_targets/*`) and the corpus-replay test
//! (through `tests/sim`). Only `std` and `idem::redb`.

#![allow(dead_code)]

/// An in-memory redb backend that keeps two images — what was written (live) and what the
/// last `sync_data` made durable — and can fail writes and syncs on demand. A "crash" opens a
/// new backend over the durable image only.
#[derive(Debug, Clone, Default)]
pub struct CrashBackend {
    images: std::sync::Arc<std::sync::Mutex<Images>>,
    pub failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Set: reads fail too, as on a disk that went away.
    pub gone: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

#[derive(Debug, Default)]
struct Images {
    live: Vec<u8>,
    durable: Vec<u8>,
}

impl CrashBackend {
    fn images(&self) -> std::sync::MutexGuard<'_, Images> {
        // A poisoned lock only means another test thread panicked; the bytes are still valid.
        self.images.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn check(&self) -> std::io::Result<()> {
        if self.failing.load(std::sync::atomic::Ordering::SeqCst)
            || self.gone.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(std::io::Error::other("injected I/O failure"));
        }
        Ok(())
    }

    /// A copy of every byte written so far (synced or not).
    pub fn live_image(&self) -> Vec<u8> {
        self.images().live.clone()
    }

    /// A copy of the bytes as of the last successful `sync_data`.
    pub fn durable_image(&self) -> Vec<u8> {
        self.images().durable.clone()
    }

    /// A new backend holding only what was durable: what a reopen after power loss sees.
    pub fn crash(&self) -> CrashBackend {
        let durable = self.images().durable.clone();
        CrashBackend {
            images: std::sync::Arc::new(std::sync::Mutex::new(Images {
                live: durable.clone(),
                durable,
            })),
            failing: Default::default(),
            gone: Default::default(),
        }
    }
}

impl idem::redb::StorageBackend for CrashBackend {
    fn len(&self) -> Result<u64, idem::redb::BackendError> {
        Ok(self.images().live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), idem::redb::BackendError> {
        if self.gone.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("injected I/O failure: the disk went away").into());
        }
        let images = self.images();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + out.len();
        if end > images.live.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end",
            )
            .into());
        }
        out.copy_from_slice(&images.live[start..end]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> Result<(), idem::redb::BackendError> {
        self.check()?;
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        self.images().live.resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> Result<(), idem::redb::BackendError> {
        self.check()?;
        let mut images = self.images();
        images.durable = images.live.clone();
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), idem::redb::BackendError> {
        self.check()?;
        let mut images = self.images();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + data.len();
        if end > images.live.len() {
            images.live.resize(end, 0);
        }
        images.live[start..end].copy_from_slice(data);
        Ok(())
    }
}

/// A [`CrashBackend`] with the byte-range locks redb's multi-process mode takes (it refuses a
/// backend without them), as the OS gives them to a process that is alone on its file: every
/// lock is granted at once, and no other process holds any. (POSIX record locks never conflict
/// with the same process's own; open one store on it at a time.)
#[derive(Debug)]
pub struct AloneOnFile(pub CrashBackend);

type Bound = std::ops::Bound<u64>;
type Locked<T> = Result<T, idem::redb::BackendError>;

impl idem::redb::StorageBackend for AloneOnFile {
    fn len(&self) -> Result<u64, idem::redb::BackendError> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), idem::redb::BackendError> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), idem::redb::BackendError> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), idem::redb::BackendError> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), idem::redb::BackendError> {
        self.0.write(offset, data)
    }
    fn try_lock_range(&self, _: Bound, _: Bound) -> Locked<bool> {
        Ok(true)
    }
    fn try_lock_shared_range(&self, _: Bound, _: Bound) -> Locked<bool> {
        Ok(true)
    }
    fn lock_range(&self, _: Bound, _: Bound) -> Locked<()> {
        Ok(())
    }
    fn lock_shared_range(&self, _: Bound, _: Bound) -> Locked<()> {
        Ok(())
    }
    fn unlock_range(&self, _: Bound, _: Bound) -> Locked<()> {
        Ok(())
    }
    fn query_lock_range(&self, _: Bound, _: Bound) -> Locked<bool> {
        Ok(false)
    }
}

/// A [`CrashBackend`] over a given durable image (the image a crash at some sync left).
pub fn crash_backend_from_image(image: Vec<u8>) -> CrashBackend {
    CrashBackend {
        images: std::sync::Arc::new(std::sync::Mutex::new(Images {
            live: image.clone(),
            durable: image,
        })),
        failing: Default::default(),
        gone: Default::default(),
    }
}

/// What a [`CountingBackend`] counted and injects.
#[derive(Debug, Default)]
pub struct Counting {
    /// `sync_data` calls that succeeded since the last [`CountingBackend::mark`].
    pub syncs: usize,
    /// The durable image right after each such sync; `[0]` is the durable image at the mark,
    /// so `snapshots[k]` is what a crash right after sync `k` leaves.
    pub snapshots: Vec<Vec<u8>>,
    /// I/O operations (writes, `set_len`, syncs) attempted since the last arming.
    pub ops: u64,
    /// Fail the I/O operation with this 0-based index (since arming), if set.
    pub fail_at: Option<u64>,
    /// Keep failing every operation after the first injected failure.
    pub persistent: bool,
    /// How many failures were injected.
    pub injected: u64,
    /// After each write or `set_len` since the last [`CountingBackend::mark`]: the syncs done
    /// so far and the live image — what a crash leaves if every write so far reached the disk
    /// in order but the next sync never ran (a torn commit).
    pub torn: Vec<(usize, Vec<u8>)>,
}

/// A wrapper over a [`CrashBackend`] (which it leaves unchanged) that counts syncs, keeps the
/// durable image after each one, and can fail the n-th write/sync (once or from then on).
#[derive(Debug, Clone, Default)]
pub struct CountingBackend {
    pub inner: CrashBackend,
    pub state: std::sync::Arc<std::sync::Mutex<Counting>>,
}

impl CountingBackend {
    pub fn counting(&self) -> std::sync::MutexGuard<'_, Counting> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts counting syncs from here; snapshot 0 is the current durable image.
    pub fn mark(&self) {
        let durable = self.inner.images().durable.clone();
        let mut c = self.counting();
        c.syncs = 0;
        c.snapshots = vec![durable];
        c.torn.clear();
    }

    /// The torn-commit images since the mark (see [`Counting::torn`]).
    pub fn torn_images(&self) -> Vec<(usize, Vec<u8>)> {
        self.counting().torn.clone()
    }

    fn after_write(&self) {
        let live = self.inner.images().live.clone();
        let mut c = self.counting();
        if !c.snapshots.is_empty() {
            let syncs = c.syncs;
            c.torn.push((syncs, live));
        }
    }

    /// Syncs since the mark.
    pub fn syncs(&self) -> usize {
        self.counting().syncs
    }

    /// The durable image as of sync `k` since the mark.
    pub fn image_at_sync(&self, k: usize) -> Vec<u8> {
        self.counting().snapshots[k].clone()
    }

    /// Arms the failure countdown: I/O operation `n` (0-based, counted from now) fails, and
    /// with `persistent` every later one too.
    pub fn fail_at(&self, n: u64, persistent: bool) {
        let mut c = self.counting();
        c.ops = 0;
        c.fail_at = Some(n);
        c.persistent = persistent;
        c.injected = 0;
    }

    /// Disarms the countdown and returns how many failures were injected.
    pub fn disarm(&self) -> u64 {
        let mut c = self.counting();
        c.fail_at = None;
        c.injected
    }

    /// A crash: a plain backend over what was durable.
    pub fn crash(&self) -> CrashBackend {
        self.inner.crash()
    }

    fn io(&self) -> std::io::Result<()> {
        let mut c = self.counting();
        let n = c.ops;
        c.ops += 1;
        if let Some(at) = c.fail_at
            && (n == at || (c.persistent && n > at))
        {
            c.injected += 1;
            return Err(std::io::Error::other("injected I/O failure (countdown)"));
        }
        Ok(())
    }
}

impl idem::redb::StorageBackend for CountingBackend {
    fn len(&self) -> Result<u64, idem::redb::BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), idem::redb::BackendError> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), idem::redb::BackendError> {
        self.io()?;
        self.inner.set_len(len)?;
        self.after_write();
        Ok(())
    }
    fn sync_data(&self) -> Result<(), idem::redb::BackendError> {
        self.io()?;
        // Hold the counter lock across the sync so the snapshot is exactly this sync's image.
        let mut c = self.counting();
        self.inner.sync_data()?;
        let durable = self.inner.images().durable.clone();
        c.syncs += 1;
        c.snapshots.push(durable);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), idem::redb::BackendError> {
        self.io()?;
        self.inner.write(offset, data)?;
        self.after_write();
        Ok(())
    }
}

/// A [`CrashBackend`] whose live image (what a process reads: the OS page cache) differs from
/// its durable one (what a power loss leaves): a file after a process kill.
pub fn crash_backend_from_images(live: Vec<u8>, durable: Vec<u8>) -> CrashBackend {
    CrashBackend {
        images: std::sync::Arc::new(std::sync::Mutex::new(Images { live, durable })),
        failing: Default::default(),
        gone: Default::default(),
    }
}

/// Which file of a [`CountingPair`] an operation touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairSide {
    /// The redb file.
    Store,
    /// The journal beside it.
    Journal,
}

/// One image of both files of a [`CountingPair`] at one instant: (store, journal). Images are
/// shared: a file that did not change between two crash points keeps one copy.
pub type PairImage = (std::sync::Arc<Vec<u8>>, std::sync::Arc<Vec<u8>>);

/// What a [`CountingPair`] counted since its mark: one operation counter and one list of crash
/// points for both files, so a crash point freezes both at the same instant.
#[derive(Debug, Default)]
pub struct PairCounting {
    /// I/O operations (writes, `set_len`, syncs) of either file since the last mark.
    pub ops: u64,
    /// `sync_data` calls of either file that succeeded since the mark.
    pub syncs: usize,
    /// Of those, the store file's.
    pub store_syncs: usize,
    /// Counting since [`CountingPair::mark`] (until [`CountingPair::stop`]).
    pub marked: bool,
    /// Both durable images right after each such sync; `[0]` is the pair at the mark, so
    /// `snapshots[k]` is what a crash right after sync `k` leaves.
    pub snapshots: Vec<PairImage>,
    /// After each write or `set_len` of either file since the mark: the syncs done so far and
    /// the pair a crash leaves if every write so far of the file written reached its disk but
    /// nothing unsynced of the other file did (the file written: its live image; the other:
    /// its durable image).
    pub torn: Vec<(usize, PairImage)>,
    /// After each write of either file since the mark, when the other file also holds unsynced
    /// writes: the syncs done so far and both live images (every write so far of both files
    /// reached the disk, the next sync never ran).
    pub torn_both: Vec<(usize, PairImage)>,
    /// After each write of either file since the mark: the syncs done so far and what a
    /// process kill leaves (the OS keeps every write): each file's live image, with the durable
    /// one beneath it that a later power loss would leave. (store live, store durable),
    /// (journal live, journal durable).
    pub kills: Vec<(usize, PairImage, PairImage)>,
    /// Every write to the journal since the pair was created, in order: (offset, bytes).
    pub journal_writes: Vec<(u64, Vec<u8>)>,
    /// The current durable images (shared by the crash points until the next sync).
    durable: Option<PairImage>,
}

/// A failure countdown of one file of a [`CountingPair`].
#[derive(Debug, Default)]
pub struct Countdown {
    /// I/O operations of this file since the arming.
    pub ops: u64,
    /// Fail the operation with this 0-based index (since arming), if set.
    pub fail_at: Option<u64>,
    /// Keep failing every operation after the first injected failure.
    pub persistent: bool,
    /// How many failures were injected.
    pub injected: u64,
}

/// One file of a [`CountingPair`]: a [`CrashBackend`] whose writes and syncs are counted and
/// recorded with the other file's, under one lock.
#[derive(Debug, Clone)]
pub struct PairFile {
    pub inner: CrashBackend,
    /// The pair's other file.
    other: CrashBackend,
    side: PairSide,
    pair: std::sync::Arc<std::sync::Mutex<PairCounting>>,
    countdown: std::sync::Arc<std::sync::Mutex<Countdown>>,
    hold: std::sync::Arc<(std::sync::Mutex<SyncHold>, std::sync::Condvar)>,
}

/// Syncs of one [`PairFile`] held back on purpose: a sync that starts while they are held
/// waits (before it touches the disk) until they are released.
#[derive(Debug, Default)]
pub struct SyncHold {
    /// Syncs wait while set.
    pub held: bool,
    /// Syncs waiting now.
    pub waiting: usize,
}

/// Two simulated disks, the store file and its journal, under one operation and sync counter:
/// after every sync of either file the pair of durable images is recorded, after every write
/// the torn pair (see [`PairCounting::torn`]). Open journal mode on it with
/// `open_with_backends(pair.store.clone(), pair.journal.clone())`.
#[derive(Debug, Clone)]
pub struct CountingPair {
    pub store: PairFile,
    pub journal: PairFile,
    pub state: std::sync::Arc<std::sync::Mutex<PairCounting>>,
}

impl Default for CountingPair {
    fn default() -> Self {
        CountingPair::new()
    }
}

impl CountingPair {
    pub fn new() -> CountingPair {
        let (s, j) = (CrashBackend::default(), CrashBackend::default());
        let state = std::sync::Arc::new(std::sync::Mutex::new(PairCounting::default()));
        let file = |inner: &CrashBackend, other: &CrashBackend, side| PairFile {
            inner: inner.clone(),
            other: other.clone(),
            side,
            pair: state.clone(),
            countdown: Default::default(),
            hold: Default::default(),
        };
        CountingPair {
            store: file(&s, &j, PairSide::Store),
            journal: file(&j, &s, PairSide::Journal),
            state,
        }
    }

    pub fn counting(&self) -> std::sync::MutexGuard<'_, PairCounting> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts counting from here; snapshot 0 is the pair's current durable images.
    pub fn mark(&self) {
        let mut c = self.counting();
        let now = (
            std::sync::Arc::new(self.store.inner.durable_image()),
            std::sync::Arc::new(self.journal.inner.durable_image()),
        );
        c.ops = 0;
        c.syncs = 0;
        c.store_syncs = 0;
        c.marked = true;
        c.snapshots = vec![now.clone()];
        c.torn.clear();
        c.torn_both.clear();
        c.kills.clear();
        c.durable = Some(now);
    }

    /// Stops recording crash points (what was recorded stays).
    pub fn stop(&self) {
        self.counting().marked = false;
    }

    /// Syncs of either file since the mark.
    pub fn syncs(&self) -> usize {
        self.counting().syncs
    }

    /// Syncs of the store file since the mark.
    pub fn store_syncs(&self) -> usize {
        self.counting().store_syncs
    }

    /// Both durable images as of sync `k` since the mark.
    pub fn image_at_sync(&self, k: usize) -> PairImage {
        self.counting().snapshots[k].clone()
    }

    /// The torn pairs since the mark (see [`PairCounting::torn`]).
    pub fn torn_images(&self) -> Vec<(usize, PairImage)> {
        self.counting().torn.clone()
    }

    /// The torn pairs of both files' writes since the mark (see [`PairCounting::torn_both`]).
    pub fn torn_both_images(&self) -> Vec<(usize, PairImage)> {
        self.counting().torn_both.clone()
    }

    /// The process kills since the mark (see [`PairCounting::kills`]).
    pub fn kill_images(&self) -> Vec<(usize, PairImage, PairImage)> {
        self.counting().kills.clone()
    }

    /// Every write to the journal so far: (offset, bytes).
    pub fn journal_writes(&self) -> Vec<(u64, Vec<u8>)> {
        self.counting().journal_writes.clone()
    }

    /// A pair over given images (each file's live and durable image alike): what an open after
    /// a crash finds, counted like any other pair.
    pub fn from_images(store: Vec<u8>, journal: Vec<u8>) -> CountingPair {
        let pair = CountingPair::new();
        for (file, image) in [(&pair.store, store), (&pair.journal, journal)] {
            let mut images = file.inner.images();
            images.live = image.clone();
            images.durable = image;
        }
        pair
    }

    /// A crash of both files now: two plain backends over what each had made durable.
    pub fn crash(&self) -> (CrashBackend, CrashBackend) {
        let _c = self.counting();
        (self.store.inner.crash(), self.journal.inner.crash())
    }
}

impl PairFile {
    fn pair(&self) -> std::sync::MutexGuard<'_, PairCounting> {
        self.pair.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn countdown(&self) -> std::sync::MutexGuard<'_, Countdown> {
        self.countdown.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Arms this file's failure countdown: its I/O operation `n` (0-based, counted from now)
    /// fails, and with `persistent` every later one too (a full disk).
    pub fn fail_at(&self, n: u64, persistent: bool) {
        let mut c = self.countdown();
        *c = Countdown {
            fail_at: Some(n),
            persistent,
            ..Countdown::default()
        };
    }

    /// Disarms the countdown and returns how many failures were injected.
    pub fn disarm(&self) -> u64 {
        let mut c = self.countdown();
        c.fail_at = None;
        c.injected
    }

    /// Holds this file's syncs back: each one that starts waits until [`Self::release_syncs`].
    pub fn hold_syncs(&self) {
        self.hold.0.lock().unwrap_or_else(|e| e.into_inner()).held = true;
    }

    /// Lets the held syncs run.
    pub fn release_syncs(&self) {
        let (hold, cv) = &*self.hold;
        hold.lock().unwrap_or_else(|e| e.into_inner()).held = false;
        cv.notify_all();
    }

    /// How many syncs are waiting behind [`Self::hold_syncs`] now.
    pub fn syncs_waiting(&self) -> usize {
        self.hold
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .waiting
    }

    fn wait_while_held(&self) {
        let (hold, cv) = &*self.hold;
        let mut h = hold.lock().unwrap_or_else(|e| e.into_inner());
        h.waiting += 1;
        while h.held {
            h = cv.wait(h).unwrap_or_else(|e| e.into_inner());
        }
        h.waiting -= 1;
    }

    /// I/O operations (writes, `set_len`, syncs) of this file since the last arming (or since
    /// it was created).
    pub fn ops(&self) -> u64 {
        self.countdown().ops
    }

    /// Failures injected since the arming.
    pub fn injected(&self) -> u64 {
        self.countdown().injected
    }

    fn io(&self) -> std::io::Result<()> {
        let mut c = self.countdown();
        let n = c.ops;
        c.ops += 1;
        if let Some(at) = c.fail_at
            && (n == at || (c.persistent && n > at))
        {
            c.injected += 1;
            return Err(std::io::Error::other("injected I/O failure (countdown)"));
        }
        Ok(())
    }

    fn after_write(&self, pair: &mut PairCounting, other: &CrashBackend) {
        pair.ops += 1;
        if !pair.marked {
            return;
        }
        let Some((store, journal)) = pair.durable.clone() else {
            return;
        };
        let live = std::sync::Arc::new(self.inner.live_image());
        let other_live = other.live_image();
        // Both files' live and durable images, this file's first.
        let (mine, theirs) = match self.side {
            PairSide::Store => (store, journal),
            PairSide::Journal => (journal, store),
        };
        let theirs_live = if *theirs == other_live {
            None
        } else {
            Some(std::sync::Arc::new(other_live))
        };
        let ordered = |a: std::sync::Arc<Vec<u8>>, b: std::sync::Arc<Vec<u8>>| match self.side {
            PairSide::Store => (a, b),
            PairSide::Journal => (b, a),
        };
        let syncs = pair.syncs;
        let mine_kill = (live.clone(), mine);
        let theirs_kill = (
            theirs_live.clone().unwrap_or_else(|| theirs.clone()),
            theirs.clone(),
        );
        let (store_kill, journal_kill) = match self.side {
            PairSide::Store => (mine_kill, theirs_kill),
            PairSide::Journal => (theirs_kill, mine_kill),
        };
        pair.kills.push((syncs, store_kill, journal_kill));
        pair.torn.push((syncs, ordered(live.clone(), theirs)));
        if let Some(theirs_live) = theirs_live {
            pair.torn_both.push((syncs, ordered(live, theirs_live)));
        }
    }
}

impl idem::redb::StorageBackend for PairFile {
    fn len(&self) -> Result<u64, idem::redb::BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), idem::redb::BackendError> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), idem::redb::BackendError> {
        self.io()?;
        let mut pair = self.pair();
        self.inner.set_len(len)?;
        self.after_write(&mut pair, &self.other);
        Ok(())
    }
    fn sync_data(&self) -> Result<(), idem::redb::BackendError> {
        self.wait_while_held();
        self.io()?;
        // Both files frozen under the pair's lock: the snapshot is exactly this instant's.
        let mut pair = self.pair();
        self.inner.sync_data()?;
        pair.ops += 1;
        if pair.marked
            && let Some((store, journal)) = pair.durable.clone()
        {
            let mine = std::sync::Arc::new(self.inner.durable_image());
            let now = match self.side {
                PairSide::Store => (mine, journal),
                PairSide::Journal => (store, mine),
            };
            pair.syncs += 1;
            if self.side == PairSide::Store {
                pair.store_syncs += 1;
            }
            pair.snapshots.push(now.clone());
            pair.durable = Some(now);
        }
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), idem::redb::BackendError> {
        self.io()?;
        let mut pair = self.pair();
        self.inner.write(offset, data)?;
        if self.side == PairSide::Journal && offset >= 4096 {
            pair.journal_writes.push((offset, data.to_vec()));
        }
        self.after_write(&mut pair, &self.other);
        Ok(())
    }
}
