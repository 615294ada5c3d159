//! The fuzz targets' logic, shared by `fuzz/fuzz_targets/*.rs` (libFuzzer, nightly) and
//! `integration/tests/fuzz_corpus/fuzz_corpus_replay.rs` (the checked-in corpus as an ordinary `cargo test` on stable).
//! Each target module's `run(data)` decodes its input, drives idem, and panics on a broken
//! invariant. `claim_race` and `engines_agree` share the schedule language (`schedule`), its
//! reference model (`model`), the runner (`lockstep`) and its engines (`on_redb`, `on_postgres`).

#![allow(dead_code)]

pub mod backend;
pub mod claim_race;
pub mod crash_recovery;
pub mod damaged_file;
pub mod effects;
#[cfg(feature = "postgres")]
pub mod engines_agree;
pub mod lockstep;
pub mod model;
#[cfg(feature = "postgres")]
pub mod on_postgres;
pub mod on_redb;
// The HTTP header parsers and the webhook verifiers: only with the features that build them (the
// fuzz crate turns both on).
#[cfg(all(feature = "http", feature = "webhooks"))]
pub mod header_parsers;
// The HTTP layer's target needs the layer (feature `http`; the fuzz crate turns its own
// `http` feature on, always).
#[cfg(feature = "http")]
pub mod http_layer;
pub mod record_decode;
pub mod schedule;
