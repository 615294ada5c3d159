//! The pending set P (docs/design.md, "Claims at the speed of a log"): per table, the versions of
//! each key written by entries that are sealed but not yet applied to redb, each tagged with its
//! entry's LSN; and the merges that read layers of versions over a redb snapshot.
//!
//! Keys and values are bytes exactly as redb stores them (`redb::Value::as_bytes`). A table's keys
//! are ordered by its key type's `redb::Key::compare` on those bytes ([`Compare`]), never by the
//! bytes alone (a `u64` is stored little-endian). Keys and bounds passed in must be encodings of
//! the table's key type: redb's comparators may panic on bytes their type never writes (the
//! capture writes only such bytes, and recovery checks them before anything is applied).
//!
//! A view reads the versions with `above < lsn <= through`: a batch `(a, j]`, a reader `(a, d]`.
//! Layers read upper over lower: the batch's own writes over P ([`overlay`], removes kept), then
//! that over the snapshot ([`merge`], removes hidden).

#![cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "step 2 of the pending-set build (docs/design.md): its users come with the applier, step 3"
    )
)]

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, VecDeque, btree_map};
use std::convert::Infallible;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

/// A table's key order: its key type's `redb::Key::compare` on stored bytes ([`compare_of`]).
/// redb requires of every key type that it be a deterministic total order; P relies on it (with
/// another, reads may miss keys, and `BTreeMap` may panic).
pub(crate) type Compare = fn(&[u8], &[u8]) -> Ordering;

/// The key order of redb's key type `K`.
pub(crate) fn compare_of<K: redb::Key>() -> Compare {
    K::compare
}

/// What [`PendingSet::bytes`] counts for a version beyond its key and value: its map slot, its
/// record, the `Arc` headers and its place in the entry index (an estimate).
const VERSION_OVERHEAD: usize = 96;

/// One write of a sealed entry: a put of `value` (`Some`) or a remove (`None`) of `key` in
/// `table`, whose keys `compare` orders.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Write<'w> {
    /// The table's name.
    pub(crate) table: &'w str,
    /// The table's key order; a table keeps the one given with its first pending write.
    pub(crate) compare: Compare,
    /// The key's stored bytes.
    pub(crate) key: &'w [u8],
    /// The value's stored bytes, `None` for a remove.
    pub(crate) value: Option<&'w [u8]>,
}

/// What P says about a key for a view `(above, through]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    /// The newest version in the window: the value, or `None` for a remove.
    Pending(Option<Arc<[u8]>>),
    /// No version in the window: the layer below holds the key's state.
    NotPending,
}

/// The order a range read yields its keys in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Increasing keys.
    Forward,
    /// Decreasing keys.
    Reverse,
}

/// [`PendingSet::insert_entry`] was given an LSN not above every LSN P has seen (inserted or
/// dropped through); nothing was inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("pending set: entry {lsn} sealed after LSN {after} (LSNs must increase)")]
pub(crate) struct LsnOrder {
    /// The refused LSN.
    pub(crate) lsn: u64,
    /// The highest LSN P had seen.
    pub(crate) after: u64,
}

/// A key as a table's map orders it: its bytes under the table's comparator. `dyn OrderedKey` is
/// what the map is searched by, so a caller's bytes are looked up without being copied.
trait OrderedKey {
    fn bytes(&self) -> &[u8];
    fn compare(&self) -> Compare;
}

impl Ord for dyn OrderedKey + '_ {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.compare())(self.bytes(), other.bytes())
    }
}

impl PartialOrd for dyn OrderedKey + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for dyn OrderedKey + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for dyn OrderedKey + '_ {}

/// A key held in P. Invariant: every key of one table's map has the table's comparator, so the
/// map's order is the table's key order.
#[derive(Debug, Clone)]
struct StoredKey {
    bytes: Arc<[u8]>,
    compare: Compare,
}

impl OrderedKey for StoredKey {
    fn bytes(&self) -> &[u8] {
        &self.bytes
    }
    fn compare(&self) -> Compare {
        self.compare
    }
}

// Ordered exactly as its `dyn OrderedKey` borrow, as `Borrow` requires.
impl Ord for StoredKey {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.compare)(&self.bytes, &other.bytes)
    }
}

impl PartialOrd for StoredKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for StoredKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for StoredKey {}

impl<'a> Borrow<dyn OrderedKey + 'a> for StoredKey {
    fn borrow(&self) -> &(dyn OrderedKey + 'a) {
        self
    }
}

/// A caller's key or bound, with the comparator of the table it is looked up in.
struct Probe<'k> {
    bytes: &'k [u8],
    compare: Compare,
}

impl OrderedKey for Probe<'_> {
    fn bytes(&self) -> &[u8] {
        self.bytes
    }
    fn compare(&self) -> Compare {
        self.compare
    }
}

