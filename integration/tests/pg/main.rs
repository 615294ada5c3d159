//! The PostgreSQL engine across processes and failures: fleets of child processes on one
//! database, lost answers and commits, terminated backends, deadlocks, and a server restart
//! under load (`pg_a_server_restart_under_load_converges_to_one_effect_per_key`, which runs only
//! with `IDEM_PG_RESTART_OK=1` and alone: it restarts the server the other tests use).
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test pg -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../../../tests/common/mod.rs"]
mod common;

#[cfg(feature = "postgres")]
#[path = "../pg_fleet/mod.rs"]
mod pg_fleet;

mod pg_a_begin_whose_answer_was_lost_is_taken_at_once_by_its_retry;
mod pg_a_killed_lease_holder_is_taken_over_with_the_same_downstream_key;
mod pg_a_lost_commit_fails_only_the_calls_that_wrote;
mod pg_a_server_restart_under_load_converges_to_one_effect_per_key;
mod pg_deadlocks_and_dispatchers_across_nodes;
mod pg_two_processes_racing_on_one_database_cause_one_effect_per_key;
