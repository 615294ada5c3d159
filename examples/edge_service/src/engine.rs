//! What the service needs of a store ([`Engine`], [`Books`]) and the file store's
//! implementation of it, and how the service opens its store file.

use std::time::Duration;

use idem::http::{Backend, BackendLease};
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, Event, Publisher, StoredEvent,
};
use idem::redb::ReadableTable;
use idem::{Abort, Store, Tx};

use crate::*;

/// The transaction handle a handler writes through on engine `E` (`&Tx` on the file store,
/// `&mut PgTx` on PostgreSQL).
pub type TxOf<'t, E> = <<E as Backend>::Lease as BackendLease>::Tx<'t>;

/// What the service needs of its store besides the layer's [`Backend`]: its reads and its
/// dispatcher. Implemented by the file store ([`Store`]) and, with the `postgres` feature, by
/// `idem::postgres::PgStore` (its tables in the store's schema, see `pg`).
pub trait Engine: Backend {
    /// The stored row of payment `id` (`{"tenant", "payment"}` as JSON), if any.
    fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError>;
    /// The tenant's ledger: its number of entries and their sum (`None` if it leaves `i64`).
    fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError>;
    /// The oldest `limit` undelivered events.
    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, idem::Error>;
    /// The oldest `limit` dead letters.
    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error>;
    /// Starts the store's outbox dispatcher.
    fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, idem::Error>;
    /// The failure the store stopped after, if it did (the file store's fail-stop: every write
    /// fails until the service restarts). `None` by default: an engine without a latch.
    fn fail_stop_cause(&self) -> Option<String> {
        None
    }
}

/// The bookings a handler makes inside the transaction that records its answer: implemented
/// for each engine's transaction handle, so the payment logic ([`capture`], [`refund`]) is
/// written once.
pub trait Books {
    /// The tenant's ledger total (0 for a new tenant), locked for this transaction.
    fn total(&mut self, tenant: &str) -> Result<i64, Abort>;
    /// The stored row of payment `id`.
    fn payment(&mut self, id: &str) -> Result<Option<String>, Abort>;
    /// Stores the row of payment `id`.
    fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort>;
    /// Books the tenant's ledger entry `entry` (`{payment id}:capture`, `…:refund`) of `amount`
    /// and sets the tenant's total to `total`.
    fn book(&mut self, tenant: &str, entry: &str, amount: i64, total: i64) -> Result<(), Abort>;
    /// Pushes an outbox event.
    fn push(&mut self, event: Event) -> Result<(), Abort>;
}

/// The file store's bookings: redb tables in the store's file.
impl Books for &Tx<'_> {
    fn total(&mut self, tenant: &str) -> Result<i64, Abort> {
        let totals = self.open_table(LEDGER_TOTALS)?;
        Ok(totals.get(tenant)?.map_or(0, |v| v.value()))
    }

    fn payment(&mut self, id: &str) -> Result<Option<String>, Abort> {
        let payments = self.open_table(PAYMENTS)?;
        Ok(payments.get(id)?.map(|v| v.value().to_owned()))
    }

    fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort> {
        self.open_table(PAYMENTS)?.insert(id, row)?;
        Ok(())
    }

    fn book(&mut self, tenant: &str, entry: &str, amount: i64, total: i64) -> Result<(), Abort> {
        let key = format!("{tenant}\0{entry}");
        self.open_table(LEDGER)?.insert(key.as_str(), amount)?;
        self.open_table(LEDGER_TOTALS)?.insert(tenant, total)?;
        Ok(())
    }

    fn push(&mut self, event: Event) -> Result<(), Abort> {
        self.outbox().push(event)?;
        Ok(())
    }
}

impl Engine for Store {
    fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError> {
        let txn = self.read_transaction()?;
        let table = match txn.open_table(PAYMENTS) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(table.get(id)?.map(|v| v.value().to_owned()))
    }

    fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError> {
        let txn = self.read_transaction()?;
        let table = match txn.open_table(LEDGER) {
            Ok(t) => t,
            Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok((0, Some(0))),
            Err(e) => return Err(e.into()),
        };
        let (from, to) = (format!("{tenant}\0"), format!("{tenant}\u{1}"));
        let mut entries = 0u64;
        let mut total = Some(0i64);
        for row in table.range(from.as_str()..to.as_str())? {
            let (_, amount) = row?;
            entries += 1;
            total = total.and_then(|t| t.checked_add(amount.value()));
        }
        Ok((entries, total))
    }

    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, idem::Error> {
        Store::pending_events(self, limit)
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error> {
        Store::dead_letters(self, limit)
    }

    fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, idem::Error> {
        Store::start_dispatcher(self, publisher, options)
    }

    fn fail_stop_cause(&self) -> Option<String> {
        Store::fail_stop_cause(self)
    }
}

/// Opens the store the way the service does: sweeps every 10 minutes keep the file bounded;
/// `lease` is how long a request that died with the process (kill -9) blocks its key before a
/// retry takes it over (`--lease-ms`, default 30 s). After a kill the file is repaired before
/// the service listens (seconds per GB): its progress and its time are printed, so the start
/// does not look hung.
pub fn open_store(
    dir: &std::path::Path,
    lease: Duration,
) -> Result<Store, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let store = Store::builder()
        .sweep_interval(Duration::from_secs(600))
        .lease_duration(lease)
        .on_repair(|progress| {
            eprintln!(
                "edge_service: the store was not closed cleanly; repairing it: {:.0} %",
                progress.fraction() * 100.0
            );
        })
        .open(dir.join("idem.redb"))?;
    if let Some(took) = store.repair_time() {
        eprintln!(
            "edge_service: the store was repaired in {:.2} s",
            took.as_secs_f64()
        );
    }
    Ok(store)
}
