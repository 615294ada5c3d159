//! Capturing a batch's writes as redo records: every write of a batch goes through a [`Table`]
//! opened on a [`Wtx`], which, in journal mode, appends the key's and value's bytes (exactly as
//! redb stores them) to the batch's entry.
//!
//! A batch runs on one of two sources:
//! - **redb's write transaction** (direct mode, and journal mode's batches that hold the
//!   applier): reads and writes go to redb inside it;
//! - **a view** (journal mode, `applier.rs`): reads merge the batch's own writes (the
//!   capture's overlay), the pending set P's versions in `(a, j]` and the redb snapshot `S(a)`,
//!   in the table's key order; writes go to the overlay and the entry only.
//!
//! Invariant: in journal mode no write reaches a batch except through these handles, so the
//! batch's entry replayed over the state before it gives the state after it. idem's own code
//! writes only through [`Wtx`]; the caller's closure gets [`Table`] from
//! [`crate::Tx::open_table`], never redb's own table.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use redb::{
    AccessGuard, Key, ReadOnlyTable, ReadableTable, ReadableTableMetadata, StorageError,
    TableDefinition, TableError, TableHandle, Value, WriteTransaction,
};

use crate::engine::journal::applier::{Applier, Snap};
use crate::engine::journal::format::{EntryBuilder, OP_PUT, OP_REMOVE, TABLE_PLAIN};
use crate::engine::journal::pending::{
    Compare, Direction, Lookup, PendingSet, Write, merge, overlay,
};

/// A key and a value as stored bytes.
type Bytes = Arc<[u8]>;

/// A batch's own writes on a view, readable by its later reads: one version per write,
/// numbered in order, so the newest is the batch's state of the key.
#[derive(Debug, Default)]
struct Overlay {
    set: PendingSet,
    writes: u64,
    /// Every table a member opened, with its key order (for sealing the entry into P).
    compares: HashMap<String, Compare>,
    /// Every table a member opened, with the type names it first opened it with.
    types: HashMap<String, (String, String)>,
}

/// A batch's entry as its members write it.
#[derive(Debug, Default)]
pub(crate) struct Capture {
    entry: Mutex<EntryBuilder>,
    /// A member opened a table recovery could not apply records to (not registered, or a
    /// multimap): the batch commits durably instead of being journaled.
    unjournaled: AtomicBool,
    overlay: Mutex<Overlay>,
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

    /// The key order of every table the batch opened (on a view).
    pub(crate) fn compares(&self) -> HashMap<String, Compare> {
        self.overlay.lock().compares.clone()
    }
}

/// A batch's view in journal mode: the published snapshot `S(a)`, and P's versions up to
/// `through` (j when the batch began: no entry is sealed while it runs).
pub(crate) struct View {
    pub(crate) snap: Arc<Snap>,
    pub(crate) applier: Arc<Applier>,
    pub(crate) through: u64,
}

/// What a batch reads and writes.
#[derive(Clone, Copy)]
enum Source<'t> {
    Redb(&'t WriteTransaction),
    View(&'t View),
}

/// A batch's write handle as idem's code and the caller's closure write through it: its source
/// and, in journal mode, the batch's [`Capture`].
#[derive(Clone, Copy)]
pub(crate) struct Wtx<'t> {
    source: Source<'t>,
    capture: Option<&'t Capture>,
}

impl<'t> Wtx<'t> {
    /// Writes through `txn`, recorded in `capture` when there is one (journal mode).
    pub(crate) fn new(txn: &'t WriteTransaction, capture: Option<&'t Capture>) -> Self {
        Wtx {
            source: Source::Redb(txn),
            capture,
        }
    }

    /// Reads through `view`, writes into `capture` (journal mode).
    pub(crate) fn view(view: &'t View, capture: &'t Capture) -> Self {
        Wtx {
            source: Source::View(view),
            capture: Some(capture),
        }
    }

