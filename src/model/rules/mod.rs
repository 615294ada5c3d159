//! The rules an engine applies and never re-derives, as pure functions of stored values and
//! time, each with its exhaustive decision table:
//!
//! - `decide`: what a request may do given the stored record ([`decide()`], [`decide_claim`]
//!   for a claim that may have written it, [`holds_lease`], [`is_expired`], [`is_forgotten`]);
//! - `restart`: which lease holders may still be running ([`Holders`]), and [`decide_among`],
//!   which takes over at once a lease whose holder cannot be;
//! - `answers`: the answer a decision gives without running anything, and what a closure's
//!   result records (`settle`);
//! - `instants`: what each write of a record stores — a claim, a takeover, a heartbeat
//!   ([`heartbeat_deadline`]), a finish, the sweep's shrink;
//! - `sweep`: where a record sits in the expiry index and what the sweep does with it
//!   ([`sweep_due`], [`sweep_action`]);
//! - `inbox`: whether a delivered message runs, given its mark ([`inbox_decide`]), when a mark
//!   is forgotten, and what a handled delivery writes;
//! - `versions`: whether an event applies, given the entity's high-water mark
//!   ([`version_check`]), and what the mark becomes.
//!
//! The fuzzer's reference model, the tests and every engine use the same functions, so each
//! rule lives in exactly one place.

pub(crate) mod answers;
mod decide;
pub(crate) mod inbox;
pub(crate) mod instants;
mod restart;
mod sweep;
#[cfg(test)]
mod table;
pub(crate) mod versions;

pub use decide::{Decision, decide, decide_claim, holds_lease, is_expired, is_forgotten};
pub use inbox::{InboxDecision, inbox_decide};
pub use instants::heartbeat_deadline;
pub use restart::{Holders, decide_among};
pub use sweep::{SweepAction, sweep_action, sweep_due};
pub use versions::{VersionCheck, version_check};
