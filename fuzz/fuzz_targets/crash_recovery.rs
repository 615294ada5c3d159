//! The `crash_recovery` target: see `tests/sim/crash_recovery.rs` (shared with the corpus-replay test).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::crash_recovery::run(data));
