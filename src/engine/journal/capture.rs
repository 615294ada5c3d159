//! Capturing a batch's writes as redo records: every write into a batch's redb transaction goes
//! through a [`Table`] opened on a [`Wtx`], which writes through to redb and, in journal mode,
//! appends the key's and value's bytes (exactly as redb stores them) to the batch's entry.
//!
//! Invariant: in journal mode no write reaches a batch's redb transaction except through these
//! handles, so the batch's entry replayed over the state before it gives the state after it.
//! idem's own code writes only through [`Wtx`]; the caller's closure gets [`Table`] from
//! [`crate::Tx::open_table`], never redb's own table.

use std::borrow::Borrow;
use std::ops::RangeBounds;

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::{
    AccessGuard, Key, ReadableTable, ReadableTableMetadata, StorageError, TableDefinition,
    TableError, TableHandle, Value, WriteTransaction,
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

/// A table in a batch's write transaction: the batch's state of one table, read and written
/// through idem so that, in journal mode, every write joins the batch's journal entry and
/// survives a crash exactly when the batch's answer does.
///
/// Its methods mirror redb's `Table` and `ReadableTable` (same arguments; reads return idem's
/// [`Guard`] and [`Range`], which give `.value()` as redb's do). Reads see every write made
/// earlier in the batch, by this closure or an earlier member's.
pub struct Table<'t, K: Key + 'static, V: Value + 'static> {
    inner: redb::Table<'t, K, V>,
    /// The batch's entry, and this table's index in its table list once it has one.
    capture: Option<(&'t Capture, Option<u16>)>,
}

/// A key or value read from a [`Table`] (redb's `AccessGuard`, behind idem's type): its
/// [`value`](Guard::value) borrows from the guard.
pub struct Guard<'a, T: Value + 'static> {
    inner: AccessGuard<'a, T>,
}

impl<'a, T: Value + 'static> Guard<'a, T> {
    fn new(inner: AccessGuard<'a, T>) -> Self {
        Guard { inner }
    }

    /// The key or value, as its type reads it.
    pub fn value(&self) -> T::SelfType<'_> {
        self.inner.value()
    }
}

impl<T: Value + 'static> std::fmt::Debug for Guard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.value(), f)
    }
}

/// A key and its value, as [`Table::first`], [`Table::last`] and [`Range`] give them.
pub type Pair<'a, K, V> = (Guard<'a, K>, Guard<'a, V>);

/// The entries of a range of a [`Table`], in key order (reversed with `rev()`).
pub struct Range<'a, K: Key + 'static, V: Value + 'static> {
    inner: redb::Range<'a, K, V>,
}

fn pair<'a, K: Key + 'static, V: Value + 'static>(
    (k, v): (AccessGuard<'a, K>, AccessGuard<'a, V>),
) -> Pair<'a, K, V> {
    (Guard::new(k), Guard::new(v))
}

impl<'a, K: Key + 'static, V: Value + 'static> Iterator for Range<'a, K, V> {
    type Item = Result<Pair<'a, K, V>, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inner.next().map(|r| r.map(pair))
    }
}

impl<K: Key + 'static, V: Value + 'static> DoubleEndedIterator for Range<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back().map(|r| r.map(pair))
    }
}

impl<K: Key + 'static, V: Value + 'static> Table<'_, K, V> {
    /// The value under `key`, if any.
    pub fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        Ok(self.inner.get(key)?.map(Guard::new))
    }

    /// The entries whose keys are in `range`, in key order.
    pub fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        Ok(Range {
            inner: self.inner.range(range)?,
        })
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> Result<Range<'_, K, V>, StorageError> {
        Ok(Range {
            inner: self.inner.iter()?,
        })
    }

    /// The entry with the smallest key, if any.
    pub fn first(&self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        Ok(self.inner.first()?.map(pair))
    }

    /// The entry with the largest key, if any.
    pub fn last(&self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        Ok(self.inner.last()?.map(pair))
    }

    /// The number of entries.
    pub fn len(&self) -> Result<u64, StorageError> {
        self.inner.len()
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> Result<bool, StorageError> {
        self.inner.is_empty()
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

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
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        let (key, value) = (key.borrow(), value.borrow());
        if self.capture.is_some() {
            let (k, v) = (K::as_bytes(key), V::as_bytes(value));
            self.record(OP_PUT, k.as_ref(), Some(v.as_ref()));
        }
        Ok(self.inner.insert(key, value)?.map(Guard::new))
    }

    /// Removes `key`, returning its value (redb's `Table::remove`).
    pub fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        let key = key.borrow();
        if self.capture.is_some() {
            let k = K::as_bytes(key);
            self.record(OP_REMOVE, k.as_ref(), None);
        }
        Ok(self.inner.remove(key)?.map(Guard::new))
    }

    /// Removes and returns the first entry (redb's `Table::pop_first`).
    pub fn pop_first(&mut self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        let first = self.inner.first()?.map(|(k, _)| k.value_bytes());
        if let Some(k) = &first {
            self.record(OP_REMOVE, k, None);
        }
        Ok(self.inner.pop_first()?.map(pair))
    }

    /// Removes and returns the last entry (redb's `Table::pop_last`).
    pub fn pop_last(&mut self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        let last = self.inner.last()?.map(|(k, _)| k.value_bytes());
        if let Some(k) = &last {
            self.record(OP_REMOVE, k, None);
        }
        Ok(self.inner.pop_last()?.map(pair))
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
