//! The `header_parsers` target: see `tests/sim/header_parsers.rs` (shared with the corpus-replay test).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::header_parsers::run(data));
