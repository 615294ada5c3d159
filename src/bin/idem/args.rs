//! The command line: clap's types for every command and its options, and the `--help` texts
//! that list the fields of `--json` output.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Inspect and maintain an idem store file.
#[derive(Parser)]
#[command(name = "idem", version, about)]
pub(crate) struct Cli {
    /// The store file.
    #[arg(long, global = true, default_value = "data/idem.redb")]
    pub(crate) file: PathBuf,
    /// Open in redb's multi-process mode (the service must use it too).
    #[arg(long, global = true)]
    pub(crate) multi_process: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
pub(crate) struct PgArgs {
    /// The database (postgresql://user@host:port/db).
    #[arg(long)]
    pub(crate) url: String,
    /// The PostgreSQL schema of idem's tables.
    #[arg(long, default_value = "idem")]
    pub(crate) schema: String,
}

#[cfg(feature = "postgres")]
#[derive(Subcommand)]
pub(crate) enum PgCommand {
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
pub(crate) const PG_STATS_JSON_FIELDS: &str = "\
JSON (--json): one object on stdout with the fields of `idem stats --json`, except that `file` \
and `file_bytes` are replaced by `schema` (the PostgreSQL schema).";

#[derive(Subcommand)]
pub(crate) enum OutboxCommand {
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
pub(crate) const STATS_JSON_FIELDS: &str = "\
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
pub(crate) const RECORD_JSON_FIELDS: &str = "\
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
pub(crate) struct KeyArgs {
    /// The tenant of the scope.
    #[arg(long)]
    pub(crate) tenant: String,
    /// The operation of the scope (the HTTP layer's default is "METHOD /route/{template}").
    #[arg(long)]
    pub(crate) op: String,
    /// The idempotency key.
    #[arg(long)]
    pub(crate) key: String,
}

impl KeyArgs {
    /// The message of an absent key, then `what` (what the command did not do).
    pub(crate) fn absent(&self, what: &str) -> String {
        format!(
            "no record for tenant {:?}, op {:?}, key {:?}{what} (check the three against \
             `idem export --jsonl`; the HTTP layer's operation is \"METHOD /route/{{template}}\")",
            self.tenant, self.op, self.key
        )
    }
}

/// The options of the commands that write to the file.
#[derive(clap::Args)]
pub(crate) struct WriteArgs {
    /// Skip the check of a copy of the file (redb's integrity check and idem's own, of records
    /// and expiry index) that comes first by default. The open for writing still checks every
    /// page's checksum, and refuses a file whose pages fail it.
    #[arg(long)]
    pub(crate) force: bool,
}
