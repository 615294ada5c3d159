//! Observability: the counters, gauges and histograms of the `metrics` feature, captured exactly
//! by a recorder local to each test's thread. (The spans and events of the `tracing` feature are
//! in `spans_and_events`: their capture is the process's global subscriber.)
//!
//! One module per behaviour, named by the sentence it proves (`cargo test -p idem-integration
//! --test observability -- <module>::` runs one); the shared helpers are modules of this binary
//! too.

#[path = "../../../tests/common/mod.rs"]
mod common;

mod observability_metrics;
