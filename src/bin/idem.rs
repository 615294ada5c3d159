//! `idem`: the operator's view of a store file (feature `cli`).
//!
//! ```text
//! cargo run --features cli --bin idem -- [--file PATH] stats
//! cargo run --features cli --bin idem -- get --tenant T --op O --key K [--body]
//! cargo run --features cli --bin idem -- purge --tenant T --op O --key K
//! cargo run --features cli --bin idem -- sweep
//! cargo run --features cli --bin idem -- compact
//! cargo run --features cli --bin idem -- check
//! cargo run --features cli --bin idem -- export --jsonl [--body]
//! cargo run --features cli --bin idem -- outbox list [--limit N] [--body]
//! cargo run --features cli --bin idem -- outbox requeue SEQ
//! cargo run --features cli --bin idem -- outbox discard SEQ
//! ```
//!
//! Every command goes through the public `Store` API. redb locks the file for one process at a
//! time: on a file a running service holds open, the command fails and says so (stop the
//! service, or run both with `--multi-process` / `StoreBuilder::multi_process(true)`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem::redb::{ReadableTable, TableDefinition};
use idem::{DeadLetter, Record, Scope, State, Store, Timestamp};

/// idem's record table (docs/FORMAT.md, "Tables"), read-only here: record key → record.
const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");

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
    /// the file size.
    Stats,
    /// One record: state, fingerprint, timestamps, response summary (no body unless --body).
    Get {
        #[command(flatten)]
        id: KeyArgs,
        /// Also print the stored response body (may contain customer data).
        #[arg(long)]
        body: bool,
    },
    /// Removes one record: the key becomes free and a retry of the intent RUNS AGAIN.
    Purge {
        #[command(flatten)]
        id: KeyArgs,
    },
    /// One sweep pass: shrinks records past their response window, deletes those past their
    /// horizon.
    Sweep,
    /// Gives free space back to the file system (sweep first; needs the file to itself).
    Compact,
    /// Runs redb's full integrity check, decodes every record and checks the expiry index
    /// against the records; exits non-zero on any problem. Works on a copy of the file (next
    /// to it, removed afterwards) unless `--in-place`: a failed check of a damaged file leaves
    /// that file marked for repair, unable to open again.
    Check {
        /// Check (and let redb repair) the file itself instead of a copy.
        #[arg(long)]
        in_place: bool,
    },
    /// Every record as one JSON object per line (no bodies unless --body).
    Export {
        /// JSON Lines on stdout (the only format).
        #[arg(long, required = true)]
        jsonl: bool,
        /// Include response bodies (lossy UTF-8; may contain customer data).
        #[arg(long)]
        body: bool,
    },
    /// The outbox's dead letters: events whose publishing failed its last allowed attempt.
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Dead letters, oldest first: seq, id, topic, ordering key, attempts, last error (no
    /// payload unless --body).
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
    },
    /// Deletes dead letter SEQ for good: it is NEVER published, and later events with its
    /// ordering key are no longer held back.
    Discard {
        /// The dead letter's sequence number (`idem outbox list`).
        seq: u64,
    },
}

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("idem: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// Copies the store file next to itself for `idem check`, without writing to it: a read-only
/// open holds redb's shared lock meanwhile (refused while another process has the file open
/// for writing), and a file that needs recovery (it was not closed cleanly, which a read-only
/// open cannot do) is copied as it is, so the recovery runs on the copy.
fn copy_for_check(cli: &Cli) -> Result<Removed, String> {
    use std::io::Write;
    if !cli.file.is_file() {
        return Err(format!(
            "{}: no such store file (pass --file PATH)",
            cli.file.display()
        ));
    }
    let lock = match idem::redb::ReadOnlyDatabase::open(&cli.file) {
        Ok(db) => Some(db),
        Err(idem::redb::DatabaseError::DatabaseAlreadyOpen) => {
            return Err(format!(
                "{}: another process has this file open for writing: stop it first, or pass \
                 --in-place together with --multi-process",
                cli.file.display()
            ));
        }
        Err(_) => None,
    };
    let path = cli
        .file
        .with_extension(format!("idem-check-{}.redb", std::process::id()));
    let cannot = |e: std::io::Error| {
        format!(
            "{}: cannot copy the file to check the copy ({e}); free some space, or pass --in-place",
            path.display()
        )
    };
    // create_new: never overwrite a file that happens to have that name.
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(cannot)?;
    let copy = Removed(path.clone());
    let mut from = std::fs::File::open(&cli.file).map_err(cannot)?;
    std::io::copy(&mut from, &mut out).map_err(cannot)?;
    out.flush().map_err(cannot)?;
    let note = match lock {
        Some(_) => "",
        None => " of a file that was not closed cleanly or does not open read-only",
    };
    println!(
        "checking    a copy{note} ({}); the file itself is not written",
        path.display()
    );
    Ok(copy)
}

/// A temporary file, removed when dropped (on every path out of the command).
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn open(cli: &Cli) -> Result<Store, String> {
    if !cli.file.is_file() {
        return Err(format!(
            "{}: no such store file (pass --file PATH)",
            cli.file.display()
        ));
    }
    Store::builder()
        .multi_process(cli.multi_process)
        .open(&cli.file)
        .map_err(|e| {
            let msg = e.to_string();
            if msg.contains("already open") || msg.contains("lock") {
                format!(
                    "{}: {msg}\n  another process holds this file (redb allows one process per file): \
                     stop it, or run both in multi-process mode (--multi-process here, \
                     StoreBuilder::multi_process(true) in the service)",
                    cli.file.display()
                )
            } else {
                format!("{}: {msg}", cli.file.display())
            }
        })
}

fn file_size(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(|e| format!("unknown ({e})"), |m| m.len().to_string())
}

fn run(cli: &Cli) -> Result<(), String> {
    match &cli.command {
        Command::Stats => {
            let store = open(cli)?;
            let s = store.stats().map_err(|e| e.to_string())?;
            println!("file        {}", cli.file.display());
            println!("file_bytes  {}", file_size(&cli.file));
            println!("records     {}", s.records);
            println!("pending     {}", s.pending);
            println!("completed   {}", s.completed);
            println!("failed      {}", s.failed);
            println!("tombstones  {}", s.tombstones);
            println!("due         {}", s.due);
            let o = store.outbox_stats().map_err(|e| e.to_string())?;
            println!("outbox_pending {}", o.pending);
            println!("dead_letters   {}", o.dead);
        }
        Command::Get { id, body } => {
            let store = open(cli)?;
            let scope = Scope::new(&id.tenant, &id.op);
            match store.get(&scope, &id.key).map_err(|e| e.to_string())? {
                None => {
                    println!("absent");
                    return Err(format!(
                        "no record for tenant {:?}, op {:?}, key {:?}",
                        id.tenant, id.op, id.key
                    ));
                }
                Some(r) => print_record(&r, store.now(), *body),
            }
        }
        Command::Purge { id } => {
            let store = open(cli)?;
            let scope = Scope::new(&id.tenant, &id.op);
            let existed = store.purge(&scope, &id.key).map_err(|e| e.to_string())?;
            println!("{}", if existed { "purged" } else { "absent" });
        }
        Command::Sweep => {
            let store = open(cli)?;
            // Progress on stderr, once per second on a long pass (stdout stays the summary).
            let mut last = std::time::Instant::now();
            let r = store
                .sweep_with_progress(|so_far| {
                    if last.elapsed() >= std::time::Duration::from_secs(1) {
                        last = std::time::Instant::now();
                        eprintln!(
                            "sweeping: {} deleted, {} tombstoned, {} batches, {} ms",
                            so_far.deleted,
                            so_far.tombstoned,
                            so_far.batches,
                            so_far.duration.as_millis()
                        );
                    }
                })
                .map_err(|e| e.to_string())?;
            let m = store.metrics();
            println!("deleted     {}", r.deleted);
            println!("tombstoned  {}", r.tombstoned);
            println!("repaired    {}", r.repaired);
            println!("batches     {}", r.batches);
            println!("duration_ms {}", r.duration.as_millis());
            println!("commits     {}", m.commits);
        }
        Command::Compact => {
            let before = file_size(&cli.file);
            let mut store = open(cli)?;
            let moved = store.compact().map_err(|e| e.to_string())?;
            drop(store);
            println!("compacted   {moved}");
            println!("bytes_before {before}");
            println!("bytes_after  {}", file_size(&cli.file));
        }
        Command::Check { in_place } => {
            // Declared first so that it outlives the store opened on it.
            let mut copy: Option<Removed> = None;
            let mut store = if *in_place {
                open(cli)?
            } else {
                let path = copy_for_check(cli)?;
                let path = &copy.insert(path).0;
                match Store::builder().open(path) {
                    Ok(store) => store,
                    Err(e) => {
                        println!("file_integrity FAILED");
                        println!("  {}: {e}", cli.file.display());
                        return Err(
                            "the file does not open as a store (above): restore it from a backup"
                                .into(),
                        );
                    }
                }
            };
            // redb's full integrity check first (it needs the only handle, which this is).
            let integrity = store.check_integrity();
            println!(
                "file_integrity {}",
                match &integrity {
                    Ok(true) => "ok",
                    Ok(false) => "REPAIRED",
                    Err(_) => "FAILED",
                }
            );
            if let Err(e) = &integrity {
                println!("  {e}");
            }
            let mut ok = 0u64;
            let mut bad = Vec::new();
            for_each_record(&store, |key, value| {
                match (split_key(key), Record::decode(value)) {
                    (Some(_), Ok(_)) => ok += 1,
                    (_, Err(e)) => bad.push(format!("{}: {e}", hex(key))),
                    (None, Ok(_)) => bad.push(format!("{}: malformed record key", hex(key))),
                }
            })?;
            println!("records_ok   {ok}");
            println!("records_bad  {}", bad.len());
            for b in bad.iter().take(20) {
                println!("  {b}");
            }
            let index = store.check_expiry_index();
            println!(
                "expiry_index {}",
                index.as_ref().map_or("MISMATCH", |()| "ok")
            );
            if let Err(detail) = &index {
                println!("  {detail}");
            }
            if !bad.is_empty() || index.is_err() || !matches!(integrity, Ok(true)) {
                return Err(
                    "the store has problems (above): `idem get` / `idem purge` the keys, \
                     or restore the file"
                        .into(),
                );
            }
        }
        Command::Export { jsonl: _, body } => {
            let store = open(cli)?;
            let now = store.now();
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let mut failed = None;
            for_each_record(&store, |key, value| {
                if failed.is_some() {
                    return;
                }
                let line = export_line(key, value, now, *body);
                if let Err(e) = writeln!(out, "{line}") {
                    failed = Some(e.to_string());
                }
            })?;
            out.flush().map_err(|e| e.to_string())?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Command::Outbox { command } => {
            let store = open(cli)?;
            outbox(&store, command)?;
        }
    }
    Ok(())
}

fn outbox(store: &Store, command: &OutboxCommand) -> Result<(), String> {
    let no_such =
        |seq: u64| format!("no dead letter with seq {seq} (`idem outbox list` shows them)");
    match command {
        OutboxCommand::List { limit, body } => {
            let stats = store.outbox_stats().map_err(|e| e.to_string())?;
            let dead = store.dead_letters(*limit).map_err(|e| e.to_string())?;
            println!("dead_letters {}", stats.dead);
            let now = store.now();
            for d in &dead {
                println!();
                print_dead_letter(d, now, *body);
            }
            if (dead.len() as u64) < stats.dead {
                println!();
                println!("(first {} shown; pass --limit N for more)", dead.len());
            }
        }
        OutboxCommand::Requeue { seq } => {
            if !store.requeue_dead_letter(*seq).map_err(|e| e.to_string())? {
                println!("absent");
                return Err(no_such(*seq));
            }
            println!("requeued");
        }
        OutboxCommand::Discard { seq } => {
            if !store.discard_dead_letter(*seq).map_err(|e| e.to_string())? {
                println!("absent");
                return Err(no_such(*seq));
            }
            println!("discarded");
        }
    }
    Ok(())
}

fn print_dead_letter(d: &DeadLetter, now: Timestamp, with_body: bool) {
    let e = &d.event;
    println!("seq          {}", e.seq);
    println!("id           {}", e.id);
    println!("topic        {}", e.topic);
    println!("ordering_key {}", e.ordering_key.as_deref().unwrap_or("-"));
    println!("attempts     {}", e.failed_attempts);
    println!("created_at   {}", when(e.created_at, now));
    println!("failed_at    {}", when(d.failed_at, now));
    println!("error        {}", d.error.replace('\n', " "));
    println!("payload_bytes {}", e.payload.len());
    println!("headers      {}", e.headers.len());
    if with_body {
        for (name, value) in &e.headers {
            println!("header       {name}: {value}");
        }
        println!("payload      {}", String::from_utf8_lossy(&e.payload));
    }
}

fn for_each_record(store: &Store, mut f: impl FnMut(&[u8], &[u8])) -> Result<(), String> {
    let read = store.begin_read().map_err(|e| e.to_string())?;
    let table = match read.open_table(RECORDS) {
        Ok(t) => t,
        Err(idem::redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    };
    for row in table.iter().map_err(|e| e.to_string())? {
        let (k, v) = row.map_err(|e| e.to_string())?;
        f(k.value(), v.value());
    }
    Ok(())
}

/// The record key (docs/FORMAT.md, "Record key"): `0x01 ‖ u16be len ‖ tenant ‖ u16be len ‖
/// operation ‖ u16be len ‖ key`.
fn split_key(k: &[u8]) -> Option<(String, String, String)> {
    let mut rest = k.strip_prefix(&[1u8])?;
    let mut part = || -> Option<String> {
        let len = usize::from(u16::from_be_bytes([*rest.first()?, *rest.get(1)?]));
        let bytes = rest.get(2..2 + len)?;
        rest = rest.get(2 + len..)?;
        Some(String::from_utf8_lossy(bytes).into_owned())
    };
    let parts = (part()?, part()?, part()?);
    rest.is_empty().then_some(parts)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn export_line(key: &[u8], value: &[u8], now: Timestamp, with_body: bool) -> serde_json::Value {
    let (tenant, op, k) = split_key(key).unwrap_or_default();
    let mut line = serde_json::json!({"tenant": tenant, "op": op, "key": k});
    let record = match Record::decode(value) {
        Ok(r) => r,
        Err(e) => {
            line["error"] = e.to_string().into();
            line["record_key_hex"] = hex(key).into();
            return line;
        }
    };
    line["fingerprint"] = record.fingerprint.to_hex().into();
    line["created_at_ms"] = record.created_at.as_millis().into();
    line["expires_at_ms"] = record.expires_at.as_millis().into();
    line["forget_at_ms"] = record.forget_at.as_millis().into();
    line["expired"] = (record.expires_at <= now).into();
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
        line["body_bytes"] = r.body().len().into();
        if let Some(res) = r.resource() {
            line["resource"] = serde_json::json!([res.kind, res.id]);
        }
        if with_body {
            line["body"] = String::from_utf8_lossy(r.body()).into_owned().into();
        }
    }
    line
}

fn print_record(r: &Record, now: Timestamp, with_body: bool) {
    let state = match &r.state {
        State::Pending { .. } => "pending",
        State::Completed(_) => "completed",
        State::Failed(_) => "failed",
        State::Tombstone(_) => "tombstone",
    };
    println!("state        {state}");
    println!("fingerprint  {}", r.fingerprint.to_hex());
    println!("created_at   {}", when(r.created_at, now));
    println!("expires_at   {}", when(r.expires_at, now));
    println!("forget_at    {}", when(r.forget_at, now));
    match &r.state {
        State::Pending {
            lease_deadline,
            attempt,
            ..
        } => {
            println!("lease_until  {}", when(*lease_deadline, now));
            println!("attempt      {attempt}");
        }
        State::Completed(resp) | State::Failed(resp) => {
            println!("status       {}", resp.status());
            println!("body_bytes   {}", resp.body().len());
            if let Some(res) = resp.resource() {
                println!("resource     {} {}", res.kind, res.id);
            }
            if with_body {
                println!("body         {}", String::from_utf8_lossy(resp.body()));
            }
        }
        State::Tombstone(t) => {
            println!("status       {}", t.status());
            if let Some(res) = t.resource() {
                println!("resource     {} {}", res.kind, res.id);
            }
        }
    }
}

/// `2026-11-30T14:45:00.123Z (in 23h59m)` from milliseconds since the Unix epoch.
fn when(t: Timestamp, now: Timestamp) -> String {
    let ms = t.as_millis();
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil(days);
    let rel = if ms >= now.as_millis() {
        format!("in {}", span(ms - now.as_millis()))
    } else {
        format!("{} ago", span(now.as_millis() - ms))
    };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z ({rel})",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}
