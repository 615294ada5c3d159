//! The store: opening, configuration, flow A (`execute`) and the claim half of flow B (`begin`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use redb::{ReadableDatabase, ReadableTable, StorageBackend, WriteTransaction};

use crate::clock::{Clock, SystemClock, Timestamp};
use crate::decision::{Decision, decide};
use crate::error::{Abort, Error};
use crate::lease::Lease;
use crate::record::{FORMAT_VERSION, HolderToken, Record, State};
use crate::response::{Begin, Outcome, Response};
use crate::scope::{Limits, Request, Scope, record_key};
use crate::tables::{META, META_FORMAT, RECORDS};
use crate::tx::Tx;

/// Settings, fixed when the store opens. See [`StoreBuilder`] for defaults.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub retention: Duration,
    pub retention_overrides: HashMap<String, Duration>,
    pub lease_duration: Duration,
    pub retry_after_cap: Duration,
    pub limits: Limits,
    pub max_response_bytes: usize,
}

impl Config {
    pub(crate) fn retention_for(&self, operation: &str) -> Duration {
        self.retention_overrides
            .get(operation)
            .copied()
            .unwrap_or(self.retention)
    }
}

/// Builds a [`Store`]. Every setting has a documented default:
///
/// | setting | default |
/// |---|---|
/// | [`retention`](Self::retention) | 24 h (Stripe keeps keys ≥ 24 h) |
/// | [`retention_for`](Self::retention_for) | none (per-operation override) |
/// | [`lease_duration`](Self::lease_duration) | 30 s |
/// | [`retry_after_cap`](Self::retry_after_cap) | 1 s |
/// | [`limits`](Self::limits) | key ≤ 255 B, tenant ≤ 128 B, operation ≤ 128 B |
/// | [`max_response_bytes`](Self::max_response_bytes) | 64 KiB |
/// | [`clock`](Self::clock) | [`SystemClock`] |
/// | [`cache_size`](Self::cache_size) | redb's default |
#[derive(Debug, Clone)]
pub struct StoreBuilder {
    config: Config,
    clock: Arc<dyn Clock>,
    cache_size: Option<usize>,
}

impl Default for StoreBuilder {
    fn default() -> Self {
        StoreBuilder {
            config: Config {
                retention: Duration::from_secs(24 * 3600),
                retention_overrides: HashMap::new(),
                lease_duration: Duration::from_secs(30),
                retry_after_cap: Duration::from_secs(1),
                limits: Limits::default(),
                max_response_bytes: 64 * 1024,
            },
            clock: Arc::new(SystemClock),
            cache_size: None,
        }
    }
}

