//! The records table as of the latest commit, shared by the lookups of the lock-free read path
//! (`Store::read_record`: the first step of `execute`, `execute_on_writer` and `begin`, and `get`).
//!
//! Beginning a redb read transaction, opening the records table and dropping both costs a
//! lookup more than the lookup itself, so lookups share one open table per commit: the first
//! lookup after a commit opens it, the later ones reuse it until the next commit.
//!
//! Invariant (freshness): a lookup that starts after a commit returned sees that commit, as a
//! fresh read transaction would. Every commit bumps `generation` after redb's commit returned
//! and before anyone is answered (`Store::commit`); a shared table is tagged with the
//! generation read *before* its read transaction began, and is used only while the generation
//! still has that value. So a table used at generation `g` began after the bump to `g`, after
//! every commit whose bump came before it, and so after every commit answered before the lookup
//! began. A lookup racing a commit may see the state before it, as a read racing a write may.
//!
//! A shared table holds a redb read transaction, which keeps the pages of its snapshot from
//! being reused. It is dropped at every commit (the next lookup opens a new one), so it delays
//! the reuse of a commit's freed pages by one commit at most, like any reader in flight; it is
//! dropped before compaction (which refuses to run beside a reader) and when the store closes.
//!
//! In multi-process mode another process's commits bump nothing here, so every lookup begins
//! its own read transaction (`shared: false`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use redb::{ReadOnlyTable, ReadableDatabase};

use crate::engine::tables::RECORDS;

/// The records table, open in a read transaction.
pub(crate) type RecordsRead = ReadOnlyTable<&'static [u8], &'static [u8]>;

/// See the module documentation.
pub(crate) struct Snapshot {
    /// Whether lookups may share a table: only this process writes the file.
    shared: bool,
    /// Commits so far (bumped after each, whatever its result).
    generation: AtomicU64,
    /// The shared table and the generation it was opened at.
    current: RwLock<Option<(u64, Arc<RecordsRead>)>>,
}

impl Snapshot {
    /// `shared`: whether this process is the file's only writer.
    pub(crate) fn new(shared: bool) -> Self {
        Snapshot {
            shared,
            generation: AtomicU64::new(0),
            current: RwLock::new(None),
        }
    }

    /// The records table as of the latest commit (the freshness invariant above).
    pub(crate) fn records(&self, db: &redb::Database) -> Result<Arc<RecordsRead>, redb::Error> {
        if !self.shared {
            return Ok(Arc::new(db.begin_read()?.open_table(RECORDS)?));
        }
        // Read before the read transaction begins: the tag must not be newer than the table.
        let generation = self.generation.load(Ordering::Acquire);
        if let Some((at, table)) = &*self.current.read()
            && *at == generation
        {
            return Ok(Arc::clone(table));
        }
        let table = Arc::new(db.begin_read()?.open_table(RECORDS)?);
        let mut current = self.current.write();
        // A commit since the load above: this table may predate it, so it is not shared (this
        // lookup, which raced that commit, may still use it).
        if self.generation.load(Ordering::Acquire) == generation {
            *current = Some((generation, Arc::clone(&table)));
        }
        Ok(table)
    }

    /// After a commit returned (committed or not), before anyone is told: later lookups must
    /// not use a table opened before it.
    pub(crate) fn committed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if self.shared {
            // Dropped outside the lock: dropping a read transaction is redb work.
            let old = self.current.write().take();
            drop(old);
        }
    }

    /// Drops the shared table (before compaction, and when the store closes).
    pub(crate) fn release(&mut self) {
        *self.current.get_mut() = None;
    }
}
