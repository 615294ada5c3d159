//! Record I/O: the public reads (`get`, `for_each_record`, `read_transaction`) and `purge`; the read
//! path every stored byte is read through (`Store::read`, `Store::read_record`, at the storage
//! boundary, every error observed by the latch); the record's load, put and remove inside a
//! write, with its expiry-index entry.

use std::ops::ControlFlow;

use std::sync::Arc;

use redb::{ReadableDatabase, ReadableTable, TableHandle};

use crate::engine::boundary::{caller_code, contained, unlatched};
use crate::engine::commit::{Durable, Step};
use crate::engine::expiry::{put_in, remove_in};
use crate::engine::journal::Wtx;
use crate::engine::journal::pending::Lookup;
use crate::engine::open::Open;
#[cfg(doc)]
use crate::engine::read_only::ReadOnlyStore;
use crate::engine::store::Store;
use crate::engine::tables::{EXPIRY, RECORDS};
use crate::error::Error;
use crate::model::record::Record;
use crate::model::scope::Scope;

impl Store {
    /// The stored record for `key` in `scope`, exactly as stored (it may be past its
    /// `expires_at` or `forget_at` if no sweep has run since; see [`crate::rules::is_expired`] and
    /// [`crate::rules::is_forgotten`]). For inspection and tests; never needed to
    /// use the store correctly.
    pub fn get(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<Option<Record>, Error> {
        let key = self.admit_key(scope, key)?;
        self.read_record(&key)
    }

    /// Calls `f` with every stored record, in record-key order, from one read transaction (a
    /// consistent snapshot; writers are not blocked), until `f` returns
    /// [`ControlFlow::Break`]. For operators' tools (`idem export`, `idem check`): `f` gets the
    /// record key as stored (docs/FORMAT.md, "Record key": tenant, operation and key, each
    /// length-prefixed) and the decoded record, or the error that reading it gives
    /// ([`Error::CorruptRecord`], [`Error::UnsupportedFormat`]), so one damaged record does not
    /// stop the walk. A damaged page does: the walk returns [`Error::CorruptStore`].
    pub fn for_each_record(
        &self,
        f: impl FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        self.read("reading the records", |read| for_each_record_in(read, f))
    }

    /// A read transaction on the store's file, for reading your own tables (e.g. to serve a
    /// `GET` of a resource a flow-A closure created). It sees a consistent snapshot. What you
    /// read through it is outside idem's storage boundary: on a damaged page, redb may panic in
    /// your code (idem's own reads return [`Error::CorruptStore`] instead).
    pub fn read_transaction(&self) -> Result<redb::ReadTransaction, Error> {
        self.wait_applied()?;
        let db = self.inner.db.get().map_err(|e| self.storage(e))?;
        let read = db.begin_read().map_err(|e| self.storage(e))?;
        // Journal mode: nothing in it may come from an entry a crash can still lose.
        self.read_durable()?;
        Ok(read)
    }

    /// Removes the record for `key` in `scope`, whatever its state, and returns whether one
    /// existed. An operator's tool for a record that fails to decode ([`Error::CorruptRecord`])
    /// or must be forgotten: the key becomes free, so a retry of the intent **runs again**, and a
    /// live lease on it is fenced out ([`Error::LeaseLost`]).
    pub fn purge(&self, scope: &Scope, key: impl AsRef<[u8]>) -> Result<bool, Error> {
        let key = self.admit_key(scope, key)?;
        let existed = self.write(Durable::AsConfigured, |txn, _| {
            match self.remove(txn, &key) {
                Ok(existed) => Step::Done(existed),
                Err(e) => Step::Abort(e),
            }
        })?;
        self.lease_event();
        Ok(existed)
    }

    /// The read path, mirroring [`Store::write`]: runs `f` on a fresh read transaction at the
    /// storage boundary. Every error `f` returns is observed (an I/O failure latches
    /// fail-stop), so no read of stored data can skip the latch; a panic redb raises on a
    /// damaged page while `f` runs is [`Error::CorruptStore`] (`while_` says what idem was
    /// doing; reads change nothing, so no fail-stop), and a panic in caller code inside `f` (run
    /// through [`caller_code`]) continues unwinding. Inside `f`, convert redb errors with
    /// [`unlatched`]: this function latches them.
    pub(crate) fn read<T>(
        &self,
        while_: &str,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<T, Error>,
    ) -> Result<T, Error> {
        contained(while_, || {
            // Journal mode: what this read must see is in redb first.
            self.wait_applied()?;
            let db = self.inner.db.get().map_err(|e| self.storage(e))?;
            let read = db.begin_read().map_err(|e| self.storage(e))?;
            self.read_durable()?;
            f(&read).map_err(|e| self.observe(e))
        })
    }

    /// The record under `key` as of the latest commit, through the table the read path shares
    /// (engine/snapshot.rs), at the storage boundary like [`Store::read`].
    pub(crate) fn read_record(&self, key: &[u8]) -> Result<Option<Record>, Error> {
        if let (Some(applier), Some(journal)) = (self.applier(), self.journal()) {
            // Journal mode: P's versions up to the last sealed entry over the published
            // snapshot, taken together (one read lock); then wait until what was read is
            // durable.
            let bound = journal.read_bound();
            return contained("reading a record", || {
                let found = applier.read(|pending, snap| {
                    match pending.get(RECORDS.name(), key, snap.lsn, bound) {
                        Lookup::Pending(v) => Ok(v),
                        Lookup::NotPending => match &snap.records {
                            Some(t) => {
                                let v = t.get(key).map_err(unlatched)?;
                                Ok(v.map(|v| Arc::from(v.value())))
                            }
                            None => Ok(None),
                        },
                    }
                });
                let found: Option<Arc<[u8]>> = found.map_err(|e| self.observe(e))?;
                self.read_durable()?;
                found.map(|v| Record::decode(&v)).transpose()
            });
        }
        contained("reading a record", || {
            let table = self
                .inner
                .snapshot
                .records(self.inner.db.get().map_err(|e| self.storage(e))?)
                .map_err(|e| self.storage(e))?;
            // After the table's read began: a bound on every entry it can see.
            self.read_durable()?;
            record_in(&*table, key).map_err(|e| self.observe(e))
        })
    }

    pub(crate) fn load(&self, txn: &Wtx<'_>, key: &[u8]) -> Result<Option<Record>, Error> {
        self.load_open(&mut Open::new(*txn), key)
    }

    /// [`Store::load`] through tables already open.
    pub(crate) fn load_open(
        &self,
        open: &mut Open<'_>,
        key: &[u8],
    ) -> Result<Option<Record>, Error> {
        let table = open.records().map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Record::decode(v.value())).transpose()
    }

