//! Order-aware handling: per-entity version high-water marks, updated in the caller's
//! transaction, so an event older than one already applied is skipped, never applied.

use redb::ReadableTable;

use crate::engine::boundary::unlatched;
use crate::engine::store::Store;
use crate::engine::tables::{VERSIONS, open_optional};
use crate::engine::tx::Tx;
use crate::error::Error;

/// What [`Versions::advance`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionCheck {
    /// The version is newer than the high-water mark (or the entity is new): apply the event.
    /// The mark now holds the new version, in this transaction.
    Apply {
        /// The version applied before, if any.
        previous: Option<u64>,
    },
    /// The version is not newer than the mark: do not apply the event. The skip is counted
    /// in this transaction.
    Stale {
        /// The version already applied.
        current: u64,
    },
}

impl VersionCheck {
    /// True for [`VersionCheck::Apply`].
    pub fn should_apply(&self) -> bool {
        matches!(self, VersionCheck::Apply { .. })
    }
}

/// The pure rule: an event applies only if its version is strictly newer than the last
/// applied one (an equal version is a duplicate, hence stale).
pub fn version_check(current: Option<u64>, incoming: u64) -> VersionCheck {
    match current {
        Some(c) if incoming <= c => VersionCheck::Stale { current: c },
        previous => VersionCheck::Apply { previous },
    }
}

/// A stored high-water mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HighWaterMark {
    /// The newest version applied.
    pub version: u64,
    /// Stale events skipped for this entity.
    pub skipped: u64,
}

impl HighWaterMark {
    fn encode(&self) -> [u8; 16] {
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&self.version.to_be_bytes());
        out[8..].copy_from_slice(&self.skipped.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let corrupt = || Error::CorruptRecord {
            reason: format!(
                "a version high-water mark is {} bytes, expected 16",
                bytes.len()
            ),
        };
        let (a, b) = bytes.split_first_chunk::<8>().ok_or_else(corrupt)?;
        let b: &[u8; 8] = b.try_into().map_err(|_| corrupt())?;
        Ok(HighWaterMark {
            version: u64::from_be_bytes(*a),
            skipped: u64::from_be_bytes(*b),
        })
    }
}

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
        let check = version_check(stored.map(|m| m.version), version);
        let next = match (check, stored) {
            (VersionCheck::Apply { .. }, m) => HighWaterMark {
                version,
                skipped: m.map_or(0, |m| m.skipped),
            },
            (VersionCheck::Stale { .. }, Some(m)) => HighWaterMark {
                version: m.version,
                skipped: m.skipped.saturating_add(1),
            },
            (VersionCheck::Stale { current }, None) => HighWaterMark {
                version: current,
                skipped: 1,
            },
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_strictly_newer_versions_apply() {
        assert_eq!(
            version_check(None, 0),
            VersionCheck::Apply { previous: None }
        );
        assert_eq!(
            version_check(Some(3), 4),
            VersionCheck::Apply { previous: Some(3) }
        );
        assert_eq!(
            version_check(Some(3), 3),
            VersionCheck::Stale { current: 3 }
        );
        assert_eq!(
            version_check(Some(3), 1),
            VersionCheck::Stale { current: 3 }
        );
    }
}
