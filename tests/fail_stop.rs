//! The first I/O or commit failure latches the store: it refuses writes until reopened, and the
//! failed commit is reported as an unknown outcome, never as success.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem::redb::StorageBackend;
use idem::redb::backends::InMemoryBackend;
use std::time::Duration;

use idem::clock::ManualClock;
use idem::{Begin, Error, Outcome, Request, Response, Scope, Store, Timestamp};

/// An in-memory backend whose writes and syncs fail while `failing` is set. The bytes live in
/// an `Arc`, so a "reopen" can build a new backend over the same image.
#[derive(Debug, Clone)]
struct FaultyBackend {
    inner: Arc<InMemoryBackend>,
    failing: Arc<AtomicBool>,
}

impl FaultyBackend {
    fn fail_if_set(&self) -> io::Result<()> {
        if self.failing.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected I/O failure"));
        }
        Ok(())
    }
}

impl StorageBackend for FaultyBackend {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.fail_if_set()?;
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.fail_if_set()?;
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
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
    let backend = FaultyBackend {
        inner: Arc::new(InMemoryBackend::new()),
        failing: Arc::new(AtomicBool::new(false)),
    };
    let store = Store::builder()
        .open_with_backend(backend.clone())
        .expect("open");
    assert!(matches!(
        store.execute(req("before"), ok),
        Ok(Outcome::Executed(_))
    ));

    backend.failing.store(true, Ordering::SeqCst);
    let err = store
        .execute(req("during"), ok)
        .expect_err("commit must fail");
    assert!(
        matches!(err, Error::OutcomeUnknown { .. } | Error::Storage { .. }),
        "got {err:?}"
    );
    assert!(store.failure().is_some(), "the failure is latched");

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
    // Replays of what was durably committed before the failure are still served.
    assert!(matches!(
        store.execute(req("before"), ok),
        Ok(Outcome::Replayed(_))
    ));
    drop(store);

    // Reopen over the same bytes: writes work again, the acknowledged record survived.
    let reopened = Store::builder()
        .open_with_backend(FaultyBackend {
            inner: backend.inner.clone(),
            failing: Arc::new(AtomicBool::new(false)),
        })
        .expect("reopen");
    assert!(reopened.failure().is_none());
    assert!(matches!(
        reopened.execute(req("before"), ok),
        Ok(Outcome::Replayed(_))
    ));
    assert!(matches!(
        reopened.execute(req("after"), ok),
        Ok(Outcome::Executed(_))
    ));
}

#[test]
fn a_failed_lease_completion_latches_and_the_key_is_retried_after_reopen() {
    let backend = FaultyBackend {
        inner: Arc::new(InMemoryBackend::new()),
        failing: Arc::new(AtomicBool::new(false)),
    };
    let clock = ManualClock::new(Timestamp(1_000_000));
    let store = Store::builder()
        .clock(clock.clone())
        .open_with_backend(backend.clone())
        .expect("open");
    let Ok(Begin::Acquired(lease)) = store.begin(req("k")) else {
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
    assert!(store.failure().is_some());
    drop(store);

    backend.failing.store(false, Ordering::SeqCst);
    let reopened = Store::builder()
        .clock(clock.clone())
        .open_with_backend(backend.clone())
        .expect("reopen");
    // The completion did not land, and the lease record did (it was committed before): the key
    // is in flight until the lease lapses, then a takeover reuses the same downstream key.
    assert!(matches!(
        reopened.begin(req("k")),
        Ok(Begin::InFlight { .. })
    ));
    clock.advance(Duration::from_secs(31));
    match reopened.begin(req("k")) {
        Ok(Begin::Acquired(l)) => {
            assert_eq!(l.downstream_key(), downstream);
            assert_eq!(l.takeover_of(), Some(1));
        }
        other => panic!("expected a takeover, got {other:?}"),
    }
}
