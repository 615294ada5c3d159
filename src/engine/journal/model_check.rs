//! Journal mode's background design, model-checked with loom: the shipped `Journal` (`log.rs`:
//! seal, the group sync, the wait for journal space, checkpoints) and `Applier` (`applier.rs`:
//! P, the queue, the thread's loop and rounds, backpressure, the hold of a batch on redb's own
//! transaction), their `Mutex`, `Condvar`, `RwLock` and decisive atomics loom's under
//! `--cfg idem_loom` (`runtime/sync.rs`), over an in-memory journal file and a fake store of
//! record.
//!
//! ```text
//! RUSTFLAGS="--cfg idem_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib engine::journal::model_check
//! ```
//!
//! Without the flag the same scenarios run once each on std threads.
//!
//! Threads: a sealer doing what `Store::commit_view` does for a run of batches (backpressure,
//! seal, join P and the queue, the wake, the wait for the entry before), one of them (in the
//! `held` case) a batch on redb's own transaction instead (`Store::commit_held`: hold, an
//! unframed entry, a durable commit, publish); a member of each of the last two batches, waiting
//! for its entry's sync while the next batch seals (the syncs run on waiting threads); and the
//! applier thread's loop (`Applier::run`). The journal
//! holds four frames, so seals wait for space, and a checkpoint is due every two. Properties:
//!
//! 1. **Progress**: every thread ends (a lost wake-up or a wait cycle is a deadlock loom
//!    reports), and every entry is applied in the end.
//! 2. **Only durable entries are applied, in order**: the fake's apply asserts that the row it
//!    is given is that of the last entry of the round, durable, and after the last applied one.
//! 3. **No round while a batch holds the applier**: the fake's apply asserts it.
//! 4. **A checkpoint's row is its last applied entry's**: a broken applier that writes the last
//!    sealed entry's row (`BrokenJournal::ApplierRowAhead`) fails property 2
//!    (`a_row_ahead_is_caught`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use redb::{Key, StorageBackend};

use crate::engine::journal::applier::{Applier, Snap, Target};
use crate::engine::journal::format::{
    EntryBuilder, HEADER_LEN, OP_PUT, Row, TABLE_PLAIN, decode_body, frame_len,
};
use crate::engine::journal::log::Journal;
use crate::engine::journal::log::tests::Mem;
use crate::engine::journal::pending::Compare;

/// The store of record: the last applied entry, checked on every apply. Ghost state (std
/// atomics: no scheduling points).
struct Fake {
    journal: Arc<Journal>,
    applied: AtomicU64,
    /// A batch holds the applier (set and cleared by the sealer around its held section).
    holding: AtomicBool,
    checkpoints: AtomicU64,
}

