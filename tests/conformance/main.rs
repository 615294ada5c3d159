//! The conformance suite: one set of cases (`mod.rs` and its files), written once against the
//! suite's `Engine` trait, run on the redb file engine (`conformance_redb`) and, with the
//! `postgres` feature, on the PostgreSQL engine (`conformance_postgres`).
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test conformance -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

#[path = "mod.rs"]
mod conformance;
#[cfg(feature = "postgres")]
mod pg_engine;
mod redb_engine;

mod conformance_postgres;
mod conformance_redb;
