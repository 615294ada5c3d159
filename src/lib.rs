//! # idem
//!
//! An embedded, single-node idempotency store: the same business intent causes at most one
//! side effect and always gets the same answer, as a local ACID fact on one redb file. For
//! services with no database server: edge services, queue workers, webhook receivers,
//! workflow activities.
//!
//! - **Flow A, local effects** ([`Store::execute`]): your writes to your own redb tables and the
//!   idempotency record commit in one write transaction, or neither does.
//! - **Flow B, external effects** ([`Store::begin`] → [`Lease`]): a fenced lease with a stable
//!   [`Lease::downstream_key`] for the provider you call; a stale holder can never complete.
//!
//! Keys are always scoped by tenant and operation ([`Scope`]); the request is stored only as a
//! fingerprint; the same key with a different payload is [`Error::PayloadMismatch`].
//!
//! ## Flow A: your writes and the answer commit together
//!
//! ```
//! use idem::{ExecuteAnswer, Request, Response, Scope, Store};
//! use redb::{ReadableTable, TableDefinition};
//!
//! const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("idem.redb"))?;
//! let place = || -> Result<ExecuteAnswer, idem::Error> {
//!     let req = Request::new(Scope::new("tenant-42", "create_order"), "order-123", &("sku-1", 2u32))?;
//!     store.execute(req, |tx| {
//!         let mut orders = tx.open_table(ORDERS)?;
//!         orders.insert("order-123", 2)?;
//!         Ok(Response::new(201, r#"{"id":"order-123"}"#).with_resource("order", "order-123"))
//!     })
//! };
//! let first = place()?;   // runs the closure: one order
//! let retry = place()?;   // the response was lost; the client retries with the same key
//! assert!(matches!(first, ExecuteAnswer::Ran(_)));
//! assert!(matches!(retry, ExecuteAnswer::Replayed(_)));
//! assert_eq!(first.response(), retry.response()); // same status and body, byte for byte
//! # let read = store.read_transaction()?;
//! # assert_eq!(read.open_table(ORDERS)?.get("order-123")?.map(|q| q.value()), Some(2));
//! # Ok(())
//! # }
//! ```
//!
//! ## Flow B: a call to another system, made with a stable key
//!
//! ```
//! use std::collections::HashMap;
//! use idem::{BeginAnswer, Request, Response, Scope, Store};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("idem.redb"))?;
//! // A payment provider that deduplicates on the idempotency key it is sent.
//! let mut provider: HashMap<String, u64> = HashMap::new();
//! let mut charge = |amount: u64| -> Result<Response, Box<dyn std::error::Error>> {
//!     let req = Request::new(Scope::new("tenant-42", "charge"), "invoice-7", &amount)?;
//!     Ok(match store.begin(req)? {
//!         BeginAnswer::Acquired(lease) => {
//!             // The same key on every attempt, even a takeover after a crash.
//!             provider.entry(lease.downstream_key().to_hex()).or_insert(amount);
//!             lease.complete(Response::new(200, "charged"))?
//!         }
//!         BeginAnswer::Replayed(stored) => stored,
//!         other => return Err(format!("not now: {other:?}").into()),
//!     })
//! };
//! let first = charge(1_000)?;
//! let retry = charge(1_000)?; // replayed: the provider is not called again
//! assert_eq!(first, retry);
//! assert_eq!(provider.len(), 1);
//! # Ok(())
//! # }
//! ```
//!
//! Not published yet (the package name `idem-store` is kept for the first release): add it from
//! a clone with `cargo add --path /path/to/idem` (the package is `idem-store`, the library
//! `idem`).
//!
//! ## Engines
//!
//! - **File store** ([`Store`]): one redb file, no server; group commit, fail-stop on I/O errors.
//! - **PostgreSQL** ([`PgStore`], feature `postgres`): the same API and guarantees for a fleet of
//!   processes sharing one database; closures get a `&mut PgTx` for your own SQL.
//!
//! ## Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `webhooks` | yes | [`webhook`]: GitHub and Standard Webhooks signature verification, before [`Store::receive`] |
//! | `http` | no | [`IdempotencyLayer`]: the `Idempotency-Key` layer for axum/hyper/tower services |
//! | `postgres` | no | [`PgStore`]: the PostgreSQL engine (`idem::postgres`) |
//! | `tokio` | no | [`AsyncStore`]: either engine from async code, off the runtime, with a bound on calls in flight (`idem::asynchronous`) |
//! | `cli` | no | the `idem` operator binary: `stats`, `get`, `export`, `check`, `purge`, `sweep`, `compact` (and `pg` for PostgreSQL) |
//!
//! ## Where to start
//!
//! Every entry point below has an example that runs as a doctest:
//!
//! - flow A: [`Store::execute`]; flow B: [`Store::begin`], [`Lease`], [`Store::begin_wait`];
//! - messages: [`Store::process`] (inbox), [`Store::receive`] with the [`webhook`] verifiers;
//! - events: [`Tx::outbox`] and [`Store::start_dispatcher`] (transactional outbox);
//! - settings: [`StoreBuilder`], [`RetentionPolicy`] ([`StoreBuilder::retention_policy`]);
//! - HTTP: [`IdempotencyLayer`] with axum (feature `http`);
//! - PostgreSQL: [`PgStore::execute`], [`PgStore::begin`], [`PgStore::process`],
//!   [`PgStoreBuilder`] (feature `postgres`; their examples need a server, so they only compile).
//!
//! ## Documents
//!
//! - [`docs::design`]: the layers, a record's lifecycle, the invariants and the crash-safety
//!   argument, operation by operation;
//! - [`docs::format`]: every stored byte (records, marks, outbox event ids, the HTTP layer's
//!   formats) and the compatibility rules;
//! - [`docs::http`]: the HTTP contract of the `Idempotency-Key` layer;
//! - [`docs::postgres`]: the PostgreSQL engine: its tables, the fleet's clock, group commit,
//!   failures and crash safety, what it does not guarantee;
//! - [`docs::reliability`]: every guarantee (and non-guarantee) with the tests that hold it, the
//!   fault model, which test checks which invariant, the figures;
//! - [`docs::guide`]: the caller's API beyond the two flows (closure results, flow B's lease
//!   calls, every answer and error, inbox, outbox, webhooks, async callers);
//! - [`docs::configuration`], [`docs::observability`], [`docs::operations`] (deployment, crash
//!   recovery, damaged files, backups) and [`docs::cli`] (the `idem` binary).
//!
//! The repository's `README.md` lists the guarantees in one page, each linking to its tests.
//!