impl Target for Fake {
    fn apply(&self, bodies: &[&[u8]], row: &Row, checkpoint: bool) -> Result<(), redb::Error> {
        assert!(
            !self.holding.load(Ordering::SeqCst),
            "a round ran while a batch held the applier"
        );
        let before = self.applied.load(Ordering::SeqCst);
        let through = before + bodies.len() as u64;
        assert_eq!(
            row.lsn,
            through,
            "the row written is not the last applied entry's ({} applied before, {} now)",
            before,
            bodies.len()
        );
        assert!(
            row.lsn <= self.journal.durable(),
            "entry {} applied before it was durable ({})",
            row.lsn,
            self.journal.durable()
        );
        for b in bodies {
            decode_body(b).map_err(|e| redb::Error::Corrupted(format!("{e:?}")))?;
        }
        self.applied.store(through, Ordering::SeqCst);
        if checkpoint {
            self.checkpoints.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }

    fn snapshot(&self, lsn: u64) -> Result<Snap, redb::Error> {
        Ok(Snap {
            lsn,
            txn: None,
            records: None,
        })
    }
}

/// One batch's entry: a put of `key` in table `t`.
fn body(key: u8) -> Vec<u8> {
    let mut b = EntryBuilder::default();
    let t = b.table("t", TABLE_PLAIN, "&[u8]", "&[u8]");
    b.record(OP_PUT, t, &[key], Some(b"value"));
    // Invariant: one plain table with one put always encodes.
    b.finish().expect("a one-put entry encodes")
}

/// What the scenario does.
#[derive(Clone, Copy)]
struct Scenario {
    /// Batches the sealer seals.
    batches: u8,
    /// The batch (1-based) that runs on redb's own transaction instead, if any.
    held: Option<u8>,
    /// The applier's P bound (1: every seal behind an unapplied entry waits).
    limit: usize,
    /// `BrokenJournal::ApplierRowAhead`.
    row_ahead: bool,
}

/// Runs `s` once: the sealer, a member and the applier thread (`spawn` starts a thread, loom's
/// or std's), and checks the end state.
fn run<J>(s: Scenario, spawn: impl Fn(Box<dyn FnOnce() + Send>) -> J, join: impl Fn(J)) {
    let len = frame_len(body(0).len());
    let capacity = HEADER_LEN + 4 * len;
    let file = Mem::default();
    // Invariant: the in-memory file takes any length.
    file.set_len(capacity).expect("an in-memory file");
    let row0 = Row {
        store_id: [7; 16],
        lsn: 0,
        position: HEADER_LEN,
        chain: [0; 8],
        clean: false,
    };
    let journal = Arc::new(Journal::new(Box::new(file), capacity, row0, 2 * len, 0));
    let snap = Snap {
        lsn: 0,
        txn: None,
        records: None,
    };
    let applier = Applier::new(snap, row0, s.limit).with_row_ahead(s.row_ahead);
    let fake = Arc::new(Fake {
        journal: Arc::clone(&journal),
        applied: AtomicU64::new(0),
        holding: AtomicBool::new(false),
        checkpoints: AtomicU64::new(0),
    });
    let last = u64::from(s.batches);

    let thread = {
        let (applier, journal, fake) = (
            Arc::clone(&applier),
            Arc::clone(&journal),
            Arc::clone(&fake),
        );
        spawn(Box::new(move || {
            applier.run(&journal, |a, j| a.round(&*fake, j, false));
        }))
    };
    let compares: HashMap<String, Compare> =
        HashMap::from([("t".to_owned(), <&[u8] as Key>::compare as Compare)]);
    let mut members = Vec::new();
    for n in 1..=s.batches {
        if s.held == Some(n) {
            // `Store::commit_held`: every earlier entry applied first, no round meanwhile.
            let hold = applier.hold(&journal).expect("hold");
            fake.holding.store(true, Ordering::SeqCst);
            let sealed = journal.seal(None).expect("an unframed seal");
            assert_eq!(fake.applied.load(Ordering::SeqCst), sealed.lsn - 1);
            // Its durable commit: the fake's state after it.
            fake.applied.store(sealed.lsn, Ordering::SeqCst);
            journal.checkpointed(&sealed.row, std::time::Duration::ZERO);
            fake.holding.store(false, Ordering::SeqCst);
            hold.committed(&*fake, journal.current_row(false))
                .expect("publish");
            drop(hold);
            continue;
        }
        // `Store::commit_view`, in its order.
        applier.wait_for_room(&journal).expect("room");
        let entry = body(n);
        let sealed = journal.seal(Some(&entry)).expect("seal");
        applier
            .add(sealed.lsn, entry, sealed.row, &compares)
            .expect("add");
        journal.wake_if_durable(sealed.lsn);
        if n + 1 >= s.batches {
            // A member of one of the last two batches, answered once its entry is durable (it
            // may run the sync) while the next batch seals: the sync a seal waiting for space
            // needs comes from there. (Members wait only for sealed entries: a wait for an
            // unsealed one is woken by no sync. The sealer's wait below syncs the earlier ones.)
            let journal = Arc::clone(&journal);
            let lsn = sealed.lsn;
            members.push(spawn(Box::new(move || {
                journal
                    .wait_durable(lsn)
                    .expect("the journal never fails here");
            })));
        }
        if sealed.lsn > 1 {
            journal.wait_durable(sealed.lsn - 1).expect("durable");
        }
    }
    for member in members {
        join(member);
    }
    applier.wait_applied(last).expect("every entry applied");
    applier.stop(&journal);
    join(thread);
    assert_eq!(fake.applied.load(Ordering::SeqCst), last);
}

/// The scenarios, each checked once on std threads (a smoke test of the model itself).
#[cfg(not(idem_loom))]
mod once {
    use super::*;

    fn std_run(s: Scenario) {
        run(s, std::thread::spawn, |t: std::thread::JoinHandle<()>| {
            t.join().expect("a model thread")
        });
    }

    #[test]
    fn journal_and_applier_scenarios_run_on_std_threads() {
        for held in [None, Some(2)] {
            for limit in [1, 1 << 20] {
                std_run(Scenario {
                    batches: 4,
                    held,
                    limit,
                    row_ahead: false,
                });
            }
        }
    }
}

/// Each scenario in every interleaving within the bound (`--cfg idem_loom`).
#[cfg(idem_loom)]
mod cases {
    use super::*;

    fn check(s: Scenario) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(2);
        }
        builder.max_branches = 100_000;
        let started = std::time::Instant::now();
        builder.check(move || {
            run(
                s,
                |f| loom::thread::spawn(f),
                |t: loom::thread::JoinHandle<()>| t.join().expect("a model thread"),
            )
        });
        eprintln!(
            "{}: checked in {:.1?}",
            std::thread::current().name().unwrap_or("a case"),
            started.elapsed()
        );
    }

    /// Seals that wait for journal space and checkpoints the applier makes for them.
    #[test]
    fn seals_the_applier_and_checkpoints_never_wait_for_each_other() {
        check(Scenario {
            batches: 4,
            held: None,
            limit: 1 << 20,
            row_ahead: false,
        });
    }

    /// Every seal behind an unapplied entry waits for the applier (P's bound).
    #[test]
    fn backpressure_never_deadlocks() {
        check(Scenario {
            batches: 3,
            held: None,
            limit: 1,
            row_ahead: false,
        });
    }

    /// A batch on redb's own transaction between journaled ones.
    #[test]
    fn a_held_batch_excludes_rounds_and_loses_no_entry() {
        check(Scenario {
            batches: 3,
            held: Some(2),
            limit: 1 << 20,
            row_ahead: false,
        });
    }

    /// The model catches a checkpoint row that runs ahead of the applied entries.
    #[test]
    #[should_panic(expected = "is not the last applied entry's")]
    fn a_row_ahead_is_caught() {
        check(Scenario {
            batches: 4,
            held: None,
            limit: 1 << 20,
            row_ahead: true,
        });
    }
}
