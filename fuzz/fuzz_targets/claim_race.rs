//! The `claim_race` target: see `tests/sim/claim_race.rs` (shared with the corpus-replay test).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::claim_race::run(data));
