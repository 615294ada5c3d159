//! The PostgreSQL engine (feature `postgres`): the same contract as the file store, for a
//! fleet of processes sharing one database. It stores the model's values (the same record,
//! mark and event bytes, docs/FORMAT.md) and applies the model's rules (decide, instants,
//! sweep, inbox, versions) exactly as the redb engine does; only the storage differs. Tested
//! against PostgreSQL 15 (`scripts/pg-test-cluster`); docs/POSTGRES.md says what else may work.
//! (docs/POSTGRES.md, "Quick start", shows this example.)
//!
//! ```no_run
//! use idem::postgres::PgStore;
//! use idem::{BeginAnswer, ExecuteAnswer, Request, Response, Scope};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let store = PgStore::builder("postgresql://app@db.internal/payments").open()?; // creates schema `idem` if missing
//!     let req = Request::new(Scope::new("tenant-42", "create_order"), "order-123", &("sku-1", 2u32))?;
//!     let outcome = store.execute(req, |tx| {
//!         tx.execute("INSERT INTO orders (id, qty) VALUES ($1, $2)", &[&"order-123", &2i32])?;
//!         Ok(Response::new(201, r#"{"id":"order-123"}"#))
//!     })?;
//!     assert!(matches!(outcome, ExecuteAnswer::Ran(_) | ExecuteAnswer::Replayed(_)));
//!
//!     let req = Request::from_canonical_bytes(Scope::new("tenant-42", "charge"), "checkout-77", b"amount=4200");
//!     if let BeginAnswer::Acquired(lease) = store.begin(req)? {
//!         let key = lease.downstream_key().to_hex(); // the same on every node, and as the file store's
//!         let _ = key; // … call the provider with it …
//!         lease.complete(Response::new(201, "ch_1"))?;
//!     }
//!     Ok(())
//! }
//! ```
//!
//! | file | owns |
//! |---|---|
//! | `store.rs` | the [`PgStore`], flow A (`execute`), the claim half of flow B (`begin`, `begin_wait`), `get`, `purge`, the read path, the fleet's clock (the server's) |
//! | `builder.rs` | the settings and their defaults ([`PgStoreBuilder`]), the pool, opening |
//! | `schema.rs` | every table, with versioned names; the schema an open creates or checks |
//! | `conn.rs` | the pool's connections (a statement cache each), what a failure means (`Failure`), literals |
//! | `commit.rs` | group commit: one transaction, one round trip to lock and one to write and commit, for concurrent callers, several batches in flight |
//! | `typed.rs` | `execute_typed`: flow A answering with a serde value |
//! | `tx.rs` | the transaction handle given to closures ([`PgTx`]) |
//! | `lease.rs` | flow B's fenced [`PgLease`] |
//! | `inbox.rs` | `process`, `receive`, marks |
//! | `outbox.rs` | the outbox push ([`PgOutbox`]), version marks ([`PgVersions`]), outbox inspection and dead letters |
//! | `dispatch.rs` | the dispatcher several processes may run at once (`FOR UPDATE SKIP LOCKED`) |
//! | `sweep.rs` | bounded sweeps on the `due` index, stats, the background sweeper |
//! | `whitebox.rs` | NOT PUBLIC API (`__internal_whitebox`): test hooks on the commit path |

pub(crate) mod builder;
pub(crate) mod commit;
pub(crate) mod conn;
pub(crate) mod dispatch;
pub(crate) mod inbox;
pub(crate) mod lease;
pub(crate) mod outbox;
pub(crate) mod schema;
pub(crate) mod store;
pub(crate) mod sweep;
pub(crate) mod tx;
pub(crate) mod typed;
#[cfg(feature = "__internal_whitebox")]
pub(crate) mod whitebox;

pub use builder::PgStoreBuilder;
pub use lease::PgLease;
pub use outbox::{PgOutbox, PgVersions};
pub use schema::SCHEMA_VERSION;
pub use store::{PgClient, PgStore};
pub use tx::PgTx;
#[cfg(feature = "__internal_whitebox")]
#[doc(hidden)]
pub use whitebox::CommitLoss;
