//! The transaction handle given to the caller's closure.

use std::cell::Cell;

use redb::{
    Key, MultimapTable, MultimapTableDefinition, MultimapTableHandle, TableDefinition, TableHandle,
    Value,
};

use crate::engine::journal::{Table, Wtx};
use crate::engine::store::Store;
use crate::engine::tables::RESERVED_PREFIX;
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::outbox::Origin;
use crate::model::response::Abort;

/// The write transaction that will also commit the idempotency record. Open your own tables
/// on it: your writes and the record commit together or not at all.
///
/// idem's own tables (names starting with [`RESERVED_PREFIX`]) cannot be opened here. In
/// journal mode ([`crate::StoreBuilder::journal`]) a batch that opens a table not registered
/// with [`crate::StoreBuilder::journal_table`] (or any multimap table) is committed to redb
/// durably instead of journaled: correct either way, fast only for registered tables.
pub struct Tx<'t> {
    /// The store whose write runs this closure: an I/O failure met through this handle latches
    /// its fail-stop at once, whatever the closure then makes of the error.
    store: &'t Store,
    txn: Wtx<'t>,
    now: Timestamp,
    /// What this transaction commits (a record, an inbox mark, and which generation of it):
    /// the root of the stable ids of the outbox events it pushes.
    origin: Origin<'t>,
    /// Work announced so far by this run of the closure (outbox pushes): after the transaction
    /// commits, the store wakes whoever waits for work ([`crate::engine::signal::Signal`]).
    announced: Cell<u32>,
}

impl<'t> Tx<'t> {
    pub(crate) fn new(store: &'t Store, txn: Wtx<'t>, now: Timestamp, origin: Origin<'t>) -> Self {
        Tx {
            store,
            txn,
            now,
            origin,
            announced: Cell::new(0),
        }
    }

    /// The batch's write handle, for the layers built on the engine (the outbox, version
    /// marks).
    pub(crate) fn raw(&self) -> Wtx<'t> {
        self.txn
    }

    /// A redb error met in this transaction, through the store's latch (see
    /// [`Store::storage`]).
    pub(crate) fn storage(&self, e: impl Into<redb::Error>) -> Error {
        self.store.storage(e)
    }

    pub(crate) fn origin(&self) -> Origin<'t> {
        self.origin
    }

    /// Announces one piece of work for a background worker of the layers above (an outbox
    /// event for the dispatcher) and numbers it within this run of the closure (0, 1, 2, …).
    pub(crate) fn announce(&self) -> u32 {
        let n = self.announced.get();
        self.announced.set(n.saturating_add(1));
        n
    }

    /// Whether this run of the closure announced any work.
    pub(crate) fn announced(&self) -> bool {
        self.announced.get() > 0
    }

    /// Opens (creating if needed) one of the caller's tables in this transaction, as idem's
    /// [`Table`]: its reads (`get`, `range`, `iter`, `first`, `last`, `len`, `is_empty`) see
    /// every write made before them in the batch, and its writes (`insert`, `remove`,
    /// `pop_first`, `pop_last`, `retain`, `retain_in`) are recorded in the batch's journal
    /// entry in journal mode. The methods take redb's arguments and give redb's results, with
    /// idem's [`Guard`](crate::store::Guard) and [`Range`](crate::store::Range) for values read.
    pub fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'t, K, V>, Error> {
        check_name(definition.name())?;
        // Looked up in journal mode only: direct mode's claims pay nothing for it.
        let known =
            !self.txn.journaled() || self.store.journal_table_known::<K, V>(definition.name());
        if self.txn.in_view() && !known {
            // The member runs again on redb's own transaction (`engine/commit.rs`), whatever
            // the closure makes of this error.
            self.txn.unjournaled();
            return Err(on_redb(definition.name()));
        }
        let table = self
            .txn
            .open_table(definition)
            .map_err(|e| self.storage(e))?;
        // `TableDefinition` is `Copy`: its name is still here after the open.
        if self.txn.journaled() && !known {
            self.txn.unjournaled();
            self.store.warn_unjournaled(
                definition.name(),
                "not registered with StoreBuilder::journal_table (or registered with other key or value types)",
            );
        }
        Ok(table)
    }

    /// Opens (creating if needed) one of the caller's multimap tables in this transaction.
    pub fn open_multimap_table<K: Key + 'static, V: Key + 'static>(
        &self,
        definition: MultimapTableDefinition<K, V>,
    ) -> Result<MultimapTable<'t, K, V>, Error> {
        check_name(definition.name())?;
        // Its writes are not captured: the batch commits durably, needing no replay.
        if self.txn.journaled() {
            self.txn.unjournaled();
            self.store
                .warn_unjournaled(definition.name(), "a multimap table");
        }
        let Some(txn) = self.txn.redb() else {
            // A view: the member runs again on redb's own transaction (`engine/commit.rs`).
            return Err(on_redb(definition.name()));
        };
        txn.open_multimap_table(definition)
            .map_err(|e| self.storage(e))
    }

    /// The store clock's time at which this transaction decided to run.
    pub fn now(&self) -> Timestamp {
        self.now
    }
}

/// What a closure sees when it opens, on a view, a table the journal cannot replay: it never
/// reaches the caller, since the member runs again on redb's own transaction.
fn on_redb(name: &str) -> Error {
    Error::Config {
        reason: format!(
            "the table `{name}` cannot be journaled (a multimap table, or one not registered with StoreBuilder::journal_table): this run of the closure is discarded and the call runs again on redb's own write transaction"
        ),
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

// `?` on a redb error in a caller's closure gives `Abort::Store`; the write that runs the closure
// observes it (latching fail-stop for an I/O failure). There is deliberately no
// `From<redb::…> for Error`: inside idem every redb error goes through the latch
// (`Store::storage`, `Store::observe`, `Store::read`) or, where nothing can be latched, through
// `unlatched` (engine/boundary.rs).
macro_rules! redb_into_abort {
    ($($t:ty),*) => {$(
        impl From<$t> for Abort {
            fn from(e: $t) -> Self {
                Abort::Store(Error::Storage {
                    source: crate::engine::boundary::redb_error(e),
                })
            }
        }
    )*};
}
redb_into_abort!(
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::DatabaseError,
    redb::CompactionError,
    redb::SetDurabilityError
);
