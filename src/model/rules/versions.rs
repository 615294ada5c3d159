//! Whether an event applies, as a pure function of the entity's version high-water mark and the
//! event's version ([`version_check`]), and what the mark becomes ([`advance`]).

use crate::model::marks::HighWaterMark;

/// What an event may do, given the entity's high-water mark (the answer of
/// `Versions::advance`).
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

/// The rule: an event applies only if its version is strictly newer than the last
/// applied one (an equal version is a duplicate, hence stale).
pub fn version_check(current: Option<u64>, incoming: u64) -> VersionCheck {
    match current {
        Some(c) if incoming <= c => VersionCheck::Stale { current: c },
        previous => VersionCheck::Apply { previous },
    }
}

/// What checking `incoming` against the `stored` mark writes: a newer version becomes the mark
/// (keeping the skip count); a stale one leaves the version and counts one more skip.
pub(crate) fn advance(
    stored: Option<HighWaterMark>,
    incoming: u64,
) -> (VersionCheck, HighWaterMark) {
    let check = version_check(stored.map(|m| m.version), incoming);
    let next = match (check, stored) {
        (VersionCheck::Apply { .. }, m) => HighWaterMark {
            version: incoming,
            skipped: m.map_or(0, |m| m.skipped),
        },
        (VersionCheck::Stale { .. }, Some(m)) => HighWaterMark {
            version: m.version,
            skipped: m.skipped.saturating_add(1),
        },
        // Unreachable (a stale check needs a stored mark); kept total.
        (VersionCheck::Stale { current }, None) => HighWaterMark {
            version: current,
            skipped: 1,
        },
    };
    (check, next)
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

    /// Every stored mark (none, one with skips) against an older, equal and newer version:
    /// the check agrees with [`version_check`], a newer version becomes the mark and keeps the
    /// skips, anything else keeps the version and counts one more skip.
    #[test]
    fn exhaustive_advance_table() {
        let marks = [
            None,
            Some(HighWaterMark {
                version: 5,
                skipped: 0,
            }),
            Some(HighWaterMark {
                version: 5,
                skipped: 2,
            }),
        ];
        for stored in marks {
            for incoming in [0, 4, 5, 6, u64::MAX] {
                let case = format!("stored={stored:?} incoming={incoming}");
                let (check, next) = advance(stored, incoming);
                assert_eq!(
                    check,
                    version_check(stored.map(|m| m.version), incoming),
                    "{case}"
                );
                let skipped = stored.map_or(0, |m| m.skipped);
                let want = match stored {
                    Some(m) if incoming <= m.version => HighWaterMark {
                        version: m.version,
                        skipped: skipped + 1,
                    },
                    _ => HighWaterMark {
                        version: incoming,
                        skipped,
                    },
                };
                assert_eq!(next, want, "{case}");
                assert!(
                    next.version >= stored.map_or(0, |m| m.version),
                    "{case}: a mark never moves back"
                );
            }
        }
    }
}