impl StoreBuilder {
    /// A builder with the defaults above.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a finished record is kept (and replayed) after it finished. Choose the longest
    /// of your client-retry, queue-redrive, webhook-replay, operator-replay and settlement
    /// windows. Must be at least the lease duration.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.config.retention = retention;
        self
    }

    /// A retention for one operation, overriding [`retention`](Self::retention).
    pub fn retention_for(mut self, operation: impl Into<String>, retention: Duration) -> Self {
        self.config
            .retention_overrides
            .insert(operation.into(), retention);
        self
    }

    /// How long a flow-B lease lives without a heartbeat.
    pub fn lease_duration(mut self, lease: Duration) -> Self {
        self.config.lease_duration = lease;
        self
    }

    /// The longest `retry_after` hint given with an in-flight answer (the hint is the lease's
    /// remaining time, capped by this).
    pub fn retry_after_cap(mut self, cap: Duration) -> Self {
        self.config.retry_after_cap = cap;
        self
    }

    /// Size limits on tenant, operation and key.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.config.limits = limits;
        self
    }

    /// The largest stored response (body plus resource pointer), in bytes.
    pub fn max_response_bytes(mut self, bytes: usize) -> Self {
        self.config.max_response_bytes = bytes;
        self
    }

    /// The clock every expiry and lease decision reads (inject a [`crate::ManualClock`] in
    /// tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// redb's page cache size in bytes.
    pub fn cache_size(mut self, bytes: usize) -> Self {
        self.cache_size = Some(bytes);
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let c = &self.config;
        c.limits.validate()?;
        if c.lease_duration.is_zero() {
            return Err(Error::Config {
                reason: "lease_duration is zero; give leases time to finish (default 30 s)".into(),
            });
        }
        let too_short = std::iter::once(("the default retention", c.retention)).chain(
            c.retention_overrides
                .values()
                .map(|d| ("a per-operation retention", *d)),
        );
        for (what, r) in too_short {
            if r < c.lease_duration {
                return Err(Error::Config {
                    reason: format!(
                        "{what} ({r:?}) is shorter than the lease duration ({:?}): a record must outlive its lease",
                        c.lease_duration
                    ),
                });
            }
        }
        if c.max_response_bytes > MAX_RESPONSE_CEILING {
            return Err(Error::Config {
                reason: format!(
                    "max_response_bytes is {}; the ceiling is {MAX_RESPONSE_CEILING}: store a pointer instead of a large body",
                    c.max_response_bytes
                ),
            });
        }
        Ok(())
    }

    fn redb_builder(&self) -> redb::Builder {
        let mut b = redb::Database::builder();
        if let Some(bytes) = self.cache_size {
            b.set_cache_size(bytes);
        }
        b
    }

    /// Opens (or creates) the store file at `path`.
    pub fn open(self, path: impl AsRef<Path>) -> Result<Store, Error> {
        self.validate()?;
        let db = self.redb_builder().create(path)?;
        Store::init(db, self)
    }

    /// Opens (or creates) a store on a custom redb storage backend (an in-memory or
    /// fault-injecting backend in tests).
    pub fn open_with_backend(self, backend: impl StorageBackend) -> Result<Store, Error> {
        self.validate()?;
        let db = self.redb_builder().create_with_backend(backend)?;
        Store::init(db, self)
    }
}

/// Ceiling for `max_response_bytes`: records are meant to be small.
const MAX_RESPONSE_CEILING: usize = 16 * 1024 * 1024;

/// Granularity of `begin_wait`'s polling (it is also woken at once by local completions).
const WAIT_POLL: Duration = Duration::from_millis(20);

pub(crate) struct Inner {
    pub(crate) db: redb::Database,
    pub(crate) config: Config,
    pub(crate) clock: Arc<dyn Clock>,
    /// The first I/O or commit failure; once set, every write is refused (fail-stop).
    failure: Mutex<Option<String>>,
    /// Random per-instance prefix of holder tokens.
    instance: [u8; 8],
    next_token: AtomicU64,
    /// Bumped and broadcast after every commit, so `begin_wait` wakes at once.
    commits: Mutex<u64>,
    committed: Condvar,
}

