//! Shared helpers for the integration tests: a store on a temp file with a manual clock, an
//! effects table the closures write to, and ways to count those effects and to poke at the
//! raw file.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use idem::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use idem::{
    Abort, Begin, Error, Lease, ManualClock, Outcome, Request, Response, Scope, Store,
    StoreBuilder, Timestamp, Tx,
};
use tempfile::TempDir;

/// A fixed, realistic start time for every manual clock (2023-11-14).
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

/// The caller's own table: effect label → how many times the effect happened.
pub const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("test.effects");

/// idem's record table, as documented in docs/FORMAT.md (only opened on a closed store).
pub const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");

/// idem's metadata table.
pub const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idem.meta.v1");

/// A store on a fresh temp file, driven by a manual clock.
pub struct Harness {
    pub dir: TempDir,
    pub path: PathBuf,
    pub clock: ManualClock,
    builder: StoreBuilder,
    store: Option<Store>,
}

impl Harness {
    /// Default settings, manual clock at [`T0`].
    pub fn new() -> Self {
        Self::with(|b| b)
    }

    /// Custom settings; the manual clock is added by the harness.
    pub fn with(configure: impl FnOnce(StoreBuilder) -> StoreBuilder) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("idem.redb");
        let clock = ManualClock::new(T0);
        let builder = configure(Store::builder()).clock(clock.clone());
        let store = builder.clone().open(&path).expect("open store");
        Harness {
            dir,
            path,
            clock,
            builder,
            store: Some(store),
        }
    }

    /// The open store.
    pub fn store(&self) -> &Store {
        self.store.as_ref().expect("store is closed")
    }

    /// Drops the store (releasing the file), so the raw file can be read or edited.
    pub fn close(&mut self) {
        self.store = None;
    }

    /// Opens the store again on the same file, with the same settings and clock.
    pub fn reopen(&mut self) {
        self.store = None;
        self.store = Some(self.builder.clone().open(&self.path).expect("reopen store"));
    }
}

/// A request whose payload is canonical bytes.
pub fn req(tenant: &str, operation: &str, key: &str, payload: &[u8]) -> Request {
    Request::from_canonical_bytes(Scope::new(tenant, operation), key, payload)
}

/// Increments the effect counter `label` in the caller's table, inside the closure's
/// transaction.
pub fn bump(tx: &Tx<'_>, label: &str) -> Result<(), Abort> {
    let mut table = tx.open_table(EFFECTS)?;
    let n = table.get(label)?.map_or(0, |v| v.value());
    table.insert(label, n + 1)?;
    Ok(())
}

/// Reads the effect counter `label` through the open store's read snapshot.
pub fn effects(store: &Store, label: &str) -> u64 {
    let read = store.begin_read().expect("read txn");
    let table = match read.open_table(EFFECTS) {
        Ok(t) => t,
        Err(idem::redb::TableError::TableDoesNotExist(_)) => return 0,
        Err(e) => panic!("open effects table: {e}"),
    };
    table
        .get(label)
        .expect("read effects")
        .map_or(0, |v| v.value())
}

/// Reads the effect counter `label` straight from a closed store file.
pub fn effects_in_file(path: &Path, label: &str) -> u64 {
    let db = idem::redb::Database::open(path).expect("open redb file");
    let read = db.begin_read().expect("read txn");
    let table = match read.open_table(EFFECTS) {
        Ok(t) => t,
        Err(idem::redb::TableError::TableDoesNotExist(_)) => return 0,
        Err(e) => panic!("open effects table: {e}"),
    };
    table
        .get(label)
        .expect("read effects")
        .map_or(0, |v| v.value())
}

