//! What idem is measured against, in the same run, on the same keys and filesystem.
//!
//! | file | owns |
//! |---|---|
//! | `naive.rs` | naive redb: one durable write transaction per claim, and its expiry-entry variants |
//! | `group_writer.rs` | the naive group-commit writer: one thread, one transaction per batch |
//! | `sqlite.rs` | the article's SQL flow on SQLite (WAL, `synchronous=FULL`), its lookups, its pre-fill |
//! | `memory.rs` | `Mutex<HashMap>`: a claim's CPU work without a disk (the CPU ceiling) |
//! | `disk.rs` | the disk's own `pwrite` + `fdatasync` rate |

pub mod disk;
pub mod group_writer;
pub mod memory;
pub mod naive;
pub mod sqlite;
