//! The record tables, opened once for a run of batch members instead of once per read or
//! write: opening a redb table looks its root up, and closing it writes the root back, work
//! repeated for every member otherwise.
//!
//! Invariant: an [`Open`] lives only while its thread holds the batch's transaction and runs
//! idem's own work in it, and is dropped before the transaction moves on (to another member's
//! thread, a commit, an abort). No caller code opens these tables (the reserved prefix,
//! `engine/tx.rs`), so holding them open while a caller's closure runs conflicts with nothing.

use redb::TableError;

use crate::engine::expiry::{ExpiryTable, RecordsTable};
use crate::engine::journal::Wtx;
use crate::engine::tables::{EXPIRY, RECORDS};

/// A batch's write transaction with its record and expiry tables, each opened on first use.
pub(crate) struct Open<'t> {
    txn: Wtx<'t>,
    records: Option<RecordsTable<'t>>,
    expiry: Option<ExpiryTable<'t>>,
}

impl<'t> Open<'t> {
    /// Nothing opened yet.
    pub(crate) fn new(txn: Wtx<'t>) -> Self {
        Open {
            txn,
            records: None,
            expiry: None,
        }
    }

    /// The transaction, for everything else (the caller's tables, the outbox).
    pub(crate) fn txn(&self) -> Wtx<'t> {
        self.txn
    }

    /// The records table.
    pub(crate) fn records(&mut self) -> Result<&mut RecordsTable<'t>, TableError> {
        opened(&mut self.records, || self.txn.open_table(RECORDS))
    }

    /// The records table and the expiry index.
    pub(crate) fn both(
        &mut self,
    ) -> Result<(&mut RecordsTable<'t>, &mut ExpiryTable<'t>), TableError> {
        let txn = self.txn;
        let records = opened(&mut self.records, || txn.open_table(RECORDS))?;
        let expiry = opened(&mut self.expiry, || txn.open_table(EXPIRY))?;
        Ok((records, expiry))
    }
}

/// The table in `slot`, opened by `open` on first use.
fn opened<T>(
    slot: &mut Option<T>,
    open: impl FnOnce() -> Result<T, TableError>,
) -> Result<&mut T, TableError> {
    let table = match slot.take() {
        Some(t) => t,
        None => open()?,
    };
    Ok(slot.insert(table))
}
