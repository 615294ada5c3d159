//! Journal mode's commit (`engine/journal/`): a batch's captured writes become one journal
//! entry, and its members are answered once the entry is durable.
//!
//! A batch on a view (the common path, [`Store::commit_view`]), and why each step is
//! crash-safe:
//! 1. seal: the entry gets LSN n and its frame is written at the journal's head (no sync),
//!    never over the live journal (a seal without room waits for the applier's checkpoint);
//! 2. the entry joins the pending set P, which later batches read, and the applier's queue,
//!    before the next batch begins;
//! 3. the members wait until a journal sync covering frame n returned Ok; the applier applies
//!    durable entries to redb with commits that each write the checkpoint row of their last
//!    entry, so whichever redb commit becomes durable says where replay resumes, and replay
//!    adds exactly the frames after it.
//!
//! A batch on redb's own transaction (a closure opened a table the journal cannot replay,
//! [`Store::commit_held`]) holds the applier, which first applies every sealed entry; its
//! entry is unframed and its commit durable, with the row: the commit is the entry's only copy.
//! A failed write, sync or commit latches fail-stop and every waiting member hears
//! `OutcomeUnknown`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use redb::{Key, Value, WriteTransaction};

use crate::engine::boundary::redb_error;
use crate::engine::journal::applier::{Applier, Hold, Redb, Target};
use crate::engine::journal::format::frame_len;
use crate::engine::journal::recover::{self, META_JOURNAL};
use crate::engine::journal::{Capture, View};
use crate::engine::store::{Inner, Store, WeakStore};
use crate::engine::tables::META;
use crate::error::{Error, StorageError};
use crate::runtime::observe;

fn unknown(cause: &str) -> Error {
    Error::OutcomeUnknown {
        source: StorageError::new(std::io::Error::other(cause.to_owned())),
    }
}

impl Store {
    /// The applier's target on this store's file `db`: redb, with the store's registered tables.
    fn redb<'a>(&'a self, db: &'a redb::Database) -> Redb<'a> {
        Redb {
            db,
            registry: self.registry(),
        }
    }

    /// Commits a batch that ran on redb's own write transaction, the applier held (`hold`):
    /// its entry is unframed and its commit durable with quick-repair (the entry's only copy,
    /// a checkpoint), and that state becomes the applied and published one. Returns the LSN
    /// its members wait for (durable once this returns).
    pub(crate) fn commit_held(
        &self,
        mut txn: WriteTransaction,
        capture: Capture,
        durable: bool,
        hold: Hold,
    ) -> Result<u64, Error> {
        let Some(journal) = self.journal() else {
            return Err(Error::Internal {
                what: "a held batch in a store without a journal",
            });
        };
        let entry = capture.take();
        let unjournaled = capture.unjournaled();
        if entry.is_empty() && !durable && !unjournaled {
            // Members reported writes but made none: nothing to seal or commit.
            self.abort(txn);
            return Ok(journal.sealed());
        }
        if unjournaled {
            journal.count_unjournaled();
        }
        let sealed = match journal.seal(None) {
            Ok(s) => s,
            Err(cause) => {
                self.latch(&cause);
                self.abort(txn);
                return Err(unknown(&cause));
            }
        };
        let prepared = (|| -> Result<(), redb::Error> {
            txn.open_table(META)?
                .insert(META_JOURNAL, sealed.row.encode().as_slice())?;
            txn.set_quick_repair(true);
            txn.set_durability(redb::Durability::Immediate)?;
            Ok(())
        })();
        if let Err(e) = prepared {
            self.latch(&e);
            self.abort(txn);
            return Err(Error::OutcomeUnknown {
                source: redb_error(e),
            });
        }
        let started = std::time::Instant::now();
        self.commit(txn)?;
        journal.checkpointed(&sealed.row, started.elapsed());
        // The hold applied every earlier entry to this transaction: all of them are durable.
        self.set_unflushed(false);
        self.held_committed(&hold)?;
        Ok(sealed.lsn)
    }

    /// After a held commit of the last sealed entry: the applier's state is that commit.
    fn held_committed(&self, hold: &Hold) -> Result<(), Error> {
        let (Some(journal), Ok(db)) = (self.journal(), self.inner.db.get()) else {
            return Err(Error::Internal {
                what: "a held commit in a store without a journal",
            });
        };
        // Invariant: no batch seals while this one commits, so the head is right after its
        // unframed entry, and that is the row its commit wrote.
        hold.committed(&self.redb(db), journal.current_row(false))
            .map_err(|cause| {
                self.latch(&cause);
                unknown(&cause)
            })
    }

