//! `idem`: the operator's view of a store file (feature `cli`).
//!
//! ```text
//! cargo run --features cli --bin idem -- [--file PATH] stats [--json]
//! cargo run --features cli --bin idem -- get --tenant T --op O --key K [--body] [--json]
//! cargo run --features cli --bin idem -- purge --tenant T --op O --key K [--force]
//! cargo run --features cli --bin idem -- sweep [--force]
//! cargo run --features cli --bin idem -- compact [--force]
//! cargo run --features cli --bin idem -- recover
//! cargo run --features cli --bin idem -- check [--in-place]
//! cargo run --features cli --bin idem -- export --jsonl [--body]
//! cargo run --features cli --bin idem -- outbox list [--limit N] [--body]
//! cargo run --features cli --bin idem -- outbox requeue SEQ [--force]
//! cargo run --features cli --bin idem -- outbox discard SEQ [--force]
//! ```
//!
//! Every command goes through the public API. The commands that only read (`stats`, `get`,
//! `export`, `outbox list`) open the file with `StoreBuilder::open_read_only`: they never write
//! a byte of it, and they refuse a file that needs crash recovery instead of recovering it.
//! `check` works on a copy (unless `--in-place`). Only `sweep`, `purge`, `compact` and
//! `outbox requeue|discard` open the file for writing, and first run redb's integrity check on a
//! copy of it (`--force` skips that copy; the open for writing still checks every page and
//! refuses a damaged file either way). No command creates a
//! store: a missing path, an empty file or a file that is not an idem store is an error.
//!
//! redb locks the file: on a file a running service holds open, every command fails and says
//! so (stop the service, or run both with `--multi-process` / `StoreBuilder::multi_process`).
//!
//! Exit status: 0 on success, and also when stdout is closed early (`idem export --jsonl |
//! head`: the reader wanted no more; nothing is printed); 1 when the command failed (the reason
//! on stderr), including an absent key (`get`, `purge`), a damaged file and a failed write of
//! the output (a full disk); 2 for a usage error (clap); 70 for a bug in idem (a panic that
//! reached the CLI; the report on stderr).
//!
//! Times are printed as RFC 3339 in UTC with milliseconds, and how far they are from now
//! (`2026-11-30T14:45:00.123Z (in 23h59m)`), with jiff. `--json` (`stats`, `get`) prints one
//! JSON object instead of the text lines; its fields are listed in each command's `--help`
//! ([`args::STATS_JSON_FIELDS`], [`args::RECORD_JSON_FIELDS`]) and in docs/CLI.md.
//!
//! | file | owns |
//! |---|---|
//! | `main.rs` | `main`: the exit status, panics reported as bugs, buffered stdout (`Out`, `out!`), stderr (`say`) |
//! | `args.rs` | the command line (clap's types) and the `--help` texts of the JSON fields |
//! | `open.rs` | opening the file: it must exist, read-only or for writing, the check of a copy before a write, what a failed open tells the operator |
//! | `commands/` | the commands, by group (`commands/mod.rs` has its table) |
//! | `render.rs` | printing records, stored HTTP answers, dead letters, times and spans, as text or JSON |

use std::fmt;
use std::io::{self, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;
use std::sync::Mutex;

use clap::Parser;

/// `out!(o, "format", args…)`: one line on stdout, `?` on a failed write.
macro_rules! out {
    ($o:expr) => {
        $o.line(format_args!(""))?
    };
    ($o:expr, $($arg:tt)*) => {
        $o.line(format_args!($($arg)*))?
    };
}

mod args;
mod commands;
mod open;
mod render;

use crate::args::Cli;
use crate::commands::run;

/// Why a command stopped.
pub(crate) enum Failure {
    /// The reason, for stderr (exit status 1).
    Said(String),
    /// Writing to stdout failed.
    Output(io::Error),
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure::Said(reason)
    }
}

/// Buffered, locked stdout whose write errors end the command (no `println!`: it panics when
/// stdout is a closed pipe or a full disk).
pub(crate) struct Out<W: Write>(W);

impl<W: Write> Out<W> {
    pub(crate) fn line(&mut self, args: fmt::Arguments<'_>) -> Result<(), Failure> {
        self.0
            .write_fmt(args)
            .and_then(|()| self.0.write_all(b"\n"))
            .map_err(Failure::Output)
    }

    fn flush(&mut self) -> Result<(), Failure> {
        self.0.flush().map_err(Failure::Output)
    }
}

/// The remedy of restoring a backup, with what it costs an idempotency store.
pub(crate) const RESTORE: &str =
    "restore a backup (every intent completed after the backup was taken would run again)";

/// A line on stderr. A failure to write it is ignored: there is nowhere left to report it.
pub(crate) fn say(msg: &str) {
    let _ = writeln!(io::stderr().lock(), "idem: {msg}");
}

/// The report of the last panic on the main thread, kept by the panic hook instead of printed.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// idem contains the panics redb raises on a damaged file and returns them as
/// `Error::CorruptStore`, whose message the CLI prints; the default hook would still print
/// "thread 'main' panicked at …" and a backtrace for each of them first. So on the main thread
/// the hook only keeps the report; `main` prints it if a panic reaches it (a bug, not a damaged
/// file). Other threads keep the default report.
fn keep_panic_reports() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().name() != Some("main") {
            return default(info);
        }
        let report = format!("{info}\n{}", std::backtrace::Backtrace::capture());
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(report);
        }
    }));
}

fn main() -> ExitCode {
    keep_panic_reports();
    let cli = Cli::parse();
    let mut out = Out(io::BufWriter::new(io::stdout().lock()));
    let Ok(result) = catch_unwind(AssertUnwindSafe(|| run(&cli, &mut out))) else {
        let report = LAST_PANIC.lock().ok().and_then(|mut r| r.take());
        say(&format!(
            "internal error: this is a bug in idem, please report it with this text:\n{}",
            report.as_deref().unwrap_or("(no report)")
        ));
        return ExitCode::from(70);
    };
    let flushed = out.flush();
    match result.and(flushed) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of a pipe closed it (`| head`): it wanted no more output. Not a failure.
        Err(Failure::Output(e)) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(Failure::Output(e)) => {
            say(&format!("cannot write the output: {e}"));
            ExitCode::FAILURE
        }
        Err(Failure::Said(msg)) => {
            say(&msg);
            ExitCode::FAILURE
        }
    }
}