// Links to items behind a feature: to the item when the feature is on (docs.rs builds with every
// feature), otherwise to the features table above, so a build without the feature has no
// broken link.
#![cfg_attr(feature = "postgres", doc = "[`PgStore`]: postgres::PgStore")]
#![cfg_attr(not(feature = "postgres"), doc = "[`PgStore`]: #features")]
#![cfg_attr(
    feature = "postgres",
    doc = "[`PgStore::execute`]: postgres::PgStore::execute"
)]
#![cfg_attr(not(feature = "postgres"), doc = "[`PgStore::execute`]: #features")]
#![cfg_attr(
    feature = "postgres",
    doc = "[`PgStore::begin`]: postgres::PgStore::begin"
)]
#![cfg_attr(not(feature = "postgres"), doc = "[`PgStore::begin`]: #features")]
#![cfg_attr(
    feature = "postgres",
    doc = "[`PgStore::process`]: postgres::PgStore::process"
)]
#![cfg_attr(not(feature = "postgres"), doc = "[`PgStore::process`]: #features")]
#![cfg_attr(
    feature = "postgres",
    doc = "[`PgStoreBuilder`]: postgres::PgStoreBuilder"
)]
#![cfg_attr(not(feature = "postgres"), doc = "[`PgStoreBuilder`]: #features")]
#![cfg_attr(feature = "tokio", doc = "[`AsyncStore`]: asynchronous::AsyncStore")]
#![cfg_attr(not(feature = "tokio"), doc = "[`AsyncStore`]: #features")]
#![cfg_attr(feature = "http", doc = "[`IdempotencyLayer`]: http::IdempotencyLayer")]
#![cfg_attr(not(feature = "http"), doc = "[`IdempotencyLayer`]: #features")]
#![cfg_attr(feature = "webhooks", doc = "[`webhook`]: webhook")]
#![cfg_attr(not(feature = "webhooks"), doc = "[`webhook`]: #features")]
// docs.rs builds with `--cfg docsrs` (Cargo.toml, `[package.metadata.docs.rs]`) on nightly: the
// feature-gated items then carry their "Available on crate feature ..." badge.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// The layers (docs/design.md, "Map"). Imports point one way: faces → messaging → engine →
// model; `error` is shared (tests/format/layers_import_one_way.rs checks the direction).
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod asynchronous;
pub mod backend;
pub(crate) mod engine;
pub mod error;
pub(crate) mod messaging;
pub(crate) mod model;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
pub(crate) mod runtime;