/// One version of a key: its entry's LSN and the value, `None` for a remove.
#[derive(Debug, Clone)]
struct Version {
    lsn: u64,
    value: Option<Arc<[u8]>>,
}

/// A table's versions. Invariant: every key has at least one version, in increasing LSN order.
#[derive(Debug)]
struct TableVersions {
    name: Arc<str>,
    compare: Compare,
    keys: BTreeMap<StoredKey, Vec<Version>>,
}

/// The keys one sealed entry wrote a version of, to drop them without scanning P.
#[derive(Debug)]
struct Sealed {
    lsn: u64,
    keys: Vec<(Arc<str>, StoredKey)>,
}

/// The newest of `versions` (increasing LSNs) in `(above, through]`.
fn visible(versions: &[Version], above: u64, through: u64) -> Option<&Version> {
    let newest = versions.iter().rev().find(|v| v.lsn <= through)?;
    (newest.lsn > above).then_some(newest)
}

fn value_len(value: &Option<Arc<[u8]>>) -> usize {
    value.as_ref().map_or(0, |v| v.len())
}

/// What [`PendingSet::bytes`] counts for a version of a `key_len`-byte key.
fn version_bytes(key_len: usize, value: &Option<Arc<[u8]>>) -> usize {
    key_len
        .saturating_add(value_len(value))
        .saturating_add(VERSION_OVERHEAD)
}

/// Whether `(start, end)` selects no key under `compare`: start after end, or an empty interval
/// at one key. redb's own range yields nothing for these; `BTreeMap::range` would panic.
pub(crate) fn bounds_are_empty(compare: Compare, start: Bound<&[u8]>, end: Bound<&[u8]>) -> bool {
    match (start, end) {
        (Bound::Unbounded, _) | (_, Bound::Unbounded) => false,
        (Bound::Included(s), Bound::Included(e)) => compare(s, e).is_gt(),
        (Bound::Included(s) | Bound::Excluded(s), Bound::Included(e) | Bound::Excluded(e)) => {
            compare(s, e).is_ge()
        }
    }
}

/// The pending set. Invariants: every version belongs to an entry in `entries`, which are in
/// increasing LSN order; `versions` and `bytes` are the sums over the versions held.
#[derive(Debug, Default)]
pub(crate) struct PendingSet {
    tables: HashMap<Arc<str>, TableVersions>,
    entries: VecDeque<Sealed>,
    /// The highest LSN inserted or dropped through: a new entry's LSN must exceed it.
    floor: u64,
    versions: usize,
    bytes: usize,
}