/// The record key of docs/FORMAT.md: `0x01`, then tenant, operation and key, each as a
/// big-endian u16 length followed by the bytes.
pub fn record_key(tenant: &str, operation: &str, key: &[u8]) -> Vec<u8> {
    let mut out = vec![0x01];
    for part in [tenant.as_bytes(), operation.as_bytes(), key] {
        let len = u16::try_from(part.len()).expect("part fits u16");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

/// Reads the raw stored value of a record from a closed store file.
pub fn raw_record(path: &Path, record_key: &[u8]) -> Option<Vec<u8>> {
    let db = idem::redb::Database::open(path).expect("open redb file");
    let read = db.begin_read().expect("read txn");
    let table = read.open_table(RECORDS).expect("records table");
    table
        .get(record_key)
        .expect("read record")
        .map(|v| v.value().to_vec())
}

/// Overwrites the raw stored value of a record in a closed store file.
pub fn overwrite_record(path: &Path, record_key: &[u8], value: &[u8]) {
    let db = idem::redb::Database::open(path).expect("open redb file");
    let write = db.begin_write().expect("write txn");
    {
        let mut table = write.open_table(RECORDS).expect("records table");
        table.insert(record_key, value).expect("overwrite record");
    }
    write.commit().expect("commit");
}

#[track_caller]
pub fn executed(outcome: Result<Outcome, Error>) -> Response {
    match outcome {
        Ok(Outcome::Executed(r)) => r,
        other => panic!("expected Outcome::Executed, got {other:?}"),
    }
}

#[track_caller]
pub fn replayed(outcome: Result<Outcome, Error>) -> Response {
    match outcome {
        Ok(Outcome::Replayed(r)) => r,
        other => panic!("expected Outcome::Replayed, got {other:?}"),
    }
}

#[track_caller]
pub fn acquired(begin: Result<Begin, Error>) -> Lease {
    match begin {
        Ok(Begin::Acquired(lease)) => lease,
        other => panic!("expected Begin::Acquired, got {other:?}"),
    }
}

#[track_caller]
pub fn begin_replayed(begin: Result<Begin, Error>) -> Response {
    match begin {
        Ok(Begin::Replayed(r)) => r,
        other => panic!("expected Begin::Replayed, got {other:?}"),
    }
}

#[track_caller]
pub fn begin_in_flight(begin: Result<Begin, Error>) -> std::time::Duration {
    match begin {
        Ok(Begin::InFlight { retry_after }) => retry_after,
        other => panic!("expected Begin::InFlight, got {other:?}"),
    }
}

/// An in-memory redb backend that keeps two images — what was written (live) and what the
/// last `sync_data` made durable — and can fail writes and syncs on demand. A "crash" opens a
/// new backend over the durable image only.
#[derive(Debug, Clone, Default)]
pub struct CrashBackend {
    images: std::sync::Arc<std::sync::Mutex<Images>>,
    pub failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
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
        if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("injected I/O failure"));
        }
        Ok(())
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
        }
    }
}

impl idem::redb::StorageBackend for CrashBackend {
    fn len(&self) -> std::io::Result<u64> {
        Ok(self.images().live.len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let images = self.images();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + out.len();
        if end > images.live.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "read past the end",
            ));
        }
        out.copy_from_slice(&images.live[start..end]);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.check()?;
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        self.images().live.resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.check()?;
        let mut images = self.images();
        images.durable = images.live.clone();
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
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

/// A [`CrashBackend`] over a given durable image (the image a crash at some sync left).
pub fn crash_backend_from_image(image: Vec<u8>) -> CrashBackend {
    CrashBackend {
        images: std::sync::Arc::new(std::sync::Mutex::new(Images {
            live: image.clone(),
            durable: image,
        })),
        failing: Default::default(),
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
    fn len(&self) -> std::io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.io()?;
        self.inner.set_len(len)?;
        self.after_write();
        Ok(())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.io()?;
        // Hold the counter lock across the sync so the snapshot is exactly this sync's image.
        let mut c = self.counting();
        self.inner.sync_data()?;
        let durable = self.inner.images().durable.clone();
        c.syncs += 1;
        c.snapshots.push(durable);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.io()?;
        self.inner.write(offset, data)?;
        self.after_write();
        Ok(())
    }
}

/// Every effect counter in the caller's table (label → count).
pub fn all_effects(store: &Store) -> Vec<(String, u64)> {
    let read = store.begin_read().expect("read txn");
    let table = match read.open_table(EFFECTS) {
        Ok(t) => t,
        Err(idem::redb::TableError::TableDoesNotExist(_)) => return Vec::new(),
        Err(e) => panic!("open effects table: {e}"),
    };
    table
        .iter()
        .expect("iter effects")
        .map(|row| {
            let (k, v) = row.expect("effects row");
            (k.value().to_owned(), v.value())
        })
        .collect()
}

/// Rows in idem's record table (records, inbox marks) seen through the open store.
pub fn record_rows(store: &Store) -> u64 {
    let read = store.begin_read().expect("read txn");
    match read.open_table(RECORDS) {
        Ok(t) => idem::redb::ReadableTableMetadata::len(&t).expect("len"),
        Err(idem::redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => panic!("open records table: {e}"),
    }
}

/// Waits (bounded) until `n` callers are queued for the next group commit: the way the
/// group-commit tests build a batch deterministically behind a caller that holds the writer.
pub fn wait_for_queue(store: &Store, n: usize) {
    for _ in 0..20_000 {
        if store.metrics().queued >= n {
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    panic!("callers never queued: {} of {n}", store.metrics().queued);
}
