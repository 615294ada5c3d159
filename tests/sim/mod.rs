//! The fuzz targets' logic, shared by `fuzz/fuzz_targets/*.rs` (libFuzzer, nightly) and
//! `tests/fuzz_corpus_replay.rs` (the checked-in corpus as an ordinary `cargo test` on stable).
//! Each target module's `run(data)` decodes its input, drives idem, and panics on a broken
//! invariant. `claim_race` is built from parts other targets can share: its schedule language
//! (`schedule`), reference model (`model`), runner (`lockstep`) and engine (`on_redb`).

#![allow(dead_code)]

pub mod backend;
pub mod claim_race;
pub mod crash_recovery;
pub mod effects;
pub mod lockstep;
pub mod model;
pub mod on_redb;
pub mod record_decode;
pub mod schedule;
