//! Typed errors. Every message says what went wrong and what the caller should do next.

use std::error::Error as StdError;
use std::sync::Arc;

/// A boxed error from the caller's own code, carried through [`Error::Aborted`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// An error of the storage engine under the store, kept whole: its message, its `source()`
/// chain, and the engine's own error value (a `redb::Error` for a file store), reachable with
/// [`downcast_ref`](Self::downcast_ref). Cheap to clone: the callers of one failed batch share it.
///
/// It is a transparent carrier: its message is the engine error's, and its
/// [`source`](StdError::source) is the engine error's source, so an error-chain walk sees the
/// engine error's text but not its type; use `downcast_ref` to match on it.
#[derive(Debug, Clone)]
pub struct StorageError(Arc<dyn StdError + Send + Sync + 'static>);

impl StorageError {
    /// Wraps a storage engine's error.
    pub fn new(error: impl StdError + Send + Sync + 'static) -> Self {
        StorageError(Arc::new(error))
    }

    /// The engine's error, if it is a `T` (e.g. `redb::Error`).
    pub fn downcast_ref<T: StdError + 'static>(&self) -> Option<&T> {
        self.0.downcast_ref::<T>()
    }
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The engine's message exactly: this type only carries it.
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for StorageError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// Which part of a scoped key a validation error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// The tenant half of a [`crate::Scope`].
    Tenant,
    /// The operation half of a [`crate::Scope`].
    Operation,
    /// The idempotency key itself.
    Key,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::Tenant => "tenant",
            Field::Operation => "operation",
            Field::Key => "idempotency key",
        })
    }
}

