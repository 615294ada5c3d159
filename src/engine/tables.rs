//! Every table idem owns, in one place. Names carry a version: a layout change gets a new name
//! and a migration, never a silent reinterpretation of old bytes.

use redb::TableDefinition;

/// Tables whose names start with this are idem's; [`crate::Tx`] refuses to open them.
pub const RESERVED_PREFIX: &str = "idem.";

/// Record key (docs/FORMAT.md, "Record key") → encoded [`crate::format::Record`].
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");

/// The expiry index (docs/FORMAT.md, "Expiry index"): `u64be(due) ‖ kind ‖ key` → the state tag
/// of the entry's record. One entry per record, maintained in the transaction that writes the
/// record, so a sweep is a range scan from the start of the table.
pub(crate) const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

/// Store metadata: `"format"` → `[FORMAT_VERSION]`, written when the file is created.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idem.meta.v1");

/// Key of the format marker in [`META`].
pub(crate) const META_FORMAT: &str = "format";

/// Marks, stored by `engine/marks.rs` (inbox marks and webhook receipts):
/// `namespace ‖ u16be(len(subscriber)) ‖ subscriber ‖ message id` → `u64be(processed_at) ‖
/// u64be(forget_at) ‖ checksum` (8 bytes, see `docs/design.md`; `v2` since the checksum was
/// added), or a longer value starting with `0x03` that also keeps a terminal rejection's
/// response (docs/FORMAT.md, "Inbox marks"; old 24-byte marks read unchanged). Each mark has
/// an entry of kind `0x02` in [`EXPIRY`], so sweeps remove it after the inbox retention.
pub(crate) const INBOX: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.inbox.v2");

/// Undelivered outbox events: commit sequence number → encoded event. A row is deleted once
/// the dispatcher's publish returned Ok (delivered events are pruned at once).
pub(crate) const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("idem.outbox.v1");

/// Dead letters: outbox events whose last attempt failed, by their original sequence number.
pub(crate) const OUTBOX_DEAD: TableDefinition<u64, &[u8]> =
    TableDefinition::new("idem.outbox_dead.v1");

/// Key in [`META`] of the next outbox sequence number (`u64be`): never reused, so commit
/// order is sequence order even after every row was pruned.
pub(crate) const META_OUTBOX_SEQ: &str = "outbox.next_seq";

/// Per-entity version high-water marks: entity → `u64be(version) ‖ u64be(skipped)`.
pub(crate) const VERSIONS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.versions.v1");

/// Opens a table in a read transaction; `None` if it was never created. The inbox, outbox
/// and version tables are created by the first write that uses them, so a store that never
/// uses them keeps exactly the core tables.
pub(crate) fn open_optional<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &redb::ReadTransaction,
    definition: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, redb::TableError> {
    match read.open_table(definition) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
