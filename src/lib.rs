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
//! ```
//! use idem::{Outcome, Request, Response, Scope, Store};
//! use redb::{ReadableTable, TableDefinition};
//!
//! const ORDERS: TableDefinition<&str, u64> = TableDefinition::new("orders");
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("idem.redb"))?;
//! let place = || -> Result<Outcome, idem::Error> {
//!     let req = Request::new(Scope::new("tenant-42", "create_order"), "order-123", &("sku-1", 2u32))?;
//!     store.execute(req, |tx| {
//!         let mut orders = tx.open_table(ORDERS)?;
//!         orders.insert("order-123", 2)?;
//!         Ok(Response::new(201, r#"{"id":"order-123"}"#).with_resource("order", "order-123"))
//!     })
//! };
//! let first = place()?;   // runs the closure: one order
//! let retry = place()?;   // the response was lost; the client retries with the same key
//! assert!(matches!(first, Outcome::Executed(_)));
//! assert!(matches!(retry, Outcome::Replayed(_)));
//! assert_eq!(first.response(), retry.response()); // same status and body, byte for byte
//! # Ok(())
//! # }
//! ```
//!
//! See `README.md` for the guarantees (and non-guarantees) and `docs/design.md` for the
//! invariants and crash-safety argument.

#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

pub(crate) mod engine;
pub(crate) mod error;
#[cfg(feature = "http")]
pub mod http;
pub(crate) mod messaging;
pub(crate) mod model;

pub use engine::expiry::Stats;

pub use engine::builder::{Durability, StoreBuilder};
pub use engine::lease::{Begin, Lease};
pub use engine::maintenance::Metrics;

pub use engine::read_only::ReadOnlyStore;
pub use engine::store::Store;
pub use engine::sweep::SweepReport;
pub use engine::tables::RESERVED_PREFIX;
pub use engine::tx::Tx;
pub use error::{Abort, BoxError, Error, Field};
pub use messaging::dispatch::{DispatcherHandle, DispatcherOptions, Publisher};
pub use messaging::inbox::{Processed, Receipt};
pub use messaging::order::Versions;
pub use messaging::outbox::{DeadLetter, Event, EventId, Outbox, OutboxEvent, OutboxStats};
#[cfg(feature = "webhooks")]
pub use messaging::webhook;
pub use model::clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use model::keys::{DownstreamKey, Fingerprint};
pub use model::keys::{activity_key, compensation_key, derive_key};
pub use model::marks::{HighWaterMark, Mark};
pub use model::record::{FORMAT_VERSION, HolderToken, Record, State};
pub use model::response::{Outcome, Resource, Response, Tombstone};
pub use model::retention::RetentionPolicy;
pub use model::rules::{
    Decision, InboxDecision, SweepAction, VersionCheck, decide, heartbeat_deadline, holds_lease,
    inbox_decide, is_expired, is_forgotten, sweep_action, sweep_due, version_check,
};
pub use model::scope::{Limits, Request, Scope};

/// README.md's code blocks compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// Re-export of the redb version idem is built on, so callers name the same table types.
pub use redb;
