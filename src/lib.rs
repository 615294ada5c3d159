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
//! Add it with `cargo add idem-store` (the package's name; the library is `idem`).
//!
//! See `README.md` for the guarantees (and non-guarantees), [`docs::design`] for the
//! invariants and crash-safety argument, and [`docs::format`] for every stored byte.

// docs.rs builds with `--cfg docsrs` (Cargo.toml, `[package.metadata.docs.rs]`) on nightly: the
// feature-gated items then carry their "Available on crate feature ..." badge.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(
    not(test),
    deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

// The layers (docs/design.md, "Map"). Imports point one way: faces → messaging → engine →
// model; `error` is shared (tests/layers_import_one_way.rs checks the direction).
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
pub use engine::lease::{Begin, Lease};
pub use engine::store::Store;
pub use engine::tx::Tx;
#[doc(inline)]
pub use error::Error;
pub use model::clock::Timestamp;
pub use model::response::{Abort, Outcome, Resource, Response, Tombstone};
pub use model::retention::RetentionPolicy;
pub use model::scope::{Request, Scope};
/// Re-export of the redb version idem is built on, so callers name the same table types.
pub use redb;
// ---- Everything else, by topic. ----

/// Opening and running a store: its settings, figures and maintenance answers, and the
/// read-only view of a file.
pub mod store {
    pub use crate::engine::builder::{Durability, StoreBuilder};
    pub use crate::engine::maintenance::Metrics;
    pub use crate::engine::read_only::ReadOnlyStore;
    pub use crate::engine::store::Store;
    pub use crate::model::reports::{Stats, SweepReport};
    pub use crate::model::retention::RetentionPolicy;
    pub use crate::model::scope::Limits;
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
        Decision, InboxDecision, SweepAction, VersionCheck, decide, heartbeat_deadline,
        holds_lease, inbox_decide, is_expired, is_forgotten, sweep_action, sweep_due,
        version_check,
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
        DeadLetter, DispatcherOptions, Event, EventId, OutboxEvent, OutboxMetrics, OutboxStats,
        Publisher,
    };
    pub use crate::runtime::worker::DispatcherHandle;
}

/// The inbox: processed-message marks (`Store::process`), webhook receipts
/// (`Store::receive`), and per-entity version marks that skip out-of-order events.
pub mod inbox {
    pub use crate::messaging::order::Versions;
    pub use crate::model::marks::{HighWaterMark, Mark, Processed, Receipt};
}

#[cfg(feature = "webhooks")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhooks")))]
#[doc(inline)]
pub use messaging::webhook;

#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http;

// The documents of docs/ as rustdoc pages (no items): idem::docs::{design, format, http,
// reliability}.
pub mod docs;

/// README.md's code blocks compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
