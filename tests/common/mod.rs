//! Shared helpers for the integration tests: a store on a temp file with a manual clock, an
//! effects table the closures write to, and ways to count those effects and to poke at the
//! raw file.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use idem::clock::ManualClock;
use idem::redb::{ReadableDatabase, ReadableTable, TableDefinition};
use idem::{
    BeginAnswer, Error, ExecuteAnswer, Lease, Request, Response, Scope, Store, StoreBuilder,
    Timestamp,
};
use tempfile::TempDir;

/// The full name of the test function `name` of the module whose `module_path!()` is
/// `module_path`, as the test harness knows it (for `--exact` when a test re-runs its own binary
/// as a child process): the module's path without the crate's name, then `name`.
pub fn test_name(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, module)) => format!("{module}::{name}"),
        None => name.to_owned(),
    }
}

/// A fixed, realistic start time for every manual clock (2023-11-14).
pub const T0: Timestamp = Timestamp(1_700_000_000_000);

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
        let builder = configure(journal_from_env(Store::builder())).clock(clock.clone());
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

/// The harness's stores open in the default mode, journal mode; `IDEM_TEST_JOURNAL=0` opens
/// them in direct mode (`StoreBuilder::journal(false)`: durable redb commits), where CI runs
/// the suites whose promises do not depend on the mode a second time.
pub fn journal_from_env(builder: StoreBuilder) -> StoreBuilder {
    match std::env::var("IDEM_TEST_JOURNAL").as_deref() {
        Ok("0") => builder.journal(false),
        _ => builder,
    }
}

/// Runs `callers` threads on `store`, thread `t` running `each(store, t)`, under a watchdog:
/// panics naming `hang` if they have not all finished within two minutes (a deadlock), or if
/// one panicked.
pub fn callers_under_watchdog(
    store: &Store,
    callers: usize,
    hang: &str,
    each: impl Fn(&Store, usize) + Send + Sync + 'static,
) {
    let store = store.clone();
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        std::thread::scope(|s| {
            for t in 0..callers {
                let (store, each) = (&store, &each);
                s.spawn(move || each(store, t));
            }
        });
        let _ = done.send(());
    });
    if finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .is_err()
    {
        panic!("the callers did not finish within two minutes ({hang})");
    }
    worker.join().expect("no caller panicked");
}

/// A request whose payload is canonical bytes.
pub fn req(tenant: &str, operation: &str, key: &str, payload: &[u8]) -> Request {
    Request::from_canonical_bytes(Scope::new(tenant, operation), key, payload)
}

