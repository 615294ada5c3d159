//! `engines_agree`: `claim_race`'s schedules run against the redb engine AND the PostgreSQL
//! engine in lockstep, with the reference model. Every call of a step goes to both engines (redb
//! first) with the same arguments; their answers, mapped to one shape (`lockstep::Answer`:
//! the response, the lease's attempt, deadline and downstream key, the `retry_after`, the error
//! kind, the closure's runs), must be equal to each other and to the model's. After every step
//! both engines' records (`get`, decoded, holder tokens mapped between the engines) and effect
//! counts per intent must equal the model's, each engine's own invariants hold (redb: the
//! expiry index, no latch; PostgreSQL: the derived columns of every record row), and every
//! check of `claim_race` applies. The schedule language, the model and the runner are
//! `claim_race`'s own (`schedule.rs`, `model.rs`, `lockstep.rs`); its corpus is this target's
//! seed.
//!
//! **Time.** One `ManualClock` drives the model and both stores: the redb store through
//! `StoreBuilder::clock`, the PostgreSQL store through `PgStoreBuilder::clock`, which makes it
//! decide at the injected clock instead of the server's `clock_timestamp()`. The clock moves
//! only in the schedule's clock steps, between calls, so every decision of a step is made at
//! the same instant in both engines, whatever the server's clock says.
//!
//! **Restarts.** The single-process file engine has a rule PostgreSQL cannot have
//! (docs/design.md, "A restart frees the leases of the dead": a store alone on its file knows
//! that a lease granted before it opened has no holder left, and takes it over at once); a
//! database shared by a fleet never knows that a holder died, so its leases always run to their
//! deadline (`Holders::Any`). Run side by side, the two would rightly disagree after every crash
//! (and after a reopen, for a lease dropped past its horizon then brought back to life by a
//! backward clock move). So here the redb store is opened in `multi_process` mode (on
//! `backend::AloneOnFile`: the mode takes byte-range locks), in which the file engine follows
//! the same rule as PostgreSQL, and the model predicts `View::Any`
//! (`claim_race` keeps the single-process mode and `View::OpenInstance`): every step then has
//! one right answer, and the reopen and crash steps stay in the language rather than being cut:
//! - a reopen drops every lease (releasing what it holds), then opens a new store: redb on the
//!   same file, PostgreSQL another `PgStore` on the same schema, as another process would;
//! - a crash drops the leases without releasing them and opens a new store on what was
//!   committed: redb fails every later write and reopens its durable image; on PostgreSQL the
//!   dying store's commits are lost (the white-box commit hook terminates the backend before
//!   the `COMMIT` runs), so the leases' release on drop lands nowhere, and the server keeps
//!   every acknowledged commit;
//! - a crash inside an executing closure: redb's disk fails under the closure (`Storage`,
//!   `FailStopped` or `OutcomeUnknown`, latched); PostgreSQL's connection fails at the commit
//!   (`OutcomeUnknown`); both map to "unacknowledged", nothing of the closure may survive, then
//!   the process crashes as above.
//!
//! What the restart rule itself does is `claim_race`'s to check, not this target's.
//!
//! **The database.** One schema per process (`fz_engines_agree_<pid>`) on the server at
//! `IDEM_PG_URL`, emptied before every input with a few `DELETE`s (about 2 ms; creating and
//! dropping a schema per input took about 100 ms here, as long as a whole input), dropped by
//! the corpus-replay test when it ends, or by the next process of this harness that starts (a
//! fuzzer is stopped, not ended). Its connections do not wait for the WAL flush at commit, and
//! the stores an input is done with are kept for the next store an input opens
//! (`on_postgres::PgDatabase` says why neither changes what is tested). Without `IDEM_PG_URL`
//! the target says so once and skips every input, unless `IDEM_REQUIRE_PG` (or `CI`) is set:
//! then it fails.

use std::sync::OnceLock;

use super::lockstep::Sim;
use super::model::View;
use super::on_postgres::{PgDatabase, PgEngine, pg_url};
use super::on_redb::RedbEngine;
use super::schedule::{T0, ops};

/// The process's database, or `None` when PostgreSQL tests are skipped here.
pub fn database() -> Option<&'static PgDatabase> {
    static DATABASE: OnceLock<Option<PgDatabase>> = OnceLock::new();
    DATABASE
        .get_or_init(|| pg_url("engines_agree").map(PgDatabase::connect))
        .as_ref()
}

/// Runs one input (nothing without a database, see the module's docs).
pub fn run(data: &[u8]) {
    let Some(db) = database() else {
        return;
    };
    let clock = db.clock().clone();
    clock.set(T0);
    db.empty();
    let redb = RedbEngine::open(&clock, true);
    let pg = PgEngine::open(db);
    Sim::new(clock, View::Any, vec![Box::new(redb), Box::new(pg)]).run(&ops(data));
}

/// Drops the process's schema when dropped (the end of a replay, passed or failed).
pub struct DropSchema(pub &'static PgDatabase);

impl Drop for DropSchema {
    fn drop(&mut self) {
        self.0.drop_schema();
    }
}