impl PendingSet {
    /// An empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds entry `lsn`'s writes, in the order the batch made them: a later write of a key in the
    /// same entry replaces the earlier one. `lsn` must exceed every LSN inserted or dropped
    /// through before; otherwise nothing is inserted.
    pub(crate) fn insert_entry<'w>(
        &mut self,
        lsn: u64,
        writes: impl IntoIterator<Item = Write<'w>>,
    ) -> Result<(), LsnOrder> {
        if lsn <= self.floor {
            return Err(LsnOrder {
                lsn,
                after: self.floor,
            });
        }
        self.floor = lsn;
        let mut touched = Vec::new();
        for w in writes {
            if !self.tables.contains_key(w.table) {
                let name: Arc<str> = Arc::from(w.table);
                let table = TableVersions {
                    name: name.clone(),
                    compare: w.compare,
                    keys: BTreeMap::new(),
                };
                self.tables.insert(name, table);
            }
            let Some(table) = self.tables.get_mut(w.table) else {
                continue; // inserted just above
            };
            let value: Option<Arc<[u8]>> = w.value.map(Arc::from);
            let probe = Probe {
                bytes: w.key,
                compare: table.compare,
            };
            let probe: &dyn OrderedKey = &probe;
            // A one-key range: the lookup that yields the stored key with its versions mutably.
            let found = table
                .keys
                .range_mut::<dyn OrderedKey, _>((Bound::Included(probe), Bound::Included(probe)))
                .next();
            let added = match found {
                Some((key, versions)) => match versions.last_mut() {
                    // A later write of the key in this entry replaces the earlier one.
                    Some(last) if last.lsn == lsn => {
                        self.bytes = self
                            .bytes
                            .saturating_sub(value_len(&last.value))
                            .saturating_add(value_len(&value));
                        last.value = value;
                        continue;
                    }
                    _ => {
                        let added = version_bytes(key.bytes.len(), &value);
                        versions.push(Version { lsn, value });
                        touched.push((table.name.clone(), key.clone()));
                        added
                    }
                },
                None => {
                    let key = StoredKey {
                        bytes: Arc::from(w.key),
                        compare: table.compare,
                    };
                    let added = version_bytes(key.bytes.len(), &value);
                    table.keys.insert(key.clone(), vec![Version { lsn, value }]);
                    touched.push((table.name.clone(), key));
                    added
                }
            };
            self.bytes = self.bytes.saturating_add(added);
            self.versions = self.versions.saturating_add(1);
        }
        if !touched.is_empty() {
            self.entries.push_back(Sealed { lsn, keys: touched });
        }
        Ok(())
    }

    /// The newest version of `key` in `table` with `above < lsn <= through`.
    pub(crate) fn get(&self, table: &str, key: &[u8], above: u64, through: u64) -> Lookup {
        let Some(t) = self.tables.get(table) else {
            return Lookup::NotPending;
        };
        let probe = Probe {
            bytes: key,
            compare: t.compare,
        };
        match t.keys.get(&probe as &dyn OrderedKey) {
            Some(versions) => match visible(versions, above, through) {
                Some(v) => Lookup::Pending(v.value.clone()),
                None => Lookup::NotPending,
            },
            None => Lookup::NotPending,
        }
    }

    /// The keys of `table` between `start` and `end` (in its key order) with a version in
    /// `(above, through]`, each with its newest such version (`None` for a remove), in
    /// `direction`. Empty when the bounds select nothing, whatever their order.
    pub(crate) fn range<'p>(
        &'p self,
        table: &str,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        above: u64,
        through: u64,
        direction: Direction,
    ) -> PendingRange<'p> {
        let keys = self.tables.get(table).and_then(|t| {
            if bounds_are_empty(t.compare, start, end) {
                return None;
            }
            let probe = |bytes| Probe {
                bytes,
                compare: t.compare,
            };
            let (start, end) = (start.map(probe), end.map(probe));
            let bounds: (Bound<&dyn OrderedKey>, Bound<&dyn OrderedKey>) = (
                start.as_ref().map(|p| p as &dyn OrderedKey),
                end.as_ref().map(|p| p as &dyn OrderedKey),
            );
            Some(t.keys.range::<dyn OrderedKey, _>(bounds))
        });
        PendingRange {
            keys,
            above,
            through,
            direction,
        }
    }

    /// Drops every version with LSN `<= lsn` (redb holds them and no view reads them any more),
    /// and the keys and tables left without versions.
    pub(crate) fn drop_through(&mut self, lsn: u64) {
        self.floor = self.floor.max(lsn);
        while let Some(entry) = self.entries.pop_front_if(|e| e.lsn <= lsn) {
            for (name, key) in entry.keys {
                let Some(table) = self.tables.get_mut(&*name) else {
                    continue;
                };
                if let Some(versions) = table.keys.get_mut(&key) {
                    let n = versions.partition_point(|v| v.lsn <= lsn);
                    for v in versions.drain(..n) {
                        self.versions = self.versions.saturating_sub(1);
                        self.bytes = self
                            .bytes
                            .saturating_sub(version_bytes(key.bytes.len(), &v.value));
                    }
                    if versions.is_empty() {
                        table.keys.remove(&key);
                    }
                }
                if table.keys.is_empty() {
                    self.tables.remove(&*name);
                }
            }
        }
    }

    /// Approximate memory held: key and value bytes plus a fixed overhead, per version.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The number of versions held.
    pub(crate) fn len(&self) -> usize {
        self.versions
    }

    /// Whether no version is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.versions == 0
    }
}

/// [`PendingSet::range`]'s iterator: `(key, newest visible version)`.
#[derive(Debug)]
pub(crate) struct PendingRange<'p> {
    keys: Option<btree_map::Range<'p, StoredKey, Vec<Version>>>,
    above: u64,
    through: u64,
    direction: Direction,
}

impl Iterator for PendingRange<'_> {
    type Item = (Arc<[u8]>, Option<Arc<[u8]>>);

    fn next(&mut self) -> Option<Self::Item> {
        let keys = self.keys.as_mut()?;
        loop {
            let (key, versions) = match self.direction {
                Direction::Forward => keys.next()?,
                Direction::Reverse => keys.next_back()?,
            };
            if let Some(v) = visible(versions, self.above, self.through) {
                return Some((key.bytes.clone(), v.value.clone()));
            }
        }
    }
}

/// Which layer's next item [`Layered`] yields.
enum Take {
    Upper,
    Lower,
    /// Equal keys: the upper version, the lower one skipped.
    Both,
}

/// An upper layer over a lower one, removes kept. Precondition: each layer's keys are strictly
/// in `direction`'s order under `compare`; otherwise the output is out of order (no panic).
struct Layered<U: Iterator, L: Iterator> {
    upper: Peekable<U>,
    lower: Peekable<L>,
    compare: Compare,
    direction: Direction,
}