/// Everything that can go wrong in `idem`, by what the caller does about it. Every variant is in
/// this table ([`Error::is_retryable`] answers the last column in code); its own doc and message
/// say more.
///
/// | variant | what happened | what to do | retry helps |
/// |---|---|---|---|
/// | [`Empty`](Error::Empty), [`TooLong`](Error::TooLong) | a tenant, operation or key is empty or too long | fix the caller | no |
/// | [`PayloadMismatch`](Error::PayloadMismatch) | the key was first used with another request | a new intent needs a new key | no |
/// | [`ResponseTooLarge`](Error::ResponseTooLarge) | the answer is over the stored-answer cap | store a pointer to the resource instead | no |
/// | [`Fingerprint`](Error::Fingerprint) | a fingerprint given by hand is malformed | fix the caller | no |
/// | [`AnswerEncoding`](Error::AnswerEncoding) | a typed answer could not be encoded | use a type postcard encodes | no |
/// | [`ReservedTable`](Error::ReservedTable) | the closure opened one of idem's own tables | rename the table | no |
/// | [`Reentrant`](Error::Reentrant) | a store write from inside that store's closure | use the `Tx`, or call after the closure | no |
/// | [`LeaseLost`](Error::LeaseLost) | the lease lapsed and another attempt took the key | stop: the other attempt finishes | no |
/// | [`Aborted`](Error::Aborted) | the closure returned a retryable error; nothing was written | retry the same request | yes |
/// | [`Busy`](Error::Busy) | the write queue stayed full | retry later (HTTP 503) | yes |
/// | [`OutcomeUnknown`](Error::OutcomeUnknown) | a commit failed; it may have landed | retry with the same key (a file store: after a reopen) | yes |
/// | [`FailStopped`](Error::FailStopped) | an earlier I/O failure stopped all writes | check the disk, reopen the store, then retry | yes |
/// | [`Storage`](Error::Storage) | the storage engine failed (I/O, PostgreSQL) | see its source; retry if it was transient | yes |
/// | [`Spawn`](Error::Spawn) | the OS refused a background thread | free resources, retry | yes |
/// | [`Random`](Error::Random) | the OS random source failed | check the platform | no |
/// | [`AlreadyOpen`](Error::AlreadyOpen) | the file is open elsewhere | drop the other `Store` or stop the other process | no |
/// | [`InUse`](Error::InUse) | `compact`, `check_integrity` or a dispatcher needs the store to itself | drop the other handles | no |
/// | [`Config`](Error::Config) | an invalid setting | fix the builder call | no |
/// | [`CorruptRecord`](Error::CorruptRecord) | one stored record cannot be decoded | inspect or purge that key | no |
/// | [`CorruptStore`](Error::CorruptStore) | the file is damaged or not an idem store | `idem check`; docs/OPERATIONS.md | no |
/// | [`ExpiryIndexMismatch`](Error::ExpiryIndexMismatch) | `check_integrity`: the expiry index disagrees with the records | `sweep`; answers are unaffected | no |
/// | [`UnsupportedFormat`](Error::UnsupportedFormat) | a record from a newer idem | open with that release | no |
/// | [`UnsupportedJournal`](Error::UnsupportedJournal) | a journal from another idem build | open with that release and close cleanly | no |
/// | [`NeedsRecovery`](Error::NeedsRecovery) | a read-only open of a file that needs crash recovery | open it for writing once, or `idem recover` | no |
/// | [`JournalNeedsReplay`](Error::JournalNeedsReplay) | a `multi_process` open found a journal holding answers the file lacks | open once without `multi_process`, or `idem recover` | no |
/// | [`RepairAborted`](Error::RepairAborted) | the `on_repair` callback abandoned the repair | open again without aborting | no |
/// | [`Internal`](Error::Internal) | a broken invariant: a bug in idem | report it | no |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A tenant, operation or key was empty.
    #[error("the {field} is empty: every request needs a non-empty tenant, operation and key")]
    Empty {
        /// Which field was empty.
        field: Field,
    },

    /// A tenant, operation or key exceeded its configured limit.
    #[error(
        "the {field} is {len} bytes, over the limit of {max}: shorten it, or raise the limit with the store builder"
    )]
    TooLong {
        /// Which field was too long.
        field: Field,
        /// Its length in bytes.
        len: usize,
        /// The configured maximum.
        max: usize,
    },

    /// The key was already used with a different request payload. Nothing was changed.
    #[error(
        "idempotency key {key:?} (tenant {tenant:?}, operation {operation:?}) was already used with a different request payload: use a new key for a new intent, or resend the original payload"
    )]
    PayloadMismatch {
        /// Tenant of the request.
        tenant: String,
        /// Operation of the request.
        operation: String,
        /// The key, lossily decoded as UTF-8 for display.
        key: String,
    },

    /// A lease call (complete, fail, heartbeat) was rejected: the lease expired and another
    /// attempt took the key over, or the key was released or purged, or a retry of the same
    /// [`crate::Claim`] took the lease back. Nothing was changed.
    #[error(
        "the lease on idempotency key {key:?} was lost (it expired and another attempt took over, or it was released): stop this attempt; its result must not be recorded"
    )]
    LeaseLost {
        /// The key, lossily decoded as UTF-8 for display.
        key: String,
    },

    /// A response (body plus resource pointer) exceeded the configured cap. Nothing was written.
    #[error(
        "the response is {len} bytes, over the cap of {max}: store a smaller canonical body or a resource pointer, or raise the cap with the store builder"
    )]
    ResponseTooLarge {
        /// Encoded size of the response.
        len: usize,
        /// The configured cap.
        max: usize,
    },

    /// The request payload could not be serialized for fingerprinting.
    #[error(
        "the request payload could not be serialized for its fingerprint ({source}): fingerprint canonical bytes with Request::from_canonical_bytes instead"
    )]
    Fingerprint {
        /// The serializer's error.
        source: postcard::Error,
    },

    /// A typed closure's answer (`execute_typed`) could not be encoded for storage. Nothing was
    /// written (the closure's writes were rolled back) and the key stays free.
    #[error(
        "the closure's answer could not be encoded for storage ({source}): give execute_typed a type serde can encode without self-describing formats (postcard), or return a Response from execute"
    )]
    AnswerEncoding {
        /// The serializer's error.
        source: postcard::Error,
    },

    /// The caller's closure returned a retryable error. Nothing was written (the caller's
    /// writes were rolled back with the record) and the key stays free: retry the request.
    #[error("the operation was aborted with a retryable error and nothing was recorded: {source}")]
    Aborted {
        /// The caller's error.
        source: BoxError,
    },

    /// The caller tried to open one of the crate's own tables through the transaction handle.
    #[error(
        "table {name:?} uses the reserved prefix \"{prefix}\": idem's own tables cannot be opened through the transaction handle; rename your table"
    )]
    ReservedTable {
        /// The table name that was refused.
        name: String,
        /// The reserved prefix.
        prefix: &'static str,
    },

    /// A stored record could not be decoded. The record is left untouched.
    #[error(
        "the stored record for this key is corrupt ({reason}): the file was damaged or written by other software; inspect it (Store::get), remove it with Store::purge, or restore the file from a backup (every intent completed after the backup was taken would run again)"
    )]
    CorruptRecord {
        /// What was wrong with it.
        reason: String,
    },

    /// A stored record has a format version this build does not know.
    #[error(
        "the stored record has format version {found}, but this build reads version {supported}: open the file with the newer idem release that wrote it"
    )]
    UnsupportedFormat {
        /// The version byte found.
        found: u8,
        /// The version this build supports.
        supported: u8,
    },

    /// The store's journal (or its checkpoint row) was written by an idem build of another
    /// journal format version.
    #[error(
        "the store's journal has format version {found}, but this build reads version {supported}: open the store with the idem release that wrote it, and close it cleanly there (the journal is then empty)"
    )]
    UnsupportedJournal {
        /// The version byte found.
        found: u8,
        /// The version this build reads.
        supported: u8,
    },

    /// The file is not an idem store, or it is damaged: beyond what redb's recovery repairs
    /// (opening it), or redb panicked on a damaged page (any call; a bug in redb or idem looks
    /// the same, and the reason says so), or its idem tables disagree (an integrity check).
    /// Retrying never helps. A damage found inside a write fail-stops the store.
    ///
    /// Restoring an older copy of the file is no neutral remedy for an idempotency store: every
    /// key completed after that copy was taken is free again, so a retry of its intent runs
    /// again. The message says so.
    #[error(
        "the store file is damaged or is not an idem store ({reason}): stop writing to it and keep a copy, and run `idem check` (it checks a copy). If it finds damage, move the file away and open a new one at that path, or restore a backup (every intent completed after the backup was taken would run again); if it finds none, this is a bug in idem or redb: report it"
    )]
    CorruptStore {
        /// What was wrong with it.
        reason: String,
    },

    /// [`crate::Store::check_integrity`]: redb's pages passed its integrity check (or redb
    /// repaired them: `repaired`), but idem's expiry index disagrees with the records (an entry
    /// without its record, at another instant, or missing). No answer depends on the index
    /// (decisions read the records), only the sweep does; the store is not fail-stopped.
    #[error(
        "idem's expiry index does not match the records ({reason}); redb's pages are intact and every answer still comes from the records: a sweep (Store::sweep, `idem sweep`) removes entries without a record and moves misplaced ones once they are due, and a record left without an entry is never swept (purge it, or it gets one when it is written again)"
    )]
    ExpiryIndexMismatch {
        /// The first mismatches.
        reason: String,
        /// redb found damage in its pages and repaired it before the index was checked (what
        /// `check_integrity` would otherwise have answered with `Ok(false)`).
        repaired: bool,
    },

    /// A read-only open ([`crate::StoreBuilder::open_read_only`]) found a file that was not
    /// closed cleanly (the process that had it open for writing crashed, or still runs in
    /// multi-process mode without having committed its allocator state). redb must recover such
    /// a file, which writes to it, and a read-only open never writes. Nothing was done.
    #[error(
        "the store file was not closed cleanly (the process that last had it open for writing died, or one of its writes failed part-way: a commit or a compaction on a full or failing disk) and needs crash recovery, which a read-only open never does: open it for writing once (start the service, or run `idem recover`), or run `idem check` (it recovers and checks a copy, leaving the file as it is)"
    )]
    NeedsRecovery,

    /// A [`multi_process`](crate::StoreBuilder::multi_process) open found the store's journal
    /// (journal mode, the default for one process) holding answers the store file does not
    /// have yet: the process that wrote it crashed, or still has the store open. A journal
    /// belongs to one process, so a multi-process open never replays it. Nothing was done.
    #[error(
        "the store's journal (the file named <store>.journal beside it) holds answers the store file does not have yet: a process that opened the store in journal mode (the default for one process) crashed or still has it open, and a multi_process open never replays a journal; stop that process, open the store once without multi_process (Store::open, or `idem recover`), which replays the journal and closes it cleanly, then open it with multi_process"
    )]
    JournalNeedsReplay,

    /// The file was not closed cleanly and the caller's
    /// [`StoreBuilder::on_repair`](crate::StoreBuilder::on_repair) callback abandoned its
    /// repair. None of the repair was written: the file holds the same commits and still needs
    /// the repair, which the next open for writing makes (without a callback that aborts it).
    #[error(
        "the store file was not closed cleanly and its repair was abandoned by the on_repair callback: none of it was written; open it again to repair it (a multi-GB file takes seconds to tens of seconds; StoreBuilder::quick_repair avoids the repair after future crashes)"
    )]
    RepairAborted,

    /// The store's configuration is invalid.
    #[error("invalid store configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },

    /// A commit failed. Whether it landed is unknown. Retry with the same key: the retry
    /// replays if the commit did land, and runs once if it did not. A flow-B `begin` whose
    /// claim landed leaves the key Pending under a token no lease holds: retry it with the same
    /// [`crate::Claim`] (`begin_claim`), which takes that lease at once (a plain `begin` waits
    /// for it to lapse). A file store is now fail-stopped (reopen it first); a PostgreSQL store
    /// reconnects by itself.
    #[error(
        "the commit failed and its outcome is unknown ({source}): retry with the same key, which replays if the commit landed (a begin: retry with the same Claim through begin_claim, which takes the lease at once if the claim landed). A file store has stopped accepting writes: drop every clone of the Store and every Lease and reopen the file first; a PostgreSQL store reconnects by itself"
    )]
    OutcomeUnknown {
        /// The storage engine's error (shared by every caller whose request was in the failed
        /// batch).
        source: StorageError,
    },

    /// The write queue stayed full for the configured wait: the store is overloaded. Nothing
    /// was done; retry later (HTTP 503).
    #[error(
        "the store is overloaded: {queued} requests were queued for the next commit and no room freed up within {waited:?}; retry later, or raise max_queue / queue_timeout"
    )]
    Busy {
        /// Requests queued when this one gave up.
        queued: usize,
        /// How long it waited for room.
        waited: std::time::Duration,
    },

    /// An internal invariant was broken: a bug in idem. Nothing was committed for this call.
    #[error("internal error in idem ({what}); please report it")]
    Internal {
        /// What went wrong.
        what: &'static str,
    },

    /// An earlier I/O failure latched the store; it refuses writes until reopened.
    #[error(
        "the store stopped accepting writes after an earlier I/O failure ({cause}): check the disk, drop every clone of the Store and every Lease, and reopen the file before retrying"
    )]
    FailStopped {
        /// The first failure, as text.
        cause: String,
    },

    /// The storage engine reported an error.
    #[error("storage error: {source}")]
    Storage {
        /// The storage engine's error (a `redb::Error` for a file store:
        /// [`StorageError::downcast_ref`]).
        source: StorageError,
    },

    /// A write call (execute, begin, a lease call) was made on a store from inside a closure
    /// that is running in that same store's write transaction. Nothing was done.
    #[error(
        "a store write was called from inside a closure running in the same store's write transaction, which would deadlock: do that work through the Tx handle, or after the closure returns"
    )]
    Reentrant,

    /// The store file is already open: by another `Store` of this process (every clone and
    /// every `Lease` keeps it open) or by another process. redb admits one open of a file at a
    /// time, unless every opener uses `StoreBuilder::multi_process(true)`. Nothing was done.
    #[error(
        "{what} is already open, by this process or another: a file admits one open store at a time. Drop the other Store (every clone and every Lease keeps it open) or stop the other process; processes that must share the file open it with StoreBuilder::multi_process(true)"
    )]
    AlreadyOpen {
        /// The file's path (or "the storage backend").
        what: String,
    },

    /// A call that needs something to itself found it in use. Nothing was done.
    /// [`crate::Store::compact`] and [`crate::Store::check_integrity`] need the only handle to
    /// the store (no other clone, no live lease, no read transaction);
    /// [`crate::Store::start_dispatcher`] needs to be the store's only outbox dispatcher.
    #[error("{}", in_use_message(operation, reason))]
    InUse {
        /// The call that was refused: `"compact"`, `"check_integrity"` or
        /// `"start_dispatcher"`.
        operation: &'static str,
        /// What still uses the store.
        reason: String,
    },

    /// A background thread could not be started (the flusher or the sweeper when the store
    /// opens or after `compact` / `check_integrity`, the outbox dispatcher). The operating
    /// system refused a new thread: the process is out of memory or at its thread limit.
    #[error(
        "could not start the {what} thread ({source}): the process is out of memory or at its thread limit; free resources or raise the limit (e.g. ulimit -u), then retry"
    )]
    Spawn {
        /// The thread's name (`idem-flusher`, `idem-sweeper`, `idem-dispatcher`).
        what: &'static str,
        /// What the operating system said.
        source: std::io::Error,
    },

    /// The operating system's random source failed (needed for lease holder tokens).
    #[error("the operating system's random source failed ({reason}): check the platform")]
    Random {
        /// What the random source said.
        reason: String,
    },
}

