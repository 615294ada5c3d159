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
//! ([`STATS_JSON_FIELDS`], [`RECORD_JSON_FIELDS`]) and in docs/CLI.md.

use std::fmt;
use std::io::{self, Write};
use std::ops::ControlFlow;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use clap::{Parser, Subcommand};
use idem::format::{HttpEnvelope, Record, State, to_hex};
use idem::outbox::DeadLetter;
use idem::store::ReadOnlyStore;
use idem::{Error, Scope, Store, StoreBuilder, Timestamp};

/// Inspect and maintain an idem store file.
#[derive(Parser)]
#[command(name = "idem", version, about)]
struct Cli {
    /// The store file.
    #[arg(long, global = true, default_value = "data/idem.redb")]
    file: PathBuf,
    /// Open in redb's multi-process mode (the service must use it too).
    #[arg(long, global = true)]
    multi_process: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Records by stored state, records due for a sweep, the outbox backlog, dead letters and
    /// the file size. Read-only.
    #[command(after_help = STATS_JSON_FIELDS)]
    Stats {
        /// One JSON object on stdout instead of the text lines (fields below).
        #[arg(long)]
        json: bool,
    },
    /// One record: state, fingerprint, timestamps, response summary (no body unless --body).
    /// An absent key prints `absent` (`null` with --json) and exits 1. Read-only.
    #[command(after_help = RECORD_JSON_FIELDS)]
    Get {
        #[command(flatten)]
        id: KeyArgs,
        /// Also print the stored response body (may contain customer data). An answer the
        /// HTTP layer stored (an IDH1/IDH2 envelope) is decoded: its headers, then its body as
        /// UTF-8 text, or as hex when it is not valid UTF-8.
        #[arg(long)]
        body: bool,
        /// One JSON object on stdout instead of the text lines (fields below; the same object
        /// as `export --jsonl` prints for the record).
        #[arg(long)]
        json: bool,
    },
    /// Removes one record: the key becomes free and a retry of the intent RUNS AGAIN. Refused
    /// without `--yes`. An absent key prints `absent` and exits 1, as `get` does.
    Purge {
        #[command(flatten)]
        id: KeyArgs,
        /// Confirms it: a retry of this intent (a payment, an email) will run again.
        #[arg(long)]
        yes: bool,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// One sweep pass: shrinks records past their response window, deletes those past their
    /// horizon.
    Sweep {
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Recovers a file that was not closed cleanly (the process that had it open died, or a
    /// write failed part-way), which read commands refuse ("needs crash recovery"): opens it
    /// for writing once, which repairs it, and closes it cleanly. Writes nothing else; on a
    /// file closed cleanly it only checks its pages.
    Recover,
    /// Gives free space back to the file system (sweep first; needs the file to itself).
    Compact {
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Runs redb's full integrity check, decodes every record and checks the expiry index
    /// against the records; exits non-zero on any problem. Works on a temporary copy of the file
    /// (next to it, removed afterwards), so the file itself is never written, unless
    /// `--in-place`: a failed check of a damaged file leaves that file marked for repair, unable
    /// to open again.
    Check {
        /// Check (and let redb repair) the file itself instead of a copy.
        #[arg(long)]
        in_place: bool,
    },
    /// Every record as one JSON object per line (no bodies unless --body). Read-only.
    #[command(after_help = RECORD_JSON_FIELDS)]
    Export {
        /// JSON Lines on stdout: the only format, and the default (accepted for scripts that
        /// name it).
        #[arg(long)]
        jsonl: bool,
        /// Include response bodies (lossy UTF-8, and the HTTP layer's envelope decoded; may
        /// contain customer data).
        #[arg(long)]
        body: bool,
    },
    /// The outbox's dead letters: events whose publishing failed its last allowed attempt.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// A store on a PostgreSQL database (the `postgres` feature): create or check its schema,
    /// counts, one record, purge, a sweep pass.
    #[cfg(feature = "postgres")]
    Pg {
        #[command(flatten)]
        db: PgArgs,
        #[command(subcommand)]
        command: PgCommand,
    },
}

/// Where a PostgreSQL store is.
#[cfg(feature = "postgres")]
#[derive(clap::Args)]
struct PgArgs {
    /// The database (postgresql://user@host:port/db).
    #[arg(long)]
    url: String,
    /// The PostgreSQL schema of idem's tables.
    #[arg(long, default_value = "idem")]
    schema: String,
}

#[cfg(feature = "postgres")]
#[derive(Subcommand)]
enum PgCommand {
    /// Creates the schema's tables if they are missing, or checks their version (what every
    /// store does when it opens); prints the schema version.
    Migrate,
    /// Records by stored state, records due for a sweep, the outbox backlog and dead letters of
    /// the whole fleet.
    #[command(after_help = PG_STATS_JSON_FIELDS)]
    Stats {
        /// One JSON object on stdout instead of the text lines (fields below).
        #[arg(long)]
        json: bool,
    },
    /// One record, as `idem get` prints it. An absent key prints `absent` and exits 1.
    Get {
        #[command(flatten)]
        id: KeyArgs,
        /// Also print the stored response body (the HTTP layer's envelope decoded).
        #[arg(long)]
        body: bool,
        /// One JSON object on stdout (the fields of `idem get --json`).
        #[arg(long)]
        json: bool,
    },
    /// Removes one record: the key becomes free and a retry of the intent RUNS AGAIN. Refused
    /// without `--yes`.
    Purge {
        #[command(flatten)]
        id: KeyArgs,
        /// Confirms it: a retry of this intent (a payment, an email) will run again.
        #[arg(long)]
        yes: bool,
    },
    /// One sweep pass (bounded batches; safe while the fleet runs).
    Sweep,
}

/// The fields of `pg stats --json`.
#[cfg(feature = "postgres")]
const PG_STATS_JSON_FIELDS: &str = "\
JSON (--json): one object on stdout with the fields of `idem stats --json`, except that `file` \
and `file_bytes` are replaced by `schema` (the PostgreSQL schema).";

#[derive(Subcommand)]
enum OutboxCommand {
    /// Dead letters, oldest first: seq, id, topic, ordering key, attempts, last error (no
    /// payload unless --body). Read-only.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Also print payloads and headers (lossy UTF-8; may contain customer data).
        #[arg(long)]
        body: bool,
    },
    /// Moves dead letter SEQ back into the outbox, at its place in commit order, with its
    /// attempts reset; the service's dispatcher publishes it again (on its next start, or
    /// within its idle re-check if it shares the file in multi-process mode).
    Requeue {
        /// The dead letter's sequence number (`idem outbox list`).
        seq: u64,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Deletes dead letter SEQ for good: it is NEVER published, and later events with its
    /// ordering key are no longer held back.
    Discard {
        /// The dead letter's sequence number (`idem outbox list`).
        seq: u64,
        #[command(flatten)]
        write: WriteArgs,
    },
}

/// The fields of `stats --json`, for its `--help` (docs/CLI.md lists the same).
const STATS_JSON_FIELDS: &str = "\
JSON (--json): one object on stdout, with these fields. Their names and meanings are stable; \
fields may be added.
  file            the store file, as given with --file
  file_bytes      its size in bytes (null when it cannot be read)
  records         records in the file, in any state
  pending         records stored as pending (a lease, live or lapsed)
  completed       records stored as completed, with their response
  failed          records stored as failed, with their response
  tombstones      records shrunk to tombstones (response window over, key still bound)
  due             records the next sweep shrinks or deletes
  outbox_pending  outbox events committed and not yet published
  dead_letters    outbox events whose publishing failed its last allowed attempt";

/// The fields of `get --json` and of each line of `export --jsonl`, for their `--help`
/// (docs/CLI.md lists the same).
const RECORD_JSON_FIELDS: &str = "\
JSON (get --json, each line of export --jsonl): one object per record, with these fields. \
Their names and meanings are stable; fields may be added. Times are milliseconds since the \
Unix epoch (UTC). A field that does not apply to the record's state is absent. `get --json` \
of an absent key prints null (and exits 1, as without --json).
  tenant             the scope's tenant (lossy UTF-8)
  op                 the scope's operation
  key                the idempotency key
  state              pending, completed, failed or tombstone
  fingerprint        the request fingerprint, 64 hex digits
  created_at_ms      when the intent was first claimed
  expires_at_ms      when the response window ends (a retry then gets the tombstone)
  forget_at_ms       when the record may be deleted (the key is then free)
  expired            true when the response window is over
  lease_deadline_ms  pending: when the lease lapses
  attempt            pending: the attempt that holds the lease
  status             completed, failed, tombstone: the stored status
  body_bytes         completed, failed: the size of the answer's body (the HTTP body of an answer the layer stored)
  stored_bytes       completed, failed: the size of the response as stored (the HTTP layer's envelope included)
  resource           the resource pointer, [kind, id], when there is one
  body               with --body: the stored response body, lossy UTF-8
  http               with --body, when the body is an answer the HTTP layer stored:
  http.envelope        IDH1 (kept whole) or IDH2
  http.body_omitted    true when the answer was over max_response_bytes and its body not kept
  http.headers         the stored header lines, [[name, value], ...] (lossy UTF-8)
  http.body            the answer's body, when it was kept and is valid UTF-8
  http.body_hex        the answer's body in hex, when it was kept and is not valid UTF-8
  http_error         with --body, when the body starts like an envelope but is damaged
  error              export: why the record does not decode (with only tenant, op, key)
  record_key_hex     export: the stored key of a record that does not decode";

#[derive(clap::Args)]
struct KeyArgs {
    /// The tenant of the scope.
    #[arg(long)]
    tenant: String,
    /// The operation of the scope (the HTTP layer's default is "METHOD /route/{template}").
    #[arg(long)]
    op: String,
    /// The idempotency key.
    #[arg(long)]
    key: String,
}

impl KeyArgs {
    /// The message of an absent key, then `what` (what the command did not do).
    fn absent(&self, what: &str) -> String {
        format!(
            "no record for tenant {:?}, op {:?}, key {:?}{what} (check the three against \
             `idem export --jsonl`; the HTTP layer's operation is \"METHOD /route/{{template}}\")",
            self.tenant, self.op, self.key
        )
    }
}

/// The options of the commands that write to the file.
#[derive(clap::Args)]
struct WriteArgs {
    /// Skip the check of a copy of the file (redb's integrity check and idem's own, of records
    /// and expiry index) that comes first by default. The open for writing still checks every
    /// page's checksum, and refuses a file whose pages fail it.
    #[arg(long)]
    force: bool,
}

/// Why a command stopped.
enum Failure {
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
struct Out<W: Write>(W);

impl<W: Write> Out<W> {
    fn line(&mut self, args: fmt::Arguments<'_>) -> Result<(), Failure> {
        self.0
            .write_fmt(args)
            .and_then(|()| self.0.write_all(b"\n"))
            .map_err(Failure::Output)
    }

    fn flush(&mut self) -> Result<(), Failure> {
        self.0.flush().map_err(Failure::Output)
    }
}

/// `out!(o, "format", args…)`: one line on stdout, `?` on a failed write.
macro_rules! out {
    ($o:expr) => {
        $o.line(format_args!(""))?
    };
    ($o:expr, $($arg:tt)*) => {
        $o.line(format_args!($($arg)*))?
    };
}

/// The remedy of restoring a backup, with what it costs an idempotency store.
const RESTORE: &str =
    "restore a backup (every intent completed after the backup was taken would run again)";

/// A line on stderr. A failure to write it is ignored: there is nowhere left to report it.
fn say(msg: &str) {
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

/// The store file must exist and be a file: the CLI never creates a store (the library's opens
/// used here refuse an empty file and a file that is not an idem store).
fn require_file(cli: &Cli) -> Result<(), Failure> {
    let file = cli.file.display();
    match std::fs::metadata(&cli.file) {
        Ok(m) if m.is_dir() => Err(format!(
            "{file} is a directory, not a store file (pass --file PATH of the store file)"
        )
        .into()),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(format!("{file}: no such store file (pass --file PATH)").into())
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Err(format!(
            "{file}: permission denied ({e}): run idem as a user who may read the file and its directory"
        )
        .into()),
        Err(e) => Err(format!("{file}: {e}").into()),
    }
}

fn builder(cli: &Cli) -> StoreBuilder {
    Store::builder()
        .multi_process(cli.multi_process)
        // A file left by a crash takes seconds per GB to repair: say so rather than look hung.
        // (A failed write to stderr is ignored: the repair goes on.)
        .on_repair(|progress| {
            let _ = writeln!(
                io::stderr(),
                "idem: repairing a file that was not closed cleanly (redb walks it to rebuild its allocator state): {:.0} % after {:.1} s",
                progress.fraction() * 100.0,
                progress.elapsed().as_secs_f64()
            );
        })
}

/// The redb error under a storage error, if that is what `e` is.
fn redb_cause(e: &Error) -> Option<&idem::redb::Error> {
    match e {
        Error::Storage { source } => source.downcast_ref::<idem::redb::Error>(),
        _ => None,
    }
}

/// What an open failed with, for the operator.
fn open_failed(cli: &Cli, e: &Error) -> Failure {
    let file = cli.file.display();
    let msg = e.to_string();
    let io_kind = match redb_cause(e) {
        Some(idem::redb::Error::Io(io)) => Some(io.kind()),
        _ => None,
    };
    if let Error::AlreadyOpen { .. } = e {
        format!(
            "{file}: {msg}\n  another process holds this file (redb allows one process per file): \
             stop it, or run both in multi-process mode (--multi-process here, \
             StoreBuilder::multi_process(true) in the service)"
        )
    } else if let Some(failure) = not_a_store(cli, e) {
        return failure;
    } else if io_kind == Some(io::ErrorKind::PermissionDenied) {
        format!(
            "{file}: permission denied ({msg}): run idem as a user who may read the file (and, \
             for sweep, purge, compact, outbox requeue|discard, write it)"
        )
    } else {
        format!("{file}: {msg}")
    }
    .into()
}

/// `purge` without `--yes`: what it would do, and that nothing was done.
fn purge_unconfirmed(id: &KeyArgs) -> Failure {
    format!(
        "purge frees the key {:?} (tenant {:?}, operation {:?}): a retry of that intent will RUN \
         AGAIN (a second payment, a second email). Nothing was done; pass --yes to purge it",
        id.key, id.tenant, id.op
    )
    .into()
}

/// The file is not a store at all (an empty file, a text file, a redb file of another program):
/// the path is wrong, which no recovery advice mends.
fn not_a_store(cli: &Cli, e: &Error) -> Option<Failure> {
    match e {
        Error::CorruptStore { reason }
            if reason.contains("not an idem store")
                || reason.contains("not a readable redb database") =>
        {
            Some(
                format!(
                    "{}: not an idem store ({reason}): check the path (--file)",
                    cli.file.display()
                )
                .into(),
            )
        }
        _ => None,
    }
}

/// The read-only commands' store: nothing is written to the file.
fn open_read_only(cli: &Cli) -> Result<ReadOnlyStore, Failure> {
    require_file(cli)?;
    builder(cli)
        .open_read_only(&cli.file)
        .map_err(|e| open_failed(cli, &e))
}

/// The writing commands' store. Unless `force`, a copy of the file passes redb's integrity
/// check first: a write to a file with damaged pages could spread the damage, and would alter
/// the evidence.
fn open_for_writing(cli: &Cli, write: &WriteArgs) -> Result<Store, Failure> {
    require_file(cli)?;
    if !write.force {
        check_before_writing(cli)?;
    }
    builder(cli)
        .open_existing(&cli.file)
        .map_err(|e| open_failed(cli, &e))
}

fn check_before_writing(cli: &Cli) -> Result<(), Failure> {
    let file = cli.file.display();
    let refuse = |why: String| -> Failure {
        format!(
            "{file}: refused: this command writes to the file, and redb's integrity check of a \
             copy of it failed ({why}). Nothing was written. Keep the file as it is (evidence), \
             run `idem check` to see the damage, then move the file away or {RESTORE}. (--force \
             skips this check of a copy, but the open for writing still refuses a file whose \
             pages fail their checksums.)"
        )
        .into()
    };
    let (copy, _) = copy_of_file(cli, "--force")?;
    let mut store = match builder(cli).open_existing(&copy.0) {
        Ok(store) => store,
        Err(e) => {
            return Err(not_a_store(cli, &e)
                .unwrap_or_else(|| refuse(format!("the copy does not open: {}", detail(&e)))));
        }
    };
    match store.check_integrity() {
        Ok(true) => Ok(()),
        // redb's pages are intact and only idem's expiry index disagrees with the records:
        // `sweep` repairs most of that, and `purge` is the remedy for a record that does not
        // decode. Anything else — a damaged page, a panic contained while reading — refuses.
        Err(Error::ExpiryIndexMismatch {
            repaired: false, ..
        }) => Ok(()),
        Ok(false) | Err(Error::ExpiryIndexMismatch { repaired: true, .. }) => {
            Err(refuse("redb found damage and repaired the copy".into()))
        }
        Err(e) => Err(refuse(detail(&e))),
    }
}

/// Copies the store file next to itself (for `idem check` and the check before a write),
/// without writing to it: a read-only open holds redb's shared lock meanwhile (refused while
/// another process has the file open for writing), and a file that does not open read-only (it
/// needs recovery, or it is damaged) is copied as it is, so the recovery runs on the copy.
/// In multi-process mode the lock admits writers, which may commit during the copy: a read
/// transaction held through it keeps every page of its snapshot, and of every later commit,
/// from being reused meanwhile (redb frees a page for reuse only once no reader may still see
/// it), so the commit the copied header names is copied whole.
/// Returns the copy and whether the lock was held.
/// `bypass` is the command's flag that works on the file without a copy (`--in-place` for
/// `check`, `--force` for the write commands), which the hints name.
fn copy_of_file(cli: &Cli, bypass: &str) -> Result<(Removed, bool), Failure> {
    require_file(cli)?;
    let file = cli.file.display();
    let lock = match builder(cli).open_read_only(&cli.file) {
        Ok(store) => Some(store),
        Err(Error::AlreadyOpen { .. }) => {
            return Err(format!(
                "{file}: another process (a service?) has this file open: stop it first; if it \
                 runs in multi-process mode, pass --multi-process (and {bypass}) to share it"
            )
            .into());
        }
        Err(_) => None,
    };
    // Without it (it failed to begin) the copy is made as before: a damage it shows is checked.
    let _snapshot = lock.as_ref().and_then(|store| store.begin_read().ok());
    let path = cli
        .file
        .with_extension(format!("idem-check-{}.redb", std::process::id()));
    let copy = path.display();
    // The reader's side and the writer's side fail for different reasons: say which.
    let mut from = std::fs::File::open(&cli.file).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied {
            ": run idem as a user who may read it"
        } else {
            ""
        };
        format!("{file}: cannot read the file to copy it ({e}){hint}")
    })?;
    let cannot_write = |e: io::Error| -> Failure {
        let hint = match e.kind() {
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                format!("free some space next to the file, or pass {bypass}")
            }
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => format!(
                "run idem as a user who may create files in the file's directory, or pass {bypass}"
            ),
            _ => format!("pass {bypass} to work on the file itself"),
        };
        format!(
            "{copy}: cannot write a temporary copy of the file ({e}): {hint}. {file} itself \
             was not modified"
        )
        .into()
    };
    // create_new: never overwrite a file that happens to have that name.
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(cannot_write)?;
    let removed = Removed(path.clone());
    io::copy(&mut from, &mut to).map_err(cannot_write)?;
    to.flush().map_err(cannot_write)?;
    Ok((removed, lock.is_some()))
}

/// A temporary file, removed when dropped (on every path out of the command).
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn file_size(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(|e| format!("unknown ({e})"), |m| m.len().to_string())
}

/// What went wrong, without the advice of `Error::CorruptStore`'s message (where the CLI
/// gives its own, about the file rather than a copy).
fn detail(e: &Error) -> String {
    match e {
        Error::CorruptStore { reason } => format!("damaged or not an idem store: {reason}"),
        other => other.to_string(),
    }
}

/// A failed call on an open store (a damaged page, a record that does not decode, …).
fn failed(cli: &Cli) -> impl Fn(Error) -> Failure + '_ {
    move |e| Failure::Said(format!("{}: {e}", cli.file.display()))
}

fn run<W: Write>(cli: &Cli, o: &mut Out<W>) -> Result<(), Failure> {
    let failed = failed(cli);
    match &cli.command {
        Command::Stats { json } => {
            let store = open_read_only(cli)?;
            let s = store.stats().map_err(&failed)?;
            let ob = store.outbox_stats().map_err(&failed)?;
            if *json {
                let file_bytes = std::fs::metadata(&cli.file).ok().map(|m| m.len());
                let stats = serde_json::json!({
                    "file": cli.file.display().to_string(),
                    "file_bytes": file_bytes,
                    "records": s.records,
                    "pending": s.pending,
                    "completed": s.completed,
                    "failed": s.failed,
                    "tombstones": s.tombstones,
                    "due": s.due,
                    "outbox_pending": ob.pending,
                    "dead_letters": ob.dead,
                });
                out!(o, "{stats}");
                return Ok(());
            }
            out!(o, "file        {}", cli.file.display());
            out!(o, "file_bytes  {}", file_size(&cli.file));
            out!(o, "records     {}", s.records);
            out!(o, "pending     {}", s.pending);
            out!(o, "completed   {}", s.completed);
            out!(o, "failed      {}", s.failed);
            out!(o, "tombstones  {}", s.tombstones);
            out!(o, "due         {}", s.due);
            out!(o, "outbox_pending {}", ob.pending);
            out!(o, "dead_letters   {}", ob.dead);
        }
        Command::Get { id, body, json } => {
            let store = open_read_only(cli)?;
            let scope = Scope::new(&id.tenant, &id.op);
            match store.get(&scope, &id.key).map_err(&failed)? {
                None => {
                    // stdout still says it, as one JSON value with --json: `jq` reads `null`
                    // (and `jq -e` fails on it), while a failure to read prints nothing.
                    out!(o, "{}", if *json { "null" } else { "absent" });
                    return Err(id.absent("").into());
                }
                Some(r) if *json => {
                    let line = record_json(&id.tenant, &id.op, &id.key, &r, store.now(), *body);
                    out!(o, "{line}");
                }
                Some(r) => print_record(o, &r, store.now(), *body)?,
            }
        }
        Command::Purge { id, yes, write } => {
            if !yes {
                return Err(purge_unconfirmed(id));
            }
            let store = open_for_writing(cli, write)?;
            let scope = Scope::new(&id.tenant, &id.op);
            if !store.purge(&scope, &id.key).map_err(&failed)? {
                out!(o, "absent");
                return Err(id.absent(": nothing was purged").into());
            }
            out!(o, "purged");
        }
        Command::Sweep { write } => {
            let store = open_for_writing(cli, write)?;
            // Progress on stderr, once per second on a long pass (stdout stays the summary).
            let mut last = std::time::Instant::now();
            let r = store
                .sweep_with_progress(|so_far| {
                    if last.elapsed() >= std::time::Duration::from_secs(1) {
                        last = std::time::Instant::now();
                        say(&format!(
                            "sweeping: {} deleted, {} tombstoned, {} batches, {} ms",
                            so_far.deleted,
                            so_far.tombstoned,
                            so_far.batches,
                            so_far.duration.as_millis()
                        ));
                    }
                })
                .map_err(&failed)?;
            let m = store.metrics();
            out!(o, "deleted     {}", r.deleted);
            out!(o, "tombstoned  {}", r.tombstoned);
            out!(o, "repaired    {}", r.repaired);
            out!(o, "batches     {}", r.batches);
            out!(o, "duration_ms {}", r.duration.as_millis());
            out!(o, "commits     {}", m.commits);
        }
        Command::Recover => {
            require_file(cli)?;
            let store = builder(cli)
                .open_existing(&cli.file)
                .map_err(|e| open_failed(cli, &e))?;
            let repaired = store.repair_time();
            drop(store);
            match repaired {
                Some(took) => out!(o, "recovered    in {:.3} s", took.as_secs_f64()),
                None => out!(o, "clean        nothing to recover"),
            }
        }
        Command::Compact { write } => {
            let before = file_size(&cli.file);
            let mut store = open_for_writing(cli, write)?;
            let moved = store.compact().map_err(|e| {
                Failure::Said(format!(
                    "{}: {e}. Compaction stopped part-way, which leaves the file needing crash \
                     recovery: the next open for writing makes it (start the service, or run \
                     `idem recover` once space is back); read commands answer \"needs crash \
                     recovery\" until then",
                    cli.file.display()
                ))
            })?;
            drop(store);
            out!(o, "compacted   {moved}");
            out!(o, "bytes_before {before}");
            out!(o, "bytes_after  {}", file_size(&cli.file));
        }
        Command::Check { in_place } => check(cli, o, *in_place)?,
        Command::Export { jsonl: _, body } => {
            let store = open_read_only(cli)?;
            let now = store.now();
            let mut output = Ok(());
            store
                .for_each_record(|key, record| {
                    output = o.line(format_args!("{}", export_line(key, record, now, *body)));
                    if output.is_ok() {
                        ControlFlow::Continue(())
                    } else {
                        ControlFlow::Break(())
                    }
                })
                .map_err(&failed)?;
            output?;
        }
        Command::Outbox { command } => outbox(cli, o, command)?,
        #[cfg(feature = "postgres")]
        Command::Pg { db, command } => pg(db, o, command)?,
    }
    Ok(())
}

/// `idem pg ...`: a store on a PostgreSQL database. Only `migrate` creates the schema; the
/// other commands refuse a database without it (nothing is created by a typo in a URL).
#[cfg(feature = "postgres")]
fn pg<W: Write>(db: &PgArgs, o: &mut Out<W>, command: &PgCommand) -> Result<(), Failure> {
    use idem::postgres::PgStore;
    let failed = |e: Error| Failure::Said(format!("PostgreSQL schema {}: {e}", db.schema));
    let builder = PgStore::builder(&db.url).schema(&db.schema).writers(1);
    let store = match command {
        PgCommand::Migrate => builder.open(),
        _ => builder.open_existing(),
    }
    .map_err(failed)?;
    match command {
        PgCommand::Migrate => {
            out!(o, "schema          {}", db.schema);
            out!(o, "schema_version  {}", idem::postgres::SCHEMA_VERSION);
        }
        PgCommand::Stats { json } => {
            let s = store.stats().map_err(failed)?;
            let ob = store.outbox_stats().map_err(failed)?;
            if *json {
                let stats = serde_json::json!({
                    "schema": db.schema,
                    "records": s.records,
                    "pending": s.pending,
                    "completed": s.completed,
                    "failed": s.failed,
                    "tombstones": s.tombstones,
                    "due": s.due,
                    "outbox_pending": ob.pending,
                    "dead_letters": ob.dead,
                });
                out!(o, "{stats}");
                return Ok(());
            }
            out!(o, "schema      {}", db.schema);
            out!(o, "records     {}", s.records);
            out!(o, "pending     {}", s.pending);
            out!(o, "completed   {}", s.completed);
            out!(o, "failed      {}", s.failed);
            out!(o, "tombstones  {}", s.tombstones);
            out!(o, "due         {}", s.due);
            out!(o, "outbox_pending {}", ob.pending);
            out!(o, "dead_letters   {}", ob.dead);
        }
        PgCommand::Get { id, body, json } => {
            let scope = Scope::new(&id.tenant, &id.op);
            match store.get(&scope, &id.key).map_err(failed)? {
                None => {
                    out!(o, "{}", if *json { "null" } else { "absent" });
                    return Err(id.absent("").into());
                }
                Some(r) if *json => {
                    let line = record_json(&id.tenant, &id.op, &id.key, &r, store.now(), *body);
                    out!(o, "{line}");
                }
                Some(r) => print_record(o, &r, store.now(), *body)?,
            }
        }
        PgCommand::Purge { id, yes } => {
            if !yes {
                return Err(purge_unconfirmed(id));
            }
            let scope = Scope::new(&id.tenant, &id.op);
            if !store.purge(&scope, &id.key).map_err(failed)? {
                out!(o, "absent");
                return Err(id.absent(": nothing was purged").into());
            }
            out!(o, "purged");
        }
        PgCommand::Sweep => {
            let r = store.sweep().map_err(failed)?;
            out!(o, "deleted     {}", r.deleted);
            out!(o, "tombstoned  {}", r.tombstoned);
            out!(o, "batches     {}", r.batches);
            out!(o, "duration_ms {}", r.duration.as_millis());
        }
    }
    Ok(())
}

/// `idem check`: redb's integrity check, then every record, then the expiry index; it stops
/// after a failed integrity check (the records of a file with damaged pages are not worth
/// decoding, and redb may not be able to read them).
fn check<W: Write>(cli: &Cli, o: &mut Out<W>, in_place: bool) -> Result<(), Failure> {
    let file = cli.file.display();
    // Declared first so that it outlives the store opened on it.
    let mut copy: Option<Removed> = None;
    let (mut store, subject) = if in_place {
        require_file(cli)?;
        let store = builder(cli)
            .open_existing(&cli.file)
            .map_err(|e| open_failed(cli, &e))?;
        (store, format!("the file itself ({file})"))
    } else {
        let (removed, locked) = copy_of_file(cli, "--in-place")?;
        let path = copy.insert(removed).0.clone();
        let note = if locked {
            ""
        } else {
            " of a file that was not closed cleanly or does not open read-only"
        };
        out!(
            o,
            "checking    a copy{note} ({}); the file itself is not written",
            path.display()
        );
        let subject = format!("the temporary copy ({})", path.display());
        match builder(cli).open_existing(&path) {
            Ok(store) => (store, subject),
            Err(e) => {
                out!(o, "file_integrity FAILED");
                out!(o, "  {subject} does not open as a store: {}", detail(&e));
                out!(o, "  {file} itself was not modified; the copy was removed");
                return Err(format!(
                    "{file} does not open as an idem store: it is damaged or is not one (above); if it should be one, move it away or {RESTORE}"
                )
                .into());
            }
        }
    };
    // redb's full integrity check first (it needs the only handle, which this is), with idem's
    // expiry-index check: a mismatch there leaves redb's verdict as it was (no fail-stop) and is
    // reported after the records.
    let (integrity, index) = match store.check_integrity() {
        Err(Error::ExpiryIndexMismatch { reason, repaired }) => (Ok(!repaired), Err(reason)),
        other => (other, Ok(())),
    };
    let verdict = match &integrity {
        Ok(true) => "ok",
        Ok(false) => "REPAIRED",
        Err(_) => "FAILED",
    };
    out!(o, "file_integrity {verdict}");
    match &integrity {
        Ok(true) => {}
        Ok(false) => out!(o, "  redb found damage in {subject} and repaired it"),
        Err(e) => out!(o, "  {subject}: {}", detail(e)),
    }
    if integrity.is_err() {
        if in_place {
            out!(
                o,
                "  this was the file itself: it is damaged, and an open that checks its pages (the default) refuses it"
            );
        } else {
            out!(
                o,
                "  this is the result for the temporary copy, which was removed; {file} itself was not modified"
            );
        }
        return Err(format!(
            "{file} is damaged (above): keep it as it is (evidence), and move it away or \
             {RESTORE}; a service that opens it may fail on the damaged pages"
        )
        .into());
    }
    let mut ok = 0u64;
    let mut bad = Vec::new();
    let walked = store.for_each_record(|key, record| {
        match (split_key(key), record) {
            (Some(_), Ok(_)) => ok += 1,
            (_, Err(e)) => bad.push(format!("{}: {e}", to_hex(key))),
            (None, Ok(_)) => bad.push(format!("{}: malformed record key", to_hex(key))),
        }
        ControlFlow::Continue(())
    });
    out!(o, "records_ok   {ok}");
    out!(o, "records_bad  {}", bad.len());
    for b in bad.iter().take(20) {
        out!(o, "  {b}");
    }
    if let Err(e) = &walked {
        out!(o, "  reading the records stopped: {e}");
    }
    out!(
        o,
        "expiry_index {}",
        index.as_ref().map_or("MISMATCH", |()| "ok")
    );
    if let Err(detail) = &index {
        out!(o, "  {detail}");
    }
    if !bad.is_empty() || walked.is_err() || index.is_err() {
        return Err(format!(
            "the store has problems (above): `idem get` / `idem purge` the keys, `idem sweep` \
             repairs the expiry index, or move {file} away or {RESTORE}"
        )
        .into());
    }
    if !matches!(integrity, Ok(true)) {
        return Err(format!("redb repaired damage in {subject} (above)").into());
    }
    Ok(())
}

fn outbox<W: Write>(cli: &Cli, o: &mut Out<W>, command: &OutboxCommand) -> Result<(), Failure> {
    let failed = failed(cli);
    let no_such =
        |seq: u64| format!("no dead letter with seq {seq} (`idem outbox list` shows them)");
    match command {
        OutboxCommand::List { limit, body } => {
            let store = open_read_only(cli)?;
            let stats = store.outbox_stats().map_err(&failed)?;
            let dead = store.dead_letters(*limit).map_err(&failed)?;
            out!(o, "dead_letters {}", stats.dead);
            let now = store.now();
            for d in &dead {
                out!(o);
                print_dead_letter(o, d, now, *body)?;
            }
            if (dead.len() as u64) < stats.dead {
                out!(o);
                out!(o, "(first {} shown; pass --limit N for more)", dead.len());
            }
        }
        OutboxCommand::Requeue { seq, write } => {
            let store = open_for_writing(cli, write)?;
            if !store.requeue_dead_letter(*seq).map_err(&failed)? {
                out!(o, "absent");
                return Err(no_such(*seq).into());
            }
            out!(o, "requeued");
        }
        OutboxCommand::Discard { seq, write } => {
            let store = open_for_writing(cli, write)?;
            if !store.discard_dead_letter(*seq).map_err(&failed)? {
                out!(o, "absent");
                return Err(no_such(*seq).into());
            }
            out!(o, "discarded");
        }
    }
    Ok(())
}

fn print_dead_letter<W: Write>(
    o: &mut Out<W>,
    d: &DeadLetter,
    now: Timestamp,
    with_body: bool,
) -> Result<(), Failure> {
    let e = &d.event;
    out!(o, "seq          {}", e.seq);
    out!(o, "id           {}", e.id);
    out!(o, "topic        {}", e.topic);
    out!(
        o,
        "ordering_key {}",
        e.ordering_key.as_deref().unwrap_or("-")
    );
    out!(o, "attempts     {}", e.failed_attempts);
    out!(o, "created_at   {}", when(e.created_at, now));
    out!(o, "failed_at    {}", when(d.failed_at, now));
    out!(o, "error        {}", d.error.replace('\n', " "));
    out!(o, "payload_bytes {}", e.payload.len());
    out!(o, "headers      {}", e.headers.len());
    if with_body {
        for (name, value) in &e.headers {
            out!(o, "header       {name}: {value}");
        }
        out!(o, "payload      {}", String::from_utf8_lossy(&e.payload));
    }
    Ok(())
}

/// The tenant, operation and idempotency key a stored record key names (lossy UTF-8), or
/// `None` for bytes that are not a record key.
fn split_key(k: &[u8]) -> Option<(String, String, String)> {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (tenant, operation, key) = Scope::split_record_key(k)?;
    Some((lossy(tenant), lossy(operation), lossy(key)))
}

/// One line of `export --jsonl`: the record's object ([`record_json`]), or for a record that
/// does not decode, its scope and key (as far as the stored key splits), the error and the
/// stored key in hex.
fn export_line(
    key: &[u8],
    record: Result<Record, Error>,
    now: Timestamp,
    with_body: bool,
) -> serde_json::Value {
    let (tenant, op, k) = split_key(key).unwrap_or_default();
    match record {
        Ok(r) => record_json(&tenant, &op, &k, &r, now, with_body),
        Err(e) => serde_json::json!({
            "tenant": tenant,
            "op": op,
            "key": k,
            "error": e.to_string(),
            "record_key_hex": to_hex(key),
        }),
    }
}

/// The JSON object of one record (`get --json`, `export --jsonl`): the fields of
/// [`RECORD_JSON_FIELDS`].
fn record_json(
    tenant: &str,
    op: &str,
    key: &str,
    record: &Record,
    now: Timestamp,
    with_body: bool,
) -> serde_json::Value {
    let mut line = serde_json::json!({"tenant": tenant, "op": op, "key": key});
    line["fingerprint"] = record.fingerprint.to_hex().into();
    line["created_at_ms"] = record.created_at.as_millis().into();
    line["expires_at_ms"] = record.expires_at.as_millis().into();
    line["forget_at_ms"] = record.forget_at.as_millis().into();
    line["expired"] = idem::rules::is_expired(record, now).into();
    let (state, response) = match &record.state {
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            line["lease_deadline_ms"] = lease_deadline.as_millis().into();
            line["attempt"] = (*attempt).into();
            ("pending", None)
        }
        State::Completed(r) => ("completed", Some(r)),
        State::Failed(r) => ("failed", Some(r)),
        State::Tombstone(t) => {
            line["status"] = t.status().into();
            if let Some(res) = t.resource() {
                line["resource"] = serde_json::json!([res.kind, res.id]);
            }
            ("tombstone", None)
        }
    };
    line["state"] = state.into();
    if let Some(r) = response {
        line["status"] = r.status().into();
        line["body_bytes"] = answer_body_len(r.body()).into();
        line["stored_bytes"] = r.body().len().into();
        if let Some(res) = r.resource() {
            line["resource"] = serde_json::json!([res.kind, res.id]);
        }
        if with_body {
            line["body"] = String::from_utf8_lossy(r.body()).into_owned().into();
            match HttpEnvelope::decode(r.body()) {
                Ok(None) => {}
                Ok(Some(env)) => line["http"] = envelope_json(&env),
                Err(e) => line["http_error"] = e.to_string().into(),
            }
        }
    }
    line
}

/// The `http` object of a record whose body is an answer the HTTP layer stored.
/// The length of the answer's body: for an answer the HTTP layer stored, its HTTP body (not
/// the envelope around it, with the status and headers to replay); otherwise what is stored.
fn answer_body_len(stored: &[u8]) -> usize {
    match HttpEnvelope::decode(stored) {
        Ok(Some(env)) => env.body().len(),
        _ => stored.len(),
    }
}

fn envelope_json(env: &HttpEnvelope<'_>) -> serde_json::Value {
    let headers: Vec<_> = env
        .headers()
        .iter()
        .map(|(n, v)| serde_json::json!([String::from_utf8_lossy(n), String::from_utf8_lossy(v)]))
        .collect();
    let mut http = serde_json::json!({
        "envelope": env.magic(),
        "body_omitted": env.body_omitted(),
        "headers": headers,
    });
    if !env.body_omitted() {
        match std::str::from_utf8(env.body()) {
            Ok(text) => http["body"] = text.into(),
            Err(_) => http["body_hex"] = to_hex(env.body()).into(),
        }
    }
    http
}

fn print_record<W: Write>(
    o: &mut Out<W>,
    r: &Record,
    now: Timestamp,
    with_body: bool,
) -> Result<(), Failure> {
    let state = match &r.state {
        State::Pending { .. } => "pending",
        State::Completed(_) => "completed",
        State::Failed(_) => "failed",
        State::Tombstone(_) => "tombstone",
    };
    out!(o, "state        {state}");
    out!(o, "fingerprint  {}", r.fingerprint.to_hex());
    out!(o, "created_at   {}", when(r.created_at, now));
    out!(o, "expires_at   {}", when(r.expires_at, now));
    out!(o, "forget_at    {}", when(r.forget_at, now));
    match &r.state {
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            out!(o, "lease_until  {}", when(*lease_deadline, now));
            out!(o, "attempt      {attempt}");
        }
        State::Completed(resp) | State::Failed(resp) => {
            out!(o, "status       {}", resp.status());
            out!(o, "body_bytes   {}", answer_body_len(resp.body()));
            out!(o, "stored_bytes {}", resp.body().len());
            if let Some(res) = resp.resource() {
                out!(o, "resource     {} {}", res.kind, res.id);
            }
            if with_body {
                print_body(o, resp.body())?;
            }
        }
        State::Tombstone(t) => {
            out!(o, "status       {}", t.status());
            if let Some(res) = t.resource() {
                out!(o, "resource     {} {}", res.kind, res.id);
            }
        }
    }
    Ok(())
}

/// `body` of `get --body`: a body that is not an answer of the HTTP layer as it is stored
/// (lossy UTF-8); an answer of the HTTP layer (an `IDH1`/`IDH2` envelope) decoded: its header
/// lines, then its body as text when it is valid UTF-8, else in hex; a damaged envelope said
/// so, and its bytes in hex.
fn print_body<W: Write>(o: &mut Out<W>, stored: &[u8]) -> Result<(), Failure> {
    let env = match HttpEnvelope::decode(stored) {
        Ok(Some(env)) => env,
        Ok(None) => {
            out!(o, "body         {}", String::from_utf8_lossy(stored));
            return Ok(());
        }
        Err(e) => {
            out!(
                o,
                "envelope     DAMAGED: {e}; the HTTP layer answers a retry of this key 500 \
                 (`idem purge` frees the key: a retry then runs again)"
            );
            out!(o, "body_hex     {}", to_hex(stored));
            return Ok(());
        }
    };
    out!(
        o,
        "envelope     {} (an answer the HTTP layer stored)",
        env.magic()
    );
    for (name, value) in env.headers() {
        out!(o, "header       {}: {}", one_line(name), one_line(value));
    }
    if env.body_omitted() {
        out!(
            o,
            "body         (not kept: the answer was over the store's max_response_bytes; a retry \
             gets these headers, an empty body and Idempotent-Body-Omitted: true)"
        );
    } else {
        match std::str::from_utf8(env.body()) {
            Ok(text) => out!(o, "body         {text}"),
            Err(_) => out!(o, "body_hex     {}", to_hex(env.body())),
        }
    }
    Ok(())
}

/// Stored bytes as one line of text: lossy UTF-8, control characters escaped (a header line
/// of a damaged or foreign envelope must not break the output into lines).
fn one_line(b: &[u8]) -> String {
    let mut line = String::new();
    for c in String::from_utf8_lossy(b).chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// `2026-11-30T14:45:00.123Z (in 23h59m)`: the time in RFC 3339, UTC, with milliseconds, and
/// how far it is from now. A time past what a date shows (after the year 9999: only a damaged
/// or foreign record holds one) is printed as its milliseconds.
fn when(t: Timestamp, now: Timestamp) -> String {
    use std::fmt::Write as _;
    let ms = t.as_millis();
    let rel = if ms >= now.as_millis() {
        format!("in {}", span(ms - now.as_millis()))
    } else {
        format!("{} ago", span(now.as_millis() - ms))
    };
    let Some(date) = i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
    else {
        return format!("{ms} ms after the Unix epoch, past the year 9999 ({rel})");
    };
    let mut text = String::new();
    // Writing into a String fails only if the Display impl does: then the milliseconds.
    if write!(text, "{date:.3} ({rel})").is_err() {
        return format!("{ms} ms after the Unix epoch ({rel})");
    }
    text
}

/// A span of `ms` milliseconds to its two largest units, truncated, days of 24 hours: `45s`,
/// `59m59s`, `23h59m`, `400d3h`.
fn span(ms: u64) -> String {
    use jiff::fmt::friendly::{Designator, Spacing, SpanPrinter};
    use jiff::{RoundMode, Span, SpanRound, Unit};
    const PRINTER: SpanPrinter = SpanPrinter::new()
        .designator(Designator::Compact)
        .spacing(Spacing::None);
    let smallest = match ms / 1000 {
        0..3600 => Unit::Second,
        3600..86_400 => Unit::Minute,
        _ => Unit::Hour,
    };
    let round = SpanRound::new()
        .largest(Unit::Day)
        .smallest(smallest)
        .mode(RoundMode::Trunc)
        .days_are_24_hours();
    let rounded = i64::try_from(ms)
        .ok()
        .and_then(|ms| Span::new().try_milliseconds(ms).ok())
        .and_then(|span| span.round(round).ok());
    match rounded {
        Some(span) => PRINTER.span_to_string(&span),
        // Over about 20 000 years: only between a damaged time and now.
        None => format!("{}d", ms / 86_400_000),
    }
}