    /// Opens (creating if needed) a table whose writes are captured.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<K, V>,
    ) -> Result<Table<'t, K, V>, TableError> {
        let inner = match self.source {
            Source::Redb(txn) => Inner::Redb(txn.open_table(definition)?),
            Source::View(view) => {
                let Some(txn) = &view.snap.txn else {
                    return Err(TableError::Storage(StorageError::Io(
                        std::io::Error::other(
                            "the store's applier is suspended (compaction or an integrity check)",
                        ),
                    )));
                };
                let snap = match txn.open_table(definition) {
                    Ok(t) => Some(t),
                    Err(TableError::TableDoesNotExist(_)) => {
                        // Not in redb yet: a sealed entry, or this batch, may have created it,
                        // with its types.
                        let (key, value) = (K::type_name(), V::type_name());
                        let created = self
                            .capture
                            .and_then(|c| c.overlay.lock().types.get(definition.name()).cloned())
                            .or_else(|| view.applier.types_of(definition.name()));
                        if let Some((k, v)) = created
                            && (k.as_str(), v.as_str()) != (key.name(), value.name())
                        {
                            return Err(type_mismatch(definition, &k, &v));
                        }
                        None
                    }
                    Err(e) => return Err(e),
                };
                let capture = self.capture.ok_or(TableError::Storage(StorageError::Io(
                    std::io::Error::other("a view without a capture"),
                )))?;
                {
                    let mut o = capture.overlay.lock();
                    o.compares.insert(definition.name().to_owned(), K::compare);
                    o.types
                        .entry(definition.name().to_owned())
                        .or_insert_with(|| {
                            (
                                K::type_name().name().to_owned(),
                                V::type_name().name().to_owned(),
                            )
                        });
                }
                Inner::View(ViewTable {
                    name: definition.name().to_owned(),
                    snap,
                    view,
                    capture,
                })
            }
        };
        Ok(Table {
            inner,
            capture: self.capture.map(|c| (c, None)),
        })
    }

    /// redb's transaction, for what writes nothing through it (multimap tables); `None` in
    /// a view, where the batch has none.
    pub(crate) fn redb(&self) -> Option<&'t WriteTransaction> {
        match self.source {
            Source::Redb(txn) => Some(txn),
            Source::View(_) => None,
        }
    }

    /// Whether writes are journaled.
    pub(crate) fn journaled(&self) -> bool {
        self.capture.is_some()
    }

    /// Whether the batch runs on a view (journal mode).
    pub(crate) fn in_view(&self) -> bool {
        matches!(self.source, Source::View(_))
    }

    /// Whether a member asked, on a view, for a table the journal cannot replay: it runs again
    /// on redb's own write transaction (`engine/commit.rs`).
    pub(crate) fn wants_redb(&self) -> bool {
        self.in_view() && self.capture.is_some_and(Capture::unjournaled)
    }

    /// A table recovery cannot apply records to was opened for writing: this batch commits
    /// durably instead (its writes need no replay); on a view, the member runs again on redb's
    /// own write transaction.
    pub(crate) fn unjournaled(&self) {
        if let Some(c) = self.capture {
            c.unjournaled.store(true, Ordering::Relaxed);
        }
    }
}

/// The `TableError::TableTypeMismatch` redb reports when `definition` is opened on a table
/// stored with the types named `key` and `value`. redb 5 has no public constructor for it: the
/// table is created with stand-in types of those names in a scratch in-memory database and
/// opened there with `definition`'s.
fn type_mismatch<K: Key + 'static, V: Value + 'static>(
    definition: TableDefinition<K, V>,
    key: &str,
    value: &str,
) -> TableError {
    use std::cell::RefCell;
    thread_local! {
        static NAMES: RefCell<(String, String)> = const { RefCell::new((String::new(), String::new())) };
    }
    /// A type named as the stored key type (`KEY`) or value type (not `KEY`).
    #[derive(Debug)]
    struct Named<const KEY: bool>;
    impl<const KEY: bool> Value for Named<KEY> {
        type SelfType<'a> = &'a [u8];
        type AsBytes<'a> = &'a [u8];
        fn fixed_width() -> Option<usize> {
            None
        }
        fn from_bytes<'a>(data: &'a [u8]) -> &'a [u8]
        where
            Self: 'a,
        {
            data
        }
        fn as_bytes<'a, 'b: 'a>(value: &'a &'b [u8]) -> &'a [u8]
        where
            Self: 'b,
        {
            value
        }
        fn type_name() -> redb::TypeName {
            NAMES.with(|n| {
                let n = n.borrow();
                redb::TypeName::new(if KEY { &n.0 } else { &n.1 })
            })
        }
    }
    impl<const KEY: bool> Key for Named<KEY> {
        fn compare(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
            a.cmp(b)
        }
    }
    NAMES.with(|n| *n.borrow_mut() = (key.to_owned(), value.to_owned()));
    let stored = TableDefinition::<Named<true>, Named<false>>::new(definition.name());
    let reported = redb::Database::builder()
        .create_with_backend(redb::backends::InMemoryBackend::new())
        .map_err(redb::Error::from)
        .and_then(|db| {
            let txn = db.begin_write()?;
            txn.open_table(stored)?;
            Ok(txn.open_table(definition).err())
        });
    match reported {
        Ok(Some(e)) => e,
        // Unreachable: the names differ from `K`'s and `V`'s, and nothing else can fail in memory.
        _ => TableError::Storage(StorageError::Corrupted(format!(
            "{} has key type {key} and value type {value}, but was opened with key type {} and value type {}",
            definition.name(),
            K::type_name().name(),
            V::type_name().name()
        ))),
    }
}

