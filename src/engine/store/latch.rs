//! The fail-stop latch: the first I/O or commit failure is kept, and from then on every write
//! is refused ([`Error::FailStopped`] naming that first cause). Every redb error a call meets
//! passes through `storage` or `observe`, which latch the ones that mean the file or the disk
//! misbehaved.

use crate::engine::boundary::redb_error;
use crate::engine::store::Store;
use crate::error::{Error, StorageError};

impl Store {
    /// The first I/O or commit failure, if the store is fail-stopped.
    pub fn fail_stop_cause(&self) -> Option<String> {
        self.inner.failure.lock().clone()
    }

    pub(crate) fn check_writable(&self) -> Result<(), Error> {
        match &*self.inner.failure.lock() {
            Some(cause) => Err(Error::FailStopped {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Runs redb calls whose every error goes through the latch ([`Store::storage`]): for a
    /// write's work, where `?` gives a `redb::Error`.
    pub(crate) fn with_latch<T>(
        &self,
        f: impl FnOnce() -> Result<T, redb::Error>,
    ) -> Result<T, Error> {
        f().map_err(|e| self.storage(e))
    }

    /// Wraps a redb error, latching fail-stop when it is an I/O-level failure.
    pub(crate) fn storage(&self, e: impl Into<redb::Error>) -> Error {
        self.observe(Error::Storage {
            source: redb_error(e),
        })
    }

    /// Latches fail-stop if `e` reports an I/O-level failure; returns `e`, or, for an I/O-level
    /// failure after the store had already failed, [`Error::FailStopped`] naming the first
    /// failure (redb answers every later read of an uncached page with "previous I/O error",
    /// which names no cause).
    pub(crate) fn observe(&self, e: Error) -> Error {
        match &e {
            Error::Storage { source } if is_io_failure_in(source) => match self.latch(source) {
                Some(cause) => Error::FailStopped { cause },
                None => e,
            },
            Error::OutcomeUnknown { source } => {
                self.latch(source);
                e
            }
            _ => e,
        }
    }

    /// Latches fail-stop for damage found inside a write (its reason is the cause), and returns
    /// the error.
    pub(crate) fn latch_damage(&self, e: Error) -> Error {
        match &e {
            Error::CorruptStore { reason } => self.latch(reason),
            other => self.latch(other),
        };
        e
    }

    /// Latches fail-stop with `cause`, unless the store had already failed: then returns that
    /// earlier, first cause.
    pub(crate) fn latch(&self, cause: &dyn std::fmt::Display) -> Option<String> {
        let mut failure = self.inner.failure.lock();
        match &*failure {
            Some(first) => Some(first.clone()),
            None => {
                let cause = cause.to_string();
                // Whoever waits for the journal's durability hears it too.
                if let Some(journal) = self.journal() {
                    journal.fail(&cause);
                }
                *failure = Some(cause);
                None
            }
        }
    }
}

/// redb errors that mean the file or the disk misbehaved (as opposed to misuse).
fn is_io_failure(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Io(_)
            | redb::Error::Backend(_)
            | redb::Error::PreviousIo
            | redb::Error::Corrupted(_)
            | redb::Error::LockPoisoned(_)
            | redb::Error::DatabaseClosed
            | redb::Error::TransactionPoisoned
    )
}

/// Whether a storage error reports an I/O-level failure, whichever redb error type it wraps:
/// idem wraps `redb::Error`, but a caller's closure may build `Error::Storage` from the error a
/// table call gave it (a `redb::StorageError`, `TableError`, `CommitError`, ...), and such an
/// I/O failure must latch fail-stop all the same.
fn is_io_failure_in(source: &StorageError) -> bool {
    use redb::StorageError as S;
    let storage = |e: &S| {
        matches!(
            e,
            S::Io(_)
                | S::Backend(_)
                | S::PreviousIo
                | S::Corrupted(_)
                | S::LockPoisoned(_)
                | S::DatabaseClosed
        )
    };
    if let Some(e) = source.downcast_ref::<redb::Error>() {
        return is_io_failure(e);
    }
    if let Some(e) = source.downcast_ref::<S>() {
        return storage(e);
    }
    if let Some(redb::TableError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::TransactionError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::DatabaseError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::CompactionError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    if let Some(redb::SavepointError::Storage(e)) = source.downcast_ref() {
        return storage(e);
    }
    match source.downcast_ref::<redb::CommitError>() {
        Some(redb::CommitError::Storage(e)) => storage(e),
        Some(redb::CommitError::TransactionPoisoned) => true,
        _ => false,
    }
}
