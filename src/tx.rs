//! The transaction handle given to the caller's closure.

use redb::{
    Key, MultimapTable, MultimapTableDefinition, MultimapTableHandle, Table, TableDefinition,
    TableHandle, Value, WriteTransaction,
};

use crate::clock::Timestamp;
use crate::error::Error;
use crate::tables::RESERVED_PREFIX;

/// The write transaction that will also commit the idempotency record. Open your own tables
/// on it: your writes and the record commit together or not at all.
///
/// idem's own tables (names starting with [`RESERVED_PREFIX`]) cannot be opened here.
pub struct Tx<'t> {
    txn: &'t WriteTransaction,
    now: Timestamp,
}

impl<'t> Tx<'t> {
    pub(crate) fn new(txn: &'t WriteTransaction, now: Timestamp) -> Self {
        Tx { txn, now }
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