    /// A sealed entry larger than the journal takes, committed to redb's file
    /// directly in one durable commit (the entry's only copy) with the applier held.
    fn commit_oversized(
        &self,
        journal: &crate::engine::journal::log::Journal,
        applier: &Arc<Applier>,
        body: &[u8],
    ) -> Result<u64, Error> {
        let (Some(journal_arc), Ok(db)) = (self.journal_arc(), self.inner.db.get()) else {
            return Err(Error::Internal {
                what: "an oversized entry in a store without a journal",
            });
        };
        let failed = |cause: String| {
            self.latch(&cause);
            unknown(&cause)
        };
        let hold = applier.hold(&journal_arc).map_err(failed)?;
        let sealed = journal.seal(None).map_err(failed)?;
        let target = self.redb(db);
        let started = std::time::Instant::now();
        let applied = catch_unwind(AssertUnwindSafe(|| {
            target.apply(&[body], &sealed.row, true)
        }))
        .unwrap_or_else(|_| {
            Err(redb::Error::Corrupted(
                "redb panicked while committing an entry (a damaged file?)".into(),
            ))
        });
        if let Err(e) = applied {
            return Err(failed(format!(
                "committing an entry larger than the journal takes failed: {e}"
            )));
        }
        journal.checkpointed(&sealed.row, started.elapsed());
        self.held_committed(&hold)?;
        Ok(sealed.lsn)
    }

    /// Starts the applier thread. It holds the database and the journal, not
    /// the store (a [`WeakStore`], to latch a failure), so dropping the last handle closes the
    /// store at once; a failed round fails the journal and latches fail-stop.
    pub(crate) fn start_applier(&self) -> Result<(), Error> {
        let (Some(applier), Some(journal), Some(db)) =
            (self.applier(), self.journal_arc(), self.db_arc())
        else {
            return Ok(());
        };
        if applier.running() {
            return Ok(());
        }
        applier
            .resume(&self.redb(&db))
            .map_err(|e| self.storage(e))?;
        let registry = self.registry().clone();
        let weak: WeakStore = self.downgrade();
        applier
            .start(journal, move |applier, journal| {
                let round = catch_unwind(AssertUnwindSafe(|| {
                    let target = Redb {
                        db: &db,
                        registry: &registry,
                    };
                    applier.round(&target, journal, false)
                }))
                .unwrap_or_else(|_| {
                    Err("redb panicked while applying journal entries (a damaged file?)".into())
                });
                if let Err(cause) = &round {
                    journal.fail(cause);
                    if let Some(store) = weak.upgrade() {
                        store.latch(cause);
                    }
                }
                round
            })
            .map_err(|source| Error::Spawn {
                what: "the journal applier",
                source,
            })
    }

    /// Before compaction or the integrity check: stops the applier and brings
    /// redb up to every entry (a failure latches fail-stop; the operation then refuses).
    pub(crate) fn suspend_applier(&self) {
        let (Some(applier), Some(journal), Ok(db)) =
            (self.applier(), self.journal(), self.inner.db.get())
        else {
            return;
        };
        if let Err(cause) = applier.suspend(&self.redb(db), journal) {
            self.latch(&cause);
        }
    }

    /// Seals a background-mode batch: its entry gets LSN n, its frame is written at the head
    /// (no sync), and it joins P and the applier's queue before the next batch begins; returns
    /// the LSN its members wait for. Nothing of redb is on this path.
    pub(crate) fn commit_view(
        &self,
        view: View,
        capture: Capture,
        durable: bool,
    ) -> Result<u64, Error> {
        let (Some(journal), Some(applier)) = (self.journal(), self.applier()) else {
            return Err(Error::Internal {
                what: "a view batch in a store without the applier",
            });
        };
        // The view's snapshot is released when this returns; P keeps what later views need.
        drop(view);
        let entry = capture.take();
        if entry.is_empty() {
            if durable {
                // Durability::Periodic's flusher: every entry sealed so far, durable.
                self.force_journal(journal)?;
            }
            return Ok(journal.sealed());
        }
        let body = entry.finish().map_err(|reason| Error::Config { reason })?;
        if !journal.fits(frame_len(body.len())) {
            return self.commit_oversized(journal, applier, &body);
        }
        // Backpressure: P stays within its bound while the applier catches up.
        applier.wait_for_room(journal).map_err(|cause| {
            self.latch(&cause);
            unknown(&cause)
        })?;
        let sealed = match journal.seal(Some(&body)) {
            Ok(s) => s,
            Err(cause) => {
                self.latch(&cause);
                return Err(unknown(&cause));
            }
        };
        if let Err(cause) = applier.add(sealed.lsn, body, sealed.row, &capture.compares()) {
            // Sealed and framed, but not in P: later views would miss it. Stop writing.
            self.latch(&cause);
            journal.fail(&cause);
            return Err(unknown(&cause));
        }
        journal.wake_if_durable(sealed.lsn);
        if durable {
            self.force_journal(journal)?;
        } else {
            // Periodic: the flusher makes these durable (and so lets the applier take them).
            self.set_unflushed(self.relaxed_durability());
        }
        // At most two batches in flight: the next batch forms once the entry before this one
        // is durable, so it gathers the callers that arrive during this entry's sync instead
        // of many small batches each paying a sync.
        if sealed.lsn > 1 {
            journal.wait_durable(sealed.lsn - 1).map_err(|cause| {
                self.latch(&cause);
                unknown(&cause)
            })?;
        }
        Ok(sealed.lsn)
    }

