//! Every fuzz target's checked-in corpus and regression inputs (fuzz/), replayed through the
//! targets' logic in tests/sim/ as an ordinary `cargo test` on stable.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test fuzz_corpus -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[cfg(feature = "__internal_whitebox")]
#[path = "../../../tests/sim/mod.rs"]
mod sim;

mod fuzz_corpus_replay;