/// A table of a view: the batch's writes over P over the snapshot's table.
struct ViewTable<'t, K: Key + 'static, V: Value + 'static> {
    name: String,
    /// The snapshot's table; `None` when it did not exist then.
    snap: Option<ReadOnlyTable<K, V>>,
    view: &'t View,
    capture: &'t Capture,
}

enum Inner<'t, K: Key + 'static, V: Value + 'static> {
    Redb(redb::Table<'t, K, V>),
    View(ViewTable<'t, K, V>),
}

/// A table in a batch: the batch's state of one table, read and written through idem so that,
/// in journal mode, every write joins the batch's journal entry and survives a crash exactly
/// when the batch's answer does.
///
/// Its methods mirror redb's `Table` and `ReadableTable` (same arguments; reads return idem's
/// [`Guard`] and [`Range`], which give `.value()` as redb's do). Reads see every write made
/// earlier in the batch, by this closure or an earlier member's.
pub struct Table<'t, K: Key + 'static, V: Value + 'static> {
    inner: Inner<'t, K, V>,
    /// The batch's entry, and this table's index in its table list once it has one.
    capture: Option<(&'t Capture, Option<u16>)>,
}

enum GuardInner<'a, T: Value + 'static> {
    Redb(AccessGuard<'a, T>),
    Bytes(Bytes),
}

/// A key or value read from a [`Table`]: its [`value`](Guard::value) borrows from the guard.
pub struct Guard<'a, T: Value + 'static> {
    inner: GuardInner<'a, T>,
}

impl<'a, T: Value + 'static> Guard<'a, T> {
    fn new(inner: AccessGuard<'a, T>) -> Self {
        Guard {
            inner: GuardInner::Redb(inner),
        }
    }

    fn bytes(bytes: Bytes) -> Self {
        Guard {
            inner: GuardInner::Bytes(bytes),
        }
    }

    /// The key or value, as its type reads it.
    pub fn value(&self) -> T::SelfType<'_> {
        match &self.inner {
            GuardInner::Redb(g) => g.value(),
            // Invariant: these bytes are a `T` as redb stores it (written through a `Table` of
            // this type, or read from redb).
            GuardInner::Bytes(b) => T::from_bytes(b),
        }
    }
}

impl<T: Value + 'static> std::fmt::Debug for Guard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.value(), f)
    }
}

/// A key and its value, as [`Table::first`], [`Table::last`] and [`Range`] give them.
pub type Pair<'a, K, V> = (Guard<'a, K>, Guard<'a, V>);

type BytesItem = Result<(Bytes, Bytes), StorageError>;

/// A view's range before and after its direction is known: lazy in the direction first read,
/// the rest collected if the other end is read too.
#[allow(
    clippy::large_enum_variant,
    reason = "one per range read, never moved after it is built"
)]
enum Merged<'a, K: Key + 'static, V: Value + 'static> {
    Fresh {
        upper: Vec<(Bytes, Option<Bytes>)>,
        lower: Option<redb::Range<'a, K, V>>,
        compare: Compare,
    },
    Going {
        forward: bool,
        items: Box<dyn Iterator<Item = BytesItem> + 'a>,
    },
    Rest(VecDeque<BytesItem>),
}

enum RangeInner<'a, K: Key + 'static, V: Value + 'static> {
    Redb(redb::Range<'a, K, V>),
    Empty,
    Merged(Merged<'a, K, V>),
}

/// The entries of a range of a [`Table`], in key order (reversed with `rev()`).
pub struct Range<'a, K: Key + 'static, V: Value + 'static> {
    inner: RangeInner<'a, K, V>,
}

fn pair<'a, K: Key + 'static, V: Value + 'static>(
    (k, v): (AccessGuard<'a, K>, AccessGuard<'a, V>),
) -> Pair<'a, K, V> {
    (Guard::new(k), Guard::new(v))
}

