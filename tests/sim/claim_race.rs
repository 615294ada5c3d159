//! `claim_race`: K logical clients race over a few intents on one thread, deterministically,
//! against a reference model.
//!
//! The input is a schedule: which client does what to which intent — flow-A `execute` with a
//! side effect (succeeding, failing terminally or retryably), flow-B `begin`, `complete_with`
//! (with a side effect), `fail`, `heartbeat`, `release`, dropping a lease, `purge` — plus
//! moving the manual clock (forwards, across the lease / retention / horizon boundaries, and
//! backwards), `sweep`, a clean reopen, a crash (the store dropped without finishing; its
//! leases die with the process), and a crash inside an executing closure.
//!
//! The model keeps, per intent, the record the store must hold, written by rules stated here
//! independently of `src/` (it does not call [`idem::rules::decide`] to predict; it checks that
//! `decide` agrees with it). After every step it checks:
//! - the store's record equals the model's, field for field (holder tokens included);
//! - effects (the caller's table) equal the model's count, and an intent never executes twice
//!   while its record is live: effects ≤ 1 per intent per record lifetime, and = 1 once any
//!   attempt saw it completed;
//! - a finished intent's replay is byte-for-byte its first response;
//! - a different payload on a live key is always `PayloadMismatch`;
//! - at most one live lease per key, and a stale lease's calls always get `LeaseLost`;
//! - `downstream_key()` never changes for an intent, across takeovers, crashes and reopens;
//! - the expiry index matches the records (`check_expiry_index`);
//! - no panic, no unexpected error.
//!
//! The schedule language is `schedule.rs`, the model `model.rs`, the runner `lockstep.rs`
//! (shared with `engines_agree`); here they run against the redb engine alone (in direct mode
//! and in journal mode, `StoreBuilder::journal`, side by side), opened as a
//! single process owns its file, so the model predicts the restart rule (docs/design.md, "A
//! restart frees the leases of the dead": after a reopen or a crash, a lease granted before it
//! is taken over at once).

use idem::clock::ManualClock;

use super::lockstep::Sim;
use super::model::View;
use super::on_redb::RedbEngine;
use super::schedule::{T0, ops};

/// Runs one input, on a store in direct mode and one in journal mode side by side.
pub fn run(data: &[u8]) {
    let clock = ManualClock::new(T0);
    let redb = RedbEngine::open(&clock, false);
    let journaled = RedbEngine::open_journaled(&clock);
    Sim::new(
        clock,
        View::OpenInstance,
        vec![Box::new(redb), Box::new(journaled)],
    )
    .run(&ops(data));
}
