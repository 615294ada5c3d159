//! Messaging: the outbox and its dispatcher, the inbox and its marks, event ids, out-of-order
//! events, compensation, and webhook signatures and receipts.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test messaging -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

mod compensation_runs_once;
mod dispatcher_delivers_in_order_at_least_once;
mod event_ids_are_unique_per_intent_and_stable_within_it;
mod inbox_duplicate_is_not_processed;
mod out_of_order_events_are_skipped;
mod outbox_event_commits_with_business_writes;
mod webhook_signatures_and_receipts;