// ---- The everyday API: what a service names in most calls. ----
pub use engine::builder::{Durability, StoreBuilder};
pub use engine::lease::{BeginAnswer, Lease};
pub use engine::store::Store;
pub use engine::tx::Tx;
#[doc(inline)]
pub use error::Error;
pub use model::claim::Claim;
pub use model::clock::Timestamp;
pub use model::response::{Abort, ExecuteAnswer, Resource, Response, Tombstone};
pub use model::retention::RetentionPolicy;
pub use model::scope::{Request, Scope};
/// Re-export of the redb version idem is built on, so callers name the same table types.
pub use redb;
/// NOT PUBLIC API (feature `__internal_whitebox`): the journal's byte format and the broken
/// steps, for idem's own format and crash tests.
#[cfg(feature = "__internal_whitebox")]
#[doc(hidden)]
pub mod __journal {
    pub use crate::engine::journal::BrokenJournal;
    /// docs/FORMAT.md, "Journal", as code.
    pub mod format {
        pub use crate::engine::journal::format::*;
    }
}

/// NOT PUBLIC API (feature `__internal_whitebox`): the steps of a new store's creation, cut
/// short one at a time by idem's own tests.
#[cfg(feature = "__internal_whitebox")]
#[doc(hidden)]
pub mod __create {
    pub use crate::engine::create::fault::*;
}

// ---- Everything else, by topic. ----

/// Opening and running a store: its settings, figures and maintenance answers, and the
/// read-only view of a file.
pub mod store {
    pub use crate::engine::builder::{DEFAULT_CACHE_SIZE, Durability, StoreBuilder};
    pub use crate::engine::journal::{
        DEFAULT_CAPACITY as DEFAULT_JOURNAL_CAPACITY, DEFAULT_CHECKPOINT_BYTES,
        DEFAULT_PENDING_BYTES, Guard, Pair, Range, Table, journal_path,
    };
    pub use crate::engine::maintenance::{JournalMetrics, Metrics};
    pub use crate::engine::read_only::ReadOnlyStore;
    pub use crate::engine::repair::RepairProgress;
    pub use crate::engine::store::Store;
    pub use crate::model::reports::{Stats, SweepReport};
    pub use crate::model::retention::RetentionPolicy;
    pub use crate::model::scope::Limits;
    pub use crate::model::typed::ExecuteTypedAnswer;
}

/// Time: the store's clock (injectable, so expiry is tested without sleeping).
pub mod clock {
    pub use crate::model::clock::{Clock, ManualClock, SystemClock, Timestamp};
}

/// Request fingerprints and downstream keys (for the calls a step makes to other systems).
pub mod keys {
    pub use crate::model::keys::{
        DownstreamKey, Fingerprint, activity_key, compensation_key, derive_key,
    };
}

/// The pure rules every engine applies, as functions of stored values and time (no I/O):
/// for a reference model, a test, or to explain an answer.
pub mod rules {
    pub use crate::model::rules::{
        Decision, InboxDecision, SweepAction, VersionCheck, decide, decide_claim,
        heartbeat_deadline, holds_lease, inbox_decide, is_expired, is_forgotten, sweep_action,
        sweep_due, version_check,
    };
}

/// What is stored: records and their states, the format version, the reserved table prefix,
/// the HTTP layer's answer envelope, and the hex form idem shows bytes in (docs/FORMAT.md gives
/// every byte).
pub mod format {
    pub use crate::engine::tables::RESERVED_PREFIX;
    pub use crate::model::envelope::{EnvelopeError, HttpEnvelope};
    pub use crate::model::keys::hex as to_hex;
    pub use crate::model::record::{FORMAT_VERSION, HolderToken, Record, State};
}

/// The transactional outbox: events committed with the business writes, and the dispatcher
/// that publishes them in order, at least once.
pub mod outbox {
    pub use crate::messaging::outbox::Outbox;
    pub use crate::model::outbox::{
        DeadLetter, DispatcherOptions, Event, EventId, OutboxMetrics, OutboxStats, Publisher,
        StoredEvent,
    };
    pub use crate::runtime::worker::DispatcherHandle;
}

/// The inbox: processed-message marks (`Store::process`), webhook receipts
/// (`Store::receive`), and per-entity version marks that skip out-of-order events.
pub mod inbox {
    pub use crate::messaging::order::Versions;
    pub use crate::model::marks::{HighWaterMark, Mark, ProcessAnswer, ReceiveAnswer};
}

#[cfg(feature = "webhooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
#[doc(inline)]
pub use messaging::webhook;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;

// The documents of docs/ as rustdoc pages (no items): idem::docs::{design, format, http,
// postgres, reliability, guide, configuration, observability, operations, cli}.
pub mod docs;

/// README.md's code blocks compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