/// Reads the effect counter `label` through the open store's read snapshot.
pub fn effects(store: &Store, label: &str) -> u64 {
    let read = store.read_transaction().expect("read txn");
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
pub fn executed(outcome: Result<ExecuteAnswer, Error>) -> Response {
    match outcome {
        Ok(ExecuteAnswer::Ran(r)) => r,
        other => panic!("expected ExecuteAnswer::Ran, got {other:?}"),
    }
}

#[track_caller]
pub fn replayed(outcome: Result<ExecuteAnswer, Error>) -> Response {
    match outcome {
        Ok(ExecuteAnswer::Replayed(r)) => r,
        other => panic!("expected ExecuteAnswer::Replayed, got {other:?}"),
    }
}

#[track_caller]
pub fn acquired(begin: Result<BeginAnswer, Error>) -> Lease {
    match begin {
        Ok(BeginAnswer::Acquired(lease)) => lease,
        other => panic!("expected BeginAnswer::Acquired, got {other:?}"),
    }
}

#[track_caller]
pub fn begin_replayed(begin: Result<BeginAnswer, Error>) -> Response {
    match begin {
        Ok(BeginAnswer::Replayed(r)) => r,
        other => panic!("expected BeginAnswer::Replayed, got {other:?}"),
    }
}

#[track_caller]
pub fn begin_in_flight(begin: Result<BeginAnswer, Error>) -> std::time::Duration {
    match begin {
        Ok(BeginAnswer::InFlight { retry_after }) => retry_after,
        other => panic!("expected BeginAnswer::InFlight, got {other:?}"),
    }
}

#[path = "../sim/effects.rs"]
mod effects;
#[allow(unused_imports)] // Not every test uses every helper.
pub use effects::{EFFECTS, all_effects, bump};

pub mod dump;
#[cfg(feature = "postgres")]
pub mod pg;
mod rng;
#[allow(unused_imports)] // Not every test draws random values.
pub use rng::{XorShift, random_bytes};

#[path = "../sim/backend.rs"]
mod backend;
#[allow(unused_imports)] // Not every test uses the fault backends.
pub use backend::*;

/// What a crash leaves: the durable image of a store opened with `builder` on an in-memory
/// backend, after `work` ran on it, taken before the store closes (no clean close).
pub fn crash_image(builder: StoreBuilder, work: impl FnOnce(&Store)) -> Vec<u8> {
    let backend = CrashBackend::default();
    let store = builder
        .open_with_backend(backend.clone())
        .expect("open on the crash backend");
    work(&store);
    let image = backend.durable_image();
    drop(store);
    image
}

/// Rows in idem's record table (records, inbox marks) seen through the open store.
pub fn record_rows(store: &Store) -> u64 {
    let read = store.read_transaction().expect("read txn");
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

/// Spawns `n` callers on `s`, `caller(i)` on the i-th, one at a time: each is queued for the
/// writer (held by a [`gate`]) before the next starts, so queue order is index order.
pub fn queue_callers<'s, 'e, T: Send + 's>(
    s: &'s std::thread::Scope<'s, 'e>,
    store: &'e Store,
    n: usize,
    caller: impl Fn(usize) -> T + Send + Sync + 's,
) -> Vec<std::thread::ScopedJoinHandle<'s, T>> {
    let caller = std::sync::Arc::new(caller);
    (0..n)
        .map(|i| {
            let caller = std::sync::Arc::clone(&caller);
            let handle = s.spawn(move || caller(i));
            wait_for_queue(store, i + 1);
            handle
        })
        .collect()
}

/// Holds the writer from a scoped thread until the returned sender is used: every caller that
/// arrives meanwhile queues, and joins the gate's batch when it is released (a batch admits
/// the callers queued while it ran before it commits). Only the gate's first run holds: a
/// re-run (a failing member behind it in the batch) goes straight through. The gate must end
/// `Ran`. Returns once the gate holds the writer.
pub fn gate<'s, 'e>(
    s: &'s std::thread::Scope<'s, 'e>,
    store: &'e Store,
) -> (
    std::sync::mpsc::Sender<()>,
    std::thread::ScopedJoinHandle<'s, ()>,
) {
    let (release_tx, answer) = gate_answered(s, store);
    let handle = s.spawn(move || {
        executed(answer.join().expect("the gate's thread"));
    });
    (release_tx, handle)
}

/// [`gate`], whose handle returns the gate's own answer (for a test in which the gate's batch
/// fails).
pub fn gate_answered<'s, 'e>(
    s: &'s std::thread::Scope<'s, 'e>,
    store: &'e Store,
) -> (
    std::sync::mpsc::Sender<()>,
    std::thread::ScopedJoinHandle<'s, Result<ExecuteAnswer, Error>>,
) {
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let handle = s.spawn(move || {
        let mut first = true;
        store.execute(req("t", "op", "gate", b"p"), |_| {
            if std::mem::take(&mut first) {
                held_tx.send(()).expect("test alive");
                release_rx.recv().expect("released");
            }
            Ok(Response::new(200, "gate"))
        })
    });
    held_rx.recv().expect("gate holds the writer");
    (release_tx, handle)
}

/// Runs `work` on a store opened with `builder` on simulated disks (the file and the journal),
/// then writes what a crash right after it leaves (both disks' durable images) at `path` and
/// its journal's path. With checkpoints far apart, the journal's entries are live: answers the
/// store file lacks.
pub fn files_a_crash_leaves(path: &Path, builder: StoreBuilder, work: impl FnOnce(&Store)) {
    let (db, jr) = (CrashBackend::default(), CrashBackend::default());
    let store = builder
        .open_with_backends(db.clone(), jr.clone())
        .expect("open on the simulated disks");
    work(&store);
    let (jr_image, db_image) = (jr.durable_image(), db.durable_image());
    drop(store);
    std::fs::write(path, db_image).expect("write the store file");
    std::fs::write(idem::store::journal_path(path), jr_image).expect("write the journal");
}
