//! The edge service (examples/edge_service/): in-process through its router, and as a child
//! process (`CARGO_BIN_EXE_edge-service-under-test`, this package's one-line binary that runs
//! `edge_service::main`) killed, restarted, out of disk, on PostgreSQL, and the HTTP guide's
//! curl session.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test edge_service -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../../../tests/common/mod.rs"]
mod common;

#[cfg(unix)]
#[path = "../edge_example/mod.rs"]
mod edge_example;

#[cfg(feature = "http")]
#[path = "../http_fixtures/mod.rs"]
mod http_fixtures;

#[cfg(target_os = "linux")]
#[path = "../tmpfs/mod.rs"]
mod tmpfs;

mod a_failed_first_start_leaves_no_file;
mod edge_service_metrics;
mod edge_service_says_when_its_store_fail_stops;
mod http_the_example_checks_tenants_like_the_layer;
mod pg_two_edge_services_share_one_database;
mod readme_curl_session;
mod the_edge_service_books_each_payment_once_and_stops_cleanly;
