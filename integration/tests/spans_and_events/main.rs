//! Observability: the spans and events of the `tracing` feature, captured by the process's
//! global subscriber. A binary of its own: every store call of the process reaches that
//! capture, and some of its checks count events exactly (e.g. one read-through of a file before
//! its repair), which the tests of another module doing the same would break.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test -p idem-integration
//! --test spans_and_events -- <module>::` runs one); the shared helpers are modules of this
//! binary too.

#[path = "../../../tests/common/mod.rs"]
mod common;

mod observability_tracing;
