//! Opening a PostgreSQL store: the settings and their documented defaults
//! ([`PgStoreBuilder`]), the connection pool, and the schema an open creates or checks.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, StorageError};
use crate::model::clock::{Clock, Timestamp};
use crate::model::settings::{Config, common_settings};
use crate::postgres::commit::Group;
use crate::postgres::conn::{Manager, PoolError, storage};
use crate::postgres::schema::{Sql, migrate};
use crate::postgres::store::{Inner, PgStore, TimeSource};
use crate::runtime::group::GroupConfig;
use crate::runtime::signal::Signal;

/// Builds a [`PgStore`]. The settings every engine shares have the file store's defaults
/// ([`crate::StoreBuilder`]); the PostgreSQL ones:
///
/// | setting | default |
/// |---|---|
/// | [`schema`](Self::schema) | `idem` (the PostgreSQL schema of idem's tables) |
/// | [`writers`](Self::writers) | 4 transactions of grouped callers in flight at once |
/// | [`pool_size`](Self::pool_size) | `writers` + 8 connections |
/// | [`pool_timeout`](Self::pool_timeout) | 5 s to get a connection, then [`Error::Storage`] |
/// | [`connect_timeout`](Self::connect_timeout) | 5 s per connection attempt |
/// | [`max_batch`](Self::max_batch) | 256 requests per shared transaction |
/// | [`max_queue`](Self::max_queue) | 4,096 requests waiting for a transaction |
/// | [`queue_timeout`](Self::queue_timeout) | 5 s, then [`Error::Busy`] |
/// | [`clock`](Self::clock) | the database server's clock |
/// | retention, horizon, lease, limits, sweeps, inbox retention | as [`crate::StoreBuilder`] |
///
/// Opening connects, then creates the schema's tables if they are missing (every process of a
/// fleet may open at once: the first creates them, the others wait for it and check them), or
/// checks their version.
///
/// # Example
///
/// (`no_run`: it needs a server.)
///
/// ```no_run
/// use std::time::Duration;
/// use idem::RetentionPolicy;
/// use idem::postgres::PgStore;
///
/// const HOUR: Duration = Duration::from_secs(3600);
///
/// # fn main() -> Result<(), idem::Error> {
/// let store = PgStore::builder("postgresql://app@db.internal:5432/payments")
///     .schema("idem_payments") // two fleets on one database keep apart by schema
///     .writers(4)
///     .pool_size(16)
///     .lease_duration(Duration::from_secs(60))
///     .retention_policy(RetentionPolicy::new().client_retry(24 * HOUR).settlement(7 * 24 * HOUR))
///     .sweep_interval(Duration::from_secs(60))
///     .open()?;
/// assert_eq!(store.schema(), "idem_payments");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PgStoreBuilder {
    url: String,
    config: Config,
    schema: String,
    writers: usize,
    pool_size: Option<u32>,
    pool_timeout: Duration,
    connect_timeout: Duration,
    group: GroupConfig,
    clock: Option<Arc<dyn Clock>>,
}

impl PgStoreBuilder {
    /// A builder for the database at `url` (`postgresql://user@host:port/db`, or libpq's
    /// `key=value` form), with the defaults above.
    pub fn new(url: impl Into<String>) -> Self {
        PgStoreBuilder {
            url: url.into(),
            config: Config::default(),
            schema: "idem".into(),
            writers: 4,
            pool_size: None,
            pool_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            group: GroupConfig {
                max_batch: 256,
                max_queue: 4096,
                queue_timeout: Duration::from_secs(5),
                lanes: 4,
            },
            clock: None,
        }
    }

    common_settings!();

    /// The PostgreSQL schema that holds idem's tables (a plain lowercase identifier). Every
    /// process of a fleet must name the same one; two fleets (or tests) on one database keep
    /// apart by naming different ones. Default `idem`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// How many transactions of grouped callers may run at once, each on its own connection
    /// (the server runs them in parallel, and while one waits for its round trip or its commit
    /// the others work; more writers also mean smaller groups). Default 4
    /// (`cargo bench -p idem-benches --features postgres --bench pg_throughput` measures 1, 2
    /// and 4).
    pub fn writers(mut self, writers: usize) -> Self {
        self.writers = writers;
        self.group.lanes = writers;
        self
    }

    /// The most connections the store opens (writers, reads, the dispatcher and the sweeper
    /// share them). Default `writers + 8`.
    pub fn pool_size(mut self, connections: u32) -> Self {
        self.pool_size = Some(connections);
        self
    }

    /// How long a call waits for a free connection before [`Error::Storage`]. Default 5 s.
    pub fn pool_timeout(mut self, wait: Duration) -> Self {
        self.pool_timeout = wait;
        self
    }

    /// How long one connection attempt may take. Default 5 s.
    pub fn connect_timeout(mut self, wait: Duration) -> Self {
        self.connect_timeout = wait;
        self
    }

    /// The most requests that share one transaction. Default 256.
    pub fn max_batch(mut self, requests: usize) -> Self {
        self.group.max_batch = requests;
        self
    }

    /// The most requests that may wait for a transaction; beyond it callers block up to
    /// [`queue_timeout`](Self::queue_timeout), then get [`Error::Busy`]. Default 4,096.
    pub fn max_queue(mut self, requests: usize) -> Self {
        self.group.max_queue = requests;
        self
    }

    /// How long a caller waits for room in a full queue before [`Error::Busy`]. Default 5 s.
    pub fn queue_timeout(mut self, wait: Duration) -> Self {
        self.group.queue_timeout = wait;
        self
    }

