//! The expiry index: one entry per stored record, ordered by the instant the sweep next has
//! work on it, so a sweep is a range scan from the start of the table.
//!
//! Entry key (docs/FORMAT.md, "Expiry index"): `u64be(due) ‖ kind ‖ key`, value: the record's
//! state tag. `kind` names the table the key belongs to (`0x01`: `idem.records.v1`), so other
//! kinds of expiring entries (e.g. inbox records) can share the index and the sweep.
//!
//! Every record write goes through [`put_in`] / [`remove_in`], which update the index in the
//! same transaction; the old entry is found from the value being replaced, never from what the
//! caller believes was stored.

use std::collections::{HashMap, HashSet};

use redb::{ReadableTable, ReadableTableMetadata, StorageError};

use crate::engine::boundary::unlatched;
use crate::engine::marks::{KIND_MARK, expected_mark_entries};
use crate::engine::store::Store;
use crate::engine::tables::{EXPIRY, RECORDS};
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::keys::hex;
use crate::model::record::Record;
use crate::model::reports::Stats;
use crate::model::rules::sweep_due;
use crate::runtime::observe;

/// Entry kind of an idempotency record (its key is in `idem.records.v1`).
pub(crate) const KIND_RECORD: u8 = 0x01;

/// Bytes before the target key: the due instant and the kind.
const ENTRY_HEADER: usize = 9;

pub(crate) type RecordsTable<'t> = crate::engine::journal::Table<'t, &'static [u8], &'static [u8]>;
pub(crate) type ExpiryTable<'t> = crate::engine::journal::Table<'t, &'static [u8], u8>;

/// `u64be(due) ‖ kind ‖ key`.
pub(crate) fn entry_key(due: Timestamp, kind: u8, key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ENTRY_HEADER + key.len());
    out.extend_from_slice(&due.0.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(key);
    out
}

/// An index entry, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    pub due: Timestamp,
    pub kind: u8,
    pub key: &'a [u8],
}

/// Parses an entry key; `None` if it is too short to hold a due instant, a kind and a key.
pub(crate) fn parse_entry(bytes: &[u8]) -> Option<Entry<'_>> {
    let (due, rest) = bytes.split_first_chunk::<8>()?;
    let (&kind, key) = rest.split_first()?;
    if key.is_empty() {
        return None;
    }
    Some(Entry {
        due: Timestamp(u64::from_be_bytes(*due)),
        kind,
        key,
    })
}

/// The index entry a record must have.
pub(crate) fn record_entry(record: &Record, key: &[u8]) -> Vec<u8> {
    entry_key(sweep_due(record), KIND_RECORD, key)
}

/// Writes `record` under `key` and moves its index entry, in the tables' transaction.
pub(crate) fn put_in(
    records: &mut RecordsTable<'_>,
    expiry: &mut ExpiryTable<'_>,
    key: &[u8],
    record: &Record,
) -> Result<(), StorageError> {
    let entry = record_entry(record, key);
    // A replaced value that does not decode has an entry we cannot locate: it stays until the
    // sweep reaches it and drops it as an orphan.
    let old_entry = records
        .insert(key, record.encode().as_slice())?
        .and_then(|old| Record::decode(old.value()).ok())
        .map(|old| record_entry(&old, key));
    if let Some(old) = old_entry
        && old != entry
    {
        expiry.remove(old.as_slice())?;
    }
    expiry.insert(entry.as_slice(), record.state.tag())?;
    Ok(())
}

/// Removes the record under `key` and its index entry; returns whether a record existed.
pub(crate) fn remove_in(
    records: &mut RecordsTable<'_>,
    expiry: &mut ExpiryTable<'_>,
    key: &[u8],
) -> Result<bool, StorageError> {
    let Some(old) = records
        .remove(key)?
        .map(|old| Record::decode(old.value()).ok())
    else {
        return Ok(false);
    };
    if let Some(old) = old {
        expiry.remove(record_entry(&old, key).as_slice())?;
    }
    Ok(true)
}

impl Store {
    /// Counts the records by stored state, with one pass over the expiry index in a read
    /// transaction (O(records), about 50 bytes read per record, no record decoded; writers are
    /// not blocked). A record is counted in the state it is stored in: a Completed record past
    /// its response window counts as completed (and `due`) until a sweep shrinks it.
    pub fn stats(&self) -> Result<Stats, Error> {
        let now = self.now();
        self.read("counting the records", |read| stats_in(read, now))
            .inspect(observe::records)
    }