    /// Writes a record, moving its expiry-index entry in the same transaction.
    pub(crate) fn put(&self, txn: &Wtx<'_>, key: &[u8], record: &Record) -> Result<(), Error> {
        self.put_open(&mut Open::new(*txn), key, record)
    }

    /// [`Store::put`] through tables already open.
    pub(crate) fn put_open(
        &self,
        open: &mut Open<'_>,
        key: &[u8],
        record: &Record,
    ) -> Result<(), Error> {
        self.with_latch(|| {
            let (records, expiry) = open.both()?;
            Ok(put_in(records, expiry, key, record)?)
        })
    }

    /// Removes a record and its expiry-index entry; returns whether one existed.
    pub(crate) fn remove(&self, txn: &Wtx<'_>, key: &[u8]) -> Result<bool, Error> {
        self.with_latch(|| {
            let mut records = txn.open_table(RECORDS)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            Ok(remove_in(&mut records, &mut expiry, key)?)
        })
    }
}

/// The record stored under `key`, from a read transaction (a [`Store`] or a [`ReadOnlyStore`]).
pub(crate) fn read_record_in(
    read: &redb::ReadTransaction,
    key: &[u8],
) -> Result<Option<Record>, Error> {
    record_in(&read.open_table(RECORDS).map_err(unlatched)?, key)
}

/// The record under `key` in an open records table, decoded. A redb error is returned
/// [`unlatched`]: the caller latches it (or has nothing to latch).
fn record_in(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<Record>, Error> {
    let value = table.get(key).map_err(unlatched)?;
    value.map(|v| Record::decode(v.value())).transpose()
}

/// Calls `f` with every record key and its decoded record (or why it does not decode), in key
/// order, until `f` breaks. `f` is caller code: its panic is the caller's.
pub(crate) fn for_each_record_in(
    read: &redb::ReadTransaction,
    mut f: impl FnMut(&[u8], Result<Record, Error>) -> ControlFlow<()>,
) -> Result<(), Error> {
    let table = match read.open_table(RECORDS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(()),
        Err(e) => return Err(unlatched(e)),
    };
    for row in table.iter().map_err(unlatched)? {
        let (key, value) = row.map_err(unlatched)?;
        let record = Record::decode(value.value());
        if caller_code(|| f(key.value(), record)).is_break() {
            break;
        }
    }
    Ok(())
}
