//! The conformance suite (`tests/conformance/`) on the PostgreSQL engine: every case the redb
//! engine passes in `tests/conformance_redb.rs`, here on a store on a fresh schema of the test
//! server (`IDEM_PG_URL`) with a manual clock. Without a server each case prints why and is
//! skipped (it fails instead when `IDEM_REQUIRE_PG` or `CI` is set).

#![cfg(feature = "postgres")]

mod common;
mod conformance;
#[path = "conformance/pg_engine.rs"]
mod pg_engine;

conformance::conformance_tests!(pg_engine::PgEngine::open);
