//! A store opened for reading only ([`StoreBuilder::open_read_only`]): inspection without a
//! single write to the file, for operators' tools (`idem stats`, `get`, `export`, `outbox list`)
//! and for a second process that only looks.
//!
//! A separate type rather than a mode of [`Store`]: it has no write call at all, so "read-only"
//! is checked by the compiler, not at run time. Its reads are the same code as the store's
//! (functions over a redb read transaction), behind the same storage boundary: a panic redb
//! raises on a damaged page is [`Error::CorruptStore`].

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use redb::ReadableDatabase;

use crate::engine::boundary::{contained, unlatched};
use crate::engine::builder::StoreBuilder;
use crate::engine::expiry::stats_in;
#[cfg(doc)]
use crate::engine::store::Store;
use crate::engine::store::{for_each_record_in, read_record_in};
use crate::error::Error;
use crate::model::clock::{Clock, Timestamp};
use crate::model::record::Record;
use crate::model::reports::Stats;
use crate::model::scope::admit_key;
use crate::model::scope::{Limits, Scope};

/// An idem store opened for reading only. Nothing it does writes to the file: no open-time
/// commit, no crash recovery, no sweep; redb's shared lock is held instead of the exclusive one.
/// Open it with [`ReadOnlyStore::open`] or [`StoreBuilder::open_read_only`] (which says what
/// it refuses: a file that needs recovery, an empty file, a file that is not an idem store).
///
/// It sees the file as it was when each call began (every call is its own read transaction).
/// `Send + Sync`; no background thread.
pub struct ReadOnlyStore {
    db: redb::ReadOnlyDatabase,
    clock: Arc<dyn Clock>,
    limits: Limits,
}

impl std::fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyStore")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ReadOnlyStore {
    pub(crate) fn new(db: redb::ReadOnlyDatabase, clock: Arc<dyn Clock>, limits: Limits) -> Self {
        ReadOnlyStore { db, clock, limits }
    }

    /// Opens the store at `path` for reading only, with the default settings (see
    /// [`StoreBuilder::open_read_only`]).
    pub fn open(path: impl AsRef<Path>) -> Result<ReadOnlyStore, Error> {
        StoreBuilder::new().open_read_only(path)
    }

    /// The stored record for `key` in `scope`, exactly as stored (like [`crate::Store::get`]).
    pub fn get(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Option<Record>, Error> {
        let key = admit_key(&self.limits, scope, key)?;
        self.read("reading a record", |read| read_record_in(read, &key))
    }

    /// Every stored record, in record-key order, until `f` breaks (like
    /// [`crate::Store::for_each_record`]).
    pub fn for_each_record(
        &self,
        f: impl FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        self.read("reading the records", |read| for_each_record_in(read, f))
    }

    /// Records by stored state and records due for a sweep (like [`crate::Store::stats`]).
    pub fn stats(&self) -> Result<Stats, Error> {
        let now = self.now();
        self.read("counting the records", |read| stats_in(read, now))
    }

    /// A read transaction on the file, for reading your own tables. What you read through it
    /// is outside idem's storage boundary: on a damaged page, redb may panic in your code.
    pub fn read_transaction(&self) -> Result<redb::ReadTransaction, Error> {
        self.db.begin_read().map_err(unlatched)
    }

    /// The store's current time (its clock: [`StoreBuilder::clock`]).
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The name-length limits keys are checked against ([`StoreBuilder::limits`]).
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The read path, like [`crate::Store::read`]'s at the same storage boundary, but a
    /// read-only store has nothing to latch (it never writes): errors are returned as they are.
    pub(crate) fn read<T>(
        &self,
        while_: &str,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        contained(while_, || f(&self.read_transaction()?))
    }
}

/// `ReadOnlyStore` is `Send + Sync`, like `Store` (a compile-time check).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<ReadOnlyStore>();
};
