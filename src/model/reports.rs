//! What a store reports about itself: a sweep pass ([`SweepReport`]) and the records by state
//! ([`Stats`]). Plain values, the same for every engine.

use std::time::Duration;

/// What one sweep pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SweepReport {
    /// Records deleted because they were past `forget_at`: tombstones past their horizon,
    /// finished records without a tombstone phase, and lease records whose attempt never
    /// finished; and inbox marks and webhook receipts past the inbox retention. Their keys
    /// were already free; now their space is too.
    pub deleted: u64,
    /// Completed or Failed records past their response window, shrunk to tombstones (the body
    /// is dropped, the key stays bound until `forget_at`).
    pub tombstoned: u64,
    /// Index entries dropped or moved because they did not match their record (an entry whose
    /// record was replaced or removed while it did not decode). Normally 0.
    pub repaired: u64,
    /// Write transactions the pass used, each holding at most
    /// `sweep_batch` records.
    pub batches: u64,
    /// Wall time of the pass.
    pub duration: Duration,
}

impl SweepReport {
    /// Records deleted or shrunk.
    pub fn swept(&self) -> u64 {
        self.deleted + self.tombstoned
    }
}

/// Records in the store by stored state (`Store::stats`, and the same call of every engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Records stored, in any state, due or not.
    pub records: u64,
    /// Records stored as Pending (a flow-B lease, live or lapsed).
    pub pending: u64,
    /// Records stored as Completed with their response.
    pub completed: u64,
    /// Records stored as Failed with their response.
    pub failed: u64,
    /// Records shrunk to tombstones (response window over, key still bound).
    pub tombstones: u64,
    /// Records whose next sweep action is already due: past their response window (still full)
    /// or past `forget_at` (still in the file). Every decision already treats them by their
    /// times; the next sweep pass shrinks or deletes them.
    pub due: u64,
}
