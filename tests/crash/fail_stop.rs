//! The first I/O or commit failure latches the store: it refuses writes until reopened, and the
//! failed commit is reported as an unknown outcome, never as success.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem::redb::backends::InMemoryBackend;
use idem::redb::{BackendError, StorageBackend};

use idem::clock::ManualClock;
use idem::{BeginAnswer, Error, ExecuteAnswer, Request, Response, Scope, Store, Timestamp};

/// An in-memory backend whose writes and syncs fail while `failing` is set. The bytes live in
/// an `Arc`, so a "reopen" can build a new backend over the same image.
#[derive(Debug, Clone)]
struct FaultyBackend {
    inner: Arc<InMemoryBackend>,
    failing: Arc<AtomicBool>,
    /// Reads fail too while set (the disk is gone, not only full).
    failing_reads: Arc<AtomicBool>,
}

impl FaultyBackend {
    fn new() -> Self {
        FaultyBackend {
            inner: Arc::new(InMemoryBackend::new()),
            failing: Arc::new(AtomicBool::new(false)),
            failing_reads: Arc::new(AtomicBool::new(false)),
        }
    }

    /// A backend over the same bytes that does not fail.
    fn reopened(&self) -> Self {
        FaultyBackend {
            inner: self.inner.clone(),
            ..FaultyBackend::new()
        }
    }

    fn fail_if_set(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected I/O failure"));
        }
        Ok(())
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> Result<u64, BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        if self.failing_reads.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected read failure").into());
        }
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        self.fail_if_set()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        self.fail_if_set()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.fail_if_set()?;
        self.inner.write(offset, data)
    }
}

fn req(key: &str) -> Request {
    Request::from_canonical_bytes(Scope::new("t", "op"), key, b"payload")
}

fn ok(_: &idem::Tx<'_>) -> Result<Response, idem::Abort> {
    Ok(Response::new(200, "done"))
}

#[test]
fn a_failed_commit_is_outcome_unknown_and_latches_until_reopen() {
    let backend = FaultyBackend::new();
    let store = Store::builder()
        .open_with_backend(backend.clone())
        .expect("open");
    assert!(matches!(
        store.execute(req("before"), ok),
        Ok(ExecuteAnswer::Ran(_))
    ));

    backend.failing.store(true, Ordering::SeqCst);
    let err = store
        .execute(req("during"), ok)
        .expect_err("commit must fail");
    assert!(
        matches!(err, Error::OutcomeUnknown { .. } | Error::Storage { .. }),
        "got {err:?}"
    );
    assert!(store.fail_stop_cause().is_some(), "the failure is latched");

    // The disk recovers, but the store stays stopped: no write path runs.
    backend.failing.store(false, Ordering::SeqCst);
    let mut ran = false;
    let err = store
        .execute(req("after"), |_| {
            ran = true;
            Ok(Response::new(200, "x"))
        })
        .expect_err("fail-stopped");
    assert!(matches!(err, Error::FailStopped { .. }), "got {err:?}");
    assert!(!ran, "the closure never runs on a fail-stopped store");
    assert!(matches!(
        store.begin(req("lease")),
        Err(Error::FailStopped { .. })
    ));
    // A replay too is refused, naming the first failure: the answer after a failure does not
    // depend on what redb still has cached. A plain read is still served.
    match store.execute(req("before"), ok) {
        Err(Error::FailStopped { cause }) => {
            assert!(cause.contains("injected I/O failure"), "{cause}")
        }
        other => panic!("a replay on a fail-stopped store: {other:?}"),
    }
    assert!(
        store
            .get(&Scope::new("t", "op"), "before")
            .expect("get")
            .is_some()
    );
    drop(store);

    // Reopen over the same bytes: writes work again, the acknowledged record survived.
    let reopened = Store::builder()
        .open_with_backend(backend.reopened())
        .expect("reopen");
    assert!(reopened.fail_stop_cause().is_none());
    assert!(matches!(
        reopened.execute(req("before"), ok),
        Ok(ExecuteAnswer::Replayed(_))
    ));
    assert!(matches!(
        reopened.execute(req("after"), ok),
        Ok(ExecuteAnswer::Ran(_))
    ));
}

