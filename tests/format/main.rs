//! What is pinned: the record format and the journal's (docs/FORMAT.md), idem's reserved tables, files that are
//! not stores, a store an older redb wrote (golden files), and the layering of `src/` (each layer imports only
//! the ones below it).
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test format -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

mod empty_file_is_not_a_store;
mod golden_redb46;
mod journal_format;
mod journal_formats;
mod layers_import_one_way;
mod record_format;
mod reserved_tables;