impl<K, V, E, U, L> Iterator for Layered<U, L>
where
    K: AsRef<[u8]>,
    U: Iterator<Item = (K, Option<V>)>,
    L: Iterator<Item = Result<(K, Option<V>), E>>,
{
    type Item = Result<(K, Option<V>), E>;

    fn next(&mut self) -> Option<Self::Item> {
        let take = match (self.upper.peek(), self.lower.peek()) {
            // An error is passed on where it is met.
            (_, Some(Err(_))) | (None, _) => Take::Lower,
            (Some(_), None) => Take::Upper,
            (Some((u, _)), Some(Ok((l, _)))) => {
                let order = (self.compare)(u.as_ref(), l.as_ref());
                let order = match self.direction {
                    Direction::Forward => order,
                    Direction::Reverse => order.reverse(),
                };
                match order {
                    Ordering::Less => Take::Upper,
                    Ordering::Greater => Take::Lower,
                    Ordering::Equal => Take::Both,
                }
            }
        };
        match take {
            Take::Upper => self.upper.next().map(Ok),
            Take::Lower => self.lower.next(),
            Take::Both => {
                self.lower.next();
                self.upper.next().map(Ok)
            }
        }
    }
}

/// `upper` over `lower`, both `(key, version)` strictly in `direction`'s order under `compare`
/// (`None` is a remove): each key once, with the upper version where both have one. Removes are
/// kept, so the result can be a layer of [`merge`] or of another overlay.
pub(crate) fn overlay<K: AsRef<[u8]>, V>(
    upper: impl IntoIterator<Item = (K, Option<V>)>,
    lower: impl IntoIterator<Item = (K, Option<V>)>,
    compare: Compare,
    direction: Direction,
) -> impl Iterator<Item = (K, Option<V>)> {
    Layered {
        upper: upper.into_iter().peekable(),
        lower: lower.into_iter().map(Ok::<_, Infallible>).peekable(),
        compare,
        direction,
    }
    .map(|r| match r {
        Ok(item) => item,
        Err(never) => match never {},
    })
}

