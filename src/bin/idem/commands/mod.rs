//! The commands: `run` dispatches the parsed command line to one of them.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | `run`: which function each command is |
//! | `read.rs` | the read-only commands: `stats`, `get`, `export` |
//! | `write.rs` | the commands that write the file: `purge` (and its refusal without `--yes`), `sweep`, `recover`, `compact` |
//! | `check.rs` | `check`: integrity, records and expiry index, on a copy unless `--in-place` |
//! | `outbox.rs` | `outbox list`, `outbox requeue`, `outbox discard` |
//! | `pg.rs` | `pg ...`: a store on a PostgreSQL database (feature `postgres`) |

mod check;
mod outbox;
#[cfg(feature = "postgres")]
mod pg;
mod read;
mod write;

use std::io::Write;

use crate::args::{Cli, Command};
use crate::{Failure, Out};

/// Runs the command `cli` names, its output on `o`.
pub(crate) fn run<W: Write>(cli: &Cli, o: &mut Out<W>) -> Result<(), Failure> {
    match &cli.command {
        Command::Stats { json } => read::stats(cli, o, *json),
        Command::Get { id, body, json } => read::get(cli, o, id, *body, *json),
        Command::Purge { id, yes, write } => write::purge(cli, o, id, *yes, write),
        Command::Sweep { write } => write::sweep(cli, o, write),
        Command::Recover => write::recover(cli, o),
        Command::Compact { write } => write::compact(cli, o, write),
        Command::Check { in_place } => check::check(cli, o, *in_place),
        Command::Export { jsonl: _, body } => read::export(cli, o, *body),
        Command::Outbox { command } => outbox::outbox(cli, o, command),
        #[cfg(feature = "postgres")]
        Command::Pg { db, command } => pg::pg(db, o, command),
    }
}
