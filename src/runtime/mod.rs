//! The thread machinery every engine runs on, with no storage and no I/O of its own:
//!
//! | file | owns |
//! |---|---|
//! | `group.rs` | the group-commit protocol: who leads a batch, who queues, whose turn it is, who is answered (an engine's driver opens, runs and commits the batch) |
//! | `driver.rs` | the group-commit driver for an engine with one writer and no partial rollback, over the engine's transaction (`BatchEngine`): a batch's run, hand-off, late admission, commit, abort and prefix re-run, and the fail-stop answers |
//! | `sync.rs` | the protocol's `Mutex` and `Condvar`: parking_lot's, or loom's for the model checker |
//! | `publish.rs` | what every dispatcher does between reading and recording its rows: publish in commit order holding failed keys back, retry decisions with jitter, counters, the thread's loop of rounds |
//! | `signal.rs` | the work-announced signal background workers wait on |
//! | `worker.rs` | the handle of a background worker (the outbox dispatcher): stop, wake, join |
//! | `observe/` | what idem reports to `tracing` and `metrics` (features of those names): one face for every call site, one file per feature (`observe/mod.rs` has its table) |
//!
//! It sits between the engines and the model: engines import it, it imports only the model
//! and `error.rs` (tests/format/layers_import_one_way.rs).

pub(crate) mod driver;
pub(crate) mod group;
#[cfg(test)]
mod model_check;
pub(crate) mod observe;
pub(crate) mod publish;
pub(crate) mod signal;
pub(crate) mod sync;
pub(crate) mod worker;