    /// Checks that the expiry index matches the records exactly: every record that decodes has
    /// exactly one entry, at [`crate::model::rules::sweep_due`] with its state tag, and every entry
    /// belongs to a record or a mark (entries of records and marks that no longer decode are
    /// tolerated). Returns a
    /// description of the first mismatches. O(records) time and memory: for tests and fuzzers.
    #[doc(hidden)]
    #[cfg(feature = "__internal_whitebox")]
    pub fn check_expiry_index(&self) -> Result<(), String> {
        self.expiry_index_verdict()
            .unwrap_or_else(|e| Err(e.to_string()))
    }

    /// The expiry-index check with its two kinds of failure apart: `Ok(Err(mismatches))` when
    /// the index disagrees with the records, `Err` when reading them failed (a storage error, or
    /// a panic contained as [`Error::CorruptStore`]).
    pub(crate) fn expiry_index_verdict(&self) -> Result<Result<(), String>, Error> {
        self.read("checking the expiry index", check_expiry_index_in)
    }
}

/// The expiry-index check of [`Store::expiry_index_verdict`], from a read transaction.
fn check_expiry_index_in(read: &redb::ReadTransaction) -> Result<Result<(), String>, Error> {
    let records = read.open_table(RECORDS).map_err(unlatched)?;
    let expiry = read.open_table(EXPIRY).map_err(unlatched)?;
    let mut expected: HashMap<Vec<u8>, u8> = HashMap::new();
    let mut undecodable: HashSet<Vec<u8>> = HashSet::new();
    for row in records.iter().map_err(unlatched)? {
        let (key, value) = row.map_err(unlatched)?;
        match Record::decode(value.value()) {
            Ok(r) => {
                expected.insert(record_entry(&r, key.value()), r.state.tag());
            }
            Err(_) => {
                undecodable.insert(key.value().to_vec());
            }
        }
    }
    let (mark_entries, marks_undecodable) = expected_mark_entries(read).map_err(unlatched)?;
    for (entry, tag) in mark_entries {
        expected.insert(entry, tag);
    }
    let marks_undecodable: HashSet<Vec<u8>> = marks_undecodable.into_iter().collect();
    let mut problems = Vec::new();
    for row in expiry.iter().map_err(unlatched)? {
        let (key, tag) = row.map_err(unlatched)?;
        let entry = key.value();
        match expected.remove(entry) {
            Some(t) if t == tag.value() => {}
            Some(t) => problems.push(format!(
                "entry {} has state tag {} but its record's state is {t}",
                hex(entry),
                tag.value()
            )),
            None => match parse_entry(entry) {
                Some(e) if e.kind == KIND_RECORD && undecodable.contains(e.key) => {}
                Some(e) if e.kind == KIND_MARK && marks_undecodable.contains(e.key) => {}
                _ => problems.push(format!(
                    "orphan entry {} (no record has this due instant)",
                    hex(entry)
                )),
            },
        }
    }
    for entry in expected.keys() {
        problems.push(format!("record without its entry {}", hex(entry)));
    }
    if problems.is_empty() {
        return Ok(Ok(()));
    }
    let n = problems.len();
    problems.truncate(10);
    Ok(Err(format!(
        "{n} expiry index mismatches, first: {}",
        problems.join("; ")
    )))
}

/// [`Store::stats`] from a read transaction (a [`Store`] or a [`crate::store::ReadOnlyStore`]).
pub(crate) fn stats_in(read: &redb::ReadTransaction, now: Timestamp) -> Result<Stats, Error> {
    let records = read.open_table(RECORDS).map_err(unlatched)?;
    let expiry = read.open_table(EXPIRY).map_err(unlatched)?;
    let mut stats = Stats {
        records: records.len().map_err(unlatched)?,
        ..Stats::default()
    };
    for row in expiry.iter().map_err(unlatched)? {
        let (key, tag) = row.map_err(unlatched)?;
        let Some(entry) = parse_entry(key.value()) else {
            continue;
        };
        if entry.kind != KIND_RECORD {
            continue;
        }
        match tag.value() {
            0 => stats.pending += 1,
            1 => stats.completed += 1,
            2 => stats.failed += 1,
            3 => stats.tombstones += 1,
            _ => continue,
        }
        if entry.due <= now {
            stats.due += 1;
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_sort_by_due_then_kind_then_key() {
        let a = entry_key(Timestamp(5), KIND_RECORD, b"zz");
        let b = entry_key(Timestamp(6), KIND_RECORD, b"aa");
        let c = entry_key(Timestamp(256), KIND_RECORD, b"aa");
        assert!(a < b && b < c, "big-endian instants sort numerically");
        assert_eq!(
            parse_entry(&c),
            Some(Entry {
                due: Timestamp(256),
                kind: KIND_RECORD,
                key: b"aa"
            })
        );
        assert_eq!(parse_entry(&c[..9]), None);
        assert_eq!(parse_entry(b"short"), None);
    }
}
