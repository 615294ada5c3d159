//! The fixtures every rule table shares: a record of each kind, at each phase of its life,
//! with its lease alive or lapsed, and a decision's name.

use crate::model::clock::Timestamp;
use crate::model::keys::Fingerprint;
use crate::model::record::{HolderToken, Record, State};
use crate::model::response::{Resource, Response, Tombstone};
use crate::model::rules::decide::Decision;

pub(super) const FP: Fingerprint = Fingerprint([1; 32]);
pub(super) const OTHER: Fingerprint = Fingerprint([2; 32]);
pub(super) const ME: HolderToken = HolderToken([7; 16]);
pub(super) const YOU: HolderToken = HolderToken([8; 16]);

/// What is stored under the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Absent,
    Pending,
    Completed,
    Failed,
    Tombstone,
}

pub(super) const KINDS: [Kind; 5] = [
    Kind::Absent,
    Kind::Pending,
    Kind::Completed,
    Kind::Failed,
    Kind::Tombstone,
];

/// Where `now` falls in the record's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// `now < expires_at`: the response window is open.
    Window,
    /// `expires_at ≤ now < forget_at`: the tombstone tier.
    Horizon,
    /// `forget_at ≤ now`: the record counts as absent.
    Forgotten,
}

pub(super) const PHASES: [Phase; 3] = [Phase::Window, Phase::Horizon, Phase::Forgotten];

/// The record of `kind` whose phase at `now` is `phase` (`None` for [`Kind::Absent`]):
/// Pending records hold [`ME`]'s lease, attempt 3, until `now + 10` or, lapsed, until `now`.
pub(super) fn record(kind: Kind, lease_alive: bool, phase: Phase, now: u64) -> Option<Record> {
    // Boundaries sit exactly at `now` so the inclusive ends are exercised.
    let (expires_at, forget_at) = match phase {
        Phase::Window => (now + 1_000, now + 2_000),
        Phase::Horizon => (now, now + 1_000),
        Phase::Forgotten => (now - 1_000, now),
    };
    let lease_deadline = if lease_alive { now + 10 } else { now };
    let state = match kind {
        Kind::Absent => return None,
        Kind::Pending => State::Pending {
            holder: ME,
            lease_deadline: Timestamp(lease_deadline),
            attempt: 3,
        },
        Kind::Completed => State::Completed(Response::new(201, "ok").with_resource("order", "o1")),
        Kind::Failed => State::Failed(Response::new(402, "declined").mark_failed()),
        Kind::Tombstone => State::Tombstone(Tombstone::new(
            409,
            Some(Resource {
                kind: "order".into(),
                id: "o2".into(),
            }),
            true,
        )),
    };
    Some(Record {
        fingerprint: FP,
        created_at: Timestamp(now.saturating_sub(5_000)),
        expires_at: Timestamp(expires_at),
        forget_at: Timestamp(forget_at),
        state,
    })
}

/// A decision's name, for the tables' expected columns.
pub(super) fn name(d: &Decision<'_>) -> &'static str {
    match d {
        Decision::Claim => "claim",
        Decision::Takeover { .. } => "takeover",
        Decision::Resume { .. } => "resume",
        Decision::Replay(_) => "replay",
        Decision::Expired { .. } => "expired",
        Decision::InFlight { .. } => "inflight",
        Decision::Mismatch => "mismatch",
    }
}
