//! The `record_decode` target: see `tests/sim/record_decode.rs` (shared with the corpus-replay test).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::record_decode::run(data));