fn bytes_pair<'a, K: Key + 'static, V: Value + 'static>((k, v): (Bytes, Bytes)) -> Pair<'a, K, V> {
    (Guard::bytes(k), Guard::bytes(v))
}

fn stored<T: Value + 'static>(g: &AccessGuard<'_, T>) -> Bytes {
    Arc::from(T::as_bytes(&g.value()).as_ref())
}

impl<'a, K: Key + 'static, V: Value + 'static> Merged<'a, K, V> {
    /// Starts reading in `forward`'s direction.
    fn go(&mut self, forward: bool) {
        let taken = std::mem::replace(self, Merged::Rest(VecDeque::new()));
        *self = match taken {
            Merged::Fresh {
                mut upper,
                lower,
                compare,
            } => {
                let direction = if forward {
                    Direction::Forward
                } else {
                    upper.reverse();
                    Direction::Reverse
                };
                let lower: Box<dyn Iterator<Item = BytesItem> + 'a> = match lower {
                    None => Box::new(std::iter::empty()),
                    Some(r) if forward => {
                        Box::new(r.map(|i| i.map(|(k, v)| (stored(&k), stored(&v)))))
                    }
                    Some(r) => Box::new(r.rev().map(|i| i.map(|(k, v)| (stored(&k), stored(&v))))),
                };
                Merged::Going {
                    forward,
                    items: Box::new(merge(upper, lower, compare, direction)),
                }
            }
            Merged::Going {
                forward: was,
                items,
            } if was != forward => {
                // Both ends read: the rest, collected in forward order.
                let mut rest: VecDeque<BytesItem> = items.collect();
                if !was {
                    rest = rest.into_iter().rev().collect();
                }
                Merged::Rest(rest)
            }
            other => other,
        };
    }

    fn next_in(&mut self, forward: bool) -> Option<BytesItem> {
        self.go(forward);
        match self {
            Merged::Going { items, .. } => items.next(),
            Merged::Rest(rest) if forward => rest.pop_front(),
            Merged::Rest(rest) => rest.pop_back(),
            Merged::Fresh { .. } => None,
        }
    }
}

impl<'a, K: Key + 'static, V: Value + 'static> Iterator for Range<'a, K, V> {
    type Item = Result<Pair<'a, K, V>, StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            RangeInner::Redb(r) => r.next().map(|r| r.map(pair)),
            RangeInner::Empty => None,
            RangeInner::Merged(m) => m.next_in(true).map(|r| r.map(bytes_pair)),
        }
    }
}

impl<K: Key + 'static, V: Value + 'static> DoubleEndedIterator for Range<'_, K, V> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match &mut self.inner {
            RangeInner::Redb(r) => r.next_back().map(|r| r.map(pair)),
            RangeInner::Empty => None,
            RangeInner::Merged(m) => m.next_in(false).map(|r| r.map(bytes_pair)),
        }
    }
}

/// A range's bounds as stored bytes.
type ByteBounds = (Bound<Vec<u8>>, Bound<Vec<u8>>);

fn byte_bounds<'a, K: Key + 'static, KR: Borrow<K::SelfType<'a>> + 'a>(
    range: &impl RangeBounds<KR>,
) -> ByteBounds {
    let bytes = |k: &KR| K::as_bytes(k.borrow()).as_ref().to_vec();
    (range.start_bound().map(bytes), range.end_bound().map(bytes))
}

