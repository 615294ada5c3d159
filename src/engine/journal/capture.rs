//! Capturing a batch's writes as redo records: every write into a batch's redb transaction goes
//! through a [`Table`] opened on a [`Wtx`], which writes through to redb and, in journal mode,
//! appends the key's and value's bytes (exactly as redb stores them) to the batch's entry.
//!
//! Invariant: in journal mode no write reaches a batch's redb transaction except through these
//! handles, so the batch's entry replayed over the state before it gives the state after it.
//! idem's own code writes only through [`Wtx`]; the caller's closure gets [`Table`] from
//! [`crate::Tx::open_table`], never redb's own table.

use std::borrow::Borrow;
use std::ops::{Deref, RangeBounds};

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::{
    AccessGuard, Key, ReadableTable, StorageError, TableDefinition, TableError, TableHandle, Value,
    WriteTransaction,
};

use crate::engine::journal::format::{EntryBuilder, OP_PUT, OP_REMOVE, TABLE_PLAIN};

/// A batch's entry as its members write it.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    entry: Mutex<EntryBuilder>,
    /// A member opened a table recovery could not apply records to (not registered, or a
    /// multimap): the batch commits durably instead of being journaled.
    unjournaled: AtomicBool,
}

impl Capture {
    /// Takes the entry written so far, leaving an empty one.
    pub(crate) fn take(&self) -> EntryBuilder {
        std::mem::take(&mut *self.entry.lock())
    }

    /// Whether the batch must commit durably instead of being journaled.
    pub(crate) fn unjournaled(&self) -> bool {
        self.unjournaled.load(Ordering::Relaxed)
    }
}

/// A batch's write transaction as idem's code and the caller's closure write to it: redb's
/// transaction and, in journal mode, the batch's [`Capture`].
#[derive(Clone, Copy)]
pub(crate) struct Wtx<'t> {
    txn: &'t WriteTransaction,
    capture: Option<&'t Capture>,
}

impl<'t> Wtx<'t> {
    /// Writes through `txn`, recorded in `capture` when there is one (journal mode).
    pub(crate) fn new(txn: &'t WriteTransaction, capture: Option<&'t Capture>) -> Self {
        Wtx { txn, capture }
    }

    /// Opens (creating if needed) a table whose writes are captured.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'t, K, V>, TableError> {
        let inner = self.txn.open_table(definition)?;
        Ok(Table {
            inner,
            capture: self.capture.map(|c| (c, None)),
        })
    }

    /// redb's transaction, for what writes nothing through it (table listing).
    pub(crate) fn redb(&self) -> &'t WriteTransaction {
        self.txn
    }

    /// Whether writes are journaled.
    pub(crate) fn journaled(&self) -> bool {
        self.capture.is_some()
    }

    /// A table recovery cannot apply records to was opened for writing: this batch commits
    /// durably instead (its writes need no replay).
    pub(crate) fn unjournaled(&self) {
        if let Some(c) = self.capture {
            c.unjournaled.store(true, Ordering::Relaxed);
        }
    }
}

/// A table in a batch's write transaction. Reads are redb's ([`ReadableTable`], through
/// `Deref`); writes go to redb and, in journal mode, into the batch's journal entry, so they
/// survive a crash exactly when the batch's answer does.
///
/// The methods that write mirror redb's `Table` (same arguments, same results).
pub struct Table<'t, K: Key + 'static, V: Value + 'static> {
    inner: redb::Table<'t, K, V>,
    /// The batch's entry, and this table's index in its table list once it has one.
    capture: Option<(&'t Capture, Option<u16>)>,
}

impl<'t, K: Key + 'static, V: Value + 'static> Deref for Table<'t, K, V> {
    type Target = redb::Table<'t, K, V>;

    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

impl<K: Key + 'static, V: Value + 'static> Table<'_, K, V> {
    fn record(&mut self, op: u8, key: &[u8], value: Option<&[u8]>) {
        let Some((capture, index)) = &mut self.capture else {
            return;
        };
        let mut entry = capture.entry.lock();
        let table = match index {
            Some(i) => *i,
            None => {
                let i = entry.table(
                    self.inner.name(),
                    TABLE_PLAIN,
                    K::type_name().name(),
                    V::type_name().name(),
                );
                *index = Some(i);
                i
            }
        };
        entry.record(op, table, key, value);
    }

    /// Inserts `value` under `key`, returning the old value (redb's `Table::insert`).
    pub fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let (key, value) = (key.borrow(), value.borrow());
        if self.capture.is_some() {
            let (k, v) = (K::as_bytes(key), V::as_bytes(value));
            self.record(OP_PUT, k.as_ref(), Some(v.as_ref()));
        }
        self.inner.insert(key, value)
    }

    /// Removes `key`, returning its value (redb's `Table::remove`).
    pub fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        let key = key.borrow();
        if self.capture.is_some() {
            let k = K::as_bytes(key);
            self.record(OP_REMOVE, k.as_ref(), None);
        }
        self.inner.remove(key)
    }

    /// Removes and returns the first entry (redb's `Table::pop_first`).
    #[allow(clippy::type_complexity, reason = "redb's own signature")]
    pub fn pop_first(
        &mut self,
    ) -> Result<Option<(AccessGuard<'_, K>, AccessGuard<'_, V>)>, StorageError> {
        let first = self.inner.first()?.map(|(k, _)| k.value_bytes());
        if let Some(k) = &first {
            self.record(OP_REMOVE, k, None);
        }
        self.inner.pop_first()
    }

    /// Removes and returns the last entry (redb's `Table::pop_last`).
    #[allow(clippy::type_complexity, reason = "redb's own signature")]
    pub fn pop_last(
        &mut self,
    ) -> Result<Option<(AccessGuard<'_, K>, AccessGuard<'_, V>)>, StorageError> {
        let last = self.inner.last()?.map(|(k, _)| k.value_bytes());
        if let Some(k) = &last {
            self.record(OP_REMOVE, k, None);
        }
        self.inner.pop_last()
    }

    /// Keeps the entries for which `predicate` is true (redb's `Table::retain`).
    pub fn retain<F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool>(
        &mut self,
        predicate: F,
    ) -> Result<(), StorageError> {
        self.retain_in::<K::SelfType<'_>, F>(.., predicate)
    }

    /// Keeps the entries in `range` for which `predicate` is true (redb's `Table::retain_in`).
    pub fn retain_in<'a, KR, F: for<'f> FnMut(K::SelfType<'f>, V::SelfType<'f>) -> bool>(
        &mut self,
        range: impl RangeBounds<KR> + 'a,
        mut predicate: F,
    ) -> Result<(), StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let mut doomed = Vec::new();
        for item in self.inner.range(range)? {
            let (k, v) = item?;
            if !predicate(k.value(), v.value()) {
                doomed.push(k.value_bytes());
            }
        }
        for k in doomed {
            self.record(OP_REMOVE, &k, None);
            self.inner.remove(K::from_bytes(&k))?;
        }
        Ok(())
    }
}

/// The bytes of a key or value read from redb, as redb stores them.
trait ValueBytes {
    fn value_bytes(&self) -> Vec<u8>;
}

impl<V: Value + 'static> ValueBytes for AccessGuard<'_, V> {
    fn value_bytes(&self) -> Vec<u8> {
        V::as_bytes(&self.value()).as_ref().to_vec()
    }
}