    /// Syncs the journal up to the last sealed entry whatever the durability mode (the
    /// flusher's commit under `Durability::Periodic`); a failure latches.
    fn force_journal(&self, journal: &crate::engine::journal::log::Journal) -> Result<(), Error> {
        journal.wait_durable(journal.sealed()).map_err(|cause| {
            self.latch(&cause);
            unknown(&cause)
        })?;
        self.set_unflushed(false);
        Ok(())
    }

    /// Before a read of redb alone (`Store::read`, `read_transaction`): waits
    /// until every entry sealed before the call is durable and applied, so the read sees it.
    pub(crate) fn wait_applied(&self) -> Result<(), Error> {
        let (Some(journal), Some(applier)) = (self.journal(), self.applier()) else {
            return Ok(());
        };
        let bound = journal.read_bound();
        let failed = |cause: String| {
            self.latch(&cause);
            Error::FailStopped { cause }
        };
        journal.wait_durable(bound).map_err(failed)?;
        applier.wait_applied(bound).map_err(failed)
    }

    /// Waits until entry `lsn` is durable; a failed sync latches and is `OutcomeUnknown`.
    pub(crate) fn journal_durable(&self, lsn: u64) -> Result<(), Error> {
        let Some(journal) = self.journal() else {
            return Ok(());
        };
        if self.relaxed_durability() {
            // Durability::Periodic: answers do not wait (its documented loss window).
            return Ok(());
        }
        journal.wait_durable(lsn).map_err(|cause| {
            self.latch(&cause);
            unknown(&cause)
        })
    }

    /// For a read that began after `sealed` was read: waits until what it may see is durable,
    /// so no answer comes from an entry a crash can still lose.
    pub(crate) fn read_durable(&self) -> Result<(), Error> {
        let Some(journal) = self.journal() else {
            return Ok(());
        };
        if self.relaxed_durability() {
            return Ok(());
        }
        let bound = journal.read_bound();
        journal.wait_durable(bound).map_err(|cause| {
            self.latch(&cause);
            Error::FailStopped { cause }
        })
    }

    /// Logs, once per store, that a batch opened `table`, which the journal cannot replay
    /// (`why`), so its batches commit durably ([`crate::store::JournalMetrics::unjournaled`]).
    pub(crate) fn warn_unjournaled(&self, table: &str, why: &str) {
        if !self.inner.unjournaled_warned.swap(true, Ordering::Relaxed) {
            observe::warn!(
                "journal mode: a batch opened a table whose writes the journal cannot replay, so it commits durably (an fsync of the store file) instead of being journaled; later such batches are counted in Metrics::journal.unjournaled, not logged",
                table = table,
                why = why,
            );
        }
    }

    /// Whether the caller's table `name` is registered with these types
    /// ([`crate::StoreBuilder::journal_table`]): its writes can be replayed.
    pub(crate) fn journal_table_known<K: Key + 'static, V: Value + 'static>(
        &self,
        name: &str,
    ) -> bool {
        self.inner
            .registry
            .knows(name, K::type_name().name(), V::type_name().name())
    }
}

impl Inner {
    /// At close: stops the applier and applies what it has not (every queued
    /// entry's members were answered, so each is durable), so the closing checkpoint covers
    /// every entry. On a failure the store is latched: the closing checkpoint is skipped and the
    /// next open replays the journal.
    pub(super) fn stop_applier(&mut self) {
        let (Some(applier), Some(journal)) = (self.applier.take(), self.journal.as_deref()) else {
            return;
        };
        applier.stop(journal);
        if self.failure.lock().is_some() {
            return;
        }
        let drained = match self.db.get() {
            Ok(db) => catch_unwind(AssertUnwindSafe(|| {
                applier.drain(
                    &Redb {
                        db,
                        registry: &self.registry,
                    },
                    journal,
                )
            }))
            .unwrap_or_else(|_| Err("redb panicked while applying (a damaged file?)".into())),
            Err(e) => Err(e.to_string()),
        };
        if let Err(cause) = drained {
            observe::warn!(
                "closing the store: applying the last journal entries failed; the next open replays the journal",
                error = observe::display(&cause),
            );
            self.failure.lock().get_or_insert(cause);
        }
    }

    /// The closing checkpoint (the last handle is gone): the row after every entry, clean, in
    /// a durable commit; then the journal file is synced and closed. Skipped after a failure:
    /// the next open replays the journal.
    pub(super) fn close_journal(&mut self) {
        let Some(journal) = self.journal.as_ref() else {
            return;
        };
        if self.failure.lock().is_none()
            && let Ok(db) = self.db.get()
        {
            let closed = catch_unwind(AssertUnwindSafe(|| recover::close(db, journal)));
            if !matches!(closed, Ok(Ok(()))) {
                observe::warn!(
                    "closing the store: the closing checkpoint failed; the next open replays the journal"
                );
            }
        }
        journal.close();
    }
}