    /// Replaces the database server's clock by `clock` for every expiry and lease decision
    /// (inject a [`crate::clock::ManualClock`] in tests). In production leave it: the server's
    /// clock is the one clock every node of the fleet agrees on.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    fn validate(&self) -> Result<(), Error> {
        if self.group.max_batch == 0 || self.group.max_queue == 0 || self.writers == 0 {
            return Err(Error::Config {
                reason: "max_batch, max_queue and writers must be at least 1".into(),
            });
        }
        if self
            .pool_size
            .is_some_and(|n| (n as usize) < self.writers + 1)
        {
            return Err(Error::Config {
                reason: format!(
                    "pool_size must be at least writers + 1 ({}): the writers each hold a connection while reads need another",
                    self.writers + 1
                ),
            });
        }
        self.config.validate()
    }

    /// Connects, creates or checks the schema, and returns the store. A server that cannot be
    /// reached is [`Error::Storage`] (the message names the address); a schema of a newer idem
    /// release is [`Error::UnsupportedFormat`]; a schema of that name that is not idem's is
    /// [`Error::CorruptStore`].
    pub fn open(self) -> Result<PgStore, Error> {
        self.open_with(Create::Yes)
    }

    /// Opens the store like [`open`](Self::open), but never creates its tables: a schema
    /// without idem's tables is [`Error::Storage`] ("no idem store"). For operators' tools,
    /// which must not turn a mistyped URL or schema into a new, empty store.
    pub fn open_existing(self) -> Result<PgStore, Error> {
        self.open_with(Create::No)
    }

    fn open_with(self, create: Create) -> Result<PgStore, Error> {
        self.validate()?;
        let sql = Sql::new(&self.schema)?;
        let mut pg = postgres::Config::from_str(&self.url).map_err(|e| Error::Config {
            reason: format!(
                "the PostgreSQL URL does not parse ({e}): use postgresql://user@host:port/database"
            ),
        })?;
        pg.connect_timeout(self.connect_timeout);
        let max_size = self.pool_size.unwrap_or(self.writers as u32 + 8);
        let pool = r2d2::Pool::builder()
            .max_size(max_size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(self.pool_timeout)
            .error_handler(Box::new(r2d2::NopErrorHandler))
            .build_unchecked(Manager { config: pg.clone() });
        // The first connection is made here, so an unreachable server is reported as such.
        let mut first = r2d2::ManageConnection::connect(&Manager { config: pg })
            .map_err(|e| unreachable_server(&self.url, e))?;
        if create == Create::No {
            require_schema(&mut first.client, &sql)?;
        }
        migrate(&mut first.client, &sql)?;
        let server_now = first
            .client
            .query_one(&format!("SELECT {}", crate::postgres::conn::NOW_MS), &[])
            .map_err(storage)?
            .get::<_, i64>(0);
        drop(first);
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| Error::Random {
            reason: e.to_string(),
        })?;
        let time = match self.clock {
            Some(c) => TimeSource::Clock(c),
            None => TimeSource::Server,
        };
        let inner = Inner {
            pool,
            pool_timeout: self.pool_timeout,
            reconnects: max_size + 1,
            sql,
            config: self.config,
            time,
            group: Group::new(self.group),
            instance,
            next_token: AtomicU64::new(0),
            seen_server: Mutex::new((
                Timestamp(u64::try_from(server_now).unwrap_or(0)),
                Instant::now(),
            )),
            lease_events: Mutex::new(0),
            lease_changed: Condvar::new(),
            work: Arc::new(Signal::default()),
            extensions: Mutex::new(HashMap::new()),
            sweeper: Mutex::new(None),
            #[cfg(feature = "__internal_whitebox")]
            hooks: Default::default(),
        };
        let store = PgStore {
            inner: Arc::new(inner),
        };
        if let Some(every) = store.config().sweep_interval {
            let sweeper = crate::postgres::sweep::Sweeper::start(&store, every)?;
            *store.inner.sweeper.lock() = Some(sweeper);
        }
        Ok(store)
    }
}

/// Whether opening may create idem's tables.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Create {
    Yes,
    No,
}

/// Refuses a schema without idem's `meta` table.
fn require_schema(client: &mut postgres::Client, sql: &Sql) -> Result<(), Error> {
    let found: Option<String> = client
        .query_one(&format!("SELECT to_regclass('{}')::text", sql.meta), &[])
        .map_err(storage)?
        .get(0);
    if found.is_none() {
        return Err(Error::Storage {
            source: StorageError::new(PoolError(format!(
                "no idem store in PostgreSQL schema {:?} on this database: check the URL and the schema name, or create it (`idem pg migrate`, or any service opening the store)",
                sql.schema
            ))),
        });
    }
    Ok(())
}

/// The server at `url` did not answer a connection.
fn unreachable_server(url: &str, e: postgres::Error) -> Error {
    // The URL may carry a password: name the host part only.
    let shown = url.rsplit('@').next().unwrap_or(url);
    Error::Storage {
        source: StorageError::new(PoolError(format!(
            "could not connect to PostgreSQL at {shown} ({e}): check that the server runs and the URL, user and database are right"
        ))),
    }
}

impl PgStore {
    /// A builder for a store on the database at `url`.
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder::new(url)
    }

    /// Opens a store on the database at `url` with the default settings (schema `idem`).
    pub fn open(url: impl Into<String>) -> Result<PgStore, Error> {
        PgStoreBuilder::new(url).open()
    }
}
