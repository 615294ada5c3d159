//! Observability: the spans and events of the `tracing` feature and the counters, gauges and
//! histograms of the `metrics` feature, captured exactly.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test observability -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../../../tests/common/mod.rs"]
mod common;

mod observability_metrics;
mod observability_tracing;
