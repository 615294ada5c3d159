//! The PostgreSQL side of the test harness: the server's URL, and a store on a schema of its
//! own that is dropped afterwards (tests run in parallel on one database; each schema keeps
//! them apart).
//!
//! The URL comes from `IDEM_PG_URL` (`eval "$(scripts/pg-test-cluster start)"` sets it). Without
//! it a test **fails** when `IDEM_REQUIRE_PG` or `CI` is set (`.ci/run` sets it: CI must run
//! these tests against the real server), and is skipped with a printed reason otherwise (a
//! laptop without PostgreSQL). A URL whose server does not answer always fails.

#![cfg(feature = "postgres")]

use std::sync::atomic::{AtomicU64, Ordering};

use idem::clock::ManualClock;
use idem::postgres::{PgStore, PgStoreBuilder};

use super::T0;

/// The test server's URL, or `None` (after printing why) when this machine has none and
/// PostgreSQL tests are not required.
pub fn pg_url() -> Option<String> {
    match std::env::var("IDEM_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required =
                std::env::var_os("IDEM_REQUIRE_PG").is_some() || std::env::var_os("CI").is_some();
            assert!(
                !required,
                "IDEM_PG_URL is not set but PostgreSQL tests are required here (IDEM_REQUIRE_PG or CI): \
                 start a server with `eval \"$(scripts/pg-test-cluster start)\"`"
            );
            eprintln!(
                "skipped: IDEM_PG_URL is not set; run `eval \"$(scripts/pg-test-cluster start)\"` to run the PostgreSQL tests"
            );
            None
        }
    }
}

/// A schema name no other test of this run (or of another process) uses.
pub fn fresh_schema(label: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let label: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .take(24)
        .collect();
    format!("t_{label}_{}_{n}", std::process::id())
}

/// A direct connection to the test server (to check effects and run the tests' own SQL).
pub fn client(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect to the test PostgreSQL server")
}

/// A PostgreSQL store on a fresh schema, driven by a manual clock; the schema is dropped when
/// the harness is.
pub struct PgHarness {
    pub url: String,
    pub schema: String,
    pub clock: ManualClock,
    builder: PgStoreBuilder,
    store: Option<PgStore>,
}

impl PgHarness {
    /// Default settings, manual clock at [`T0`]; `None` when PostgreSQL tests are skipped here.
    pub fn new(label: &str) -> Option<Self> {
        Self::with(label, |b| b)
    }

    /// Custom settings (the manual clock and the schema are added by the harness).
    pub fn with(
        label: &str,
        configure: impl FnOnce(PgStoreBuilder) -> PgStoreBuilder,
    ) -> Option<Self> {
        let url = pg_url()?;
        let schema = fresh_schema(label);
        let clock = ManualClock::new(T0);
        let builder = configure(PgStore::builder(&url))
            .schema(&schema)
            .clock(clock.clone());
        let store = builder.clone().open().expect("open the PostgreSQL store");
        Some(PgHarness {
            url,
            schema,
            clock,
            builder,
            store: Some(store),
        })
    }

    /// The open store.
    pub fn store(&self) -> &PgStore {
        self.store.as_ref().expect("store is closed")
    }

    /// Another store on the same schema and clock, as a second process would open it.
    pub fn open_another(&self) -> PgStore {
        self.builder.clone().open().expect("open a second store")
    }

    /// A direct connection to the test server.
    pub fn client(&self) -> postgres::Client {
        client(&self.url)
    }

    /// `{schema}.{name}`: a table of the test's own in the test's schema.
    pub fn table(&self, name: &str) -> String {
        format!("{}.{name}", self.schema)
    }
}

impl Drop for PgHarness {
    fn drop(&mut self) {
        self.store = None;
        if let Ok(mut c) = postgres::Client::connect(&self.url, postgres::NoTls) {
            let _ = c.batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
        }
    }
}
