//! A panic on a thread that holds the shared write transaction — in the caller's closure or in
//! caller-supplied code the commit path calls, like the `Clock` — never strands the other
//! callers of its batch or the callers queued behind it.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use idem::{Clock, ManualClock, Outcome, Response, Store, Timestamp};

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
    let (held_tx, held_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let (victim_tx, victim_rx) = mpsc::channel();
    thread::scope(|s| {
        let store = &store;
        s.spawn(move || {
            executed(store.execute(req("t", "op", "gate", b"p"), |_| {
                held_tx.send(()).expect("test alive");
                release_rx.recv().expect("released");
                Ok(Response::new(200, "gate"))
            }));
        });
        held_rx.recv().expect("gate holds the writer");
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
            matches!(bystander, Ok(Outcome::Executed(_))),
            "{bystander:?}"
        );
    });
    assert_eq!(effects(&store, "bystander"), 1);
    // A panic in caller code is not an I/O failure: the store keeps working.
    assert_eq!(store.failure(), None);
    executed(store.execute(req("t", "op", "after", b"p"), |_| {
        Ok(Response::new(201, "after"))
    }));
}