impl<K: Key + 'static, V: Value + 'static> ViewTable<'_, K, V> {
    /// The batch's and P's state of `key`, if either has one.
    fn upper_get(&self, key: &[u8]) -> Lookup {
        let own = self
            .capture
            .overlay
            .lock()
            .set
            .get(&self.name, key, 0, u64::MAX);
        if let Lookup::Pending(v) = own {
            return Lookup::Pending(v);
        }
        let (above, through) = (self.view.snap.lsn, self.view.through);
        self.view
            .applier
            .pending(|p| p.get(&self.name, key, above, through))
    }

    /// The batch's writes over P's versions in `bounds`, in forward order, removes kept.
    fn upper_range(&self, (start, end): &ByteBounds) -> Vec<(Bytes, Option<Bytes>)> {
        let (s, e) = (
            start.as_ref().map(Vec::as_slice),
            end.as_ref().map(Vec::as_slice),
        );
        let own: Vec<_> = self
            .capture
            .overlay
            .lock()
            .set
            .range(&self.name, s, e, 0, u64::MAX, Direction::Forward)
            .collect();
        let (above, through) = (self.view.snap.lsn, self.view.through);
        let pending: Vec<_> = self.view.applier.pending(|p| {
            p.range(&self.name, s, e, above, through, Direction::Forward)
                .collect()
        });
        overlay(own, pending, K::compare, Direction::Forward).collect()
    }

    fn range_bytes<'s>(&'s self, bounds: ByteBounds) -> Result<RangeInner<'s, K, V>, StorageError> {
        let upper = self.upper_range(&bounds);
        let lower = match &self.snap {
            None => None,
            Some(t) => {
                let (start, end) = &bounds;
                let start = start.as_ref().map(|b| K::from_bytes(b));
                let end = end.as_ref().map(|b| K::from_bytes(b));
                Some(t.range((start, end))?)
            }
        };
        Ok(match (upper.is_empty(), lower) {
            (true, Some(r)) => RangeInner::Redb(r),
            (true, None) => RangeInner::Empty,
            (false, lower) => RangeInner::Merged(Merged::Fresh {
                upper,
                lower,
                compare: K::compare,
            }),
        })
    }

    /// Records a put (`Some`) or a remove of `key` in the batch's own writes.
    fn write(&self, key: &[u8], value: Option<&[u8]>) {
        let mut o = self.capture.overlay.lock();
        o.writes += 1;
        let lsn = o.writes;
        // Invariant: `lsn` increases with every write of the batch, so the insert is accepted.
        let _ = o.set.insert_entry(
            lsn,
            [Write {
                table: &self.name,
                compare: K::compare,
                key,
                value,
            }],
        );
    }
}