/// `upper` (versions, `None` a remove) over `lower` (a snapshot's entries, e.g. a redb range
/// mapped to bytes), both strictly in `direction`'s order under `compare`: each live key once,
/// with the upper version where both have one; a key the upper layer removes is left out.
/// `lower`'s errors are passed on where they are met.
pub(crate) fn merge<K: AsRef<[u8]>, V, E>(
    upper: impl IntoIterator<Item = (K, Option<V>)>,
    lower: impl IntoIterator<Item = Result<(K, V), E>>,
    compare: Compare,
    direction: Direction,
) -> impl Iterator<Item = Result<(K, V), E>> {
    Layered {
        upper: upper.into_iter().peekable(),
        lower: lower
            .into_iter()
            .map(|r| r.map(|(k, v)| (k, Some(v))))
            .peekable(),
        compare,
        direction,
    }
    .filter_map(|r| match r {
        Ok((k, Some(v))) => Some(Ok((k, v))),
        Ok((_, None)) => None,
        Err(e) => Some(Err(e)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Key, ReadableDatabase, ReadableTable, TableDefinition, Value};

    /// splitmix64: the random tests' deterministic stream.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        /// Uniform in `lo..=hi`.
        fn within(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.next() % (hi - lo + 1)
        }
    }

    /// A model key. One table's keys are all one variant, so the derived order is the typed
    /// order redb's comparator must give on their bytes.
    #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
    enum TKey {
        U(u64),
        S(String),
        Pair(u32, String),
    }

    fn to_vec(bytes: impl AsRef<[u8]>) -> Vec<u8> {
        bytes.as_ref().to_vec()
    }

    impl TKey {
        fn encode(&self) -> Vec<u8> {
            match self {
                TKey::U(n) => to_vec(<u64 as Value>::as_bytes(n)),
                TKey::S(s) => to_vec(<&str as Value>::as_bytes(&s.as_str())),
                TKey::Pair(n, s) => to_vec(<(u32, &str) as Value>::as_bytes(&(*n, s.as_str()))),
            }
        }
    }

    /// The tables: `u64` keys (little-endian, so byte order is not key order), `&str` keys and
    /// `(u32, &str)` keys.
    fn tables() -> [(&'static str, Compare); 3] {
        [
            ("u64", compare_of::<u64>()),
            ("str", compare_of::<&str>()),
            ("pair", <(u32, &str) as Key>::compare),
        ]
    }

    const U64S: [u64; 11] = [
        0,
        1,
        2,
        255,
        256,
        257,
        511,
        65_536,
        1 << 32,
        1 << 40,
        u64::MAX,
    ];
    const STRS: [&str; 7] = ["", "a", "aa", "ab", "b", "ba", "é"];

    fn random_key(rng: &mut Rng, table: usize) -> TKey {
        match table {
            0 => TKey::U(U64S[rng.below(U64S.len())]),
            1 => TKey::S(STRS[rng.below(STRS.len())].to_owned()),
            _ => TKey::Pair([1, 2, 256][rng.below(3)], STRS[rng.below(4)].to_owned()),
        }
    }

    /// A put (an empty value is a put too) or, one time in three, a remove.
    fn random_value(rng: &mut Rng) -> Option<Vec<u8>> {
        (rng.below(3) != 0).then(|| vec![rng.below(256) as u8; rng.below(4)])
    }

    fn random_bound(rng: &mut Rng, table: usize) -> Bound<TKey> {
        match rng.below(3) {
            0 => Bound::Unbounded,
            1 => Bound::Included(random_key(rng, table)),
            _ => Bound::Excluded(random_key(rng, table)),
        }
    }

    fn in_bounds(k: &TKey, start: &Bound<TKey>, end: &Bound<TKey>) -> bool {
        let above_start = match start {
            Bound::Included(s) => k >= s,
            Bound::Excluded(s) => k > s,
            Bound::Unbounded => true,
        };
        above_start
            && match end {
                Bound::Included(e) => k <= e,
                Bound::Excluded(e) => k < e,
                Bound::Unbounded => true,
            }
    }

    type State = Vec<BTreeMap<TKey, Vec<u8>>>;
    type Writes = Vec<(usize, TKey, Option<Vec<u8>>)>;
    type Bytes = Arc<[u8]>;

    fn apply(state: &mut State, writes: &Writes) {
        for (t, k, v) in writes {
            match v {
                Some(v) => state[*t].insert(k.clone(), v.clone()),
                None => state[*t].remove(k),
            };
        }
    }

    /// The model: the snapshot S(a) and the entries in `(a, j]`.
    struct Model {
        snapshot: State,
        entries: Vec<(u64, Writes)>,
        applied: u64,
        sealed: u64,
    }

    impl Model {
        fn new() -> Self {
            Model {
                snapshot: vec![BTreeMap::new(); 3],
                entries: Vec::new(),
                applied: 0,
                sealed: 0,
            }
        }

        fn state_through(&self, through: u64) -> State {
            let mut s = self.snapshot.clone();
            for (_, w) in self.entries.iter().filter(|(lsn, _)| *lsn <= through) {
                apply(&mut s, w);
            }
            s
        }

        /// Table `t`'s keys written in `(above, through]`, each with its newest version there:
        /// what P's reads of that window must give.
        fn window(&self, t: usize, above: u64, through: u64) -> BTreeMap<TKey, Option<Vec<u8>>> {
            let mut w = BTreeMap::new();
            for (_, writes) in self
                .entries
                .iter()
                .filter(|(lsn, _)| (above + 1..=through).contains(lsn))
            {
                for (_, k, v) in writes.iter().filter(|(wt, _, _)| *wt == t) {
                    w.insert(k.clone(), v.clone());
                }
            }
            w
        }

        /// Seals a random entry into both the model and `p`; returns its writes.
        fn seal(&mut self, rng: &mut Rng, p: &mut PendingSet, among: &[usize]) -> Writes {
            let lsn = self.sealed + 1 + u64::from(rng.below(10) == 0); // sometimes a gap
            let writes: Writes = (0..rng.below(7))
                .map(|_| {
                    let t = among[rng.below(among.len())];
                    (t, random_key(rng, t), random_value(rng))
                })
                .collect();
            let encoded: Vec<_> = writes.iter().map(|(_, k, _)| k.encode()).collect();
            let all = tables();
            let ws = writes.iter().zip(&encoded).map(|((t, _, v), kb)| Write {
                table: all[*t].0,
                compare: all[*t].1,
                key: kb,
                value: v.as_deref(),
            });
            assert_eq!(p.insert_entry(lsn, ws), Ok(()));
            self.sealed = lsn;
            self.entries.push((lsn, writes.clone()));
            writes
        }

        /// Drops through a random LSN in `[a, j]` from both; returns the entries dropped.
        fn drop_random(&mut self, rng: &mut Rng, p: &mut PendingSet) -> Vec<(u64, Writes)> {
            let to = rng.within(self.applied, self.sealed);
            p.drop_through(to);
            let (done, rest) = self.entries.drain(..).partition(|(lsn, _)| *lsn <= to);
            self.entries = rest;
            for (_, w) in &done {
                apply(&mut self.snapshot, w);
            }
            self.applied = to;
            done
        }

        /// `p.len()` and `p.bytes()` as the entries in `(a, j]` say.
        fn check_counts(&self, p: &PendingSet) {
            let (mut len, mut bytes) = (0, 0);
            for (_, writes) in &self.entries {
                let mut last = BTreeMap::new();
                for (t, k, v) in writes {
                    last.insert((*t, k.clone()), v.clone());
                }
                len += last.len();
                for ((_, k), v) in last {
                    bytes += k.encode().len() + v.map_or(0, |v| v.len()) + VERSION_OVERHEAD;
                }
            }
            assert_eq!((p.len(), p.bytes(), p.is_empty()), (len, bytes, len == 0));
        }
    }

    fn bytes_bound(b: &Bound<TKey>) -> Bound<Vec<u8>> {
        b.as_ref().map(TKey::encode)
    }

    /// A model map's entries within the bounds in `direction`'s order (the typed order), keys
    /// encoded.
    fn model_range<T: Clone>(
        map: &BTreeMap<TKey, T>,
        start: &Bound<TKey>,
        end: &Bound<TKey>,
        direction: Direction,
    ) -> Vec<(Vec<u8>, T)> {
        let mut v: Vec<_> = map
            .iter()
            .filter(|(k, _)| in_bounds(k, start, end))
            .map(|(k, x)| (k.encode(), x.clone()))
            .collect();
        if direction == Direction::Reverse {
            v.reverse();
        }
        v
    }

    fn plain(
        items: impl Iterator<Item = Result<(Bytes, Bytes), Infallible>>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        items
            .map(|r| match r {
                Ok((k, v)) => (k.to_vec(), v.to_vec()),
                Err(never) => match never {},
            })
            .collect()
    }

    #[test]
    fn reads_over_a_snapshot_match_the_model() {
        let all = tables();
        for seed in 1..=4u64 {
            let mut rng = Rng(seed);
            let mut p = PendingSet::new();
            let mut m = Model::new();
            for _ in 0..2_500 {
                match rng.below(100) {
                    0..35 => drop(m.seal(&mut rng, &mut p, &[0, 1, 2])),
                    35..47 => drop(m.drop_random(&mut rng, &mut p)),
                    47..50 => {
                        let lsn = rng.within(0, m.sealed.max(m.applied));
                        let w = Write {
                            table: "u64",
                            compare: all[0].1,
                            key: &[0; 8],
                            value: None,
                        };
                        let (len, bytes) = (p.len(), p.bytes());
                        assert!(p.insert_entry(lsn, [w]).is_err());
                        assert_eq!((p.len(), p.bytes()), (len, bytes));
                    }
                    _ => {
                        let through = rng.within(m.applied, m.sealed);
                        let above = rng.within(m.applied, through);
                        let lower_state = m.state_through(above);
                        let expected = m.state_through(through);
                        let t = rng.below(3);
                        let (name, compare) = all[t];
                        // A batch's own writes, a third layer over P.
                        let mut batch: BTreeMap<TKey, Option<Vec<u8>>> = BTreeMap::new();
                        for _ in 0..rng.below(4) {
                            batch.insert(random_key(&mut rng, t), random_value(&mut rng));
                        }
                        let window = m.window(t, above, through);
                        for _ in 0..3 {
                            let k = random_key(&mut rng, t);
                            let kb = k.encode();
                            let lookup = p.get(name, &kb, above, through);
                            let in_window = window.get(&k).map(|v| v.as_deref().map(Bytes::from));
                            assert_eq!(
                                lookup,
                                in_window.map_or(Lookup::NotPending, Lookup::Pending)
                            );
                            let got = match lookup {
                                Lookup::Pending(v) => v.map(|v| v.to_vec()),
                                Lookup::NotPending => lower_state[t].get(&k).cloned(),
                            };
                            assert_eq!(
                                got,
                                expected[t].get(&k).cloned(),
                                "get {k:?} in ({above}, {through}]"
                            );
                        }
                        let (start, end) = (random_bound(&mut rng, t), random_bound(&mut rng, t));
                        let (sb, eb) = (bytes_bound(&start), bytes_bound(&end));
                        let (sb, eb) = (
                            sb.as_ref().map(Vec::as_slice),
                            eb.as_ref().map(Vec::as_slice),
                        );
                        let mut composed = expected.clone();
                        for (k, v) in &batch {
                            apply(&mut composed, &vec![(t, k.clone(), v.clone())]);
                        }
                        for direction in [Direction::Forward, Direction::Reverse] {
                            let lower = model_range(&lower_state[t], &start, &end, direction)
                                .into_iter()
                                .map(|(k, v)| Ok((Bytes::from(k), Bytes::from(v))));
                            let pending = p.range(name, sb, eb, above, through, direction);
                            let versions: Vec<_> = pending
                                .map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec())))
                                .collect();
                            assert_eq!(versions, model_range(&window, &start, &end, direction));
                            let pending = p.range(name, sb, eb, above, through, direction);
                            let got = plain(merge(pending, lower.clone(), compare, direction));
                            let want = model_range(&expected[t], &start, &end, direction);
                            assert_eq!(
                                got, want,
                                "range {start:?}..{end:?} {direction:?} in ({above}, {through}]"
                            );

                            let own = model_range(&batch, &start, &end, direction)
                                .into_iter()
                                .map(|(k, v)| (Bytes::from(k), v.map(Bytes::from)));
                            let pending = p.range(name, sb, eb, above, through, direction);
                            let upper = overlay(own, pending, compare, direction);
                            let got = plain(merge(upper, lower, compare, direction));
                            let want = model_range(&composed[t], &start, &end, direction);
                            assert_eq!(
                                got, want,
                                "batch over P over S, {start:?}..{end:?} {direction:?}"
                            );
                        }
                    }
                }
                m.check_counts(&p);
            }
            m.drop_random(&mut rng, &mut p);
            p.drop_through(m.sealed);
            assert!(p.is_empty() && p.bytes() == 0 && p.tables.is_empty() && p.entries.is_empty());
        }
    }

    #[test]
    fn merge_over_a_real_redb_snapshot_matches_the_model() {
        const TABLE: TableDefinition<u64, &[u8]> = TableDefinition::new("u64");
        let u = |k: &TKey| match k {
            TKey::U(n) => *n,
            _ => unreachable!("the u64 table"),
        };
        let db = redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .unwrap();
        let tx = db.begin_write().unwrap();
        drop(tx.open_table(TABLE).unwrap());
        tx.commit().unwrap();
        let mut rng = Rng(7);
        let mut p = PendingSet::new();
        let mut m = Model::new();
        let compare = compare_of::<u64>();
        for _ in 0..600 {
            match rng.below(10) {
                0..4 => drop(m.seal(&mut rng, &mut p, &[0])),
                4..6 => {
                    // The applier's copy: entries up to the new `a` into redb.
                    let tx = db.begin_write().unwrap();
                    {
                        let mut table = tx.open_table(TABLE).unwrap();
                        for (_, writes) in m.drop_random(&mut rng, &mut p) {
                            for (_, k, v) in writes {
                                match v {
                                    Some(v) => drop(table.insert(u(&k), v.as_slice()).unwrap()),
                                    None => drop(table.remove(u(&k)).unwrap()),
                                }
                            }
                        }
                    }
                    tx.commit().unwrap();
                }
                _ => {
                    let through = rng.within(m.applied, m.sealed);
                    let expected = m.state_through(through);
                    let (start, end) = (random_bound(&mut rng, 0), random_bound(&mut rng, 0));
                    let (sb, eb) = (bytes_bound(&start), bytes_bound(&end));
                    let (sb, eb) = (
                        sb.as_ref().map(Vec::as_slice),
                        eb.as_ref().map(Vec::as_slice),
                    );
                    let rtx = db.begin_read().unwrap();
                    let table = rtx.open_table(TABLE).unwrap();
                    for direction in [Direction::Forward, Direction::Reverse] {
                        // redb yields nothing when start is after end, as `range` does.
                        let range = table
                            .range((start.as_ref().map(u), end.as_ref().map(u)))
                            .unwrap();
                        let snapshot: Box<dyn Iterator<Item = _>> = match direction {
                            Direction::Forward => Box::new(range),
                            Direction::Reverse => Box::new(range.rev()),
                        };
                        let lower = snapshot.map(|r| {
                            r.map(|(k, v)| {
                                (
                                    Bytes::from(to_vec(<u64 as Value>::as_bytes(&k.value()))),
                                    Bytes::from(v.value()),
                                )
                            })
                        });
                        let pending = p.range("u64", sb, eb, m.applied, through, direction);
                        let got: Vec<_> = merge(pending, lower, compare, direction)
                            .map(|r| r.map(|(k, v)| (k.to_vec(), v.to_vec())))
                            .collect::<Result<_, redb::StorageError>>()
                            .unwrap();
                        let want = model_range(&expected[0], &start, &end, direction);
                        assert_eq!(
                            got, want,
                            "{start:?}..{end:?} {direction:?} through {through}"
                        );
                    }
                }
            }
        }
    }

    fn put(p: &mut PendingSet, lsn: u64, key: u64, value: Option<&[u8]>) {
        let key = key.to_le_bytes();
        let w = Write {
            table: "t",
            compare: compare_of::<u64>(),
            key: &key,
            value,
        };
        assert_eq!(p.insert_entry(lsn, [w]), Ok(()));
    }

    fn keys(
        p: &PendingSet,
        start: Bound<u64>,
        end: Bound<u64>,
        direction: Direction,
    ) -> Vec<(u64, Option<Vec<u8>>)> {
        let (s, e) = (start.map(u64::to_le_bytes), end.map(u64::to_le_bytes));
        p.range(
            "t",
            s.as_ref().map(|b| &b[..]),
            e.as_ref().map(|b| &b[..]),
            0,
            u64::MAX,
            direction,
        )
        .map(|(k, v)| {
            (
                u64::from_le_bytes(k[..].try_into().unwrap()),
                v.map(|v| v.to_vec()),
            )
        })
        .collect()
    }

    #[test]
    fn edge_cases() {
        use Bound::{Excluded, Included, Unbounded};
        use Direction::{Forward, Reverse};
        let mut p = PendingSet::new();
        assert_eq!(keys(&p, Unbounded, Unbounded, Forward), vec![]);
        put(&mut p, 1, 1, Some(b"one"));
        put(&mut p, 2, 256, Some(b"big"));
        put(&mut p, 3, 2, None);
        // Key order, not byte order: 256 is [0, 1, ..] little-endian, below 1's bytes.
        let all = vec![
            (1, Some(b"one".to_vec())),
            (2, None),
            (256, Some(b"big".to_vec())),
        ];
        assert_eq!(keys(&p, Unbounded, Unbounded, Forward), all);
        let mut rev = all.clone();
        rev.reverse();
        assert_eq!(keys(&p, Unbounded, Unbounded, Reverse), rev);
        // Empty and reversed bounds yield nothing and do not panic.
        for (s, e) in [
            (Included(5), Included(4)),
            (Excluded(5), Excluded(5)),
            (Included(5), Excluded(5)),
            (Excluded(5), Included(5)),
            (Included(256), Included(1)),
            (Excluded(1), Excluded(2)),
        ] {
            assert_eq!(keys(&p, s, e, Forward), vec![]);
            assert_eq!(keys(&p, s, e, Reverse), vec![]);
        }
        assert_eq!(keys(&p, Included(2), Included(2), Forward), vec![(2, None)]);
        assert_eq!(
            keys(&p, Excluded(1), Unbounded, Reverse),
            vec![(256, Some(b"big".to_vec())), (2, None)]
        );
        // A window with `above == through` sees nothing; one without a version neither.
        assert_eq!(p.get("t", &1u64.to_le_bytes(), 1, 1), Lookup::NotPending);
        assert_eq!(
            p.get("t", &1u64.to_le_bytes(), 0, 1),
            Lookup::Pending(Some(Arc::from(&b"one"[..])))
        );
        assert_eq!(p.get("t", &256u64.to_le_bytes(), 0, 1), Lookup::NotPending);
        assert_eq!(
            p.get("other", &1u64.to_le_bytes(), 0, 9),
            Lookup::NotPending
        );
        // A remove in P hides the snapshot's key; the snapshot's error is passed on where it is
        // met, before the upper keys after it.
        let snapshot = [(2u64, "s2"), (3, "s3")].map(|(k, v)| {
            Ok::<_, &str>((Bytes::from(&k.to_le_bytes()[..]), Bytes::from(v.as_bytes())))
        });
        let pending = p.range("t", Unbounded, Unbounded, 0, 3, Forward);
        let got: Vec<_> = merge(
            pending,
            snapshot.into_iter().chain([Err("io")]),
            compare_of::<u64>(),
            Forward,
        )
        .collect();
        let k = |n: u64| Bytes::from(&n.to_le_bytes()[..]);
        assert_eq!(
            got,
            vec![
                Ok((k(1), Bytes::from(&b"one"[..]))),
                Ok((k(3), Bytes::from(&b"s3"[..]))),
                Err("io"),
                Ok((k(256), Bytes::from(&b"big"[..]))),
            ]
        );
        // A later write of a key in the same entry wins.
        let key = 9u64.to_le_bytes();
        let w = |value| Write {
            table: "t",
            compare: compare_of::<u64>(),
            key: &key,
            value,
        };
        p.insert_entry(4, [w(Some(b"a")), w(None), w(Some(b"last"))])
            .unwrap();
        assert_eq!(
            p.get("t", &key, 3, 4),
            Lookup::Pending(Some(Arc::from(&b"last"[..])))
        );
        assert_eq!(p.len(), 4);
        assert_eq!(p.bytes(), 4 * (8 + VERSION_OVERHEAD) + 3 + 3 + 4);
        // LSNs must increase.
        assert_eq!(
            p.insert_entry(4, [w(None)]),
            Err(LsnOrder { lsn: 4, after: 4 })
        );
        p.drop_through(2);
        assert_eq!(
            keys(&p, Unbounded, Unbounded, Forward),
            vec![(2, None), (9, Some(b"last".to_vec()))]
        );
        // Past every version: empty, and the floor moved.
        p.drop_through(100);
        assert!(p.is_empty() && p.bytes() == 0 && p.tables.is_empty());
        assert_eq!(keys(&p, Unbounded, Unbounded, Forward), vec![]);
        assert!(p.insert_entry(100, [w(None)]).is_err());
        assert_eq!(p.insert_entry(101, []), Ok(()));
        assert!(p.is_empty());
    }
}
