//! A panic on a thread that holds the shared write transaction — in the caller's closure, in
//! caller-supplied code the commit path calls, like the `Clock`, or in a step of the protocol
//! itself — never strands the other callers of its batch or the callers queued behind it.
//! And a closure that panics leaves nothing behind: no record, none of its writes, and the store
//! keeps working (the key stays free and the retry runs).

use crate::common;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use common::*;
use idem::clock::{Clock, ManualClock};
use idem::redb::backends::InMemoryBackend;
use idem::redb::{BackendError, StorageBackend};
use idem::redb::{ReadableTableMetadata, TableDefinition};
use idem::{Error, ExecuteAnswer, Request, Response, Scope, Store, Timestamp};

/// A clock that panics when read on the thread named "victim".
#[derive(Debug, Clone)]
struct PanicsOnVictim(ManualClock);

impl Clock for PanicsOnVictim {
    fn now(&self) -> Timestamp {
        if thread::current().name() == Some("victim") {
            panic!("clock failure on the victim thread");
        }
        self.0.now()
    }
}

#[test]
fn a_clock_that_panics_inside_a_batch_strands_no_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::builder()
        .clock(PanicsOnVictim(ManualClock::new(T0)))
        .open(dir.path().join("idem.redb"))
        .expect("open");
    let (done_tx, done_rx) = mpsc::channel();
    let (victim_tx, victim_rx) = mpsc::channel();
    thread::scope(|s| {
        let store = &store;
        let (release_tx, _gate) = gate(s, store);
        // The victim queues first (it leads the next batch), a bystander behind it. `purge`
        // has no read path, so the victim reads the clock only on its turn in the batch.
        // Detached threads (not scoped): if the bug came back they would hang, and the bounded
        // waits below fail the test instead of hanging it.
        let victim_store = store.clone();
        let victim_done = victim_tx.clone();
        thread::Builder::new()
            .name("victim".into())
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    victim_store.purge(&idem::Scope::new("t", "op"), "nothing")
                }));
                victim_done.send(r.is_err()).expect("test alive");
            })
            .expect("spawn victim");
        wait_for_queue(store, 1);
        let bystander_store = store.clone();
        let done = done_tx.clone();
        thread::spawn(move || {
            let r = bystander_store.execute(req("t", "op", "bystander", b"p"), |tx| {
                bump(tx, "bystander")?;
                Ok(Response::new(201, "fine"))
            });
            done.send(r).expect("test alive");
        });
        wait_for_queue(store, 2);
        release_tx.send(()).expect("gate alive");
        assert!(
            victim_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("the victim returns"),
            "the clock's panic reaches the victim's own caller"
        );
        let bystander = done_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the bystander is answered, not stranded");
        assert!(
            matches!(bystander, Ok(ExecuteAnswer::Ran(_))),
            "{bystander:?}"
        );
    });
    assert_eq!(effects(&store, "bystander"), 1);
    // A panic in caller code is not an I/O failure: the store keeps working.
    assert_eq!(store.fail_stop_cause(), None);
    executed(store.execute(req("t", "op", "after", b"p"), |_| {
        Ok(Response::new(201, "after"))
    }));
}

/// An in-memory backend whose next `sync_data` panics once armed, as redb may on a damaged page.
#[derive(Debug, Clone)]
struct PanicsOnSyncWhenArmed {
    inner: Arc<InMemoryBackend>,
    armed: Arc<AtomicBool>,
}

impl StorageBackend for PanicsOnSyncWhenArmed {
    fn len(&self) -> Result<u64, BackendError> {
        self.inner.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.inner.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        self.inner.set_len(len)
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("the backend failed while syncing");
        }
        self.inner.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.inner.write(offset, data)
    }
}