/// An embedded idempotency store on one redb file. Cheap to clone (clones share the file);
/// `Send + Sync`.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("config", &self.inner.config)
            .field("failure", &*self.inner.failure.lock())
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) a store at `path` with the default settings.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, Error> {
        StoreBuilder::new().open(path)
    }

    /// A builder for non-default settings.
    pub fn builder() -> StoreBuilder {
        StoreBuilder::new()
    }

    fn init(db: redb::Database, b: StoreBuilder) -> Result<Store, Error> {
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        // Create the tables and check (or write) the format marker.
        let txn = db.begin_write()?;
        {
            let mut meta = txn.open_table(META)?;
            let found = meta.get(META_FORMAT)?.map(|v| v.value().to_vec());
            match found.as_deref() {
                None => {
                    meta.insert(META_FORMAT, [FORMAT_VERSION].as_slice())?;
                }
                Some([v]) if *v == FORMAT_VERSION => {}
                Some([v]) => {
                    return Err(Error::UnsupportedFormat {
                        found: *v,
                        supported: FORMAT_VERSION,
                    });
                }
                Some(other) => {
                    return Err(Error::CorruptStore {
                        reason: format!("format marker is {} bytes, expected 1", other.len()),
                    });
                }
            }
            txn.open_table(RECORDS)?;
        }
        txn.commit()
            .map_err(|e| Error::OutcomeUnknown { source: e.into() })?;
        Ok(Store {
            inner: Arc::new(Inner {
                db,
                config: b.config,
                clock: b.clock,
                failure: Mutex::new(None),
                instance,
                next_token: AtomicU64::new(0),
                commits: Mutex::new(0),
                committed: Condvar::new(),
            }),
        })
    }

    /// Flow A: runs `f` at most once per intent, in the same write transaction that records the
    /// result.
    ///
    /// - a finished intent is replayed from a read transaction: `f` does not run, no write
    ///   transaction is opened, the stored status and body come back byte for byte;
    /// - otherwise `f` runs inside the write transaction, after the record was re-read under
    ///   redb's writer lock (no check-then-act gap), and its result decides what commits:
    ///   `Ok(response)` → Completed; [`Abort::Terminal`] → Failed (replayed later);
    ///   [`Abort::Retryable`] / [`Abort::Store`] → nothing, not even `f`'s own writes;
    /// - another attempt's live lease → [`Outcome::InFlight`];
    /// - the key used with a different payload → [`Error::PayloadMismatch`].
    ///
    /// The contract allows `f` to be called more than once per call (a batched commit path may
    /// have to re-run it); today it is called at most once. Either way it must only have effects
    /// through the [`Tx`]: only the committed call's writes persist.
    ///
    /// A replay normally comes from a read transaction. If the intent finishes while this call
    /// waits for redb's writer lock, the replay is read inside that write transaction, which is
    /// then aborted without writing anything.
    pub fn execute<F>(&self, request: Request, mut f: F) -> Result<Outcome, Error>
    where
        F: FnMut(&Tx<'_>) -> Result<Response, Abort>,
    {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &key)? {
            return early.into_outcome();
        }
        self.check_writable()?;
        let txn = self.begin_write()?;
        let now = self.now();
        let created_at = match self.decide_in(&txn, &request, &key, now)? {
            Claimed::Early(early) => return early.into_outcome(),
            Claimed::Free { created_at, .. } => created_at,
        };
        let result = self.run_closure(|| f(&Tx::new(&txn, now)));
        let (state, response) = match result {
            Ok(response) => {
                let response = response.mark_succeeded();
                (State::Completed(response.clone()), response)
            }
            Err(Abort::Terminal(response)) => {
                let response = response.mark_failed();
                (State::Failed(response.clone()), response)
            }
            Err(Abort::Retryable(source)) => {
                self.abort(txn);
                return Err(Error::Aborted { source });
            }
            Err(Abort::Store(e)) => {
                self.abort(txn);
                return Err(self.observe(e));
            }
        };
        if let Err(e) = self.check_response(&response) {
            self.abort(txn);
            return Err(e);
        }
        let record = Record {
            fingerprint: *request.fingerprint(),
            created_at,
            expires_at: now
                .saturating_add(self.inner.config.retention_for(request.scope().operation())),
            state,
        };
        self.put(&txn, &key, &record)?;
        self.commit(txn)?;
        Ok(Outcome::Executed(response))
    }

    /// Flow B: claims the key with a lease for work that calls the outside world. Returns
    /// [`Begin::Acquired`] with a [`Lease`] (the attempt may now make the external call, using
    /// [`Lease::downstream_key`]), or the stored result, or [`Begin::InFlight`]; a different
    /// payload is [`Error::PayloadMismatch`]. Fails fast; see [`Store::begin_wait`] to wait.
    pub fn begin(&self, request: Request) -> Result<Begin, Error> {
        let key = self.admit(&request)?;
        if let Some(early) = self.read_path(&request, &key)? {
            return early.into_begin();
        }
        self.check_writable()?;
        let txn = self.begin_write()?;
        let now = self.now();
        let (created_at, attempt) = match self.decide_in(&txn, &request, &key, now)? {
            Claimed::Early(early) => return early.into_begin(),
            Claimed::Free {
                created_at,
                attempt,
            } => (created_at, attempt),
        };
        let holder = self.new_token();
        let lease_deadline = now.saturating_add(self.inner.config.lease_duration);
        let expires_at = now
            .saturating_add(self.inner.config.retention_for(request.scope().operation()))
            .max(lease_deadline);
        let record = Record {
            fingerprint: *request.fingerprint(),
            created_at,
            expires_at,
            state: State::Pending {
                holder,
                lease_deadline,
                attempt,
            },
        };
        self.put(&txn, &key, &record)?;
        self.commit(txn)?;
        Ok(Begin::Acquired(Lease::new(
            self.clone(),
            request,
            key,
            holder,
            lease_deadline,
            attempt,
        )))
    }

    /// Like [`Store::begin`], but when another attempt is in flight, waits up to `max_wait` for
    /// it to finish (returning its result), release (acquiring the key) or lapse (taking it
    /// over). Returns [`Begin::InFlight`] if it is still in flight after `max_wait`. Woken at
    /// once by every commit of this store; re-checks every 20 ms to notice a lapsing lease.
    /// `Duration::MAX` waits without a deadline.
    pub fn begin_wait(&self, request: Request, max_wait: Duration) -> Result<Begin, Error> {
        // `None`: a wait so long that the deadline is not representable, i.e. no deadline.
        let give_up = Instant::now().checked_add(max_wait);
        loop {
            let seen = *self.inner.commits.lock();
            match self.begin(request.clone())? {
                Begin::InFlight { retry_after } => {
                    let now = Instant::now();
                    let slice = match give_up {
                        Some(t) if now >= t => return Ok(Begin::InFlight { retry_after }),
                        Some(t) => (t - now).min(WAIT_POLL),
                        None => WAIT_POLL,
                    };
                    let mut commits = self.inner.commits.lock();
                    if *commits == seen {
                        let _ = self.inner.committed.wait_for(&mut commits, slice);
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// The stored record for `key` in `scope`, exactly as stored (it may be past its
    /// `expires_at`; see [`crate::is_expired`]). For inspection and tests; never needed to
    /// use the store correctly.
    pub fn get(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Option<Record>, Error> {
        let request = Request::with_fingerprint(scope.clone(), key, crate::Fingerprint([0; 32]));
        let key = self.admit(&request)?;
        self.read_record(&key)
    }

    /// A read transaction on the store's file, for reading your own tables (e.g. to serve a
    /// `GET` of a resource a flow-A closure created). It sees a consistent snapshot.
    pub fn begin_read(&self) -> Result<redb::ReadTransaction, Error> {
        self.inner.db.begin_read().map_err(|e| self.storage(e))
    }

    /// Removes the record for `key` in `scope`, whatever its state, and returns whether one
    /// existed. An operator's tool for a record that fails to decode ([`Error::CorruptRecord`])
    /// or must be forgotten: the key becomes free, so a retry of the intent **runs again**, and a
    /// live lease on it is fenced out ([`Error::LeaseLost`]).
    pub fn purge(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let request = Request::with_fingerprint(scope.clone(), key, crate::Fingerprint([0; 32]));
        let key = self.admit(&request)?;
        self.check_writable()?;
        let txn = self.begin_write()?;
        let existed = {
            let mut table = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
            table
                .remove(key.as_slice())
                .map_err(|e| self.storage(e))?
                .is_some()
        };
        self.commit(txn)?;
        Ok(existed)
    }

    /// The store's current time.
    pub fn now(&self) -> Timestamp {
        self.inner.clock.now()
    }

    /// The first I/O or commit failure, if the store is fail-stopped.
    pub fn failure(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    // ---- shared plumbing (also used by Lease) ----

    fn admit(&self, request: &Request) -> Result<Vec<u8>, Error> {
        self.inner.config.limits.check(request)?;
        Ok(record_key(request))
    }

    /// The lock-free path: a read transaction answers replays, mismatches and in-flight keys.
    fn read_path(&self, request: &Request, key: &[u8]) -> Result<Option<Early>, Error> {
        let stored = self.read_record(key)?;
        Ok(self.early(
            decide(stored.as_ref(), request.fingerprint(), self.now()),
            request,
        ))
    }

    fn decide_in(
        &self,
        txn: &WriteTransaction,
        request: &Request,
        key: &[u8],
        now: Timestamp,
    ) -> Result<Claimed, Error> {
        let stored = self.load(txn, key)?;
        let decision = decide(stored.as_ref(), request.fingerprint(), now);
        if let Some(early) = self.early(decision.clone(), request) {
            return Ok(Claimed::Early(early));
        }
        Ok(match (decision, &stored) {
            // A takeover keeps the intent's original creation time.
            (Decision::Takeover { attempt }, Some(r)) => Claimed::Free {
                created_at: r.created_at,
                attempt,
            },
            _ => Claimed::Free {
                created_at: now,
                attempt: 1,
            },
        })
    }

    fn early(&self, decision: Decision<'_>, request: &Request) -> Option<Early> {
        match decision {
            Decision::Claim | Decision::Takeover { .. } => None,
            Decision::Replay(r) => Some(Early::Replay(r.clone())),
            Decision::Mismatch => Some(Early::Mismatch(Error::PayloadMismatch {
                tenant: request.scope().tenant().to_owned(),
                operation: request.scope().operation().to_owned(),
                key: request.key_display(),
            })),
            Decision::InFlight { lease_deadline } => Some(Early::InFlight {
                retry_after: lease_deadline
                    .saturating_since(self.now())
                    .min(self.inner.config.retry_after_cap)
                    .max(Duration::from_millis(1)),
            }),
        }
    }

    pub(crate) fn read_record(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        let read = self.inner.db.begin_read().map_err(|e| self.storage(e))?;
        let table = read.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Record::decode(v.value())).transpose()
    }

    pub(crate) fn load(&self, txn: &WriteTransaction, key: &[u8]) -> Result<Option<Record>, Error> {
        let table = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Record::decode(v.value())).transpose()
    }

    pub(crate) fn put(
        &self,
        txn: &WriteTransaction,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Error> {
        let mut table = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
        table
            .insert(key, record.encode().as_slice())
            .map_err(|e| self.storage(e))?;
        Ok(())
    }

    pub(crate) fn remove(&self, txn: &WriteTransaction, key: &[u8]) -> Result<(), Error> {
        let mut table = txn.open_table(RECORDS).map_err(|e| self.storage(e))?;
        table.remove(key).map_err(|e| self.storage(e))?;
        Ok(())
    }

    pub(crate) fn check_response(&self, response: &Response) -> Result<(), Error> {
        let len = response.stored_len();
        let max = self.inner.config.max_response_bytes;
        if len > max {
            return Err(Error::ResponseTooLarge { len, max });
        }
        Ok(())
    }

    pub(crate) fn check_writable(&self) -> Result<(), Error> {
        match &*self.inner.failure.lock() {
            Some(cause) => Err(Error::FailStopped {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    pub(crate) fn begin_write(&self) -> Result<WriteTransaction, Error> {
        if self.in_closure() {
            return Err(Error::Reentrant);
        }
        self.inner.db.begin_write().map_err(|e| self.storage(e))
    }

    /// Runs the caller's closure, marking this thread as inside this store's write
    /// transaction so a nested write call fails fast with [`Error::Reentrant`] instead of
    /// waiting forever on redb's writer lock.
    pub(crate) fn run_closure<T>(&self, f: impl FnOnce() -> T) -> T {
        struct Unmark(usize);
        impl Drop for Unmark {
            fn drop(&mut self) {
                IN_CLOSURE.with_borrow_mut(|v| {
                    if let Some(i) = v.iter().rposition(|&p| p == self.0) {
                        v.remove(i);
                    }
                });
            }
        }
        let id = self.id();
        IN_CLOSURE.with_borrow_mut(|v| v.push(id));
        let _unmark = Unmark(id);
        f()
    }

    fn in_closure(&self) -> bool {
        let id = self.id();
        IN_CLOSURE.with_borrow(|v| v.contains(&id))
    }

    /// Identity of the shared store state (clones of a Store share it).
    fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// Commits; any failure latches fail-stop and reports an unknown outcome.
    pub(crate) fn commit(&self, txn: WriteTransaction) -> Result<(), Error> {
        if let Err(e) = txn.commit() {
            let source: redb::Error = e.into();
            self.latch(&source);
            return Err(Error::OutcomeUnknown { source });
        }
        let mut commits = self.inner.commits.lock();
        *commits = commits.wrapping_add(1);
        self.inner.committed.notify_all();
        Ok(())
    }

    /// Aborts a transaction; a failure to abort is an I/O failure and latches.
    pub(crate) fn abort(&self, txn: WriteTransaction) {
        if let Err(e) = txn.abort() {
            self.latch(&e);
        }
    }

    /// Wraps a redb error, latching fail-stop when it is an I/O-level failure.
    pub(crate) fn storage(&self, e: impl Into<redb::Error>) -> Error {
        self.observe(Error::Storage { source: e.into() })
    }

    /// Latches fail-stop if `e` reports an I/O-level failure; returns `e`.
    pub(crate) fn observe(&self, e: Error) -> Error {
        match &e {
            Error::Storage { source } if is_io_failure(source) => self.latch(source),
            Error::OutcomeUnknown { source } => self.latch(source),
            _ => {}
        }
        e
    }

    fn latch(&self, cause: &dyn std::fmt::Display) {
        let mut failure = self.inner.failure.lock();
        if failure.is_none() {
            *failure = Some(cause.to_string());
        }
    }

    fn new_token(&self) -> HolderToken {
        let n = self.inner.next_token.fetch_add(1, Ordering::Relaxed);
        let mut t = [0u8; 16];
        t[..8].copy_from_slice(&self.inner.instance);
        t[8..].copy_from_slice(&n.to_be_bytes());
        HolderToken(t)
    }
}

thread_local! {
    /// Stores whose write transaction is running a caller closure on this thread.
    static IN_CLOSURE: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// redb errors that mean the file or the disk misbehaved (as opposed to misuse).
fn is_io_failure(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Io(_)
            | redb::Error::PreviousIo
            | redb::Error::Corrupted(_)
            | redb::Error::LockPoisoned(_)
            | redb::Error::DatabaseClosed
            | redb::Error::TransactionPoisoned
    )
}

/// An answer reached without running anything.
enum Early {
    Replay(Response),
    Mismatch(Error),
    InFlight { retry_after: Duration },
}

impl Early {
    fn into_outcome(self) -> Result<Outcome, Error> {
        match self {
            Early::Replay(r) => Ok(Outcome::Replayed(r)),
            Early::Mismatch(e) => Err(e),
            Early::InFlight { retry_after } => Ok(Outcome::InFlight { retry_after }),
        }
    }

    fn into_begin(self) -> Result<Begin, Error> {
        match self {
            Early::Replay(r) => Ok(Begin::Replayed(r)),
            Early::Mismatch(e) => Err(e),
            Early::InFlight { retry_after } => Ok(Begin::InFlight { retry_after }),
        }
    }
}

enum Claimed {
    Early(Early),
    Free { created_at: Timestamp, attempt: u32 },
}