impl<'t, K: Key + 'static, V: Value + 'static> Table<'t, K, V> {
    /// The value under `key`, if any.
    pub fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        match &self.inner {
            Inner::Redb(t) => Ok(t.get(key)?.map(Guard::new)),
            Inner::View(v) => {
                let key = key.borrow();
                if let Lookup::Pending(found) = v.upper_get(K::as_bytes(key).as_ref()) {
                    return Ok(found.map(Guard::bytes));
                }
                match &v.snap {
                    Some(t) => Ok(t.get(key)?.map(Guard::new)),
                    None => Ok(None),
                }
            }
        }
    }

    /// The entries whose keys are in `range`, in key order.
    pub fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        let inner = match &self.inner {
            Inner::Redb(t) => {
                // redb's range takes its `KeyRange`: the bounds as keys of `K`'s own type.
                let (start, end) = byte_bounds::<K, KR>(&range);
                let start = start.as_ref().map(|b| K::from_bytes(b));
                let end = end.as_ref().map(|b| K::from_bytes(b));
                RangeInner::Redb(t.range((start, end))?)
            }
            Inner::View(v) => v.range_bytes(byte_bounds::<K, KR>(&range))?,
        };
        Ok(Range { inner })
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> Result<Range<'_, K, V>, StorageError> {
        let inner = match &self.inner {
            Inner::Redb(t) => RangeInner::Redb(t.iter()?),
            Inner::View(v) => v.range_bytes((Bound::Unbounded, Bound::Unbounded))?,
        };
        Ok(Range { inner })
    }

    /// The entry with the smallest key, if any.
    pub fn first(&self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        match &self.inner {
            Inner::Redb(t) => Ok(t.first()?.map(pair)),
            Inner::View(_) => self.iter()?.next().transpose(),
        }
    }

    /// The entry with the largest key, if any.
    pub fn last(&self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        match &self.inner {
            Inner::Redb(t) => Ok(t.last()?.map(pair)),
            Inner::View(_) => self.iter()?.next_back().transpose(),
        }
    }

    /// The number of entries.
    pub fn len(&self) -> Result<u64, StorageError> {
        match &self.inner {
            Inner::Redb(t) => t.len(),
            Inner::View(v) => {
                let mut n = match &v.snap {
                    Some(t) => t.len()?,
                    None => 0,
                };
                for (k, value) in v.upper_range(&(Bound::Unbounded, Bound::Unbounded)) {
                    let below = match &v.snap {
                        Some(t) => t.get(K::from_bytes(&k))?.is_some(),
                        None => false,
                    };
                    match (below, value.is_some()) {
                        (false, true) => n += 1,
                        (true, false) => n = n.saturating_sub(1),
                        _ => {}
                    }
                }
                Ok(n)
            }
        }
    }

    /// Whether the table has no entry.
    pub fn is_empty(&self) -> Result<bool, StorageError> {
        Ok(self.first()?.is_none())
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        match &self.inner {
            Inner::Redb(t) => t.name(),
            Inner::View(v) => &v.name,
        }
    }

    fn record(&mut self, op: u8, key: &[u8], value: Option<&[u8]>) {
        if let Inner::View(v) = &self.inner {
            v.write(key, value);
        }
        let Some((capture, index)) = &mut self.capture else {
            return;
        };
        let mut entry = capture.entry.lock();
        let table = match index {
            Some(i) => *i,
            None => {
                let name = match &self.inner {
                    Inner::Redb(t) => t.name(),
                    Inner::View(v) => &v.name,
                };
                let i = entry.table(
                    name,
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

    /// The value under `key` as owned bytes (a view's write returns the old value this way).
    fn get_bytes(&self, key: &K::SelfType<'_>) -> Result<Option<Bytes>, StorageError> {
        Ok(self.get(key)?.map(|g| {
            let v = g.value();
            Arc::from(V::as_bytes(&v).as_ref())
        }))
    }

    /// Inserts `value` under `key`, returning the old value (redb's `Table::insert`).
    pub fn insert<'k, 'v>(
        &mut self,
        key: impl Borrow<K::SelfType<'k>>,
        value: impl Borrow<V::SelfType<'v>>,
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        let (key, value) = (key.borrow(), value.borrow());
        let old = match &self.inner {
            Inner::View(_) => self.get_bytes(key)?,
            Inner::Redb(_) => None,
        };
        if self.capture.is_some() {
            let (k, v) = (K::as_bytes(key), V::as_bytes(value));
            self.record(OP_PUT, k.as_ref(), Some(v.as_ref()));
        }
        match &mut self.inner {
            Inner::Redb(t) => Ok(t.insert(key, value)?.map(Guard::new)),
            Inner::View(_) => Ok(old.map(Guard::bytes)),
        }
    }

    /// Removes `key`, returning its value (redb's `Table::remove`).
    pub fn remove<'a>(
        &mut self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<Guard<'_, V>>, StorageError> {
        let key = key.borrow();
        let old = match &self.inner {
            Inner::View(_) => self.get_bytes(key)?,
            Inner::Redb(_) => None,
        };
        if self.capture.is_some() {
            let k = K::as_bytes(key);
            self.record(OP_REMOVE, k.as_ref(), None);
        }
        match &mut self.inner {
            Inner::Redb(t) => Ok(t.remove(key)?.map(Guard::new)),
            Inner::View(_) => Ok(old.map(Guard::bytes)),
        }
    }

    /// The first (or last) entry as owned bytes.
    fn end_bytes(&self, first: bool) -> Result<Option<(Bytes, Bytes)>, StorageError> {
        let end = if first { self.first()? } else { self.last()? };
        Ok(end.map(|(k, v)| {
            (
                Arc::from(K::as_bytes(&k.value()).as_ref()),
                Arc::from(V::as_bytes(&v.value()).as_ref()),
            )
        }))
    }

    /// Removes and returns the first entry (redb's `Table::pop_first`).
    pub fn pop_first(&mut self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        self.pop_end(true)
    }

    /// Removes and returns the last entry (redb's `Table::pop_last`).
    pub fn pop_last(&mut self) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        self.pop_end(false)
    }

    fn pop_end(&mut self, first: bool) -> Result<Option<Pair<'_, K, V>>, StorageError> {
        let Some((k, v)) = self.end_bytes(first)? else {
            return Ok(None);
        };
        self.record(OP_REMOVE, &k, None);
        match &mut self.inner {
            Inner::Redb(t) => {
                let popped = if first { t.pop_first()? } else { t.pop_last()? };
                Ok(popped.map(pair))
            }
            Inner::View(_) => Ok(Some(bytes_pair((k, v)))),
        }
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
        for item in self.range(range)? {
            let (k, v) = item?;
            if !predicate(k.value(), v.value()) {
                doomed.push(K::as_bytes(&k.value()).as_ref().to_vec());
            }
        }
        for k in doomed {
            self.record(OP_REMOVE, &k, None);
            if let Inner::Redb(t) = &mut self.inner {
                t.remove(K::from_bytes(&k))?;
            }
        }
        Ok(())
    }
}
