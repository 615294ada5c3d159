//! The PostgreSQL tests that need a process of their own: they terminate every idem backend of
//! their process (`pg_fleet::terminate_own_backends`), which in the `pg` binary would also cut
//! the connections of the other tests running beside them. (Cargo runs test binaries one after
//! the other, so nothing else of this repository's suite runs in this process meanwhile.)
//!
//! One module per behaviour, named by the sentence it proves (`cargo test -p idem-integration
//! --test pg_own_process -- <module>::` runs one); the shared helpers are modules of this binary
//! too.

#[path = "../../../tests/common/mod.rs"]
mod common;

#[cfg(feature = "postgres")]
#[path = "../pg_fleet/mod.rs"]
mod pg_fleet;

mod pg_terminated_backends_give_typed_errors_and_retries_converge;
