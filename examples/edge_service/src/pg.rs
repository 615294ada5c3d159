//! The service on PostgreSQL (`--postgres URL`): idem's tables and the service's own
//! (`payments`, `ledger`, `ledger_totals`) in one PostgreSQL schema (`--pg-schema`), so every
//! replica of the service on that database shares the keys, the payments and the outbox.

use std::sync::OnceLock;
use std::time::Duration;

use idem::Abort;
use idem::outbox::{
    DeadLetter, DispatcherHandle, DispatcherOptions, Event, Publisher, StoredEvent,
};
use idem::postgres::{PgStore, PgTx};

use super::{Books, Engine};

/// The schema of the service's tables (one per process: set once, by [`open_store`]).
static SCHEMA: OnceLock<String> = OnceLock::new();

fn table(name: &str) -> String {
    format!(
        "{}.{name}",
        SCHEMA.get().map_or("edge_service", String::as_str)
    )
}

/// Opens the store on `url` in `schema` (created with its tables if missing), with sweeps
/// every 10 minutes and `lease` as the lease duration.
pub fn open_store(
    url: &str,
    schema: &str,
    lease: Duration,
) -> Result<PgStore, Box<dyn std::error::Error>> {
    if SCHEMA.get_or_init(|| schema.to_owned()) != schema {
        return Err("one process serves one PostgreSQL schema".into());
    }
    let store = PgStore::builder(url)
        .schema(schema)
        .sweep_interval(Duration::from_secs(600))
        .lease_duration(lease)
        .open()?;
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    client.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {p} (id text PRIMARY KEY, row text NOT NULL);
         CREATE TABLE IF NOT EXISTS {l} (tenant text NOT NULL, entry text NOT NULL, amount int8 NOT NULL, PRIMARY KEY (tenant, entry));
         CREATE TABLE IF NOT EXISTS {t} (tenant text PRIMARY KEY, total int8 NOT NULL);",
        p = table("payments"),
        l = table("ledger"),
        t = table("ledger_totals"),
    ))?;
    Ok(store)
}

/// The bookings on PostgreSQL: the service's tables, in the store's transaction.
impl Books for &mut PgTx<'_> {
    fn total(&mut self, tenant: &str) -> Result<i64, Abort> {
        let totals = table("ledger_totals");
        // The tenant's row exists and is locked from here on: concurrent bookings of one
        // tenant take turns, so the checked sum is never computed from a stale total.
        self.execute(
            &format!("INSERT INTO {totals} (tenant, total) VALUES ($1, 0) ON CONFLICT (tenant) DO NOTHING"),
            &[&tenant],
        )?;
        let row = self.query_one(
            &format!("SELECT total FROM {totals} WHERE tenant = $1 FOR UPDATE"),
            &[&tenant],
        )?;
        Ok(row.get(0))
    }

    fn payment(&mut self, id: &str) -> Result<Option<String>, Abort> {
        let row = self.query_opt(
            &format!(
                "SELECT row FROM {} WHERE id = $1 FOR UPDATE",
                table("payments")
            ),
            &[&id],
        )?;
        Ok(row.map(|r| r.get(0)))
    }

    fn put_payment(&mut self, id: &str, row: &str) -> Result<(), Abort> {
        self.execute(
            &format!(
                "INSERT INTO {} (id, row) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET row = EXCLUDED.row",
                table("payments")
            ),
            &[&id, &row],
        )?;
        Ok(())
    }

    fn book(&mut self, tenant: &str, entry: &str, amount: i64, total: i64) -> Result<(), Abort> {
        self.execute(
            &format!(
                "INSERT INTO {} (tenant, entry, amount) VALUES ($1, $2, $3)",
                table("ledger")
            ),
            &[&tenant, &entry, &amount],
        )?;
        self.execute(
            &format!(
                "UPDATE {} SET total = $2 WHERE tenant = $1",
                table("ledger_totals")
            ),
            &[&tenant, &total],
        )?;
        Ok(())
    }

    fn push(&mut self, event: Event) -> Result<(), Abort> {
        self.outbox().push(event)?;
        Ok(())
    }
}

impl Engine for PgStore {
    fn payment(&self, id: &str) -> Result<Option<String>, idem::error::BoxError> {
        let mut c = self.client()?;
        let row = c.query_opt(
            &format!("SELECT row FROM {} WHERE id = $1", table("payments")),
            &[&id],
        )?;
        Ok(row.map(|r| r.get(0)))
    }

    fn ledger(&self, tenant: &str) -> Result<(u64, Option<i64>), idem::error::BoxError> {
        let mut c = self.client()?;
        // numeric: the sum of i64 entries never overflows here; one that leaves i64 is None.
        let row = c.query_one(
            &format!(
                "SELECT count(*), CASE WHEN sum(amount::numeric) BETWEEN -9223372036854775808 AND 9223372036854775807 THEN coalesce(sum(amount), 0)::int8 END FROM {} WHERE tenant = $1",
                table("ledger")
            ),
            &[&tenant],
        )?;
        Ok((u64::try_from(row.get::<_, i64>(0)).unwrap_or(0), row.get(1)))
    }

    fn pending_events(&self, limit: usize) -> Result<Vec<StoredEvent>, idem::Error> {
        PgStore::pending_events(self, limit)
    }

    fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>, idem::Error> {
        PgStore::dead_letters(self, limit)
    }

    fn start_dispatcher(
        &self,
        publisher: impl Publisher,
        options: DispatcherOptions,
    ) -> Result<DispatcherHandle, idem::Error> {
        PgStore::start_dispatcher(self, publisher, options)
    }
}
