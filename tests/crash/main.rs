//! Crashes and failures: killed processes and restarts, crash points, damaged files and pages,
//! I/O failures and the fail-stop latch, repair on open.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test crash -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

#[path = "../damage/mod.rs"]
mod damage;

mod a_crashed_store_reports_its_repair;
mod a_panic_the_caller_caught_does_not_hide_a_damaged_page;
mod a_restart_takes_over_the_leases_of_a_killed_process;
mod an_expiry_index_mismatch_is_not_a_damaged_file;
mod an_io_failure_a_closure_reports_latches_fail_stop;
mod crash_point_enumeration;
mod damaged_pages_never_panic;
mod fail_stop;
mod failure_flag_follows_state;
mod io_error_loop;
mod journal_full_disk_during_checkpoint;
mod journal_torn_tails;
mod multi_process;
mod open_survives_io_failures;
mod process_kill;
mod quick_repair_reopens_without_a_rebuild;
