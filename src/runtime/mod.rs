//! The thread machinery every engine runs on, with no storage and no I/O of its own:
//!
//! | file | owns |
//! |---|---|
//! | `group.rs` | the group-commit protocol: who leads a batch, who queues, whose turn it is, who is answered (an engine's driver opens, runs and commits the batch) |
//! | `signal.rs` | the work-announced signal background workers wait on |
//!
//! It sits between the engines and the model: engines import it, it imports only the model
//! and `error.rs` (tests/layers_import_one_way.rs).

pub(crate) mod group;
pub(crate) mod signal;
