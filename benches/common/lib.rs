//! What more than one of idem's benches (and the tools in `benches/bin/`) uses: one copy each.
//!
//! | file | owns |
//! |---|---|
//! | `env.rs` | the environment every bench reads alike: `env_parse`, `quick` (`IDEM_BENCH_QUICK`), `bench_parent` (`IDEM_BENCH_DIR`) |
//! | `workload.rs` | the request the benches claim: scope, payload, request, response |
//! | `stats.rs` | `median`, `percentile` (nearest rank) |
//! | `files.rs` | `sync_file`, `copy_synced`: store copies that a run's first fsync does not pay for |
//! | `machine.rs` | what a run's header says: date, CPU, memory, kernel, load, the filesystem under a path, RSS, the git commit, the versions in Cargo.lock |

#![forbid(unsafe_code)]

mod env;
mod files;
mod machine;
mod stats;
pub mod workload;

pub use env::{bench_parent, env_parse, quick};
pub use files::{copy_synced, sync_file};
pub use machine::{
    cpu_model, filesystem_of, git_commit, kernel, loadavg, locked_version, mem_total_gib, rss_mib,
    utc_now,
};
pub use stats::{median, percentile};
