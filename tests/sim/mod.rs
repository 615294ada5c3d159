//! The fuzz targets' logic, shared by `fuzz/fuzz_targets/*.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the checked-in corpus as an ordinary `cargo test` on stable).
//! Each module's `run(data)` decodes its input, drives idem, and panics on a broken invariant.

#![allow(dead_code)]

pub mod backend;
pub mod claim_race;
pub mod crash_recovery;
pub mod damaged_file;
pub mod effects;
// The HTTP header parsers and the webhook verifiers: only with the features that build them (the
// fuzz crate turns both on).
#[cfg(all(feature = "http", feature = "webhooks"))]
pub mod header_parsers;
pub mod record_decode;
