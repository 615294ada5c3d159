//! The transaction handle given to the caller's closure.

use redb::{
    Key, MultimapTable, MultimapTableDefinition, MultimapTableHandle, Table, TableDefinition,
    TableHandle, Value, WriteTransaction,
};

use crate::engine::tables::RESERVED_PREFIX;
use crate::error::Error;
use crate::messaging::outbox::Origin;
use crate::model::clock::Timestamp;

/// The write transaction that will also commit the idempotency record. Open your own tables
/// on it: your writes and the record commit together or not at all.
///
/// idem's own tables (names starting with [`RESERVED_PREFIX`]) cannot be opened here.
pub struct Tx<'t> {
    txn: &'t WriteTransaction,
    now: Timestamp,
    /// What this transaction commits (a record, an inbox mark, and which generation of it):
    /// the root of the stable ids of the outbox events it pushes.
    origin: Origin<'t>,
    /// Outbox events pushed so far by this run of the closure.
    pushed: std::cell::Cell<u32>,
}

impl<'t> Tx<'t> {
    pub(crate) fn new(txn: &'t WriteTransaction, now: Timestamp, origin: Origin<'t>) -> Self {
        Tx {
            txn,
            now,
            origin,
            pushed: std::cell::Cell::new(0),
        }
    }

    /// The transactional outbox: events pushed here commit with this transaction's writes, or
    /// not at all. See [`crate::Outbox`].
    pub fn outbox(&self) -> crate::messaging::outbox::Outbox<'_, 't> {
        crate::messaging::outbox::Outbox::new(self)
    }

    /// Per-entity version high-water marks, updated in this transaction. See
    /// [`crate::Versions`].
    pub fn versions(&self) -> crate::messaging::order::Versions<'_, 't> {
        crate::messaging::order::Versions::new(self)
    }

    pub(crate) fn raw(&self) -> &'t WriteTransaction {
        self.txn
    }

    pub(crate) fn origin(&self) -> Origin<'t> {
        self.origin
    }

    /// Numbers the next event pushed by this run of the closure (0, 1, 2, …).
    pub(crate) fn next_push(&self) -> u32 {
        let n = self.pushed.get();
        self.pushed.set(n.saturating_add(1));
        n
    }

    /// Opens (creating if needed) one of the caller's tables in this transaction.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'t, K, V>, Error> {
        check_name(definition.name())?;
        Ok(self.txn.open_table(definition)?)
    }

    /// Opens (creating if needed) one of the caller's multimap tables in this transaction.
    pub fn open_multimap_table<K: Key + 'static, V: Key + 'static>(
        &self,
        definition: MultimapTableDefinition<K, V>,
    ) -> Result<MultimapTable<'t, K, V>, Error> {
        check_name(definition.name())?;
        Ok(self.txn.open_multimap_table(definition)?)
    }

    /// The store clock's time at which this transaction decided to run.
    pub fn now(&self) -> Timestamp {
        self.now
    }
}

fn check_name(name: &str) -> Result<(), Error> {
    if name.starts_with(RESERVED_PREFIX) {
        return Err(Error::ReservedTable {
            name: name.to_owned(),
            prefix: RESERVED_PREFIX,
        });
    }
    Ok(())
}
