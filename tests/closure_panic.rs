//! A closure that panics leaves nothing behind: no record, none of its writes, and the store
//! keeps working (the key stays free and the retry runs).

use std::panic::{AssertUnwindSafe, catch_unwind};

use idem::redb::{ReadableTableMetadata, TableDefinition};
use idem::{Outcome, Request, Response, Scope, Store};

const EFFECTS: TableDefinition<&str, u32> = TableDefinition::new("effects");

#[test]
fn a_panicking_closure_commits_nothing_and_the_retry_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("idem.redb")).expect("open");
    let req = || Request::from_canonical_bytes(Scope::new("t", "op"), "k", b"p");

    let result = catch_unwind(AssertUnwindSafe(|| {
        store.execute(req(), |tx| {
            tx.open_table(EFFECTS)?.insert("k", 1)?;
            panic!("handler bug");
        })
    }));
    assert!(result.is_err(), "the panic reaches the caller");
    assert!(store.get(req().scope(), "k").expect("get").is_none());
    assert!(
        store.failure().is_none(),
        "a caller panic is not an I/O failure"
    );

    let outcome = store
        .execute(req(), |tx| {
            let mut effects = tx.open_table(EFFECTS)?;
            assert_eq!(
                effects.len()?,
                0,
                "the panicked attempt's write was rolled back"
            );
            effects.insert("k", 1)?;
            Ok(Response::new(200, "ok"))
        })
        .expect("retry");
    assert!(matches!(outcome, Outcome::Executed(_)));
    let effects = store
        .begin_read()
        .expect("read")
        .open_table(EFFECTS)
        .expect("table")
        .len()
        .expect("len");
    assert_eq!(effects, 1);
}
