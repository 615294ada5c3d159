//! The `idem` operator binary on a store file, shared by the CLI tests (`cli_idem`,
//! `cli_damaged_file_never_panics`, `cli_read_commands_never_write`,
//! `cli_output_and_permission_errors_do_not_panic`).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// `idem --file <file> <args>`, ready to run (for tests that set its stdio or credentials).
pub fn command(file: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idem"));
    c.arg("--file").arg(file).args(args);
    c
}

/// Runs `idem --file <file> <args>` to completion and returns its status and output.
pub fn idem(file: &Path, args: &[&str]) -> Output {
    command(file, args).output().expect("run idem")
}
