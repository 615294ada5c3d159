//! Order-aware handling: webhooks or messages arriving out of order; the stale one is recorded
//! as skipped and never applied, in the same transaction as the newer one's effect.

use crate::common;

use common::{Harness, bump, effects};
use idem::Abort;
use idem::inbox::ProcessAnswer;
use idem::rules::VersionCheck;

const STATUS: idem::redb::TableDefinition<&str, u64> =
    idem::redb::TableDefinition::new("test.order_status_version");

fn deliver(h: &Harness, delivery: &str, version: u64) -> VersionCheck {
    let r = h
        .store()
        .receive("shop", delivery, |tx| {
            let check = tx.versions().advance("order-7", version)?;
            if check.should_apply() {
                tx.open_table(STATUS)?.insert("order-7", version)?;
                bump(tx, "applied")?;
            }
            Ok(check)
        })
        .unwrap();
    match r {
        idem::inbox::ReceiveAnswer::Ran(c) => c,
        other => panic!("unexpected {other:?}"),
    }
}

fn status(h: &Harness) -> u64 {
    let read = h.store().read_transaction().unwrap();
    let t = read.open_table(STATUS).unwrap();
    idem::redb::ReadableTable::get(&t, "order-7")
        .unwrap()
        .unwrap()
        .value()
}

#[test]
fn the_stale_webhook_is_skipped() {
    let h = Harness::new();
    assert_eq!(
        deliver(&h, "d-1", 1),
        VersionCheck::Apply { previous: None }
    );
    assert_eq!(
        deliver(&h, "d-3", 3),
        VersionCheck::Apply { previous: Some(1) }
    );
    // Version 2 arrives late.
    assert_eq!(deliver(&h, "d-2", 2), VersionCheck::Stale { current: 3 });
    assert_eq!(status(&h), 3);
    assert_eq!(effects(h.store(), "applied"), 2);
    let mark = h.store().high_water_mark("order-7").unwrap().unwrap();
    assert_eq!((mark.version, mark.skipped), (3, 1));
}

#[test]
fn an_aborted_closure_does_not_move_the_mark() {
    let h = Harness::new();
    let err = h
        .store()
        .process("sub", "m", |tx| -> Result<(), Abort> {
            tx.versions().advance("e", 9)?;
            Err(Abort::retryable("later"))
        })
        .unwrap_err();
    assert!(err.is_retryable());
    assert_eq!(h.store().high_water_mark("e").unwrap(), None);
    let r = h
        .store()
        .process("sub", "m", |tx| Ok(tx.versions().advance("e", 9)?))
        .unwrap();
    assert_eq!(
        r,
        ProcessAnswer::Ran(VersionCheck::Apply { previous: None })
    );
}