impl Error {
    /// True when retrying the same request later may succeed (`Aborted`, `OutcomeUnknown` after
    /// a reopen, `FailStopped` after a reopen, transient storage errors, `Spawn` once the process
    /// has threads to spare).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Aborted { .. }
                | Error::Busy { .. }
                | Error::OutcomeUnknown { .. }
                | Error::FailStopped { .. }
                | Error::Storage { .. }
                | Error::Spawn { .. }
        )
    }
}

/// The message of [`Error::InUse`]: what `operation` needs, and what to do about `reason`.
fn in_use_message(operation: &str, reason: &str) -> String {
    match operation {
        "start_dispatcher" => format!(
            "start_dispatcher needs to be the store's only outbox dispatcher, but {reason}: shut the running one down (DispatcherHandle::shutdown, or drop its handle) before starting another"
        ),
        _ => format!(
            "{operation} needs exclusive use of the store, but {reason}: finish or release every Lease, drop every other Store clone and every read transaction, then call {operation} again"
        ),
    }
}

#[cfg(test)]
mod tests {
    //! The `Error` doc's table names every variant once, and its last column is
    //! `Error::is_retryable`: both read from this file's source, so a new variant or a changed
    //! retry rule fails here until the table says it.

    use std::collections::BTreeSet;

    const SOURCE: &str = include_str!("error.rs");

