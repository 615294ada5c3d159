//! How a file was left before it is opened for writing: new, closed cleanly, or left by a crash
//! ([`Shutdown`]), as a read-only open of it says. The open for writing checks the file
//! ([`StoreBuilder::verify_on_open`](crate::StoreBuilder::verify_on_open)), which redb runs as
//! the walk of a repair and reports through the repair callbacks: only for a file a crash left
//! is that walk a repair, to be shown to the caller, logged and counted.
//!
//! A read-only open never writes and refuses a file that needs recovery, which is exactly the
//! question. For a caller's storage backend, which the open for writing takes by value, the
//! look goes through a second handle on the same backend that never closes it or takes its
//! locks.

use std::fmt;
use std::io;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use redb::{BackendError, StorageBackend};

use crate::engine::boundary::catch_storage_panic;

/// How the file was left, as far as a read-only open can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shutdown {
    /// No file, or an empty one: nothing to verify or recover.
    New,
    /// The read-only open succeeded: the last process closed it cleanly.
    Clean,
    /// The read-only open refused it as needing recovery: a process died with it open (or a
    /// write failed part-way and the process never closed it cleanly).
    Crashed,
    /// Not looked at (nothing asks), or the read-only open failed otherwise (a lock held
    /// elsewhere, a damaged header, a panic): not known to need recovery.
    Unknown,
}

impl Shutdown {
    fn of(opened: Result<Result<redb::ReadOnlyDatabase, redb::DatabaseError>, ()>) -> Shutdown {
        match opened {
            Ok(Ok(_db)) => Shutdown::Clean,
            // A read-only open's answer to a file that needs recovery.
            Ok(Err(redb::DatabaseError::RepairAborted)) => Shutdown::Crashed,
            Ok(Err(_)) | Err(()) => Shutdown::Unknown,
        }
    }
}

/// How the file at `path` was left. A missing or empty file is [`Shutdown::New`].
pub(crate) fn path(builder: &redb::Builder, path: &Path) -> Shutdown {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > 0 => {}
        // Missing, or empty: redb creates (or initialises) it. Anything else unreadable is the
        // open's to report.
        Ok(_) => return Shutdown::New,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Shutdown::New,
        Err(_) => return Shutdown::Unknown,
    }
    Shutdown::of(catch_storage_panic(|| builder.open_read_only(path)).map_err(|_| ()))
}

/// How the storage behind `backend` was left.
pub(crate) fn backend<B: StorageBackend>(builder: &redb::Builder, backend: &Arc<B>) -> Shutdown {
    match backend.len() {
        Ok(0) => return Shutdown::New,
        Ok(_) => {}
        Err(_) => return Shutdown::Unknown,
    }
    let look = ReadOnlyLook(backend.clone());
    Shutdown::of(catch_storage_panic(|| builder.open_read_only_with_backend(look)).map_err(|_| ()))
}

/// The caller's backend, shared between the read-only look and the open for writing: every
/// call goes to it (its locks and its `close` included).
pub(crate) struct SharedBackend<B>(pub(crate) Arc<B>);

impl<B: StorageBackend> fmt::Debug for SharedBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<B: StorageBackend> StorageBackend for SharedBackend<B> {
    fn len(&self) -> Result<u64, BackendError> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), BackendError> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        self.0.write(offset, data)
    }
    fn close(&self) -> Result<(), BackendError> {
        self.0.close()
    }
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.try_lock_range(start, end)
    }
    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.0.try_lock_shared_range(start, end)
    }
    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_range(start, end)
    }
    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.lock_shared_range(start, end)
    }
    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.0.unlock_range(start, end)
    }
    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.0.query_lock_range(start, end)
    }
}

/// The read-only look's handle on the caller's backend: it reads, and nothing else reaches the
/// backend — no lock (the open for writing takes its own right after), no close (the open for
/// writing owns the backend), no write (a read-only open makes none).
pub(crate) struct ReadOnlyLook<B>(pub(crate) Arc<B>);

impl<B: StorageBackend> fmt::Debug for ReadOnlyLook<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<B: StorageBackend> StorageBackend for ReadOnlyLook<B> {
    fn len(&self) -> Result<u64, BackendError> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        self.0.read(offset, out)
    }
    fn set_len(&self, _: u64) -> Result<(), BackendError> {
        Err(io::Error::from(io::ErrorKind::ReadOnlyFilesystem).into())
    }
    fn sync_data(&self) -> Result<(), BackendError> {
        Ok(())
    }
    fn write(&self, _: u64, _: &[u8]) -> Result<(), BackendError> {
        Err(io::Error::from(io::ErrorKind::ReadOnlyFilesystem).into())
    }
    fn close(&self) -> Result<(), BackendError> {
        Ok(())
    }
}
