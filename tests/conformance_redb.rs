//! The conformance suite (`tests/conformance/`) on the redb file engine: every case the
//! PostgreSQL engine passes in `tests/conformance_postgres.rs`, here on a store on a temp file
//! with a manual clock.

mod common;
mod conformance;
#[path = "conformance/redb_engine.rs"]
mod redb_engine;

conformance::conformance_tests!(redb_engine::RedbEngine::open);
