//! The write-ahead journal in front of redb (docs/design.md, "Claims at the speed of a log").
//!
//! In journal mode a batch's writes are captured as redo records (`capture.rs`) and sealed into
//! one checksummed frame of a preallocated file (`format.rs`, `log.rs`); its members are
//! answered once one `fdatasync` of the journal covers the frame. The applier thread
//! (`applier.rs`) applies durable entries to redb without an fsync, each of its commits holding
//! the checkpoint row, so whichever redb commit becomes durable says where the journal resumes;
//! a durable redb commit (a checkpoint) every `checkpoint_bytes` of frames bounds what an open
//! replays (`recover.rs`, `apply.rs`).
//!
//! | file | owns |
//! |---|---|
//! | `format.rs` | the bytes: header, frames, entry bodies, the checkpoint row (pure functions) |
//! | `capture.rs` | [`Table`] and the batch's write handle: writes through to redb, recorded |
//! | `log.rs` | the running journal: the head, LSNs, the group sync, fail-stop |
//! | `recover.rs` | creating, replaying and closing the journal at open and close |
//! | `applier.rs` | the thread that applies durable entries to redb, the published snapshot, P |
//! | `apply.rs` | the tables recovery can apply records to, with their types |
//! | `pending.rs` | the pending set: versions sealed but not applied, read over a snapshot in key order |
//! | `model_check.rs` | the journal and the applier model-checked with loom (tests only) |

pub(crate) mod applier;
pub(crate) mod apply;
pub(crate) mod capture;
pub(crate) mod format;
pub(crate) mod log;
#[cfg(test)]
mod model_check;
pub(crate) mod pending;
pub(crate) mod recover;

pub(crate) use capture::{Capture, View, Wtx};
pub use capture::{Guard, Pair, Range, Table};
pub use recover::journal_path;

/// The journal's default capacity: 16 MiB, twice the default checkpoint interval
/// (benches/results/2026-12-07-54fd947-journal-capacity.md: no cost measured against 64 MiB).
pub const DEFAULT_CAPACITY: u64 = 16 << 20;
/// The default frame bytes between two checkpoints: 8 MiB.
pub const DEFAULT_CHECKPOINT_BYTES: u64 = 8 << 20;
/// The default bound on journaled writes held in memory until they are in redb's file: 32 MiB.
pub const DEFAULT_PENDING_BYTES: usize = 32 << 20;

/// NOT PUBLIC API: a recovery or commit step deliberately broken, for the tests that prove the
/// crash tests catch it. Only `StoreBuilder::__break_journal` (feature `__internal_whitebox`)
/// sets anything but `No`; a build without that feature (every user's) has none of it.
#[cfg(any(test, feature = "__internal_whitebox"))]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BrokenJournal {
    /// Nothing broken.
    #[default]
    No,
    /// Recovery accepts frames by their LSN alone, without the checksum chain.
    UnchainedFrames,
    /// Recovery applies nothing from the journal.
    NoReplay,
    /// Members are answered before the journal's sync covers their entry.
    AnswerBeforeSync,
    /// Recovery stops at the first wrap frame.
    StopAtWrap,
    /// The applier's checkpoints (the pending-set design) write the row of the last sealed
    /// entry instead of their last applied one.
    ApplierRowAhead,
}
