//! The `idem` operator binary (feature `cli`), run as a child process (`CARGO_BIN_EXE_idem`:
//! these tests are in the package of the binary).
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test cli -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../common/mod.rs"]
mod common;

#[path = "../damage/mod.rs"]
mod damage;

#[cfg(feature = "cli")]
#[path = "../idem_cli/mod.rs"]
mod idem_cli;

mod cli_damaged_file_never_panics;
mod cli_get_body_decodes_http_answers;
mod cli_handles_a_live_journal;
mod cli_idem;
mod cli_output_and_permission_errors_do_not_panic;
mod cli_pg_creates_only_when_asked;
mod cli_read_commands_never_write;
