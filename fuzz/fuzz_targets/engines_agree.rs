//! The `engines_agree` target: see `tests/sim/engines_agree.rs` (shared with the corpus-replay
//! test). Needs a PostgreSQL server at `IDEM_PG_URL` (`eval "$(scripts/pg-test-cluster start)"`).
#![no_main]

#[path = "../../tests/sim/mod.rs"]
#[allow(dead_code, unused_imports)]
mod sim;

libfuzzer_sys::fuzz_target!(|data: &[u8]| sim::engines_agree::run(data));