    fn section<'a>(from: &str, to: &str) -> &'a str {
        let start = SOURCE.find(from).expect("the marker is in this file");
        let end = start + SOURCE[start..].find(to).expect("the end marker follows it");
        &SOURCE[start..end]
    }

    /// The variants declared in `pub enum Error`.
    fn variants() -> BTreeSet<String> {
        section("pub enum Error {", "\n}\n")
            .lines()
            .filter_map(|l| l.strip_prefix("    "))
            .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
            .map(|l| l.trim_end_matches([',', '{', ' ']).to_string())
            .collect()
    }

    /// (variant, retry column) for each variant named in the table's rows.
    fn table() -> Vec<(String, String)> {
        let mut rows = Vec::new();
        for line in section("/// | variant |", "#[derive(").lines().skip(2) {
            let cells: Vec<&str> = line.trim_start_matches("///").split('|').collect();
            let retry = cells[cells.len() - 2].trim().to_string();
            for name in cells[1].split("(Error::").skip(1) {
                let name = name.split(')').next().expect("a link ends with `)`");
                rows.push((name.to_string(), retry.clone()));
            }
        }
        rows
    }

    #[test]
    fn the_error_doc_names_every_variant_once() {
        let named: Vec<String> = table().into_iter().map(|(n, _)| n).collect();
        let unique: BTreeSet<String> = named.iter().cloned().collect();
        assert_eq!(
            named.len(),
            unique.len(),
            "a variant is in the table twice: {named:?}"
        );
        assert_eq!(unique, variants(), "the table and the enum differ");
    }

    #[test]
    fn the_error_doc_retry_column_is_is_retryable() {
        let retryable: BTreeSet<String> = section("pub fn is_retryable", "\n    }\n")
            .split("Error::")
            .skip(1)
            .map(|s| s.split(' ').next().expect("a variant name").to_string())
            .collect();
        let said: BTreeSet<String> = table()
            .into_iter()
            .filter(|(_, retry)| retry == "yes")
            .map(|(n, _)| n)
            .collect();
        assert_eq!(said, retryable);
        assert!(table().iter().all(|(_, r)| r == "yes" || r == "no"));
    }
}
