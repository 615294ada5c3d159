//! The `damaged_file` target: see `tests/sim/damaged_file.rs` (shared with the corpus-replay test).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::damaged_file::run(data));
