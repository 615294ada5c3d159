//! The caller's own table the tests and fuzz targets write their side effects to: effect label
//! → how many times the effect happened. Shared by `tests/common` and `tests/sim`.

use idem::redb::{ReadableTable, TableDefinition};
use idem::{Abort, Store, Tx};

/// The caller's effect table.
pub const EFFECTS: TableDefinition<&str, u64> = TableDefinition::new("test.effects");

/// Increments the effect counter `label`, inside the closure's transaction.
pub fn bump(tx: &Tx<'_>, label: &str) -> Result<(), Abort> {
    let mut table = tx.open_table(EFFECTS)?;
    let n = table.get(label)?.map_or(0, |v| v.value());
    table.insert(label, n + 1)?;
    Ok(())
}

/// Every effect counter (label → count), in label order, through the open store's read snapshot.
pub fn all_effects(store: &Store) -> Vec<(String, u64)> {
    let read = store.read_transaction().expect("read txn");
    let table = match read.open_table(EFFECTS) {
        Ok(t) => t,
        Err(idem::redb::TableError::TableDoesNotExist(_)) => return Vec::new(),
        Err(e) => panic!("open effects table: {e}"),
    };
    table
        .iter()
        .expect("iter effects")
        .map(|row| {
            let (k, v) = row.expect("effects row");
            (k.value().to_owned(), v.value())
        })
        .collect()
}
