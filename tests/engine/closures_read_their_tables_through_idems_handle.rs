//! A closure reads its tables through `idem::store::Table` (`get`, `range`, `iter`, `first`,
//! `last`, `len`, `is_empty`), in the table's key order, and sees every write made before it:
//! its own, earlier in the closure, and every earlier claim's. The same in direct and journal
//! mode, so code written against the handle runs in both.

use crate::common;

use common::*;
use idem::redb::TableDefinition;
use idem::store::Table;
use idem::{Abort, ExecuteAnswer, Response, Store, StoreBuilder};

/// `u64` keys: redb stores them little-endian, so their byte order is not their key order and a
/// read that ordered by bytes would be caught.
const LEDGER: TableDefinition<u64, &str> = TableDefinition::new("ledger");

/// A mode's name and how the builder opens it.
type Mode = (&'static str, fn(StoreBuilder) -> StoreBuilder);

fn modes() -> [Mode; 2] {
    [
        ("direct", |b| b.journal(false)),
        ("journal", |b| b.journal(true).journal_table(LEDGER)),
    ]
}

fn keys(t: &Table<'_, u64, &str>, reverse: bool) -> Vec<u64> {
    let range = t.range(3..=70_000).expect("range");
    let rows: Vec<_> = if reverse {
        range.rev().collect()
    } else {
        range.collect()
    };
    rows.into_iter()
        .map(|r| r.expect("row").0.value())
        .collect()
}

fn run(store: &Store, key: &str, f: impl Fn(&mut Table<'_, u64, &str>) -> Result<(), Abort>) {
    let answer = store
        .execute(req("t", "ledger", key, key.as_bytes()), |tx| {
            let mut t = tx.open_table(LEDGER)?;
            f(&mut t)?;
            Ok(Response::new(200, Vec::new()))
        })
        .expect("execute");
    assert!(matches!(answer, ExecuteAnswer::Ran(_)), "{answer:?}");
}

#[test]
fn reads_see_the_closures_own_writes_in_key_order() {
    for (mode, configure) in modes() {
        let h = Harness::with(configure);
        run(h.store(), "first", |t| {
            assert!(t.is_empty()?, "{mode}: a new table is empty");
            assert!(t.first()?.is_none() && t.last()?.is_none(), "{mode}");
            for (k, v) in [(300, "c"), (2, "a"), (70_000, "d"), (5, "b"), (70_001, "e")] {
                t.insert(k, v)?;
            }
            assert_eq!(t.len()?, 5, "{mode}");
            assert_eq!(
                t.get(300)?.map(|g| g.value().to_owned()).as_deref(),
                Some("c"),
                "{mode}"
            );
            assert!(t.get(4)?.is_none(), "{mode}");
            assert_eq!(
                keys(t, false),
                [5, 300, 70_000],
                "{mode}: key order, not byte order"
            );
            assert_eq!(keys(t, true), [70_000, 300, 5], "{mode}: reversed");
            let all: Vec<u64> = t
                .iter()?
                .map(|r| r.map(|(k, _)| k.value()))
                .collect::<Result<_, _>>()?;
            assert_eq!(all, [2, 5, 300, 70_000, 70_001], "{mode}");
            {
                let (k, v) = t.first()?.expect("first");
                assert_eq!((k.value(), v.value()), (2, "a"), "{mode}");
                let (k, v) = t.last()?.expect("last");
                assert_eq!((k.value(), v.value()), (70_001, "e"), "{mode}");
                assert_eq!(format!("{:?}", t.get(2)?.expect("2")), "\"a\"", "{mode}");
            }
            t.remove(300)?;
            assert!(t.get(300)?.is_none(), "{mode}: a remove is seen at once");
            assert_eq!(keys(t, false), [5, 70_000], "{mode}");
            Ok(())
        });
    }
}

#[test]
fn a_later_claim_reads_what_earlier_claims_wrote_and_so_does_a_reopen() {
    for (mode, configure) in modes() {
        let mut h = Harness::with(configure);
        run(h.store(), "a", |t| {
            t.insert(9, "nine")?;
            t.insert(256, "two hundred fifty-six")?;
            Ok(())
        });
        run(h.store(), "b", |t| {
            assert_eq!(
                t.get(9)?.map(|g| g.value().to_owned()).as_deref(),
                Some("nine"),
                "{mode}"
            );
            {
                let (k, v) = t.pop_first()?.expect("an entry");
                assert_eq!(
                    (k.value(), v.value()),
                    (9, "nine"),
                    "{mode}: the smallest key"
                );
            }
            assert!(t.insert(1, "one")?.is_none(), "{mode}: no old value");
            let old = t.insert(1, "uno")?.map(|g| g.value().to_owned());
            assert_eq!(old.as_deref(), Some("one"), "{mode}: the old value");
            let old = t.remove(1)?.map(|g| g.value().to_owned());
            assert_eq!(old.as_deref(), Some("uno"), "{mode}: the removed value");
            t.insert(1, "one")?;
            Ok(())
        });
        h.reopen();
        run(h.store(), "c", |t| {
            let all: Vec<(u64, String)> = t
                .iter()?
                .map(|r| r.map(|(k, v)| (k.value(), v.value().to_owned())))
                .collect::<Result<_, _>>()?;
            assert_eq!(
                all,
                [
                    (1, "one".to_owned()),
                    (256, "two hundred fifty-six".to_owned())
                ],
                "{mode}: after the reopen"
            );
            Ok(())
        });
    }
}
