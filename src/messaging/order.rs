//! Order-aware handling: per-entity version high-water marks, updated in the caller's
//! transaction, so an event older than one already applied is skipped, never applied.

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::store::Store;
use crate::engine::tables::{VERSIONS, open_optional};
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::marks::HighWaterMark;
use crate::model::rules::VersionCheck;
use crate::model::rules::versions::advance;

/// The version high-water marks of one transaction; see [`Tx::versions`]. Marks are kept
/// until removed (they are tiny: one row per entity).
pub struct Versions<'a, 't> {
    tx: &'a Tx<'t>,
}

impl<'t> Tx<'t> {
    /// Per-entity version high-water marks, updated in this transaction. See [`Versions`].
    pub fn versions(&self) -> Versions<'_, 't> {
        Versions { tx: self }
    }
}

impl<'a, 't> Versions<'a, 't> {
    /// Checks `version` against `entity`'s high-water mark in this transaction: a newer version
    /// moves the mark and answers [`VersionCheck::Apply`] (apply the event in the same
    /// closure); an older or equal one answers [`VersionCheck::Stale`] and counts the skip.
    /// Both commit with the closure's other writes, or not at all.
    pub fn advance(&self, entity: impl AsRef<[u8]>, version: u64) -> Result<VersionCheck, Error> {
        let entity = entity.as_ref();
        let tx = self.tx;
        let mut table = tx.raw().open_table(VERSIONS).map_err(|e| tx.storage(e))?;
        let stored = match table.get(entity).map_err(|e| tx.storage(e))? {
            Some(v) => Some(HighWaterMark::decode(v.value())?),
            None => None,
        };
        let (check, next) = advance(stored, version);
        table
            .insert(entity, next.encode().as_slice())
            .map_err(|e| tx.storage(e))?;
        Ok(check)
    }
}

impl Store {
    /// `entity`'s version high-water mark, if any event was applied for it.
    pub fn high_water_mark(
        &self,
        entity: impl AsRef<[u8]>,
    ) -> Result<Option<HighWaterMark>, Error> {
        self.read("reading a version high-water mark", |read| {
            let Some(table) = open_optional(read, VERSIONS).map_err(unlatched)? else {
                return Ok(None);
            };
            let value = table.get(entity.as_ref()).map_err(unlatched)?;
            value.map(|v| HighWaterMark::decode(v.value())).transpose()
        })
    }
}