/// A panic in a step of the commit protocol itself (here the commit's fsync, in the storage
/// backend) fail-stops the store, answers the member waiting on that commit, and is
/// `CorruptStore` for the member that ran it: no one is stranded and no panic escapes.
#[test]
fn a_panic_in_a_commit_step_answers_every_member_and_latches() {
    let armed = Arc::new(AtomicBool::new(false));
    let store = Store::builder()
        .clock(ManualClock::new(T0))
        .open_with_backend(PanicsOnSyncWhenArmed {
            inner: Arc::new(InMemoryBackend::new()),
            armed: armed.clone(),
        })
        .expect("open");
    let (first_tx, first_rx) = mpsc::channel();
    let (last_tx, last_rx) = mpsc::channel();
    let gate_answer = thread::scope(|s| {
        let store = &store;
        let (release_tx, gate) = gate_answered(s, store);
        // `first` and `last` queue behind the gate and join its batch when it is released:
        // `last` runs last, arms the backend and commits.
        // Detached threads: if a member were stranded, the bounded waits below fail the test.
        let first_store = store.clone();
        thread::spawn(move || {
            let r = first_store.execute(req("t", "op", "first", b"p"), |_| {
                Ok(Response::new(201, "first"))
            });
            first_tx.send(r).expect("test alive");
        });
        wait_for_queue(store, 1);
        let last_store = store.clone();
        let arm = armed.clone();
        thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                last_store.execute(req("t", "op", "last", b"p"), |_| {
                    arm.store(true, Ordering::SeqCst);
                    Ok(Response::new(201, "last"))
                })
            }));
            last_tx.send(r.ok()).expect("test alive");
        });
        wait_for_queue(store, 2);
        release_tx.send(()).expect("gate alive");
        gate.join().expect("the gate returns")
    });
    assert!(
        matches!(gate_answer, Err(Error::FailStopped { .. })),
        "the gate waited on the failed commit: {gate_answer:?}"
    );
    let last = last_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the committing member returns")
        .expect("no panic reaches the committing member's caller");
    match &last {
        Err(Error::CorruptStore { reason }) => {
            assert!(reason.contains("committing a batch"), "{reason}")
        }
        other => panic!("expected CorruptStore, got {other:?}"),
    }
    let first = first_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the member waiting on the commit is answered, not stranded");
    assert!(matches!(first, Err(Error::FailStopped { .. })), "{first:?}");
    assert!(
        store.fail_stop_cause().is_some(),
        "a panicking commit fail-stops"
    );
    assert!(matches!(
        store.execute(req("t", "op", "after", b"p"), |_| Ok(Response::new(
            201, "after"
        ))),
        Err(Error::FailStopped { .. })
    ));
}

// ---- A panicking closure alone ----

/// The table the closure of the test below writes.
const CLOSURE_EFFECTS: TableDefinition<&str, u32> = TableDefinition::new("effects");

#[test]
fn a_panicking_closure_commits_nothing_and_the_retry_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("idem.redb")).expect("open");
    let req = || Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"p");

    let result = catch_unwind(AssertUnwindSafe(|| {
        store.execute(req(), |tx| {
            tx.open_table(CLOSURE_EFFECTS)?.insert("k", 1)?;
            panic!("handler bug");
        })
    }));
    assert!(result.is_err(), "the panic reaches the caller");
    assert!(store.get(req().scope(), "k").expect("get").is_none());
    assert!(
        store.fail_stop_cause().is_none(),
        "a caller panic is not an I/O failure"
    );

    let outcome = store
        .execute(req(), |tx| {
            let mut effects = tx.open_table(CLOSURE_EFFECTS)?;
            assert_eq!(
                effects.len()?,
                0,
                "the panicked attempt's write was rolled back"
            );
            effects.insert("k", 1)?;
            Ok(Response::new(200, "ok"))
        })
        .expect("retry");
    assert!(matches!(outcome, ExecuteAnswer::Ran(_)));
    let effects = store
        .read_transaction()
        .expect("read")
        .open_table(CLOSURE_EFFECTS)
        .expect("table")
        .len()
        .expect("len");
    assert_eq!(effects, 1);
}
