//! The conformance suite (`tests/conformance/`) on the PostgreSQL engine: every case the redb
//! engine passes in `conformance_redb`, here on a store on a fresh schema of the test
//! server (`IDEM_PG_URL`) with a manual clock. Without a server each case prints why and is
//! skipped (it fails instead when `IDEM_REQUIRE_PG` or `CI` is set).

#![cfg(feature = "postgres")]

crate::conformance::conformance_tests!(crate::pg_engine::PgEngine::open);