#[test]
fn a_failed_lease_completion_latches_and_the_key_is_retried_after_reopen() {
    let backend = FaultyBackend::new();
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = Store::builder()
        .clock(clock.clone())
        .open_with_backend(backend.clone())
        .expect("open");
    let Ok(BeginAnswer::Acquired(lease)) = store.begin(req("k")) else {
        panic!("expected a lease");
    };
    let downstream = lease.downstream_key();
    backend.failing.store(true, Ordering::SeqCst);
    let err = lease
        .complete(Response::new(201, "charged"))
        .expect_err("commit must fail");
    assert!(
        matches!(err, Error::OutcomeUnknown { .. } | Error::Storage { .. }),
        "got {err:?}"
    );
    assert!(store.fail_stop_cause().is_some());
    drop(store);

    backend.failing.store(false, Ordering::SeqCst);
    let reopened = Store::builder()
        .clock(clock.clone())
        .open_with_backend(backend.clone())
        .expect("reopen");
    // The completion did not land, and the lease record did (it was committed before). Its
    // holder went with the store that granted it, so the reopened store takes the key over at
    // once (no waiting out the lease) with the same downstream key.
    match reopened.begin(req("k")) {
        Ok(BeginAnswer::Acquired(l)) => {
            assert_eq!(l.downstream_key(), downstream);
            assert_eq!(l.takeover_of(), Some(1));
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}

/// After the first failure every call that cannot answer is `FailStopped` naming that first
/// failure: the write calls at once (replays and duplicates included, whatever is cached), and a
/// read that redb refuses after the failure ("previous I/O error", which names no cause) too —
/// never a bare storage error.
#[test]
fn after_a_failure_every_call_is_fail_stopped_naming_the_first_cause() {
    let backend = FaultyBackend::new();
    // A page cache far smaller than the records, so most reads after the failure reach the disk.
    let store = Store::builder()
        .cache_size(64 << 10)
        .open_with_backend(backend.clone())
        .expect("open");
    const N: usize = 400;
    for i in 0..N {
        let outcome = store.execute(req(&format!("k{i}")), |_| {
            Ok(Response::new(200, format!("body {i} {}", "x".repeat(200))))
        });
        assert!(matches!(outcome, Ok(ExecuteAnswer::Ran(_))));
    }
    assert!(matches!(
        store.process("sub", "m1", |_| Ok::<(), idem::Abort>(())),
        Ok(idem::inbox::ProcessAnswer::Ran(()))
    ));

    backend.failing.store(true, Ordering::SeqCst);
    let first = store
        .execute(req("during"), ok)
        .expect_err("commit must fail");
    assert!(
        matches!(first, Error::OutcomeUnknown { .. } | Error::Storage { .. }),
        "the first failure is reported as itself: {first:?}"
    );
    backend.failing_reads.store(true, Ordering::SeqCst);

    let fail_stopped = |what: &str, r: Result<(), Error>| match r {
        Err(Error::FailStopped { cause }) => assert!(
            cause.contains("injected I/O failure"),
            "{what}: names the first failure: {cause}"
        ),
        other => panic!("{what}: {other:?}"),
    };
    for i in 0..N {
        let key = format!("k{i}");
        fail_stopped("execute (a replay)", store.execute(req(&key), ok).map(drop));
        fail_stopped("begin (a replay)", store.begin(req(&key)).map(drop));
        // A plain read: served while redb can, else FailStopped with the first cause.
        match store.get(&Scope::new("t", "op"), &key) {
            Ok(_) => {}
            other => fail_stopped("get", other.map(drop)),
        }
    }
    fail_stopped(
        "process (a duplicate)",
        store
            .process("sub", "m1", |_| Ok::<(), idem::Abort>(()))
            .map(drop),
    );
    fail_stopped("purge", store.purge(&Scope::new("t", "op"), "k1").map(drop));
    fail_stopped("sweep", store.sweep().map(drop));
}
