//! The fuzz targets' logic, shared by `fuzz/fuzz_targets/*.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the checked-in corpus as an ordinary `cargo test` on stable).
//! Each module's `run(data)` decodes its input, drives idem, and panics on a broken invariant.

#![allow(dead_code)]

pub mod backend;
pub mod claim_race;
pub mod crash_recovery;
pub mod effects;
// The HTTP layer's target needs the layer (feature `http`; the fuzz crate turns its own
// `http` feature on, always).
#[cfg(feature = "http")]
pub mod http_layer;
pub mod record_decode;
