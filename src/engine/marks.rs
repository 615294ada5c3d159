//! Marks: the engine's second kind of expiring row, next to records. A mark says that a message
//! (an inbox message, a webhook delivery) was processed, when, until when it is remembered, and
//! the response of a first handling that was a terminal rejection. It is a row of
//! `idem.inbox.v2` ([`INBOX`]) under a key the layer above chooses (`messaging/inbox.rs` builds
//! it from a namespace, a subscriber or source, and a message or delivery id), written in the
//! same write transaction as the consumer's own writes.
//!
//! Each mark has an entry of kind [`KIND_MARK`] in the expiry index at its `forget_at`, so
//! [`crate::Store::sweep`] removes it after the inbox retention like any expired record, and
//! `check_expiry_index` checks it like a record's. This file owns a mark's storage and its index
//! entry; its value and byte layout are the model's (`model/marks.rs`), the rule of when it is
//! forgotten too (`model/rules/inbox.rs`); the inbox and webhook-receipt API is built on it in
//! `messaging/inbox.rs`.

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::expiry::{ExpiryTable, entry_key};
use crate::engine::journal::Wtx;
use crate::engine::store::Store;
use crate::engine::tables::{EXPIRY, INBOX, open_optional};
use crate::error::Error;
use crate::model::clock::Timestamp;
use crate::model::marks::Mark;
use crate::model::rules::inbox::is_mark_forgotten;

/// Expiry-index entry kind of a mark (its key is in `idem.inbox.v2`).
pub(crate) const KIND_MARK: u8 = 0x02;

/// The state tag stored with a mark's entry in the expiry index.
const MARK_TAG: u8 = 0;

impl Store {
    /// The mark stored under `key`, from a read transaction.
    pub(crate) fn read_mark(&self, key: &[u8]) -> Result<Option<Mark>, Error> {
        self.read("reading an inbox mark", |read| {
            let Some(table) = open_optional(read, INBOX).map_err(unlatched)? else {
                return Ok(None);
            };
            let value = table.get(key).map_err(unlatched)?;
            value.map(|v| Mark::decode(v.value())).transpose()
        })
    }

    /// The mark stored under `key`, inside `txn`.
    pub(crate) fn load_mark(&self, txn: &Wtx<'_>, key: &[u8]) -> Result<Option<Mark>, Error> {
        let table = txn.open_table(INBOX).map_err(|e| self.storage(e))?;
        let value = table.get(key).map_err(|e| self.storage(e))?;
        value.map(|v| Mark::decode(v.value())).transpose()
    }

    /// Writes a mark and moves its expiry-index entry, in `txn`.
    pub(crate) fn put_mark(&self, txn: &Wtx<'_>, key: &[u8], mark: &Mark) -> Result<(), Error> {
        self.with_latch(|| {
            let mut inbox = txn.open_table(INBOX)?;
            let mut expiry = txn.open_table(EXPIRY)?;
            let old = inbox
                .insert(key, mark.encode().as_slice())?
                // Only reached after `load_mark` decoded the old mark (or found none).
                .and_then(|v| Mark::decode(v.value()).ok());
            if let Some(old) = old {
                expiry.remove(entry_key(old.forget_at, KIND_MARK, key).as_slice())?;
            }
            expiry.insert(
                entry_key(mark.forget_at, KIND_MARK, key).as_slice(),
                MARK_TAG,
            )?;
            Ok(())
        })
    }

    /// Removes the mark under `key`, whatever it holds, and its expiry-index entry if the mark
    /// decodes (an undecodable mark's entry is dropped by the sweep); returns whether one
    /// existed.
    pub(crate) fn remove_mark(&self, txn: &Wtx<'_>, key: &[u8]) -> Result<bool, Error> {
        self.with_latch(|| {
            let mut inbox = txn.open_table(INBOX)?;
            let old = inbox.remove(key)?.map(|v| v.value().to_vec());
            let Some(old) = old else { return Ok(false) };
            if let Ok(mark) = Mark::decode(&old) {
                let mut expiry = txn.open_table(EXPIRY)?;
                expiry.remove(entry_key(mark.forget_at, KIND_MARK, key).as_slice())?;
            }
            Ok(true)
        })
    }
}

/// What the sweep did with one due mark entry.
pub(crate) enum MarkSweep {
    /// The mark was past `forget_at`: mark and entry deleted.
    Deleted,
    /// The entry did not match its mark (none, undecodable, or another instant): fixed.
    Repaired,
    /// Not due at `now` (the clock went back): stop the batch.
    Keep,
}

/// Handles one due expiry-index entry of kind [`KIND_MARK`] at `now`.
pub(crate) fn sweep_mark_entry(
    txn: &Wtx<'_>,
    expiry: &mut ExpiryTable<'_>,
    raw: &[u8],
    key: &[u8],
    now: Timestamp,
) -> Result<MarkSweep, redb::Error> {
    let mut inbox = txn.open_table(INBOX)?;
    // An undecodable mark is left in place (reading it is an error, never "absent"); only its
    // index entry is dropped, so the sweep does not revisit it.
    let mark = inbox.get(key)?.and_then(|v| Mark::decode(v.value()).ok());
    let Some(mark) = mark else {
        expiry.remove(raw)?;
        return Ok(MarkSweep::Repaired);
    };
    let expected = entry_key(mark.forget_at, KIND_MARK, key);
    if expected != raw {
        expiry.remove(raw)?;
        expiry.insert(expected.as_slice(), MARK_TAG)?;
        return Ok(MarkSweep::Repaired);
    }
    if !is_mark_forgotten(&mark, now) {
        return Ok(MarkSweep::Keep);
    }
    inbox.remove(key)?;
    expiry.remove(raw)?;
    Ok(MarkSweep::Deleted)
}

/// The expiry-index entries every stored mark must have (for `check_expiry_index`), and
/// the keys of marks that do not decode (their entries are tolerated, like a corrupt record's).
pub(crate) type ExpectedMarks = (Vec<(Vec<u8>, u8)>, Vec<Vec<u8>>);

pub(crate) fn expected_mark_entries(
    read: &redb::ReadTransaction,
) -> Result<ExpectedMarks, redb::Error> {
    let (mut out, mut undecodable) = (Vec::new(), Vec::new());
    let Some(inbox) = open_optional(read, INBOX)? else {
        return Ok((out, undecodable));
    };
    for row in inbox.iter()? {
        let (k, v) = row?;
        match Mark::decode(v.value()) {
            Ok(mark) => out.push((entry_key(mark.forget_at, KIND_MARK, k.value()), MARK_TAG)),
            Err(_) => undecodable.push(k.value().to_vec()),
        }
    }
    Ok((out, undecodable))
}
