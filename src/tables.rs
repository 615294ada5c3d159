//! Every table idem owns, in one place. Names carry a version: a layout change gets a new name
//! and a migration, never a silent reinterpretation of old bytes.

use redb::TableDefinition;

/// Tables whose names start with this are idem's; [`crate::Tx`] refuses to open them.
pub const RESERVED_PREFIX: &str = "idem.";

/// Record key (docs/FORMAT.md, "Record key") → encoded [`crate::Record`].
pub(crate) const RECORDS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("idem.records.v1");

/// The expiry index (docs/FORMAT.md, "Expiry index"): `u64be(due) ‖ kind ‖ key` → the state tag
/// of the entry's record. One entry per record, maintained in the transaction that writes the
/// record, so a sweep is a range scan from the start of the table.
pub(crate) const EXPIRY: TableDefinition<&[u8], u8> = TableDefinition::new("idem.expiry.v1");

/// Store metadata: `"format"` → `[FORMAT_VERSION]`, written when the file is created.
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("idem.meta.v1");

/// Key of the format marker in [`META`].
pub(crate) const META_FORMAT: &str = "format";
