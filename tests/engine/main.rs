//! The store's own behaviour on one process: claims and replays, leases, expiry and sweeps,
//! group commit, retention, scopes, typed answers, and bad input as typed errors.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test engine -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

mod a_cut_short_first_open_leaves_an_openable_path;
mod a_table_opened_with_other_types_is_redbs_type_mismatch;
mod background_sweeper_stops_with_the_store;
mod bad_input_is_a_typed_error;
mod caller_errors;
mod check_integrity_needs_the_only_handle;
mod closures_read_their_tables_through_idems_handle;
mod commit_path_survives_panics;
mod compact_needs_the_only_handle;
mod concurrent_same_key;
mod durability_modes;
mod expiry;
mod expiry_index_matches_records;
mod group_commit_admits_late_callers;
mod group_commit_failure;
mod group_commit_isolation;
mod group_commit_runs_send_closures_on_the_batch_thread;
mod group_commit_stops_at_the_latch;
mod journal_mode;
mod journal_mode_commits_what_the_journal_cannot_hold;
mod lease_dropped_at_thread_exit;
mod lease_takeover_fencing;
mod lost_response_replays;
mod payload_mismatch;
mod read_path_sees_every_answered_commit;
mod replay_after_state_change;
mod retention_policy_keeps_the_longest_window;
mod retention_shorter_than_lease_is_refused;
mod scope_isolation;
mod steady_state_plateau;
mod stress_hot_keys;
mod sweep_in_bounded_batches;
mod sweep_spares_live_leases;
mod tombstone_after_response_window;
mod two_workers_claim_one_task;
mod typed_answers_replay_decoded;
