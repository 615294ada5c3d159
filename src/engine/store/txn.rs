//! A batch's write transaction: begun in the store's durability mode (and quick-repair),
//! committed or aborted. Any failure to begin, commit or abort latches fail-stop, so every
//! member of the batch can truthfully be told the store is fail-stopped.

use redb::WriteTransaction;

use crate::engine::boundary::redb_error;
use crate::engine::builder::Durability;
use crate::engine::store::Store;
use crate::error::Error;
use crate::runtime::observe;

impl Store {
    /// Begins the write transaction of a batch, in the store's durability mode.
    /// Failing to begin is a storage-level failure: it latches, so every member of the batch
    /// can truthfully be told the store is fail-stopped.
    pub(crate) fn begin_batch_txn(&self) -> Result<WriteTransaction, Error> {
        let latched = |e: redb::Error| {
            self.latch(&e);
            Error::Storage {
                source: redb_error(e),
            }
        };
        let db = self.inner.db.get().map_err(latched)?;
        let mut txn = db.begin_write().map_err(|e| latched(e.into()))?;
        if self.inner.quick_repair {
            txn.set_quick_repair(true);
        }
        if self.relaxed_durability() {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| latched(e.into()))?;
        }
        Ok(txn)
    }

    /// True in [`Durability::Periodic`]: batches commit without an fsync.
    pub(crate) fn relaxed_durability(&self) -> bool {
        matches!(self.inner.durability, Durability::Periodic(_))
    }

    /// Makes this batch's commit durable (fsync) whatever the durability mode.
    pub(crate) fn force_durable(&self, txn: &mut WriteTransaction) {
        if let Durability::Periodic(_) = self.inner.durability {
            // Raising durability cannot conflict with a savepoint (idem takes none); if redb
            // refuses anyway, the commit stays non-durable and the flusher covers it.
            if let Err(e) = txn.set_durability(redb::Durability::Immediate) {
                observe::warn!(
                    "a forced durable commit stays non-durable until the flusher's next tick",
                    error = observe::display(e),
                );
            }
        }
    }

    /// Commits; any failure latches fail-stop and reports an unknown outcome.
    pub(crate) fn commit(&self, txn: WriteTransaction) -> Result<(), Error> {
        let result = txn.commit();
        // Whether or not it reached the file, before anyone is answered (engine/snapshot.rs).
        self.inner.snapshot.committed();
        if let Err(e) = result {
            let source: redb::Error = e.into();
            self.latch(&source);
            return Err(Error::OutcomeUnknown {
                source: redb_error(source),
            });
        }
        Ok(())
    }

    /// Aborts a transaction; a failure to abort is an I/O failure and latches.
    pub(crate) fn abort(&self, txn: WriteTransaction) {
        if let Err(e) = txn.abort() {
            self.latch(&e);
        }
    }
}
