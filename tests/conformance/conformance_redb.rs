//! The conformance suite (`tests/conformance/`) on the redb file engine: every case the
//! PostgreSQL engine passes in `conformance_postgres`, here on a store on a temp file
//! with a manual clock.

crate::conformance::conformance_tests!(crate::redb_engine::RedbEngine::open);
